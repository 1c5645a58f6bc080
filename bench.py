r"""
Times one training step of the models that config files describe, on random tokens, after a
warm-up: what train.py runs per iteration, gradient_accumulation_steps forward-backward passes
(train.forward_backward) and one AdamW step. Settings are train.py's (config file plus
--key=value flags), with a few of bench.py's own (BENCH_DEFAULTS below);
--gradient_accumulation_steps=1 times a single micro-step and its AdamW step.

    python bench.py config/future50_mse.py --device=cpu --batch_size=4 \
        --gradient_accumulation_steps=1
    python bench.py config/baseline.py config/future50_mse.py --compare --impl=readable,fast \
        --device=cpu --batch_size=4
    python bench.py config/future50_mse.py --explain  # graph breaks under torch.compile
    python bench.py config/future50_mse.py --sweep_block_size=256,512,1024,2048 --batch_size=8
    python bench.py config/baseline.py --profile      # where a step's time goes, by kind
    python bench.py config/baseline.py --splits=50x16,100x8,200x4  # batch x accumulation,
                                                                   # same tokens
    python bench.py --gpu_report                      # on a GPU: splits and profiles of the
                                                      # write-ups' models, in one markdown file
    python bench.py --prepare                         # prepare_wikipedia.py's speed and memory
    python bench.py --prepare --writeup               # the same, the write-ups' text
    python bench.py --causal=my_model.py:build        # check_causal.py --model, timed per model

--compare runs all configs in one process, one step of each in turn, and prints each one's
time over the first's, the median of the per-round ratios: a busy machine slows every
config in a round alike, so the ratios hold where the milliseconds wander. --impl picks
the future-attention code (model_future_attn.GPT.set_impl); a comma list times the
future-attention configs once per implementation. On a CPU, compile is off unless asked
for (it takes minutes there) and peak memory is the growth of the process's peak RSS.

--profile=N traces N steps with torch.profiler after the warm-up and sums their time by
kernel kind (kind_of): on CUDA the GPU's kernels and copies, plus the GPU's idle time
between them (host gaps: Python, launches, syncs); on a CPU the ops' own (self) time, plus
the time outside any op. Kernel names cannot tell the output head's matmul from the
layers', so it counts under matmul, and the report gives its share of the model's FLOPs.

--memory traces one step after the warm-up and prints the most tensor memory allocated during
it, above what the step started with (the weights and AdamW's state), from the allocator's
running total in torch.profiler's allocation records: on a CPU too, where the peak RSS above
also counts the allocator's and Python's own memory.

--splits times whole optimizer steps for each way of splitting the same sequences per step
into batch_size x gradient_accumulation_steps.

--gpu_report, on a CUDA GPU, times --splits=50x16,100x8,200x4,400x2,800x1 of the configs in
GPU_REPORT_CONFIGS at their own settings (torch.compile, bf16), skipping a split that runs out
of memory, then profiles the fastest split of the baseline and of future attention, and writes
the tables to out-bench/gpu_report.md (or --gpu_report=FILE.md) after each config.

Peak memory: on CUDA the most allocated during a step; on a CPU the growth of the process's
peak resident memory (RSS) over its steps, one run per process (--warmup=0 --iters=1: the
first step's, AdamW's state included).
"""

import collections
import itertools
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import torch
from torch._C._profiler import _EventType
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

import configurator
import model_future_attn
import train
from configurator import ConfigError, UserError

BENCH_DEFAULTS = dict(
    iters=20,  # timed steps per run
    warmup=5,  # untimed steps per run first (torch.compile compiles here)
    impl="auto",  # future attention: 'auto', 'readable', 'fast', 'flex', or a comma list of them
    compare=False,  # interleave all runs in one process; print ratios to the first run
    explain=False,  # print torch._dynamo.explain's graph and graph-break counts instead of timing
    sweep_block_size="",  # e.g. '256,512,1024,2048': time and peak memory per block_size
    splits="",  # e.g. '50x16,100x8': batch_size x gradient_accumulation_steps, all the same product
    profile=0,  # steps to trace with torch.profiler after the warm-up (a bare --profile: 5)
    # with --profile: also write the trace to this .json (chrome://tracing, Perfetto)
    profile_trace="",
    # the peak tensor memory of one step after the warm-up, from torch.profiler's allocation records
    memory=False,
    # e.g. 'my_models.py:gpt2,my_models.py:bert': seconds of `check_causal.py --model=` per model
    causal="",
    # a markdown file: on a CUDA GPU, --splits and --profile of the write-ups' models (GPU_REPORT)
    gpu_report="",
)
# The modes: at most one per run.
MODES = ("compare", "explain", "sweep_block_size", "splits", "profile", "memory", "causal",
         "gpu_report")
