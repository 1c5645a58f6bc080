"""
Settings from the command line: `[config_file.py ...] [--key=value | --key value | --key ...]`
over a dict of defaults: `config = merge(defaults, *parse(sys.argv[1:]))`.

A config file is plain Python run in a fresh namespace; its simple values (bool, int, float, str,
None) whose names do not start with "_" are taken. Flags win over files; a flag alone (`--compile`)
means True. Every key must have a default and every value its default's type (an int is accepted
for a float; a None default accepts any value), or merge raises one ConfigError that says why.
"""

import ast
import difflib
import os

from lib.cli import HELP_FLAGS, KEYS_ELSEWHERE, ConfigError, usage, wants_help  # noqa: F401 (--help, for the scripts)

SIMPLE_TYPES = (bool, int, float, str, type(None))
EXPECTED = {bool: "True or False", int: "an integer", float: "a number", str: "text"}  # what a wrong type should be


def read_config_file(path):
    """The simple, non-underscore values a Python config file defines."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} not found (a config file is a .py path such as config/tiny_cpu.py)")
    namespace = {}  # the file's own, never our globals
    with open(path) as f:
        try:
            exec(compile(f.read(), path, "exec"), namespace)
        except Exception as e:
            line = e.lineno if isinstance(e, SyntaxError) else (e.__traceback__.tb_next or e.__traceback__).tb_lineno
            raise ConfigError(f"{path}, line {line}: {type(e).__name__}: {getattr(e, 'msg', e)} — fix the config file") from None
    return {k: v for k, v in namespace.items() if not k.startswith("_") and isinstance(v, SIMPLE_TYPES)}


def normalize(argv, switches=None, keep=()):
    """argv with every flag as one `--key=value` (`--key` where no value follows), config files in
    place. `--key value` takes any next argument but a flag (so `--seed -1` works). A key of switches
    (bench.py's profile=5) alone means that value, and takes the next argument only when it is of its
    type (`--compare False`, not `--compare config/x.py`). Flags in `keep` stay as they are."""
    switches, flags, rest = switches or {}, [], list(argv)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--") or "=" in arg or arg in HELP_FLAGS or arg in keep:
            flags.append(arg)
            continue
        key = arg[2:]
        following = rest[0] if rest and not rest[0].startswith("--") else None
        if key in switches:
            takes_next = following is not None and type(read_flag(key, following, switches[key])) is type(switches[key])
            flags.append(f"{arg}={rest.pop(0) if takes_next else switches[key]}")
        else:
            flags.append(arg if following is None else f"{arg}={rest.pop(0)}")
    return flags


def parse(argv, switches=None):
    """Split argv into (values from the config files, {key: raw text of the flag's value, None alone})."""
    files, overrides = {}, {}
    for arg in normalize(argv, switches):
        if arg.startswith("--"):
            key, equals, text = arg[2:].partition("=")
            if not key:
                raise ConfigError(f"bad argument {arg!r}: flags are written --key=value or --key value")
            overrides[key] = text if equals else None
        else:
            files.update(read_config_file(arg))
    return files, overrides


def read_flag(key, text, default):
    """The Python value of `--key=text`; plain text for string keys; True for a flag alone."""
    if text is None:
        return True
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    return text if isinstance(default, str) and not isinstance(value, str) else value  # --wandb_run_name=2024: text


def check_type(value, default):
    """(the value converted to the default's type, None), or (None, what was expected)."""
    if default is None or type(value) is type(default):
        return value, None
    if type(default) is float and type(value) is int:
        return float(value), None
    return None, EXPECTED[type(default)]


def unknown_key(key, known, program):
    """The message for a key no default has: the script it belongs to, the closest known key, or --help."""
    if key in KEYS_ELSEWHERE and key not in known:
        return f"{program} has no setting {key}; did you mean to pass it to {KEYS_ELSEWHERE[key]}?"
    close = difflib.get_close_matches(key, known, n=1)
    return f"unknown key {key}; did you mean {close[0]}?" if close else f"unknown key {key} (--help lists the keys)"


def merge(defaults, files, overrides, script_keys=(), program="train.py"):
    """defaults updated with config-file values, then with flags; checked against defaults. script_keys,
    the calling script's own keys, are skipped here but suggested for a misspelt key."""
    config, problems = dict(defaults), []
    settings = [(key, value, f"{key}={value!r} in the config file") for key, value in files.items()]
    settings += [(key, read_flag(key, text, defaults.get(key)), f"--{key}" + f"={text}" * (text is not None))
                 for key, text in overrides.items()]
    for key, value, given in settings:
        if key in script_keys:
            continue
        if key not in defaults:
            problems.append(unknown_key(key, [*defaults, *script_keys], program))
        elif given == f"--{key}" and not isinstance(defaults[key], bool):  # a flag alone, of a key that is not a switch
            problems.append(f"{given} has no value: write {given}=VALUE or {given} VALUE")
        else:
            value, expected = check_type(value, defaults[key])
            if expected:
                problems.append(f"{given}: expected {expected} (now {config[key]!r})")
            else:
                config[key] = value
    if problems:
        raise ConfigError("; ".join(problems))
    return config
