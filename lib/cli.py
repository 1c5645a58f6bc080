"""
What every script does with a mistake the user can fix: one line saying what to do, exit status 1
(UserError) or 2 (a bad setting, ConfigError), never a traceback. Also the stop signals (status
128 + the signal's number) and atomic writes: a crash never leaves half a file.
"""

import errno
import os
import shutil
import signal
import sys
import termios
import threading
import time
from contextlib import suppress

# Ctrl-C; kill; a closed terminal; SLURM's warning before a time limit
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


class UserError(Exception):
    """A failure the user can fix: missing data, a folder in use, a full disk."""

    status = 1


class ConfigError(UserError, ValueError):
    """A bad setting: a wrong key, type or value."""

    status = 2


class Stopped(BaseException):
    """A stop signal ended the script; the message says what was saved."""

    def __init__(self, signum, message):
        super().__init__(message)
        self.signum = signum


class StopRequests:
    """Within it, a first stop signal sets .signum, for the script to stop where it can save,
    and is answered at once with plan(). A second raises Stopped, and ends the process within
    exit_within_s seconds even if its teardown hangs. passed_on: under torchrun, the same signal
    within 5 s is torchrun's copy. closed_pipe: a SIGPIPE (`train.py | head`) asks for a stop
    too, never a second one."""

    def __init__(self, plan=None, passed_on=False, exit_within_s=None, closed_pipe=False):
        self.signum, self.plan, self.passed_on = None, plan, passed_on
        self.exit_within_s, self.closed_pipe = exit_within_s, closed_pipe

    def __enter__(self):
        signals = [*STOP_SIGNALS, signal.SIGPIPE] if self.closed_pipe else STOP_SIGNALS
        self.previous = {s: signal.signal(s, self.request) for s in signals}
        return self

    def request(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum is not None:
            copy = self.passed_on and signum == self.signum and time.monotonic() < self.copies_until
            if copy or signum == signal.SIGPIPE:
                return
            if self.exit_within_s is not None:
                watchdog = threading.Timer(self.exit_within_s, exit_now, args=(128 + signum,))
                watchdog.daemon = True
                watchdog.start()
            raise Stopped(signum, f"stopped at once by a second {name}")
        self.signum, self.copies_until = signum, time.monotonic() + 5.0
        if signum == signal.SIGHUP:
            leave_a_closed_terminal()
        if self.plan:
            print(f"{name}: {self.plan()}; a second signal stops at once", file=sys.stderr,
                  flush=True)

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def exit_now(status):
    """Ends the process at once, with what it printed flushed."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(status)


def leave_a_closed_terminal():
    """After a SIGHUP, what goes to a closed terminal goes to /dev/null instead."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(ValueError):  # no file behind the stream
            try:
                termios.tcgetattr(stream)
            except termios.error as e:
                if e.args[0] == errno.EIO:  # the terminal closed
                    to_devnull(stream)


def to_devnull(stream):
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


def raise_stopped(signum, frame):
    if signum == signal.SIGHUP:
        leave_a_closed_terminal()
    raise Stopped(signum, f"stopped by {signal.Signals(signum).name}")


def main(entry):
    """Wraps a script's entry(argv) to return its exit status."""

    def wrapped(argv=None):
        argv = sys.argv[1:] if argv is None else argv
        previous = {signum: signal.signal(signum, raise_stopped) for signum in STOP_SIGNALS}
        try:
            return entry(argv) or 0
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.status
        except Stopped as e:
            if str(e):  # empty for DDP processes but rank 0
                print(e, file=sys.stderr)
            return 128 + e.signum
        except BrokenPipeError:  # `python sample.py | head`: the reader has what it wanted
            to_devnull(sys.stdout)
            return 128 + signal.SIGPIPE
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    return wrapped


ADVICE = {  # what to do when a write fails, by errno
    errno.ENOSPC: "free some space, or write to another disk",
    errno.EACCES: "check the folder's permissions, or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
}


def write_atomically(path, write, size=0):
    """write(f) to path.tmp, renamed to path: a failure leaves a previous file whole. size, what
    write() writes, tells a full disk behind torch.save's RuntimeError, which has no errno."""
    tmp_path = path + ".tmp"
    try:
        with open(tmp_path, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename
        os.replace(tmp_path, path)
    except BaseException as e:
        with suppress(OSError):
            os.remove(tmp_path)
        stop = stop_within(e)
        if stop is not None:
            raise stop from None  # the signal, not torch.save's error around it
        if isinstance(e, OSError):
            raise UserError(write_problem(path, e)) from None
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free if size else 0
        if isinstance(e, RuntimeError) and free < size:
            needs = f"{size / 1e6:,.1f} MB to write, {free / 1e6:,.1f} MB free"
            raise UserError(f"cannot write {path}: no space left on device ({needs}); "
                            f"{ADVICE[errno.ENOSPC]}") from None
        raise


def stop_within(error):
    """The Stopped or KeyboardInterrupt that error's chain holds (torch.save wraps it)."""
    while error is not None and not isinstance(error, (Stopped, KeyboardInterrupt)):
        error = error.__cause__ or error.__context__
    return error


def write_problem(path, error):
    """'cannot write PATH: cause; what to do' for an OSError."""
    cause = error.strerror.lower() if error.strerror else error
    return f"cannot write {path}: {cause}; {ADVICE.get(error.errno, 'check the disk and the path')}"