PROFILE_STEPS = 5  # what a bare --profile traces
# --gpu_report: the write-ups' models at their settings, their 800 sequences per optimizer step
# split five ways, and a profile of the fastest split of each model type in GPU_REPORT_PROFILED
GPU_REPORT = "out-bench/gpu_report.md"  # where a bare --gpu_report writes
GPU_REPORT_CONFIGS = ("baseline", "future50_mse", "encdec_mse_possub")
GPU_REPORT_SPLITS = "50x16,100x8,200x4,400x2,800x1"
GPU_REPORT_PROFILED = ("baseline", "future_attn")
REPO = os.path.dirname(os.path.abspath(__file__))
IMPLS = model_future_attn.IMPLS  # 'auto', 'readable', 'fast', 'flex'


def parse_args(argv):
    """(bench settings, [(label, train config, impl)]) from `[config.py ...] [--key=value ...]`."""
    bare = {"--profile": f"--profile={PROFILE_STEPS}", "--gpu_report": f"--gpu_report={GPU_REPORT}"}
    argv = [bare.get(arg, arg) for arg in configurator.normalize(argv)]
    paths = [a for a in argv if not a.startswith("--")]
    flags = [a for a in argv if a.startswith("--")]
    _, overrides = configurator.parse(flags)
    bench_overrides = {k: v for k, v in overrides.items() if k in BENCH_DEFAULTS}
    bench = configurator.merge(BENCH_DEFAULTS, {}, bench_overrides)
    impls = bench["impl"].split(",")
    if not set(impls) <= set(IMPLS):
        raise ConfigError(f"impl must be one or more of {', '.join(IMPLS)}, "
                          f"got {bench['impl']!r}")
    modes = [f"--{mode}" for mode in MODES if bench[mode]]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} do not go together: pick one")
    if bench["profile_trace"] and not bench["profile"]:
        raise ConfigError("--profile_trace saves the trace of --profile: "
                          "add --profile")
    trace_dir = os.path.dirname(os.path.abspath(bench["profile_trace"]))
    if bench["profile_trace"] and not os.path.isdir(trace_dir):
        raise ConfigError("no directory for "
                          f"--profile_trace={bench['profile_trace']}: create it first")
    if bench["gpu_report"]:
        if paths:
            raise ConfigError("--gpu_report times the write-ups' three configs: give no config "
                              "file")
        paths = [os.path.join(REPO, "config", f"{name}.py") for name in GPU_REPORT_CONFIGS]
        bench.update(splits=GPU_REPORT_SPLITS, profile=PROFILE_STEPS)
    bench["splits"] = parse_splits(bench["splits"]) if bench["splits"] else []
    train_flags = [f for f in flags if f[2:].partition("=")[0] not in BENCH_DEFAULTS]
    runs = []
    for path in paths or [None]:
        config = train.get_config(([path] if path else []) + train_flags,
                                  script_keys=BENCH_DEFAULTS)
        future = config["model_type"] == "future_attn"
        if future and "flex" in impls and not config["device"].startswith("cuda"):
            raise ConfigError("impl=flex needs --device=cuda: "
                              "FlexAttention has no backward on a CPU")
        label = os.path.basename(path)[:-3] if path else config["model_type"]
        for impl in impls if future else ["auto"]:
            runs.append((f"{label}[{impl}]" if future else label, config, impl))
    if bench["profile_trace"] and len(runs) > 1:
        raise ConfigError("--profile_trace takes one config and one --impl "
                          "(one trace per file)")
    return bench, runs


def parse_splits(text):
    """[(batch_size, gradient_accumulation_steps)] from '50x16,100x8', all with the same product."""
    try:
        splits = [tuple(int(n) for n in split.split("x")) for split in text.split(",")]
    except ValueError:
        splits = []
    if not splits or any(len(split) != 2 or min(split) < 1 for split in splits):
        raise ConfigError("write splits as BATCHxACCUM, e.g. --splits=50x16,100x8; "
                          f"got {text!r}")
    (b0, k0), *others = splits
    for b, k in others:
        if b * k != b0 * k0:
            raise ConfigError(
                f"split {b}x{k} trains on {b * k} sequences per optimizer step "
                f"but {b0}x{k0} on {b0 * k0}: give splits of the same product"
            )
    return splits


def build(label, config, impl, micro_steps=None):
    """A dict with everything one run's step needs: model, optimizer, batch, autocast; a step
    is micro_steps forward-backward passes, by default the config's gradient_accumulation_steps."""
    device = config["device"]
    dtype, autocast = train.autocast_for(config["dtype"], torch.device(device).type)
    torch.manual_seed(config["seed"])
    # train.py's model, AdamW and gradient scaler (it also turns on TF32 matmuls)
    model, optimizer, scaler = train.build(dict(config, dtype=dtype), 0, None, None)
    if config["model_type"] == "future_attn":
        try:
            model.set_impl(impl)
        except ValueError as e:  # an implementation that cannot compute this config's attention
            raise ConfigError(str(e)) from None
    shape = (config["batch_size"], config["block_size"])
    x = torch.randint(config["vocab_size"], shape, device=device)
    y = torch.randint(config["vocab_size"], shape, device=device)
    return dict(label=label, config=config, impl=impl, device=device, dtype=dtype,
                autocast=autocast, model=model,
                step_model=torch.compile(model) if config["compile"] else model,
                optimizer=optimizer, scaler=scaler, x=x, y=y,
                micro_steps=micro_steps or config["gradient_accumulation_steps"],
                times=[], peak_memory=0)


