"""
train.py's settings: the models and their fields (each GPTConfig's), and the one check of a
config.
"""

import dataclasses
import importlib.util
import json
import os

import configurator
import model_baseline
import model_encdec
import model_future_attn
from lib import machine
from lib.cli import ConfigError

MODELS = {"baseline": model_baseline, "future_attn": model_future_attn, "encdec": model_encdec}

# what the settings must be: (keys, test, the rule as a message says it)
RULES = [
    (("init_from",), lambda value: value in ("scratch", "resume"), "'scratch' or 'resume'"),
    (("batch_size", "gradient_accumulation_steps", "eval_interval", "eval_iters", "log_interval"),
     lambda value: value >= 1, "at least 1"),
    (("learning_rate",), lambda value: value > 0, "> 0"),
    (("beta1", "beta2"), lambda value: 0 <= value < 1, "in [0, 1)"),
    (("seed", "max_iters", "warmup_iters", "weight_decay", "grad_clip", "min_lr"),
     lambda value: value >= 0, ">= 0"),
]


def get_config(defaults, argv, script_keys=(), check_model=False):
    """The checked config of argv over defaults and the model's GPTConfig fields; script_keys
    are the caller's own keys."""
    files, overrides = configurator.parse(argv)
    # the keys depend on the model, so model_type comes first: flag, else file, else default
    model_type = overrides.get("model_type") or files.get("model_type", defaults["model_type"])
    if model_type not in MODELS:
        raise ConfigError(f"model_type must be one of {', '.join(map(repr, MODELS))}, "
                          f"got {model_type!r}")
    defaults = dict(defaults, model_type=model_type)
    for field in dataclasses.fields(MODELS[model_type].GPTConfig):
        defaults[field.name] = field.default
    config = configurator.merge(defaults, files, overrides, script_keys)
    check(config, world_size=int(os.environ.get("WORLD_SIZE", 1)))  # torchrun sets WORLD_SIZE
    if check_model:
        try:
            model_args_of(config)
        except ConfigError as e:  # which config file set the other field, if one did
            paths = [arg for arg in configurator.normalize(argv) if not arg.startswith("-")]
            raise ConfigError(f"{', '.join(paths)}: {e}" if paths else str(e)) from None
    if not config["device"].startswith("cuda") and "compile" not in {**files, **overrides}:
        config["compile"] = False  # slow to compile on a CPU, young on MPS: used when asked
    return config


def check(config, world_size):
    """Refuse, in one ConfigError, settings that would fail mid-run or train on nonsense."""
    problems = [f"{key} must be {rule}, got {config[key]!r}"
                for keys, ok, rule in RULES for key in keys if not ok(config[key])]
    if config["decay_lr"] and config["warmup_iters"] >= config["lr_decay_iters"]:
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


def model_args_of(config):
    """The chosen model's GPTConfig fields, as the dataclass resolves them."""
    module = MODELS[config["model_type"]]
    args = {field.name: config[field.name] for field in dataclasses.fields(module.GPTConfig)}
    try:
        return dataclasses.asdict(module.GPTConfig(**args))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def saved_model_args(model_type, model_args):
    """Recorded GPTConfig fields as resolved now: a field added since takes its default."""
    try:
        fields = dataclasses.asdict(MODELS[model_type].GPTConfig(**model_args))
        return json.loads(json.dumps(fields))
    except (KeyError, TypeError, ValueError):
        return model_args


def build_model(model_type, model_args):
    module = MODELS[model_type]
    return module.GPT(module.GPTConfig(**model_args))
