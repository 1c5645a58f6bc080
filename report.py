"""
Compares training runs in a table like the write-ups', from each out_dir/log.jsonl.

    python report.py out-baseline out-future50_mse out-encdec_mse_possub
    python report.py out-* --plot losses.png     # loss curves too (needs matplotlib)

Train and val loss are the last eval-mode estimates; "aux" is the last logged auxiliary
loss (unscaled); wall time adds up the time of every launch of the run.
"""

import argparse
import json
import os
import sys


class ReportError(Exception):
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
                raise ReportError(f"{path}, line {line_no}: not a JSON record") from None
            if record.get("type") == "start":
                launch = record["time"]
                records = [r for r in records if r.get("iter", 0) <= record["iter_num"]]
            elif launch is not None:
                wall_s += record["time"] - max(launch, records[-1]["time"])
            records.append(record)
    if not any(r.get("type") == "start" for r in records):
        raise ReportError(f"{path}: empty, or no start record (the run logged nothing yet)")
    return records, wall_s


def summarize(out_dir):
    records, wall_s = read_log(out_dir)
    start = [r for r in records if r["type"] == "start"][-1]
    evals = [r for r in records if r["type"] == "eval"]
    trains = [r for r in records if r["type"] == "train"]
    iters = max([r["iter"] for r in evals + trains], default=0)
    aux = trains[-1]["aux"] if trains else {}
    hours, rest = divmod(int(wall_s), 3600)
    return {
        "run": os.path.basename(os.path.normpath(out_dir)),
        "model_type": start["model_type"],
        "params": f"{start['num_params']:,}",
        "iters": str(iters),
        "tokens": f"{iters * start['tokens_per_iter']:,}",
        "train loss": f"{evals[-1]['train_loss']:.3f}" if evals else "-",
        "val loss": f"{evals[-1]['val_loss']:.3f}" if evals else "-",
        "best val": f"{min(r['val_loss'] for r in evals):.3f}" if evals else "-",
        "aux loss": ", ".join(f"{k} {v:.4g}" for k, v in aux.items()) or "-",
        "wall time": f"{hours}:{rest // 60:02d}:{rest % 60:02d}",
    }


def print_table(rows):
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    for row in [dict(zip(columns, columns)), *rows]:
        print("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())


def plot(out_dirs, path):
    """Train (logged) and val (estimated) loss against iterations, one line per run."""
    try:
        import matplotlib
    except ImportError:
        print("error: --plot needs matplotlib: `pip install matplotlib` (the table above is complete)", file=sys.stderr)
        return False
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for out_dir in out_dirs:
        records, _ = read_log(out_dir)
        name = os.path.basename(os.path.normpath(out_dir))
        trains = [r for r in records if r["type"] == "train"]
        evals = [r for r in records if r["type"] == "eval"]
        ax_train.plot([r["iter"] for r in trains], [r["loss"] for r in trains], label=name)
        ax_val.plot([r["iter"] for r in evals], [r["val_loss"] for r in evals], marker=".", label=name)
    ax_train.set(title="train loss (with aux losses)", xlabel="iteration", ylabel="loss")
    ax_val.set(title="val loss (cross-entropy)", xlabel="iteration")
    ax_val.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"saved {path}")
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description="Compare train.py runs from their log.jsonl.")
    parser.add_argument("out_dirs", nargs="+", help="out_dir of each run")
    parser.add_argument("--plot", metavar="FILE.png", help="also save loss curves here (needs matplotlib)")
    args = parser.parse_args(argv)
    rows, good = [], []
    for out_dir in args.out_dirs:
        try:
            rows.append(summarize(out_dir))
            good.append(out_dir)
        except ReportError as e:
            print(f"error: {e}", file=sys.stderr)
    if rows:
        print_table(rows)
    plotted = plot(good, args.plot) if args.plot and good else True
    return 0 if len(good) == len(args.out_dirs) and plotted else 1


if __name__ == "__main__":
    sys.exit(main())
