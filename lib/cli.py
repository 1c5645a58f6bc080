"""
What every script does with a mistake the user can fix: one line that says what is wrong and what
to do, never a traceback. Also the stop signals, and the one way files are written: under a
temporary name, then renamed, so that a crash, a full disk or a signal never leaves half a file.

Exit status: 0 done, 1 a failure the user can fix (UserError), 2 a bad setting (ConfigError), and
128 + the signal's number for a stop signal, as a shell reports it: 130 Ctrl-C, 143 SIGTERM.
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
from contextlib import suppress

# Ctrl-C; `kill` and schedulers; a closed terminal; SLURM's warning before a time limit
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


class UserError(Exception):
    """A failure the user can fix: missing or damaged data, a folder in use, a full disk."""

    status = 1


class ConfigError(UserError, ValueError):
    """A bad setting: a wrong key, type or value."""

    status = 2


class Stopped(BaseException):
    """A stop signal ended the script; the message says what was saved, if anything."""

    def __init__(self, signum, message=None):
        super().__init__(f"stopped by {signal.Signals(signum).name}" if message is None else message)
        self.signum = signum


class StopRequests:
    """Within it, a stop signal does not interrupt: its number goes to .signum, for the script to
    stop where it can save its work, and acknowledge(signum) gives a line to print at once. A
    second signal stops at once (Stopped). passed_on: under torchrun, which passes a signal on to
    processes that may have had it already, the same signal within REPEAT_S seconds is that copy.
    exit_within_s: after a second signal the process ends that much later, even if its teardown
    hangs (torch.compile's workers, gloo's threads); None for a process that goes on (a test)."""

    REPEAT_S = 5.0

    def __init__(self, acknowledge=None, passed_on=False, exit_within_s=None):
        self.signum, self.acknowledge, self.passed_on = None, acknowledge, passed_on
        self.exit_within_s = exit_within_s

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():  # the only one signals reach
            self.previous = {s: signal.signal(s, self.request) for s in STOP_SIGNALS}
        return self

    def request(self, signum, frame):
        if self.signum is not None:
            recent = time.monotonic() - self.requested_at < self.REPEAT_S
            if self.passed_on and signum == self.signum and recent:
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
    """How to stop at once after a first signal, for its acknowledgement."""
    return "Ctrl-C again to stop at once" if signum == signal.SIGINT else "a second signal stops at once"


def leave_a_closed_terminal():
    """After a SIGHUP, a write to the closed terminal fails (EIO) and would end the script before
    it saves: what goes to that terminal goes to /dev/null instead."""
    for stream in (sys.stdout, sys.stderr):
        try:
            termios.tcgetattr(stream)  # fails with ENOTTY on a file or a pipe, EIO once closed
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
    follows goes to /dev/null, and on_close() is called once, for the script to stop where it
    can save its work. Without it, the next print would end the script."""

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

    def __getattr__(self, name):  # the rest is the stream's own (fileno, isatty, encoding, ...)
        return getattr(self.stream, name)

    def __exit__(self, *exc_info):
        sys.stdout = self.stream


def raise_stopped(signum, frame):
    if signum == signal.SIGHUP:
        leave_a_closed_terminal()
    raise Stopped(signum)


def main(entry):
    """Wraps a script's `entry(argv)` (argv defaults to sys.argv[1:]) to return its exit status.
    SIGTERM, SIGHUP and SIGUSR1 unwind as Ctrl-C does, so that `with` statements clean up."""

    @functools.wraps(entry)
    def wrapped(argv=None):
        argv = sys.argv[1:] if argv is None else argv
        in_main_thread = threading.current_thread() is threading.main_thread()
        stop_signals = STOP_SIGNALS[1:] if in_main_thread else ()  # SIGINT raises already
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
            if str(e):  # empty for the DDP processes that leave the talking to rank 0
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
    """Calls write(f) on path.tmp, then renames it to path. A failure removes path.tmp and leaves
    a previous file whole; a disk problem becomes one UserError. size, the bytes about to be
    written, lets a full disk be seen before anything is written."""
    tmp_path = path + ".tmp"
    folder = os.path.dirname(os.path.abspath(path))
    if size and os.path.isdir(folder) and shutil.disk_usage(folder).free < size:
        raise UserError(write_problem(path, RuntimeError("not enough space"), size))
    try:
        with open(tmp_path, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename, should the power go
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
    """The Stopped or KeyboardInterrupt along the chain of causes of error: torch.save, stopped
    by a second signal inside a write, reports a RuntimeError of its own. None otherwise."""
    while error is not None and not isinstance(error, (Stopped, KeyboardInterrupt)):
        error = error.__cause__ or error.__context__
    return error


def write_problem(path, error, size=0):
    """'cannot write PATH: cause; advice', or None for an error that is not the disk's. torch.save
    says a disk is full with a RuntimeError without errno: one counts when the free space is below
    size."""
    if isinstance(error, OSError) and error.errno is not None:
        code, cause = error.errno, error.strerror.lower()
    else:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        if not size or free >= size:
            return None
        code, cause = errno.ENOSPC, (f"no space left on device ({size / 1e6:,.1f} MB to write, "
                                     f"{free / 1e6:,.1f} MB free)")
    return f"cannot write {path}: {cause}; {ADVICE.get(code, 'check the disk and the path')}"
