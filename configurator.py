"""
Settings from the command line: `[config_file.py ...] [--key=value | --key value ...]` over a
dict of defaults.

    files, overrides = configurator.parse(sys.argv[1:])
    config = configurator.merge(defaults, files, overrides)

A config file is plain Python run in a fresh namespace; its simple values (bool, int, float,
str, None) whose names do not start with "_" are taken, later files over earlier ones.
A flag is `--key=value` or `--key value` (the next argument is the value, even one that starts
with a single "-", such as -1). The value is read with ast.literal_eval, or kept as the raw
text for a key whose default is a string (so `--dtype=bfloat16` needs no quotes). Flags win
over files. Every key must have a default, and every value must match its default's type (an
int is accepted for a float; a None default accepts any value); otherwise merge raises one
ConfigError: a type error names the expected type and the value now in force, an unknown key
the closest known one.
`-h` or `--help` anywhere asks for the script's usage instead (wants_help, usage).
"""

import ast
import difflib
import os

from lib.cli import ConfigError  # noqa: F401 (the scripts' error for a bad setting, also importable from here)

SIMPLE_TYPES = (bool, int, float, str, type(None))
HELP_FLAGS = ("-h", "--help")
EXPECTED = {bool: "True or False", int: "an integer", float: "a number", str: "text"}  # what a wrong type should be


def read_config_file(path):
    """The simple, non-underscore values a Python config file defines."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} not found (a config file is a .py path such as config/tiny_cpu.py)")
    namespace = {}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), namespace)  # its own namespace, never our globals
    return {k: v for k, v in namespace.items() if not k.startswith("_") and isinstance(v, SIMPLE_TYPES)}


def wants_help(argv):
    return any(arg in HELP_FLAGS for arg in argv)


def usage(doc, config):
    """A script's --help text: its docstring, then every key with its value in config."""
    keys = "\n".join(f"  --{key}={value!r}" for key, value in config.items())
    return (f"{doc.strip()}\n\nkeys, as --key=value or --key value (after any config files), "
            f"with their values:\n{keys}")


def normalize(argv, switches=None, keep=()):
    """argv with every flag as one `--key=value` argument, config files left in place.

    `--key value` takes the next argument as the value, whatever it starts with but "--"
    (so `--seed -1` works). A switch, a key of `switches` such as bench.py's --compare, may
    stand alone for its value there; it takes the next argument only when that is a value of
    the switch's type (`--compare False`), so `--compare config/x.py` leaves the file a file.
    Flags in `keep` (another parser's options) stay as they are."""
    switches = switches or {}
    flags, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--") or "=" in arg or arg in HELP_FLAGS or arg in keep:
            flags.append(arg)
            continue
        key = arg[2:]
        following = rest[0] if rest and not rest[0].startswith("--") else None
        if key in switches:
            default = switches[key]
            takes_next = following is not None and type(read_flag(key, following, default)) is type(default)
            flags.append(f"{arg}={rest.pop(0) if takes_next else default}")
        elif following is None:
            raise ConfigError(f"{arg} has no value: write {arg}=VALUE or {arg} VALUE")
        else:
            flags.append(f"{arg}={rest.pop(0)}")
    return flags


def parse(argv, switches=None):
    """Split argv into (values from the config files, {key: raw text of the flag's value})."""
    files, overrides = {}, {}
    for arg in normalize(argv, switches):
        if arg.startswith("--"):
            key, _, text = arg[2:].partition("=")
            if not key:
                raise ConfigError(f"bad argument {arg!r}: flags are written --key=value or --key value")
            overrides[key] = text
        else:
            files.update(read_config_file(arg))
    return files, overrides


def read_flag(key, text, default):
    """The Python value of `--key=text`; plain text for string keys."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    if isinstance(default, str) and not isinstance(value, str):
        value = text  # e.g. --wandb_run_name=2024 stays the string '2024'
    return value


def check_type(value, default):
    """(the value converted to the default's type, None), or (None, what was expected)."""
    if default is None or type(value) is type(default):
        return value, None
    if type(default) is float and type(value) is int:
        return float(value), None
    return None, EXPECTED[type(default)]


def unknown_key(key, known):
    """The message for a key no default has: the closest known key, else where to find them."""
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key {key}; did you mean {close[0]}?"
    return f"unknown key {key} (--help lists the keys)"


def merge(defaults, files, overrides, script_keys=()):
    """defaults updated with config-file values, then with flags; checked against defaults.
    script_keys are keys the calling script reads itself: skipped here, but suggested for a
    misspelt key."""
    config, problems = dict(defaults), []
    settings = [(key, value, f"{key}={value!r} in the config file") for key, value in files.items()]
    settings += [(key, read_flag(key, text, defaults.get(key)), f"--{key}={text}") for key, text in overrides.items()]
    for key, value, given in settings:
        if key in script_keys:
            continue
        if key not in defaults:
            problems.append(unknown_key(key, [*defaults, *script_keys]))
            continue
        value, expected = check_type(value, defaults[key])
        if expected:
            problems.append(f"{given}: expected {expected} (now {config[key]!r})")
        else:
            config[key] = value
    if problems:
        raise ConfigError("; ".join(problems))
    return config
