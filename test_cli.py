"""
Tests of cli.py, what every script shares: --help, one line and an exit status for an error or a
signal where nothing is being saved, and writes that fail cleanly.
Run: python -m pytest -q test_cli.py
"""

import errno
import os
import signal
import subprocess
import sys

import pytest

import bench
import check_causal
import cli
import sample
import train
from conftest import REPO


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


SIGNALLED = """
import os, signal, sys, time
import cli
def entry(argv):
    os.kill(os.getpid(), int(argv[0]))
    time.sleep(30)  # the signal interrupts this
sys.exit(cli.main(entry)(sys.argv[1:]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1])
def test_a_signal_outside_training_is_one_line(signum):
    # where nothing is being saved (before training starts, in sample.py, ...): one line, 128 + the
    # signal's number; a process of its own, which the signal would kill if cli.main did not handle it
    done = subprocess.run([sys.executable, "-c", SIGNALLED, str(int(signum))], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 128 + signum
    assert done.stderr == f"stopped by {signal.Signals(signum).name}\n"


def test_a_read_only_folder_is_one_line(tmp_path):
    def refuse(f):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    (tmp_path / "study.md").write_text("old")
    with pytest.raises(cli.UserError, match=r"cannot write .*study.md: permission denied; check the folder's"):
        cli.write_atomically(str(tmp_path / "study.md"), refuse)
    assert (tmp_path / "study.md").read_text() == "old" and os.listdir(tmp_path) == ["study.md"]
