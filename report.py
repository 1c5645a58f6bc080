"""
Compares training runs in a table like the write-ups', from their log.jsonl.

    python report.py out-baseline out-future50_mse out-encdec_mse_possub
    python report.py out-* --plot    # and the loss curves in losses.png, or --plot=FILE
"""

import datetime
import json
import os
import sys

import configurator
from configurator import ConfigError, UserError

DEFAULTS = dict(plot="")  # a file for the loss curves (needs matplotlib); "": none
# The write-ups' published results: (train loss, val loss, the auxiliary loss of the last step or
# None, parameters) after WRITEUP_ITERS steps of 160,000 tokens.
WRITEUP_ITERS, WRITEUP_TOKENS = 9000, 1_440_000_000
WRITEUP = {name: dict(zip(("train", "val", "aux", "params"), numbers)) for name, numbers in {
    "baseline": (2.937, 3.424, None, 16_036_800),
    "smaller_baseline": (2.958, 3.416, None, 15_441_192),
    "dropout02_baseline": (3.174, 3.406, None, 16_036_800),
    "future50_cosine": (3.017, 3.423, 0.2589, 15_817_248),
    "future50_mse": (3.017, 3.419, 0.07681, 15_817_248),
    "future100_mse": (3.025, 3.421, 0.08633, 15_817_248),
    "encdec_cosine": (2.993, 3.387, 8.564e-9, 15_763_500),
    "encdec_mse": (2.998, 3.385, 4.138e-9, 15_763_500),
    "encdec_plain": (3.043, 3.413, None, 15_763_200),
    "encdec_possub": (2.979, 3.381, None, 15_763_200),
    "encdec_mse_possub": (2.982, 3.378, 4.673e-9, 15_763_500),
}.items()}
# the write-ups' training settings
BUDGET_KEYS = ("max_iters", "batch_size", "gradient_accumulation_steps", "learning_rate", "min_lr",
               "warmup_iters", "lr_decay_iters", "decay_lr", "weight_decay", "beta1", "beta2",
               "grad_clip", "eval_iters")


def read_log(out_dir):
    """(records, wall seconds); a resumed launch replaces what was logged past its checkpoint."""
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.isfile(path):
        raise UserError(f"{out_dir}: no log.jsonl there")
    records, wall_s, launch = [], 0.0, None
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a launch killed mid-write
                configurator.say(f"warning: {path}, line {line_no}: cut off mid-write; skipped")
                continue
            if record["type"] == "start":
                launch, resumed_at = record["time"], record["iter_num"]
                records = [r for r in records if r.get("iter", r.get("iter_num")) <= resumed_at]
            elif launch is not None and record["type"] != "eval_only":  # not training time
                wall_s += record["time"] - max(launch, records[-1]["time"])
            records.append(record)
    if not any(r["type"] == "start" for r in records):
        raise UserError(f"{path}: no start record")
    return records, wall_s


def loss_text(record, key):
    if key not in record:
        return "-"
    return "non-finite" if record[key] is None else f"{record[key]:.3f}"  # JSON's null


def writeup_match(start):
    """(name, {key: (run's value, theirs)} where they differ) of the write-up config in whose
    folder a run was trained, or None."""
    folder = os.path.basename(os.path.normpath(start["config"]["out_dir"]))
    name = folder.removeprefix("out-").split("-seed")[0]  # study.py's: <name>-seed<S>
    if name not in WRITEUP:
        return None
    import train  # and torch, which --help and a bad argument need not wait for
    theirs = train.get_config([os.path.join(os.path.dirname(__file__), "config", f"{name}.py")])
    ours = start["config"]
    keys = ["model_type", *train.model_args_of(theirs), *BUDGET_KEYS]
    return name, {key: (ours.get(key), theirs[key]) for key in keys if ours.get(key) != theirs[key]}


def same_data(identity):
    from prepare_wikipedia import WRITEUP_FILES
    theirs = [WRITEUP_FILES[f"wikipedia_{split}.bin"].sha256 for split in ("train", "val")]
    if [identity["train_sha256"], identity["val_sha256"]] == theirs:
        return "same data as the write-up"
    return f"not the write-up's data: {identity['data_dir']}"


