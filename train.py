"""
Trains one of the three models (baseline, future attention, auto-regressive encoder-decoder)
on the token files that prepare_wikipedia.py writes. The defaults are the seeds' training
settings and, for the model, the defaults of its GPTConfig (the seeds' shape for each model);
a config file and --key=value flags change any setting (configurator.py).

    python train.py config/future50_mse.py                     # one GPU: compile + bf16
    python train.py config/tiny_cpu.py                         # a CPU, a few minutes
    python train.py config/baseline.py --batch_size=25 --gradient_accumulation_steps=32
    python train.py config/future50_mse.py --init_from=resume  # continue from out_dir/ckpt.pt
    python train.py config/tiny_cpu.py --help                   # every key with its value
    torchrun --standalone --nproc_per_node=8 train.py config/future50_mse.py   # 8 GPUs, one node

gradient_accumulation_steps is the TOTAL number of micro-steps per optimizer step over all
processes, so a config gives the same tokens per step on 1 or 8 GPUs. Rank 0 prints, appends
JSON lines to out_dir/log.jsonl ("start", "train", "eval" records) and writes out_dir/ckpt.pt.
A new run refuses an out_dir that already holds a run (resume it, or pass --overwrite=True),
and a run locks its out_dir (out_dir/train.lock) so that a second one cannot write there too.
"""

import dataclasses
import fcntl
import functools
import hashlib
import json
import math
import os
import random
import socket
import sys
import time
from contextlib import nullcontext, suppress

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
import model_baseline
import model_encdec
import model_future_attn
from configurator import ConfigError

MODELS = {"baseline": model_baseline, "future_attn": model_future_attn, "encdec": model_encdec}

# --------------------------------------------------------------------------------------
# default config: the seeds' baseline run (SPEC.md, "Common to all")

DEFAULTS = dict(
    model_type="baseline",  # 'baseline', 'future_attn' or 'encdec': which model_<type>.py
    # I/O
    data_dir="data/wikipedia",  # train.bin and val.bin, uint16 tokens (prepare_wikipedia.py)
    out_dir="out",  # gets log.jsonl and ckpt.pt
    eval_interval=500,  # optimizer steps between loss estimates (the seeds' est_interval)
    eval_iters=200,  # batches per split per estimate (the seeds' est_steps)
    log_interval=10,  # optimizer steps between train records
    eval_only=False,  # estimate the losses once and exit
    always_save_checkpoint=False,  # save at every eval, not only when val loss improves
    init_from="scratch",  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
    overwrite=False,  # let a new run replace the run in out_dir: deletes its ckpt.pt and log.jsonl
    wandb_log=False,  # also log to Weights & Biases (needs `pip install wandb`)
    wandb_project="transformer-ideas",
    wandb_run_name="run",
    # data
    batch_size=50,  # sequences per micro-step per process
    gradient_accumulation_steps=16,  # micro-steps per optimizer step, in total over all processes
    # model: the fields of the chosen model's GPTConfig, with its defaults (default_config)
    # AdamW
    learning_rate=9e-4,  # peak learning rate
    max_iters=9000,  # optimizer steps in all (the seeds' train_steps)
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=0.0,  # clip the gradient norm at this value; 0 = off, as in the seeds
    # learning rate: linear warmup, then cosine decay to min_lr at lr_decay_iters
    decay_lr=True,
    warmup_iters=300,
    lr_decay_iters=700_000,  # far beyond max_iters in the seeds: the rate stays near its peak
    min_lr=9e-5,
    # system
    device="cuda" if torch.cuda.is_available() else "cpu",  # 'cpu', 'cuda', 'cuda:1', ...
    dtype="auto",  # 'float32', 'bfloat16', 'float16'; auto = bf16 (else fp16) on CUDA, fp32 on CPU
    compile=True,  # torch.compile the model (set False on a CPU: compiling takes minutes there)
    backend="nccl",  # process-group backend on CUDA; CPU runs always use gloo
    seed=1337,
)

DTYPES = ("auto", "float32", "bfloat16", "float16")
CHECKPOINT_FORMAT = "train.py checkpoint v1"  # bump when the checkpoint layout changes
CHECKPOINT_KEYS = ("format", "model_type", "model_args", "model", "optimizer", "scaler",
                   "config", "iter_num", "best_val_loss", "rng")
