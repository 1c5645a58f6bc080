"""
Trains configs × seeds with train.py, a run per GPU; writes each config's losses (mean ± std over
the seeds) and val loss difference to the first config, with its exact paired permutation test,
to OUT_ROOT/study.md and study.json (docs/study.md).

    python study.py config/baseline.py config/future50_mse.py
    python study.py config/baseline.py config/future50_mse.py --out_root=quick --max_iters=300
    python study.py config/baseline.py config/future50_mse.py --report_only

Flags other than the keys below go to every run's train.py. Stopped, the same command resumes.
"""

import contextlib
import ctypes
import dataclasses
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import configurator
import train
from configurator import ConfigError, Stopped, UserError, say

STUDY_DEFAULTS = dict(
    seeds="1337,1338,1339,1340,1341,1342",  # a run per config and seed; six can show p ≤ 0.05
    out_root="study",  # runs in OUT_ROOT/<config>-seed<S>, the table in OUT_ROOT/study.md
    report_only=False,  # train nothing: tabulate and draw what the run folders hold
)
# the settings in which a run folder may differ from the study's and still be its run
MAY_DIFFER = ("out_dir", "init_from", "max_iters", "log_interval", "device", "dtype", "compile",
              "wandb_log", "wandb_project", "wandb_run_name")
POLL_S = 0.1  # seconds between looks at the runs: a stop signal reaches them within this
PROGRESS_S = 60  # seconds between progress lines
THRESHOLD = 0.05  # a difference is called lower or higher when its p-value is at most this
POWER = 0.8  # the share of studies in which the seeds needed find the difference


@dataclasses.dataclass
class Run:
    config_name: str  # the config file's name without .py
    seed: int
    argv: list  # train.py's command line for the run
    config: dict  # train.get_config(argv)

    @property
    def out_dir(self):
        return self.config["out_dir"]

    @property
    def name(self):
        return f"{self.config_name}-seed{self.seed}"


# ----------------------------------------
# the command line, and the runs it asks for


def parse_command_line(argv):
    """(the study's settings, the config files, train.py's flags)."""
    config_paths = [arg for arg in argv if arg.endswith(".py") and not arg.startswith("-")]
    overrides = configurator.parse([arg for arg in argv if arg not in config_paths])[1]
    flags = [f"--{key}" if text is None else f"--{key}={text}"
             for key, text in overrides.items() if key not in STUDY_DEFAULTS]
    return configurator.own_settings(overrides, STUDY_DEFAULTS), config_paths, flags


def plan_runs(config_paths, seeds, out_root, flags):
    """A Run per seed and config, seed by seed: after the first seed every config has a result."""
    names = [os.path.basename(path).removesuffix(".py") for path in config_paths]
    if not names or len(set(names)) < len(names):
        raise ConfigError("give config files of distinct names, such as config/baseline.py "
                          "config/future50_mse.py")
    for path in config_paths:  # train.get_config would skip the study's keys: lost
        for key, value in configurator.read_config_file(path).items():
            if key in STUDY_DEFAULTS:
                raise ConfigError(f"{path} sets {key}, which is study.py's: pass it as a flag, "
                                  f"--{key}={value}")
    if given := {"--out_dir", "--seed", "--init_from"} & {flag.split("=")[0] for flag in flags}:
        raise ConfigError(f"study.py sets {given.pop()} for each run itself")
    # the exact test counts 2^n sign vectors: a million for 20 seeds
    if not len(seeds) == len(set(seeds)) <= 20:
        raise ConfigError(f"--seeds takes up to 20 distinct seeds, got {','.join(map(str, seeds))}")
    runs = []
    for seed in seeds:
        for name, path in zip(names, config_paths):
            out_dir = os.path.join(out_root, f"{name}-seed{seed}")
            argv = [path, *flags, f"--out_dir={out_dir}", f"--seed={seed}"]
            try:
                config = train.get_config(argv, script_keys=STUDY_DEFAULTS)
            except ConfigError as e:  # name the config that refuses a flag
                raise ConfigError(str(e) if path in str(e) else f"{path}: {e}") from None
            runs.append(Run(name, config["seed"], argv, config))
    return runs


# ----------------------------------------
# what a run folder holds


def examine(run):
    """(whether the run finished, the iteration of its ckpt.pt or None); a UserError for a
    checkpoint that is damaged or trained with other settings."""
    path = f"{run.out_dir}/ckpt.pt"
    if not os.path.exists(path):
        return False, None
    saved = train.load_checkpoint(path, train.TRAINING_KEYS, mmap=True)
    differ = []
    for key, value in run.config.items():
        saved_value = saved["config"].get(key, value)
        if key == "data_dir":  # data/x is /home/me/data/x: the same folder
            saved_value, value = os.path.realpath(saved_value), os.path.realpath(value)
        if key not in MAY_DIFFER and saved_value != value:
            differ.append(f"{key} {saved_value!r} (this study: {value!r})")
    if differ:
        raise UserError(f"{run.out_dir} holds a run trained with {', '.join(differ)}: use the "
                        "same settings, or another --out_root")
    finished = saved["iter_num"] == saved["last_eval_iter"] == run.config["max_iters"]
    return finished, saved["iter_num"]


