"""
Settings from the command line: `[config_file.py ...] [--key=value ...]` over a dict of defaults.

    files, overrides = configurator.parse(sys.argv[1:])
    config = configurator.merge(defaults, files, overrides)

A config file is plain Python run in a fresh namespace; its simple values (bool, int, float,
str, None) whose names do not start with "_" are taken, later files over earlier ones.
A `--key=value` value is read with ast.literal_eval, or kept as the raw text for a key whose
default is a string (so `--dtype=bfloat16` needs no quotes). Flags win over files.
Every key must have a default, and every value must match its default's type (an int is
accepted for a float; a None default accepts any value); otherwise merge raises one
ConfigError that lists all the problems and the valid keys.
`-h` or `--help` anywhere asks for the script's usage instead (wants_help, usage).
"""

import ast
import os

from cli import ConfigError  # noqa: F401 (the scripts' error for a bad setting, also importable from here)

SIMPLE_TYPES = (bool, int, float, str, type(None))
HELP_FLAGS = ("-h", "--help")


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
    return f"{doc.strip()}\n\nkeys, as --key=value (after any config files), with their values:\n{keys}"


def parse(argv):
    """Split argv into (values from the config files, {key: raw text of --key=value})."""
    files, overrides = {}, {}
    for arg in argv:
        if arg.startswith("--"):
            key, sep, text = arg[2:].partition("=")
            if not sep or not key:
                raise ConfigError(f"bad argument {arg!r}: flags are written --key=value")
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


def check_type(key, value, default):
    """The value converted to the default's type, or an error message."""
    if default is None or type(value) is type(default):
        return value, None
    if type(default) is float and type(value) is int:
        return float(value), None
    return None, f"{key}={value!r} is a {type(value).__name__}, expected a {type(default).__name__} like {default!r}"


def merge(defaults, files, overrides):
    """defaults updated with config-file values, then with flags; checked against defaults."""
    config, problems = dict(defaults), []
    settings = [(key, value) for key, value in files.items()]
    settings += [(key, read_flag(key, text, defaults.get(key))) for key, text in overrides.items()]
    for key, value in settings:
        if key not in defaults:
            problems.append(f"unknown key {key!r}")
            continue
        value, problem = check_type(key, value, defaults[key])
        if problem:
            problems.append(problem)
        else:
            config[key] = value
    if problems:
        raise ConfigError("; ".join(problems) + "\nvalid keys: " + ", ".join(sorted(defaults)))
    return config