EVAL_SEED_OFFSET = 1_000_000  # eval batches use seed + this, a seed no rank trains with
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


class TrainError(Exception):
    """A failure the user can fix; main prints its message (no traceback) and exits with 1."""


# --------------------------------------------------------------------------------------
# config


def default_config(model_type):
    """DEFAULTS plus the fields of the chosen model's GPTConfig, with their defaults."""
    if model_type not in MODELS:
        raise ConfigError(f"model_type must be one of {', '.join(map(repr, MODELS))}, got {model_type!r}")
    config = dict(DEFAULTS, model_type=model_type)
    for field in dataclasses.fields(MODELS[model_type].GPTConfig):
        config.setdefault(field.name, field.default)
    return config


def get_config(argv):
    """The config dict for `[config_file.py ...] [--key=value ...]`."""
    files, overrides = configurator.parse(argv)
    # the valid keys depend on the model, so find model_type first: flag, then file, then default
    model_type = files.get("model_type", DEFAULTS["model_type"])
    if "model_type" in overrides:
        model_type = configurator.read_flag("model_type", overrides["model_type"], "")
    config = configurator.merge(default_config(model_type), files, overrides)
    for key, allowed in (("init_from", ("scratch", "resume")), ("dtype", DTYPES)):
        if config[key] not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(map(repr, allowed))}, got {config[key]!r}")
    for key in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"):
        if config[key] < 1:
            raise ConfigError(f"{key} must be at least 1, got {config[key]}")
    check_optimizer_settings(config)
    check_device(config["device"])
    return config


def check_optimizer_settings(config):
    """Settings that would otherwise fail mid-run (or train on nonsense) are refused up front."""
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


def check_device(device):
    """'cpu', 'cuda' or 'cuda:N', and the GPU must exist (sample.py uses this too)."""
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


def usage(argv):
    """--help: the docstring and every key, with the values the rest of argv gives (defaults if it fails)."""
    try:
        config = get_config([arg for arg in argv if arg not in configurator.HELP_FLAGS])
    except ConfigError:
        config = default_config(DEFAULTS["model_type"])
    return configurator.usage(__doc__, config) + (
        f"\nThe model keys are those of model_{config['model_type']}.py's GPTConfig; "
        "--model_type=... --help lists another model's.")


def model_args_of(config):
    """The chosen model's GPTConfig fields, resolved by the dataclass (None defaults filled in)."""
    module = MODELS[config["model_type"]]
    args = {field.name: config[field.name] for field in dataclasses.fields(module.GPTConfig)}
    try:
        return dataclasses.asdict(module.GPTConfig(**args))
    except ValueError as e:
        raise ConfigError(f"{e} (model_type {config['model_type']!r})") from None


# --------------------------------------------------------------------------------------
# data


def check_data(data_dir, block_size, vocab_size):
    """Refuse, before training starts, data that would fail mid-run: missing, damaged or short
    files, token ids beyond the vocabulary, or a train.bin and val.bin from two preparations."""
    meta_path = os.path.join(data_dir, "meta.json")
    meta = {}
    if os.path.isfile(meta_path):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise TrainError(f"{meta_path} cannot be read ({e}) — run prepare_wikipedia.py again") from None
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            flag = "" if data_dir == DEFAULTS["data_dir"] else f" --out_dir {data_dir}"
            raise TrainError(f"no data at {path} — run `python prepare_wikipedia.py{flag}` first")
        n_bytes = os.path.getsize(path)
        if n_bytes % 2:
            raise TrainError(f"{path} has an odd number of bytes ({n_bytes:,}), so it is not whole uint16 "
                             f"tokens: the file is damaged — prepare the data again")
        n_tokens = n_bytes // 2
        if n_tokens < block_size + 1:
            raise TrainError(
                f"{path} holds {n_tokens} tokens, fewer than block_size + 1 = {block_size + 1}: "
                f"prepare more text or lower --block_size"
            )
        recorded = meta.get(split, {})
        # meta.json is written last by prepare_wikipedia.py: a .bin that disagrees with it comes
        # from another preparation (one interrupted between its renames, say)
        if "tokens" in recorded and recorded["tokens"] != n_tokens:
            raise TrainError(f"{path} holds {n_tokens:,} tokens but {meta_path} records {recorded['tokens']:,}: "
                             f"the files come from different preparations — prepare the data again")
        if "sha256" in recorded and sha256_of(path) != recorded["sha256"]:
            raise TrainError(f"{path} does not match the sha256 in {meta_path}: the file changed after it was "
                             f"prepared — prepare the data again")
        max_token_id = recorded.get("max_token_id")
        if max_token_id is None:  # not recorded: scan the tokens once
            max_token_id = int(np.memmap(path, dtype=np.uint16, mode="r").max())
        if max_token_id >= vocab_size:
            raise TrainError(f"{path} holds token id {max_token_id}, beyond vocab_size {vocab_size}: "
                             f"set --vocab_size={max_token_id + 1} or more, or prepare the data with this vocabulary")
    if not meta:
        print(f"note: {data_dir} has no meta.json, so train.bin and val.bin cannot be checked against "
              f"each other (prepare_wikipedia.py writes it last; without it, the preparation may not have finished)")


