"""
Tests of cli.py, what every script shares: --help, one line and an exit status for an error or a
signal where nothing is being saved, and writes that fail cleanly.
Run: python -m pytest -q test_cli.py
"""

import errno
import os
import signal
import time

import pytest

import bench
import check_causal
import cli
import sample
import train


@pytest.mark.parametrize("main, doc_line, key", [
    (train.main, "Trains one of the three models", "--learning_rate=0.0009"),
    (sample.main, "Samples text from a model", "--max_new_tokens=200"),
    (bench.main, "Times one training step", "--iters=20"),
    (check_causal.main, "Checks that a model cannot see the future", "--probe_steps=0"),
])
def test_help_prints_usage_and_keys(main, doc_line, key, capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert doc_line in out and key in out


def test_sigterm_outside_training_is_one_line(capsys):
    # where nothing is being saved (before training starts, in sample.py, ...): one line, 128 + 15
    def entry(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal interrupts this

    assert cli.main(entry)([]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "stopped by SIGTERM\n"


def test_a_read_only_folder_is_one_line(tmp_path):
    def refuse(f):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    (tmp_path / "study.md").write_text("old")
    with pytest.raises(cli.UserError, match=r"cannot write .*study.md: permission denied; check the folder's"):
        cli.write_atomically(str(tmp_path / "study.md"), refuse)
    assert (tmp_path / "study.md").read_text() == "old" and os.listdir(tmp_path) == ["study.md"]
