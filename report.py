"""
Compares training runs in a table like the write-ups', from each out_dir/log.jsonl.

    python report.py out-baseline out-future50_mse out-encdec_mse_possub
    python report.py out-* --plot losses.png     # loss curves too (needs matplotlib)

Train and val loss are the last eval-mode estimates; "aux" is the last logged auxiliary
loss (unscaled); wall time adds up the time of every launch of the run; data is the run's
data_dir. A run that trains the model of one of the write-ups' configs (config/<name>.py) gets a
second line with the write-up's published numbers for that config, and whether the run's data
was theirs: "same data as the write-up" when the train and val sha256 the run recorded are those
of the write-ups' token files (prepare_wikipedia.py's default), else which data it was.
Evaluations made with --eval_only are not the run's: a note lists them under the table. --plot
draws the loss curves, and for future attention the loss of every layer (the write-up's "L
different objectives").
"""

import argparse
import functools
import json
import os
import sys

import configurator

REPO = os.path.dirname(os.path.abspath(__file__))

# The write-ups' published results (their tables and appendices): eval-mode train and val
# loss after 9000 steps of 160,000 tokens on their Wikipedia text, the unscaled auxiliary
# loss of the last step (None: the model has none), and the parameter count.
WRITEUP = {
    "baseline": dict(train=2.937, val=3.424, aux=None, params=16_036_800),
    "smaller_baseline": dict(train=2.958, val=3.416, aux=None, params=15_441_192),
    "dropout02_baseline": dict(train=3.174, val=3.406, aux=None, params=16_036_800),
    "future50_cosine": dict(train=3.017, val=3.423, aux=0.2589, params=15_817_248),
    "future50_mse": dict(train=3.017, val=3.419, aux=0.07681, params=15_817_248),
    "future100_mse": dict(train=3.025, val=3.421, aux=0.08633, params=15_817_248),
    "encdec_cosine": dict(train=2.993, val=3.387, aux=8.564e-9, params=15_763_500),
    "encdec_mse": dict(train=2.998, val=3.385, aux=4.138e-9, params=15_763_500),
    "encdec_plain": dict(train=3.043, val=3.413, aux=None, params=15_763_200),
    "encdec_possub": dict(train=2.979, val=3.381, aux=None, params=15_763_200),
    "encdec_mse_possub": dict(train=2.982, val=3.378, aux=4.673e-9, params=15_763_500),
}
# the settings that make a run's training and its loss estimates those of the write-ups
BUDGET_KEYS = ("max_iters", "batch_size", "gradient_accumulation_steps", "learning_rate", "min_lr",
               "warmup_iters", "lr_decay_iters", "decay_lr", "weight_decay", "beta1", "beta2",
               "grad_clip", "eval_iters")


class ReportError(configurator.UserError):
    """A run that cannot be reported; its message is printed and the other runs go on."""


def read_log(out_dir):
    """(records in training order, wall seconds); a resumed launch supersedes what its
    earlier launch logged after the checkpoint it resumed from."""
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.isfile(path):
        raise ReportError(f"{out_dir}: no log.jsonl there (is it a train.py out_dir?)")
    records, wall_s, launch = [], 0.0, None
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                # a launch killed mid-write leaves a cut-off line; a resumed launch appends after it
                print(f"warning: {path}, line {line_no}: "
                      "not a JSON record (cut off mid-write?); skipped", file=sys.stderr)
                continue
            if record.get("type") == "start":
                launch = record["time"]
                # A launch's start counts as at its iteration, so a later launch from an earlier
                # checkpoint replaces what was logged after that iteration.
                records = [r for r in records
                           if r.get("iter", r.get("iter_num", 0)) <= record["iter_num"]]
            # An evaluation later on (--eval_only) is not training time.
            elif launch is not None and record.get("type") != "eval_only":
                wall_s += record["time"] - max(launch, records[-1]["time"])
            records.append(record)
    if not any(r.get("type") == "start" for r in records):
        raise ReportError(f"{path}: empty, or no start record (the run logged nothing yet)")
    return records, wall_s


def final_numbers(records):
    """The last start record, the last eval record (None before the first) and the last
    train record's auxiliary losses of a run's records (read_log)."""
    start = [r for r in records if r["type"] == "start"][-1]
    evals = [r for r in records if r["type"] == "eval"]
    trains = [r for r in records if r["type"] == "train"]
    return start, evals[-1] if evals else None, trains[-1]["aux"] if trains else {}


