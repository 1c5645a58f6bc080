"""
train.py's settings: the defaults, a config file plus --key=value flags made into one checked
dict, the model's own fields (each model's GPTConfig), and the dtype and autocast they choose.
sample.py, bench.py, study.py, report.py and check_causal.py read configs through here too.

    config = settings.get_config(["config/future50_mse.py", "--batch_size=25"])
    model_args = settings.model_args_of(config)      # the GPTConfig fields, resolved
    dtype, autocast = settings.autocast_for(config["dtype"], "cuda")
"""

import dataclasses
import json
from contextlib import nullcontext

import torch

import configurator
import model_baseline
import model_encdec
import model_future_attn
from lib import data, machine
from lib.cli import ConfigError

DEFAULT_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = machine.DTYPES  # auto = bf16 (else fp16) on CUDA, fp32 on a CPU

MODELS = {"baseline": model_baseline, "future_attn": model_future_attn, "encdec": model_encdec}

# the training settings of every run of the write-ups, their baseline's included
DEFAULTS = dict(
    model_type="baseline",  # 'baseline', 'future_attn' or 'encdec': which model_<type>.py
    # I/O
    data_dir=data.DEFAULT_DATA_DIR,  # train.bin and val.bin, uint16 tokens (prepare_wikipedia.py)
    out_dir="out",  # gets log.jsonl, ckpt.pt (the latest state) and best.pt (the best model)
    eval_interval=500,  # optimizer steps between loss estimates and saves (the write-ups' est_interval)
    eval_iters=200,  # batches per split per estimate (the write-ups' est_steps)
    log_interval=10,  # optimizer steps between train records
    eval_only=False,  # with init_from='resume': estimate the losses of ckpt.pt once and exit
    init_from="scratch",  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
    overwrite=False,  # let a new run replace the run in out_dir: deletes its ckpt.pt, best.pt and log.jsonl
    new_data=False,  # with init_from='resume': train on data other than the checkpoint's (best.pt starts afresh if val.bin differs)
    wandb_log=False,  # also log to Weights & Biases (needs `pip install wandb`)
    wandb_project="transformer-ideas",
    wandb_run_name="run",
    # data
    batch_size=50,  # sequences per micro-step per process
    gradient_accumulation_steps=16,  # micro-steps per optimizer step, in total over all processes
    # model: the fields of the chosen model's GPTConfig, with its defaults (default_config)
    # AdamW
    learning_rate=9e-4,  # peak learning rate
    max_iters=9000,  # optimizer steps in all (the write-ups' train_steps)
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=0.0,  # clip the gradient norm at this value; 0 = off, as in the write-ups
    # learning rate: linear warmup, then cosine decay to min_lr at lr_decay_iters
    decay_lr=True,
    warmup_iters=300,
    lr_decay_iters=700_000,  # far beyond max_iters in the write-ups: the rate stays near its peak
    min_lr=9e-5,
    # system
    device=DEFAULT_DEVICE,  # 'cpu', 'cuda', 'cuda:1', ..., 'mps' (an Apple-silicon GPU)
    dtype="auto",  # 'float32', 'bfloat16', 'float16'; auto = bf16 (else fp16) on CUDA, fp32 on CPU
    compile=True,  # torch.compile the model (set False on a CPU: compiling takes minutes there)
    backend="nccl",  # process-group backend on CUDA; CPU runs always use gloo
    seed=1337,
)


# --------------------------------------------------------------------------------------
# the config: defaults, a file and flags, checked


def default_config(model_type):
    """DEFAULTS plus the fields of the chosen model's GPTConfig, with their defaults."""
    if model_type not in MODELS:
        raise ConfigError(f"model_type must be one of {', '.join(map(repr, MODELS))}, got {model_type!r}")
    config = dict(DEFAULTS, model_type=model_type)
    for field in dataclasses.fields(MODELS[model_type].GPTConfig):
        config.setdefault(field.name, field.default)
    return config


def get_config(argv, script_keys=(), check_model=False):
    """The config dict for `[config_file.py ...] [--key=value ...]`; script_keys, the calling
    script's own keys, are left to it (configurator.merge). check_model: the model's fields must
    make a model (train.py's; check_causal.py shrinks a config first)."""
    files, overrides = configurator.parse(argv)
    # the valid keys depend on the model, so find model_type first: flag, then file, then default
    model_type = files.get("model_type", DEFAULTS["model_type"])
    if "model_type" in overrides:
        model_type = configurator.read_flag("model_type", overrides["model_type"], "")
    config = configurator.merge(default_config(model_type), files, overrides, script_keys)
    machine.check_settings(config)  # values that would fail mid-run, the device and the dtype
    if torch.device(config["device"]).type == "mps" and "compile" not in {**files, **overrides}:
        config["compile"] = False  # torch.compile on MPS is young: used when asked, not by default
    try:
        if check_model:  # the model's own checks (its GPTConfig), naming the config files they read
            model_args_of(config)
    except ConfigError as e:
        paths = [arg for arg in configurator.normalize(argv) if not arg.startswith("-")]
        raise ConfigError(f"{', '.join(paths)}: {e}" if paths else str(e)) from None
    return config


def usage(doc, argv):
    """--help: the script's docstring and every key, with the values the rest of argv gives
    (the defaults if that fails)."""
    try:
        config = get_config([arg for arg in argv if arg not in configurator.HELP_FLAGS])
    except ConfigError:
        config = default_config(DEFAULTS["model_type"])
    return configurator.usage(doc, config) + (
        f"\nThe model keys are those of model_{config['model_type']}.py's GPTConfig; "
        "--model_type=... --help lists another model's.")


# --------------------------------------------------------------------------------------
# the model's fields, and the model


def model_args_of(config):
    """The chosen model's GPTConfig fields, resolved by the dataclass (None defaults filled in)."""
    module = MODELS[config["model_type"]]
    args = {field.name: config[field.name] for field in dataclasses.fields(module.GPTConfig)}
    try:
        return dataclasses.asdict(module.GPTConfig(**args))
    except ValueError as e:
        raise ConfigError(f"{e} (model_type {config['model_type']!r})") from None


def saved_model_args(model_type, model_args):
    """The GPTConfig fields a checkpoint or a log recorded, as this version resolves them: a field
    added since (say future_kv) takes its default, so a run saved before it still compares equal
    to one configured now. The record as it is where the fields do not fit this model."""
    try:
        return json.loads(json.dumps(dataclasses.asdict(MODELS[model_type].GPTConfig(**model_args))))
    except (KeyError, TypeError, ValueError):
        return model_args


def build_model(model_type, model_args):
    """The GPT of model_<model_type>.py with these GPTConfig fields, freshly initialized."""
    module = MODELS[model_type]
    return module.GPT(module.GPTConfig(**model_args))


# --------------------------------------------------------------------------------------
# the precision


def autocast_for(dtype, device_type):
    """(dtype name, autocast context); 'auto' is the device's own (machine.auto_dtype)."""
    if dtype == "auto":
        dtype = machine.auto_dtype(device_type)
    if dtype == "float32":
        return dtype, nullcontext()
    return dtype, torch.autocast(device_type, dtype=getattr(torch, dtype))