def sha256_of(path):
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def get_batch(data_dir, split, generator, batch_size, block_size, device):
    """batch_size random windows of split.bin: x (B, T) and y, x shifted by one token; int64."""
    # a fresh memmap per batch: a long-lived np.memmap leaks memory (nanoGPT's note)
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator).tolist()
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])  # (B, T)
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])  # (B, T)
    if device.startswith("cuda"):
        # pinned memory lets the copy run asynchronously while the GPU works
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


# --------------------------------------------------------------------------------------
# learning rate, loss estimates


def get_lr(it, config):
    """Linear warmup for warmup_iters, then cosine decay to min_lr at lr_decay_iters (nanoGPT)."""
    lr, min_lr = config["learning_rate"], config["min_lr"]
    if not config["decay_lr"]:
        return lr
    if it < config["warmup_iters"]:
        return lr * (it + 1) / (config["warmup_iters"] + 1)
    if it > config["lr_decay_iters"]:
        return min_lr
    ratio = (it - config["warmup_iters"]) / (config["lr_decay_iters"] - config["warmup_iters"])
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


@torch.no_grad()
def estimate_loss(model, batch, eval_iters, autocast, seed):
    """Mean eval-mode loss (plain cross-entropy) over eval_iters batches of each split."""
    # the same batches at every estimate, from a generator of their own: successive
    # estimates differ by the model only, and evaluating never moves the training batches
    generator = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = batch(split, generator)
            with autocast:
                _, loss, _ = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


# --------------------------------------------------------------------------------------
# checkpoints


def unwrap(model):
    """The plain GPT inside DDP and torch.compile wrappers (so its state dict has no prefixes)."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    return getattr(model, "_orig_mod", model)  # torch.compile


def get_rng_state(batch_generator):
    """Every random state training reads, so a resumed run draws what an unbroken one would."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()  # plain ints load with weights_only
    return {
        "python": random.getstate(),
        "numpy": np_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
        "batches": batch_generator.get_state(),
    }


def set_rng_state(state, batch_generator):
    random.setstate(state["python"])
    np_state = state["numpy"]
    np_state["state"]["key"] = np.array(np_state["state"]["key"], dtype=np.uint32)
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])
    batch_generator.set_state(state["batches"])


def save_checkpoint(path, checkpoint):
    """Write atomically: a crash mid-save leaves the previous checkpoint whole."""
    tmp_path = path + ".tmp"
    torch.save(checkpoint, tmp_path)
    os.replace(tmp_path, path)


