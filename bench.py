"""
Times one training step of train.py (gradient_accumulation_steps forward-backward passes, then
AdamW) on random tokens, after a warm-up. Settings: train.py's (python train.py --help) and the
keys below; one mode at a time. docs/performance.md explains each mode.

    python bench.py config/future50_mse.py --batch_size=4
    python bench.py config/baseline.py config/future50_mse.py --compare --impl=readable,fast
    python bench.py --gpu_report    # on a GPU: writes out-bench/gpu_report.md
"""

import os
import resource
import statistics
import sys
import time
from itertools import repeat

import torch

import configurator
import train
from configurator import ConfigError, UserError

BENCH_DEFAULTS = dict(
    iters=20,  # timed steps per run
    warmup=5,  # untimed steps first (torch.compile compiles here)
    impl="auto",  # future attention: 'auto', 'readable', 'fast', 'flex', or a comma list
    compare=False,  # a step of each config in turn; their times over the first's
    explain=False,  # torch.compile's graphs and graph breaks, instead of timing
    sweep_block_size="",  # e.g. '256,512,1024': a micro-step at each block_size
    splits="",  # e.g. '50x16,200x4': batch_size x gradient_accumulation_steps, one product
    profile=0,  # steps traced by torch.profiler after the warm-up (a bare --profile: 5)
    memory=False,  # the peak memory of a step above its start
    gpu_report="",  # on a CUDA GPU: the write-ups' models measured into this markdown file
    budget_s=420,  # --gpu_report starts no measurement after this many seconds
)
MODES = ("compare", "explain", "sweep_block_size", "splits", "profile", "memory", "gpu_report")
BARE = {"--profile": "--profile=5", "--gpu_report": "--gpu_report=out-bench/gpu_report.md"}
GPU_REPORT_CONFIGS = ("baseline", "future50_mse", "encdec_mse_possub")
GPU_REPORT_SPLITS = "50x16,200x4,800x1,100x8,400x2"
GPU_REPORT_PROFILED = ("baseline", "future_attn")


def parse_args(argv):
    """(bench's settings, [(label, train config, impl)]) from the command line."""
    argv = [BARE.get(arg, arg) for arg in configurator.normalize(argv)]
    paths = [arg for arg in argv if not arg.startswith("--")]
    flags = [arg for arg in argv if arg.startswith("--")]
    overrides = configurator.parse(flags)[1]
    bench = configurator.own_settings(overrides, BENCH_DEFAULTS)
    impls = bench["impl"].split(",")
    modes = [f"--{mode}" for mode in MODES if bench[mode]]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} do not go together: pick one")
    if bench["gpu_report"] and paths:
        raise ConfigError("--gpu_report times the write-ups' configs: give none")
    if bench["gpu_report"]:
        configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
        paths = [os.path.join(configs, f"{name}.py") for name in GPU_REPORT_CONFIGS]
        bench.update(splits=GPU_REPORT_SPLITS, profile=2)
    if bench["splits"]:
        parse_splits(bench["splits"])  # its mistakes, before anything is built
    runs = []
    for path in paths or [None]:
        config = train.get_config(([path] if path else []) + flags, script_keys=BENCH_DEFAULTS)
        future = config["model_type"] == "future_attn"
        if future and "flex" in impls and not config["device"].startswith("cuda"):
            raise ConfigError("impl=flex needs --device=cuda: no backward on a CPU")
        label = os.path.basename(path)[:-3] if path else config["model_type"]
        for impl in impls if future else ["auto"]:
            runs.append((f"{label}[{impl}]" if future else label, config, impl))
    return bench, runs


def parse_splits(text):
    """[(batch_size, gradient_accumulation_steps)] from '50x16,100x8', of one product."""
    try:
        splits = [(int(b), int(k)) for b, k in (split.split("x") for split in text.split(","))]
    except ValueError:  # not two numbers
        splits = []
    if not splits or min(min(split) for split in splits) < 1 or len({b * k for b, k in splits}) > 1:
        raise ConfigError("write splits as BATCHxACCUM, all of the same product, e.g. "
                          f"--splits=50x16,100x8; got {text!r}")
    return splits


# ----------------------------------------
# one step as train.py takes it, and its timing


def build(label, config, impl):
    """All that a run's step needs: train.py's model, AdamW, scaler, autocast; random tokens."""
    device = config["device"]
    dtype, autocast = train.autocast_for(config["dtype"], torch.device(device).type)
    torch.manual_seed(config["seed"])
    model, optimizer, scaler = train.build(dict(config, dtype=dtype), 0, None)
    if config["model_type"] == "future_attn":
        try:
            model.set_impl(impl)
        except ValueError as e:  # an impl that cannot compute this config's attention
            raise ConfigError(str(e)) from None
    shape = (config["batch_size"], config["block_size"])
    return dict(label=label, config=config, device=device, autocast=autocast,
                model=model, step_model=torch.compile(model) if config["compile"] else model,
                optimizer=optimizer, scaler=scaler, times=[], peak_memory=0,
                x=torch.randint(config["vocab_size"], shape, device=device),
                y=torch.randint(config["vocab_size"], shape, device=device))


