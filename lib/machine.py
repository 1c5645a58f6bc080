"""
What a run's settings must be, and the machine they meet: values that would fail mid-run are
refused up front; the device and precision a setting names must exist; a GPU's peak FLOP/s,
which model FLOPs utilization (MFU) is measured against; a CPU's speed, to warn before a config
sized for a GPU starts there; a CPU that other processes keep busy. A reader of the tutorial
may skip this file.
"""

import functools
import os
import time
import warnings

import torch

from lib.cli import ConfigError

# dense bf16 tensor-core FLOP/s (without 2:4 sparsity) for MFU, by a part of the name that
# torch.cuda.get_device_name reports, any case; the first match wins, so variants come first
PEAK_FLOPS = (
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989.4e12),  # SXM, reported as e.g. "NVIDIA H100 80GB HBM3"
    ("H200 NVL", 835e12),
    ("H200", 989.4e12),  # also matches GH200, the same Hopper GPU
    ("A100", 312e12),  # SXM and PCIe alike
)


# auto = bf16 (else fp16) on CUDA, fp32 on a CPU, fp32 on MPS unless bf16 autocast works there
DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_settings(config):
    """Settings that would otherwise fail mid-run (or train on nonsense) are refused up front."""
    if config["init_from"] not in ("scratch", "resume"):
        raise ConfigError(f"init_from must be one of 'scratch', 'resume', got {config['init_from']!r}")
    for key in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"):
        if config[key] < 1:
            raise ConfigError(f"{key} must be at least 1, got {config[key]}")
    problems = []
    if config["learning_rate"] <= 0:
        problems.append(f"learning_rate must be > 0, got {config['learning_rate']}")
    for key in ("beta1", "beta2"):
        if not 0 <= config[key] < 1:
            problems.append(f"{key} must be in [0, 1), got {config[key]}")
    for key in ("seed", "max_iters", "warmup_iters", "weight_decay", "grad_clip", "min_lr"):
        if config[key] < 0:
            problems.append(f"{key} must be >= 0, got {config[key]}")
    if config["decay_lr"]:
        # the cosine's ratio divides by lr_decay_iters - warmup_iters
        if config["warmup_iters"] >= config["lr_decay_iters"]:
            problems.append(f"warmup_iters ({config['warmup_iters']}) must be below lr_decay_iters "
                            f"({config['lr_decay_iters']}), or set --decay_lr=False")
        if config["min_lr"] > config["learning_rate"]:
            problems.append(f"min_lr ({config['min_lr']}) must not exceed learning_rate ({config['learning_rate']})")
    if problems:
        raise ConfigError("; ".join(problems))
    check_device(config["device"], config["dtype"])


def check_device(device, dtype="auto"):
    """'cpu', 'cuda', 'cuda:N' or 'mps' (an Apple-silicon GPU), and the GPU must exist; dtype one
    of DTYPES."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"device={device!r} but this machine has no MPS device (an "
                              f"Apple-silicon GPU, macOS 12.3 or later, a torch built with MPS): "
                              f"use --device=cpu")
        if dtype == "bfloat16" and not mps_bf16_autocast_works():
            raise ConfigError("dtype='bfloat16' but bf16 autocast does not work on this MPS device "
                              "(it needs macOS 14 or later): use --dtype=float32")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but this machine has no CUDA GPU (or this torch has no CUDA): use --device=cpu")
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r} but this machine has {torch.cuda.device_count()} GPU(s), cuda:0 .. "
                              f"cuda:{torch.cuda.device_count() - 1}")


def auto_dtype(device_type):
    """What dtype='auto' means on a device: bf16 (fp16 where unsupported) on CUDA, fp32 on a
    CPU, and on MPS bf16 where its autocast works there, else fp32."""
    if device_type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device_type == "mps" and mps_bf16_autocast_works():
        return "bfloat16"
    return "float32"


@functools.cache
def mps_bf16_autocast_works():
    """Does a matmul under bf16 autocast run in bf16 on the Apple GPU? torch has no query for it
    (bf16 on MPS needs macOS 14), so we try one; autocast turns itself off with a warning where
    a dtype is not supported, and that warning counts as a no."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with torch.autocast("mps", dtype=torch.bfloat16):
                x = torch.ones(2, 2, device="mps")
                return (x @ x).dtype == torch.bfloat16
    except (RuntimeError, TypeError, UserWarning):
        return False


def peak_flops(device):
    """The GPU's peak FLOP/s from PEAK_FLOPS; None (no MFU) for a GPU not listed there."""
    name = torch.cuda.get_device_name(device)
    for part, flops in PEAK_FLOPS:
        if part.lower() in name.lower():
            return flops
    print(f"note: no bf16 peak known for {name}, so MFU is not reported; add it to PEAK_FLOPS in settings.py")
    return None


def cpu_flops(seconds=0.2):
    """This CPU's float32 FLOP/s in 512 × 512 matmuls, measured for about `seconds`: more than a
    model's mix of operations reaches, so times estimated from it are lower bounds."""
    a = torch.randn(512, 512)
    a @ a  # the first call sets up the threads
    t0, matmuls = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ a
        matmuls += 1
    return matmuls * 2 * 512**3 / (time.perf_counter() - t0)


def duration(seconds):
    """'40 s', '7 minutes', '3.5 hours'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} minutes" if seconds < 5400 else f"{seconds / 3600:,.1f} hours"


def warn_if_slow_on_cpu(config, flops_per_token, tokens_per_step, flops=None):
    """Say at once when a config sized for a GPU starts on a CPU, and what its steps and its first
    evaluation will cost there (at `flops` FLOP/s, measured if not given): before compiling and
    evaluating, which take that long. flops_per_token counts forward and backward."""
    flops_per_step = flops_per_token * tokens_per_step
    if flops_per_step > 1e12:
        flops = flops or cpu_flops()
        # the evaluation: eval_iters batches of each split, forward only (a third of the FLOPs)
        eval_flops = flops_per_token / 3 * 2 * config["eval_iters"] * config["batch_size"] * config["block_size"]
        print(f"note: this config is sized for a GPU: one optimizer step ({tokens_per_step // config['block_size']:,} "
              f"sequences of {config['block_size']} tokens) is {flops_per_step / 1e12:,.0f} TFLOP, at least "
              f"{duration(flops_per_step / flops)} on this CPU ({flops / 1e9:,.0f} GFLOP/s in matmuls), and the first "
              f"evaluation (2 × {config['eval_iters']} batches of {config['batch_size']} sequences, forward only) at "
              f"least {duration(eval_flops / flops)}")
        print(f"note: max_iters is {config['max_iters']:,}: for a first run on a CPU use config/tiny_cpu.py")
    if config["compile"]:
        print("note: compile=True on a CPU: compiling takes minutes there; --compile=False skips it")


def busy_cpu_note(threads):
    """A note, or None: say so when other processes keep busy the cores that torch's `threads`
    need, at the start of a run, before this process adds to the load. A thread whose core is
    taken runs only now and then, and the others wait for it at every operation: sample.py ran
    60× slower with one of 2 cores taken, and as fast as ever on one thread. The others' load is
    the 1-minute load average: the processes running or ready to, over all cores."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # a system without a load average
        return None
    cores = os.cpu_count() or 1
    free = max(cores - round(load), 1)  # the cores the others leave, at least one
    if threads <= free:
        return None
    return (f"note: other processes keep this CPU busy (load average {load:.1f} on {cores} cores), and torch's "
            f"{threads} threads would wait for each other, many times slower: put OMP_NUM_THREADS={free} in front "
            f"of the command (OMP_NUM_THREADS={free} python ...)")
