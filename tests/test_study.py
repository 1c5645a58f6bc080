"""
Tests of study.py: configs × seeds through train.py, on a CPU with tiny models on random tokens
(conftest.py): the table of means over seeds, a study killed or signalled and resumed, run
folders it must not train over, and its pieces (scheduling, launching, the numbers, the command
line). report.py's own tests are in test_report.py.
Run: python -m pytest -q test_study.py
"""

import contextlib
import importlib.util
import io
import itertools
import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
import torch

import report
import study
from configurator import Stopped
from train import TRAINING_KEYS, load_checkpoint
from conftest import REPO, TINY, flip_bits, read_log, start, trained_to, wait_for


@pytest.fixture(scope="module")
def two_configs(data_dir, tmp_path_factory):
    """Random-token data (conftest.py) and two tiny config files, a baseline and a future_attn."""
    path = tmp_path_factory.mktemp("tiny")
    settings = dict(TINY, max_iters=4, eval_interval=2)
    lines = "".join(f"{key} = {value!r}\n" for key, value in settings.items())
    for name, model_type in (("base", "baseline"), ("future", "future_attn")):
        (path / f"{name}.py").write_text(f"model_type = {model_type!r}\n{lines}")
    return dict(data=data_dir, base=str(path / "base.py"), future=str(path / "future.py"))


@pytest.fixture(scope="module", autouse=True)
def one_thread_runs():
    """Each train.py child on one thread: tiny models run fastest so on busy cores."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


def base_study(two_configs, out_root, seeds, *flags):
    """study.py's arguments for a study of the base config alone."""
    return [two_configs["base"], f"--seeds={seeds}", f"--out_root={out_root}",
            f"--data_dir={two_configs['data']}", *flags]