def sync(run):
    """Waits for the GPU, so that a time is that of its work, not of queuing it."""
    if run["device"].startswith("cuda"):
        torch.cuda.synchronize(run["device"])
    elif run["device"].startswith("mps"):
        torch.mps.synchronize()


def step(run):
    """Takes and times an optimizer step as train.run does: forward-backward passes, gradients
    unscaled and clipped, one read from the device, AdamW; on CUDA, keeps its peak memory."""
    cuda, config = run["device"].startswith("cuda"), run["config"]
    if cuda:
        torch.cuda.reset_peak_memory_stats(run["device"])
    sync(run)
    t0 = time.perf_counter()
    numbers = train.forward_backward(run["step_model"], repeat((run["x"], run["y"])),
                                     config["gradient_accumulation_steps"], run["autocast"],
                                     run["scaler"])
    numbers["grad_norm"] = train.unscale_and_clip(run["optimizer"], run["scaler"],
                                                  config["grad_clip"])
    train.read_numbers(numbers, ddp=False)
    run["scaler"].step(run["optimizer"])
    run["scaler"].update()
    run["optimizer"].zero_grad(set_to_none=True)
    sync(run)
    seconds = time.perf_counter() - t0
    if cuda:
        run["peak_memory"] = max(run["peak_memory"], torch.cuda.max_memory_allocated(run["device"]))
    return seconds


def time_runs(runs, bench):
    """The warm-up, then iters rounds of one step per run, into run['times']."""
    for _ in range(bench["warmup"]):
        for run in runs:
            step(run)
    for _ in range(bench["iters"]):
        for run in runs:
            run["times"].append(step(run))


def report(run, bench, first=None):
    """Prints and returns a run's line: median ms per step, tokens/s, MFU, peak memory (CUDA);
    with first, the median of the per-round ratios of its times to first's."""
    seconds, config = statistics.median(run["times"]), run["config"]
    sequences = config["batch_size"] * config["gradient_accumulation_steps"]  # per step
    line = (f"{run['label']:28s} {seconds * 1000:9.1f} ms/iter "
            f"{sequences * config['block_size'] / seconds:9.0f} tokens/s")
    if run["device"].startswith("cuda") and bench["peak_flops"]:
        mfu = run["model"].estimate_mfu(sequences, seconds, flops_promised=bench["peak_flops"])
        line += f"  MFU {mfu * 100:5.1f}%"
    if run["peak_memory"]:
        line += f"  peak memory {run['peak_memory'] / 2**20:8.1f} MiB"
    if first is not None:
        ratios = [t / t0 for t, t0 in zip(run["times"], first["times"])]  # per round
        line += (f"  ratio {statistics.median(ratios):.3f} "
                 f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")
    print(line)
    return line


def time_one(label, config, impl, bench):
    """Builds and times a run; returns it, its report() in run['line'], or None if out of memory."""
    try:
        run = build(label, config, impl)
        time_runs([run], bench)
        run["line"] = report(run, bench)
        return run
    except torch.OutOfMemoryError:
        print(f"{label}: out of memory, skipped")
        return None


def time_shapes(label, config, impl, bench):
    """Times each split of --splits or block_size of --sweep_block_size, in a model of its own."""
    if bench["splits"]:
        shapes = {f"{b}x{k}": dict(batch_size=b, gradient_accumulation_steps=k)
                  for b, k in parse_splits(bench["splits"])}
    else:
        shapes = {f"T={T}": dict(block_size=int(T), gradient_accumulation_steps=1)
                  for T in bench["sweep_block_size"].split(",")}
    for name, changes in shapes.items():
        torch._dynamo.reset()  # a fresh compile per shape: no recompile limit, no dynamic shapes
        time_one(f"{label} {name}", dict(config, **changes), impl, bench)


# ----------------------------------------
# what a step is made of: graphs, kernels, memory


def explain(run):
    """Counts the graphs and graph breaks torch.compile makes of one training forward."""
    with run["autocast"]:
        result = torch._dynamo.explain(run["model"])(run["x"], run["y"])
    print(f"{run['label']}: {result.graph_count} graphs, {result.graph_break_count} graph breaks")
    for reason in result.break_reasons:
        print(f"  break: {reason.reason}")


def profile(run, bench):
    """Traces bench['profile'] steps after the warm-up; prints and returns torch.profiler's
    table of the ops (on CUDA: kernels) that took the most time."""
    for _ in range(bench["warmup"]):
        step(run)
    with torch.profiler.profile() as prof:  # the CPU's ops, and CUDA's kernels where it runs
        seconds = [step(run) for _ in range(bench["profile"])]
    cuda = run["device"].startswith("cuda")
    table = prof.key_averages().table(
        sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=15)
    text = (f"{run['label']}: {statistics.mean(seconds) * 1000:.1f} ms per traced step (the "
            f"profiler slows the host)\n{table}")
    print(text)
    return text


def peak_memory(run, bench):
    """Prints the peak memory of a step above its start: on CUDA the allocator's, after the
    warm-up; on a CPU the growth of the process's peak resident memory over its first step."""
    device = run["device"]
    if device.startswith("cuda"):
        for _ in range(bench["warmup"]):
            step(run)
        start = torch.cuda.memory_allocated(device)
        step(run)
        peak = torch.cuda.max_memory_allocated(device) - start
    else:  # Linux counts the peak resident memory in KiB
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        step(run)
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) * 1024
    print(f"{run['label']}: peak memory of a step: {peak / 2**20:,.1f} MiB above its start")
    return peak


