"""
What every script does with a mistake the user can fix: one line that says what is wrong and
what to do, and an exit status; never a traceback. Also the stop signals, --help, and the one way
files are written: under a temporary name, then renamed, so a crash, a full disk or a signal never
leaves half a file. A reader of the tutorial may skip this file.

    @cli.main
    def main(argv):
        ...
        raise UserError("no data at data/wikipedia/train.bin — run `python prepare_wikipedia.py` first")

    if __name__ == "__main__":
        sys.exit(main())

Exit status: 0 done, 1 a failure the user can fix (UserError), 2 a bad setting (ConfigError),
and 128 + the signal's number for a stop signal (STOP_SIGNALS), what a shell reports for a
process a signal stopped: 130 Ctrl-C (SIGINT), 143 SIGTERM, 129 SIGHUP, 138 SIGUSR1.
"""

import errno
import functools
import os
import shutil
import signal
import sys
import termios
import threading
import time
from contextlib import contextmanager, suppress

# the signals that ask a script to stop: Ctrl-C; `kill`, schedulers and preemptible machines;
# a closed terminal or a dropped ssh session; SLURM's warning before a time limit (--signal=USR1@120)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


# the keys of the scripts that do not read their flags through configurator.py, so that a flag
# given to the wrong script says where it belongs (test_configurator.py checks them against --help)
KEYS_ELSEWHERE = {**dict.fromkeys(("dataset", "input", "val", "detokenize", "num_proc", "max_chars", "url", "zip",
                                   "split", "train_tokens", "val_tokens", "val_fraction", "retries"), "prepare_wikipedia.py"),
                  **dict.fromkeys(("seeds", "out_root", "gpus", "report_only", "progress_s"), "study.py")}


HELP_FLAGS = ("-h", "--help")


def wants_help(argv):
    return any(arg in HELP_FLAGS for arg in argv)


def usage(doc, config):
    """A script's --help text: its docstring, then every key with its value in config."""
    keys = "\n".join(f"  --{key}={value!r}" for key, value in config.items())
    return f"{doc.strip()}\n\nkeys, as --key=value or --key value (after any config files), with their values:\n{keys}"


class UserError(Exception):
    """A failure the user can fix: missing or damaged data, a folder in use, a full disk."""

    status = 1


class ConfigError(UserError, ValueError):
    """A bad setting: a wrong key, type or value."""

    status = 2


class Stopped(BaseException):
    """A signal stopped the script (SIGTERM, SIGHUP or SIGUSR1 turned into an exception, as SIGINT
    already is); its message says what was saved, if the script saved anything."""

    def __init__(self, signum, message=None):
        super().__init__(f"stopped by {signal.Signals(signum).name}" if message is None else message)
        self.signum = signum


class StopRequests:
    """Within `with StopRequests() as stop:`, the STOP_SIGNALS do not interrupt: the signal's
    number goes to stop.signum, for the script to stop where it can save its work. A second
    signal stops at once (raises Stopped), for a user who will not wait.

    stop.acknowledge(signum), when set, gives the line printed at once on the first signal, so
    that the user knows it was heard long before the script can stop (a step may take minutes).
    passed_on=True is for a process under torchrun: torchrun passes a signal on to its processes,
    which may have got it themselves (SLURM signals every process of a job), so the same signal
    again within REPEAT_S seconds is that copy, not a second request.
    exit_within_s, for a script's own process: after a second signal, the process ends that many
    seconds later even if what it unwinds or tears down hangs (torch.compile's worker processes,
    gloo's threads); None for a process that goes on, as a test does."""

    REPEAT_S = 5.0

    def __init__(self, acknowledge=None, passed_on=False, exit_within_s=None):
        self.signum, self.acknowledge, self.passed_on = None, acknowledge, passed_on
        self.exit_within_s = exit_within_s

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():  # the only thread signals reach
            self.previous = {s: signal.signal(s, self.request) for s in STOP_SIGNALS}
        return self

    def request(self, signum, frame):
        if self.signum is not None:
            if self.passed_on and signum == self.signum and time.monotonic() - self.requested_at < self.REPEAT_S:
                return
            if self.exit_within_s is not None:
                watchdog = threading.Timer(self.exit_within_s, exit_now, args=(128 + signum,))
                watchdog.daemon = True
                watchdog.start()
            raise Stopped(signum, f"stopped at once by a second {signal.Signals(signum).name}")
        self.signum, self.requested_at = signum, time.monotonic()
        if signum == signal.SIGHUP:
            leave_a_closed_terminal()
        line = self.acknowledge and self.acknowledge(signum)
        if line:
            print(line, file=sys.stderr, flush=True)

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def exit_now(status):
    """Ends the process with status at once, with what it printed flushed."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(status)


def again(signum):
    """How a user stops at once after the first signal: for an acknowledgement."""
    return "Ctrl-C again to stop at once" if signum == signal.SIGINT else "a second signal stops at once"


def leave_a_closed_terminal():
    """After a SIGHUP: writes to a terminal that closed fail (EIO), and the next print would end
    the script before it saves; what goes to such a terminal goes to /dev/null instead."""
    for stream in (sys.stdout, sys.stderr):
        try:
            termios.tcgetattr(stream)  # works on an open terminal, fails with ENOTTY on a file or a pipe
        except termios.error as e:
            if e.args[0] == errno.EIO:
                to_devnull(stream)
        except (OSError, ValueError):  # no file descriptor at all (output captured in memory)
            pass


def to_devnull(stream):
    """What is written to stream from now on, and what it still buffers, goes to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


