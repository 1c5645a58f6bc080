"""
The machine: the device and dtype a run names, the autocast they choose, a GPU's peak FLOP/s for
model FLOPs utilization (MFU), and notes on what slows a run on a CPU.
"""

import functools
import os
import time
import warnings
from contextlib import nullcontext

import torch

from lib.cli import ConfigError

# dense bf16 FLOP/s by a part of the GPU's name; the first match wins: variants come first
PEAK_FLOPS = {
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989.4e12,  # SXM, reported as e.g. "NVIDIA H100 80GB HBM3"
    "H200 NVL": 835e12,
    "H200": 989.4e12,  # also GH200, the same GPU
    "A100": 312e12,  # SXM and PCIe alike
}
DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_device(device, dtype="auto"):
    """The device must be 'cpu', 'cuda', 'cuda:N' or 'mps' (an Apple-silicon GPU), and exist."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={device!r} but this machine has no MPS device (an Apple-silicon "
                          "GPU): use --device=cpu")
    if kind == "mps" and dtype == "bfloat16" and not mps_bf16_autocast_works():
        raise ConfigError("dtype='bfloat16' but bf16 autocast does not work on this MPS device: "
                          "use --dtype=float32")
    if kind == "cuda" and (torch.device(device).index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"device={device!r} but this machine (or this torch) has "
                          f"{torch.cuda.device_count()} CUDA GPU(s): use --device=cpu")


def autocast_for(dtype, device_type):
    """(dtype, autocast context). 'auto' is bf16 on CUDA (fp16 where unsupported) and on MPS
    where its autocast works, else fp32."""
    if dtype == "auto" and device_type == "cuda":
        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    elif dtype == "auto":
        dtype = "bfloat16" if device_type == "mps" and mps_bf16_autocast_works() else "float32"
    if dtype == "float32":
        return dtype, nullcontext()
    return dtype, torch.autocast(device_type, dtype=getattr(torch, dtype))


@functools.cache
def mps_bf16_autocast_works():
    """One matmul tried: where bf16 autocast fails on MPS (before macOS 14), it warns."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with torch.autocast("mps", dtype=torch.bfloat16):
                x = torch.ones(2, 2, device="mps")
                return (x @ x).dtype == torch.bfloat16
    except (RuntimeError, TypeError, UserWarning):
        return False


def peak_flops(device):
    """The GPU's peak FLOP/s, or None (no MFU) for a GPU not in PEAK_FLOPS."""
    name = torch.cuda.get_device_name(device)
    for part, flops in PEAK_FLOPS.items():
        if part.lower() in name.lower():
            return flops
    print(f"note: no bf16 peak known for {name}, so no MFU: add it to lib/machine.py's PEAK_FLOPS")
    return None


def speed_notes(device, flops_per_step):
    """A CUDA GPU's peak FLOP/s for MFU (None elsewhere); on a CPU, notes on what slows it."""
    if device.startswith("cuda"):
        return peak_flops(device)
    if device == "cpu" and flops_per_step > 1e12:
        print(f"note: one optimizer step is {flops_per_step / 1e12:,.0f} TFLOP, sized for a GPU: "
              "minutes per step on a CPU; for a first run there use config/tiny_cpu.py")
    if device == "cpu" and (busy := busy_cpu_note()):
        print(busy)


def busy_cpu_note(seconds=0.1):
    """Other programs' share of the cores over a moment, from Linux's /proc/stat (a load average
    counts the last command too): one thread per free core runs faster then."""
    threads, cores = torch.get_num_threads(), os.cpu_count()
    if threads == 1 or not os.path.exists("/proc/stat"):
        return None

    def idle_and_all():  # every core's ticks since boot: idle or waiting for I/O, and all
        with open("/proc/stat") as f:
            ticks = [int(n) for n in f.readline().split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)

    idle, total = idle_and_all()
    time.sleep(seconds)
    idle_after, total_after = idle_and_all()
    busy = round((1 - (idle_after - idle) / max(total_after - total, 1)) * cores)
    if busy and threads > cores - busy:
        return (f"note: other programs keep {busy} of {cores} CPU cores busy; one thread per free "
                f"core runs faster: OMP_NUM_THREADS={max(cores - busy, 1)}")
    return None