def read_log(run):
    """The records of the run's log.jsonl; a line cut off by a killed launch is skipped."""
    records = []
    with contextlib.suppress(FileNotFoundError), open(f"{run.out_dir}/log.jsonl") as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    return records


def logged_iter(run):
    """The iteration of the last train or eval record, or where the latest launch started."""
    records = read_log(run)
    return records[-1].get("iter", records[-1].get("iter_num", 0)) if records else 0


# ----------------------------------------
# training: a train.py process per GPU, polled


def gpu_slots():
    """Each slot's CUDA_VISIBLE_DEVICES, from the study's own; [None] below two GPUs."""
    count = torch.cuda.device_count()
    if count < 2:
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = visible.split(",") if visible else range(count)
    return [str(name) for name in names][:count]


class StopRequest:
    """The first stop signal sets .signum, for the runs; a second stops the study at once."""

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
        say(f"{name}: passed on to the runs, which save their state and stop; a second signal "
            "stops at once")

    def __exit__(self, *exception):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


# prctl, found before a fork: a child must load nothing before its exec
PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
PR_SET_PDEATHSIG = 1  # from linux/prctl.h


def launch(run, saved, gpu):
    """Starts train.py for the run, resumed if saved is an iteration, its output to train.out."""
    command = [sys.executable, train.__file__, *run.argv]
    where = "" if gpu is None else f" on GPU {gpu}"
    if saved is None:
        say(f"{run.name}: training{where}")
    else:
        command.append("--init_from=resume")
        say(f"{run.name}: resuming from iter {saved}{where}")
    env = None if gpu is None else dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
    # Linux sends the run SIGTERM when the thread that started it ends, even by kill -9: the run
    # saves and stops. Elsewhere it outlives a study killed by -9.
    before_exec = functools.partial(PRCTL, PR_SET_PDEATHSIG, signal.SIGTERM) if PRCTL else None
    os.makedirs(run.out_dir, exist_ok=True)
    with open(f"{run.out_dir}/train.out", "a") as out:
        # a session of its own: a Ctrl-C reaches study.py alone, which passes it on once
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=before_exec)


def train_runs(runs):
    """Trains the runs not finished, a run per GPU; returns (failed runs, the stop signal)."""
    todo, failed = [], []  # todo: [(run, the iteration of its ckpt.pt, or None)]
    for run in runs:
        try:
            finished, saved = examine(run)
        except UserError as e:
            say(f"{run.name}: cannot train: {e}")
            failed.append(run)
            continue
        if not finished:
            todo.append((run, saved))
    say(f"{len(todo)} of {len(runs)} runs to train")
    if todo:  # the data checked once rather than failing every run
        config = todo[0][0].config
        train.check_data(config["data_dir"], config["block_size"], config["vocab_size"])
    slots, running = gpu_slots(), {}  # running: {slot: (run, process)}
    last_progress = time.time()
    with StopRequest() as stop:
        try:
            passed_on = False
            while todo or running:
                if stop.signum and not passed_on:  # nothing starts from now on
                    todo, passed_on = [], True
                    for _, process in running.values():
                        process.send_signal(stop.signum)  # once: each run saves and stops
                for slot in [slot for slot in slots if slot not in running][:len(todo)]:
                    run, saved = todo.pop(0)
                    running[slot] = run, launch(run, saved, slot)
                for slot, (run, process) in list(running.items()):
                    if process.poll() is None:
                        continue
                    del running[slot]
                    code = process.returncode
                    if code == 0:
                        say(f"{run.name}: done at iter {logged_iter(run)}")
                    elif stop.signum and code == 128 + stop.signum:
                        say(f"{run.name}: stopped, its state saved")
                    else:
                        say(f"{run.name}: FAILED, exit code {code}: see {run.out_dir}/train.out")
                        failed.append(run)
                if time.time() - last_progress >= PROGRESS_S and running:
                    last_progress = time.time()
                    say("; ".join(f"{run.name} at iter {logged_iter(run)}"
                                  for run, _ in running.values()))
                time.sleep(POLL_S)
        finally:  # left early (a second signal): the runs stop at once
            for _, process in running.values():
                process.terminate()
                process.wait()
    return failed, stop.signum


# ----------------------------------------
# is a difference real? the exact paired permutation test