def sync(run):
    """Waits for the GPU's queued work, so that a time is that of the work, not of queuing it."""
    if run["device"].startswith("cuda"):
        torch.cuda.synchronize(run["device"])
    elif run["device"].startswith("mps"):
        torch.mps.synchronize()


def step(run):
    """One timed optimizer step as train.run takes it: run['micro_steps'] forward-backward
    passes of the batch, the gradients unscaled and clipped (or their norm taken), the step's
    one read from the device, then AdamW. On CUDA it also records the step's peak memory."""
    cuda = run["device"].startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(run["device"])
    sync(run)
    t0 = time.perf_counter()
    numbers = train.forward_backward(run["step_model"], itertools.repeat((run["x"], run["y"])),
                                     run["micro_steps"], run["autocast"], run["scaler"])
    numbers["grad_norm"] = train.unscale_and_clip(run["optimizer"], run["scaler"],
                                                  run["config"]["grad_clip"])
    train.read_numbers(numbers, ddp=False)  # the step's one read from the device
    run["scaler"].step(run["optimizer"])
    run["scaler"].update()
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


def measure(run, bench):
    """A run's timed steps in numbers: the median ms per step (and the fastest and slowest),
    tokens/s, MFU (on a GPU of known peak, else None) and peak memory in bytes (or None)."""
    times = sorted(run["times"])
    dt = statistics.median(times)
    config = run["config"]
    sequences = config["batch_size"] * run["micro_steps"]  # per step
    mfu = None
    if run["device"].startswith("cuda") and bench["peak_flops"]:
        mfu = run["model"].estimate_mfu(sequences, dt, flops_promised=bench["peak_flops"])
    return dict(ms=dt * 1000, min_ms=times[0] * 1000, max_ms=times[-1] * 1000,
                tokens_per_s=sequences * config["block_size"] / dt, mfu=mfu,
                peak_memory=run["peak_memory"] or None)


