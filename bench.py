"""
Times one training step of train.py (gradient_accumulation_steps forward-backward passes, then
AdamW) on random tokens, after a warm-up. Settings: train.py's (python train.py --help) and the
keys below; one mode at a time. docs/performance.md explains each mode.

    python bench.py config/future50_mse.py --batch_size=4
    python bench.py config/baseline.py config/future50_mse.py --compare --impl=readable,fast
    python bench.py --gpu_report    # on a GPU: writes out-bench/gpu_report.md
    python bench.py --gpu_report=report.md --device=cpu   # its rehearsal on a CPU, in seconds
"""

import importlib.metadata
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import traceback
from itertools import repeat
from unittest import mock

import torch

import configurator
import model_future_attn
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
    gpu_report="",  # the write-ups' models measured into this markdown file (a CPU rehearses)
    budget_s=300,  # --gpu_report starts no measurement that would end after this many seconds
    commit="",  # --gpu_report: the commit measured, for a copy of the code without .git
)
MODES = ("compare", "explain", "sweep_block_size", "splits", "profile", "memory", "gpu_report")
BARE = {"--profile": "--profile=5", "--gpu_report": "--gpu_report=out-bench/gpu_report.md"}
GPU_REPORT_CONFIGS = ("baseline", "future50_mse", "encdec_mse_possub")
GPU_REPORT_SPLITS = "50x16,200x4,800x1,100x8,400x2"
REHEARSAL_SPLITS = "2x16,8x4,32x1,4x8,16x2"  # the same accumulations over 32 sequences
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
    elif bench["commit"]:
        raise ConfigError("--commit names the commit of a --gpu_report")
    if bench["splits"]:
        parse_splits(bench["splits"])  # its mistakes, before anything is built
    runs = []
    for path in paths or [None]:
        config = train.get_config(([path] if path else []) + flags, script_keys=BENCH_DEFAULTS)
        bench["rehearsal"] = bool(bench["gpu_report"]) and config["device"] == "cpu"
        if bench["rehearsal"]:  # the same plan, in seconds
            config = rehearsal_config(config)
            bench.update(splits=REHEARSAL_SPLITS, warmup=1, iters=2, profile=1)
        future = config["model_type"] == "future_attn"
        if future and "flex" in impls and not config["device"].startswith("cuda"):
            raise ConfigError("impl=flex needs --device=cuda: no backward on a CPU")
        label = config["model_type"]
        if path:  # the config's name, and the model type a flag put in its place
            label = os.path.basename(path)[:-3]
            if "model_type" in overrides:
                label += f" as {config['model_type']}"
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
# --gpu_report: the write-ups' models on a GPU within a time budget, or its rehearsal on a CPU


def rehearsal_config(config):
    """config shrunk so that a CPU takes a step in a fraction of a second, with its model type,
    options and heads kept: 2 layers (per stack), a 32-token context with future_dim scaled to
    it, 256 words, 4 dimensions per head (of cross-attention's heads too)."""
    heads = [config["n_head"]]
    if config["model_type"] == "encdec":
        heads.append(config["cross_n_head"] or 2 * config["n_head"])
    small = dict(n_layer=2, block_size=32, vocab_size=256, n_embd=4 * math.lcm(*heads))
    if config["model_type"] == "future_attn":
        # 50 of the 199 later positions stay about a quarter of them: 8 of 31
        share = config["future_dim"] / (config["block_size"] - 1)
        small["future_dim"] = max(1, round(share * (small["block_size"] - 1)))
    return dict(config, **small)


def attention_that_runs(run):
    """Which attention computes the model's training forward pass: for future attention the
    version FutureAttention.forward picks ('flex', 'fast' or 'readable'), seen in one eager pass
    over one sequence; the others call F.scaled_dot_product_attention ('sdpa')."""
    if run["config"]["model_type"] != "future_attn":
        return "sdpa"
    kernels, chosen = model_future_attn.kernels, []
    if kernels is None:  # no kernels file: the readable version
        return "readable"
    choose = kernels.choose

    def choose_and_note(*args):
        chosen.append(choose(*args))
        return chosen[-1]

    with mock.patch.object(kernels, "choose", choose_and_note), torch.no_grad(), run["autocast"]:
        run["model"](run["x"][:1], run["y"][:1])
    return ", ".join(sorted(set(chosen))) or "readable"