def permutation_p_value(differences):
    """The share of the 2^n ways to flip the signs of the differences d whose |mean| is at least
    the observed one: the two-sided p-value of the exact paired permutation test."""
    d = np.asarray(differences, dtype=np.float64)
    vectors = np.arange(2 ** len(d))
    sums = np.zeros(len(vectors))  # the sum ranks as the mean does
    for i, d_i in enumerate(d):  # sign vector k flips d_i when bit i of k is set
        sums += np.where((vectors >> i) & 1, -d_i, d_i)
    # sums added in another order differ in their last bits: a tie must count as one
    tolerance = 1e-9 * np.abs(d).sum()
    return np.count_nonzero(np.abs(sums) >= abs(d.sum()) - tolerance) / len(sums)


def seeds_needed(mean, std, threshold):
    """The seeds n with which a test at the threshold finds a difference of this mean and std in
    POWER of studies, the mean of n taken as normal: sqrt(n)·|mean|/std = z(1 - t/2) + z(POWER)."""
    if std is None or mean == 0:
        return None
    z = statistics.NormalDist().inv_cdf
    n = math.ceil(((z(1 - threshold / 2) + z(POWER)) * std / abs(mean)) ** 2)
    return max(n, math.ceil(1 - math.log2(threshold)))  # the fewest with which p can reach it


def verdict(mean, p, n, threshold):
    """The difference in words: `lower (p = 0.031)`, `no evidence (p = 0.41)`, ..."""
    if 2 / 2**n > threshold:  # the smallest p of n seeds: every d of one sign
        return f"too few seeds (n = {n}: p ≥ {2 / 2**n:.2g})"
    if p <= threshold:
        return f"{'lower' if mean < 0 else 'higher'} (p = {p:.2g})"
    return f"no evidence (p = {p:.2g})"


# ----------------------------------------
# the table


def stats(values):
    """Mean and sample standard deviation (ddof=1, None for one value)."""
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else None
    return dict(mean=statistics.mean(values), std=std)


def run_result(run):
    """A finished run's numbers, from its log.jsonl; else why it is left out of the means."""
    result = dict(seed=run.seed, name=run.name, finished=False)
    try:
        finished, saved = examine(run)
    except UserError as e:
        return dict(result, note=str(e))
    if not finished:
        at = "no checkpoint" if saved is None else f"saved at iter {saved}"
        return dict(result, note=f"{at} of {run.config['max_iters']}")
    # a resumed launch's evaluations replace those of a killed launch
    evals = {r["iter"]: r for r in read_log(run) if r["type"] == "eval"}
    final = evals[run.config["max_iters"]]
    val_curve = {i: r["val_loss"] for i, r in evals.items()}
    return dict(result, finished=True, train_loss=final["train_loss"], val_loss=final["val_loss"],
                best_val_loss=final["best_val_loss"], val_curve=val_curve)


def val_difference(results, reference):
    """The per-seed val loss differences to the reference, over the seeds both finished."""
    ours = {r["seed"]: r["val_loss"] for r in results if r["finished"]}
    theirs = {r["seed"]: r["val_loss"] for r in reference if r["finished"]}
    seeds = [seed for seed in ours if seed in theirs]
    if not seeds:
        return None
    d = [ours[seed] - theirs[seed] for seed in seeds]
    spread, p = stats(d), permutation_p_value(d)
    return dict(spread, seeds=seeds, differences=d, p_value=p,
                verdict=verdict(spread["mean"], p, len(d), THRESHOLD),
                seeds_needed=seeds_needed(spread["mean"], spread["std"], THRESHOLD))


def tabulate(runs, flags):
    """The study's numbers, config by config in the order of the command line."""
    configs = {run.config_name: [] for run in runs}
    for run in runs:
        configs[run.config_name].append(run_result(run))
    reference = next(iter(configs))
    rows, left_out = [], []
    for name, results in configs.items():
        finished = [r for r in results if r["finished"]]
        left_out += [dict(run=r["name"], reason=r["note"]) for r in results if not r["finished"]]
        difference = None if name == reference else val_difference(results, configs[reference])
        rows.append(dict(config=name, runs=results, seeds_finished=len(finished),
                         train_loss=stats([r["train_loss"] for r in finished]),
                         val_loss=stats([r["val_loss"] for r in finished]),
                         val_difference=difference))
    seeds = list(dict.fromkeys(run.seed for run in runs))
    return dict(reference=reference, seeds=seeds, flags=flags, threshold=THRESHOLD, configs=rows,
                left_out=left_out)


def format_stat(stat, spec=".4f"):
    if stat is None:
        return "-"
    text = f"{stat['mean']:{spec}}"
    return text if stat["std"] is None else f"{text} ± {stat['std']:{spec.lstrip('+')}}"


