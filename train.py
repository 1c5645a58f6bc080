"""
Trains one of the three models (baseline, future attention, auto-regressive encoder-decoder) on
the token files of prepare_wikipedia.py, with the write-ups' settings (DEFAULTS) changed by a
config file and --key=value flags.

    python train.py config/tiny_cpu.py                         # a CPU, a few minutes
    python train.py config/future50_mse.py                     # one GPU: compile + bf16
    python train.py config/future50_mse.py --init_from=resume  # go on from out_dir/ckpt.pt
    torchrun --standalone --nproc_per_node=8 train.py config/future50_mse.py   # 8 GPUs
    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0 --master_addr=<first node> \\
        --master_port=29500 train.py config/future50_mse.py   # and --node_rank=1 on the other

Ctrl-C stops after the step under way, with its state saved.
"""

import dataclasses
import errno
import hashlib
import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import signal
import sys
import time
import zipfile
from contextlib import ExitStack, contextmanager, nullcontext, suppress

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
import model_baseline
import model_encdec
import model_future_attn
from configurator import ConfigError, Stopped, UserError, say

# ----------------------------------------
# the settings

DEFAULTS = dict(
    model_type="baseline",  # 'baseline', 'future_attn' or 'encdec': which model_<type>.py
    # I/O
    data_dir="data/wikipedia",  # train.bin and val.bin of prepare_wikipedia.py
    out_dir="out",  # gets log.jsonl, ckpt.pt (the latest state) and best.pt (the best model)
    eval_interval=500,  # optimizer steps between evaluations and saves
    eval_iters=200,  # batches per split per evaluation
    log_interval=10,  # optimizer steps between train records
    eval_only=False,  # with init_from='resume': evaluate ckpt.pt once and exit
    init_from="scratch",  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
    overwrite=False,  # let a new run delete the run in out_dir
    wandb_log=False,  # also log to Weights & Biases (needs `pip install wandb`)
    wandb_project="transformer-ideas",
    wandb_run_name="run",
    # data
    batch_size=50,  # sequences per micro-step per process
    gradient_accumulation_steps=16,  # micro-steps per optimizer step, over all processes
    # AdamW
    learning_rate=9e-4,  # peak learning rate
    max_iters=9000,  # optimizer steps in all
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=0.0,  # clip the gradient norm at this value; 0 = off, as in the write-ups
    # learning rate: linear warmup, then cosine decay to min_lr at lr_decay_iters
    decay_lr=True,
    warmup_iters=300,
    lr_decay_iters=700_000,  # far beyond max_iters, as in the write-ups: the rate stays near peak
    min_lr=9e-5,
    # system
    device="cuda" if torch.cuda.is_available() else "cpu",  # 'cpu', 'cuda', 'cuda:1', ..., 'mps'
    dtype="auto",  # 'float32', 'bfloat16', 'float16'; auto: bf16 (or fp16) on CUDA, else fp32
    compile=True,  # torch.compile the model; on a CPU or MPS only when asked (slow to compile)
    backend="nccl",  # process-group backend on CUDA; CPU runs always use gloo
    seed=1337,
)
MODELS = {"baseline": model_baseline, "future_attn": model_future_attn, "encdec": model_encdec}
RULES = [  # (keys, test, the rule)
    (["init_from"], lambda value: value in ("scratch", "resume"), "'scratch' or 'resume'"),
    (["dtype"], lambda value: value in ("auto", "float32", "bfloat16", "float16"),
     "'auto', 'float32', 'bfloat16' or 'float16'"),
    (["batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"],
     lambda value: value >= 1, "at least 1"),
    (["learning_rate"], lambda value: value > 0, "> 0"),
    (["beta1", "beta2"], lambda value: 0 <= value < 1, "in [0, 1)"),
    (["seed", "max_iters", "warmup_iters", "weight_decay", "grad_clip", "min_lr"],
     lambda value: value >= 0, ">= 0"),
]
# a GPU's dense bf16 FLOP/s, for the MFU, by a part of its name (its variants first)
PEAK_FLOPS = {"h100 nvl": 835e12, "h100 pcie": 756e12, "h100": 989.4e12, "h200 nvl": 835e12,
              "h200": 989.4e12, "a100": 312e12}


