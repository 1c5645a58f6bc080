"""
Times one training step (forward, backward, AdamW step) of the models that config files
describe, on random tokens, after a warm-up. Settings are train.py's (config file plus
--key=value flags), with a few of bench.py's own (BENCH_DEFAULTS below).

    python bench.py config/future50_mse.py --device=cpu --batch_size=4
    python bench.py config/baseline.py config/future50_mse.py --compare --impl=readable,fast --device=cpu --batch_size=4
    python bench.py config/future50_mse.py --explain                # graph breaks under torch.compile
    python bench.py config/future50_mse.py --sweep_block_size=256,512,1024,2048 --batch_size=8

--compare runs all configs in one process, one step of each in turn, and prints each one's
time over the first's, the median of the per-round ratios: a busy machine slows every
config in a round alike, so the ratios hold where the milliseconds wander. --impl picks
the future-attention code (model_future_attn.FUTURE_ATTN_IMPL); a comma list times the
future-attention configs once per implementation. On a CPU, compile is off unless asked
for (it takes minutes there) and peak memory is the growth of the process's peak RSS.
"""

import os
import resource
import statistics
import sys
import time

import torch

import configurator
import model_future_attn
import train

BENCH_DEFAULTS = dict(
    iters=20,  # timed steps per run
    warmup=5,  # untimed steps per run first (torch.compile compiles here)
    impl="auto",  # future attention: 'auto', 'readable', 'fast', 'flex', or a comma list of them
    compare=False,  # interleave all runs in one process; print ratios to the first run
    explain=False,  # print torch._dynamo.explain's graph and graph-break counts instead of timing
    sweep_block_size="",  # e.g. '256,512,1024,2048': time and peak memory per block_size
)
IMPLS = ("auto", "readable", "fast", "flex")


def parse_args(argv):
    """(bench settings, [(label, train config, impl)]) from `[config.py ...] [--key=value ...]`."""
    argv = [a + "=True" if a in ("--compare", "--explain") else a for a in argv]
    paths = [a for a in argv if not a.startswith("--")]
    flags = [a for a in argv if a.startswith("--")]
    _, overrides = configurator.parse(flags)
    bench = configurator.merge(BENCH_DEFAULTS, {}, {k: v for k, v in overrides.items() if k in BENCH_DEFAULTS})
    impls = bench["impl"].split(",")
    if not set(impls) <= set(IMPLS):
        raise configurator.ConfigError(f"impl must be one or more of {', '.join(IMPLS)}, got {bench['impl']!r}")
    train_flags = [f for f in flags if f[2:].partition("=")[0] not in BENCH_DEFAULTS]
    runs = []
    for path in paths or [None]:
        try:
            config = train.get_config(([path] if path else []) + train_flags)
        except configurator.ConfigError as e:
            raise configurator.ConfigError(f"{e}\nbench.py's own keys: {', '.join(BENCH_DEFAULTS)}") from None
        future = config["model_type"] == "future_attn"
        if future and "flex" in impls and not config["device"].startswith("cuda"):
            raise configurator.ConfigError("impl=flex needs --device=cuda: FlexAttention has no backward on a CPU")
        if "compile" not in overrides and not config["device"].startswith("cuda"):
            config["compile"] = False  # compiling takes minutes on a CPU; --compile=True to try
        label = os.path.basename(path)[:-3] if path else config["model_type"]
        for impl in impls if future else ["auto"]:
            runs.append((f"{label}[{impl}]" if future else label, config, impl))
    return bench, runs


def build(label, config, impl):
    """A dict with everything one run's step needs: model, optimizer, batch, autocast."""
    device = config["device"]
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    dtype, autocast = train.autocast_for(config["dtype"], device_type)
    torch.manual_seed(config["seed"])
    module = train.MODELS[config["model_type"]]
    model = module.GPT(module.GPTConfig(**train.model_args_of(config))).to(device)
    optimizer = model.configure_optimizers(
        config["weight_decay"], config["learning_rate"], (config["beta1"], config["beta2"]), device_type
    )
    shape = (config["batch_size"], config["block_size"])
    x = torch.randint(config["vocab_size"], shape, device=device)
    y = torch.randint(config["vocab_size"], shape, device=device)
    return dict(label=label, config=config, impl=impl, device=device, dtype=dtype, autocast=autocast,
                model=model, step_model=torch.compile(model) if config["compile"] else model,
                optimizer=optimizer, x=x, y=y, times=[], peak_memory=0)