def run_study(argv):
    """(exit status, stdout, stderr) of study.main in this process (its runs are children)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = study.main(argv)
    return status, out.getvalue(), err.getvalue()


def starts(out_dir):
    return [r for r in read_log(out_dir) if r["type"] == "start"]


def open_or_empty(path):
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


# the max_iters of a run a test stops: no machine trains that far in a test's time
BEYOND_REACH = 10**6


@pytest.fixture(scope="module")
def finished_study(two_configs, tmp_path_factory):
    """2 configs × 2 seeds of 4 steps each, trained through study.py."""
    out_root = str(tmp_path_factory.mktemp("study"))
    argv = [two_configs["base"], two_configs["future"], "--seeds=1,2", f"--out_root={out_root}",
            f"--data_dir={two_configs['data']}"]
    status, out, err = run_study(argv)
    return dict(argv=argv, out_root=out_root, status=status, out=out, err=err)


RUN_NAMES = ["base-seed1", "future-seed1", "base-seed2", "future-seed2"]  # seed by seed


def test_study_trains_every_config_and_seed(finished_study):
    assert finished_study["status"] == 0, finished_study["out"] + finished_study["err"]
    out = finished_study["out"]
    for k, name in enumerate(RUN_NAMES, 1):
        assert f"[{k}/4] {name}: training" in out and f"[{k}/4] {name}: done at iter 4" in out
        out_dir = os.path.join(finished_study["out_root"], name)
        records = read_log(out_dir)
        assert [r["init_from"] for r in starts(out_dir)] == ["scratch"]
        assert records[0]["config"]["seed"] == int(name[-1])
        assert [r["iter"] for r in records if r["type"] == "eval"] == [0, 2, 4]
        assert load_checkpoint(os.path.join(out_dir, "ckpt.pt"))["iter_num"] == 4
        with open(os.path.join(out_dir, "train.out")) as f:
            assert "eval at iter 4:" in f.read()  # the child's own output is kept
    # the seeds really differ
    assert read_log(os.path.join(finished_study["out_root"], "base-seed1"))[-1]["val_loss"] != \
        read_log(os.path.join(finished_study["out_root"], "base-seed2"))[-1]["val_loss"]


def test_a_second_study_trains_nothing(finished_study):
    status, out, _ = run_study(finished_study["argv"])
    assert status == 0
    assert "nothing to train" in out and f"finished before: {', '.join(RUN_NAMES)}" in out
    for name in RUN_NAMES:
        assert len(starts(os.path.join(finished_study["out_root"], name))) == 1


def hand_numbers(out_dir):
    """(train loss, val loss, aux loss) of a run, read plainly from its log.jsonl."""
    records = read_log(out_dir)
    last_eval = [r for r in records if r["type"] == "eval"][-1]
    aux = [r for r in records if r["type"] == "train"][-1]["aux"]
    return last_eval["train_loss"], last_eval["val_loss"], aux.get("future_attn_loss")


def test_the_table_holds_mean_and_std_over_seeds(finished_study):
    out_root = finished_study["out_root"]
    with open(os.path.join(out_root, "study.json")) as f:
        table = json.load(f)
    with open(os.path.join(out_root, "study.md")) as f:
        text = f.read()
    assert text in finished_study["out"]  # printed as written
    numbers = {name: [hand_numbers(os.path.join(out_root, f"{name}-seed{s}")) for s in (1, 2)]
               for name in ("base", "future")}
    assert table["reference"] == "base"
    assert [row["config"] for row in table["configs"]] == ["base", "future"]
    for row in table["configs"]:
        runs = numbers[row["config"]]
        assert row["seeds_finished"] == [1, 2]
        for column, values in (("train_loss", [r[0] for r in runs]),
                               ("val_loss", [r[1] for r in runs])):
            mean, std = np.mean(values), np.std(values, ddof=1)
            assert row[column]["mean"] == pytest.approx(mean, abs=1e-12)
            assert row[column]["std"] == pytest.approx(std, abs=1e-12)
            assert f"{mean:.4f} ± {std:.4f}" in text
        diffs = [ours[1] - ref[1] for ours, ref in zip(runs, numbers["base"])]  # paired by seed
        if row["config"] == "future":
            assert row["val_difference"]["mean"] == pytest.approx(np.mean(diffs), abs=1e-12)
            assert row["val_difference"]["std"] == pytest.approx(np.std(diffs, ddof=1), abs=1e-12)
            assert row["val_difference"]["paired"]
            assert f"{np.mean(diffs):+.4f} ± {np.std(diffs, ddof=1):.4f}" in text
            aux = [r[2] for r in runs]
            assert row["aux_loss"]["mean"] == pytest.approx(np.mean(aux), abs=1e-15)
            assert row["aux_loss"]["std"] == pytest.approx(np.std(aux, ddof=1), abs=1e-15)
        else:
            assert row["aux_loss"] is None and "| base | 2 of 2 | 32,928 |" in text
    assert "write-up" not in text  # tiny models are no write-up config's


def test_kill_then_resume(two_configs, tmp_path):
    # a real kill -9 of study.py and its train.py after a checkpoint past iteration 0, in a run
    # that cannot reach its end first however fast the machine; resumed to a few steps further
    argv = base_study(two_configs, tmp_path, 7, f"--max_iters={BEYOND_REACH}", "--eval_interval=5")
    ckpt_path = tmp_path / "base-seed7" / "ckpt.pt"
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "study.py"), *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 60
        def saved_past_0():
            return ckpt_path.exists() and study.saved_iteration(str(ckpt_path)) > 0

        while not saved_past_0() and time.time() < deadline:
            time.sleep(0.02)
    finally:
        children = []
        for option in ("-s", "-P"):  # its session's processes, and its children
            children += subprocess.run(["pgrep", option, str(proc.pid)], capture_output=True,
                                       text=True).stdout.split()
        for pid in {proc.pid, *map(int, children)}:  # the runs have sessions of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
    killed_at = load_checkpoint(str(ckpt_path))["iter_num"]
    assert killed_at > 0
    status, out, _ = run_study([*argv, f"--max_iters={killed_at + 7}"])
    assert status == 0 and f"[1/1] base-seed7: resuming from iter {killed_at}" in out
    records = read_log(tmp_path / "base-seed7")
    resumed = [r for r in records if r["type"] == "start"][-1]
    assert resumed["init_from"] == "resume" and resumed["iter_num"] == killed_at
    assert records[-1]["type"] == "eval" and records[-1]["iter"] == killed_at + 7
    # the resumed run supersedes the killed one
    kept, _ = report.read_log(str(tmp_path / "base-seed7"))
    assert [r["iter"] for r in kept if r["type"] == "train"] == list(range(1, killed_at + 8))


def train_iters(run_dir):
    """The iterations of the train records in a run's log so far."""
    with open(run_dir / "log.jsonl") as f:
        return [r["iter"] for r in map(json.loads, f) if r["type"] == "train"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1])
