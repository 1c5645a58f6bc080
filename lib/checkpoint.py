"""
What train.py writes in a run's folder, out_dir, and how it is read back:

    out_dir/log.jsonl   JSON lines: a "start" record per launch, "train" records every
                        log_interval steps, "eval" records at every loss estimate, and an
                        "eval_only" record for each --eval_only evaluation. Strict JSON: a
                        non-finite number is written as null and named in "nonfinite".
    out_dir/ckpt.pt     the latest state: model, AdamW's state, the config, the iteration, the
                        best val loss so far, every random state training reads (one per
                        process, so that a resumed run draws exactly what an unbroken one
                        would) and the identity of the data. Written at every evaluation, at
                        the end and when a signal stops the run; train.py resumes from it.
    out_dir/best.pt     the model of the evaluation with the lowest val loss (no optimizer
                        state). sample.py and visualize.py load it unless told otherwise.
    out_dir/train.lock  held while train.py runs (lib/guards.py).

Checkpoints are dicts of plain tensors and Python values (torch.load with weights_only=True
reads them), written under a temporary name and then renamed, so a crash mid-save leaves the
previous file whole. lib/guards.py checks them as they are read back (guards.load_checkpoint).
"""

import json
import math
import os
import random
import time

import numpy as np
import torch

from lib import settings
from lib.cli import ConfigError, UserError, write_atomically, write_problem

FORMAT = "train.py checkpoint v1"  # bump when the checkpoint layout changes
MODEL_KEYS = ("format", "model_type", "model_args", "model", "config", "iter_num", "best_val_loss")
TRAINING_KEYS = MODEL_KEYS + ("optimizer", "scaler", "rng")  # and last_eval_iter, absent in older files
FILES = {"latest": "ckpt.pt", "best": "best.pt"}
RUN_FILES = ("ckpt.pt", "best.pt", "log.jsonl")  # what a run leaves in its out_dir


# --------------------------------------------------------------------------------------
# what the checkpoints hold


def model_state(config, model_args, model, iter_num, best_val_loss, data_identity):
    """best.pt: the model at iter_num, whose val loss is best_val_loss, and the data it trained on."""
    return dict(format=FORMAT, model_type=config["model_type"], model_args=model_args, model=model.state_dict(),
                config=config, iter_num=iter_num, best_val_loss=best_val_loss, data=data_identity)


def training_state(config, model_args, model, optimizer, scaler, iter_num, best_val_loss, rng, last_eval_iter,
                   data_identity, first_val_loss):
    """ckpt.pt: everything a resumed run needs, at iter_num; last_eval_iter says whether the
    evaluation at iter_num (if it is an eval step) is done, so a resumed run knows to make it;
    first_val_loss is the run's first evaluation's, which later ones are compared with."""
    return dict(model_state(config, model_args, model, iter_num, best_val_loss, data_identity),
                optimizer=optimizer.state_dict(), scaler=scaler.state_dict(), rng=rng, last_eval_iter=last_eval_iter,
                first_val_loss=first_val_loss)


def save_checkpoint(path, state):
    """torch.save, atomically (cli.write_atomically). The size given for the free-space check counts
    each storage once: the tied token embedding and output head share one."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for _, t in named_tensors(state)}
    write_atomically(path, lambda f: torch.save(state, f), size=sum(storages.values()))


def restore(saved, model, optimizer, scaler, batch_generator, rank):
    """Loads a ckpt.pt (guards.Launch.load_resumable) into the model, the optimizer, the fp16 scaler and
    this rank's random states; returns (iter_num, best_val_loss, last_eval_iter). The weights and
    AdamW's state leave the checkpoint as they go in, so training does not hold them twice."""
    model.load_state_dict(saved.pop("model"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    if saved["scaler"]:  # empty when saved without fp16
        scaler.load_state_dict(saved["scaler"])
    if rank < len(saved["rng"]):  # ranks beyond the saving run's keep their fresh seeds
        set_rng_state(saved["rng"][rank], batch_generator)
    return saved["iter_num"], saved["best_val_loss"], saved["last_eval_iter"]


def check_which(which):
    """Refuse a --checkpoint setting other than 'best' or 'latest' (sample.py, visualize.py)."""
    if which not in FILES:
        raise ConfigError(f"checkpoint must be 'best' or 'latest', got {which!r}")


def model_path(out_dir, which="best"):
    """out_dir/best.pt ('best') or out_dir/ckpt.pt ('latest'). A run with no best.pt (one from
    before best.pt existed) gives its ckpt.pt, with a note."""
    check_which(which)
    path, latest = os.path.join(out_dir, FILES[which]), os.path.join(out_dir, FILES["latest"])
    if which == "best" and not os.path.isfile(path) and os.path.isfile(latest):
        print(f"note: {out_dir} has no best.pt; using its latest state, {latest}")
        return latest
    return path


def model_from_checkpoint(saved):
    """The GPT of the checkpoint's model_type, with its weights."""
    try:
        model = settings.build_model(saved["model_type"], saved["model_args"])
        model.load_state_dict(saved["model"])
    except (TypeError, ValueError, RuntimeError) as e:
        raise UserError(f"the checkpoint does not fit model_{saved['model_type']}.py: {e}".splitlines()[0]) from None
    return model


def named_tensors(value, name=""):
    """(path, tensor) for every tensor in a nested dict/list/tuple (a checkpoint)."""
    if isinstance(value, torch.Tensor):
        yield name, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        yield from named_tensors(item, f"{name}/{key}" if name else str(key))


# --------------------------------------------------------------------------------------
# random states: a resumed run draws what an unbroken one would


def get_rng_state(batch_generator):
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()  # plain ints load with weights_only
    return {
        "python": random.getstate(),
        "numpy": np_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
        "batches": batch_generator.get_state(),
    }


def set_rng_state(state, batch_generator):
    random.setstate(state["python"])
    np_state = state["numpy"]
    np_state["state"]["key"] = np.array(np_state["state"]["key"], dtype=np.uint32)
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])
    batch_generator.set_state(state["batches"])


# --------------------------------------------------------------------------------------
# the log


def log_event(path, record):
    """Print one record and append it to the log."""
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


def append_record(path, record):
    """Append one record (with the time) to the log as a JSON line of strict JSON: a non-finite
    number (which jq and JavaScript reject) becomes null, and the record lists its name under
    "nonfinite", e.g. ["val_loss"] or ["aux/future_attn_loss_per_layer/2"]."""
    nonfinite = []
    record = dict(finite_only(record, "", nonfinite), time=time.time())
    if nonfinite:
        record["nonfinite"] = nonfinite
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
    except OSError as e:
        raise UserError(write_problem(path, e)) from None


def end_line(path):
    """A launch killed mid-record leaves a partial last line: the next records start a new one."""
    if os.path.isfile(path) and os.path.getsize(path):
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


def finite_only(value, name, nonfinite):
    """value with every non-finite float replaced by None, whose names are appended to nonfinite."""
    if isinstance(value, float) and not math.isfinite(value):
        nonfinite.append(name)
        return None
    if isinstance(value, dict):
        return {key: finite_only(item, f"{name}/{key}" if name else key, nonfinite) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_only(item, f"{name}/{index}", nonfinite) for index, item in enumerate(value)]
    return value


def flat_aux(aux):
    """(name, value) for every auxiliary loss, a per-layer list giving name/1, name/2, ..."""
    for name, value in aux.items():
        if isinstance(value, list):
            yield from ((f"{name}/{layer}", v) for layer, v in enumerate(value, 1))
        else:
            yield name, value