# ----------------------------------------
# --gpu_report: the write-ups' models on a GPU, within a time budget


def gpu_report(runs, bench, machine):
    """Measures each config at its own split, the profiles of GPU_REPORT_PROFILED's model types
    there, then the other splits; starts nothing once bench['budget_s'] is spent; writes the
    report after each measurement."""
    own, *larger = parse_splits(bench["splits"])
    path, sections, kept = bench["gpu_report"], [], {}
    plan = ([("time", run, own) for run in runs]
            + [("profile", run, own) for run in runs if run[1]["model_type"] in GPU_REPORT_PROFILED]
            + [("time", run, split) for split in larger for run in runs])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    started = time.monotonic()
    for index, (what, (label, config, impl), (b, k)) in enumerate(plan):
        if time.monotonic() - started >= bench["budget_s"]:
            break
        measure_started, name = time.monotonic(), f"{label} {b}x{k}"
        if what == "profile":
            text = profile(kept.pop(label), bench) if label in kept else "out of memory"
        else:
            if (b, k) != own:
                kept.clear()  # the profiles are done
                torch._dynamo.reset()  # as time_shapes does
            changes = dict(batch_size=b, gradient_accumulation_steps=k)
            run = time_one(name, dict(config, **changes), impl, bench)
            text = run["line"] if run else f"{name}: out of memory"
            if run and (b, k) == own and config["model_type"] in GPU_REPORT_PROFILED:
                kept[label] = run  # compiled, for its profile
        seconds = time.monotonic() - measure_started
        sections.append(f"{what} {name} ({seconds:.0f} s, compile included):\n{text}")
        left = ", ".join(f"{what} {label} {b}x{k}"
                         for what, (label, _, _), (b, k) in plan[index + 1:])
        markdown = (f"# bench.py --gpu_report\n\n{machine}; the median of {bench['iters']} steps "
                    f"after {bench['warmup']} of warm-up\n\n```\n" + "\n\n".join(sections)
                    + f"\n```\n\nNot measured within {bench['budget_s']} s: {left or 'nothing'}\n")
        train.write_atomically(path, lambda f: f.write(markdown.encode()))
        print(f"wrote {path}")
    return 0


@configurator.script
def main(argv):
    bench, runs = parse_args(argv)
    if configurator.wants_help(argv):
        print(configurator.usage(__doc__, bench))
        return 0
    device = runs[0][1]["device"]
    cuda = device.startswith("cuda")
    if bench["gpu_report"] and not cuda:
        raise UserError(f"--gpu_report measures a CUDA GPU: run it on one, not on {device}")
    bench["peak_flops"] = train.peak_flops(device)
    machine = f"{torch.cuda.get_device_name(device) if cuda else device}, torch {torch.__version__}"
    print(machine)
    if bench["gpu_report"]:
        return gpu_report(runs, bench, machine)
    if bench["sweep_block_size"] or bench["splits"]:
        for run in runs:
            time_shapes(*run, bench)
        return 0
    runs = [build(*run) for run in runs]
    if bench["compare"]:
        time_runs(runs, bench)
    for run in runs:
        if bench["explain"]:
            explain(run)
        elif bench["profile"]:
            profile(run, bench)
        elif bench["memory"]:
            peak_memory(run, bench)
        elif bench["compare"]:
            report(run, bench, first=runs[0])
        else:
            time_runs([run], bench)
            report(run, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
