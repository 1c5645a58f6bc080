"""
What every script does with a mistake the user can fix: one line that says what is wrong and
what to do, and an exit status; never a traceback.

    @cli.main
    def main(argv):
        ...
        raise UserError("no data at data/wikipedia/train.bin — run `python prepare_wikipedia.py` first")

    if __name__ == "__main__":
        sys.exit(main())

Exit status: 0 done, 1 a failure the user can fix (UserError), 2 a bad setting (ConfigError),
130 Ctrl-C (SIGINT) and 143 SIGTERM where the script had nothing to save: 128 + the signal's
number, what a shell reports for a process a signal stopped.
"""

import functools
import signal
import sys
import threading


class UserError(Exception):
    """A failure the user can fix: missing or damaged data, a folder in use, a full disk."""

    status = 1


class ConfigError(UserError, ValueError):
    """A bad setting: a wrong key, type or value."""

    status = 2


class Stopped(BaseException):
    """A signal stopped the script (SIGTERM turned into an exception, as SIGINT already is)."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stopped(signum, frame):
    raise Stopped(signum)


def main(entry):
    """Wraps a script's `entry(argv)`: argv defaults to sys.argv[1:]; returns the exit status.

    SIGTERM (what `kill` and cluster schedulers send) unwinds like Ctrl-C does, so `finally`
    blocks and `with` statements clean up; a script with work to save handles both itself."""

    @functools.wraps(entry)
    def wrapped(argv=None):
        argv = sys.argv[1:] if argv is None else argv
        in_main_thread = threading.current_thread() is threading.main_thread()  # where signals arrive
        previous = signal.signal(signal.SIGTERM, raise_stopped) if in_main_thread else None
        try:
            return entry(argv) or 0
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.status
        except (KeyboardInterrupt, Stopped) as e:
            signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
            print(f"stopped by {signal.Signals(signum).name}", file=sys.stderr)
            return 128 + signum
        finally:
            if in_main_thread:
                signal.signal(signal.SIGTERM, previous)

    return wrapped