def sync(run):
    if run["device"].startswith("cuda"):
        torch.cuda.synchronize(run["device"])


def step(run):
    """One timed training step; on CUDA also records the step's peak memory."""
    model_future_attn.FUTURE_ATTN_IMPL = run["impl"]
    cuda = run["device"].startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(run["device"])
    sync(run)
    t0 = time.perf_counter()
    with run["autocast"]:
        _, loss, _ = run["step_model"](run["x"], run["y"])
    loss.backward()
    run["optimizer"].step()
    run["optimizer"].zero_grad(set_to_none=True)
    sync(run)
    dt = time.perf_counter() - t0
    if cuda:
        run["peak_memory"] = max(run["peak_memory"], torch.cuda.max_memory_allocated(run["device"]))
    return dt


def peak_rss():
    """The process's peak resident memory in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def time_runs(runs, bench):
    """warmup, then iters rounds of one step per run; the runs' step times fill run['times']."""
    rss_before = peak_rss()
    for _ in range(bench["warmup"]):
        for run in runs:
            step(run)
    for _ in range(bench["iters"]):
        for run in runs:
            run["times"].append(step(run))
    if not runs[0]["device"].startswith("cuda") and len(runs) == 1:
        runs[0]["peak_memory"] = peak_rss() - rss_before


def report(run, first=None):
    times = sorted(run["times"])
    dt = statistics.median(times)
    config = run["config"]
    tokens = config["batch_size"] * config["block_size"]
    line = (f"{run['label']:28s} {dt * 1000:9.1f} ms/iter (min {times[0] * 1000:.1f}, max {times[-1] * 1000:.1f})"
            f" {tokens / dt:9.0f} tokens/s")
    if run["device"].startswith("cuda"):
        mfu = run["model"].estimate_mfu(config["batch_size"], dt, flops_promised=train.peak_flops(run["device"]))
        line += f"  MFU {mfu * 100:5.1f}%"
    line += f"  peak memory {run['peak_memory'] / 2**20:8.1f} MiB" if run["peak_memory"] else "  peak memory n/a"
    if first is not None:
        ratios = [t / t0 for t, t0 in zip(run["times"], first["times"])]  # per round
        line += f"  ratio {statistics.median(ratios):.3f} (rounds {min(ratios):.2f}-{max(ratios):.2f})"
    print(line)


def explain(run):
    """Counts the graphs and graph breaks torch.compile makes of one training forward."""
    model_future_attn.FUTURE_ATTN_IMPL = run["impl"]
    with run["autocast"]:
        result = torch._dynamo.explain(run["model"])(run["x"], run["y"])
    print(f"{run['label']}: {result.graph_count} graphs, {result.graph_break_count} graph breaks")
    for reason in result.break_reasons:
        print(f"  break: {reason.reason}")


def sweep(run, bench):
    """ms/iter and peak memory at each block_size of --sweep_block_size (T = block_size)."""
    for block_size in [int(t) for t in bench["sweep_block_size"].split(",")]:
        config = dict(run["config"], block_size=block_size)
        torch._dynamo.reset()  # a fresh compile per length: no recompile limit, no dynamic shapes
        try:
            one = build(f"{run['label']} T={block_size}", config, run["impl"])
            time_runs([one], bench)
            report(one)
        except torch.OutOfMemoryError:
            print(f"{run['label']} T={block_size}: out of memory")
        one = None
        if run["device"].startswith("cuda"):
            torch.cuda.empty_cache()


def main(argv):
    try:
        bench, runs = parse_args(argv)
    except (configurator.ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    device = runs[0][1]["device"]
    torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {name}; warmup {bench['warmup']}, iters {bench['iters']}")
    if bench["sweep_block_size"]:  # builds its own models, one block_size at a time
        for label, config, impl in runs:
            sweep(dict(label=label, config=config, impl=impl, device=config["device"]), bench)
        return 0
    runs = [build(*run) for run in runs]
    for run in runs:
        print(f"{run['label']}: {run['model'].get_num_params():,} parameters, batch {run['config']['batch_size']} "
              f"x block_size {run['config']['block_size']}, {run['dtype']}, compile={run['config']['compile']}")
    if bench["explain"]:
        for run in runs:
            explain(run)
    elif bench["compare"]:
        time_runs(runs, bench)
        for run in runs:
            report(run, first=runs[0])
    else:
        for run in runs:
            time_runs([run], bench)
            report(run)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