def load_checkpoint(path):
    """A checkpoint this script wrote (on the CPU); TrainError saying what is wrong otherwise."""
    if not os.path.isfile(path):
        raise TrainError(f"no checkpoint at {path} — train one first (python train.py CONFIG --out_dir={os.path.dirname(path) or '.'})")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged or foreign file; torch's own advice (weights_only=False) would run its code
        reason = "not a complete torch file" if isinstance(e, RuntimeError) else "it holds objects train.py never saves"
        raise TrainError(f"{path} is not a checkpoint written by train.py, or it is damaged ({reason}): "
                         f"train again into a new --out_dir, or resume from a good copy") from None
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise TrainError(f"{path} is not a checkpoint written by train.py: it lacks {', '.join(missing)}")
    if checkpoint["format"] != CHECKPOINT_FORMAT:
        raise TrainError(f"{path} has format {checkpoint['format']!r}; this train.py reads {CHECKPOINT_FORMAT!r}")
    if checkpoint["model_type"] not in MODELS:
        raise TrainError(f"{path} holds an unknown model_type {checkpoint['model_type']!r} (known: {', '.join(MODELS)})")
    return checkpoint


def model_from_checkpoint(checkpoint):
    """The GPT of the checkpoint's model_type, with its weights (sample.py uses this too)."""
    module = MODELS[checkpoint["model_type"]]
    try:
        model = module.GPT(module.GPTConfig(**checkpoint["model_args"]))
        model.load_state_dict(checkpoint["model"])
    except (TypeError, ValueError, RuntimeError) as e:
        raise TrainError(f"the checkpoint does not fit model_{checkpoint['model_type']}.py: {e}".splitlines()[0]) from None
    return model


def check_resume(checkpoint, config, model_args):
    """The checkpoint must hold the model the config asks for."""
    if checkpoint["model_type"] != config["model_type"]:
        raise TrainError(
            f"cannot resume: the checkpoint holds model_type {checkpoint['model_type']!r}, "
            f"the config asks for {config['model_type']!r}"
        )
    differ = [f"{key} (checkpoint {checkpoint['model_args'].get(key)!r}, config {value!r})"
              for key, value in model_args.items() if checkpoint["model_args"].get(key) != value]
    if differ:
        raise TrainError(f"cannot resume: model settings differ from the checkpoint's: {', '.join(differ)}")


# --------------------------------------------------------------------------------------
# out_dir: one run per folder, one process at a time


RUN_FILES = ("ckpt.pt", "log.jsonl")  # what a run leaves in its out_dir


def claim_out_dir(config):
    """Create and lock out_dir for this process; returns the open lock file (closing it unlocks).

    A second process on the same folder is refused, naming the holder. The lock is the
    kernel's (flock), so it ends with its process, however that dies (kill -9 included).
    A new run (init_from='scratch') refuses a folder that holds a run unless overwrite=True."""
    out_dir = config["out_dir"]
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, "train.lock"), "a+")
    except OSError as e:
        raise TrainError(f"cannot create out_dir {out_dir} ({e.strerror}): choose another --out_dir") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise TrainError(f"{out_dir} is in use by {holder}: wait for it to end, or choose another --out_dir") from None
    lock.truncate(0)
    lock.write(f"train.py (process {os.getpid()} on {socket.gethostname()})\n")
    lock.flush()
    with suppress(FileNotFoundError):
        os.remove(os.path.join(out_dir, "ckpt.pt.tmp"))  # left by a save that was killed
    existing = [name for name in RUN_FILES if os.path.exists(os.path.join(out_dir, name))]
    if config["init_from"] == "scratch" and existing:
        if not config["overwrite"]:
            lock.close()
            raise TrainError(
                f"{out_dir} already holds a run ({', '.join(existing)}): continue it with --init_from=resume, "
                f"start this one in another --out_dir, or replace it with --overwrite=True (deletes {', '.join(existing)})"
            )
        for name in existing:
            os.remove(os.path.join(out_dir, name))
        print(f"overwrite=True: deleted {', '.join(existing)} in {out_dir}")
    return lock


def agree(problem, ddp):
    """Under DDP, rank 0's problem (a message or None) becomes every rank's, so all stop together."""
    if ddp:
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0]
    if problem:
        raise TrainError(problem)


# --------------------------------------------------------------------------------------
# logging