def tokens_trained(records, iters):
    """Tokens over the launches of a run's records (read_log): each launch's tokens_per_iter times
    the iterations it ran, from its start to the next launch's start (or to iters)."""
    starts = [r for r in records if r["type"] == "start"]
    ends = [r["iter_num"] for r in starts[1:]] + [iters]
    return sum(start["tokens_per_iter"] * (end - start["iter_num"])
               for start, end in zip(starts, ends))


def loss_text(value):
    """A logged loss in the table: null is a non-finite value (the record's "nonfinite" names
    it)."""
    return "non-finite" if value is None else f"{value:.3f}"


@functools.cache
def writeup_configs():
    """{name: config} of config/<name>.py for every config in WRITEUP."""
    # train imports torch and the models: seconds that --help and a bad argument need not wait.
    import train
    return {name: train.get_config([os.path.join(REPO, "config", f"{name}.py")])
            for name in WRITEUP}


def writeup_match(start):
    """(write-up config name, {budget key: (run's value, write-up's value)} where they differ)
    for a run that trains the model of a write-up config, or None. The model decides (model_type and
    model_args of the start record); out_dir, data and seed may be anything."""
    import train  # as in writeup_configs
    for name, config in writeup_configs().items():
        # through JSON, as the start record went, so tuples and lists compare equal
        model_args = json.loads(json.dumps(train.model_args_of(config)))
        if (start["model_type"] == config["model_type"]
                and train.saved_model_args(start["model_type"],
                                           start.get("model_args", {})) == model_args):
            run_config = start["config"]
            return name, {key: (run_config.get(key), config[key]) for key in BUDGET_KEYS
                          if run_config.get(key) != config[key]}
    return None


def main_aux(aux):
    """The auxiliary loss of a train record's aux (each model logs at most one, besides its
    per-layer list), or None."""
    return next((v for v in aux.values() if not isinstance(v, list)), None)


def format_aux(aux):
    return ", ".join(f"{k} {v:.4g}" for k, v in aux.items() if not isinstance(v, list)) or "-"


def summarize(out_dir):
    """(row of the table, write-up row or None, notes) for one run."""
    records, wall_s = read_log(out_dir)
    start, last_eval, aux = final_numbers(records)
    evals = [r for r in records if r["type"] == "eval"]
    iters = max([r["iter"] for r in records if "iter" in r], default=0)
    finite_val_losses = [r["val_loss"] for r in evals if r["val_loss"] is not None]
    hours, rest = divmod(int(wall_s), 3600)
    run = os.path.basename(os.path.normpath(out_dir))
    row = {
        "run": run,
        "model_type": start["model_type"],
        "params": f"{start['num_params']:,}",
        "iters": str(iters),
        "tokens": f"{tokens_trained(records, iters):,}",
        "train loss": loss_text(last_eval["train_loss"]) if last_eval else "-",
        "val loss": loss_text(last_eval["val_loss"]) if last_eval else "-",
        "best val": loss_text(min(finite_val_losses)) if finite_val_losses else "-",
        "aux loss": format_aux(aux),
        "wall time": f"{hours}:{rest // 60:02d}:{rest % 60:02d}",
        "data": start.get("data", {}).get("data_dir", "-"),
    }
    notes = [f"{run}: evaluated with --eval_only (not the run's numbers) at iter {r['iter']} "
             f"on {r['data_dir']}: "
             f"train loss {r['train_loss']:.3f}, val loss {r['val_loss']:.3f}"
             for r in records if r["type"] == "eval_only"]
    match = writeup_match(start)
    if match is None:
        return row, None, notes
    name, budget_differs = match
    published = WRITEUP[name]
    # the published aux under the run's own aux name, so the two lines read alike
    aux_names = list(aux) or ["aux"]
    if published["aux"] is not None:
        published_aux = format_aux({aux_names[0]: published["aux"]})
    else:
        published_aux = "-"
    writeup_row = dict.fromkeys(row, "")
    original = writeup_configs()[name]
    tokens_per_iter = (original["gradient_accumulation_steps"] * original["batch_size"]
                       * original["block_size"])
    tokens = original["max_iters"] * tokens_per_iter
    writeup_row.update({"run": f"  write-up: {name}", "params": f"{published['params']:,}",
                        "iters": str(original["max_iters"]), "tokens": f"{tokens:,}",
                        "train loss": f"{published['train']:.3f}",
                        "val loss": f"{published['val']:.3f}", "aux loss": published_aux,
                        "data": same_data(start.get("data"))})
    if budget_differs:
        differences = ", ".join(f"{key} {ours} (write-up {theirs})"
                                for key, (ours, theirs) in budget_differs.items())
        notes.append(f"{run} trains the model of config/{name}.py, but unlike the write-up: "
                     + differences)
    return row, writeup_row, notes


