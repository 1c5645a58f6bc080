"""
Compares training runs in a table like the write-ups', from their log.jsonl.

    python report.py out-baseline out-future50_mse out-encdec_mse_possub
    python report.py study/* --plot    # and the loss curves in the first run's losses.png
    python report.py out-a out-b --plot=curves.svg    # or in a .png, .pdf, .svg or .jpg
"""

import datetime
import itertools
import json
import os
import sys

import configurator
from configurator import ConfigError, UserError

DEFAULTS = dict(plot="")  # a file for the loss curves (needs matplotlib); "": none
IMAGE_TYPES = (".png", ".pdf", ".svg", ".jpg")
# The write-ups' published results after WRITEUP_ITERS steps of 160,000 tokens: the last train
# and val loss, the auxiliary loss of the last step (None: the model has none), the parameters.
WRITEUP_ITERS, WRITEUP_TOKENS = 9000, 1_440_000_000
WRITEUP_COLUMNS = ("train", "val", "aux", "params")
WRITEUP_NUMBERS = {
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
}
WRITEUP = {name: dict(zip(WRITEUP_COLUMNS, numbers)) for name, numbers in WRITEUP_NUMBERS.items()}
# the write-ups' training settings
BUDGET_KEYS = ("max_iters", "batch_size", "gradient_accumulation_steps", "learning_rate", "min_lr",
               "warmup_iters", "lr_decay_iters", "decay_lr", "weight_decay", "beta1", "beta2",
               "grad_clip", "eval_iters")


def read_log(out_dir):
    """(records, wall seconds); a resumed launch replaces what was logged past its checkpoint."""
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.isdir(out_dir):
        raise UserError(f"no folder {out_dir}")
    if not os.path.isfile(path):
        raise UserError(f"{out_dir} holds no log.jsonl: not a run of train.py")
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


def summarize(out_dir, records, wall_s):
    """(the run's row, the write-up's row or None, notes)."""
    starts = [r for r in records if r["type"] == "start"]
    evals = [r for r in records if r["type"] == "eval"]
    trains = [r for r in records if r["type"] == "train"]
    start = starts[-1]
    last_eval = evals[-1] if evals else {}
    aux = trains[-1]["aux"] if trains else {}  # the last step's
    # a loss per layer (a list) is too long for the table
    aux_losses = [f"{k} {v:.4g}" for k, v in aux.items() if not isinstance(v, list)]
    finite_val_losses = [r["val_loss"] for r in evals if r["val_loss"] is not None]
    best_val_loss = f"{min(finite_val_losses):.3f}" if finite_val_losses else "-"
    iters, max_iters = max(r.get("iter", 0) for r in records), start["config"]["max_iters"]
    # each launch's tokens per iteration times the iterations it ran
    ends = [r["iter_num"] for r in starts[1:]] + [iters]
    tokens = sum(s["tokens_per_iter"] * (end - s["iter_num"]) for s, end in zip(starts, ends))
    run = os.path.basename(os.path.normpath(out_dir))
    row = {"run": run, "model_type": start["model_type"], "params": f"{start['num_params']:,}",
           "iters": str(iters) if iters >= max_iters else f"{iters} of {max_iters}",
           "tokens": f"{tokens:,}",
           "train loss": loss_text(last_eval, "train_loss"),
           "val loss": loss_text(last_eval, "val_loss"),
           "best val loss": best_val_loss,
           "aux loss": ", ".join(aux_losses) or "-",
           "wall time": str(datetime.timedelta(seconds=round(wall_s))),
           "data": start["data"]["data_dir"]}
    notes = [f"{run}: evaluated with --eval_only (not the run's numbers) at iter {r['iter']} on "
             f"{r['data_dir']}: train loss {r['train_loss']:.3f}, val loss {r['val_loss']:.3f}"
             for r in records if r["type"] == "eval_only"]
    if iters < max_iters:
        losses = f"from iteration {last_eval['iter']}" if last_eval else "none"
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
        "best val loss": "-",  # unpublished
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
    # tab10's ten colours differ most; tab20 adds a light shade of each
    colors = plt.colormaps["tab10" if len(runs) <= 10 else "tab20"].colors
    for ax, kind, key, title in ((axes[0], "train", "loss", "train loss, aux losses added"),
                                 (axes[1], "eval", "val_loss", "val loss")):
        for (name, records), color in zip(runs, itertools.cycle(colors)):
            iters = [r["iter"] for r in records if r["type"] == kind]
            losses = [r[key] for r in records if r["type"] == kind]
            ax.plot(iters, losses, color=color, label=name)
        ax.set(title=title, xlabel="iteration")
        ax.legend()
    image_format = os.path.splitext(path)[1][1:] or "png"
    train.write_atomically(path, lambda f: fig.savefig(f, format=image_format))
    print(f"saved {path}")


def without_bare_plot(argv):
    """(argv less a bare --plot, whether it had one). --plot is bare unless an image's file name
    follows it: configurator would read a run folder there as the file."""
    rest, bare = [], False
    for arg, following in zip(argv, [*argv[1:], ""]):
        if arg == "--plot" and not following.endswith(IMAGE_TYPES):
            bare = True
        else:
            rest.append(arg)
    return rest, bare


@configurator.script
def main(argv):
    argv_without_plot, bare_plot = without_bare_plot(argv)
    out_dirs, rest = configurator.take_runs(argv_without_plot)
    config = configurator.settings(rest, DEFAULTS)
    if configurator.wants_help(argv):
        print(configurator.usage(__doc__, config))
        return 0
    folders = [path for path in out_dirs if not os.path.isfile(path)]  # study/* names files too
    if not folders:
        raise ConfigError("no run folder given: python report.py out-baseline ...")
    rows, notes, runs, plot_path = [], [], [], config["plot"]
    for out_dir in folders:
        try:
            records, wall_s = read_log(out_dir)
            row, writeup_row, run_notes = summarize(out_dir, records, wall_s)
        except UserError as e:
            configurator.say(f"error: {e}")
            continue
        rows += [row, writeup_row] if writeup_row else [row]
        notes += run_notes
        runs.append((row["run"], records))
        if bare_plot and not plot_path:  # not the current folder, often the repository
            plot_path = os.path.join(out_dir, "losses.png")
    if rows:
        header = {key: key for key in rows[0]}
        widths = {key: max(len(row[key]) for row in [header, *rows]) for key in header}
        for row in [header, *rows]:
            print("  ".join(row[key].ljust(widths[key]) for key in header).rstrip())
    for note in notes:
        print(f"note: {note}")
    if plot_path and runs:
        plot(runs, plot_path)
    return 0 if len(runs) == len(folders) else 1


if __name__ == "__main__":
    sys.exit(main())