def end_line(path):
    """A launch killed mid-record leaves a partial last line: start the next records on a new one."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")


def log_event(path, record):
    """Print one record and append it as a JSON line."""
    record = dict(record, time=time.time())
    kind = record["type"]
    if kind == "start":
        c = record["config"]
        print(f"{record['model_type']}: {record['num_params']:,} parameters; world size {record['world_size']}")
        print(f"tokens per iteration: {c['gradient_accumulation_steps']} micro-steps × {c['batch_size']} "
              f"sequences × {c['block_size']} tokens = {record['tokens_per_iter']:,}")
    elif kind == "train":
        aux = "".join(f", {k} {v:.4f}" for k, v in record["aux"].items())
        mfu = f", mfu {record['mfu'] * 100:.1f}%" if record.get("mfu") is not None else ""
        print(f"iter {record['iter']}: loss {record['loss']:.4f}{aux}, lr {record['lr']:.2e}, "
              f"{record['ms_per_iter']:.1f} ms/iter, {record['tokens_per_s']:,.0f} tokens/s{mfu}")
    else:
        saved = ", saved checkpoint" if record["saved"] else ""
        print(f"eval at iter {record['iter']}: train loss {record['train_loss']:.4f}, "
              f"val loss {record['val_loss']:.4f} (best {record['best_val_loss']:.4f}){saved}")
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def warn_if_slow_on_cpu(config, flops_per_iter):
    """Say at once when a config sized for a GPU starts on a CPU, rather than after its first step."""
    if flops_per_iter > 1e12:
        print(f"note: this config is sized for a GPU: {flops_per_iter / 1e12:,.0f} TFLOP per optimizer step "
              f"({config['gradient_accumulation_steps']} × {config['batch_size']} sequences of {config['block_size']} "
              f"tokens), tens of seconds to minutes per step on a CPU, and max_iters is {config['max_iters']:,}; "
              f"for a first run on a CPU use config/tiny_cpu.py")
    if config["compile"]:
        print("note: compile=True on a CPU: compiling takes minutes there; --compile=False skips it")


def peak_flops(device):
    """The GPU's peak FLOP/s from PEAK_FLOPS; None (no MFU) for a GPU not listed there."""
    name = torch.cuda.get_device_name(device)
    for part, flops in PEAK_FLOPS:
        if part.lower() in name.lower():
            return flops
    print(f"note: no bf16 peak known for {name}, so MFU is not reported; add it to PEAK_FLOPS in train.py")
    return None


# --------------------------------------------------------------------------------------
# training


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


def setup_distributed(config):
    """(rank, world_size, device); under torchrun (RANK set) joins the process group."""
    if "RANK" not in os.environ:
        return 0, 1, config["device"]
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if config["device"].startswith("cuda"):
        device, backend = f"cuda:{local_rank}", config["backend"]
        torch.cuda.set_device(device)
    else:
        device, backend = "cpu", "gloo"  # nccl needs GPUs
    dist.init_process_group(backend=backend)
    return rank, world_size, device


def train(config):
    """Run the training job that config describes; returns the trained (unwrapped) model,
    iter_num and best_val_loss. Under torchrun, every process calls this."""
    rank, world_size, device = setup_distributed(config)
    lock = None
    try:
        problem = None
        if rank == 0:  # rank 0 writes the out_dir, so it holds the lock
            try:
                lock = claim_out_dir(config)
            except TrainError as e:
                problem = str(e)
        agree(problem, ddp=world_size > 1)
        return run(config, rank, world_size, device)
    finally:
        if lock:
            lock.close()
        if "RANK" in os.environ:  # setup_distributed joined a process group
            dist.destroy_process_group()