def failure(error):
    """An exception in one line for the report (its traceback goes to the console)."""
    traceback.print_exc()
    first_line = (str(error).strip().splitlines() or [""])[0][:160]
    return f"failed: {type(error).__name__}: {first_line}".replace("|", "/")


def measure(label, config, impl, split, bench):
    """A row of the report for one config at one split, and the run (None if it failed). A
    failure of any kind is the row's result, so that the measurements after it still run."""
    b, k = split
    dtype = train.autocast_for(config["dtype"], torch.device(config["device"]).type)[0]
    row = dict(config=label, attention="-", dtype=dtype, compile=config["compile"],
               split=f"{b} × {k}")
    try:
        run = build(label, dict(config, batch_size=b, gradient_accumulation_steps=k), impl)
        row["attention"] = attention_that_runs(run)
        time_runs([run], bench)
    except Exception as e:  # any failure is a result to report
        return dict(row, failed=failure(e)), None
    seconds = statistics.median(run["times"])
    tokens = b * k * config["block_size"]
    mfu = bench["peak_flops"] and run["model"].estimate_mfu(b * k, seconds, bench["peak_flops"])
    row.update(ms_per_micro_step=seconds * 1000 / k, ms_per_step=seconds * 1000,
               tokens_per_s=tokens / seconds, mfu=mfu, peak_mib=run["peak_memory"] / 2**20)
    return row, run


def expected_seconds(what, label, costs, bench):
    """How long a measurement should take by those made so far (None: nothing to go by): a
    timing, its config's build and compile and its steps; a profile, its steps, twice (the
    profiler slows the host); a config not yet timed, the longest timing so far."""
    steps = bench["warmup"] + (bench["profile"] if what == "profile" else bench["iters"])
    if label in costs:
        setup = 0 if what == "profile" else costs[label]["setup"]
        return setup + steps * costs[label]["step"] * (2 if what == "profile" else 1)
    totals = [cost["setup"] + steps * cost["step"] for cost in costs.values()]
    return max(totals) if totals else None


