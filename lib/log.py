"""
The run's log: rank 0 prints each record as a line and appends it to out_dir/log.jsonl (and
wandb). A "train" record holds cross_entropy, each auxiliary loss under aux, and loss, their
weighted sum that the gradients come from; "eval" records hold cross-entropy losses.
"""

import json
import math
import os
import sys
import time

from lib.cli import UserError, to_devnull, write_problem


def console_line(record):
    """A record's console line; a step's cross-entropy first, like the evaluations' losses."""
    kind = record["type"]
    if kind == "start":
        c = record["config"]
        return (f"{record['model_type']}: {record['num_params']:,} parameters, world size "
                f"{record['world_size']}\ntokens per iteration: {c['gradient_accumulation_steps']} "
                f"micro-steps × {c['batch_size']} sequences × {c['block_size']} tokens = "
                f"{record['tokens_per_iter']:,}")
    if kind == "train":
        aux = "".join(f", {name} {value:.4f}" for name, value in record["aux"].items()
                      if not isinstance(value, list))
        total = f", total loss {record['loss']:.4f}" if aux else ""
        mfu = f", mfu {record['mfu'] * 100:.1f}%" if record["mfu"] is not None else ""
        return (f"iter {record['iter']}: cross-entropy {record['cross_entropy']:.4f}{aux}{total}, "
                f"grad norm {record['grad_norm']:.3g}, lr {record['lr']:.2e}, "
                f"{record['ms_per_iter']:.1f} ms/iter, {record['tokens_per_s']:,.0f} tokens/s{mfu}")
    losses = f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f}"
    if kind == "eval_only":
        return (f"evaluation only, at iteration {record['iter']} on {record['data_dir']} "
                f"({record['eval_iters']} batches per split): {losses}")
    best = ", the best so far" if record["best"] else f" (best {record['best_val_loss']:.4f})"
    return f"eval at iter {record['iter']}: {losses}{best}"


def start(path, config, model_args, model, world_size, iter_num, data_identity):
    """A launch's first record, on a line of its own after a launch killed mid-record; returns
    wandb when config["wandb_log"] asks for it, else None."""
    wandb = None
    if config["wandb_log"]:  # first: it may fail, and nothing is logged yet
        import wandb

        wandb.init(project=config["wandb_project"], name=config["wandb_run_name"], config=config)
    end_line(path)
    write(path, dict(type="start", model_type=config["model_type"],
                     num_params=model.get_num_params(), world_size=world_size,
                     tokens_per_iter=tokens_per_iter(config), iter_num=iter_num,
                     init_from=config["init_from"], config=config, model_args=model_args,
                     data=data_identity))
    return wandb


def evaluation(path, iter_num, losses, best_val_loss, wandb):
    """An eval record; returns whether val improved on best_val_loss. Written before the
    checkpoints: if they are never saved, the resumed launch's records replace it."""
    improved = math.isfinite(losses["train_loss"]) and losses["val_loss"] < best_val_loss
    best = losses["val_loss"] if improved else best_val_loss
    record = dict(type="eval", iter=iter_num, **losses, best_val_loss=best, best=improved)
    write(path, record, wandb)
    return improved


def step(path, iter_num, numbers, lr, dt, config, mfu, wandb):
    write(path, dict(type="train", iter=iter_num, **numbers, lr=lr, ms_per_iter=dt * 1000,
                     tokens_per_s=tokens_per_iter(config) / dt, mfu=mfu), wandb)


def tokens_per_iter(config):
    return config["gradient_accumulation_steps"] * config["batch_size"] * config["block_size"]


def write(path, record, wandb=None):
    try:
        print(console_line(record))
    except BrokenPipeError:  # stdout's reader went away: its SIGPIPE stops the run
        to_devnull(sys.stdout)
    append(path, record)
    if wandb:
        wandb.log(dict(flat(record, record["type"])))


def append(path, record):
    """Append a record and the time as strict JSON: a non-finite number becomes null, named
    under "nonfinite"."""
    nonfinite = [name for name, value in flat(record) if not math.isfinite(value)]
    record = json.loads(json.dumps(record), parse_constant=lambda constant: None)  # NaN → null
    record["time"] = time.time()
    if nonfinite:
        record["nonfinite"] = nonfinite
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
    except OSError as e:
        raise UserError(write_problem(path, e)) from None


def end_line(path):
    """After a partial last line (a launch killed mid-record), start a new one."""
    if os.path.isfile(path) and os.path.getsize(path):
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


def flat(value, name=""):
    """(name/key/..., number) for each number in nested dicts and lists (items from 1)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        yield name, value
    elif isinstance(value, (dict, list)):
        items = value.items() if isinstance(value, dict) else enumerate(value, 1)
        for key, item in items:
            yield from flat(item, f"{name}/{key}" if name else str(key))