def run(config, rank, world_size, device):
    master = rank == 0  # rank 0 logs and saves
    ddp = world_size > 1
    if config["gradient_accumulation_steps"] % world_size:
        raise ConfigError(
            f"gradient_accumulation_steps ({config['gradient_accumulation_steps']}) is the total over "
            f"all processes and must be divisible by the world size ({world_size})"
        )
    accum_steps = config["gradient_accumulation_steps"] // world_size  # micro-steps per process
    tokens_per_iter = config["gradient_accumulation_steps"] * config["batch_size"] * config["block_size"]
    model_args = model_args_of(config)
    check_data(config["data_dir"], config["block_size"], config["vocab_size"])

    device_type = "cuda" if device.startswith("cuda") else "cpu"
    dtype, autocast = autocast_for(config["dtype"], device_type)
    config = dict(config, dtype=dtype)  # logged and saved as resolved
    torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls on CUDA; no effect on a CPU
    torch.backends.cudnn.allow_tf32 = True

    # every rank seeds differently (dropout, batches); DDP copies rank 0's initial weights
    random.seed(config["seed"] + rank)
    np.random.seed(config["seed"] + rank)
    torch.manual_seed(config["seed"] + rank)
    batch_generator = torch.Generator().manual_seed(config["seed"] + rank)
    batch = functools.partial(get_batch, config["data_dir"], batch_size=config["batch_size"],
                              block_size=config["block_size"], device=device)

    module = MODELS[config["model_type"]]
    raw_model = module.GPT(module.GPTConfig(**model_args)).to(device)
    optimizer = raw_model.configure_optimizers(
        config["weight_decay"], config["learning_rate"], (config["beta1"], config["beta2"]), device_type
    )
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")  # fp16 only
    iter_num, best_val_loss = 0, float("inf")
    ckpt_path = os.path.join(config["out_dir"], "ckpt.pt")
    if config["init_from"] == "resume":
        checkpoint = load_checkpoint(ckpt_path)
        check_resume(checkpoint, config, model_args)
        raw_model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if checkpoint["scaler"]:  # empty when saved without fp16
            scaler.load_state_dict(checkpoint["scaler"])
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
        if rank < len(checkpoint["rng"]):  # ranks beyond the saving run's keep their fresh seeds
            set_rng_state(checkpoint["rng"][rank], batch_generator)
        del checkpoint
        if iter_num >= config["max_iters"] and not config["eval_only"]:
            if master:
                print(f"{ckpt_path} is at iteration {iter_num} and max_iters is {config['max_iters']}: "
                      f"nothing to train (raise --max_iters to train on)")
            return dict(model=raw_model, iter_num=iter_num, best_val_loss=best_val_loss)
        if master:
            print(f"resumed from iteration {iter_num} ({ckpt_path}), training to max_iters {config['max_iters']}")
    start_iter = iter_num

    model = torch.compile(raw_model) if config["compile"] else raw_model
    eval_model = model  # evaluation runs on rank 0 alone, outside DDP
    if ddp:
        # an encdec model without embedding loss still owns the unused LayerNorm on E (the
        # seeds' parameter counts include it); DDP must be told that it gets no gradient
        unused = config["model_type"] == "encdec" and model_args["embedding_loss_type"] == "none"
        model = DDP(model, device_ids=[torch.device(device)] if device_type == "cuda" else None, find_unused_parameters=unused)

    log_path = os.path.join(config["out_dir"], "log.jsonl")
    wandb = None
    if master:
        end_line(log_path)
        log_event(log_path, dict(
            type="start", model_type=config["model_type"], num_params=raw_model.get_num_params(),
            world_size=world_size, tokens_per_iter=tokens_per_iter, iter_num=iter_num,
            init_from=config["init_from"], config=config, model_args=model_args,
        ))
        if config["wandb_log"]:
            try:
                import wandb
            except ImportError:
                raise ConfigError("wandb_log=True needs wandb: `pip install wandb`, or drop --wandb_log") from None
            wandb.init(project=config["wandb_project"], name=config["wandb_run_name"], config=config)
    flops_promised = peak_flops(device) if master and device_type == "cuda" else None
    if master and device_type == "cpu":
        warn_if_slow_on_cpu(config, raw_model.flops_per_token() * tokens_per_iter)

    t_last, timed_iters = time.time(), 0
    while True:
        # estimate the losses and save: every eval_interval steps and at the end (a resumed
        # run skips its first step: the run that saved the checkpoint evaluated there)
        at_eval = iter_num % config["eval_interval"] == 0 or iter_num == config["max_iters"]
        if config["eval_only"] or (at_eval and not (iter_num == start_iter and config["init_from"] == "resume")):
            rng = [None] * world_size  # every rank's random state goes into the checkpoint
            if ddp:
                dist.all_gather_object(rng, get_rng_state(batch_generator))
            else:
                rng[0] = get_rng_state(batch_generator)
            if master:
                losses = estimate_loss(eval_model, batch, config["eval_iters"], autocast, config["seed"])
                improved = losses["val"] < best_val_loss
                best_val_loss = min(best_val_loss, losses["val"])
                at_end = iter_num == config["max_iters"]
                saved = not config["eval_only"] and iter_num > 0 and (improved or config["always_save_checkpoint"] or at_end)
                if saved:
                    save_checkpoint(ckpt_path, dict(
                        format=CHECKPOINT_FORMAT, model_type=config["model_type"], model_args=model_args,
                        model=raw_model.state_dict(), optimizer=optimizer.state_dict(),
                        scaler=scaler.state_dict(), config=config, iter_num=iter_num,
                        best_val_loss=best_val_loss, rng=rng,
                    ))
                log_event(log_path, dict(type="eval", iter=iter_num, train_loss=losses["train"],
                                         val_loss=losses["val"], best_val_loss=best_val_loss, saved=saved))
                if wandb:
                    wandb.log({"iter": iter_num, "train/loss": losses["train"], "val/loss": losses["val"]})
            t_last, timed_iters = time.time(), 0  # timings leave out evaluation
        if iter_num >= config["max_iters"] or config["eval_only"]:
            break

        # one optimizer step over accum_steps micro-batches
        lr = get_lr(iter_num, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        X, Y = batch("train", batch_generator)
        totals = 0  # sum over micro-steps of [loss, *aux losses], on the device
        for micro_step in range(accum_steps):
            last = micro_step == accum_steps - 1
            # DDP averages the gradients across processes in the last micro-step's backward only
            with model.no_sync() if ddp and not last else nullcontext():
                with autocast:
                    _, loss, aux = model(X, Y)
                if not last:
                    X, Y = batch("train", batch_generator)  # fetch while the GPU computes
                # dividing by accum_steps makes the summed gradients those of the mean loss
                scaler.scale(loss / accum_steps).backward()
            totals = totals + torch.stack([loss.detach().float(), *(v.detach().float() for v in aux.values())])
        means = totals / accum_steps
        if ddp:  # the mean over all processes; every rank then sees the same numbers
            dist.all_reduce(means)
            means /= world_size
        loss_value, *aux_values = means.tolist()  # one sync with the device per step
        aux_means = dict(zip(aux.keys(), aux_values))
        bad = [name for name, v in [("loss", loss_value), *aux_means.items()] if not math.isfinite(v)]
        if bad:
            # the out_dir holds this run alone (claim_out_dir), so a checkpoint there is this run's
            kept = f"{ckpt_path} keeps the last good state" if os.path.exists(ckpt_path) else "no checkpoint was saved yet"
            raise TrainError(
                f"iteration {iter_num + 1}: non-finite {', '.join(bad)} "
                f"({', '.join(f'{n} {v}' for n, v in [('loss', loss_value), *aux_means.items()])}); "
                f"stopped, {kept} — try a lower --learning_rate or --grad_clip=1.0"
            )
        if config["grad_clip"] > 0:
            scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        timed_iters += 1

        if master and iter_num % config["log_interval"] == 0:
            dt = (time.time() - t_last) / timed_iters  # mean seconds per step since the last record
            t_last, timed_iters = time.time(), 0
            mfu = None
            if flops_promised:
                mfu = raw_model.estimate_mfu(config["batch_size"] * accum_steps, dt, flops_promised=flops_promised)
            log_event(log_path, dict(type="train", iter=iter_num, loss=loss_value, aux=aux_means, lr=lr,
                                     ms_per_iter=dt * 1000, tokens_per_s=tokens_per_iter / dt, mfu=mfu))
            if wandb:
                wandb.log({"iter": iter_num, "train/step_loss": loss_value, "lr": lr, "mfu": mfu,
                           **{f"train/{k}": v for k, v in aux_means.items()}})

    return dict(model=raw_model, iter_num=iter_num, best_val_loss=best_val_loss)


def main(argv=None):
    """Command-line entry: returns the exit status (2 for a bad setting, 1 for other errors)."""
    argv = sys.argv[1:] if argv is None else argv
    if configurator.wants_help(argv):
        print(usage(argv))
        return 0
    try:
        train(get_config(argv))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
