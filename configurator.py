"""
Settings from `[config_file.py ...] [--key=value | --key value | --key ...]` over defaults:
`config = merge(defaults, *parse(sys.argv[1:]))`. A config file is plain Python; flags win over
files; a flag alone means True. A key needs a default, a value its default's type.
"""

import ast
import difflib
import os

from lib.cli import ConfigError

EXPECTED = {bool: "True or False", int: "an integer", float: "a number", str: "text"}
HELP_FLAGS = ("-h", "--help")


def wants_help(argv):
    return any(arg in HELP_FLAGS for arg in argv)


def usage(doc, config):
    """A script's --help: its docstring, then every key with its value."""
    keys = "\n".join(f"  --{key}={value!r}" for key, value in config.items())
    return f"{doc.strip()}\n\nkeys (--key=value or --key value), with their values:\n{keys}"


def read_config_file(path):
    """The values a config file defines (bool, int, float, str or None), but _names."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} not found: give a path such as config/tiny_cpu.py")
    namespace = {}  # the file's own, never our globals
    with open(path) as f:
        try:
            exec(compile(f.read(), path, "exec"), namespace)
        except Exception as e:
            where = e.__traceback__.tb_next or e.__traceback__  # the file's frame, not ours
            line = e.lineno if isinstance(e, SyntaxError) else where.tb_lineno
            raise ConfigError(f"{path}, line {line}: {type(e).__name__}: "
                              f"{getattr(e, 'msg', e)} — fix the config file") from None
    return {key: value for key, value in namespace.items() if not key.startswith("_")
            and isinstance(value, (bool, int, float, str, type(None)))}


def normalize(argv):
    """argv with each `--key value` joined into `--key=value`. A word that is a flag or a config
    file (.py) is no value: a flag before one stands alone."""
    flags, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        value_follows = rest and not rest[0].startswith("--") and not rest[0].endswith(".py")
        if arg.startswith("--") and "=" not in arg and arg not in HELP_FLAGS and value_follows:
            arg = f"{arg}={rest.pop(0)}"
        flags.append(arg)
    return flags


def parse(argv):
    """(the config files' values, {key: the flag's text, None for a flag alone})."""
    files, overrides = {}, {}
    for arg in normalize(argv):
        if arg in HELP_FLAGS:
            continue  # --help shows the values the rest of argv gives
        if arg.startswith("--"):
            key, equals, text = arg[2:].partition("=")
            overrides[key] = text if equals else None
        else:
            files.update(read_config_file(arg))
    return files, overrides


def read_flag(text, default):
    """The value of `--key=text`: text for a text key, True for a flag alone."""
    if text is None:
        return True
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    return text if isinstance(default, str) and not isinstance(value, str) else value


def merge(defaults, files, overrides, script_keys=()):
    """defaults updated with the files' values, then the flags', each checked against its
    default's type; script_keys, the caller's own, are skipped."""
    config, problems = dict(defaults), []
    given = [(key, value, f"{key}={value!r} in the config file") for key, value in files.items()]
    for key, text in overrides.items():
        flag = f"--{key}" if text is None else f"--{key}={text}"
        given.append((key, read_flag(text, defaults.get(key)), flag))
    for key, value, where in given:
        default = defaults.get(key)
        if key in script_keys:
            continue
        if key not in defaults:
            problems.append(unknown_key(key, [*defaults, *script_keys]))
        elif where == f"--{key}" and not isinstance(default, bool):
            problems.append(f"{where} has no value: write {where}=VALUE or {where} VALUE")
        elif type(default) is float and type(value) is int:
            config[key] = float(value)
        elif default is None or type(value) is type(default):
            config[key] = value
        else:
            problems.append(f"{where}: expected {EXPECTED[type(default)]} (now {config[key]!r})")
    if problems:
        raise ConfigError("; ".join(problems))
    return config


def unknown_key(key, known):
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key {key}; did you mean {close[0]}?"
    return f"unknown key {key} (--help lists the keys)"