def get_config(argv, script_keys=()):
    """DEFAULTS and the model's GPTConfig fields, changed by argv and checked. script_keys are
    the calling script's own."""
    files, overrides = configurator.parse(argv)
    # the model decides the keys, so model_type comes first: its flag, its file, or the default
    model_type = overrides.get("model_type") or files.get("model_type", [DEFAULTS["model_type"]])[0]
    if model_type not in MODELS:
        raise ConfigError(f"model_type must be one of {', '.join(MODELS)}, got {model_type!r}")
    defaults = dict(DEFAULTS, model_type=model_type)
    for field in dataclasses.fields(MODELS[model_type].GPTConfig):
        defaults[field.name] = field.default
    unknown = [key for key in [*files, *overrides] if key not in defaults]
    for key in unknown:  # a key of another model: name that model
        owners = [name for name, module in MODELS.items()
                  if key in module.GPTConfig.__dataclass_fields__]
        if owners:
            raise ConfigError(f"{key} is a key of model_type {' and '.join(owners)}, not of "
                              f"{model_type}: add --model_type={owners[0]}")
    config = configurator.merge(defaults, files, overrides, script_keys)
    if not config["device"].startswith("cuda") and "compile" not in {**files, **overrides}:
        config["compile"] = False  # compiling is slow on a CPU and young on MPS: only when asked
    problems = [f"{key} must be {rule}, got {config[key]!r}"
                for keys, ok, rule in RULES for key in keys if not ok(config[key])]
    if config["decay_lr"] and config["warmup_iters"] >= config["lr_decay_iters"]:
        problems.append("warmup_iters must be below lr_decay_iters, or set --decay_lr=False")
    if config["decay_lr"] and config["min_lr"] > config["learning_rate"]:
        problems.append("min_lr must not exceed learning_rate")
    processes = int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
    if config["gradient_accumulation_steps"] % processes:
        problems.append(f"gradient_accumulation_steps must be divisible by the {processes} "
                        "processes")
    if config["eval_only"] and config["init_from"] != "resume":
        problems.append("eval_only=True evaluates a run's ckpt.pt: add --init_from=resume")
    if config["wandb_log"] and importlib.util.find_spec("wandb") is None:
        problems.append("wandb_log=True needs wandb: `pip install wandb`")
    if problems:
        raise ConfigError("; ".join(problems))
    check_device(config["device"])
    model_args_of(config)  # the model's own checks
    return config


def check_device(device):
    """The device must be 'cpu', 'cuda', 'cuda:N' or 'mps' (Apple silicon), and be there."""
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise ConfigError(f"device={device!r} is not a device name: the names are cpu, cuda, "
                          "cuda:N (the GPU numbered N) and mps")
    kind, _, index = device.partition(":")
    there = dict(cpu=True, mps=torch.backends.mps.is_available(),
                 cuda=int(index or 0) < torch.cuda.device_count())
    if not there[kind]:
        raise ConfigError(f"device={device!r} is not on this machine: use cpu, or cuda, cuda:N or "
                          "mps where there is one")


def model_args_of(config):
    """The chosen model's GPTConfig fields, as the dataclass resolves them."""
    module = MODELS[config["model_type"]]
    args = {field.name: config[field.name] for field in dataclasses.fields(module.GPTConfig)}
    try:
        return dataclasses.asdict(module.GPTConfig(**args))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def saved_model_args(model_type, model_args):
    """Saved GPTConfig fields as they resolve today (a field added since takes its default), as
    JSON holds them."""
    try:
        fields = dataclasses.asdict(MODELS[model_type].GPTConfig(**model_args))
    except (KeyError, TypeError, ValueError):  # a model or a field that is no more
        return model_args
    return json.loads(json.dumps(fields))


def build_model(model_type, model_args):
    module = MODELS[model_type]
    return module.GPT(module.GPTConfig(**model_args))


def autocast_for(dtype, device_type):
    """(dtype, its autocast context). 'auto' is bf16 on a CUDA GPU that computes it natively
    (Ampere and later), fp16 and the gradient scaler on an older one, and fp32 elsewhere."""
    if dtype == "auto":
        dtype = "float32"
        if device_type == "cuda":  # an emulated bf16 would be slower than fp16
            native = torch.cuda.is_bf16_supported(including_emulation=False)
            dtype = "bfloat16" if native else "float16"
    if dtype == "float32":
        return dtype, nullcontext()
    return dtype, torch.autocast(device_type, dtype=getattr(torch, dtype))