def same_data(identity):
    """The write-up line's word on a run's data (identity: the data_dir and the train and val sha256
    its start record holds): the write-ups' own when the hashes are those of their token files."""
    import prepare_wikipedia  # their pins; imported only for a run of a write-up config
    if not identity:
        return "data not recorded"
    theirs = [prepare_wikipedia.WRITEUP_FILES[f"wikipedia_{split}.bin"].sha256
              for split in ("train", "val")]
    if [identity["train_sha256"], identity["val_sha256"]] == theirs:
        return "same data as the write-up"
    return f"not the write-up's data: {describe(identity)}"


def describe(identity):
    """The data of identity by the dataset its meta.json names, when that meta.json still describes
    the files the run read; else by its folder."""
    try:
        with open(os.path.join(identity["data_dir"], "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        meta = {}
    same = [meta.get(split, {}).get("sha256") for split in ("train", "val")] == [
        identity["train_sha256"], identity["val_sha256"]]
    dataset = same and meta.get("dataset")
    return f"{dataset} in {identity['data_dir']}" if dataset else identity["data_dir"]


def print_table(rows):
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    for row in [dict(zip(columns, columns)), *rows]:
        print("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())


def plot(out_dirs, path):
    """Train (logged) and val (estimated) loss against iterations, one line per run; and, if a
    run logs a per-layer auxiliary loss, that loss per layer, one panel per such run."""
    try:
        import matplotlib
    except ImportError:
        print("error: --plot needs matplotlib: `pip install matplotlib` "
              "(the table above is complete)", file=sys.stderr)
        return False
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    import train  # as in writeup_configs

    runs = [(os.path.basename(os.path.normpath(out_dir)), read_log(out_dir)[0])
            for out_dir in out_dirs]
    per_layer = [(name, key, [r for r in records if r["type"] == "train" and key in r["aux"]])
                 for name, records in runs for key in layer_keys(records)]
    n_panels = 2 + len(per_layer)
    fig, axes = plt.subplots(1, n_panels, figsize=(6 * n_panels, 4.5), squeeze=False)
    ax_train, ax_val, *ax_layers = axes[0]
    for name, records in runs:
        trains = [r for r in records if r["type"] == "train"]
        evals = [r for r in records if r["type"] == "eval"]
        ax_train.plot([r["iter"] for r in trains], [r["loss"] for r in trains], label=name)
        ax_val.plot([r["iter"] for r in evals], [r["val_loss"] for r in evals],
                    marker=".", label=name)
    ax_train.set(title="train loss (with aux losses)", xlabel="iteration", ylabel="loss")
    ax_val.set(title="val loss (cross-entropy)", xlabel="iteration")
    ax_val.legend()
    for ax, (name, key, trains) in zip(ax_layers, per_layer):
        losses = [r["aux"][key] for r in trains]  # one list per record: the loss of each layer
        cmap = plt.get_cmap("viridis")
        for layer in range(len(losses[0])):
            ax.plot([r["iter"] for r in trains], [loss[layer] for loss in losses],
                    color=cmap(layer / max(1, len(losses[0]) - 1)), label=f"layer {layer + 1}")
        ax.set(title=f"{name}: {key.removesuffix('_per_layer')} by layer", xlabel="iteration")
        ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    image_format = os.path.splitext(path)[1][1:] or "png"
    train.write_atomically(path, lambda f: fig.savefig(f, format=image_format))
    print(f"saved {path}")
    return True


def layer_keys(records):
    """The names of the per-layer auxiliary losses (lists) that a run's train records hold."""
    return sorted({k for r in records if r["type"] == "train"
                   for k, v in r["aux"].items() if isinstance(v, list)})


@configurator.script
def main(argv):
    parser = argparse.ArgumentParser(description="Compare train.py runs from their log.jsonl.")
    parser.add_argument("out_dirs", nargs="+", help="out_dir of each run")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also save loss curves here (needs matplotlib)")
    args = parser.parse_args(argv)
    rows, notes, good = [], [], []
    for out_dir in args.out_dirs:
        try:
            row, writeup_row, run_notes = summarize(out_dir)
        except ReportError as e:
            print(f"error: {e}", file=sys.stderr)
            continue
        rows += [row, writeup_row] if writeup_row else [row]
        notes += run_notes
        good.append(out_dir)
    if rows:
        print_table(rows)
    for note in notes:
        print(f"note: {note}")
    plotted = plot(good, args.plot) if args.plot and good else True
    return 0 if len(good) == len(args.out_dirs) and plotted else 1


if __name__ == "__main__":
    sys.exit(main())
