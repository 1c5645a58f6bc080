"""
Tests that a stopped run loses minutes, not hours: the state saved at every evaluation and
apart from the best model, SIGTERM and SIGINT (real signals, to real processes: train.py,
torchrun, study.py) that stop after the step with the state saved, writes that fail cleanly,
and evaluations with --eval_only kept apart from the run's own. On a CPU, tiny models.
Run: python -m pytest -q test_preemption.py
"""

import collections
import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import checkpoint
import cli
import report
import train
from checkpoint import TRAINING_KEYS, load_checkpoint
from test_study import run_study
from test_train import REPO, TINY, flags, read_log

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py
# long enough to be signalled mid-run: 150 steps of a few ms; evaluations of 20 batches
RUN = dict(TINY, max_iters=150, eval_interval=50, eval_iters=20)
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
Usage = collections.namedtuple("Usage", "total used free")  # as shutil.disk_usage returns it


def argv_for(data_dir, out_dir, **overrides):
    return flags(**{**RUN, "data_dir": data_dir, "out_dir": str(out_dir), **overrides})


def start(argv, launcher=(sys.executable, "train.py")):
    return subprocess.Popen([*launcher, *argv], cwd=REPO, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(condition, process, timeout=90):
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, f"ended before the signal: {process.communicate()}"
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def trained_to(out_dir, iteration):
    """A condition: the log holds a train record at `iteration` or later."""
    def condition():
        try:
            with open(os.path.join(out_dir, "log.jsonl")) as f:
                return any(json.loads(line).get("iter", -1) >= iteration for line in f
                           if line.endswith("\n") and '"type": "train"' in line)
        except FileNotFoundError:
            return False
    return condition


def numbers(out_dir):
    """What a run computed, launch by launch merged as report.py reads it: every train and eval
    record's iteration and losses."""
    records, _ = report.read_log(str(out_dir))
    return [(r["type"], r["iter"], r.get("loss"), r.get("aux"), r.get("train_loss"), r.get("val_loss"))
            for r in records if r["type"] in ("train", "eval")]


@pytest.fixture(scope="module")
def unbroken(data_dir, tmp_path_factory):
    """The reference: RUN trained without a stop, for each model type asked for."""
    runs = {}

    def get(model_type):
        if model_type not in runs:
            out_dir = tmp_path_factory.mktemp(f"unbroken-{model_type}")
            assert train.main(argv_for(data_dir, out_dir, model_type=model_type)) == 0
            runs[model_type] = numbers(out_dir)
        return runs[model_type]
    return get


# --------------------------------------------------------------------------------------
# signals


@pytest.mark.parametrize("signum, model_type", [(signal.SIGTERM, "future_attn"), (signal.SIGINT, "baseline")])
def test_a_signal_stops_after_the_step_and_the_resumed_run_matches_an_unbroken_one(
        signum, model_type, data_dir, tmp_path, unbroken):
    out_dir = tmp_path / "run"
    process = start(argv_for(data_dir, out_dir, model_type=model_type))
    wait_for(trained_to(out_dir, 60), process)  # past the evaluation at 50
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    stopped_at = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert 60 <= stopped_at < RUN["max_iters"]
    assert max(r["iter"] for r in read_log(out_dir) if r["type"] == "train") == stopped_at  # no step lost
    name = signal.Signals(signum).name
    assert err.startswith(f"stopped by {name} after iteration {stopped_at}: saved {out_dir}/ckpt.pt; continue with: ")

    # the command the message gives continues the run, to the numbers of a run never stopped
    command = shlex.split(err.strip().split("continue with: ")[1])
    assert command[:2] == ["python", "train.py"] and command[-1] == "--init_from=resume"
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from iteration {stopped_at}" in resumed.stdout
    assert numbers(out_dir) == unbroken(model_type)


def test_a_signal_during_an_evaluation(data_dir, tmp_path, unbroken):
    # evaluations of 500 batches take a second or so; the signal comes right after step 50,
    # when the evaluation at 50 begins: it completes, is saved, then one more step, then the stop
    out_dir = tmp_path / "run"
    process = start(argv_for(data_dir, out_dir, eval_iters=500, eval_interval=50))
    wait_for(trained_to(out_dir, 50), process)
    process.send_signal(signal.SIGTERM)
    sent = time.time()
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert "stopped by SIGTERM after iteration 51" in err
    evals = [r for r in read_log(out_dir) if r["type"] == "eval"]
    assert [r["iter"] for r in evals] == [0, 50]  # the evaluation was made
    assert sent < evals[-1]["time"]  # and the signal came while it ran: its record is written after it
    assert train.main(argv_for(data_dir, out_dir, eval_iters=500, max_iters=60, eval_interval=50,
                               init_from="resume")) == 0
    assert load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"] == 60


def test_a_second_signal_while_saving_leaves_the_previous_checkpoint_whole(data_dir, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, max_iters=4, eval_interval=2)) == 0
    before = (out_dir / "ckpt.pt").read_bytes()
    save = torch.save

    def interrupted_save(obj, f):  # half the file written, then the second Ctrl-C arrives
        save(obj, f)
        f.truncate(f.tell() // 2)
        os.kill(os.getpid(), signal.SIGINT)  # the first (during this save) asked for the stop
        os.kill(os.getpid(), signal.SIGINT)  # the second stops at once

    monkeypatch.setattr(checkpoint.torch, "save", interrupted_save)
    status = train.main(argv_for(data_dir, out_dir, max_iters=8, eval_interval=2, init_from="resume"))
    assert status == 128 + signal.SIGINT
    assert "stopped at once by a second SIGINT" in capsys.readouterr().err
    assert (out_dir / "ckpt.pt").read_bytes() == before and not (out_dir / "ckpt.pt.tmp").exists()


def test_a_two_process_run_stopped_by_sigterm_resumes(data_dir, tmp_path):
    out_dir = tmp_path / "ddp"
    argv = argv_for(data_dir, out_dir, model_type="encdec", gradient_accumulation_steps=4, max_iters=300)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py")
    process = start(argv, launcher=torchrun)
    wait_for(trained_to(out_dir, 20), process)
    os.kill(process.pid, signal.SIGTERM)  # to torchrun, which passes it on to both processes
    out, err = process.communicate(timeout=60)
    stopped_at = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert 20 <= stopped_at < 300
    # one line from the processes (rank 0's); torchrun adds its own report of the signal
    assert err.count("stopped by SIGTERM") == 1 and f"after iteration {stopped_at}: saved" in err
    assert "train.py" not in "".join(line for line in err.splitlines() if line.startswith("  File"))
    assert max(r["iter"] for r in read_log(out_dir) if r["type"] == "train") == stopped_at
    resumed = subprocess.run([*torchrun, *argv, "--max_iters=" + str(stopped_at + 5), "--init_from=resume"],
                             cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    records, _ = report.read_log(str(out_dir))
    trains = [r["iter"] for r in records if r["type"] == "train"]
    assert trains == list(range(1, stopped_at + 6))  # every step once, none lost, none twice


def test_study_passes_sigterm_on_and_the_same_command_finishes(tiny, tmp_path):
    argv = [tiny["base"], "--seeds=3", f"--out_root={tmp_path}", f"--data_dir={tiny['data']}",
            "--max_iters=150", "--eval_interval=50"]
    run_dir = tmp_path / "base-seed3"
    process = start(argv, launcher=(sys.executable, "study.py"))
    wait_for(trained_to(run_dir, 20), process)
    child = int(open(run_dir / "train.lock").read().split("process ")[1].split()[0])
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM and "Traceback" not in out + err
    assert "the same command resumes the study" in err
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # train.py ended with study.py
    stopped_at = load_checkpoint(str(run_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert f"base-seed3: stopped at iter {stopped_at}, its state saved" in out
    status, out, _ = run_study(argv)
    assert status == 0 and f"[1/1] base-seed3: resuming from iter {stopped_at}" in out
    trains = [r["iter"] for r in report.read_log(str(run_dir))[0] if r["type"] == "train"]
    assert trains == list(range(1, 151))


@pytest.fixture
def tiny(data_dir, tmp_path):
    path = tmp_path / "base.py"
    settings = dict(TINY, max_iters=4, eval_interval=2)
    path.write_text("model_type = 'baseline'\n" + "".join(f"{k} = {v!r}\n" for k, v in settings.items()))
    return dict(base=str(path), data=data_dir)


# --------------------------------------------------------------------------------------
# what is saved when


def test_an_overfitting_run_resumes_from_its_latest_evaluation_not_its_best(data_dir, tmp_path, monkeypatch):
    # val improves until iteration 2, then worsens: best.pt stays at 2, ckpt.pt follows training
    val_at = {0: 5.0, 2: 4.0, 4: 4.5, 6: 4.8, 8: 5.1}
    estimate = train.estimate_loss
    iteration = iter(sorted(val_at))

    def overfitting(*args, **kwargs):
        losses = estimate(*args, **kwargs)
        return dict(losses, val=val_at[next(iteration)])

    monkeypatch.setattr(train, "estimate_loss", overfitting)
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, max_iters=6, eval_interval=2)) == 0
    best, latest = load_checkpoint(str(out_dir / "best.pt")), load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)
    assert best["iter_num"] == 2 and best["best_val_loss"] == 4.0
    assert latest["iter_num"] == 6 and latest["best_val_loss"] == 4.0
    assert set(os.listdir(out_dir)) == {"ckpt.pt", "best.pt", "log.jsonl", "train.lock"}  # two checkpoints at most
    assert "optimizer" not in best  # the model only
    for name, p in best["model"].items():  # best.pt is not the latest model
        if not torch.equal(p, latest["model"][name]):
            break
    else:
        pytest.fail("best.pt holds the latest model")
    assert train.main(argv_for(data_dir, out_dir, max_iters=8, eval_interval=2, init_from="resume")) == 0
    assert [r["iter_num"] for r in read_log(out_dir) if r["type"] == "start"] == [0, 6]


def test_a_full_disk_leaves_the_previous_checkpoint_and_no_temporary_file(data_dir, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, max_iters=2, eval_interval=2)) == 0
    before = {name: (out_dir / name).read_bytes() for name in ("ckpt.pt", "best.pt")}
    save = torch.save

    def disk_full(obj, f):  # part of the file, then the disk is full
        save(obj, f)
        f.truncate(100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    assert train.main(argv_for(data_dir, out_dir, max_iters=4, eval_interval=2, init_from="resume")) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"error: cannot write {out_dir}/" in err and "no space left on device; free some space" in err
    assert {name: (out_dir / name).read_bytes() for name in before} == before
    assert not [name for name in os.listdir(out_dir) if name.endswith(".tmp")]

    # torch.save itself reports a full disk as a RuntimeError without errno: the free space tells
    def torch_full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    calls = []

    def disk_usage(path):  # room before the write (the check made first), none after it failed
        calls.append(path)
        return Usage(total=10**9, used=10**9, free=10**9 if len(calls) == 1 else 1000)

    monkeypatch.setattr(checkpoint.torch, "save", torch_full)
    monkeypatch.setattr(cli.shutil, "disk_usage", disk_usage)
    assert train.main(argv_for(data_dir, out_dir, max_iters=4, eval_interval=2, init_from="resume")) == 1
    err = capsys.readouterr().err
    assert "no space left on device (" in err and "MB to write, 0.0 MB free)" in err
    assert {name: (out_dir / name).read_bytes() for name in before} == before


def test_a_read_only_folder_is_one_line(tmp_path):
    def refuse(f):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    (tmp_path / "study.md").write_text("old")
    with pytest.raises(cli.UserError, match=r"cannot write .*study.md: permission denied; check the folder's"):
        cli.write_atomically(str(tmp_path / "study.md"), refuse)
    assert (tmp_path / "study.md").read_text() == "old" and os.listdir(tmp_path) == ["study.md"]


# --------------------------------------------------------------------------------------
# evaluations and tables that do not mislabel


def test_eval_only_is_kept_apart_from_the_run(data_dir, tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, max_iters=4, eval_interval=2)) == 0
    before = report.summarize(str(out_dir))[0]
    other_data = tmp_path / "other"
    other_data.mkdir()
    rng = np.random.default_rng(5)
    for split in ("train", "val"):  # another text: other numbers
        rng.integers(0, 64, 2000).astype(np.uint16).tofile(other_data / f"{split}.bin")
    capsys.readouterr()
    assert train.main(argv_for(str(other_data), out_dir, max_iters=4, eval_iters=3, eval_only=True,
                               init_from="resume")) == 0
    out = capsys.readouterr().out
    assert f"evaluation only, of {out_dir}/ckpt.pt at iteration 4 on {other_data}" in out
    record = read_log(out_dir)[-1]
    assert record["type"] == "eval_only" and record["data_dir"] == str(other_data)
    assert [r["type"] for r in read_log(out_dir)].count("start") == 1  # no launch of the run's
    row, _, notes = report.summarize(str(out_dir))
    assert row == before  # the run's losses, best val and wall time: unchanged
    assert f"evaluated with --eval_only (not the run's numbers) at iter 4 on {other_data}" in notes[0]


