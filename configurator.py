"""
The configuration of every script: `[config_file.py ...] [--key=value | --key value | --key ...]`
over the script's defaults. A config file is plain Python; flags win over files; a flag alone
means True; a key needs a default, and a value the type of its default. Also how a script says a
mistake its user can fix: in one line, never a traceback.
"""

import ast
import contextlib
import difflib
import fcntl
import os
import signal
import socket
import sys
import types

EXPECTED = {bool: "True or False", int: "an integer", float: "a number", str: "text"}
HELP_FLAGS = ("-h", "--help")
# Ctrl-C, kill, a closed terminal, and SLURM's warning before a time limit
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


class UserError(Exception):
    """A failure the user can fix: missing data, a folder in use, a full disk."""

    status = 1


class ConfigError(UserError, ValueError):
    """A bad setting."""

    status = 2


class Stopped(BaseException):
    """A stop signal ended the script; the message says what was saved. Like KeyboardInterrupt,
    no `except Exception` catches it."""

    def __init__(self, signum, message=None):
        self.signum, self.status = signum, 128 + signum
        super().__init__(message if message is not None else
                         f"stopped by {signal.Signals(signum).name}")


def script(main):
    """main(argv) made to return an exit status (a UserError's, a ConfigError's, 128 + a stop
    signal's number), each error said in one line."""

    def raise_stopped(signum, frame):
        raise Stopped(signum)

    def wrapped(argv=None):
        previous = {signum: signal.signal(signum, raise_stopped) for signum in STOP_SIGNALS}
        try:
            return main(sys.argv[1:] if argv is None else argv) or 0
        except (UserError, Stopped) as e:
            if str(e):  # the processes of a DDP run but rank 0 say nothing
                say(f"error: {e}" if isinstance(e, UserError) else str(e))
            return e.status
        except BrokenPipeError:  # `python sample.py | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    return wrapped


def say(line):
    """Prints a line to stderr, whose reader may have gone away."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def exit_now(status):
    """Ends the process without the interpreter's teardown of torch, which can take seconds."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


@contextlib.contextmanager
def lock_folder(folder, name, program):
    """Holds an flock on folder/name, a file naming its holder, and removes the file at the end,
    still holding it. The kernel releases the lock however the process ends: a killed holder
    never blocks the folder, and leaves its file behind, naming it."""
    path = os.path.join(folder, name)
    try:
        os.makedirs(folder, exist_ok=True)
        while True:
            lock = open(path, "a+")
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # A holder that ended between our open and our flock removed the file we locked:
            # that lock guards nothing, so lock the file now at the path instead.
            if os.path.exists(path) and os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino:
                break
            lock.close()
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read()
        lock.close()
        raise UserError(f"{folder} is in use by {holder}: wait for it to end, or use another "
                        "folder") from None
    except OSError as e:
        raise UserError(f"cannot create {folder}: {e.strerror.lower()}; choose another "
                        "folder") from None
    with lock:
        lock.truncate(0)
        lock.write(f"{program} (process {os.getpid()} on {socket.gethostname()})")
        lock.flush()
        try:
            yield lock
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)  # before the lock is let go: the next holder makes a new file


def wants_help(argv):
    return any(arg in HELP_FLAGS for arg in argv)


def usage(doc, config):
    """A script's --help: its docstring, then every key with its value."""
    keys = "\n".join(f"  --{key}={value!r}" for key, value in config.items())
    return f"{doc.strip()}\n\nkeys (--key=value or --key value), with their values:\n{keys}"


def read_config_file(path):
    """The values a config file defines (bool, int, float, str or None), except _names and the
    modules, functions and classes it uses. A value of another type is refused: `max_iters = 10,`
    (a trailing comma) makes a tuple, which no key takes."""
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
    values = {}
    for key, value in namespace.items():
        if key.startswith("_") or isinstance(value, (type, types.ModuleType, types.FunctionType)):
            continue
        if not isinstance(value, (bool, int, float, str, type(None))):
            raise ConfigError(f"{path}: {key} = {value!r} is a {type(value).__name__}, which no "
                              "key takes (a trailing comma makes a tuple) — fix the config file")
        values[key] = value
    return values


