"""
The machine a run computes on: the device and dtype settings, autocast, and the GPU's peak
FLOP/s that model FLOPs utilization (MFU) is measured against.
"""

from contextlib import nullcontext

import torch

from cli import ConfigError

DEFAULT_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = ("auto", "float32", "bfloat16", "float16")
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


def check_device(device):
    """'cpu', 'cuda' or 'cuda:N', and the GPU must exist."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but this machine has no CUDA GPU (or this torch has no CUDA): use --device=cpu")
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r} but this machine has {torch.cuda.device_count()} GPU(s), cuda:0 .. "
                              f"cuda:{torch.cuda.device_count() - 1}")


def autocast_for(dtype, device_type):
    """(dtype name, autocast context); 'auto' = bf16 (fp16 if unsupported) on CUDA, fp32 on a CPU."""
    if dtype == "auto":
        if device_type == "cuda":
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            dtype = "float32"
    if dtype == "float32":
        return dtype, nullcontext()
    return dtype, torch.autocast(device_type, dtype=getattr(torch, dtype))


def peak_flops(device):
    """The GPU's peak FLOP/s from PEAK_FLOPS; None (no MFU) for a GPU not listed there."""
    name = torch.cuda.get_device_name(device)
    for part, flops in PEAK_FLOPS:
        if part.lower() in name.lower():
            return flops
    print(f"note: no bf16 peak known for {name}, so MFU is not reported; add it to PEAK_FLOPS in hardware.py")
    return None


def warn_if_slow_on_cpu(config, flops_per_iter):
    """Say at once when a config sized for a GPU starts on a CPU, rather than after its first step."""
    if flops_per_iter > 1e12:
        print(f"note: this config is sized for a GPU: {flops_per_iter / 1e12:,.0f} TFLOP per optimizer step "
              f"({config['gradient_accumulation_steps']} × {config['batch_size']} sequences of {config['block_size']} "
              f"tokens), tens of seconds to minutes per step on a CPU, and max_iters is {config['max_iters']:,}; "
              f"for a first run on a CPU use config/tiny_cpu.py")
    if config["compile"]:
        print("note: compile=True on a CPU: compiling takes minutes there; --compile=False skips it")