# --------------------------------------------------------------------------------------
# data and settings checked before anything is written


@pytest.mark.parametrize("kind", ["int32", "int64", "text"])
def test_data_that_is_not_uint16_tokens_is_refused(kind, tmp_path, capsys):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        path = tmp_path / f"{split}.bin"
        if kind == "text":
            path.write_text("A file of text renamed to .bin, which is not made of token ids. " * 100)
        else:
            rng.integers(0, 50257, 3000).astype(kind).tofile(path)
    assert train.main(argv_for(str(tmp_path), tmp_path / "out", vocab_size=50257)) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path}/train.bin does not hold uint16 token ids: it looks like {kind}" in err
    assert "--vocab_size" not in err and not (tmp_path / "out").exists()


def test_uint16_tokens_pass_the_format_check(tmp_path):
    rng = np.random.default_rng(0)
    rng.integers(0, 50257, 3000).astype(np.uint16).tofile(tmp_path / "a.bin")
    import data
    data.check_format(str(tmp_path / "a.bin"))  # no error


def test_missing_wandb_writes_nothing(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, wandb_log=True)) == 2
    assert "wandb_log=True needs wandb" in capsys.readouterr().err
    assert not out_dir.exists()  # so the corrected command is not refused
    assert train.main(argv_for(data_dir, out_dir, max_iters=2)) == 0


