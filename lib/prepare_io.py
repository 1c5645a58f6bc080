"""
What prepare_wikipedia.py and lib/fetch.py share to read text and write a data folder: the
folder's exclusive lock, text checked as UTF-8, a failed write said in one line, and a progress
line on stderr. train.py needs none of it.
"""

import os
import sys
import time
from contextlib import contextmanager

from lib.cli import UserError, write_problem
from lib.data import DATA_LOCK, lock_data_dir


def hold_for_writing(out_dir):
    """prepare_wikipedia.py's exclusive lock on out_dir (data.lock_data_dir) while it writes
    there, so that neither a run that trains from the folder nor a second preparation sees its
    files change under it."""
    if lock := lock_data_dir(out_dir, shared=False):
        return lock
    if reader := lock_data_dir(out_dir, shared=True):  # shared holders are runs
        reader.close()
        raise UserError(f"a run is training from {out_dir} (it holds "
                        f"{os.path.join(out_dir, DATA_LOCK)}), so its files cannot change now; "
                        "HINT: wait for the run to end, or prepare into another --out_dir")
    raise UserError(f"{out_dir} is in use by another prepare_wikipedia.py; HINT: wait for it to "
                    "end, or pass another --out_dir")


def utf8_text(block, offset, name):
    """block, bytes of the file name from byte offset on, decoded as UTF-8; a UserError naming
    the first byte that is not UTF-8 text. A NUL is refused too: binary files hold them."""
    bad = block.find(b"\0")
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = e.start if bad < 0 else min(bad, e.start)
    if bad >= 0 and block[bad] == 0:
        raise UserError(f"{name} is not UTF-8 text: byte {offset + bad:,} is a NUL, as in binary "
                        "files; HINT: give text files only; if it is text, convert it to UTF-8 "
                        "first")
    if bad >= 0:
        raise UserError(f"{name} is not UTF-8 text: byte {offset + bad:,} "
                        f"(0x{block[bad]:02x}) is not UTF-8; HINT: convert it to UTF-8 first, "
                        "e.g. `iconv -f latin1 -t utf-8 FILE > FILE.txt` for Latin-1 text, or "
                        "leave it out")
    return text


@contextmanager
def writing(path, after_failure=None):
    """An OSError while writing (or renaming to) path ends the run with cli.write_problem's line,
    then after_failure: what the failure left, if anything."""
    try:
        yield
    except OSError as e:
        name = e.filename2 or e.filename or path  # a failed write() names no file, a rename two
        problem = write_problem(name, e)
        raise UserError(f"{problem}; {after_failure}" if after_failure else problem) from None


class Progress:
    """One status line on stderr, ended on exit with the last numbers. On a terminal the line is
    rewritten in place at most 4 times a second; to a file or a pipe it comes as whole lines (no
    \\r), one every LINE_S seconds, so that a log reads line by line."""

    LINE_S = 10

    def __enter__(self):
        self.t0, self.last, self.message, self.shown = time.time(), 0.0, "", ""
        self.terminal = sys.stderr.isatty()
        return self

    def show(self, message):
        self.message = message
        if time.time() - self.last >= (0.25 if self.terminal else self.LINE_S):
            self.last, self.shown = time.time(), message
            self.print(message, end="")

    def print(self, message, end):
        if self.terminal:
            print(f"\r{message}", end=end, file=sys.stderr, flush=True)
        else:  # a line of its own, ended at once
            print(message, file=sys.stderr, flush=True)

    def __exit__(self, *exc_info):
        if self.message != self.shown:
            self.print(self.message, end="\n")
        elif self.message and self.terminal:  # a newline, so that later messages start clean
            print(file=sys.stderr, flush=True)