def summarize(out_dir):
    """(the run's row, the write-up's row or None, notes)."""
    records, wall_s = read_log(out_dir)
    starts = [r for r in records if r["type"] == "start"]
    start, last = starts[-1], ([{}] + [r for r in records if r["type"] == "eval"])[-1]
    aux = ([{}] + [r["aux"] for r in records if r["type"] == "train"])[-1]
    iters, max_iters = max(r.get("iter", 0) for r in records), start["config"]["max_iters"]
    # each launch's tokens per iteration times the iterations it ran
    ends = [r["iter_num"] for r in starts[1:]] + [iters]
    tokens = sum(s["tokens_per_iter"] * (end - s["iter_num"]) for s, end in zip(starts, ends))
    run = os.path.basename(os.path.normpath(out_dir))
    row = {"run": run, "model_type": start["model_type"], "params": f"{start['num_params']:,}",
           "iters": str(iters) if iters >= max_iters else f"{iters} of {max_iters}",
           "tokens": f"{tokens:,}",
           "train loss": loss_text(last, "train_loss"), "val loss": loss_text(last, "val_loss"),
           "aux loss": ", ".join(f"{k} {v:.4g}" for k, v in aux.items()
                                 if not isinstance(v, list)) or "-",
           "wall time": str(datetime.timedelta(seconds=round(wall_s))),
           "data": start["data"]["data_dir"]}
    notes = [f"{run}: evaluated with --eval_only (not the run's numbers) at iter {r['iter']} on "
             f"{r['data_dir']}: train loss {r['train_loss']:.3f}, val loss {r['val_loss']:.3f}"
             for r in records if r["type"] == "eval_only"]
    if iters < max_iters:
        losses = f"from iteration {last['iter']}" if last else "none"
        notes.append(f"{run} stopped at iteration {iters} of {max_iters}: its losses are {losses}")
    match = writeup_match(start)
    if match is None:
        return row, None, notes
    name, differs = match
    published = WRITEUP[name]
    writeup_row = dict.fromkeys(row, "") | {
        "run": f"  write-up: {name}", "params": f"{published['params']:,}",
        "iters": str(WRITEUP_ITERS), "tokens": f"{WRITEUP_TOKENS:,}",
        "train loss": f"{published['train']:.3f}", "val loss": f"{published['val']:.3f}",
        "aux loss": f"{published['aux']:.4g}" if published["aux"] else "-",
        "data": same_data(start["data"])}
    if differs:
        notes.append(f"{run} trains config/{name}.py, but unlike the write-up: " + ", ".join(
            f"{key} {ours} (write-up {their})" for key, (ours, their) in differs.items()))
    return row, writeup_row, notes


def plot(runs, path):
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install matplotlib") from None
    import train
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    # distinct colours for any number of runs: a colour map sampled at as many points
    colors = plt.colormaps["turbo"].resampled(len(runs)).colors
    for ax, kind, key, title in ((axes[0], "train", "loss", "train loss, aux losses added"),
                                 (axes[1], "eval", "val_loss", "val loss")):
        for (name, records), color in zip(runs, colors):
            points = [(r["iter"], r[key]) for r in records if r["type"] == kind]
            ax.plot(*zip(*points), color=color, label=name)
        ax.set(title=title, xlabel="iteration")
        ax.legend()
    image_format = os.path.splitext(path)[1][1:] or "png"
    train.write_atomically(path, lambda f: fig.savefig(f, format=image_format))
    print(f"saved {path}")


@configurator.script
def main(argv):
    out_dirs, rest = configurator.take_runs(argv)
    rest = ["--plot=losses.png" if arg == "--plot" else arg for arg in rest]  # --plot alone
    config = configurator.settings(rest, DEFAULTS)
    if configurator.wants_help(argv):
        print(configurator.usage(__doc__, config))
        return 0
    if not out_dirs:
        raise ConfigError("no run folder given: python report.py out-baseline ...")
    rows, notes, runs = [], [], []
    for out_dir in out_dirs:
        try:
            row, writeup_row, run_notes = summarize(out_dir)
        except UserError as e:
            configurator.say(f"error: {e}")
            continue
        rows += [row, writeup_row] if writeup_row else [row]
        notes += run_notes
        runs.append((row["run"], read_log(out_dir)[0]))
    if rows:
        widths = {key: max(len(key), *(len(row[key]) for row in rows)) for key in rows[0]}
        for row in [dict(zip(widths, widths)), *rows]:
            print("  ".join(row[key].ljust(width) for key, width in widths.items()).rstrip())
    for note in notes:
        print(f"note: {note}")
    if config["plot"] and runs:
        plot(runs, config["plot"])
    return 0 if len(runs) == len(out_dirs) else 1


if __name__ == "__main__":
    sys.exit(main())