@contextmanager
def tf32_matmuls():
    """TF32 for a GPU's float32 matmuls while a run or a benchmark lasts, then as it was, so
    that float32 kernels tested later in the same process stay float32."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def use_device(device):
    """Makes a CUDA device current: what is made without naming one (CUDA random states, pinned
    copies, bf16's support) is then its own, not cuda:0's."""
    if device.startswith("cuda"):
        torch.cuda.set_device(device)


def peak_flops(device):
    """The GPU's peak FLOP/s, or None (no MFU)."""
    name = torch.cuda.get_device_name(device).lower() if device.startswith("cuda") else ""
    return next((flops for part, flops in PEAK_FLOPS.items() if part in name), None)


# ----------------------------------------
# the data: GPT-2 token ids as uint16 in train.bin and val.bin, their sha256 in meta.json


def check_data(data_dir, block_size, vocab_size):
    """Refuses data that would fail mid-run; returns its identity, which checkpoints record."""
    meta_path, identity = os.path.join(data_dir, "meta.json"), {"data_dir": data_dir}
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        meta = {}  # data made elsewhere, with nothing to check it against
    except (OSError, ValueError) as e:
        raise UserError(f"{meta_path} cannot be read ({e}): prepare the data again") from None
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            raise UserError(f"no data at {path}: prepare it with {prepare_command(data_dir)}")
        n_tokens, odd = divmod(os.path.getsize(path), 2)
        if odd or n_tokens <= block_size:
            raise UserError(f"{path} must hold whole uint16 tokens, more than block_size: "
                            "prepare the data again, or more of it")
        with open(path, "rb") as f:
            sha256 = identity[f"{split}_sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
        recorded = meta.get(split, {})
        if recorded.get("sha256", sha256) != sha256:
            raise UserError(f"{path} does not match the sha256 in {meta_path}: prepare it again")
        if not meta:  # made elsewhere: a look at its first words
            check_uint16_ids(path)
        max_token_id = recorded.get("max_token_id")
        if max_token_id is None:  # not recorded: read the tokens once
            max_token_id = int(np.memmap(path, dtype=np.uint16, mode="r").max())
        if max_token_id >= vocab_size:
            raise UserError(f"{path} holds token id {max_token_id}: set --vocab_size to more")
    return identity


def prepare_command(data_dir):
    """The command that prepares data_dir, where prepare_wikipedia.py has one of its own."""
    datasets = {"data/wikipedia": "", "data/wikitext2": " --dataset=wikitext2",
                "data/wikitext103": " --dataset=wikitext103"}
    flags = datasets.get(os.path.normpath(data_dir), f" --input TEXT --out_dir={data_dir}")
    return f"`python prepare_wikipedia.py{flags}`"


def check_uint16_ids(path):
    """Refuses a token file of text, or of ids of 32 or 64 bits: below 65,536 their upper uint16
    words are 0, and the model would train on a token and a 0 in turn."""
    with open(path, "rb") as f:
        head = f.read(8192)
    words = np.frombuffer(head, dtype=np.uint16)
    if min(head.translate(None, delete=b"\t\n\r"), default=32) >= 32:  # no control character
        found = "text"
    elif words[0::2].any() and not words[1::2].any():
        found = "int32 or int64 ids (every other uint16 word is 0)"
    else:
        return
    raise UserError(f"{path} holds {found}, not uint16 token ids: tokenize it with "
                    "prepare_wikipedia.py --input, or write the ids as np.uint16")


def data_stamps(data_dir):
    """The size and time of each data file: a cheap sign that it was written again."""
    paths = [os.path.join(data_dir, name) for name in ("train.bin", "val.bin", "meta.json")]
    return [(os.stat(path).st_size, os.stat(path).st_mtime_ns) if os.path.exists(path) else None
            for path in paths]


def get_batch(data_dir, split, generator, batch_size, block_size, device):
    """batch_size random windows of split.bin: x (B, T), and y, x shifted by one token."""
    # a new memmap for each batch, because a long-lived np.memmap leaks memory
    tokens = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    starts = torch.randint(len(tokens) - block_size, (batch_size, 1), generator=generator).numpy()
    windows = torch.from_numpy(tokens[starts + np.arange(block_size + 1)].astype(np.int64))
    x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T) each
    if device.startswith("cuda"):  # pinned memory lets the copy run while the GPU computes
        x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return x.to(device), y.to(device)


# ----------------------------------------
# the learning rate, the loss estimate and the gradients of one optimizer step


def get_lr(it, config):
    """Linear warmup for warmup_iters, then cosine decay to min_lr at lr_decay_iters."""
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
def estimate_loss(model, config, device, autocast):
    """The mean eval-mode cross-entropy over eval_iters batches of each split."""
    # The same batches at every evaluation, from a generator of their own: estimates differ by
    # the model alone, and the training batches do not move.
    generator = torch.Generator().manual_seed(config["seed"] + 1_000_000)
    model.eval()
    means = []
    for split in ("train", "val"):
        total = 0  # a tensor on the device, so that no batch waits for the host
        for _ in range(config["eval_iters"]):
            X, Y = get_batch(config["data_dir"], split, generator, config["batch_size"],
                             config["block_size"], device)
            with autocast:
                total = total + model(X, Y)[1].float()
        means.append(total / config["eval_iters"])
    model.train()
    train_loss, val_loss = torch.stack(means).tolist()  # one read from the device
    return dict(train_loss=train_loss, val_loss=val_loss)


def forward_backward(model, batches, accum_steps, autocast, scaler, ddp=False):
    """Sums one optimizer step's gradients over accum_steps micro-batches. Returns the mean loss
    they come from (the cross-entropy plus the weighted auxiliary losses), the cross-entropy and
    each auxiliary loss, as tensors on the device."""
    means = {}
    X, Y = next(batches)
    for micro_step in range(accum_steps):
        last = micro_step == accum_steps - 1
        # DDP averages the gradients over the processes in the last backward pass only
        with model.no_sync() if ddp and not last else nullcontext():
            with autocast:
                logits, loss, aux = model(X, Y)
            # The cross-entropy alone, as the evaluations measure it: a model with an auxiliary
            # loss returns it in aux, computed in its own graph from its own logits, so that no
            # float32 copy of the (B, T, vocab) logits is made here.
            cross_entropy = aux.pop("cross_entropy", loss)
            del logits  # freed here, so that the next forward pass does not keep it alive
            if not last:
                X, Y = next(batches)  # the next batch is copied while the GPU computes
            scaler.scale(loss / accum_steps).backward()  # the gradients of the mean loss
        for name, value in dict(loss=loss, cross_entropy=cross_entropy, **aux).items():
            means[name] = means.get(name, 0) + value.detach().float() / accum_steps
    return means


def unscale_and_clip(optimizer, scaler, grad_clip):
    """Unscales the gradients (fp16) and clips them at grad_clip if > 0; returns their norm."""
    scaler.unscale_(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if grad_clip > 0:
        return torch.nn.utils.clip_grad_norm_(params, grad_clip)
    return torch.nn.utils.get_total_norm([p.grad for p in params])


def read_numbers(numbers, ddp):
    """Tensors on the device as numbers (a list for a per-layer loss), read in one copy; under
    DDP, the means over the processes."""
    flat = torch.cat([value.float().view(-1) for value in numbers.values()])
    if ddp:
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
    values = iter(flat.tolist())
    return {name: [next(values) for _ in range(value.numel())] if value.dim() else next(values)
            for name, value in numbers.items()}


# ----------------------------------------
# checkpoints: ckpt.pt holds all that a resumed run needs, best.pt the best model; tensors and
# plain values only, which torch.load(weights_only=True) reads without running code

FORMAT = "train.py checkpoint v1"  # changed whenever the layout changes
MODEL_KEYS = ("format", "model_type", "model_args", "model", "config", "iter_num", "best_val_loss")
TRAINING_KEYS = MODEL_KEYS + ("last_eval_iter", "data", "optimizer", "scaler", "rng")


@dataclasses.dataclass
class RunState:
    """Where the run is: the loop changes it, ckpt.pt saves it, a resume restores it."""

    iter_num: int = 0  # optimizer steps taken
    best_val_loss: float = math.inf
    last_eval_iter: int = None
    last_good_iter: int = None  # the iteration that ckpt.pt holds
    diverging: bool = False  # the last val loss was too far above the best to be saved
    data: dict = None  # data_dir and the sha256 of each split

    def may_save_latest(self, evaluated):
        """ckpt.pt takes the state after an evaluation, or at a stop if it lacks this iteration,
        unless the run diverges."""
        return not self.diverging and (evaluated or self.last_good_iter != self.iter_num)


WRITING = set()  # the temporary file being written, which a stop at once removes


def write_atomically(path, write, size=0):
    """write(f) to path.tmp, renamed to path: a failure leaves the previous file whole. size, what
    write() writes, tells a full disk behind torch.save's error."""
    try:
        WRITING.add(path + ".tmp")
        with open(path + ".tmp", "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on the disk before the rename
        os.replace(path + ".tmp", path)
    except BaseException as e:  # a stop signal too
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        full = isinstance(e, RuntimeError) and free < size  # torch.save's error has no errno
        if full or isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"cannot write {path}: no space left on device ({free / 1e6:,.1f} MB "
                            "free); make space, or write elsewhere") from None
        if isinstance(e, OSError):  # a folder in the way, no permission, a read-only disk
            cause = (e.strerror or str(e)).lower()
            raise UserError(f"cannot write {path}: {cause}; write elsewhere") from None
        raise
    finally:
        WRITING.discard(path + ".tmp")


def save_checkpoint(path, checkpoint, config):
    """Writes a checkpoint atomically, if it holds nothing non-finite."""
    tensors = dict(leaves(checkpoint, torch.Tensor))
    finite = {}  # one read per device: AdamW's step counts stay on the CPU
    for t in tensors.values():
        if t.is_floating_point():
            finite.setdefault(t.device, []).append(t.isfinite().all())
    if not all(torch.stack(flags).all().item() for flags in finite.values()):
        bad = next(name for name, t in tensors.items() if not t.isfinite().all())
        raise diverged(f"iteration {checkpoint['iter_num']}: non-finite values in {bad}", config,
                       checkpoint["last_good_iter"])
    # the tied embedding and output head share one storage, which torch.save writes once
    size = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors.values()}.values())
    write_atomically(path, lambda f: torch.save(checkpoint, f), size)


