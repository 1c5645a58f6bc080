"""
What train.py's settings mean beyond their values: the three models and their own fields (each
model's GPTConfig), the one check of a whole config, and the precision a dtype setting chooses.
"""

import dataclasses
import importlib.util
import json
from contextlib import nullcontext

import torch

import model_baseline
import model_encdec
import model_future_attn
from lib import machine
from lib.cli import ConfigError

MODELS = {"baseline": model_baseline, "future_attn": model_future_attn, "encdec": model_encdec}


def with_model_fields(defaults, model_type):
    """defaults plus the fields of the chosen model's GPTConfig, with their own defaults."""
    if model_type not in MODELS:
        raise ConfigError(f"model_type must be one of {', '.join(map(repr, MODELS))}, "
                          f"got {model_type!r}")
    config = dict(defaults, model_type=model_type)
    for field in dataclasses.fields(MODELS[model_type].GPTConfig):
        config.setdefault(field.name, field.default)
    return config


def check(config, world_size=1, check_model=False, files=()):
    """Refuse, in one ConfigError, the settings that would fail mid-run or train on nonsense.
    check_model: the model's own checks too (its GPTConfig), naming the config files read."""
    problems = []
    if config["init_from"] not in ("scratch", "resume"):
        problems.append(f"init_from must be 'scratch' or 'resume', got {config['init_from']!r}")
    for key in ("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters",
                "log_interval"):
        if config[key] < 1:
            problems.append(f"{key} must be at least 1, got {config[key]}")
    if config["learning_rate"] <= 0:
        problems.append(f"learning_rate must be > 0, got {config['learning_rate']}")
    for key in ("beta1", "beta2"):
        if not 0 <= config[key] < 1:
            problems.append(f"{key} must be in [0, 1), got {config[key]}")
    for key in ("seed", "max_iters", "warmup_iters", "weight_decay", "grad_clip", "min_lr"):
        if config[key] < 0:
            problems.append(f"{key} must be >= 0, got {config[key]}")
    if config["decay_lr"] and config["warmup_iters"] >= config["lr_decay_iters"]:
        # the cosine divides by lr_decay_iters - warmup_iters
        problems.append(f"warmup_iters ({config['warmup_iters']}) must be below lr_decay_iters "
                        f"({config['lr_decay_iters']}), or set --decay_lr=False")
    if config["decay_lr"] and config["min_lr"] > config["learning_rate"]:
        problems.append(f"min_lr ({config['min_lr']}) must not exceed learning_rate "
                        f"({config['learning_rate']})")
    if config["gradient_accumulation_steps"] % world_size:
        problems.append(f"gradient_accumulation_steps ({config['gradient_accumulation_steps']}) "
                        f"is the total over all processes: make it divisible by {world_size}")
    if config["eval_only"] and config["init_from"] != "resume":
        problems.append("eval_only=True evaluates a run's ckpt.pt: add --init_from=resume")
    if config["wandb_log"] and importlib.util.find_spec("wandb") is None:
        problems.append("wandb_log=True needs wandb: `pip install wandb`, or drop --wandb_log")
    if problems:
        raise ConfigError("; ".join(problems))
    machine.check_device(config["device"], config["dtype"])
    if check_model:
        try:
            model_args_of(config)
        except ConfigError as e:
            raise ConfigError(f"{', '.join(files)}: {e}" if files else str(e)) from None


def model_args_of(config):
    """The chosen model's GPTConfig fields, as the dataclass resolves them (None defaults filled)."""
    module = MODELS[config["model_type"]]
    args = {field.name: config[field.name] for field in dataclasses.fields(module.GPTConfig)}
    try:
        return dataclasses.asdict(module.GPTConfig(**args))
    except ValueError as e:
        raise ConfigError(f"{e} (model_type {config['model_type']!r})") from None


def saved_model_args(model_type, model_args):
    """The GPTConfig fields a checkpoint or a log recorded, as this version resolves them: a field
    added since then takes its default, so an older run still compares equal to one configured
    now. The record as it is where the fields do not fit this model."""
    try:
        fields = dataclasses.asdict(MODELS[model_type].GPTConfig(**model_args))
        return json.loads(json.dumps(fields))
    except (KeyError, TypeError, ValueError):
        return model_args


def build_model(model_type, model_args):
    """The GPT of model_<model_type>.py with these GPTConfig fields, freshly initialized."""
    module = MODELS[model_type]
    return module.GPT(module.GPTConfig(**model_args))


def autocast_for(dtype, device_type):
    """(dtype name, autocast context); 'auto' is bf16 (fp16 if unsupported) on CUDA, fp32 on a CPU."""
    if dtype == "auto" and device_type == "cuda":
        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if dtype in ("auto", "float32"):
        return "float32", nullcontext()
    return dtype, torch.autocast(device_type, dtype=getattr(torch, dtype))
