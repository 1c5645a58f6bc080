"""
Tests of study.py: configs × seeds through train.py, on a CPU with tiny models on random tokens
(conftest.py): each run a train.py process of its own, progress from the logs, the table of means
over seeds and its test, study.json, a stop signal that reaches every run, a run that stops with
its killed study, resuming, run folders it must not train on, the lock, the command line, the
GPU of each run, and the picture.
Run: python -m pytest -q -p no:xdist tests/test_study.py
"""

import contextlib
import importlib.util
import io
import itertools
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
import torch

import configurator
import study
from conftest import REPO, TINY, flip_bits, read_log, start, trained_to, wait_for
from train import TRAINING_KEYS, load_checkpoint

BEYOND_REACH = 10**6  # the max_iters of a run a test stops: no machine trains that far meanwhile
RUN_NAMES = ["base-seed1", "future-seed1", "base-seed2", "future-seed2"]  # seed by seed


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


def run_study(argv):
    """(exit status, stdout, stderr) of study.main in this process (its runs are children)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = study.main(argv)
    return status, out.getvalue(), err.getvalue()


def base_study(two_configs, out_root, seeds, *flags):
    """study.py's arguments for a study of the base config alone."""
    return [two_configs["base"], f"--seeds={seeds}", f"--out_root={out_root}",
            f"--data_dir={two_configs['data']}", *flags]


def starts(out_dir):
    return [r for r in read_log(out_dir) if r["type"] == "start"]


def iters_of(out_dir, kind="train"):
    return [r["iter"] for r in read_log(out_dir) if r["type"] == kind]