def report(run, bench, first=None):
    """Prints a run's line and returns its numbers (measure)."""
    numbers = measure(run, bench)
    line = (f"{run['label']:28s} {numbers['ms']:9.1f} ms/iter "
            f"(min {numbers['min_ms']:.1f}, max {numbers['max_ms']:.1f})"
            f" {numbers['tokens_per_s']:9.0f} tokens/s")
    if numbers["mfu"] is not None:
        line += f"  MFU {numbers['mfu'] * 100:5.1f}%"
    elif run["device"].startswith("cuda"):
        line += "  MFU n/a"
    if numbers["peak_memory"]:
        line += f"  peak memory {numbers['peak_memory'] / 2**20:8.1f} MiB"
    else:
        line += "  peak memory n/a"
    if first is not None:
        ratios = [t / t0 for t, t0 in zip(run["times"], first["times"])]  # per round
        line += (f"  ratio {statistics.median(ratios):.3f} "
                 f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")
    print(line)
    return numbers


def explain(run):
    """Counts the graphs and graph breaks torch.compile makes of one training forward."""
    with run["autocast"]:
        result = torch._dynamo.explain(run["model"])(run["x"], run["y"])
    print(f"{run['label']}: {result.graph_count} graphs, {result.graph_break_count} graph breaks")
    for reason in result.break_reasons:
        print(f"  break: {reason.reason}")


def time_each(run, bench, variants):
    """Times each (label, config changes, micro-steps) of variants in turn, one model at a time.
    Returns the numbers of each (measure), or None for one that ran out of memory."""
    cuda = run["device"].startswith("cuda")
    results = []
    for i, (label, changes, micro_steps) in enumerate(variants):
        torch._dynamo.reset()  # a fresh compile per shape: no recompile limit, no dynamic shapes
        numbers = one = None
        try:
            one = build(label, dict(run["config"], **changes), run["impl"], micro_steps=micro_steps)
            time_runs([one], bench)
            if not cuda and i > 0:
                # The process's peak RSS never falls: it measures the first variant only.
                one["peak_memory"] = 0
            numbers = report(one, bench)
        except torch.OutOfMemoryError:
            print(f"{label}: out of memory, skipped")
        results.append(numbers)
        one = None  # its memory is free for the next variant
        if cuda:
            torch.cuda.empty_cache()
    return results


def sweep(run, bench):
    """ms/iter and peak memory at each block_size of --sweep_block_size (T = block_size)."""
    block_sizes = [int(t) for t in bench["sweep_block_size"].split(",")]
    time_each(run, bench, [(f"{run['label']} T={T}", dict(block_size=T), 1) for T in block_sizes])


def splits(run, bench):
    """ms per optimizer step, tokens/s and peak memory of each batch_size x accumulation split
    (time_each's numbers)."""
    (b0, k0), T = bench["splits"][0], run["config"]["block_size"]
    print(f"{run['label']}: {b0 * k0 * T:,} tokens per optimizer step "
          f"({b0 * k0} sequences of {T}); an iter below is a whole optimizer step")
    variants = [(f"{run['label']} {b}x{k}", dict(batch_size=b, gradient_accumulation_steps=k), k)
                for b, k in bench["splits"]]
    return time_each(run, bench, variants)


def peak_memory(run, bench):
    """Prints the most tensor memory allocated during one step after the warm-up, above what
    was allocated when it started: the allocator's running total in the allocation records
    on the run's device, less its value before the step's first allocation."""
    for _ in range(bench["warmup"]):
        step(run)
    cuda = run["device"].startswith("cuda")
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        step(run)
    device_type = "cuda" if cuda else "cpu"
    records, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:  # every allocation and free, wherever in the op tree
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == device_type:
            records.append((event.start_time_ns, event.extra_fields))
    records.sort(key=lambda record: record[0])
    first = records[0][1]
    start = first.total_allocated - first.alloc_size  # the allocator's total before the step
    peak = max(fields.total_allocated for _, fields in records) - start
    config = run["config"]
    print(f"{run['label']}: peak tensor memory of one step "
          f"({run['micro_steps']} x (forward, backward) of batch "
          f"{config['batch_size']} x {config['block_size']}, then AdamW): "
          f"{peak / 2**20:,.1f} MiB above its start")


# --------------------------------------------------------------------------------------
# profile: where a step's time goes

KINDS = ("matmul", "attention", "head + loss", "norm + pointwise", "optimizer", "memory copies",
         "other")
# (kind, pattern) for a lowercased CUDA kernel name (cuBLAS, FlashAttention, ATen, Triton
# from torch.compile) or CPU op name (aten::...); the first pattern that matches wins
KIND_PATTERNS = (
    # autograd's bookkeeping around each backward op (the op's own work has its own name)
    ("other", r"^autograd::|^torch::autograd::|backward\d+$"),
    ("optimizer", r"adam|^optimizer\.|foreach|multi_tensor"),
    ("head + loss", r"log_?softmax|nll_loss|cross_entropy"),
    # torch.compile's Triton kernels: pointwise, reduction, persistent reduction (named after
    # all the ops they fuse, so they may mention addmm or attention)
    ("norm + pointwise", r"^triton_(poi|red|per)_"),
    ("attention", r"flash|fmha|sdpa|scaled_dot_product|efficient_attention|flex_attention"),
    ("matmul", r"gemm|gemv|cutlass|xmma|nvjet|cublas|splitkreduce|"
               r"(^|_|::)(mm|addmm|bmm|baddbmm|matmul|linear)(_|$)"),
    ("memory copies", r"memcpy|memset|copy|clone|contiguous|fill|^aten::cat$"),
    ("norm + pointwise", r"layer_norm|gammabeta|elementwise|reduce_kernel|softmax|"
                         r"^aten::_?(add|sub|mul|div|neg|pow|sqrt|rsqrt|exp|log|tanh|gelu|where|"
                         r"sum|mean|norm|lerp)"),
)
TOP_KERNELS = 15


def kind_of(name):
    """The kind of work (one of KINDS) of a CUDA kernel or CPU op, from its name."""
    name = name.lower()
    for kind, pattern in KIND_PATTERNS:
        if re.search(pattern, name):
            return kind
    return "other"


def kind_of_op(event):
    """A CPU op's kind: its outermost caller's with a kind other than 'other', so that the
    fills inside the loss's backward count as loss and AdamW's plain aten ops as optimizer."""
    kind = "other"
    while event is not None:
        caller_kind = kind_of(event.name)
        kind = caller_kind if caller_kind != "other" else kind
        event = event.cpu_parent
    return kind


def busy_time(intervals):
    """The length of the union of (start, end) intervals: the time something ran."""
    busy, reached = 0.0, float("-inf")
    for start, end in sorted(intervals):
        busy += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return busy


def profile(run, bench):
    """Traces bench['profile'] steps after the warm-up; prints and returns the ms per step by
    kind, with the time in which nothing ran (GPU idle, or outside ops on a CPU) and the total."""
    cuda = run["device"].startswith("cuda")
    n = bench["profile"]
    for _ in range(bench["warmup"]):
        step(run)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        # ms per step; step() syncs before and after
        wall = sum(step(run) for _ in range(n)) * 1e3 / n
    events = prof.events()
    if cuda:  # what the GPU ran: kernels, copies and fills
        events = [e for e in events if e.device_type == DeviceType.CUDA]
        work = [(e.name, kind_of(e.name), e.time_range.elapsed_us()) for e in events]
    else:  # each op's time outside the ops it calls
        work = [(e.name, kind_of_op(e), e.self_cpu_time_total) for e in events]
    busy = busy_time([(e.time_range.start, e.time_range.end) for e in events]) / 1e3 / n
    ms_by_kind = dict.fromkeys(KINDS, 0.0)
    ms_by_name, calls = collections.Counter(), collections.Counter()
    for name, kind, us in work:
        ms_by_kind[kind] += us / 1e3 / n
        ms_by_name[name, kind] += us / 1e3 / n  # on a CPU, one op can do several kinds of work
        calls[name, kind] += 1
    gap = "host gaps (GPU idle)" if cuda else "outside ops (Python)"
    rows = {**ms_by_kind, gap: wall - busy, "total (wall)": wall}

    config = run["config"]
    print(f"{run['label']}: {n} steps traced, each {run['micro_steps']} forward and backward "
          f"passes of batch {config['batch_size']} x {config['block_size']} tokens, then AdamW: "
          f"{wall:.2f} ms/step (the profiler slows the host side)")
    print(f"  {'kind':24s} {'ms/step':>9s} {'%':>7s}")
    for kind, ms in rows.items():
        print(f"  {kind:24s} {ms:9.2f} {ms / wall * 100:6.1f}%")
    if sum(ms_by_kind.values()) > 1.01 * busy:
        print(f"  note: work overlapped (streams or threads): the kinds add up to "
              f"{sum(ms_by_kind.values()):.2f} ms but something ran during {busy:.2f} ms")
    head = 6 * config["n_embd"] * config["vocab_size"] / run["model"].flops_per_token()
    print(f"  the output head's matmuls, 6 x n_embd x vocab_size FLOPs per token, "
          f"are {head * 100:.0f}% of the model's FLOPs; they count under matmul")
    print(f"  top {TOP_KERNELS} {'kernels' if cuda else 'ops'} by time:")
    print(f"  {'ms/step':>9s} {'calls/step':>10s}  {'kind':17s} name")
    for (name, kind), ms in ms_by_name.most_common(TOP_KERNELS):
        short = name if len(name) <= 90 else name[:87] + "..."
        print(f"  {ms:9.2f} {calls[name, kind] / n:10.1f}  {kind:17s} {short}")
    if bench["profile_trace"]:
        root, ext = os.path.splitext(bench["profile_trace"])
        prof.export_chrome_trace(f"{root}.tmp{ext}")
        os.replace(f"{root}.tmp{ext}", bench["profile_trace"])  # whole or not at all
        print(f"  trace written to {bench['profile_trace']} "
              "(open it in chrome://tracing or ui.perfetto.dev)")
    return rows


# --------------------------------------------------------------------------------------
# --gpu_report: the write-ups' models on a GPU, in one markdown file


def gpu_report(runs, bench, machine):
    """Times the splits of each run, then profiles the fastest split of each model type in
    GPU_REPORT_PROFILED. The markdown file is written after each config, so that a run cut short
    keeps what it measured."""
    path, timings, profiles = bench["gpu_report"], {}, {}
    first, (b0, k0) = runs[0][1], bench["splits"][0]
    dtype = train.autocast_for(first["dtype"], torch.device(first["device"]).type)[0]
    about = (f"{machine}. Each config at its own settings (compile={first['compile']}, {dtype}), "
             f"{b0 * k0} sequences of {first['block_size']} tokens per optimizer step, split as "
             f"batch_size x gradient_accumulation_steps; the median of {bench['iters']} steps "
             f"after {bench['warmup']} of warm-up.")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for label, config, impl in runs:
        run = dict(label=label, config=config, impl=impl, device=config["device"])
        timings[label] = splits(run, bench)
        measured = [(numbers["ms"], split)
                    for split, numbers in zip(bench["splits"], timings[label]) if numbers]
        if config["model_type"] in GPU_REPORT_PROFILED and measured:
            b, k = min(measured)[1]
            changes = dict(batch_size=b, gradient_accumulation_steps=k)
            torch._dynamo.reset()
            fastest = build(f"{label} {b}x{k}", dict(config, **changes), impl, micro_steps=k)
            profiles[fastest["label"]] = profile(fastest, bench)
            del fastest  # its memory is free for the next config's splits
            torch.cuda.empty_cache()
        text = gpu_report_markdown(about, bench["splits"], timings, profiles, bench["profile"])
        train.write_atomically(path, lambda f: f.write(text.encode()))
        print(f"wrote {path}")
    return 0


def gpu_report_markdown(about, splits, timings, profiles, profiled_steps):
    """The --gpu_report file: a row per config and split, from timings {label: [measure() of
    each split, or None where it ran out of memory]}; then the ms per step by kind of each
    profiled split, from profiles {label: profile()}."""
    lines = ["# bench.py --gpu_report", "", about, "",
             "| config | split | ms per step | tokens/s | MFU | peak memory |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for label, results in timings.items():
        for (b, k), numbers in zip(splits, results):
            if numbers is None:
                lines.append(f"| {label} | {b}x{k} | out of memory | | | |")
                continue
            mfu = "-" if numbers["mfu"] is None else f"{numbers['mfu'] * 100:.1f}%"
            memory = "-" if numbers["peak_memory"] is None else (
                f"{numbers['peak_memory'] / 2**30:.1f} GiB")
            lines.append(f"| {label} | {b}x{k} | {numbers['ms']:.1f} | "
                         f"{numbers['tokens_per_s']:,.0f} | {mfu} | {memory} |")
    if profiles:
        lines += ["", f"Where the time of a step goes at the fastest split, in ms per step and "
                  f"share of the wall time ({profiled_steps} steps traced; the profiler slows "
                  "the host side):", "",
                  "| kind |" + "".join(f" {label} | % |" for label in profiles),
                  "| --- |" + " ---: | ---: |" * len(profiles)]
        for kind in next(iter(profiles.values())):
            cells = "".join(f" {rows[kind]:.2f} | {rows[kind] / rows['total (wall)'] * 100:.1f}% |"
                            for rows in profiles.values())
            lines.append(f"| {kind} |{cells}")
    return "\n".join(lines) + "\n"


def causal_seconds(models):
    """For each MODULE:FACTORY of a comma list, `python check_causal.py --model=MODULE:FACTORY` in
    a fresh process, as a CI job runs it: its wall seconds, its CPU seconds (user + system, the
    steadier number on a busy machine), the part the exact checks took (the rest is starting
    Python and importing torch and the model's library) and the verdict."""
    check_causal = os.path.join(REPO, "check_causal.py")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; "
          "each model checked in a fresh process")
    print(f"{'model':40s} {'wall s':>7s} {'CPU s':>6s} {'checks s':>8s}  verdict")
    for spec in models.split(","):
        before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        done = subprocess.run([sys.executable, check_causal, f"--model={spec}"],
                              capture_output=True, text=True)
        wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        # A leak ends the checks early: no total.
        checks = re.search(r"\[the checks: ([\d.]+) s\]", done.stdout)
        checks_s = checks.group(1) if checks else "-"
        last_error_line = (done.stderr.strip().splitlines() or ["?"])[-1]
        verdict = {0: "causal", 1: "leak"}.get(done.returncode) or last_error_line
        print(f"{spec:40s} {wall:7.1f} {cpu:6.1f} {checks_s:>8s}  {verdict}")


# --------------------------------------------------------------------------------------
# prepare_wikipedia.py: how fast on a large corpus, and in how much memory (bench.py --prepare)

PREPARE_CHILD = """
import json, re, sys, time
import prepare_wikipedia, tiktoken
tiktoken.get_encoding("gpt2")  # loaded once per process, as the modules are: not part of the speed

def status(key):  # in MiB, from the kernel's account of this process
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\\s+(\\d+) kB", f.read()).group(1)) / 1024

imports = status("VmRSS")  # the interpreter and the modules, torch's among them
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak so far was the imports': start it again from here
t0 = time.perf_counter()
meta = prepare_wikipedia.prepare_data(sys.argv[1:])
print(json.dumps(dict(seconds=time.perf_counter() - t0,
                      tokens=meta["train"]["tokens"] + meta["val"]["tokens"],
                      peak=status("VmHWM"), imports=imports)))
"""


def write_corpus(path, chars, seed=0):
    """About `chars` characters of WikiText-like articles (` = Title = ` headings, ` @-@ ` and
    ` , ` marks, numbers) of English words drawn from this repository's docs; a text of at most
    5 MB, repeated."""
    import glob, random  # noqa: E401 (this mode's own)
    docs = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    words = re.findall(r"[A-Za-z]+", " ".join(open(doc).read() for doc in docs))
    rng, articles, size = random.Random(seed), [], 0
    while size < min(chars, 5e6):
        paragraphs = []
        for _ in range(rng.randint(2, 12)):
            n = rng.randint(40, 160)
            marks = rng.choices([" ", " , ", " . ", " @-@ ", " 's ", f" {rng.randint(1, 2000)} "],
                                weights=[85, 5, 5, 2, 1, 2], k=n)
            sentence = "".join(w + m for w, m in zip(rng.choices(words, k=n), marks))
            paragraphs.append(" " + sentence + ". \n \n")
        articles.append(f" = {' '.join(rng.choices(words, k=3))} = \n \n" + "".join(paragraphs))
        size += len(articles[-1])
    text = "".join(articles)
    with open(path, "w") as f:
        for start in range(0, int(chars), len(text)):
            f.write(text[:int(chars) - start])


def run_prepare(argv):
    """prepare_wikipedia.py with argv in a child process: its seconds (after the imports), tokens,
    peak memory."""
    import json, subprocess  # noqa: E401 (this mode's own)
    child = subprocess.run([sys.executable, "-c", PREPARE_CHILD, *argv], capture_output=True,
                           text=True, cwd=REPO)
    if child.returncode:
        raise UserError(f"prepare_wikipedia.py failed: {child.stderr.strip().splitlines()[-1]}")
    return json.loads(child.stdout.splitlines()[-1])


def tiktoken_seconds(batches, num_threads, arrays=False, end_of_text=True):
    """(seconds, tokens) of tiktoken's own encode_ordinary_batch on batches of documents, an
    <|endoftext|> counted per document if end_of_text; each batch's tokens are dropped as the next
    is encoded, as prepare drops them. arrays: the encoder prepare uses instead, encode_to_numpy
    mapped over each batch on a pool of as many threads."""
    import concurrent.futures, functools, tiktoken  # noqa: E401 (this mode's own)
    encoding = tiktoken.get_encoding("gpt2")
    encode = functools.partial(encoding.encode_to_numpy, disallowed_special=())
    t0, tokens, ends = time.perf_counter(), 0, int(end_of_text)
    with concurrent.futures.ThreadPoolExecutor(num_threads) as pool:
        for batch in batches:
            if arrays:
                tokens += sum(len(ids) + ends for ids in pool.map(encode, batch))
            else:
                encoded = encoding.encode_ordinary_batch(batch, num_threads=num_threads)
                tokens += sum(len(ids) + ends for ids in encoded)
    return time.perf_counter() - t0, tokens


def bench_prepare(argv):
    """python bench.py --prepare [--writeup] [--mb 50] [--threads N] [--rounds 5] [--memory_at 4]:
    prepare_wikipedia.py on --mb MB of WikiText-like text (write_corpus) and a val file 1/50 of it,
    run in a child process; with --writeup, the write-ups' text path instead (--dataset=writeup
    --input: their 90/10 split of one text, in pieces, no <|endoftext|>). Its tokens per second are
    set beside tiktoken's own encode_ordinary_batch on the same documents (or pieces), in the same
    batches, with the same threads, timed before and after each of --rounds runs of prepare: the
    ratio to their mean holds on a busy machine where the speeds wander. It is set beside prepare's
    own encoder (encode_to_numpy on a thread pool) too, timed just after. Its peak memory (RSS) is
    measured on that corpus and on one --memory_at times larger."""
    import argparse, shutil, tempfile  # noqa: E401 (this mode's own)
    import prepare_wikipedia
    parser = argparse.ArgumentParser(prog="bench.py --prepare")
    parser.add_argument("--mb", type=float, default=50,
                        help="the corpus, in millions of characters")
    parser.add_argument("--writeup", action="store_true", help="the write-ups' text path")
    parser.add_argument("--threads", "--num_proc", type=int, default=os.cpu_count(),
                        help="tokenizer threads")
    parser.add_argument("--rounds", type=int, default=5,
                        help="runs of prepare, each between two of tiktoken")
    parser.add_argument("--memory_at", default="4",
                        help="larger corpora whose peak memory is measured, in --mb")
    args = parser.parse_args(argv)
    path = "the write-ups' text path" if args.writeup else "documents"
    print(f"prepare_wikipedia.py ({path}), {args.threads} tokenizer threads; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    folder = tempfile.mkdtemp(prefix="bench_prepare_")
    val, corpus = os.path.join(folder, "val.txt"), os.path.join(folder, "train.txt")
    out = ["--out_dir", os.path.join(folder, "out"), "--threads", str(args.threads)]
    prepare_argv = (["--dataset=writeup", "--input", corpus, *out] if args.writeup
                    else ["--input", corpus, "--val", val, *out])

    def report_memory(runs, scale):
        peak, imports = max(run["peak"] for run in runs), max(run["imports"] for run in runs)
        print(f"{scale:g}x ({os.path.getsize(corpus) / 1e6:.0f} MB of text): "
              f"peak memory {peak:.0f} MiB, "
              f"{peak - imports:.0f} MiB above the imports' {imports:.0f} MiB")

    try:
        write_corpus(val, args.mb * 1e6 / 50, seed=1)
        write_corpus(corpus, args.mb * 1e6)
        # the documents (or the write-ups' pieces) in batches of about READ_AHEAD_CHARS characters,
        # as many as prepare has in flight
        parts = ([pieces for _, pieces in prepare_wikipedia.writeup_parts(corpus)] if args.writeup
                 else [prepare_wikipedia.file_documents([path]) for path in (corpus, val)])
        batches = []
        for texts in parts:
            batches.append([])
            for text in texts:
                if sum(map(len, batches[-1])) >= prepare_wikipedia.READ_AHEAD_CHARS:
                    batches.append([])
                batches[-1].append(text)
        ends = not args.writeup  # an <|endoftext|> per document; none in the write-ups' text
        before, tokens = tiktoken_seconds(batches, args.threads, end_of_text=ends)
        runs, ratios, of_encoder = [], [], []
        for _ in range(args.rounds):  # tiktoken, prepare, tiktoken, prepare, ..., tiktoken
            runs.append(run_prepare(prepare_argv))
            after, _ = tiktoken_seconds(batches, args.threads, end_of_text=ends)
            encoder, encoder_tokens = tiktoken_seconds(batches, args.threads, arrays=True,
                                                       end_of_text=ends)
            same_text = runs[-1]["tokens"] == tokens == encoder_tokens
            assert same_text, "prepare and tiktoken tokenized different text"
            # tiktoken's time around prepare's: a load that drifts cancels out
            tiktoken_s = (before + after) / 2
            ratios.append(tiktoken_s / runs[-1]["seconds"])
            of_encoder.append(encoder / runs[-1]["seconds"])
            print(f"{tokens / 1e6:.1f}M tokens: "
                  f"tiktoken {tokens / tiktoken_s / 1e6:.2f}M tokens/s, "
                  f"prepare {tokens / runs[-1]['seconds'] / 1e6:.2f}M tokens/s: "
                  f"ratio {ratios[-1]:.2f}; "
                  f"prepare's encoder alone {tokens / encoder / 1e6:.2f}M tokens/s, "
                  f"prepare keeps {of_encoder[-1]:.2f} of it")
            before = after
        print(f"ratio, median of {args.rounds}: {statistics.median(ratios):.2f} "
              f"(goal: 0.85 or more; from {min(ratios):.2f} to {max(ratios):.2f}); "
              f"of prepare's own encoder: {statistics.median(of_encoder):.2f}")
        del batches
        report_memory(runs, 1)
        for scale in [float(scale) for scale in args.memory_at.split(",") if scale]:
            write_corpus(corpus, scale * args.mb * 1e6)
            report_memory([run_prepare(prepare_argv)], scale)
    finally:
        shutil.rmtree(folder)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


@configurator.script
def main(argv):
    if argv[:1] == ["--prepare"]:  # prepare_wikipedia.py's speed and memory: bench_prepare
        return bench_prepare(argv[1:])
    if configurator.wants_help(argv):
        print(configurator.usage(__doc__, BENCH_DEFAULTS)
              + "\nand every key of train.py (python train.py --help)")
        return 0
    bench, runs = parse_args(argv)
    if bench["causal"]:
        return causal_seconds(bench["causal"])
    device = runs[0][1]["device"]
    cuda = device.startswith("cuda")
    if bench["gpu_report"] and not cuda:
        raise UserError(f"--gpu_report measures a CUDA GPU, and the device here is {device}: run "
                        "it on a machine with one")
    bench["peak_flops"] = train.peak_flops(device)
    name = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    if device.startswith("mps"):
        name = "Apple GPU (MPS)"
    peak = f" (MFU against {bench['peak_flops'] / 1e12:.1f} TFLOP/s)" if bench["peak_flops"] else ""
    print(f"torch {torch.__version__}, {name}{peak}; "
          f"warmup {bench['warmup']}, iters {bench['iters']}")
    if bench["gpu_report"]:
        return gpu_report(runs, bench, f"{name}, torch {torch.__version__}")
    # Sweeps and splits build their own models, one shape at a time.
    if bench["sweep_block_size"] or bench["splits"]:
        for label, config, impl in runs:
            run = dict(label=label, config=config, impl=impl, device=config["device"])
            if bench["sweep_block_size"]:
                sweep(run, bench)
            else:
                splits(run, bench)
        return 0
    runs = [build(*run) for run in runs]
    for run in runs:
        print(f"{run['label']}: {run['model'].get_num_params():,} parameters, "
              f"batch {run['config']['batch_size']} x block_size {run['config']['block_size']}, "
              f"{run['dtype']}, compile={run['config']['compile']}; "
              f"an iter is one train.py step: {run['micro_steps']} x (forward, backward), "
              "then AdamW")
    if bench["explain"]:
        for run in runs:
            explain(run)
    elif bench["profile"]:
        for run in runs:
            profile(run, bench)
    elif bench["memory"]:
        for run in runs:
            peak_memory(run, bench)
    elif bench["compare"]:
        time_runs(runs, bench)
        for run in runs:
            report(run, bench, first=runs[0])
    else:
        for run in runs:
            time_runs([run], bench)
            report(run, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
