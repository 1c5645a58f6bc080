"""
Settings from `[config_file.py ...] [--key=value | --key value | --key ...]` over defaults:
`config = merge(defaults, *parse(sys.argv[1:]))`. A config file is plain Python; flags win over
files; a flag alone means True. A key needs a default, a value its default's type.
"""

import ast
import difflib
import os

from lib.cli import ConfigError

SIMPLE_TYPES = (bool, int, float, str, type(None))
EXPECTED = {bool: "True or False", int: "an integer", float: "a number", str: "text"}
HELP_FLAGS = ("-h", "--help")
# other scripts' flags: given to the wrong script, they say where they belong
PREPARE_KEYS = ("dataset", "input", "val", "detokenize", "threads", "num_proc", "max_chars", "url",
                "zip", "split", "train_tokens", "val_tokens", "val_fraction", "retries", "tokens")
STUDY_KEYS = ("seeds", "out_root", "gpus", "report_only", "progress_s", "threshold", "plot")
KEYS_ELSEWHERE = {**dict.fromkeys(PREPARE_KEYS, "prepare_wikipedia.py"),
                  **dict.fromkeys(STUDY_KEYS, "study.py")}
CHECKPOINT_KEYS = ("model_type",)  # the checkpoint decides them in sample.py and visualize.py


def wants_help(argv):
    return any(arg in HELP_FLAGS for arg in argv)


def without_help(argv):
    return [arg for arg in argv if arg not in HELP_FLAGS]


def usage(doc, config):
    """A script's --help: its docstring, then every key with its value."""
    keys = "\n".join(f"  --{key}={value!r}" for key, value in config.items())
    return f"{doc.strip()}\n\nkeys (--key=value or --key value), with their values:\n{keys}"


def read_config_file(path):
    """The simple values (bool, int, float, str, None) a config file defines, but _names."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} not found (a config file is a .py path such as "
                          "config/tiny_cpu.py)")
    namespace = {}  # the file's own, never our globals
    with open(path) as f:
        try:
            exec(compile(f.read(), path, "exec"), namespace)
        except Exception as e:
            where = e.__traceback__.tb_next or e.__traceback__  # the file's frame, not ours
            line = e.lineno if isinstance(e, SyntaxError) else where.tb_lineno
            raise ConfigError(f"{path}, line {line}: {type(e).__name__}: "
                              f"{getattr(e, 'msg', e)} — fix the config file") from None
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and isinstance(v, SIMPLE_TYPES)}


def normalize(argv, switches=None, keep=()):
    """argv with each flag as one `--key=value` (`--key` alone if no value follows). A key of
    switches alone means its value; flags in keep stay as they are."""
    switches, flags, rest = switches or {}, [], list(argv)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--") or "=" in arg or arg in HELP_FLAGS or arg in keep:
            flags.append(arg)
            continue
        key = arg[2:]
        following = rest[0] if rest and not rest[0].startswith("--") else None
        if key in switches:
            value = switches[key]
            takes_next = following is not None
            takes_next = takes_next and type(read_flag(key, following, value)) is type(value)
            flags.append(f"{arg}={rest.pop(0) if takes_next else value}")
        else:
            flags.append(arg if following is None else f"{arg}={rest.pop(0)}")
    return flags


def parse(argv, switches=None):
    """(the config files' values, {key: the flag's text, None for a flag alone})."""
    files, overrides = {}, {}
    for arg in normalize(argv, switches):
        if arg.startswith("--"):
            key, equals, text = arg[2:].partition("=")
            if not key:
                raise ConfigError(f"bad argument {arg!r}: write --key=value or --key value")
            overrides[key] = text if equals else None
        else:
            files.update(read_config_file(arg))
    return files, overrides


def read_flag(key, text, default):
    """The value of `--key=text`: text for a text key, True for a flag alone."""
    if text is None:
        return True
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    return text if isinstance(default, str) and not isinstance(value, str) else value


def check_type(value, default):
    """(value as the default's type, None), or (None, what was expected)."""
    if default is None or type(value) is type(default):
        return value, None
    if type(default) is float and type(value) is int:
        return float(value), None
    return None, EXPECTED[type(default)]


def unknown_key(key, known, program):
    """What to say of a key without a default."""
    if key in KEYS_ELSEWHERE:
        return f"{program} has no setting {key}; did you mean to pass it to {KEYS_ELSEWHERE[key]}?"
    if key in CHECKPOINT_KEYS:
        return f"{key} is not a setting here: the checkpoint decides the model"
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key {key}; did you mean {close[0]}?"
    return f"unknown key {key} (--help lists the keys)"


def merge(defaults, files, overrides, script_keys=(), program="train.py"):
    """defaults updated with the files' values, then the flags, checked; script_keys, the
    caller's own, are skipped."""
    config, problems = dict(defaults), []
    given = [(key, value, f"{key}={value!r} in the config file") for key, value in files.items()]
    for key, text in overrides.items():
        flag = f"--{key}" if text is None else f"--{key}={text}"
        given.append((key, read_flag(key, text, defaults.get(key)), flag))
    for key, value, where in given:
        if key in script_keys:
            continue
        if key not in defaults:
            problems.append(unknown_key(key, [*defaults, *script_keys], program))
        elif where == f"--{key}" and not isinstance(defaults[key], bool):
            problems.append(f"{where} has no value: write {where}=VALUE or {where} VALUE")
        else:
            value, expected = check_type(value, defaults[key])
            if expected:
                problems.append(f"{where}: expected {expected} (now {config[key]!r})")
            else:
                config[key] = value
    if problems:
        raise ConfigError("; ".join(problems))
    return config