def load_checkpoint(path, keys=MODEL_KEYS, mmap=False):
    """A checkpoint of train.py's that holds `keys`, on the CPU."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: train one first")
    try:  # each member of the zip has a CRC32, which flipped bits fail
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
        # never weights_only=False, which would run the file's code
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception:
        checkpoint = damaged = "unreadable"
    if damaged or not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise UserError(f"{path} is damaged, or not a checkpoint of this train.py: use a good "
                        "copy, or train again")
    if missing := [key for key in keys if key not in checkpoint]:
        raise UserError(f"{path} lacks {', '.join(missing)}: it is not a training state")
    return checkpoint


def model_from_checkpoint(checkpoint):
    try:
        model = build_model(checkpoint["model_type"], checkpoint["model_args"])
        model.load_state_dict(checkpoint["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:  # KeyError: no such model
        raise UserError(f"the checkpoint does not fit model_{checkpoint['model_type']}: "
                        f"{str(e).splitlines()[0]}") from None
    return model


def resume(config, data):
    """The run's state that out_dir/ckpt.pt holds, checked against the config and the data. The
    settings that differ from the checkpoint's are named, so that a mistyped flag shows."""
    out_dir = config["out_dir"]
    # mmap: the tensors stay on the disk, as only the plain values are read here
    checkpoint = load_checkpoint(os.path.join(out_dir, "ckpt.pt"), TRAINING_KEYS, mmap=True)
    recorded = saved_model_args(checkpoint["model_type"], checkpoint["model_args"])
    differ = [f"{key} {recorded.get(key)!r}" for key, value in model_args_of(config).items()
              if recorded.get(key) != value]
    if checkpoint["model_type"] != config["model_type"]:
        differ = [f"model_type {checkpoint['model_type']!r}"]
    if differ:
        raise UserError(f"cannot resume: the checkpoint holds another model ({', '.join(differ)})")
    saved = checkpoint["data"]
    if (saved["train_sha256"], saved["val_sha256"]) != (data["train_sha256"], data["val_sha256"]):
        raise UserError(f"cannot resume: {out_dir}/ckpt.pt trained on other data ("
                        f"{saved['data_dir']}, sha256 train {saved['train_sha256'][:12]}, val "
                        f"{saved['val_sha256'][:12]}): resume on that data, or start a new run")
    fields = [field.name for field in dataclasses.fields(RunState)]
    state = RunState(**{name: checkpoint[name] for name in fields if name in checkpoint})
    state.last_good_iter, state.data = state.iter_num, data
    print(f"resumed from iteration {state.iter_num} of {config['max_iters']}")
    saved = checkpoint["config"]
    changed = [f"{key} {saved[key]!r} -> {value!r}" for key, value in config.items()
               if key in saved and saved[key] != value and key not in ("init_from", "overwrite")]
    if changed:
        print(f"settings other than the checkpoint's: {', '.join(changed)}")
    return state