@pytest.fixture(scope="module")
def finished_study(two_configs, tmp_path_factory):
    """2 configs × 2 seeds of 4 steps each, trained through study.py, a progress line at every
    look at the runs."""
    out_root = str(tmp_path_factory.mktemp("study"))
    argv = [two_configs["base"], two_configs["future"], "--seeds=1,2", f"--out_root={out_root}",
            f"--data_dir={two_configs['data']}"]
    processes, launch = [], study.launch  # the process of each run, as launched

    def launch_and_note(*args):
        processes.append(launch(*args))
        return processes[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(study, "PROGRESS_S", 0)
        mp.setattr(study, "launch", launch_and_note)
        status, out, err = run_study(argv)
    return dict(argv=argv, out_root=out_root, status=status, out=out, err=err,
                pids=[process.pid for process in processes])


# --------------------------------------------------------------------------------------
# a study trained whole, and what it says


def test_study_trains_every_config_and_seed_each_in_a_process(finished_study):
    assert finished_study["status"] == 0, finished_study["out"] + finished_study["err"]
    err, out_root = finished_study["err"], finished_study["out_root"]
    assert err.startswith("4 of 4 runs to train\n")
    said = [line for line in err.splitlines() if ": training" in line or ": done" in line]
    assert said == [line for name in RUN_NAMES
                    for line in (f"{name}: training", f"{name}: done at iter 4")]
    for name in RUN_NAMES:
        out_dir = os.path.join(out_root, name)
        assert [r["init_from"] for r in starts(out_dir)] == ["scratch"]
        assert starts(out_dir)[0]["config"]["seed"] == int(name[-1])
        assert iters_of(out_dir, "eval") == [0, 2, 4]
        assert load_checkpoint(os.path.join(out_dir, "ckpt.pt"))["iter_num"] == 4
        with open(os.path.join(out_dir, "train.out")) as f:
            assert "eval at iter 4:" in f.read()  # the run's own output
    pids = finished_study["pids"]  # a train.py each, whose lock went with it
    assert len(set(pids)) == 4 and os.getpid() not in pids
    base_losses = [read_log(os.path.join(out_root, f"base-seed{s}"))[-1]["val_loss"] for s in (1, 2)]
    assert base_losses[0] != base_losses[1]  # the seeds differ
    # a study that succeeded leaves its runs, its tables and its picture, and no lock
    expected = {*RUN_NAMES, "study.md", "study.json", "study.png"}
    assert set(os.listdir(out_root)) == (expected if importlib.util.find_spec("matplotlib")
                                         else expected - {"study.png"})


def test_progress_comes_from_each_runs_log(finished_study):
    progress = re.findall(r"^(\S+) at iter (\d+)$", finished_study["err"], re.MULTILINE)
    assert {name for name, _ in progress} == set(RUN_NAMES)
    for name, iteration in progress:
        records = read_log(os.path.join(finished_study["out_root"], name))
        logged = {r.get("iter", r.get("iter_num")) for r in records}
        assert int(iteration) in logged


def test_the_iteration_logged_is_the_last_records(tmp_path):
    run = study.Run("base", 1, [], dict(out_dir=str(tmp_path), seed=1))
    assert study.logged_iter(run) == 0  # no log yet
    # a launch killed mid-record at iter 7, resumed from the checkpoint of iter 5
    (tmp_path / "log.jsonl").write_text(
        '{"type": "start", "iter_num": 0}\n{"type": "train", "iter": 6}\n'
        '{"type": "eval", "iter": 6}\n{"type": "train", "it\n{"type": "start", "iter_num": 5}\n')
    assert study.logged_iter(run) == 5
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"type": "train", "iter": 6}\n{"type": "train", "it')  # one being written
    assert study.logged_iter(run) == 6


def test_a_second_study_trains_nothing(finished_study):
    status, out, err = run_study(finished_study["argv"])
    assert status == 0 and err == "0 of 4 runs to train\n"
    for name in RUN_NAMES:
        assert len(starts(os.path.join(finished_study["out_root"], name))) == 1


def study_table(argv):
    """study.py's numbers for a command line, as its table shows them."""
    settings, config_paths, flags = study.parse_command_line(argv)
    seeds = settings["seeds"].split(",")
    return study.tabulate(study.plan_runs(config_paths, seeds, settings["out_root"], flags), flags)


def hand_numbers(out_dir):
    """(train loss, val loss) of a run's last evaluation, read plainly from its log.jsonl."""
    last_eval = [r for r in read_log(out_dir) if r["type"] == "eval"][-1]
    return last_eval["train_loss"], last_eval["val_loss"]


def reference_p_value(differences):
    """The two-sided p-value, slowly and exactly: every sign vector in turn, the differences as
    exact fractions (decimal strings stay exact), so that a tie is a tie."""
    d = [Fraction(x) for x in differences]
    observed = abs(sum(d))
    flips = list(itertools.product((1, -1), repeat=len(d)))
    at_least = sum(abs(sum(sign * x for sign, x in zip(signs, d))) >= observed for signs in flips)
    return Fraction(at_least, len(flips))


def power(n, mean, std, threshold):
    """The share of studies of n seeds in which the mean of n normal differences lies beyond
    the threshold's two-sided critical value, on the side of the true mean."""
    z = NormalDist().inv_cdf(1 - threshold / 2)
    return NormalDist().cdf(math.sqrt(n) * abs(mean) / std - z)


def test_the_table_holds_mean_std_and_the_test(finished_study):
    out_root = finished_study["out_root"]
    text = open(os.path.join(out_root, "study.md")).read()
    assert text in finished_study["out"]  # printed as written
    table = study_table(finished_study["argv"])
    numbers = {name: [hand_numbers(os.path.join(out_root, f"{name}-seed{s}")) for s in (1, 2)]
               for name in ("base", "future")}
    assert [row["config"] for row in table["configs"]] == ["base", "future"]
    for row in table["configs"]:
        assert row["seeds_finished"] == 2
        for column, values in (("train_loss", [r[0] for r in numbers[row["config"]]]),
                               ("val_loss", [r[1] for r in numbers[row["config"]]])):
            mean, std = np.mean(values), np.std(values, ddof=1)
            assert row[column]["mean"] == pytest.approx(mean, abs=1e-12)
            assert row[column]["std"] == pytest.approx(std, abs=1e-12)
            assert f"{mean:.4f} ± {std:.4f}" in text
    # future's val loss minus base's, paired by seed
    d = [ours[1] - ref[1] for ours, ref in zip(numbers["future"], numbers["base"])]
    diff = table["configs"][1]["val_difference"]
    assert diff["differences"] == pytest.approx(d, abs=1e-12)
    assert diff["p_value"] == float(reference_p_value([repr(x) for x in d]))
    assert diff["verdict"] == "too few seeds (n = 2: p ≥ 0.5)"  # 2 seeds: p ≥ 0.5 whatever
    fewest = next(n for n in range(1, 10**6)
                  if power(n, np.mean(d), np.std(d, ddof=1), 0.05) >= study.POWER)
    assert diff["seeds_needed"] == max(fewest, 6)
    assert (f"| future | 2 of 2 | {format(np.mean([r[0] for r in numbers['future']]), '.4f')}"
            in text)
    assert (f"| {np.mean(d):+.4f} ± {np.std(d, ddof=1):.4f} | too few seeds (n = 2: p ≥ 0.5) | "
            f"{diff['seeds_needed']} |") in text
    assert "| base | 2 of 2 |" in text and "| (reference) |  |  |" in text


def table_cells(text):
    """The cells of each row of study.md's table, by config."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| config |"):  # a row, not the header
            cells = [cell.strip() for cell in line.split("|")[1:-1]]
            rows[cells[0]] = cells
    return rows


def plain_json(path):
    """A JSON file's values; NaN and Infinity, which plain JSON lacks, fail."""
    def refuse(constant):
        raise AssertionError(f"{path} holds {constant}")
    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def test_study_json_holds_the_numbers_of_study_md(finished_study, two_configs):
    out_root = finished_study["out_root"]
    numbers = plain_json(os.path.join(out_root, "study.json"))
    cells = table_cells(open(os.path.join(out_root, "study.md")).read())
    assert numbers["reference"] == "base" and numbers["seeds"] == [1, 2]
    assert numbers["flags"] == [f"--data_dir={two_configs['data']}"] and numbers["left_out"] == []
    for config in numbers["configs"]:
        row = cells[config["config"]]
        assert row[1] == f"{config['seeds_finished']} of 2"
        for column, key in ((2, "train_loss"), (3, "val_loss")):
            per_seed = [run[key] for run in config["runs"]]
            assert config[key]["mean"] == pytest.approx(np.mean(per_seed), abs=1e-12)
            assert config[key]["std"] == pytest.approx(np.std(per_seed, ddof=1), abs=1e-12)
            assert row[column] == f"{config[key]['mean']:.4f} ± {config[key]['std']:.4f}"
        for run in config["runs"]:  # each seed's numbers, from its log
            run_dir = os.path.join(out_root, run["name"])
            assert (run["train_loss"], run["val_loss"]) == hand_numbers(run_dir)
            evals = [r["val_loss"] for r in read_log(run_dir) if r["type"] == "eval"]
            assert run["best_val_loss"] == min(evals)
    base, future = numbers["configs"]
    assert base["val_difference"] is None and cells["base"][4:] == ["(reference)", "", ""]
    diff = future["val_difference"]
    d = [ours["val_loss"] - ref["val_loss"] for ours, ref in zip(future["runs"], base["runs"])]
    assert diff["seeds"] == [1, 2] and diff["differences"] == pytest.approx(d, abs=1e-12)
    assert diff["mean"] == pytest.approx(np.mean(d), abs=1e-12)
    assert diff["std"] == pytest.approx(np.std(d, ddof=1), abs=1e-12)
    assert diff["p_value"] == float(reference_p_value([repr(x) for x in diff["differences"]]))
    assert cells["future"][4:] == [f"{diff['mean']:+.4f} ± {diff['std']:.4f}", diff["verdict"],
                                   str(diff["seeds_needed"])]


def test_one_seed_gives_no_estimate_of_the_seeds_needed(finished_study, two_configs, tmp_path):
    for name in ("base-seed1", "future-seed1"):
        shutil.copytree(os.path.join(finished_study["out_root"], name), tmp_path / name)
    argv = [two_configs["base"], two_configs["future"], "--seeds=1", f"--out_root={tmp_path}",
            f"--data_dir={two_configs['data']}", "--report_only"]
    assert run_study(argv)[0] == 0
    text = (tmp_path / "study.md").read_text()
    assert table_cells(text)["future"][5:] == ["too few seeds (n = 1: p ≥ 1)", "-"]
    assert "None" not in text
    diff = plain_json(tmp_path / "study.json")["configs"][1]["val_difference"]
    assert diff["std"] is None and diff["seeds_needed"] is None  # null in the file


@pytest.mark.parametrize("differences", [
    # 0.1 + 0.2 = 0.3 and 0.05 + 0.15 = 0.2: sums that tie exactly, but not in floats
    ["0.1", "0.2", "0.3", "-0.6", "0.05", "0.15"],
    ["0", "0", "0.5", "-0.25", "0.25", "0"],  # zeros: flipping them changes nothing
    ["0", "0", "0", "0"],  # no difference at all: p = 1
    ["-0.004"] * 6,  # every seed agrees: the smallest p of 6 seeds, 2/64
    ["0.003"],  # one seed: p = 1
    ["-0.011", "-0.007", "-0.004", "-0.009", "0.002", "-0.006", "-0.008"],
    [str(x) for x in np.random.default_rng(3).normal(0.002, 0.004, 12)],
])
def test_permutation_p_value_against_every_sign_flip(differences):
    p = study.permutation_p_value([float(x) for x in differences])
    assert p == pytest.approx(float(reference_p_value(differences)), abs=1e-12)
    # flipping every sign, or another unit, is the same study
    assert study.permutation_p_value([-1000 * float(x) for x in differences]) == p


def test_the_verdict_in_words():
    # the smallest p of n seeds is 2/2^n: 6 seeds are the fewest that can reach 0.05
    assert study.verdict(-0.01, 0.03125, 6, 0.05) == "lower (p = 0.031)"
    assert study.verdict(0.01, 0.015625, 7, 0.05) == "higher (p = 0.016)"
    assert study.verdict(0.01, 0.40625, 7, 0.05) == "no evidence (p = 0.41)"
    assert study.verdict(-0.01, 0.05, 7, 0.05) == "lower (p = 0.05)"  # at the threshold: shown
    assert study.verdict(-0.01, 0.0625, 5, 0.05) == "too few seeds (n = 5: p ≥ 0.062)"
    assert study.verdict(-0.01, 0.25, 3, 0.25) == "lower (p = 0.25)"  # another threshold


@pytest.mark.parametrize("mean, std, threshold", [
    (0.005, 0.005, 0.05), (-0.005, 0.01, 0.05), (0.046, 0.02, 0.05), (0.05, 0.001, 0.05),
    (0.002, 0.01, 0.01), (-0.003, 0.004, 0.2),
])
def test_seeds_needed_is_the_fewest_with_the_power(mean, std, threshold):
    fewest = next(n for n in range(1, 10_000) if power(n, mean, std, threshold) >= study.POWER)
    can_reach = next(n for n in range(1, 100) if 2 / 2**n <= threshold)  # counted one by one
    assert study.seeds_needed(mean, std, threshold) == max(fewest, can_reach)


def test_seeds_needed_without_a_spread_or_a_difference():
    assert study.seeds_needed(0.005, 0.005, 0.05) == 8  # ((1.96 + 0.84) · 1)² = 7.8
    assert study.seeds_needed(0.005, None, 0.05) is None  # one seed: no spread
    assert study.seeds_needed(0.0, 0.01, 0.05) is None
    assert study.seeds_needed(0.005, 0.0, 0.05) == 6  # no spread: the fewest that can show it


# --------------------------------------------------------------------------------------
# stopping and resuming


def stop_when(condition, signum, done):
    """A thread that sends this process signum once condition() holds, unless done is set."""
    def wait_and_send():
        while not done.is_set():
            if condition():
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.02)
    threading.Thread(target=wait_and_send, daemon=True).start()


