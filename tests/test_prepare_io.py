"""
Tests of prepare_io.py, what prepare_wikipedia.py and fetch.py share: a failed write said in one
line, and the progress line. The lock and the UTF-8 check are tested through prepare_wikipedia.py.
Run: python -m pytest -q tests/test_prepare_io.py
"""

import errno
import os

import pytest

from lib import prepare_io
from lib.cli import UserError


def test_writing_turns_a_failed_write_into_one_line(tmp_path):
    target = str(tmp_path / "out.bin")
    with pytest.raises(UserError) as e:
        with prepare_io.writing(target, after_failure="no output written under the final names"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), target + ".tmp")
    assert str(e.value) == (f"cannot write {target}.tmp: no space left on device; free some space, "
                            "or write to another disk; no output written under the final names")
    with prepare_io.writing(target):  # nothing failed: nothing said
        pass


def test_progress_rewrites_one_line_and_ends_it_with_the_last_numbers(capsys, monkeypatch):
    # enter; each show reads the time, once more if shown
    clock = iter([100.0, 100.0, 100.0, 100.1, 100.3, 100.3])
    monkeypatch.setattr(prepare_io.time, "time", lambda: next(clock))
    monkeypatch.setattr(prepare_io.sys.stderr, "isatty", lambda: True)  # on a terminal
    with prepare_io.Progress() as progress:
        progress.show("1 of 3")  # shown: the first
        progress.show("2 of 3")  # 0.1 s later: not shown
        progress.show("3 of 3")  # 0.3 s after the first: shown
    assert capsys.readouterr().err == "\r1 of 3\r3 of 3\n"