def rng_states(batch_generator, world_size):
    """Every rank's random states: torch's (dropout), CUDA's and the training batches'."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
    state = dict(torch=torch.get_rng_state(), cuda=cuda, batches=batch_generator.get_state())
    states = [state] * world_size
    if world_size > 1:
        dist.all_gather_object(states, state)
    return states


# ----------------------------------------
# the log: rank 0 prints each record, and appends it to out_dir/log.jsonl and wandb


def log(path, record, wandb=None):
    try:
        print(console_line(record), flush=True)
    except OSError:  # a closed pipe or terminal, whose SIGPIPE or SIGHUP asks for a stop
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    # JSON has no NaN or infinity: such a number becomes null, and its name is listed
    nonfinite = [name for name, value in leaves(record) if not math.isfinite(value)]
    record = json.loads(json.dumps(record), parse_constant=lambda constant: None)
    record.update(time=time.time(), **({"nonfinite": nonfinite} if nonfinite else {}))
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror.lower()}") from None
    if wandb:
        wandb.log(dict(leaves(record, name=record["type"])))


def console_line(record):
    kind = record["type"]
    if kind == "start":
        return (f"{record['model_type']}: {record['num_params']:,} parameters, "
                f"{record['tokens_per_iter']:,} tokens per iteration")
    if kind == "train":  # the cross-entropy first, as the evaluations measure it
        aux = "".join(f", {name} {value:.4f}" for name, value in record["aux"].items()
                      if not isinstance(value, list))
        total = f", total loss {record['loss']:.4f}" if aux else ""
        mfu = f", mfu {record['mfu'] * 100:.1f}%" if record["mfu"] is not None else ""
        return (f"iter {record['iter']}: cross-entropy {record['cross_entropy']:.4f}{aux}{total}, "
                f"grad norm {record['grad_norm']:.3g}, lr {record['lr']:.2e}, "
                f"{record['ms_per_iter']:.1f} ms/iter, {record['tokens_per_s']:,.0f} tokens/s{mfu}")
    losses = f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f}"
    if kind == "eval_only":
        return f"evaluation only, of iteration {record['iter']} on {record['data_dir']}: {losses}"
    best = ", the best so far" if record["best"] else f" (best {record['best_val_loss']:.4f})"
    return f"eval at iter {record['iter']}: {losses}{best}"


def leaves(value, kind=(int, float), name=""):
    """(name/key/..., leaf) for each leaf of kind (numbers, or tensors) in nested dicts, lists
    and tuples; list items count from 1, as layers do."""
    if isinstance(value, kind) and not isinstance(value, bool):
        yield name, value
    elif isinstance(value, (dict, list, tuple)):
        for key, item in value.items() if isinstance(value, dict) else enumerate(value, 1):
            yield from leaves(item, kind, f"{name}/{key}" if name else str(key))


# ----------------------------------------
# the run's guards: the out_dir, stop signals, errors of rank 0, divergence


@contextmanager
def claim_out_dir(config):
    """Locks out_dir while the run lasts. A new run replaces a run there (ckpt.pt or best.pt) only
    when asked; to a log.jsonl alone, of a launch that saved nothing, it adds its records."""
    out_dir = config["out_dir"]
    with configurator.lock_folder(out_dir, "train.lock", "train.py"):
        for name in ("ckpt.pt.tmp", "best.pt.tmp"):  # left by a process killed while it wrote
            if os.path.exists(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))
        existing = [name for name in ("ckpt.pt", "best.pt", "log.jsonl")
                    if os.path.exists(os.path.join(out_dir, name))]
        if config["init_from"] == "scratch" and existing and config["overwrite"]:
            for name in existing:
                os.remove(os.path.join(out_dir, name))
            print(f"overwrite=True: deleted {', '.join(existing)} in {out_dir}")
        elif config["init_from"] == "scratch" and {"ckpt.pt", "best.pt"} & set(existing):
            raise UserError(f"{out_dir} already holds a run ({', '.join(existing)}): continue it "
                            "with --init_from=resume, or replace it with --overwrite=True")
        yield


class StopSignals:
    """The first stop signal (Ctrl-C, SIGTERM, SIGHUP, SIGUSR1, or the SIGPIPE of a closed
    stdout, as after `train.py | head`) sets .signum, which the loop reads after each step to
    save and stop. The same one within a second (a double Ctrl-C; 5 s under torchrun, which
    passes it on) is the same request; any other ends the process at once, with the file being
    written removed, so that the previous one stays whole."""

    def __init__(self, speak, passed_on):
        self.signum, self.speak, self.passed_on = None, speak, passed_on

    def __enter__(self):
        signals = (*configurator.STOP_SIGNALS, signal.SIGPIPE)
        self.previous = {signum: signal.signal(signum, self.request) for signum in signals}
        return self

    def request(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum, self.until = signum, time.monotonic() + (5 if self.passed_on else 1)
            if self.speak:
                say(f"{name}: stopping after the step under way, with its state saved; a second "
                    "signal stops at once")
        elif signum != signal.SIGPIPE and not (
                signum == self.signum and time.monotonic() < self.until):
            for path in WRITING:
                with suppress(FileNotFoundError):
                    os.remove(path)
            say(f"stopped at once by a second {name}")
            configurator.exit_now(128 + signum)

    def __exit__(self, *exception):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def agreed(self, ddp, device):
        """The signal any process got: all stop after the same step."""
        if not ddp:
            return self.signum
        flag = torch.tensor([self.signum or 0], device=device)  # nccl reduces GPU tensors only
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag.item() or None


@contextmanager
def rank0_decides(ddp):
    """A UserError that rank 0 meets within it stops every process."""
    problem = None
    try:
        yield
    except UserError as e:
        problem = e
    if ddp:
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0] if dist.get_rank() == 0 or not shared[0] else type(shared[0])("")
    if problem:
        raise problem  # said by rank 0 alone


def diverged(what, config, last_good_iter):
    """The error that stops a run gone non-finite, with how to go on at a lower learning rate."""
    lr = min(config["learning_rate"] / 2, DEFAULTS["learning_rate"])
    flags = f"--learning_rate={lr:g}" + (f" --min_lr={lr:g}" if config["min_lr"] > lr else "")
    go_on = "start again with" if last_good_iter is None else (
        f"{config['out_dir']}/ckpt.pt holds iteration {last_good_iter}, the last good one; resume "
        "it with the same command and --init_from=resume")
    return UserError(f"{what}: stopped, and nothing non-finite was saved; {go_on} {flags}")


def check_step(iteration, numbers, aux, config, last_good_iter):
    """Stops the run before a non-finite loss or gradient changes the weights (under fp16, the
    gradient scaler skips such a step)."""
    checked = [("loss", numbers["loss"]), *leaves(aux)]
    if config["dtype"] != "float16":
        checked.append(("gradient norm", numbers["grad_norm"]))
    if bad := [name for name, value in checked if not math.isfinite(value)]:
        values = ", ".join(f"{name} {value}" for name, value in checked)
        raise diverged(f"iteration {iteration}: non-finite {', '.join(bad)} ({values})", config,
                       last_good_iter)


def judge_evaluation(state, losses, config, log_path, wandb):
    """Logs an evaluation, stops the run at non-finite losses, and updates the best val loss and
    whether the run diverges. Returns whether val improved."""
    val_loss = losses["val_loss"]
    improved = math.isfinite(losses["train_loss"]) and val_loss < state.best_val_loss
    log(log_path, dict(type="eval", iter=state.iter_num, **losses, best=improved,
                       best_val_loss=val_loss if improved else state.best_val_loss), wandb)
    if not all(map(math.isfinite, losses.values())):
        raise diverged(f"non-finite losses at the evaluation of iteration {state.iter_num}",
                       config, state.last_good_iter)
    # a nat above the best: the run blew up, and ckpt.pt keeps the last good state
    state.diverging = state.last_good_iter is not None and val_loss > state.best_val_loss + 1
    if state.diverging:
        say(f"warning: val loss {val_loss:.4f} is far above the best: {config['out_dir']}/ckpt.pt "
            f"keeps iteration {state.last_good_iter}")
    state.best_val_loss = min(state.best_val_loss, val_loss)
    return improved


# ----------------------------------------
# the run


def evaluate_only(config):
    """--eval_only: the saved model's losses, logged apart from the run's."""
    check_data(config["data_dir"], config["block_size"], config["vocab_size"])
    checkpoint = load_checkpoint(os.path.join(config["out_dir"], "ckpt.pt"), TRAINING_KEYS)
    model = model_from_checkpoint(checkpoint).to(config["device"])
    autocast = autocast_for(config["dtype"], torch.device(config["device"]).type)[1]
    with claim_out_dir(config):  # no run adds to the log meanwhile
        losses = estimate_loss(model, config, config["device"], autocast)
        log(os.path.join(config["out_dir"], "log.jsonl"), dict(
            type="eval_only", iter=checkpoint["iter_num"], **losses, data_dir=config["data_dir"]))
    return dict(model=model, iter_num=checkpoint["iter_num"], best_val_loss=None)


def build(config, rank, batch_generator):
    """The model, AdamW and the fp16 gradient scaler, with this rank's random states, as a
    resumed run's checkpoint saved them."""
    # Rank 0 reads the checkpoint and sends it to the others, so that out_dir may be on the
    # first node's disk alone. It is let go on return: its weights are in the model then.
    checkpoint = None
    if config["init_from"] == "resume":
        shared = [load_checkpoint(os.path.join(config["out_dir"], "ckpt.pt"), TRAINING_KEYS)
                  if rank == 0 else None]
        if dist.is_initialized():
            dist.broadcast_object_list(shared, src=0)
        checkpoint = shared[0]
    device_type = torch.device(config["device"]).type
    model = build_model(config["model_type"], model_args_of(config)).to(config["device"])
    optimizer = model.configure_optimizers(config["weight_decay"], config["learning_rate"],
                                           (config["beta1"], config["beta2"]), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=config["dtype"] == "float16")
    if checkpoint:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if checkpoint["scaler"]:  # empty when saved without fp16
            scaler.load_state_dict(checkpoint["scaler"])
        if rank < len(checkpoint["rng"]):  # a rank added since then keeps its seed
            rng = checkpoint["rng"][rank]
            torch.set_rng_state(rng["torch"])
            if rng["cuda"] is not None and torch.cuda.is_initialized():
                torch.cuda.set_rng_state(rng["cuda"])
            batch_generator.set_state(rng["batches"])
    return model, optimizer, scaler