def test_a_signal_reaches_every_run_and_the_study_resumes(two_configs, tmp_path, monkeypatch):
    monkeypatch.setattr(study, "gpu_slots", lambda: ["0", "1"])  # two runs at once
    monkeypatch.setattr(study, "PROGRESS_S", 0)  # a progress line at every look at the runs
    argv = [two_configs["base"], two_configs["future"], "--seeds=9", f"--out_root={tmp_path}",
            f"--data_dir={two_configs['data']}", f"--max_iters={BEYOND_REACH}",
            "--eval_interval=50"]
    run_dirs = [tmp_path / "base-seed9", tmp_path / "future-seed9"]
    done = threading.Event()
    stop_when(lambda: all(trained_to(run_dir, 3)() for run_dir in run_dirs), signal.SIGTERM, done)
    try:
        status, out, err = run_study(argv)
    finally:
        done.set()
    assert status == 128 + signal.SIGTERM and "Traceback" not in err
    assert err.count("SIGTERM: passed on to the runs, which save their state and stop; a second "
                     "signal stops at once\n") == 1
    assert err.endswith("stopped by SIGTERM: every run that was training saved its state; the "
                        "same command resumes\n")
    stopped_at = []
    for run_dir in run_dirs:
        assert f"{run_dir.name}: stopped, its state saved\n" in err
        train_out = (run_dir / "train.out").read_text()
        assert train_out.count("SIGTERM: stopping after the step under way") == 1  # heard once
        saved = load_checkpoint(str(run_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
        assert iters_of(run_dir)[-1] == saved  # no step trained is lost
        # the table names the iteration saved, where the same command goes on
        assert f"{run_dir.name} (saved at iter {saved} of {BEYOND_REACH})" in out
        # the progress, read from the log, never ran ahead of what the run saved
        progress = [int(i) for i in re.findall(rf"{run_dir.name} at iter (\d+)", err)]
        assert progress and 0 < progress[-1] <= saved and set(progress) <= {0, *iters_of(run_dir)}
        stopped_at.append(saved)
    status, out, err = run_study([*argv, f"--max_iters={max(stopped_at) + 3}"])
    assert status == 0, err
    for run_dir, saved in zip(run_dirs, stopped_at):
        assert f"{run_dir.name}: resuming from iter {saved}" in err
        resumed = starts(run_dir)[-1]
        assert resumed["init_from"] == "resume" and resumed["iter_num"] == saved
        assert iters_of(run_dir)[-(max(stopped_at) + 3 - saved):] == list(
            range(saved + 1, max(stopped_at) + 4))


def test_a_signal_to_the_study_process_is_passed_on_at_once(two_configs, tmp_path):
    # a run far from its end, so that the signal lands mid-run however fast the machine; its
    # steps take milliseconds, so a signal passed on late shows as many steps trained after it
    argv = base_study(two_configs, tmp_path, 3, f"--max_iters={BEYOND_REACH}", "--eval_interval=50")
    run_dir = tmp_path / "base-seed3"
    process = start(argv, launcher=(sys.executable, "study.py"))
    wait_for(trained_to(run_dir, 20), process)
    child = int(re.search(r"process (\d+)", (run_dir / "train.lock").read_text()).group(1))
    sent_at = iters_of(run_dir)[-1]  # the last step logged when the signal goes
    process.send_signal(signal.SIGHUP)  # the terminal closed
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGHUP and "Traceback" not in out + err
    assert "SIGHUP: passed on to the runs" in err and "base-seed3: stopped, its state saved" in err
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # train.py ended with study.py
    stopped_at = load_checkpoint(str(run_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert iters_of(run_dir)[-1] == stopped_at
    step_s = np.median([r["ms_per_iter"] for r in read_log(run_dir) if r["type"] == "train"]) / 1000
    late = stopped_at - 1 - sent_at  # steps the run trained before the signal reached it
    assert late * step_s < 0.5, f"the signal reached the run {late} steps late"


def still_running(pid):
    """Whether a process runs: neither gone, nor a zombie that its new parent has not reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_run_saves_and_stops_when_its_study_is_killed(two_configs, tmp_path):
    argv = base_study(two_configs, tmp_path, 4, f"--max_iters={BEYOND_REACH}", "--eval_interval=50")
    run_dir = tmp_path / "base-seed4"
    process = start(argv, launcher=(sys.executable, "study.py"))
    wait_for(trained_to(run_dir, 3), process)
    child = int(re.search(r"process (\d+)", (run_dir / "train.lock").read_text()).group(1))
    try:
        process.kill()  # kill -9: study.py can pass nothing on
        process.communicate(timeout=60)
        deadline = time.time() + 10
        while still_running(child):
            assert time.time() < deadline, "the run trains on without its study"
            time.sleep(0.05)
    finally:
        if still_running(child):  # an orphan of a failed test: it must not train on
            os.kill(child, signal.SIGKILL)
    assert "SIGTERM: stopping after the step under way" in (run_dir / "train.out").read_text()
    saved = load_checkpoint(str(run_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert saved >= 3 and iters_of(run_dir)[-1] == saved  # saved at its last step
    status, out, err = run_study(base_study(two_configs, tmp_path, 4, f"--max_iters={saved + 2}",
                                            "--eval_interval=50"))
    assert status == 0 and f"base-seed4: resuming from iter {saved}\n" in err, err
    assert iters_of(run_dir)[-2:] == [saved + 1, saved + 2]


def test_a_second_signal_stops_at_once(capsys):
    before = signal.getsignal(signal.SIGUSR1)
    with study.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.signum == signal.SIGUSR1
        assert capsys.readouterr().err.startswith("SIGUSR1: passed on to the runs")
        with pytest.raises(configurator.Stopped) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
        assert str(stopped.value) == "stopped at once by a second SIGTERM"
    assert signal.getsignal(signal.SIGUSR1) is before


def test_a_final_evaluation_not_made_is_made_on_resume(finished_study, two_configs, tmp_path):
    # a run stopped by a signal after its last step saves its state without evaluating there:
    # its checkpoint is at max_iters, its log lacks that evaluation. Resuming makes it.
    run_dir = tmp_path / "base-seed1"
    shutil.copytree(os.path.join(finished_study["out_root"], "base-seed1"), run_dir)
    lines = (run_dir / "log.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "log.jsonl").write_text("".join(lines[:-1]))  # the evaluation at iter 4
    saved = load_checkpoint(str(run_dir / "ckpt.pt"), TRAINING_KEYS)
    torch.save(dict(saved, last_eval_iter=2), run_dir / "ckpt.pt")
    status, out, err = run_study(base_study(two_configs, tmp_path, 1))
    assert status == 0, err
    assert "base-seed1: resuming from iter 4" in err
    assert iters_of(run_dir, "eval")[-1] == 4 and len(iters_of(run_dir)) == 4  # none trained again
    assert "| base | 1 of 1 |" in out


# --------------------------------------------------------------------------------------
# run folders the study must not train on, and the lock


def test_a_run_trained_with_other_settings_is_refused(finished_study, two_configs, tmp_path):
    for seed in (1, 2):
        shutil.copytree(os.path.join(finished_study["out_root"], f"base-seed{seed}"),
                        tmp_path / f"base-seed{seed}")
    before = (tmp_path / "base-seed1" / "log.jsonl").read_text()
    argv = base_study(two_configs, tmp_path, "1,2")
    status, out, err = run_study([*argv, "--learning_rate=0.002"])
    assert status == 1 and err.endswith("error: 2 of 2 runs failed: base-seed1, base-seed2\n")
    refusal = (f"{tmp_path}/base-seed1 holds a run trained with learning_rate 0.001 (this study: "
               "0.002): use the same settings, or another --out_root")
    assert f"base-seed1: cannot train: {refusal}\n" in err
    assert (tmp_path / "base-seed1" / "log.jsonl").read_text() == before  # left alone
    assert "| base | 0 of 2 |" in out and f"Left out of the means: base-seed1 ({refusal})" in out
    # --report_only reads the same folders with the same flags: the same verdict
    assert run_study([*argv, "--learning_rate=0.002", "--report_only"])[0] == 0
    assert "| base | 0 of 2 |" in (tmp_path / "study.md").read_text()
    assert run_study([*argv, "--report_only"])[0] == 0
    assert "| base | 2 of 2 |" in (tmp_path / "study.md").read_text()


def test_the_same_data_named_relative_or_absolute_is_the_same(finished_study, two_configs, tmp_path,
                                                             monkeypatch):
    shutil.copytree(os.path.join(finished_study["out_root"], "base-seed1"), tmp_path / "base-seed1")
    data = two_configs["data"]  # the runs trained on its absolute path
    monkeypatch.chdir(os.path.dirname(data))  # now named relative, as is the out_root
    argv = [two_configs["base"], "--seeds=1", f"--out_root={os.path.relpath(tmp_path)}",
            f"--data_dir={os.path.basename(data)}"]
    status, out, err = run_study(argv)
    assert status == 0 and err == "0 of 1 runs to train\n"
    assert "| base | 1 of 1 |" in out and "Left out" not in out


def test_a_run_of_other_data_is_refused_and_kept(finished_study, two_configs, tmp_path):
    out_root, other = tmp_path / "study", tmp_path / "other"
    shutil.copytree(os.path.join(finished_study["out_root"], "base-seed1"), out_root / "base-seed1")
    shutil.copytree(two_configs["data"], other)  # the same tokens, but another folder
    status, out, err = run_study(base_study(two_configs, out_root, 1, f"--data_dir={other}"))
    assert status == 1
    trained_on, ours = os.path.realpath(two_configs["data"]), os.path.realpath(other)
    refusal = (f"{out_root}/base-seed1 holds a run trained with data_dir {trained_on!r} (this "
               f"study: {ours!r}): use the same settings, or another --out_root")
    assert f"base-seed1: cannot train: {refusal}\n" in err
    assert "delete" not in out + err  # the run is good: nothing invites its loss


def test_folders_without_a_usable_checkpoint(finished_study, two_configs, tmp_path):
    # seed 1: stopped before its first checkpoint, a log cut off mid-record: trained from scratch;
    # seed 2: a checkpoint with flipped bits: refused
    (tmp_path / "base-seed1").mkdir()
    (tmp_path / "base-seed1" / "log.jsonl").write_text('{"type": "start", "iter_num": 0, "ti')
    shutil.copytree(os.path.join(finished_study["out_root"], "base-seed2"), tmp_path / "base-seed2")
    flip_bits(tmp_path / "base-seed2" / "ckpt.pt")
    status, out, err = run_study(base_study(two_configs, tmp_path, "1,2"))
    assert status == 1 and err.endswith("error: 1 of 2 runs failed: base-seed2\n")
    assert (f"base-seed2: cannot train: {tmp_path}/base-seed2/ckpt.pt is damaged, or not a "
            "checkpoint of this train.py: use a good copy, or train again\n") in err
    assert "base-seed1: training\n" in err and "base-seed1: done at iter 4\n" in err
    lines = (tmp_path / "base-seed1" / "log.jsonl").read_text().splitlines()
    assert lines[0] == '{"type": "start", "iter_num": 0, "ti'  # train.py appends to it
    assert [json.loads(line)["init_from"] for line in lines[1:] if '"start"' in line] == ["scratch"]
    assert "| base | 1 of 2 |" in out and "Left out of the means: base-seed2 (" in out


def test_one_study_at_a_time_in_an_out_root(two_configs, tmp_path):
    argv = base_study(two_configs, tmp_path, 1)
    with configurator.lock_folder(str(tmp_path), "study.lock", "study.py"):
        status, out, err = run_study(argv)
        assert status == 1 and out == ""
        assert err == (f"error: {tmp_path} is in use by study.py (process {os.getpid()} on "
                       f"{socket.gethostname()}): wait for it to end, or use another folder\n")
        assert run_study([*argv, "--report_only"])[0] == 0  # reading takes no lock
    assert not (tmp_path / "base-seed1").exists()  # nothing trained


# --------------------------------------------------------------------------------------
# the command line, and the GPU of each run


@pytest.mark.parametrize("argv, message", [
    ([], "give config files of distinct names"),
    (["config/baseline.py", "other/baseline.py"], "give config files of distinct names"),
    (["config/no_such.py"], "config file config/no_such.py not found"),
    (["config/baseline.py", "--seeds=1,1"], "--seeds takes up to 20 distinct seeds, got 1,1"),
    (["config/baseline.py", f"--seeds={','.join(map(str, range(21)))}"], "up to 20 distinct"),
    (["config/baseline.py", "--seeds=x"], "config/baseline.py: --seed=x: expected an integer"),
    (["config/baseline.py", "--seed=3"], "study.py sets --seed for each run itself"),
    (["config/baseline.py", "--max_itres=3"], "unknown key max_itres; did you mean max_iters?"),
    (["config/baseline.py", "--out_rot=x"], "unknown key out_rot; did you mean out_root?"),
    (["config/baseline.py", "--report_only=maybe"], "--report_only=maybe: expected True or False"),
    # a flag that one config of the study refuses: that config is named
    (["config/baseline.py", "config/future50_mse.py", "--n_embd=150"],
     "config/future50_mse.py: n_embd must be divisible by n_head (9), got 150"),
    (["config/baseline.py", "config/future50_mse.py", "--future_dim=3"],
     "config/baseline.py: future_dim is a key of model_type future_attn, not of baseline"),
])
def test_bad_input_is_one_line_and_status_2(argv, message, monkeypatch):
    monkeypatch.chdir(REPO)
    status, out, err = run_study(argv)
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("line, flag", [
    ("seeds = '1,2'", "--seeds=1,2"),
    ("out_root = 'elsewhere'", "--out_root=elsewhere"),
    ("report_only = True", "--report_only=True"),
])
def test_a_config_file_may_not_set_the_studys_keys(line, flag, tmp_path):
    config = tmp_path / "mine.py"
    config.write_text(f"model_type = 'baseline'\n{line}\n")
    key = flag.removeprefix("--").split("=")[0]
    status, out, err = run_study([str(config), f"--out_root={tmp_path / 'study'}", "--report_only"])
    assert status == 2 and out == ""
    assert err == f"error: {config} sets {key}, which is study.py's: pass it as a flag, {flag}\n"
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("argv", [
    ["a.py", "--max_iters", "3", "b.py", "--seeds", "1,2", "--report_only", "--eval_iters", "2"],
    ["a.py", "--max_iters=3", "b.py", "--report_only=True", "--seeds=1,2", "--eval_iters=2"],
    ["--report_only", "True", "a.py", "b.py", "--max_iters", "3", "--seeds=1,2", "--eval_iters=2"],
])
def test_the_flags_the_study_keeps_and_those_it_passes_on(argv):
    settings, config_paths, flags = study.parse_command_line(argv)
    assert config_paths == ["a.py", "b.py"] and flags == ["--max_iters=3", "--eval_iters=2"]
    assert settings == dict(study.STUDY_DEFAULTS, seeds="1,2", report_only=True)


def test_help_lists_the_keys(capsys):
    assert study.main(["--seeds=5,6", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(study.__doc__.strip())
    assert "--seeds='5,6'" in out and "--out_root='study'" in out and "--report_only=False" in out


def test_report_only_trains_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out_root = tmp_path / "new"
    status, out, err = run_study(["config/baseline.py", "config/future50_mse.py", "--seeds=1",
                                  f"--out_root={out_root}", "--report_only", "--max_iters=300"])
    assert status == 0 and err == ""
    assert "| baseline | 0 of 1 | - | - | (reference) |  |  |" in out
    assert "| future50_mse | 0 of 1 | - | - | - | - | - |" in out
    assert ("Left out of the means: baseline-seed1 (no checkpoint of 300), future50_mse-seed1 "
            "(no checkpoint of 300).") in out
    assert sorted(os.listdir(out_root)) == ["study.json", "study.md"]  # no run, lock or picture


def test_each_run_gets_one_of_the_studys_gpus(two_configs, tmp_path, monkeypatch):
    monkeypatch.setattr(study.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the study's GPUs: physical 2 and 3
    assert study.gpu_slots() == ["2", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert study.gpu_slots() == ["0", "1"]
    monkeypatch.setattr(study.torch.cuda, "device_count", lambda: 1)
    assert study.gpu_slots() == [None]  # one GPU or none: a run at a time, devices untouched
    # launch hands the slot's GPU to the run
    monkeypatch.setattr(study.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    calls = []
    monkeypatch.setattr(study.subprocess, "Popen", lambda command, env, **_: calls.append(
        (command, env)))
    [run] = study.plan_runs([two_configs["base"]], [5], str(tmp_path), [])
    with contextlib.redirect_stderr(io.StringIO()):
        study.launch(run, 7, study.gpu_slots()[1])
    command, env = calls[0]
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert command[1:] == [os.path.join(REPO, "train.py"), two_configs["base"],
                           f"--out_dir={tmp_path}/base-seed5", "--seed=5", "--init_from=resume"]


# --------------------------------------------------------------------------------------
# the picture


draws = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                           reason="needs matplotlib")


@draws
def test_the_picture_draws_the_runs_numbers(finished_study):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    out_root = finished_study["out_root"]
    table = study_table(finished_study["argv"])
    fig = study.study_figure(table, plt)
    try:
        [ax] = fig.axes
        for line, name in zip(ax.get_lines(), ("base", "future")):
            val = [[r["val_loss"] for r in read_log(os.path.join(out_root, f"{name}-seed{s}"))
                    if r["type"] == "eval"] for s in (1, 2)]
            val = np.array(val)[:, 1:]  # iterations 2 and 4: from a fifth of training on
            assert list(line.get_xdata()) == [2, 4]
            assert line.get_ydata() == pytest.approx(val.mean(axis=0), abs=1e-12)
            # the band: from the min to the max over the seeds, at every iteration
            [band] = [c for c in ax.collections if isinstance(c, PolyCollection)
                      and c.get_facecolor()[0][:3]
                      == pytest.approx(matplotlib.colors.to_rgb(line.get_color()))]
            corners = {(round(x), round(y, 9)) for x, y in band.get_paths()[0].vertices}
            for k, it in enumerate((2, 4)):
                assert {(it, round(val[:, k].min(), 9)), (it, round(val[:, k].max(), 9))} <= corners
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["base (reference)", "future: too few seeds (n = 2: p ≥ 0.5)"]
    finally:
        plt.close(fig)
    with open(os.path.join(out_root, "study.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"  # the study drew it at its end


def test_without_matplotlib_the_table_is_written_and_the_picture_named(finished_study, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    out_root = tmp_path / "copy"
    shutil.copytree(finished_study["out_root"], out_root)
    (out_root / "study.png").unlink(missing_ok=True)
    argv = [*finished_study["argv"][:3], f"--out_root={out_root}", *finished_study["argv"][4:]]
    status, out, err = run_study([*argv, "--report_only"])
    assert status == 0 and err == ""
    assert f"note: no picture {out_root}/study.png: it needs matplotlib (pip install matplotlib)" in out
    assert not (out_root / "study.png").exists() and (out_root / "study.md").exists()
