"""
Trains several configs over several seeds, then tabulates each config's losses as the mean
± standard deviation over its seeds, and its val loss difference to the first config: whether
that difference is real (an exact paired permutation test over the seeds, in words), and how
many seeds a difference of its size needs. It draws the study too (needs matplotlib).

    python study.py config/baseline.py config/future50_mse.py --out_root=study
    python study.py config/baseline.py config/future50_mse.py --out_root=quick --max_iters=300
    python study.py config/baseline.py config/future50_mse.py --out_root=study --report_only
    python study.py config/baseline.py config/future50_mse.py --report_only --plot=mine.png

Each run is `python train.py CONFIG [--key=value ...] --out_dir=OUT_ROOT/<config>-seed<S>
--seed=S` in a process of its own (any other --key=value goes to every run). Stopping the
study, or one run, loses at most the steps since that run's last checkpoint: the same
command again skips the runs that finished and resumes the others. With several GPUs, one
run per GPU at a time. The table is printed and written to OUT_ROOT/study.md and study.json,
the picture to OUT_ROOT/study.png. Six seeds, the default, are the fewest whose test can show a
difference at p ≤ 0.05.
"""

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import torch

import configurator
import report
import train
from configurator import ConfigError, Stopped, UserError
from train import TRAINING_KEYS, load_checkpoint

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
STUDY_KEYS = ("out_dir", "seed", "init_from", "overwrite")  # set by the study, run by run
# a finished or resumed run must have been trained with the settings the study asks for
SAME_RUN_KEYS = ("model_type", "data_dir", "seed",
                 *(k for k in report.BUDGET_KEYS if k != "max_iters"))
ITER_LINE = re.compile(r"^(eval at )?iter (\d+):")  # train.py's train and eval lines
TAIL_LINES = 12  # lines of a failed run's output to show


@dataclasses.dataclass
class Run:
    index: int  # 1-based position in the study and the number of runs, for "[k/n]"
    total: int
    config_name: str  # the config file's name without .py
    config_path: str
    seed: int
    config: dict  # train.get_config of the run's command line
    # 'new', 'restart', 'resume', 'finished' or 'failed', then 'done', 'stopped' or 'failed'
    state: str = "new"
    iter: int = 0  # iterations done as far as we know: from the log, then from train.py's output
    tail: collections.deque = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: threading.Thread = None  # copies its output (follow)
    started: float = 0.0  # time.time() at its launch

    @property
    def name(self):
        return f"{self.config_name}-seed{self.seed}"

    @property
    def out_dir(self):
        return self.config["out_dir"]

    @property
    def max_iters(self):
        return self.config["max_iters"]


say_lock = threading.Lock()  # the runs' reader threads print too


def say(text):
    """Prints a line, which a closed terminal (after a SIGHUP) does not turn into an error that
    would stop the study before its runs have saved."""
    with say_lock, contextlib.suppress(OSError):
        print(text, flush=True)


def hms(seconds):
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


# --------------------------------------------------------------------------------------
# the command line


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and status 2, like train.py's ConfigError
        raise ConfigError(f"{message} (python study.py --help)")


def parse_args(argv):
    parser = Parser(
        description="Train configs × seeds with train.py; tabulate mean ± std over the seeds.",
        epilog="Any other --key=value goes to train.py for every run, "
               "e.g. --max_iters=300 --data_dir=data/wikipedia.",
        allow_abbrev=False,
    )
    parser.add_argument("configs", nargs="*", metavar="CONFIG",
                        help="config files such as config/baseline.py; the first is the "
                             "reference of the val loss differences")
    parser.add_argument("--seeds", default="1337,1338,1339,1340,1341,1342",
                        help="comma-separated seeds, one run per config and seed "
                             "(default %(default)s)")
    parser.add_argument("--out_root", default="study",
                        help="runs go to OUT_ROOT/<config>-seed<S>, the table to "
                             "OUT_ROOT/study.md, study.json")
    parser.add_argument("--gpus", help="comma-separated GPU ids, one run on each at a time "
                                       "(default: all GPUs when there are several)")
    parser.add_argument("--report_only", action="store_true",
                        help="train nothing, only tabulate (and draw) what the runs hold")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="a difference is shown when its p-value is at most this "
                             "(default %(default)s)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="the picture's path (default OUT_ROOT/study.png, drawn when "
                             "matplotlib is installed)")
    parser.add_argument("--progress_s", type=float, default=60.0,
                        help="seconds between progress lines (default %(default)s)")
    # train.py's flags may be written `--key value` too: joined into `--key=value`, they pass
    # through whole
    args, rest = parser.parse_known_args(configurator.normalize(argv))
    # argparse leaves config paths that follow a --key=value among the unknown arguments
    args.configs += [arg for arg in rest if not arg.startswith("--")]
    args.flags = [arg for arg in rest if arg.startswith("--")]
    if not args.configs:
        raise ConfigError("no config given: python study.py config/baseline.py "
                          "config/future50_mse.py ... (python study.py --help)")
    args.seeds = parse_ids("--seeds", args.seeds, "1337,1338,1339")
    if not 0 < args.threshold < 1:
        raise ConfigError(f"--threshold is a p-value between 0 and 1 such as 0.05, "
                          f"got {args.threshold:g}")
    args.gpus = parse_ids("--gpus", args.gpus, "0,1") if args.gpus is not None else None
    return args


