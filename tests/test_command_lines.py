"""
Tests of what every script shares (configurator.script, and train.py's signal handling and atomic
writes): --help, one line and an exit status for an error or a signal, and writes that fail
cleanly.
Run: python -m pytest -q tests/test_command_lines.py
"""

import errno
import importlib
import os
import signal
import subprocess
import sys

import pytest

import configurator
import train
from conftest import REPO


# every script, a key of its own with a value to give it, and a switch (a key whose value is a bool)
FLAG_FORMS = {
    "train": ("max_iters", 7, "compile"),
    "sample": ("num_samples", 7, "compile"),
    "prepare_wikipedia": ("train_tokens", 7, "detokenize"),
    "bench": ("iters", 7, "memory"),
    "study": ("out_root", "elsewhere", "report_only"),
    "check_causal": ("probe_steps", 7, "probe"),
    "report": ("plot", "curves.png", None),  # the two that take folders have no switch
    "visualize": ("grid", 4, None),
}


@pytest.mark.parametrize("script", FLAG_FORMS)
def test_every_script_takes_every_flag_form_and_its_help_shows_the_values(script, tmp_path, capsys):
    main = importlib.import_module(script).main
    key, value, switch = FLAG_FORMS[script]
    forms = [([f"--{key}={value}"], f"--{key}={value!r}"), ([f"--{key}", str(value)], f"--{key}={value!r}")]
    if switch:
        forms += [([f"--{switch}"], f"--{switch}=True"),  # a switch alone means True
                  ([f"--{switch}=True"], f"--{switch}=True"),
                  ([f"--{switch}=False"], f"--{switch}=False")]
    if script not in ("bench", "check_causal", "study"):  # whose .py words are train.py's configs
        config_file = tmp_path / "my_config.py"
        config_file.write_text(f"{key} = {value!r}\n")
        forms.append(([str(config_file)], f"--{key}={value!r}"))
    for argv in (["--help"], ["-h"]):
        assert main(argv) == 0
        doc = importlib.import_module(script).__doc__.strip().splitlines()[0]
        assert doc in capsys.readouterr().out
    for argv, shown in forms:
        assert main([*argv, "--help"]) == 0, argv
        out = capsys.readouterr().out
        assert f"\n  {shown}\n" in out, (argv, out[-2000:])


def test_no_script_parses_its_flags_with_argparse():
    for name in os.listdir(REPO):
        if name.endswith(".py"):
            with open(os.path.join(REPO, name)) as f:
                assert "argparse" not in f.read(), name


SIGNALLED = """
import os, signal, sys, time
import configurator
def entry(argv):
    os.kill(os.getpid(), int(argv[0]))
    time.sleep(30)  # the signal interrupts this
sys.exit(configurator.script(entry)(sys.argv[1:]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1])
def test_a_signal_outside_training_is_one_line(signum):
    # where nothing is being saved (before training starts, in sample.py, ...): one line, 128 + the
    # signal's number; a process of its own, which the signal would kill if configurator.script did not handle it
    done = subprocess.run([sys.executable, "-c", SIGNALLED, str(int(signum))], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 128 + signum
    assert done.stderr == f"stopped by {signal.Signals(signum).name}\n"


def test_a_closed_pipe_asks_for_a_stop_and_never_for_a_second_one():
    with train.StopSignals(speak=False, passed_on=False) as stop:
        os.kill(os.getpid(), signal.SIGPIPE)  # a write to a pipe whose reader went away
        assert stop.signum == signal.SIGPIPE
        os.kill(os.getpid(), signal.SIGPIPE)  # the next write: no second signal, no exit
    with train.StopSignals(speak=False, passed_on=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGPIPE)  # `... | head` ended by the same signal
        assert stop.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # Python's own again


def test_a_read_only_folder_is_one_line(tmp_path):
    def refuse(f):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    (tmp_path / "study.md").write_text("old")
    # no free space is claimed to be the cause, nor making space the cure
    with pytest.raises(configurator.UserError, match=r"cannot write .*study.md: permission denied; "
                                                     r"write elsewhere$"):
        train.write_atomically(str(tmp_path / "study.md"), refuse)
    assert (tmp_path / "study.md").read_text() == "old" and os.listdir(tmp_path) == ["study.md"]


def test_a_folder_in_the_way_is_no_full_disk(tmp_path):
    (tmp_path / "picture.png").mkdir()  # report.py --plot=FOLDER, say
    with pytest.raises(configurator.UserError, match=r"cannot write .*picture.png: is a directory; "
                                                     r"write elsewhere$"):
        train.write_atomically(str(tmp_path / "picture.png"), lambda f: f.write(b"png"))
    assert os.listdir(tmp_path) == ["picture.png"] and not os.listdir(tmp_path / "picture.png")


PRINTS_MUCH = """
import sys
import configurator

@configurator.script
def main(argv):
    for i in range(1_000_000):
        print("line", i)

sys.exit(main())
"""


def test_a_reader_that_goes_away_ends_a_script_quietly():
    # `python sample.py ... | head`: no BrokenPipeError traceback, the status a shell gives a SIGPIPE
    process = subprocess.Popen([sys.executable, "-c", PRINTS_MUCH], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "line 0\n"
    process.stdout.close()  # what head does after its lines
    assert process.wait(timeout=60) == 128 + signal.SIGPIPE
    assert process.stderr.read() == ""


def test_a_stop_signal_passes_through_the_checks_that_catch_errors(tmp_path, monkeypatch):
    # Stopped, like KeyboardInterrupt, is no Exception: a stop while a checkpoint is read stays a
    # stop, not a "damaged checkpoint", and a stop mid-write leaves no temporary file
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "ckpt.pt")
    torch.save({"format": train.FORMAT}, path)

    def stopped(*args, **kwargs):
        raise configurator.Stopped(signal.SIGINT)

    monkeypatch.setattr(train.torch, "load", stopped)
    with pytest.raises(configurator.Stopped):
        train.load_checkpoint(path)

    def half_then_stopped(f):
        f.write(b"half")
        stopped()

    with pytest.raises(configurator.Stopped):
        train.write_atomically(str(tmp_path / "table.md"), half_then_stopped)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