def command_output(command):
    """The first line a command prints, or 'unknown' where it cannot run."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def machine_facts(device, commit):
    """What ran where: the report's header."""
    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name(device) if cuda else f"{device}, {os.cpu_count()} cores"
    driver = "-"
    if cuda:
        driver = command_output(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"])
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "not installed"
    if not commit:  # from git, where the code is a clone
        repository = os.path.dirname(os.path.abspath(__file__))
        commit = command_output(["git", "-C", repository, "describe", "--always", "--dirty"])
    return {"device": name, "driver": driver, "torch": torch.__version__,
            "CUDA": torch.version.cuda or "-", "Triton": triton, "commit": commit}


def report_markdown(facts, bench, rows, profiles, not_measured):
    """The report: its header, a table row per timing, what was not measured, the profiles."""
    lines = ["# bench.py --gpu_report", ""]
    if bench["rehearsal"]:
        lines += ["**A rehearsal on a CPU: not a measurement.** The same plan, every config "
                  "shrunk to seconds (bench.rehearsal_config).", ""]
    lines += ["| | |", "| --- | --- |", *[f"| {key} | {value} |" for key, value in facts.items()],
              f"| steps | the median of {bench['iters']} after {bench['warmup']} of warm-up |",
              f"| budget | {bench['budget_s']} s |", ""]
    head = ["config", "attention", "dtype", "compiled", "batch × accumulation", "ms per micro-step",
            "ms per step", "tokens/s", "MFU", "peak memory", "seconds, compile included"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [row["config"], row["attention"], row["dtype"], "yes" if row["compile"] else "no",
                 row["split"]]
        if "failed" in row:
            cells += [row["failed"], "", "", "", ""]
        else:
            mfu = f"{row['mfu'] * 100:.1f}%" if row["mfu"] else "-"
            peak = f"{row['peak_mib']:,.0f} MiB" if row["peak_mib"] else "-"
            cells += [f"{row['ms_per_micro_step']:.2f}", f"{row['ms_per_step']:.1f}",
                      f"{row['tokens_per_s']:,.0f}", mfu, peak]
        lines.append("| " + " | ".join(cells + [f"{row['seconds']:.0f}"]) + " |")
    lines += ["", f"Not measured: {'; '.join(not_measured) or 'nothing'}."]
    for title, text in profiles:
        lines += ["", f"## Profile: {title}", "", "```", text, "```"]
    return "\n".join(lines) + "\n"


def gpu_report(runs, bench, facts):
    """Measures each config at its own split, then profiles GPU_REPORT_PROFILED's model types
    there, then times the other splits; starts no measurement that the ones before it say will
    not end within bench['budget_s']; writes the whole report after each measurement."""
    own, *larger = parse_splits(bench["splits"])
    plan = ([("time", run, own) for run in runs]
            + [("profile", run, own) for run in runs if run[1]["model_type"] in GPU_REPORT_PROFILED]
            + [("time", run, split) for split in larger for run in runs])
    path = bench["gpu_report"]
    rows, profiles, not_measured, costs, compiled = [], [], [], {}, {}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    started = time.monotonic()
    for what, (label, config, impl), split in plan:
        name = f"{what} {label} {split[0]}x{split[1]}"
        left = bench["budget_s"] - (time.monotonic() - started)
        expected = expected_seconds(what, label, costs, bench)
        measure_started = time.monotonic()
        if expected is not None and expected > left:
            not_measured.append(f"{name} (about {expected:.0f} s, {max(left, 0):.0f} s left)")
        elif what == "profile" and label not in compiled:
            not_measured.append(f"{name} (its timing failed)")
        elif what == "profile":
            try:
                text = profile(compiled.pop(label), bench)
            except Exception as e:  # any failure is a result to report
                text = failure(e)
            profiles.append((name, text))
        else:
            if split != own:
                compiled.clear()  # the profiles are done
                torch._dynamo.reset()  # a fresh compile per shape, as time_shapes does
            row, run = measure(label, config, impl, split, bench)
            row["seconds"] = time.monotonic() - measure_started
            rows.append(row)
            result = row.get("failed") or f"{row['ms_per_step']:.1f} ms per step"
            print(f"{name}: {result}")
            if run and split == own:
                steps = bench["warmup"] + bench["iters"]
                step_s = statistics.median(run["times"])
                costs[label] = dict(step=step_s, setup=max(row["seconds"] - steps * step_s, 0))
                if config["model_type"] in GPU_REPORT_PROFILED:
                    compiled[label] = run  # compiled already, for its profile
        write_report(path, report_markdown(facts, bench, rows, profiles, not_measured))
    return 0


def write_report(path, markdown):
    train.write_atomically(path, lambda f: f.write(markdown.encode()))
    print(f"wrote {path}")


@configurator.script
def main(argv):
    bench, runs = parse_args(argv)
    if configurator.wants_help(argv):
        print(configurator.usage(__doc__, bench))
        return 0
    device = runs[0][1]["device"]
    if bench["gpu_report"] and not (device.startswith("cuda") or bench["rehearsal"]):
        raise UserError(f"--gpu_report measures a CUDA GPU, or rehearses on a CPU: not {device}")
    train.use_device(device)  # cuda:N, before anything is built there
    bench["peak_flops"] = train.peak_flops(device)
    facts = machine_facts(device, bench["commit"])
    print(", ".join(f"{key} {value}" for key, value in facts.items()))
    with train.tf32_matmuls():  # as in a run of train.py, for this measurement alone
        if bench["gpu_report"]:
            return gpu_report(runs, bench, facts)
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