def parse_ids(option, text, example):
    """Distinct non-negative integers from 'a,b,c'."""
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        ids = []
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise ConfigError(f"{option} takes distinct comma-separated integers such as {example}, "
                          f"got {text!r}")
    return ids


def plan_runs(configs, seeds, out_root, flags):
    """One Run per seed and config, seed by seed: after the first seed, every config has a
    result."""
    for key in STUDY_KEYS:
        if any(flag.startswith(f"--{key}=") for flag in flags):
            raise ConfigError(f"study.py sets --{key} for each run itself "
                              "(seeds: --seeds, folders: --out_root)")
    names = [os.path.basename(path).removesuffix(".py") for path in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"two configs share a name ({', '.join(names)}): "
                          "their runs would share folders")
    runs = []
    for seed in seeds:
        for name, path in zip(names, configs):
            out_dir = os.path.join(out_root, f"{name}-seed{seed}")
            try:  # the flags go to every config: say which one refuses them
                config = train.get_config(
                    [path, *flags, f"--out_dir={out_dir}", f"--seed={seed}"])
            except ConfigError as e:
                raise ConfigError(str(e) if path in str(e) else f"{path}: {e}") from None
            runs.append(Run(len(runs) + 1, len(seeds) * len(configs), name, path, seed, config))
    return runs


# --------------------------------------------------------------------------------------
# what each run folder holds


def read_run(run):
    """(last start record or None, records) of the run's log; nothing yet: (None, [])."""
    try:
        records, _ = report.read_log(run.out_dir)
    except report.ReportError:
        return None, []
    return report.final_numbers(records)[0], records


def settings_differ(start, config):
    """The settings of the study's config that the run in the folder was not trained with."""
    def same(key, a, b):
        return os.path.realpath(a) == os.path.realpath(b) if key == "data_dir" else a == b
    differ = [f"{key} {start['config'].get(key)!r} (this study: {config[key]!r})"
              for key in SAME_RUN_KEYS if not same(key, start["config"].get(key), config[key])]
    saved = train.saved_model_args(start["model_type"], start.get("model_args", {}))
    if saved != json.loads(json.dumps(train.model_args_of(config))):
        differ.append("the model settings")
    return differ


def saved_iteration(path):
    """A checkpoint's iteration, without loading its tensors."""
    return load_checkpoint(path, TRAINING_KEYS, mmap=True)["iter_num"]


def find_state(run):
    """Sets run.state and run.iter from the folder: a run is finished when its checkpoint is at
    max_iters and its log holds the evaluation there (train.py logs an evaluation, then saves);
    one with a checkpoint before that resumes (train.py makes an evaluation it missed)."""
    start, records = read_run(run)
    ckpt_path = os.path.join(run.out_dir, "ckpt.pt")
    if not os.path.isfile(ckpt_path):
        # stopped before its first checkpoint: nothing to resume from
        run.state = "restart" if os.path.exists(os.path.join(run.out_dir, "log.jsonl")) else "new"
        return
    differ = settings_differ(start, run.config) if start else []
    if differ:
        run.state = "failed"
        say(f"[{run.index}/{run.total}] {run.name}: {run.out_dir} holds a run trained with "
            f"{', '.join(differ)}: choose another --out_root, or delete that folder to train the "
            f"run again")
        return
    try:
        run.iter = saved_iteration(ckpt_path)
    except UserError as e:
        run.state = "failed"
        say(f"[{run.index}/{run.total}] {run.name}: cannot resume: {e}")
        return
    evals = [r["iter"] for r in records if r["type"] == "eval"]
    run.state = "finished" if run.iter >= run.max_iters and run.max_iters in evals else "resume"


# --------------------------------------------------------------------------------------
# running train.py


def pick_gpus(gpus):
    """The slots runs go to: GPU ids, or [None] (one run at a time, devices left as they are)."""
    if gpus:
        return gpus
    count = torch.cuda.device_count()
    return list(range(count)) if count > 1 else [None]