def test_study_passes_a_signal_on_at_once_and_resumes(signum, two_configs, tmp_path):
    # a run far from its end, so that the signal lands mid-run however fast the machine; its
    # steps take milliseconds, so a signal passed on late shows as many steps trained after it
    argv = base_study(two_configs, tmp_path, 3, f"--max_iters={BEYOND_REACH}", "--eval_interval=50")
    run_dir = tmp_path / "base-seed3"
    process = start(argv, launcher=(sys.executable, "study.py"))
    wait_for(trained_to(run_dir, 20), process)
    child = int(open(run_dir / "train.lock").read().split("process ")[1].split()[0])
    sent_at = train_iters(run_dir)[-1]  # the last step logged when the signal goes
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum and "Traceback" not in out + err
    name = signal.Signals(signum).name
    assert err.startswith(f"{name}: passed on to the running runs, which stop after their current "
                          "step with their state saved; a second signal stops at once\n")
    assert err.endswith(f"stopped by {name}: every run that was training saved its state; the "
                        "same command resumes the study\n")
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # train.py ended with study.py
    # train.py heard it once, and stopped after the step under way with that step saved
    train_out = (run_dir / "train.out").read_text()
    assert train_out.count(f"{name}: stopping after the step under way, with its state saved") == 1
    stopped_at = load_checkpoint(str(run_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert f"stopped by {name} after iteration {stopped_at}: " in train_out
    assert train_iters(run_dir)[-1] == stopped_at
    step_s = np.median([r["ms_per_iter"] for r in read_log(run_dir) if r["type"] == "train"]) / 1000
    late = stopped_at - 1 - sent_at  # steps the run trained before the signal reached it
    late_s = late * step_s
    assert late_s < 0.25, f"the signal reached the run {late} steps ({late_s:.2f} s) late"
    assert f"base-seed3: stopped at iter {stopped_at}, its state saved" in out
    # the table names the iteration saved, where the same command goes on
    evaluated = "" if stopped_at % 50 == 0 else f", last evaluated at {stopped_at // 50 * 50}"
    assert (f"Not finished, left out of the means: base-seed3 (saved at iter {stopped_at:,} of "
            f"{BEYOND_REACH:,}{evaluated}).") in out
    if signum != signal.SIGTERM:
        return  # resuming is the same after every signal: once is enough
    status, out, _ = run_study([*argv, f"--max_iters={stopped_at + 7}"])
    assert status == 0 and f"[1/1] base-seed3: resuming from iter {stopped_at}" in out
    trains = [r["iter"] for r in report.read_log(str(run_dir))[0] if r["type"] == "train"]
    assert trains == list(range(1, stopped_at + 8))


def test_a_second_study_on_the_same_out_root_is_refused(two_configs, tmp_path):
    argv = base_study(two_configs, tmp_path, 4, "--max_iters=40", "--eval_interval=20")
    run_dir = tmp_path / "base-seed4"
    first = start(argv, launcher=(sys.executable, "study.py"))
    wait_for(lambda: "process" in open_or_empty(tmp_path / "study.lock"), first)
    # the first holds its lock until we let it go on, however fast its run
    os.kill(first.pid, signal.SIGSTOP)
    try:
        status, out, err = run_study(argv)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert status == 1 and out == ""
    assert err == (f"error: {tmp_path} is in use by study.py (process {first.pid} on "
                   f"{socket.gethostname()}): wait for it to end, or use another folder\n")
    out, err = first.communicate(timeout=120)  # the first finishes untouched
    assert first.returncode == 0, err
    assert "[1/1] base-seed4: done at iter 40" in out and "FAILED" not in out
    assert train_iters(run_dir) == list(range(1, 41))
    assert len(starts(run_dir)) == 1


def test_folders_without_a_usable_checkpoint(finished_study, two_configs, tmp_path):
    # seed 1: stopped before its first checkpoint (a log, no ckpt.pt): trained again from scratch;
    # seed 2: no checkpoint of train.py's: refused before launching; seed 3: a future_attn
    # checkpoint, which train.py refuses to resume as a baseline: that run fails, the study goes on
    for seed in (1, 2, 3):
        (tmp_path / f"base-seed{seed}").mkdir()
    (tmp_path / "base-seed1" / "log.jsonl").write_text('{"type": "start", "iter_num": 0, "ti')
    (tmp_path / "base-seed2" / "ckpt.pt").write_text("not a checkpoint")
    shutil.copy(os.path.join(finished_study["out_root"], "future-seed1", "ckpt.pt"),
                tmp_path / "base-seed3")
    status, out, err = run_study(base_study(two_configs, tmp_path, "1,2,3", "--max_iters=6"))
    assert status == 1 and "error: 2 runs failed: base-seed2, base-seed3" in err
    assert "[1/3] base-seed1: note:" in out and "holds a log but no checkpoint" in out
    assert "[1/3] base-seed1: done at iter 6" in out
    assert (f"[2/3] base-seed2: cannot resume: {tmp_path}/base-seed2/ckpt.pt is damaged, or not a "
            "checkpoint of this train.py") in out
    assert "[3/3] base-seed3: resuming from iter 4" in out
    assert "[3/3] base-seed3: FAILED with exit code 1; the study goes on." in out
    # its last lines
    assert "    error: cannot resume: the checkpoint holds another model (model_type 'future_attn')" in out
    assert [r["init_from"] for r in starts(tmp_path / "base-seed1")] == ["scratch"]
    with open(tmp_path / "study.md") as f:
        text = f.read()
    assert "| base | 1 of 3 |" in text
    assert ("Not finished, left out of the means: base-seed2 (not started), "
            "base-seed3 (not started).") in text


def test_a_checkpoint_with_flipped_bits_is_not_counted_as_finished(finished_study, two_configs,
                                                                   tmp_path):
    shutil.copytree(os.path.join(finished_study["out_root"], "base-seed1"), tmp_path / "base-seed1")
    flip_bits(tmp_path / "base-seed1" / "ckpt.pt")
    status, out, err = run_study(base_study(two_configs, tmp_path, 1))
    assert status == 1 and "failed: base-seed1" in err
    assert (f"[1/1] base-seed1: cannot resume: {tmp_path}/base-seed1/ckpt.pt is damaged, or not a "
            "checkpoint of this train.py: use a good copy, or train again\n") in out


def test_a_final_evaluation_not_made_is_made_on_resume(finished_study, two_configs, tmp_path):
    # a run stopped by a signal after its last step saves its state without evaluating there:
    # its checkpoint is at max_iters, its log lacks that evaluation. Resuming makes it.
    run_dir = tmp_path / "base-seed1"
    shutil.copytree(os.path.join(finished_study["out_root"], "base-seed1"), run_dir)
    lines = (run_dir / "log.jsonl").read_text().splitlines(keepends=True)
    lost = json.loads(lines[-1])
    assert lost["type"] == "eval" and lost["iter"] == 4
    (run_dir / "log.jsonl").write_text("".join(lines[:-1]))
    saved = load_checkpoint(str(run_dir / "ckpt.pt"), TRAINING_KEYS)
    torch.save(dict(saved, last_eval_iter=2), run_dir / "ckpt.pt")
    status, out, err = run_study(base_study(two_configs, tmp_path, 1))
    assert status == 0, out + err
    assert "[1/1] base-seed1: resuming from iter 4" in out
    evaluated = read_log(run_dir)[-1]
    assert evaluated["type"] == "eval" and evaluated["iter"] == 4
    assert evaluated["val_loss"] == lost["val_loss"]  # the same model, the same eval batches
    assert [r["type"] for r in read_log(run_dir)].count("train") == 4  # nothing trained again
    assert load_checkpoint(str(run_dir / "ckpt.pt"), TRAINING_KEYS)["last_eval_iter"] == 4
    with open(tmp_path / "study.md") as f:
        assert "| base | 1 of 1 |" in f.read()


def test_a_study_with_other_settings_lists_the_old_runs_apart(finished_study, two_configs,
                                                              tmp_path):
    # the same command with another learning rate over runs trained at 1e-3: the table must not
    # present them as this study's results
    for seed in (1, 2):
        shutil.copytree(os.path.join(finished_study["out_root"], f"base-seed{seed}"),
                        tmp_path / f"base-seed{seed}")
    argv = base_study(two_configs, tmp_path, "1,2")
    status, out, err = run_study(argv + ["--learning_rate=0.002"])
    assert status == 1  # nothing trained over them
    text = (tmp_path / "study.md").read_text()
    assert "| base | 0 of 2 |" in text and "--learning_rate=0.002" in text
    assert ("Trained with other settings than this study's, left out of the means: base-seed1 "
            "(trained with learning_rate 0.001 (this study: 0.002))") in text
    table = json.loads((tmp_path / "study.json").read_text())
    assert table["configs"][0]["val_loss"] is None and not table["configs"][0]["seeds_finished"]
    # --report_only reads the same folders with the same flags: the same verdict
    assert run_study(argv + ["--learning_rate=0.002", "--report_only"])[0] == 0
    assert "| base | 0 of 2 |" in (tmp_path / "study.md").read_text()
    assert run_study(argv + ["--report_only"])[0] == 0
    assert "| base | 2 of 2 |" in (tmp_path / "study.md").read_text()


def test_a_run_trained_otherwise_is_left_alone(finished_study, two_configs, tmp_path):
    shutil.copytree(os.path.join(finished_study["out_root"], "base-seed1"), tmp_path / "base-seed1")
    before = (tmp_path / "base-seed1" / "log.jsonl").read_text()
    status, out, err = run_study(base_study(two_configs, tmp_path, 1, "--learning_rate=0.002"))
    assert status == 1
    assert "holds a run trained with learning_rate 0.001 (this study: 0.002)" in out
    assert (tmp_path / "base-seed1" / "log.jsonl").read_text() == before


# --------------------------------------------------------------------------------------
# pieces: scheduling, launching, the numbers, the command line


class FakeProcess:
    """Ends (exit code 0, or 3 for a job named 'bad') after a number of polls."""

    def __init__(self, job, polls, log):
        self.job, self.polls, self.log = job, polls, log

    def poll(self):
        self.polls -= 1
        if self.polls > 0:
            return None
        self.log.append(("end", self.job))
        return 3 if self.job == "bad" else 0


def test_run_jobs_keeps_one_job_per_slot():
    log, done, busy, most = [], {}, {}, [0]

    def launch(job, slot):
        assert slot not in busy.values(), f"slot {slot} is taken"
        busy[job] = slot
        most[0] = max(most[0], len(busy))
        log.append(("start", job, slot))
        return FakeProcess(job, polls={"a": 5, "b": 1, "c": 2, "bad": 1, "e": 1}[job], log=log)

    def on_done(job, code):
        done[job] = code
        del busy[job]

    jobs = ["a", "b", "c", "bad", "e"]
    study.run_jobs(jobs, [0, 1], launch, on_done, on_tick=lambda: None, poll_s=0)
    assert done == {"a": 0, "b": 0, "c": 0, "bad": 3, "e": 0} and most[0] == 2
    starts_ = [entry[1:] for entry in log if entry[0] == "start"]
    assert [job for job, _ in starts_] == jobs  # in order
    assert starts_[:3] == [("a", 0), ("b", 1), ("c", 1)]  # c waits for b's slot, a keeps GPU 0
    study.run_jobs(jobs, [None], launch, on_done, on_tick=lambda: None, poll_s=0)
    assert most[0] == 2 and len(done) == 5  # one slot: one at a time (launch asserts it)


def test_run_jobs_stops_its_processes_when_interrupted():
    class Process:
        terminated = waited = False

        def poll(self):
            raise KeyboardInterrupt  # Ctrl-C while waiting

        def terminate(self):
            self.terminated = True

        def wait(self):
            self.waited = True

    processes = []
    with pytest.raises(KeyboardInterrupt):
        study.run_jobs(["a", "b"], [0, 1],
                       lambda job, slot: processes.append(Process()) or processes[-1],
                       on_done=None, on_tick=lambda: None)
    assert len(processes) == 2 and all(p.terminated and p.waited for p in processes)


def test_run_jobs_passes_a_signal_on_at_once():
    # a signal that comes while run_jobs waits between two looks at its processes reaches them
    # at once, not at the next look (here a minute away)
    class Process:
        signalled = None  # (signal, seconds after the signal was sent)

        def poll(self):
            return None if self.signalled is None else 128 + self.signalled[0]

        def send_signal(self, signum):
            self.signalled = (signum, time.monotonic() - sent[0])

    processes, codes, sent = [], {}, [None]

    def send():
        sent[0] = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)

    timer = threading.Timer(0.2, send)
    with study.StopRequest() as stop:
        timer.start()
        study.run_jobs(["a", "b"], [0, 1],
                       lambda job, slot: processes.append(Process()) or processes[-1],
                       on_done=codes.__setitem__, on_tick=lambda: None, stop=stop, poll_s=60)
    assert codes == {"a": 128 + signal.SIGUSR1, "b": 128 + signal.SIGUSR1}
    for process in processes:
        assert process.signalled[0] == signal.SIGUSR1 and process.signalled[1] < 5


def test_a_first_signal_is_a_request_a_second_stops_at_once(capsys):
    before = signal.getsignal(signal.SIGUSR1)
    with study.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.signum == signal.SIGUSR1
        assert capsys.readouterr().err == ("SIGUSR1: passed on to the running runs, which stop after their current "
                                           "step with their state saved; a second signal stops at once\n")
        with pytest.raises(Stopped) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
        assert stopped.value.signum == signal.SIGTERM and str(stopped.value) == "stopped at once by a second SIGTERM"
    assert signal.getsignal(signal.SIGUSR1) is before and capsys.readouterr().err == ""


def test_pick_gpus(monkeypatch):
    monkeypatch.setattr(study.torch.cuda, "device_count", lambda: 4)
    assert study.pick_gpus(None) == [0, 1, 2, 3]
    assert study.pick_gpus([2, 3]) == [2, 3]
    monkeypatch.setattr(study.torch.cuda, "device_count", lambda: 1)
    # one GPU or none: runs one after another, devices untouched
    assert study.pick_gpus(None) == [None]


def test_launch_command_and_gpu(two_configs, tmp_path, monkeypatch):
    calls = []

    class Popen:
        def __init__(self, command, env, **kwargs):
            calls.append((command, env))
            self.stdout = io.StringIO("iter 3: loss 5.1\neval at iter 4: train loss 5.0\n")

    monkeypatch.setattr(study.subprocess, "Popen", Popen)
    [run] = study.plan_runs([two_configs["base"]], [5], str(tmp_path), ["--max_iters=9"])
    run.state, run.iter = "resume", 2
    with contextlib.redirect_stdout(io.StringIO()):
        study.launch(run, 1, ["--max_iters=9"])
        run.reader.join()
    command, env = calls[0]
    assert command == [sys.executable, os.path.join(REPO, "train.py"), two_configs["base"],
                       "--max_iters=9",
                       f"--out_dir={tmp_path}/base-seed5", "--seed=5", "--init_from=resume"]
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and run.iter == 4 and run.max_iters == 9
    assert "eval at iter 4" in (tmp_path / "base-seed5" / "train.out").read_text()


def test_val_difference_paired_and_unpaired():
    def results(vals):
        return [dict(seed=seed, finished=val is not None, val_loss=val)
                for seed, val in vals.items()]

    reference = results({1: 3.0, 2: 3.2, 3: None})
    # seed 3: one side only
    paired = study.val_difference(results({1: 2.9, 2: 3.0, 3: 3.5}), reference, 0.05)
    assert paired["paired"] and paired["n"] == 2 and paired["seeds"] == [1, 2]
    assert paired["mean"] == pytest.approx(-0.15)
    assert paired["std"] == pytest.approx(np.std([-0.1, -0.2], ddof=1))
    assert paired["p_value"] == 0.5 and paired["verdict"] == "too few seeds (n = 2: p ≥ 0.5)"
    assert study.verdict_cells(paired) == ["too few seeds (n = 2: p ≥ 0.5)", "0.5 (n = 2)",
                                        str(paired["seeds_needed"])]
    unpaired = study.val_difference(results({3: 3.1, 4: 3.3}), reference, 0.05)
    assert not unpaired["paired"] and unpaired["mean"] == pytest.approx(3.2 - 3.1)
    spread = np.hypot(np.std([3.1, 3.3], ddof=1), np.std([3.0, 3.2], ddof=1))
    assert unpaired["std"] == pytest.approx(spread)
    assert "p_value" not in unpaired and study.verdict_cells(unpaired) == ["-", "-", "-"]  # no test
    assert study.format_stat(dict(mean=3.21, std=None)) == "3.2100"  # one seed: no ±
    assert study.val_difference(results({1: None}), reference, 0.05) is None


def test_flags_as_key_space_value():
    args = study.parse_args(["config/baseline.py", "--max_iters", "3", "config/future50_mse.py",
                             "--seeds", "1,2",
                             "--report_only", "--eval_iters", "2"])
    assert args.configs == ["config/baseline.py", "config/future50_mse.py"] and args.seeds == [1, 2]
    assert args.flags == ["--max_iters=3", "--eval_iters=2"] and args.report_only


@pytest.mark.parametrize("argv, message", [
    ([], "no config given"),
    (["config/no_such.py"], "config file config/no_such.py not found"),
    (["config/baseline.py", "--seeds=1,x"], "--seeds takes distinct comma-separated integers"),
    (["config/baseline.py", "--seeds=1,1"], "--seeds takes distinct comma-separated integers"),
    (["config/baseline.py", "--seeds="], "--seeds takes distinct comma-separated integers"),
    (["config/baseline.py", "--seed=3"], "study.py sets --seed for each run itself"),
    (["config/baseline.py", "--gpus=a"], "--gpus takes distinct comma-separated integers"),
    (["config/baseline.py", "--threshold=1.5"], "--threshold is a p-value between 0 and 1"),
    (["config/baseline.py", "--threshold=x"], "argument --threshold: invalid float value: 'x'"),
    (["config/baseline.py", "--max_itres=3"], "unknown key max_itres; did you mean max_iters?"),
    (["config/baseline.py", "baseline.py"], "two configs share a name"),
    # a flag that one config of the study refuses: that config is named
    (["config/baseline.py", "config/future50_mse.py", "--n_embd=150"],
     "config/future50_mse.py: n_embd must be divisible by n_head (9), got 150"),
    (["config/baseline.py", "config/future50_mse.py", "--future_dim=3"],
     "config/baseline.py: unknown key future_dim"),
])
def test_bad_input_is_one_line_and_status_2(argv, message, monkeypatch):
    monkeypatch.chdir(REPO)
    status, out, err = run_study(argv)
    assert status == 2 and message in err.splitlines()[0] and "Traceback" not in err and out == ""


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        study.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--seeds" in out and "--report_only" in out
    assert "--max_iters=300" in out and "--threshold" in out and "--plot" in out


def test_report_only_lists_unfinished_runs_and_the_writeup(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    status, out, _ = run_study(["config/baseline.py", "config/future50_mse.py", "--seeds=1",
                                f"--out_root={tmp_path}",
                                "--report_only", "--max_iters=300"])
    assert status == 0
    assert ("| baseline | 0 of 1 | - | - | - | - |  |  |  | - | 2.937 | 3.424 | (reference) | - "
            "| 16,036,800 |") in out
    assert ("| future50_mse | 0 of 1 | - | - | - | - | - | - | - | - | 3.017 | 3.419 | -0.005 "
            "| 0.07681 | 15,817,248 |") in out
    assert "note: no run finished: no picture" in out
    assert "This study trains unlike them: max_iters 300 (write-up 9000)." in out
    assert ("Not finished, left out of the means: baseline-seed1 (not started), "
            "future50_mse-seed1 (not started).") in out
    assert not (tmp_path / "baseline-seed1").exists()  # nothing trained


# --------------------------------------------------------------------------------------
# is a difference real? the permutation test, the seeds needed, the verdict


def reference_p_value(differences):
    """The two-sided p-value, slowly and exactly: every sign vector in turn, the differences as
    exact fractions (decimal strings stay exact), so that a tie is a tie."""
    d = [Fraction(x) for x in differences]
    observed = abs(sum(d))
    flips = list(itertools.product((1, -1), repeat=len(d)))
    at_least = sum(abs(sum(sign * x for sign, x in zip(signs, d))) >= observed for signs in flips)
    return Fraction(at_least, len(flips))


@pytest.mark.parametrize("differences", [
    # 0.1 + 0.2 = 0.3 and 0.05 + 0.15 = 0.2: sums that tie exactly, but not in floats
    ["0.1", "0.2", "0.3", "-0.6", "0.05", "0.15"],
    ["0", "0", "0.5", "-0.25", "0.25", "0"],  # zeros: flipping them changes nothing
    ["0", "0", "0", "0"],  # no difference at all: p = 1
    ["-0.004"] * 6,  # every seed agrees: the smallest p of 6 seeds, 2/64
    ["0.003"],  # one seed: p = 1
    ["0.01", "-0.01", "0.02", "-0.02", "0.03"],
    ["-0.011", "-0.007", "-0.004", "-0.009", "0.002", "-0.006", "-0.008"],
    [str(x) for x in np.random.default_rng(3).normal(0.002, 0.004, 12)],
])
def test_permutation_p_value_against_every_sign_flip(differences):
    p = study.permutation_p_value([float(x) for x in differences])
    assert p == pytest.approx(float(reference_p_value(differences)), abs=1e-12)
    # flipping every sign, or another unit, is the same study
    assert study.permutation_p_value([-1000 * float(x) for x in differences]) == p


def test_beyond_exact_seeds_the_flips_are_drawn(monkeypatch):
    d = np.random.default_rng(4).normal(0.3, 1.0, 22)
    drawn = study.permutation_p_value(d)
    assert study.permutation_p_value(d) == drawn  # the same numbers, the same p
    monkeypatch.setattr(study, "EXACT_UP_TO", 22)  # all 4 million sign vectors
    exact = study.permutation_p_value(d)
    assert 0.01 < exact < 0.5 and drawn == pytest.approx(exact, abs=0.002)


def test_smallest_p_value_and_the_verdict_in_words():
    assert [study.smallest_p_value(n) for n in (1, 3, 6)] == [1.0, 0.25, 0.03125]
    # the fewest seeds whose smallest p reaches the threshold, counted one by one
    for threshold in (0.5, 0.25, 0.1, 0.05, 0.01, 0.001):
        n = study.fewest_seeds(threshold)
        assert 2 / 2**n <= threshold < 2 / 2 ** (n - 1) or n == 1
    assert study.fewest_seeds(0.05) == 6
    assert study.verdict(-0.01, 0.03125, 6, 0.05) == "lower (p = 0.031)"
    assert study.verdict(0.01, 0.015625, 7, 0.05) == "higher (p = 0.016)"
    assert study.verdict(0.01, 0.40625, 7, 0.05) == "no evidence (p = 0.41)"
    assert study.verdict(-0.01, 0.05, 7, 0.05) == "lower (p = 0.05)"  # at the threshold: shown
    assert study.verdict(-0.01, 0.25, 3, 0.05) == "too few seeds (n = 3: p ≥ 0.25)"
    assert study.verdict(-0.01, 0.25, 3, 0.25) == "lower (p = 0.25)"  # another threshold


def power(n, mean, std, threshold):
    """The share of studies of n seeds in which the mean of n normal differences lies beyond
    the threshold's two-sided critical value, on the side of the true mean."""
    z = NormalDist().inv_cdf(1 - threshold / 2)
    return NormalDist().cdf(math.sqrt(n) * abs(mean) / std - z)


@pytest.mark.parametrize("mean, std, threshold", [
    (0.005, 0.005, 0.05), (-0.005, 0.01, 0.05), (0.046, 0.02, 0.05), (0.05, 0.001, 0.05),
    (0.002, 0.01, 0.01), (-0.003, 0.004, 0.2),
])
def test_seeds_needed_is_the_fewest_with_the_power(mean, std, threshold):
    fewest = next(n for n in range(1, 10_000) if power(n, mean, std, threshold) >= study.POWER)
    assert study.seeds_needed(mean, std, threshold) == max(fewest, study.fewest_seeds(threshold))


def test_seeds_needed_without_a_spread_or_a_difference():
    assert study.seeds_needed(0.005, 0.005, 0.05) == 8  # ((1.96 + 0.84) · 1)² = 7.8
    assert study.seeds_needed(0.005, None, 0.05) is None  # one seed: no spread
    assert study.seeds_needed(0.0, 0.01, 0.05) is None
    # identical differences: the fewest seeds the exact test can show them with
    assert study.seeds_needed(0.005, 0.0, 0.05) == 6


@pytest.fixture(scope="module")
def study_copy(finished_study, tmp_path_factory):
    """A copy of the finished study's folders, for --report_only runs that rewrite its table."""
    out_root = tmp_path_factory.mktemp("copy") / "study"
    shutil.copytree(finished_study["out_root"], out_root)
    argv = [*finished_study["argv"][:3], f"--out_root={out_root}", *finished_study["argv"][4:]]
    return dict(argv=argv, out_root=out_root)


def hand_differences(out_root):
    """future's val loss minus base's, seed by seed, read plainly from the logs."""
    return [hand_numbers(os.path.join(out_root, f"future-seed{s}"))[1]
            - hand_numbers(os.path.join(out_root, f"base-seed{s}"))[1] for s in (1, 2)]


def test_the_table_holds_the_test_of_a_real_study(study_copy):
    # 2 seeds give p ≥ 0.5: at a threshold of 0.5, the test can speak
    status, out, err = run_study([*study_copy["argv"], "--report_only", "--threshold=0.5"])
    assert status == 0, out + err
    table = json.loads((study_copy["out_root"] / "study.json").read_text())
    text = (study_copy["out_root"] / "study.md").read_text()
    d = hand_differences(study_copy["out_root"])
    diff = table["configs"][1]["val_difference"]
    assert table["threshold"] == 0.5 and diff["seeds"] == [1, 2]
    assert diff["differences"] == pytest.approx(d, abs=1e-12)
    p = float(reference_p_value([repr(x) for x in d]))
    assert diff["p_value"] == p and diff["smallest_p_value"] == 0.5
    direction = "lower" if np.mean(d) < 0 else "higher"
    words = f"{direction if p <= 0.5 else 'no evidence'} (p = {p:.2g})"
    assert diff["verdict"] == words
    fewest = next(n for n in range(1, 10**6) if power(n, np.mean(d), np.std(d, ddof=1), 0.5) >= 0.8)
    assert diff["seeds_needed"] == max(fewest, 2)
    assert f"| {words} | 0.5 (n = 2) | {diff['seeds_needed']} |" in text
    assert "verdict (p ≤ 0.5)" in text and "Seeds needed: an estimate" in text
    # at the default threshold, 2 seeds are too few whatever they say
    assert run_study([*study_copy["argv"], "--report_only"])[0] == 0
    text = (study_copy["out_root"] / "study.md").read_text()
    assert "| too few seeds (n = 2: p ≥ 0.5) | 0.5 (n = 2) |" in text


# --------------------------------------------------------------------------------------
# the picture


PNG = b"\x89PNG\r\n\x1a\n"
draws = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                           reason="needs matplotlib")


def png_size(path):
    """(width, height) in pixels, from the PNG's header."""
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == PNG
    return struct.unpack(">II", header[16:24])


@draws
def test_the_picture_draws_the_runs_numbers(finished_study):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection, PolyCollection
    out_root = finished_study["out_root"]
    table = json.loads(open(os.path.join(out_root, "study.json")).read())
    fig = study.study_figure(table, plt)
    try:
        ax_curves, ax_diffs = fig.axes
        for line, name in zip(ax_curves.get_lines(), ("base", "future")):
            val = [[r["val_loss"] for r in read_log(os.path.join(out_root, f"{name}-seed{s}"))
                    if r["type"] == "eval"] for s in (1, 2)]
            assert list(line.get_xdata()) == [0, 2, 4]
            assert line.get_ydata() == pytest.approx(np.mean(val, axis=0), abs=1e-12)
            # the band: from the min to the max over the seeds, at every iteration
            [band] = [c for c in ax_curves.collections
                      if isinstance(c, PolyCollection) and c.get_facecolor()[0][:3]
                      == pytest.approx(matplotlib.colors.to_rgb(line.get_color()))]
            corners = {(round(x), round(y, 9)) for x, y in band.get_paths()[0].vertices}
            for k, it in enumerate((0, 2, 4)):
                low, high = min(v[k] for v in val), max(v[k] for v in val)
                assert {(it, round(low, 9)), (it, round(high, 9))} <= corners
        verdict = table["configs"][1]["val_difference"]["verdict"]
        legend = [t.get_text() for t in ax_curves.get_legend().get_texts()]
        assert legend == ["base (reference)", f"future: {verdict}"]
        [dots] = [c for c in ax_diffs.collections if isinstance(c, PathCollection)]
        d = hand_differences(out_root)
        assert list(np.asarray(dots.get_offsets())[:, 0]) == pytest.approx(d, abs=1e-12)
        [mean_bar] = [c for c in ax_diffs.collections if not isinstance(c, PathCollection)]
        assert list(mean_bar.get_segments()[0][:, 0]) == pytest.approx([np.mean(d)] * 2, abs=1e-12)
        assert [t.get_text() for t in ax_diffs.get_yticklabels()] == [f"future\n{verdict}"]
    finally:
        plt.close(fig)


@draws
def test_the_picture_fits_a_screen(study_copy, tmp_path, monkeypatch):
    import matplotlib.text
    figure, smallest_text = study.study_figure, []

    def measured_figure(table, plt):
        fig = figure(table, plt)
        fig.canvas.draw()  # tick labels exist once drawn
        texts = [t for t in fig.findobj(matplotlib.text.Text)
                 if t.get_visible() and t.get_text().strip()]
        smallest_text.append(min(t.get_fontsize() for t in texts) * study.DPI / 72)  # points -> px
        return fig

    monkeypatch.setattr(study, "study_figure", measured_figure)
    path = tmp_path / "picture.png"
    status, out, err = run_study([*study_copy["argv"], "--report_only", f"--plot={path}"])
    assert status == 0 and f"wrote {path}\n" in out, out + err
    width, height = png_size(path)
    assert width <= 1600 and height <= 1000, (width, height)  # at 100% on a laptop's screen
    assert smallest_text[0] >= 10, smallest_text
    assert os.listdir(tmp_path) == ["picture.png"]  # no temporary file left


@draws
def test_a_study_draws_its_picture_at_the_end(finished_study):
    assert f"wrote {finished_study['out_root']}/study.png" in finished_study["out"]
    assert png_size(os.path.join(finished_study["out_root"], "study.png"))[0] > 0


def test_without_matplotlib_the_table_is_written_and_the_picture_named(study_copy, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    (study_copy["out_root"] / "study.md").unlink()
    status, out, err = run_study([*study_copy["argv"], "--report_only", f"--plot={tmp_path}/a.png"])
    assert status == 1 and err == ("error: --plot draws with matplotlib: pip install matplotlib "
                                   "(the table is written)\n")
    assert (study_copy["out_root"] / "study.md").exists() and os.listdir(tmp_path) == []
    status, out, err = run_study([*study_copy["argv"], "--report_only"])
    assert status == 0 and err == ""
    assert (f"note: no picture {study_copy['out_root']}/study.png: it needs matplotlib "
            "(pip install matplotlib)") in out