class quiet_when_closed:
    """Within it, a stdout whose reader went away (`python train.py | head`) costs nothing: what
    follows goes to /dev/null, and on_close() is called once, for the script to stop where it can
    save its work, as after a SIGPIPE. Without it, the next print would end the script."""

    def __init__(self, on_close):
        self.on_close, self.closed = on_close, False

    def __enter__(self):
        self.stream, sys.stdout = sys.stdout, self
        return self

    def write(self, text):
        return self.guarded(self.stream.write, text)

    def flush(self):
        return self.guarded(self.stream.flush)

    def guarded(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            to_devnull(self.stream)
            if not self.closed:
                self.closed = True
                self.on_close()
            return None

    def __getattr__(self, name):  # everything else is the stream's own (fileno, isatty, encoding, ...)
        return getattr(self.stream, name)

    def __exit__(self, *exc_info):
        sys.stdout = self.stream


def raise_stopped(signum, frame):
    if signum == signal.SIGHUP:
        leave_a_closed_terminal()
    raise Stopped(signum)


def main(entry):
    """Wraps a script's `entry(argv)`: argv defaults to sys.argv[1:]; returns the exit status.

    SIGTERM, SIGHUP and SIGUSR1 unwind like Ctrl-C does, so `finally` blocks and `with`
    statements clean up; a script with work to save handles them itself (StopRequests)."""

    @functools.wraps(entry)
    def wrapped(argv=None):
        argv = sys.argv[1:] if argv is None else argv
        in_main_thread = threading.current_thread() is threading.main_thread()  # where signals arrive
        stop_signals = STOP_SIGNALS[1:] if in_main_thread else ()  # SIGINT raises KeyboardInterrupt already
        previous = {signum: signal.signal(signum, raise_stopped) for signum in stop_signals}
        try:
            return entry(argv) or 0
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.status
        except KeyboardInterrupt:
            print("stopped by SIGINT", file=sys.stderr)
            return 128 + signal.SIGINT
        except Stopped as e:
            if str(e):  # empty for the processes of a DDP run that leave the talking to rank 0
                print(e, file=sys.stderr)
            return 128 + e.signum
        except BrokenPipeError:  # `python sample.py ... | head`: the reader has what it wanted
            to_devnull(sys.stdout)
            return 128 + signal.SIGPIPE
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    return wrapped


# --------------------------------------------------------------------------------------
# writing files

ADVICE = {  # what to do when a write fails, by errno
    errno.ENOSPC: "free some space on that disk, or write to another one",
    errno.EDQUOT: "free some space under your disk quota, or write elsewhere",
    errno.EACCES: "check the folder's permissions, or write elsewhere",
    errno.EPERM: "check the folder's permissions, or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
}


def write_atomically(path, write, size=0):
    """Calls write(f) on path.tmp (opened "wb"), then renames it to path. A failure (a full
    disk, a read-only folder, a signal) removes path.tmp and leaves a previous path whole; a
    disk problem becomes one UserError naming the file, its cause and what to do. `size`, the
    bytes about to be written, lets a full disk be recognized before anything is written."""
    tmp_path = path + ".tmp"
    folder = os.path.dirname(os.path.abspath(path))
    if size and os.path.isdir(folder) and shutil.disk_usage(folder).free < size:
        raise UserError(write_problem(path, RuntimeError("not enough space"), size))
    try:
        with open(tmp_path, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a machine that loses power keeps one whole file
        os.replace(tmp_path, path)
    except BaseException as e:
        with suppress(OSError):
            os.remove(tmp_path)
        stop = stop_within(e)
        if stop is not None and stop is not e:
            raise stop from None  # the signal, not torch.save's error around it
        problem = write_problem(path, e, size) if isinstance(e, (OSError, RuntimeError)) else None
        if problem:
            raise UserError(problem) from None
        raise


def stop_within(error):
    """The Stopped or KeyboardInterrupt that a second signal raised, found along the chain of the
    error it became: torch.save, interrupted inside a write, reports it as a RuntimeError of its own.
    None for an error no signal caused."""
    while error is not None and not isinstance(error, (Stopped, KeyboardInterrupt)):
        error = error.__cause__ or error.__context__
    return error


def write_problem(path, error, size=0):
    """'cannot write PATH: cause; advice' for a failed write, or None for an error that is not
    the disk's. torch.save reports a full disk as a RuntimeError without errno, so a
    RuntimeError counts as a full disk when the free space is below `size`."""
    if isinstance(error, OSError) and error.errno is not None:
        code, cause = error.errno, error.strerror.lower()
    else:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        if not size or free >= size:
            return None
        code, cause = errno.ENOSPC, f"no space left on device ({size / 1e6:,.1f} MB to write, {free / 1e6:,.1f} MB free)"
    return f"cannot write {path}: {cause}; {ADVICE.get(code, 'check the disk and the path')}"


@contextmanager
def writing(path, after_failure=None):
    """An OSError while writing (or renaming to) path ends the run with write_problem's line, then after_failure:
    what the failure left, if anything."""
    try:
        yield
    except OSError as e:
        name = e.filename2 or e.filename or path  # a failed write() names no file, a rename names two
        problem = write_problem(name, e) or f"cannot write {name}: {e}"
        raise UserError(f"{problem}; {after_failure}" if after_failure else problem) from None


class Progress:
    """One status line on stderr, rewritten in place at most 4 times a second; ended on exit."""

    def __enter__(self):
        self.t0, self.last, self.message, self.shown = time.time(), 0.0, "", ""
        return self

    def show(self, message):
        self.message = message
        if time.time() - self.last >= 0.25:
            self.last, self.shown = time.time(), message
            print(f"\r{message}", end="", file=sys.stderr, flush=True)

    def __exit__(self, *exc_info):
        if self.message:  # the final numbers, and a newline so that later messages start clean
            print(f"\r{self.message}" if self.message != self.shown else "", file=sys.stderr, flush=True)