def normalize(argv):
    """argv with each `--key value` joined into `--key=value`. A flag or a config file (.py) is
    no value, so a flag before one stands alone."""
    flags, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        value_follows = rest and not rest[0].startswith("--") and not rest[0].endswith(".py")
        if arg.startswith("--") and "=" not in arg and arg not in HELP_FLAGS and value_follows:
            arg = f"{arg}={rest.pop(0)}"
        flags.append(arg)
    return flags


def take_runs(argv):
    """(the run folders argv names, in order, and the rest of argv). A run folder is written as a
    plain word or as --out_dir=RUN, as train.py writes it, each as often as there are runs. A word
    after a bare `--key` is that flag's value; a word ending in .py is a config file."""
    runs, rest = [], []
    for arg in normalize(argv):
        if arg.startswith("--out_dir="):
            runs.append(arg.removeprefix("--out_dir="))
        elif arg.startswith("-") or arg.endswith(".py"):
            rest.append(arg)
        else:
            runs.append(arg)
    return runs, rest


def parse(argv):
    """(the config files' values, {key: the flag's text, or None for a flag alone}). A value from
    a file comes with its file's path, for the errors that name it."""
    files, overrides = {}, {}
    for arg in normalize(argv):
        if arg in HELP_FLAGS:
            continue  # --help shows the values that the rest of argv gives
        if arg.startswith("--"):
            key, equals, text = arg[2:].partition("=")
            overrides[key] = text if equals else None
        elif arg.startswith("-") and not arg.endswith(".py"):
            raise ConfigError(f"{arg} is not a flag: flags start with two dashes, as in "
                              f"--{arg.lstrip('-')}")
        else:
            files.update({key: (value, arg) for key, value in read_config_file(arg).items()})
    return files, overrides


def read_flag(text, default):
    """The value of `--key=text`: the text itself for a text key, True for a flag alone."""
    if text is None:
        return True
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    return text if isinstance(default, str) and not isinstance(value, str) else value


def merge(defaults, files, overrides, script_keys=()):
    """The defaults updated with the files' values, then the flags', each checked against the
    type of its default. script_keys are the caller's own, and skipped."""
    config, problems = dict(defaults), []
    given = [(key, value, f"{key} = {value!r} in {path}") for key, (value, path) in files.items()]
    for key, text in overrides.items():
        flag = f"--{key}" if text is None else f"--{key}={text}"
        given.append((key, read_flag(text, defaults.get(key)), flag))
    for key, value, where in given:
        default = defaults.get(key)
        if key in script_keys:
            continue
        if key not in defaults:
            close = difflib.get_close_matches(key, [*defaults, *script_keys], n=1)
            problems.append(f"unknown key {key}; did you mean {close[0]}?" if close else
                            f"unknown key {key} (--help lists the keys)")
        elif where == f"--{key}" and not isinstance(default, bool):
            problems.append(f"{where} has no value: write {where}=VALUE or {where} VALUE")
        elif type(default) is float and type(value) is int:
            config[key] = float(value)
        elif default is None or type(value) is type(default):
            config[key] = value
        elif where.startswith("--"):  # the value a file or the default gives, in force now
            problems.append(f"{where}: expected {EXPECTED[type(default)]} (now {config[key]!r})")
        else:
            problems.append(f"{where}: expected {EXPECTED[type(default)]}")
    if problems:
        raise ConfigError("; ".join(problems))
    return config


def own_settings(overrides, defaults):
    """The settings of a script's own keys among overrides, whose other keys are train.py's."""
    return merge(defaults, {}, {key: text for key, text in overrides.items() if key in defaults})


def settings(argv, defaults, script_keys=()):
    """The config of a script with keys of its own only: its defaults, changed by argv."""
    return merge(defaults, *parse(argv), script_keys)