class StopRequest:
    """Within it, the first stop signal sets .signum: no run starts from then on, and run_jobs
    passes the signal on to the running runs, which save their state and stop. A second signal
    stops the study at once, and run_jobs stops the runs as it leaves."""

    def __enter__(self):
        self.signum = None
        self.previous = {signum: signal.signal(signum, self.heard)
                         for signum in configurator.STOP_SIGNALS}
        return self

    def heard(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum is not None:
            raise Stopped(signum, f"stopped at once by a second {name}")
        self.signum = signum
        configurator.say(f"{name}: passed on to the running runs, which stop after their current "
                         "step with their state saved; a second signal stops at once")

    def __exit__(self, *exception):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def run_jobs(jobs, slots, launch, on_done, on_tick, stop=None, poll_s=0.1):
    """Starts each job, in order, on a free slot (one job per slot at a time) with
    launch(job, slot) -> a process (subprocess.Popen or alike); calls on_done(job, exit code)
    as each ends (within poll_s) and on_tick() in between. Once stop.signum is set
    (StopRequest), starts nothing more, passes the signal on to the running processes at
    once and waits for them to end. Leaving early (an exception) stops the running processes."""
    pending, free, running = list(jobs), list(slots), []
    with sleep_that_a_signal_ends() as sleep:
        try:
            while pending or running:
                if stop and stop.signum and pending is not None:
                    pending = None  # nothing more starts
                    for _, _, process in running:
                        process.send_signal(stop.signum)  # once: each run saves its state and stops
                while pending and free:
                    job, slot = pending.pop(0), free.pop(0)
                    running.append((job, slot, launch(job, slot)))
                for entry in list(running):
                    job, slot, process = entry
                    code = process.poll()
                    if code is not None:
                        running.remove(entry)
                        free.append(slot)
                        on_done(job, code)
                on_tick()
                if running:
                    sleep(poll_s)
        finally:
            for _, _, process in running:  # interrupted: each run keeps its last checkpoint
                process.terminate()
                process.wait()


@contextlib.contextmanager
def sleep_that_a_signal_ends():
    """A sleep(seconds) that a signal cuts short, so that a stop request is passed on at once.
    time.sleep goes on sleeping after the signal's handler has run (PEP 475); here the signal
    also writes a byte to a pipe (signal.set_wakeup_fd), and select wakes up on it."""
    # signals reach the main thread alone
    if threading.current_thread() is not threading.main_thread():
        yield time.sleep
        return
    read_fd, write_fd = os.pipe()
    # set_wakeup_fd's condition: a signal never waits on a full pipe
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def sleep(seconds):
        if select.select([read_fd], [], [], seconds)[0]:
            os.read(read_fd, 512)  # empty it for the next sleep

    try:
        yield sleep
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)


def follow(process, run):
    """Copies train.py's output to OUT_DIR/train.out and takes its iteration from it."""
    with open(os.path.join(run.out_dir, "train.out"), "a") as out:
        for line in process.stdout:
            out.write(line)
            out.flush()
            run.tail.append(line.rstrip("\n"))
            match = ITER_LINE.match(line)
            if match:
                run.iter = int(match.group(2))
                if match.group(1):  # eval lines are few: show them
                    say(f"  {run.name}: {line.rstrip()}")