def test_sample_says_once_that_it_crops_a_long_prompt(data_dir, tmp_path, capsys):
    import sample
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, vocab_size=50257, max_iters=2, eval_interval=2)) == 0
    capsys.readouterr()
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--num_samples=2", "--max_new_tokens=3",
                        "--start=word" + " word" * 39]) == 0
    out = capsys.readouterr().out
    assert out.count("note: the prompt has 40 tokens; the model sees only the last 16") == 1
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--max_new_tokens=3", "--start=word"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_sample_reads_best_or_latest(data_dir, tmp_path, capsys, monkeypatch):
    import sample
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, vocab_size=50257, max_iters=2, eval_interval=2)) == 0
    loaded = []
    monkeypatch.setattr(sample, "load_checkpoint", lambda path: loaded.append(path) or load_checkpoint(path))
    for which, name in (("best", "best.pt"), ("latest", "ckpt.pt")):
        assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--max_new_tokens=1", f"--checkpoint={which}"]) == 0
        assert loaded[-1] == os.path.join(str(out_dir), name)
    os.remove(out_dir / "best.pt")  # a run from before best.pt: its latest state, said so
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--max_new_tokens=1"]) == 0
    assert loaded[-1].endswith("ckpt.pt") and "has no best.pt" in capsys.readouterr().out


def test_sigterm_outside_training_is_one_line(capsys):
    # where nothing is being saved (before training starts, in sample.py, ...): one line, 128 + 15
    def entry(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal interrupts this

    assert cli.main(entry)([]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "stopped by SIGTERM\n"
