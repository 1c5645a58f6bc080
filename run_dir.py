"""
A run's folder, out_dir: one run per folder, one process at a time, and its log.

train.py locks out_dir/train.lock while it runs, and appends JSON lines to out_dir/log.jsonl:
a "start" record per launch, "train" records every log_interval steps, "eval" records at
every loss estimate, and an "eval_only" record for each --eval_only evaluation (kept apart
from the run's own). report.py and study.py read them back. The checkpoints are
checkpoint.py's: ckpt.pt (the latest state) and best.pt (the best model).
"""

import fcntl
import json
import os
import socket
import time
from contextlib import suppress

from cli import UserError, write_problem

RUN_FILES = ("ckpt.pt", "best.pt", "log.jsonl")  # what a run leaves in its out_dir


def claim_out_dir(config):
    """Create and lock out_dir for this process; returns the open lock file (closing it unlocks).

    A second process on the same folder is refused, naming the holder. The lock is the
    kernel's (flock), so it ends with its process, however that dies (kill -9 included).
    A new run (init_from='scratch') refuses a folder that holds a run unless overwrite=True."""
    out_dir = config["out_dir"]
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, "train.lock"), "a+")
    except OSError as e:
        raise UserError(f"cannot create out_dir {out_dir} ({e.strerror}): choose another --out_dir") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise UserError(f"{out_dir} is in use by {holder}: wait for it to end, or choose another --out_dir") from None
    lock.truncate(0)
    lock.write(f"train.py (process {os.getpid()} on {socket.gethostname()})\n")
    lock.flush()
    for name in ("ckpt.pt.tmp", "best.pt.tmp"):  # left by a save that was killed (kill -9)
        with suppress(FileNotFoundError):
            os.remove(os.path.join(out_dir, name))
    existing = [name for name in RUN_FILES if os.path.exists(os.path.join(out_dir, name))]
    if config["init_from"] == "scratch" and existing:
        if not config["overwrite"]:
            lock.close()
            if "ckpt.pt" not in existing:  # nothing to resume from
                raise UserError(f"{out_dir} holds the log of a run that stopped before its first checkpoint: start "
                                f"it again with --overwrite=True (deletes {', '.join(existing)}), or use another --out_dir")
            raise UserError(
                f"{out_dir} already holds a run ({', '.join(existing)}): continue it with --init_from=resume, "
                f"start this one in another --out_dir, or replace it with --overwrite=True (deletes {', '.join(existing)})"
            )
        for name in existing:
            os.remove(os.path.join(out_dir, name))
        print(f"overwrite=True: deleted {', '.join(existing)} in {out_dir}")
    return lock


def end_line(path):
    """A launch killed mid-record leaves a partial last line: start the next records on a new one."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")


def append_record(path, record):
    """Append one record (with the time) to the log as a JSON line."""
    record = dict(record, time=time.time())
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        raise UserError(write_problem(path, e)) from None


def log_event(path, record):
    """Print one record and append it as a JSON line."""
    kind = record["type"]
    if kind == "start":
        c = record["config"]
        print(f"{record['model_type']}: {record['num_params']:,} parameters; world size {record['world_size']}")
        print(f"tokens per iteration: {c['gradient_accumulation_steps']} micro-steps × {c['batch_size']} "
              f"sequences × {c['block_size']} tokens = {record['tokens_per_iter']:,}")
    elif kind == "train":
        aux = "".join(f", {k} {v:.4f}" for k, v in record["aux"].items() if not isinstance(v, list))
        mfu = f", mfu {record['mfu'] * 100:.1f}%" if record.get("mfu") is not None else ""
        print(f"iter {record['iter']}: loss {record['loss']:.4f}{aux}, lr {record['lr']:.2e}, "
              f"{record['ms_per_iter']:.1f} ms/iter, {record['tokens_per_s']:,.0f} tokens/s{mfu}")
    else:
        best = ", the best so far" if record["best"] else f" (best {record['best_val_loss']:.4f})"
        print(f"eval at iter {record['iter']}: train loss {record['train_loss']:.4f}, "
              f"val loss {record['val_loss']:.4f}{best}")
    append_record(path, record)