def markdown(table, out_root):
    reference, seeds = table["reference"], table["seeds"]
    head = ["config", "seeds finished", "train loss", "val loss", f"Δ val vs {reference}",
            f"verdict (p ≤ {THRESHOLD})", "seeds needed (est.)"]
    flags = " ".join(table["flags"]) or "(none)"
    lines = [f"# {out_root}: seeds {', '.join(map(str, seeds))}; flags for every run: `{flags}`",
             "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in table["configs"]:
        diff = row["val_difference"]
        if row["config"] == reference:
            tests = ["(reference)", "", ""]
        elif diff is None:
            tests = ["-", "-", "-"]
        else:  # one seed has no spread: no estimate
            needed = "-" if diff["seeds_needed"] is None else str(diff["seeds_needed"])
            tests = [format_stat(diff, "+.4f"), diff["verdict"], needed]
        cells = [row["config"], f"{row['seeds_finished']} of {len(seeds)}",
                 format_stat(row["train_loss"]), format_stat(row["val_loss"]), *tests]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Mean ± std (ddof=1) over the seeds that finished; Δ val paired by seed."]
    if table["left_out"]:
        left_out = ", ".join(f"{r['run']} ({r['reason']})" for r in table["left_out"])
        lines.append(f"Left out of the means: {left_out}.")
    return "\n".join(lines) + "\n"


def write_tables(table, out_root):
    """Prints the table, and writes OUT_ROOT/study.md and study.json."""
    text = markdown(table, out_root)
    # plain JSON: a missing number is null, and a NaN fails here
    numbers = json.dumps(table, indent=1, allow_nan=False) + "\n"
    train.write_atomically(f"{out_root}/study.md", lambda f: f.write(text.encode()))
    train.write_atomically(f"{out_root}/study.json", lambda f: f.write(numbers.encode()))
    print(f"{text}wrote {out_root}/study.md and study.json")


# ----------------------------------------
# the picture


def study_figure(table, plt):
    """Each config's val loss against iterations from a fifth of training on (the first losses
    dwarf the end's): the mean over its seeds as a line, their min to max as a band."""
    fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")  # 1,000 × 500 px at 100 dpi
    rows = table["configs"]
    colours = plt.get_cmap("tab10" if len(rows) <= 10 else "tab20").colors
    for row, colour in zip(rows, colours):
        curves = [r["val_curve"] for r in row["runs"] if r["finished"]]
        if not curves:
            continue
        iters = sorted(set.intersection(*(set(curve) for curve in curves)))
        iters = [i for i in iters if i >= iters[-1] / 5]
        losses = np.array([[curve[i] for i in iters] for curve in curves])  # (seeds, iters)
        label = row["config"]
        if row is rows[0]:
            label += " (reference)"
        elif row["val_difference"]:
            label += f": {row['val_difference']['verdict']}"
        ax.plot(iters, losses.mean(axis=0), color=colour, label=label)
        ax.fill_between(iters, losses.min(axis=0), losses.max(axis=0), color=colour, alpha=0.2,
                        linewidth=0)
    ax.legend()
    ax.set(title="val loss: mean over seeds (line), min to max (band)", xlabel="iteration",
           ylabel="val loss")
    return fig


def draw_picture(table, out_root):
    """Draws OUT_ROOT/study.png when a run finished and matplotlib is installed."""
    path = f"{out_root}/study.png"
    try:
        import matplotlib
    except ImportError:
        print(f"note: no picture {path}: it needs matplotlib (pip install matplotlib)")
        return
    if not any(row["seeds_finished"] for row in table["configs"]):
        return
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    fig = study_figure(table, plt)
    try:
        train.write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)
    print(f"wrote {path}")


@configurator.script
def main(argv):
    """0 when every run finished, 1 when one failed, 2 for a bad setting."""
    settings, config_paths, flags = parse_command_line(argv)
    if configurator.wants_help(argv):
        print(configurator.usage(__doc__, settings))
        return 0
    out_root, failed, signum = settings["out_root"], [], None
    runs = plan_runs(config_paths, settings["seeds"].split(","), out_root, flags)
    if not settings["report_only"]:
        # one study per out_root: a second would take the first's runs for failed ones
        with configurator.lock_folder(out_root, "study.lock", "study.py"):
            failed, signum = train_runs(runs)
    os.makedirs(out_root, exist_ok=True)
    table = tabulate(runs, flags)
    write_tables(table, out_root)
    draw_picture(table, out_root)
    if signum:
        raise Stopped(signum, f"stopped by {signal.Signals(signum).name}: every run that was "
                      "training saved its state; the same command resumes")
    if failed:
        raise UserError(f"{len(failed)} of {len(runs)} runs failed: "
                        + ", ".join(run.name for run in failed))
    return 0


if __name__ == "__main__":
    configurator.exit_now(main())  # without the slow teardown of torch