def start_log(path, config, model, state, world_size):
    """The first record of a launch, on a line of its own; returns wandb if asked for."""
    wandb = None
    if config["wandb_log"]:  # first: it may fail, and nothing is logged yet
        import wandb

        wandb.init(project=config["wandb_project"], name=config["wandb_run_name"], config=config)
    if os.path.isfile(path) and os.path.getsize(path):  # after a launch killed mid-record
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
    tokens = config["gradient_accumulation_steps"] * config["batch_size"] * config["block_size"]
    log(path, dict(type="start", model_type=config["model_type"], world_size=world_size,
                   num_params=model.get_num_params(), tokens_per_iter=tokens,
                   iter_num=state.iter_num, init_from=config["init_from"], config=config,
                   model_args=model_args_of(config), data=state.data), wandb)
    return wandb


def run(config, signals, state, stamps):
    """The model, the optimizer and the loop, in one process."""
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    master, ddp, device = rank == 0, world_size > 1, config["device"]
    autocast = autocast_for(config["dtype"], torch.device(device).type)[1]
    ckpt_path, best_path, log_path = (os.path.join(config["out_dir"], name)
                                      for name in ("ckpt.pt", "best.pt", "log.jsonl"))
    torch.manual_seed(config["seed"] + rank)  # each rank its own dropout and batches
    batch_generator = torch.Generator().manual_seed(config["seed"] + rank)
    raw_model, optimizer, scaler = build(config, rank, batch_generator)
    model = torch.compile(raw_model) if config["compile"] else raw_model
    if ddp:
        # an encdec model without embedding loss has a LayerNorm that gets no gradient
        unused = config["model_type"] == "encdec" and config["embedding_loss_type"] == "none"
        model = DDP(model, device_ids=[device] if "cuda" in device else None,
                    find_unused_parameters=unused)
    eval_model = model.module if ddp else model  # rank 0 evaluates alone, outside DDP
    batches = (get_batch(config["data_dir"], "train", batch_generator, config["batch_size"],
                         config["block_size"], device) for _ in itertools.count())
    accum_steps = config["gradient_accumulation_steps"] // world_size  # per process
    wandb = start_log(log_path, config, raw_model, state, world_size) if master else None
    gpu_peak_flops = peak_flops(device)
    start_iter = state.iter_num

    def checkpoint_now(rng):  # (best.pt's, ckpt.pt's) of the state now
        best = dict(format=FORMAT, model_type=config["model_type"], config=config,
                    model_args=model_args_of(config), model=raw_model.state_dict(),
                    **dataclasses.asdict(state))
        return best, dict(best, optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                          rng=rng)

    while True:
        # an evaluation every eval_interval steps and at the end, then the saves
        due = state.iter_num % config["eval_interval"] == 0 or state.iter_num == config[
            "max_iters"]
        if due and state.last_eval_iter != state.iter_num:
            state.last_eval_iter = state.iter_num
            rng = rng_states(batch_generator, world_size)
            with rank0_decides(ddp):  # what stops rank 0 here stops every process
                if master and data_stamps(config["data_dir"]) != stamps:
                    raise UserError(f"the data in {config['data_dir']} changed during the run: "
                                    "stopped without saving; resume on the first data")
                if master:
                    losses = estimate_loss(eval_model, config, device, autocast)
                    improved = judge_evaluation(state, losses, config, log_path, wandb)
                    best, latest = checkpoint_now(rng)
                    if improved:  # first, so that ckpt.pt never claims a newer best.pt
                        save_checkpoint(best_path, best, config)
                    if state.may_save_latest(evaluated=True):
                        save_checkpoint(ckpt_path, latest, config)
                        state.last_good_iter = state.iter_num
        if state.iter_num >= config["max_iters"]:
            break
        if signum := signals.agreed(ddp, device):  # a stop signal: save, then stop
            rng = rng_states(batch_generator, world_size)
            if master and state.may_save_latest(evaluated=False):
                save_checkpoint(ckpt_path, checkpoint_now(rng)[1], config)
                state.last_good_iter = state.iter_num
            raise Stopped(signum, "" if not master else (
                f"stopped by {signal.Signals(signum).name} after iteration {state.iter_num}: "
                f"{ckpt_path} holds iteration {state.last_good_iter}; continue with the same "
                "command and --init_from=resume"))

        # one optimizer step: forward and backward passes, unscale, clip, AdamW
        t0 = time.time()
        lr = get_lr(state.iter_num, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        numbers = forward_backward(model, batches, accum_steps, autocast, scaler, ddp)
        numbers["grad_norm"] = unscale_and_clip(optimizer, scaler, config["grad_clip"])
        numbers = read_numbers(numbers, ddp)  # the one read from the device in a step
        aux = {name: numbers.pop(name) for name in list(numbers)
               if name not in ("loss", "cross_entropy", "grad_norm")}
        check_step(state.iter_num + 1, numbers, aux, config, state.last_good_iter)
        scaler.step(optimizer)  # fp16: skipped when a gradient is not finite
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        state.iter_num += 1
        if master and state.iter_num % config["log_interval"] == 0:
            dt = time.time() - t0  # the step alone, without an evaluation
            sequences = config["batch_size"] * accum_steps  # this process's
            mfu = gpu_peak_flops and raw_model.estimate_mfu(sequences, dt, gpu_peak_flops)
            tokens_per_s = sequences * world_size * config["block_size"] / dt
            log(log_path, dict(type="train", iter=state.iter_num, **numbers, aux=aux, lr=lr,
                               ms_per_iter=dt * 1000, tokens_per_s=tokens_per_s, mfu=mfu), wandb)
    if master and start_iter >= config["max_iters"]:
        print(f"nothing to train: {ckpt_path} is at iteration {start_iter}, max_iters; to train "
              "on, resume with a larger --max_iters")
    elif master:
        print(f"trained to iteration {state.iter_num}: best val loss {state.best_val_loss:.4f}, "
              f"its model in {best_path}")
    if wandb:
        wandb.finish()
    return dict(model=raw_model, iter_num=state.iter_num, best_val_loss=state.best_val_loss)


def train(config):
    """Trains as the config says, in each process under torchrun. Returns the model, iter_num and
    best_val_loss, or raises Stopped after a stop signal."""
    master = int(os.environ.get("RANK", 0)) == 0  # rank 0 checks, logs and saves
    ddp = int(os.environ.get("WORLD_SIZE", 1)) > 1  # under torchrun
    device = config["device"]
    if ddp and device.startswith("cuda"):
        device = f"cuda:{os.environ['LOCAL_RANK']}"  # each process of a node its own GPU
    use_device(device)
    if ddp:
        dist.init_process_group(backend=config["backend"] if "cuda" in device else "gloo")
    dtype = autocast_for(config["dtype"], torch.device(device).type)[0]
    config = dict(config, device=device, dtype=dtype)  # logged and saved as resolved
    with ExitStack() as cleanup:  # what the run holds, let go however it ends
        cleanup.enter_context(tf32_matmuls())
        if ddp:
            cleanup.callback(dist.destroy_process_group)
        if config["eval_only"]:
            return evaluate_only(config) if master else None
        signals = cleanup.enter_context(StopSignals(speak=master, passed_on=ddp))
        state, stamps = RunState(), None
        with rank0_decides(ddp):
            if master:
                stamps = data_stamps(config["data_dir"])  # before the slow hashing
                state.data = check_data(config["data_dir"], config["block_size"],
                                        config["vocab_size"])
                if config["init_from"] == "resume":
                    state = resume(config, state.data)
                cleanup.enter_context(claim_out_dir(config))  # locked until the run ends
                if config["max_iters"] < config["warmup_iters"] and config["decay_lr"]:
                    print(f"note: max_iters {config['max_iters']} is below warmup_iters "
                          f"{config['warmup_iters']}: the learning rate never reaches its peak")
        if ddp:  # every process starts where rank 0 does, from the same ckpt.pt
            shared = [state]
            dist.broadcast_object_list(shared, src=0)
            state = shared[0]
        try:
            return run(config, signals, state, stamps)
        except RuntimeError as e:  # an OutOfMemoryError on a GPU, a plain one on a CPU
            if not isinstance(e, torch.OutOfMemoryError) and "can't allocate" not in str(e):
                raise
            raise UserError(f"out of memory: {config['batch_size']} sequences of "
                            f"{config['block_size']} tokens do not fit on {device}; lower "
                            "--batch_size or --block_size") from None


@configurator.script
def main(argv):
    if configurator.wants_help(argv):  # with the values the rest of argv gives
        config = get_config(argv)
        print(configurator.usage(__doc__, config))
        others = [f"--model_type={name} --help" for name in MODELS if name != config["model_type"]]
        print(f"The other models' keys: {' and '.join(others)}")
        return 0
    train(get_config(argv))
    return 0


if __name__ == "__main__":
    configurator.exit_now(main())  # without the slow teardown of torch