def launch(run, gpu, flags):
    command = [sys.executable, TRAIN, run.config_path, *flags, f"--out_dir={run.out_dir}",
               f"--seed={run.seed}"]
    where = "" if gpu is None else f" on GPU {gpu}"
    if run.state == "resume":
        command.append("--init_from=resume")
        say(f"[{run.index}/{run.total}] {run.name}: resuming from iter {run.iter:,}{where}")
    elif run.state == "restart":
        command.append("--overwrite=True")
        say(f"[{run.index}/{run.total}] {run.name}: note: {run.out_dir} holds a log but no "
            f"checkpoint (stopped before its first one): training from scratch{where}")
    else:
        say(f"[{run.index}/{run.total}] {run.name}: training{where}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # lines as they come, for the progress
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    os.makedirs(run.out_dir, exist_ok=True)
    with open(os.path.join(run.out_dir, "train.out"), "a") as out:
        out.write(f"$ {' '.join(command)}\n")
    # a pipe, not a file: if the study dies, the run's next print fails and the run stops. A
    # session of its own: a Ctrl-C in the terminal reaches study.py alone, which passes it on
    # once (a second one would stop the run at once, without saving)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True)
    run.reader = threading.Thread(target=follow, args=(process, run), daemon=True)
    run.reader.start()
    return process


class Progress:
    """A line every interval_s: runs finished, each running run's iteration, time left
    from the iterations done so far in this study and the iterations still to do."""

    def __init__(self, runs, interval_s):
        self.runs, self.interval_s = runs, interval_s
        self.t0 = self.last = time.time()
        self.iters_at_start = sum(run.iter for run in runs)

    def tick(self, running=()):
        now = time.time()
        if now - self.last < self.interval_s:
            return
        self.last = now
        live = [run for run in self.runs if run.state != "failed"]
        done = sum(run.state in ("finished", "done") for run in self.runs)
        gained = sum(run.iter for run in self.runs) - self.iters_at_start
        left = sum(max(run.max_iters - run.iter, 0) for run in live)
        if gained > 0:
            eta = f"about {hms(left * (now - self.t0) / gained)} left"
        else:
            eta = "time left: after the first steps"
        at = [f"{run.name} iter {run.iter:,}/{run.max_iters:,}" for run in running]
        say("; ".join([f"[{hms(now - self.t0)}] {done}/{len(self.runs)} runs finished", *at, eta]))


def train_runs(runs, slots, flags, progress_s, stop=None):
    """Trains the runs that are not finished; returns the runs that failed. A signal (stop, a
    StopRequest) is passed on to the running runs, which save their state and stop."""
    todo = [run for run in runs if run.state in ("new", "restart", "resume")]
    finished = [run.name for run in runs if run.state == "finished"]
    if finished:
        say(f"finished before: {', '.join(finished)}")
    for data_dir in sorted({run.config["data_dir"] for run in todo}):
        config = next(run.config for run in todo if run.config["data_dir"] == data_dir)
        train.check_data(data_dir, config["block_size"], config["vocab_size"])
    if todo:
        say(f"{len(todo)} of {len(runs)} runs to train, {len(slots)} at a time")
    else:
        say("nothing to train")
    progress = Progress(runs, progress_s)
    running = {}

    def start(run, slot):
        running[run.name] = run
        run.started = time.time()
        return launch(run, slot, flags)

    def done(run, code):
        del running[run.name]
        run.reader.join()  # its last lines
        if code == 0:
            run.state = "done"
            say(f"[{run.index}/{run.total}] {run.name}: done at iter {run.iter:,} "
                f"in {hms(time.time() - run.started)}")
            return
        if stop and stop.signum and code == 128 + stop.signum:
            run.state = "stopped"
            try:  # the checkpoint's iteration: the progress followed may lag behind it
                run.iter = saved_iteration(os.path.join(run.out_dir, "ckpt.pt"))
            except UserError:
                say(f"[{run.index}/{run.total}] {run.name}: stopped before its first "
                    f"checkpoint: {run.tail[-1]}")
                return
            say(f"[{run.index}/{run.total}] {run.name}: stopped at iter {run.iter:,}, "
                f"its state saved: {run.tail[-1]}")
            return
        run.state = "failed"
        lines = "\n".join(f"    {line}" for line in run.tail)
        say(f"[{run.index}/{run.total}] {run.name}: FAILED with exit code {code}; the study "
            f"goes on. Last lines of {os.path.join(run.out_dir, 'train.out')}:\n{lines}")

    run_jobs(todo, slots, start, done, lambda: progress.tick(running.values()), stop)
    return [run for run in runs if run.state == "failed"]


# --------------------------------------------------------------------------------------
# is a difference real? the exact paired permutation test


EXACT_UP_TO = 20  # seeds: 2^20 sign vectors, a million sums of 8 bytes, is a fraction of a second
RANDOM_FLIPS = 2**20  # sign vectors drawn at random beyond EXACT_UP_TO seeds
POWER = 0.8  # the share of studies in which the estimate of the seeds needed finds the difference


def permutation_p_value(differences):
    """The two-sided p-value of the exact paired permutation test of the mean of the per-seed
    differences d: if the config made no difference, each d was as likely to come out with the
    other sign, so every one of the 2^n ways to flip the signs gives an equally likely study.
    p is the share of them whose |mean| is at least the observed |mean|. With more than
    EXACT_UP_TO seeds, RANDOM_FLIPS sign vectors drawn at random (with a fixed generator, so the
    same numbers give the same p) stand in for all of them."""
    d = np.asarray(differences, dtype=np.float64)
    n = len(d)
    exact = n <= EXACT_UP_TO
    vectors = np.arange(2**n) if exact else None
    rng = np.random.default_rng(0)
    sums = np.zeros(2**n if exact else RANDOM_FLIPS)  # the sum ranks as the mean does, n fixed
    for i, d_i in enumerate(d):
        if exact:  # sign vector k flips d_i when bit i of k is set: every vector exactly once
            flipped = ((vectors >> i) & 1).astype(bool)
        else:
            flipped = rng.random(RANDOM_FLIPS) < 0.5
        sums += np.where(flipped, -d_i, d_i)
    # sums added in another order differ in their last bits: a tie must count as one
    tolerance = 1e-9 * np.abs(d).sum()
    at_least = np.count_nonzero(np.abs(sums) >= abs(d.sum()) - tolerance)
    # drawn at random, the observed study counts as one of them (a p-value is never 0)
    return at_least / len(sums) if exact else (at_least + 1) / (RANDOM_FLIPS + 1)


def smallest_p_value(n):
    """The smallest p-value n seeds can give: with every d of one sign, only the observed
    signs and their opposite reach the observed |mean|."""
    return 2 / 2**n


def fewest_seeds(threshold):
    """The fewest seeds whose test can reach the threshold at all: 6 for 0.05."""
    n = 1
    while smallest_p_value(n) > threshold:
        n += 1
    return n


def seeds_needed(mean, std, threshold):
    """An estimate of the seeds a difference of this mean and std (of the per-seed
    differences) needs: the mean of n differences taken as normal, with the measured mean and
    std taken as true, a two-sided test at the threshold finds it in POWER of studies when
    sqrt(n)·|mean|/std = z(1 - threshold/2) + z(POWER). None without a spread or a difference."""
    if std is None or mean == 0:
        return None
    z = statistics.NormalDist().inv_cdf
    n = math.ceil(((z(1 - threshold / 2) + z(POWER)) * std / abs(mean)) ** 2)
    return max(n, fewest_seeds(threshold))


def format_p(p):
    return f"{p:.2g}"


def verdict(mean, p, n, threshold):
    """The difference in words: `lower (p = 0.031)`, `no evidence (p = 0.41)`, ..."""
    if smallest_p_value(n) > threshold:
        return f"too few seeds (n = {n}: p ≥ {format_p(smallest_p_value(n))})"
    if p <= threshold:
        return f"{'lower' if mean < 0 else 'higher'} (p = {format_p(p)})"
    return f"no evidence (p = {format_p(p)})"


# --------------------------------------------------------------------------------------
# the table


def mean_std(values):
    """(mean, sample standard deviation with ddof=1; None for a single value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def stats(values):
    if not values:
        return None
    mean, std = mean_std(values)
    return dict(mean=mean, std=std, n=len(values))


def run_result(run):
    """A run's final numbers; 'finished' only when its last eval is the one at max_iters."""
    start, records = read_run(run)
    if start is None:
        return dict(seed=run.seed, out_dir=run.out_dir, status="not started", finished=False)
    differ = settings_differ(start, run.config)
    if differ:  # not this study's run, whatever its numbers
        return dict(seed=run.seed, out_dir=run.out_dir,
                    status=f"trained with {', '.join(differ)}", finished=False,
                    other_settings=True)
    _, last_eval, aux = report.final_numbers(records)
    at = last_eval["iter"] if last_eval else 0
    result = dict(seed=run.seed, out_dir=run.out_dir, iter=at, params=start["num_params"],
                  finished=at == run.max_iters)
    if at > run.max_iters:
        result["status"] = f"trained to iter {at:,}, past max_iters {run.max_iters:,}"
    elif at < run.max_iters:
        # ckpt.pt's iteration, where a resume goes on: a signal saves the state after the last
        # evaluation
        try:
            saved = result["saved_iter"] = saved_iteration(os.path.join(run.out_dir, "ckpt.pt"))
        except UserError:
            result["status"] = f"at iter {at:,} of {run.max_iters:,}, no checkpoint to resume"
        else:
            evaluated = f", last evaluated at {at:,}" if last_eval and at != saved else ""
            result["status"] = f"saved at iter {saved:,} of {run.max_iters:,}{evaluated}"
    else:
        # each model logs at most one auxiliary loss
        result.update(status="finished", train_loss=last_eval["train_loss"],
                      val_loss=last_eval["val_loss"], aux_loss=report.main_aux(aux))
        # the val loss of every evaluation, for the picture: [[iter, val loss], ...]
        result["val_curve"] = [[r["iter"], r["val_loss"]] for r in records if r["type"] == "eval"]
    return result


def val_difference(results, reference, threshold):
    """Val loss minus the reference config's. Over the seeds both finished (paired): the mean
    ± std of the per-seed differences, the permutation test's p-value and verdict, and the
    seeds a difference of that size needs. With no seed in common: the difference of the means
    ± the std of a difference of two independent runs, sqrt(std_a² + std_b²), and no test."""
    val = {r["seed"]: r["val_loss"] for r in results if r["finished"]}
    ref = {r["seed"]: r["val_loss"] for r in reference if r["finished"]}
    if not val or not ref:
        return None
    common = sorted(set(val) & set(ref))
    if common:
        differences = [val[seed] - ref[seed] for seed in common]
        difference = dict(stats(differences), paired=True, seeds=common, differences=differences)
        p = permutation_p_value(differences)
        mean, std, n = difference["mean"], difference["std"], difference["n"]
        return dict(difference, p_value=p, smallest_p_value=smallest_p_value(n),
                    verdict=verdict(mean, p, n, threshold),
                    seeds_needed=seeds_needed(mean, std, threshold))
    (mean_a, std_a), (mean_b, std_b) = mean_std(list(val.values())), mean_std(list(ref.values()))
    std = math.hypot(std_a, std_b) if std_a is not None and std_b is not None else None
    return dict(mean=mean_a - mean_b, std=std, n=0, paired=False)


def tabulate(runs, seeds, flags, threshold):
    """The study's numbers, config by config (the order of the command line)."""
    configs = {}
    for run in runs:
        configs.setdefault(run.config_name, []).append(run)
    rows = []
    for name, config_runs in configs.items():
        results = [run_result(run) for run in config_runs]
        finished = [r for r in results if r["finished"]]
        config = config_runs[0].config
        match = report.writeup_match(dict(model_type=config["model_type"],
                                          model_args=train.model_args_of(config), config=config))
        rows.append(dict(
            config=name, config_path=config_runs[0].config_path,
            params=next((r["params"] for r in results if "params" in r), None),
            seeds_finished=[r["seed"] for r in finished],
            train_loss=stats([r["train_loss"] for r in finished]),
            val_loss=stats([r["val_loss"] for r in finished]),
            aux_loss=stats([r["aux_loss"] for r in finished if r["aux_loss"] is not None]),
            runs=results,
            writeup=dict(report.WRITEUP[match[0]], config=match[0],
                         differs={k: dict(study=a, writeup=b) for k, (a, b) in match[1].items()})
            if match else None,
        ))
    reference = rows[0]
    for row in rows:
        row["val_difference"] = val_difference(row["runs"], reference["runs"], threshold)
        ours, theirs = row["writeup"], reference["writeup"]
        row["writeup_val_difference"] = ours["val"] - theirs["val"] if ours and theirs else None
    return dict(reference=reference["config"], seeds=seeds, flags=flags, threshold=threshold,
                configs=rows)


def format_stat(stat, digits=4, sign=""):
    if stat is None:
        return "-"
    text = f"{stat['mean']:{sign}.{digits}f}"
    return text if stat["std"] is None else f"{text} ± {stat['std']:.{digits}f}"


def format_aux(stat):
    if stat is None:
        return "-"
    if stat["std"] is None:
        return f"{stat['mean']:.4g}"
    return f"{stat['mean']:.4g} ± {stat['std']:.2g}"


def verdict_cells(diff):
    """The verdict, smallest p-value and seeds-needed cells of a config's row."""
    if diff is None or not diff["paired"]:
        return ["-", "-", "-"]
    needed = diff["seeds_needed"]
    smallest = f"{format_p(diff['smallest_p_value'])} (n = {diff['n']})"
    return [diff["verdict"], smallest, "-" if needed is None else str(needed)]


def verdict_note(reference, threshold):
    """The lines under the table that say how the verdict and the seeds needed were made."""
    z = statistics.NormalDist().inv_cdf
    return [
        f"Verdict: the exact paired permutation test of the per-seed differences to {reference}'s "
        f"val loss (two-sided: the share p of the 2^n ways to flip their signs whose mean is at "
        f"least as far from 0 as the observed mean); `lower` or `higher` when p ≤ {threshold:g}. "
        f"n seeds give p ≥ 2/2^n (smallest p): with fewer than {fewest_seeds(threshold)} "
        f"seeds no difference can reach {threshold:g} (`too few seeds`).",
        f"Seeds needed: an estimate, made from the mean and std of the differences measured "
        f"here as if they were the true ones: the seeds with which a test at {threshold:g} finds "
        f"a difference of that size in {POWER:.0%} of studies, taking the mean of n differences as "
        f"normal: n = ((z(1 - {threshold:g}/2) + z({POWER:g})) · std / |mean|)² = "
        f"({z(1 - threshold / 2) + z(POWER):.2f} · std / |mean|)², and at least "
        f"{fewest_seeds(threshold)}. The std of a few seeds is itself uncertain: take it as a "
        f"first guess, and add seeds with the same command.",
    ]


def markdown(table, out_root):
    reference, threshold = table["reference"], table["threshold"]
    n_seeds = len(table["seeds"])
    with_writeup = any(row["writeup"] for row in table["configs"])
    head = ["config", "seeds finished", "params", "train loss", "val loss",
            f"Δ val vs {reference}", f"verdict (p ≤ {threshold:g})", "smallest p",
            "seeds needed (est.)", "aux loss"]
    if with_writeup:
        head += ["write-up train", "write-up val", "write-up Δ val", "write-up aux",
                 "write-up params"]
    flags = " ".join(table["flags"]) or "(none)"
    lines = [f"# Study: {len(table['configs'])} configs × {n_seeds} seed{'s' * (n_seeds > 1)} "
             f"({', '.join(map(str, table['seeds']))})", "",
             f"Runs in `{out_root}/<config>-seed<seed>`; flags for every run: `{flags}`.", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    unpaired = False
    for row in table["configs"]:
        diff = row["val_difference"]
        if row["config"] == reference:
            diff_text = "(reference)" if diff else "-"
            tests = ["", "", ""]
        else:
            paired = diff is None or diff["paired"]
            diff_text = format_stat(diff, sign="+") + ("" if paired else " *")
            unpaired |= not paired
            tests = verdict_cells(diff)
        cells = [row["config"], f"{len(row['seeds_finished'])} of {n_seeds}",
                 f"{row['params']:,}" if row["params"] else "-",
                 format_stat(row["train_loss"]), format_stat(row["val_loss"]), diff_text, *tests,
                 format_aux(row["aux_loss"])]
        if row["writeup"]:
            cells += writeup_cells(row, reference)
        elif with_writeup:
            cells += [""] * 5
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Mean ± sample standard deviation (ddof=1) over the seeds that finished "
              "(no ± for one seed): train and val loss are each run's last eval-mode estimates, "
              "aux loss the unscaled auxiliary loss of its last logged step. Δ val: the mean ± "
              f"std of the per-seed differences of the val loss to {reference}'s, over the seeds "
              "both finished (paired)."]
    if unpaired:
        lines.append("* no seed finished by both: the difference of the means ± "
                     "sqrt(std² + std_ref²), and no test.")
    lines += verdict_note(reference, threshold)
    differs = sorted({f"{k} {v['study']} (write-up {v['writeup']})"
                      for row in table["configs"] if row["writeup"]
                      for k, v in row["writeup"]["differs"].items()})
    if with_writeup:
        lines.append("Write-up: the published numbers of the write-up config with the same model "
                     "(9000 steps on the write-ups' own Wikipedia text): compare differences "
                     "between configs, not absolute losses."
                     + (f" This study trains unlike them: {', '.join(differs)}."
                        if differs else ""))
    for label, other in (("Not finished", False),
                         ("Trained with other settings than this study's", True)):
        runs = [f"{os.path.basename(r['out_dir'])} ({r['status']})" for row in table["configs"]
                for r in row["runs"]
                if not r["finished"] and r.get("other_settings", False) == other]
        if runs:
            lines.append(f"{label}, left out of the means: {', '.join(runs)}.")
    return "\n".join(lines) + "\n"


def writeup_cells(row, reference):
    """The write-up's published numbers beside the study's, for a row with a write-up config."""
    w = row["writeup"]
    if row["config"] == reference:
        difference = "(reference)"
    elif row["writeup_val_difference"] is not None:
        difference = f"{row['writeup_val_difference']:+.3f}"
    else:
        difference = "-"
    aux = f"{w['aux']:.4g}" if w["aux"] is not None else "-"
    return [f"{w['train']:.3f}", f"{w['val']:.3f}", difference, aux, f"{w['params']:,}"]


def write_table(runs, args):
    table = tabulate(runs, args.seeds, args.flags, args.threshold)
    text = markdown(table, args.out_root)
    out_root = args.out_root
    os.makedirs(out_root, exist_ok=True)
    for name, content in (("study.md", text), ("study.json", json.dumps(table, indent=1) + "\n")):
        train.write_atomically(os.path.join(out_root, name), lambda f: f.write(content.encode()))
    print(text, end="")
    print(f"wrote {os.path.join(out_root, 'study.md')} and study.json")
    return table


# --------------------------------------------------------------------------------------
# the picture


FIGURE_INCHES = (13, 5.2)  # at DPI, 1,300 × 520 px: whole at 100% on a laptop's screen
DPI = 100  # the smallest text, 9 points, is 12 px high
TEXT_PT = 9


def val_curves(row):
    """(iterations, array (seeds, iterations) of val losses) of a config's finished runs, at
    the iterations every one of them evaluated; None without a finished run."""
    curves = [dict(map(tuple, r["val_curve"])) for r in row["runs"] if r["finished"]]
    if not curves:
        return None
    iters = sorted(set.intersection(*(set(curve) for curve in curves)))
    return iters, np.array([[curve[i] for i in iters] for curve in curves])


def legend_label(row, reference):
    if row["config"] == reference:
        return f"{row['config']} (reference)"
    diff = row["val_difference"]
    return f"{row['config']}: {diff['verdict']}" if diff and diff["paired"] else row["config"]


def study_figure(table, plt):
    """Left: val loss against iterations, per config the mean over its finished seeds as a
    line and their min to max as a band, the verdict in the legend. Right: each config's
    per-seed differences to the reference at the end, as dots, with their mean as a bar."""
    reference = table["reference"]
    fig, (ax_curves, ax_diffs) = plt.subplots(1, 2, figsize=FIGURE_INCHES, width_ratios=[3, 2],
                                              layout="constrained")
    # one colour per config: matplotlib's ten, or twenty paler ones beyond ten configs
    n_configs = len(table["configs"])
    if n_configs <= 10:
        colours = [f"C{k}" for k in range(n_configs)]
    else:
        colours = [plt.get_cmap("tab20")(k % 20) for k in range(n_configs)]
    band_alpha = 0.2 if n_configs <= 4 else 0.1  # many bands overlap: each paler
    drawn = []  # (iterations, losses) of every config drawn
    for k, row in enumerate(table["configs"]):
        curves = val_curves(row)
        if curves is None:
            continue
        iters, losses = curves
        ax_curves.plot(iters, losses.mean(axis=0), color=colours[k],
                       label=legend_label(row, reference))
        ax_curves.fill_between(iters, losses.min(axis=0), losses.max(axis=0), color=colours[k],
                               alpha=band_alpha, linewidth=0)
        drawn.append((np.array(iters), losses))
    title = "val loss: mean over seeds (line), min to max (band)"
    if drawn:
        # the first steps' losses are many times the end's: the axis holds the last 4/5 of
        # training, so that the end shows
        bottom = min(losses.min() for _, losses in drawn)
        top = max(losses[:, iters >= iters[-1] / 5].max() for iters, losses in drawn)
        margin = 0.05 * (top - bottom) or 0.05  # one evaluation: some room all the same
        ax_curves.set_ylim(bottom - margin, top + 2 * margin)
        if any(losses.max() > top + 2 * margin for _, losses in drawn):
            title += "\n(the first steps go above the top)"
    ax_curves.set(title=title, xlabel="iteration", ylabel="val loss")
    ax_curves.legend(fontsize=TEXT_PT + 1)
    compared = [(k, row) for k, row in enumerate(table["configs"])
                if row["config"] != reference and row["val_difference"]
                and row["val_difference"]["paired"]]
    # one row per config, the first at the top, its name and verdict beside it: long names
    # and many configs stay legible
    for y, (k, row) in enumerate(compared):
        d = row["val_difference"]["differences"]
        spread = np.linspace(-0.1, 0.1, len(d)) if len(d) > 1 else np.zeros(1)  # ties stay seen
        ax_diffs.scatter(d, y + spread, color=colours[k], zorder=3)
        ax_diffs.vlines(np.mean(d), y - 0.3, y + 0.3, color="black", linewidth=2, zorder=4)
    ax_diffs.axvline(0, color="grey", linestyle="--", linewidth=1)
    labels = [f"{row['config']}\n{row['val_difference']['verdict']}" for _, row in compared]
    ax_diffs.set_yticks(range(len(compared)), labels)
    ax_diffs.set_ylim(max(len(compared), 1) - 0.5, -0.5)
    ax_diffs.set(title="at the end: a dot per seed, a bar at their mean",
                 xlabel=f"val loss − {reference}'s")
    if not compared:
        ax_diffs.text(0.5, 0.5, "no config with a seed finished by it and the reference",
                      ha="center", va="center", transform=ax_diffs.transAxes)
    for ax in (ax_curves, ax_diffs):
        ax.tick_params(labelsize=TEXT_PT)
    return fig


def draw_picture(table, args):
    """Draws the study's picture to --plot, or else OUT_ROOT/study.png when matplotlib is
    installed (written whole, or not at all). matplotlib is needed for this alone."""
    path = args.plot or os.path.join(args.out_root, "study.png")
    if not any(row["seeds_finished"] for row in table["configs"]):
        print(f"note: no run finished: no picture {path}")
        return
    try:
        import matplotlib
    except ImportError:
        if args.plot:
            raise UserError("--plot draws with matplotlib: pip install matplotlib "
                            "(the table is written)") from None
        print(f"note: no picture {path}: it needs matplotlib (pip install matplotlib)")
        return
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    fig = study_figure(table, plt)
    try:
        train.write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=DPI))
    finally:
        plt.close(fig)
    print(f"wrote {path}")


