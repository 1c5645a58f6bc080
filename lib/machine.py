"""
The machine a run meets: the device and dtype a setting names must exist; a GPU's peak FLOP/s
for model FLOPs utilization (MFU); and a CPU too small or too busy for the run, said at once.
"""

import os
import sys
import time

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
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: bf16 (else fp16) on CUDA, fp32 on CPU
BUSY_CORES = 0.5  # other processes busy on this many cores or more: a run is slower than idle


def check_device(device, dtype="auto"):
    """The device is 'cpu', 'cuda' or 'cuda:N' of a GPU that exists; the dtype one of DTYPES."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but this machine has no CUDA GPU (or this torch has "
                          "no CUDA): use --device=cpu")
    index, count = torch.device(device).index, torch.cuda.device_count()
    if kind == "cuda" and index is not None and index >= count:
        raise ConfigError(f"device={device!r} but this machine has {count} GPU(s)")


def peak_flops(device):
    """The GPU's peak FLOP/s from PEAK_FLOPS; None (no MFU) for a GPU not listed there."""
    name = torch.cuda.get_device_name(device)
    for part, flops in PEAK_FLOPS:
        if part.lower() in name.lower():
            return flops
    print(f"note: no bf16 peak known for {name}, so MFU is not reported; add it to PEAK_FLOPS in "
          "lib/machine.py")
    return None


def warn_if_slow_on_cpu(config, flops_per_step):
    """Say at once when a run sized for a GPU starts on a CPU, before compiling and the first
    evaluation spend minutes there."""
    if flops_per_step > 1e12:
        print(f"note: one optimizer step is {flops_per_step / 1e12:,.0f} TFLOP, sized for a GPU: "
              "minutes per step on a CPU; for a first run there use config/tiny_cpu.py")
    if config["compile"]:
        print("note: compile=True on a CPU: compiling takes minutes there; --compile=False skips it")


def cpu_times():
    """(busy, total) ticks of all cores since boot: /proc/stat's first line, whose fields are
    user, nice, system, idle, iowait, ...; idle and iowait are the idle ones."""
    with open("/proc/stat") as f:
        ticks = [int(field) for field in f.readline().split()[1:8]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def busy_cpu_note(seconds=0.25, read=cpu_times):
    """A note when other processes keep cores of this CPU busy, measured over `seconds` before
    this process starts its work: the run will be slower (no thread count made it faster when
    we measured). None on an idle machine, without /proc/stat, or when stderr is not a terminal
    (a log file or a pipe gets no note)."""
    if not sys.stderr.isatty():
        return None
    try:
        busy_before, total_before = read()
        time.sleep(seconds)
        busy_after, total_after = read()
    except OSError:
        return None
    cores = os.cpu_count() or 1
    busy = cores * (busy_after - busy_before) / max(total_after - total_before, 1)
    if busy < BUSY_CORES:
        return None
    return (f"note: other processes keep {busy:.1f} of this machine's {cores} cores busy: "
            "this run will be slower than on an idle machine")