def train_study(runs, slots, args):
    """Trains the runs that are not finished; returns those that failed. After a stop signal,
    once the running runs saved their state and stopped, writes the table and raises Stopped."""
    for run in runs:
        find_state(run)
    with StopRequest() as stop:
        failed = train_runs(runs, slots, args.flags, args.progress_s, stop)
    if stop.signum:
        write_table(runs, args)
        name = signal.Signals(stop.signum).name
        raise Stopped(stop.signum, f"stopped by {name}: every run that was training saved its "
                                   "state; the same command resumes the study")
    return failed


@configurator.script
def main(argv):
    """Command-line entry: 0 when every run finished, 1 when one failed, 2 for bad input."""
    args = parse_args(argv)
    runs = plan_runs(args.configs, args.seeds, args.out_root, args.flags)
    slots = pick_gpus(args.gpus)
    # one study per out_root: a second would take the first's runs for failed ones
    lock = None if args.report_only else configurator.lock_folder(args.out_root, "study.lock",
                                                                  "study.py")
    try:
        failed = [] if args.report_only else train_study(runs, slots, args)
        table = write_table(runs, args)
        draw_picture(table, args)
    finally:
        if lock:
            lock.close()
    if failed:
        names = ", ".join(run.name for run in failed)
        raise UserError(f"{len(failed)} run{'s' if len(failed) > 1 else ''} failed: {names}")
    return 0


if __name__ == "__main__":
    configurator.exit_now(main())  # without the slow teardown of torch
