"""
A run's folder, out_dir, and the files train.py writes there; how they are read back (train.py
to resume, sample.py and the other scripts to load a model, report.py and study.py the log).

    out_dir/train.lock  held while train.py runs: one process per folder, named in the file
                        (FolderLock; study.py locks its out_root the same way).
    out_dir/log.jsonl   JSON lines: a "start" record per launch, "train" records every
                        log_interval steps, "eval" records at every loss estimate, and an
                        "eval_only" record for each --eval_only evaluation (kept apart from
                        the run's own). Strict JSON: a non-finite number is written as null
                        and named in the record's "nonfinite" list.
    out_dir/ckpt.pt     the latest state: written at every evaluation, at the end, and when a
                        signal stops the run. Model, AdamW's state, the config, the iteration,
                        the best val loss so far, and every random state training reads, one
                        per process, so that a resumed run draws exactly what an unbroken one
                        would, and the identity of the data (data.check_data). train.py
                        resumes from it. Never written with a non-finite weight or optimizer
                        value.
    out_dir/best.pt     the model of the evaluation with the lowest val loss (no optimizer
                        state). sample.py and visualize.py load it unless told otherwise.

The checkpoints are dicts of plain tensors and Python values (torch.load with weights_only=True
reads them), written under a temporary name and then renamed: a crash, a full disk or a second
Ctrl-C mid-save leaves the previous file whole. Reading one checks the CRC32 that torch's zip
container stores for every member, so bits that changed on disk are refused, not trained on.
"""

import fcntl
import json
import math
import os
import random
import socket
import time
import zipfile
from contextlib import suppress

import numpy as np
import torch

from lib import data, settings
from lib.cli import UserError, write_atomically, write_problem

FORMAT = "train.py checkpoint v1"  # bump when the checkpoint layout changes
MODEL_KEYS = ("format", "model_type", "model_args", "model", "config", "iter_num", "best_val_loss")
TRAINING_KEYS = MODEL_KEYS + ("optimizer", "scaler", "rng")  # and last_eval_iter, absent in older files
FILES = {"latest": "ckpt.pt", "best": "best.pt"}
RUN_FILES = ("ckpt.pt", "best.pt", "log.jsonl")  # what a run leaves in its out_dir


# --------------------------------------------------------------------------------------
# the run's folder: one run per folder, one process at a time


class FolderLock:
    """This process's lock on FOLDER/NAME, a file that names the holder: the kernel's (flock), so
    it ends with its process, however that dies (kill -9 included); close() unlocks. A second
    process is refused at once, in one line that names the holder. The folder is created if
    need be; undo() removes what the lock created, so a script that fails before writing
    anything leaves nothing behind."""

    def __init__(self, folder, name, program, option):
        self.folder, self.path = folder, os.path.join(folder, name)
        made = []  # the folders makedirs is about to create, the deepest first
        parent = os.path.abspath(folder)
        while not os.path.exists(parent):
            made.append(parent)
            parent = os.path.dirname(parent)
        try:
            os.makedirs(folder, exist_ok=True)
            new_file = not os.path.exists(self.path)
            self.file = open(self.path, "a+")
        except OSError as e:
            raise UserError(f"cannot create {option} {folder} ({e.strerror}): choose another --{option}") from None
        self.created = [self.path] * new_file + made  # what undo() removes, in this order
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise UserError(f"{folder} is in use by {holder}: wait for it to end, or choose another --{option}") from None
        self.file.truncate(0)
        self.file.write(f"{program} (process {os.getpid()} on {socket.gethostname()})\n")
        self.file.flush()
        self.keep()

    def contents(self):
        """Every entry of the folder but the lock file, with its size: what the script wrote."""
        return {entry.name: entry.stat().st_size for entry in os.scandir(self.folder) if entry.path != self.path}

    def keep(self):
        """The folder as it is now counts as untouched: undo() removes nothing once it holds more."""
        self.untouched = self.contents()

    def close(self):
        self.file.close()

    def undo(self):
        """Unlock; when nothing was written to the folder since the lock was taken, also remove
        the lock file and the folders, if the lock created them (only those)."""
        if self.contents() == self.untouched:
            for path in self.created:
                with suppress(OSError):  # a folder that holds something else stays
                    (os.remove if path == self.path else os.rmdir)(path)
        self.close()


def claim_out_dir(config):
    """Create and lock out_dir for this process: a FolderLock on out_dir/train.lock.
    A new run (init_from='scratch') refuses a folder that holds a run unless overwrite=True."""
    out_dir = config["out_dir"]
    lock = FolderLock(out_dir, "train.lock", "train.py", "out_dir")
    for name in ("ckpt.pt.tmp", "best.pt.tmp"):  # left by a save that was killed (kill -9)
        with suppress(FileNotFoundError):
            os.remove(os.path.join(out_dir, name))
    existing = [name for name in RUN_FILES if os.path.exists(os.path.join(out_dir, name))]
    if config["init_from"] == "scratch" and existing:
        if not config["overwrite"]:
            lock.undo()
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
    lock.keep()  # the deletions above count as done before the run
    return lock


# --------------------------------------------------------------------------------------
# the log


def end_line(path):
    """A launch killed mid-record leaves a partial last line: start the next records on a new one."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")


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


# --------------------------------------------------------------------------------------
# checkpoints: random states, saving, loading


def get_rng_state(batch_generator):
    """Every random state training reads, so a resumed run draws what an unbroken one would."""
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


def save_checkpoint(path, checkpoint):
    """Write atomically (see write_atomically): a crash mid-save leaves the previous file whole.
    A state holding a non-finite tensor is refused (UserError), and the previous file kept."""
    bad = nonfinite_tensors(checkpoint)
    if bad:
        raise UserError(f"not saving {path}: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} hold non-finite "
                        f"values; the previous {os.path.basename(path)} is kept")
    size = sum(t.numel() * t.element_size() for _, t in named_tensors(checkpoint))
    write_atomically(path, lambda f: torch.save(checkpoint, f), size=size)


def nonfinite_tensors(state):
    """The names (model/..., optimizer/...) of the floating-point tensors in a checkpoint that hold
    a NaN or an infinity. One read per device for the whole state (a GPU syncs once); the names
    are looked for only when something is not finite."""
    named = [(name, t) for name, t in named_tensors(state) if t.is_floating_point()]
    finite_by_device = {}  # AdamW's step counts stay on the CPU while the weights are on a GPU
    for _, t in named:
        finite_by_device.setdefault(t.device, []).append(torch.isfinite(t).all())
    if all(torch.stack(finite).all().item() for finite in finite_by_device.values()):
        return []
    return [name for name, t in named if not torch.isfinite(t).all()]


def named_tensors(value, name=""):
    """(path, tensor) for every tensor in a nested dict/list/tuple (a checkpoint)."""
    if isinstance(value, torch.Tensor):
        yield name, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        yield from named_tensors(item, f"{name}/{key}" if name else str(key))


def load_checkpoint(path, keys=MODEL_KEYS):
    """A checkpoint train.py wrote (on the CPU) holding `keys` (TRAINING_KEYS to resume from);
    UserError saying what is wrong otherwise."""
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        if os.path.isfile(os.path.join(folder, "log.jsonl")):
            raise UserError(f"no checkpoint at {path}: the run in {folder} stopped before its first one — start it "
                            f"again with --overwrite=True (deletes its log.jsonl), or use another --out_dir")
        raise UserError(f"no checkpoint at {path} — train one first (python train.py CONFIG --out_dir={folder})")
    check_crc(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged or foreign file; torch's own advice (weights_only=False) would run its code
        reason = "not a complete torch file" if isinstance(e, RuntimeError) else "it holds objects train.py never saves"
        raise UserError(f"{path} is not a checkpoint written by train.py, or it is damaged ({reason}): "
                        f"train again into a new --out_dir, or resume from a good copy") from None
    missing = [key for key in keys if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        ours = isinstance(checkpoint, dict) and "format" in checkpoint  # best.pt, say, where ckpt.pt was asked for
        what = "a checkpoint to resume from (best.pt holds a model only)" if ours else "a checkpoint"
        raise UserError(f"{path} is not {what} written by train.py: it lacks {', '.join(missing)}")
    if checkpoint["format"] != FORMAT:
        raise UserError(f"{path} has format {checkpoint['format']!r}; this train.py reads {FORMAT!r}")
    if checkpoint["model_type"] not in settings.MODELS:
        raise UserError(f"{path} holds an unknown model_type {checkpoint['model_type']!r} (known: {', '.join(settings.MODELS)})")
    return checkpoint


def check_crc(path):
    """Refuse a checkpoint whose bytes changed after it was written: torch's zip container stores a
    CRC32 per member, and ZipFile.testzip() reads every member against it. A file that is not a
    zip at all is left to torch.load, whose failure says so."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # the first member whose bytes fail their CRC32, or None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return
    if damaged:
        folder, name = os.path.split(path)
        advice = {  # what else the run's folder may offer
            "ckpt.pt": f"; {os.path.join(folder, 'best.pt')} (the best model, no optimizer state) may be whole",
            "best.pt": f", or load the latest state instead (--checkpoint=latest, {os.path.join(folder, 'ckpt.pt')})",
        }.get(name, "")
        raise UserError(f"{path} is damaged: its member {damaged} fails its CRC32 check (the file changed on disk "
                        f"after it was written) — restore a good copy of it, or train again{advice}")


def saved_iteration(path):
    """The iteration of a checkpoint, read without loading its tensors into memory (study.py
    reads it for every run folder); the UserError of load_checkpoint for a file it cannot read."""
    check_crc(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)["iter_num"]
    except Exception:
        return load_checkpoint(path, TRAINING_KEYS)["iter_num"]  # raises the UserError that says why


def model_path(out_dir, which="best"):
    """out_dir/best.pt ('best') or out_dir/ckpt.pt ('latest'). A run with no best.pt (one from
    before best.pt existed) gives its ckpt.pt, with a note."""
    if which not in FILES:
        raise UserError(f"checkpoint must be 'best' or 'latest', got {which!r}")
    path = os.path.join(out_dir, FILES[which])
    latest = os.path.join(out_dir, FILES["latest"])
    if which == "best" and not os.path.isfile(path) and os.path.isfile(latest):
        print(f"note: {out_dir} has no best.pt; using its latest state, {latest}")
        return latest
    return path


def model_from_checkpoint(checkpoint):
    """The GPT of the checkpoint's model_type, with its weights."""
    try:
        model = settings.build_model(checkpoint["model_type"], checkpoint["model_args"])
        model.load_state_dict(checkpoint["model"])
    except (TypeError, ValueError, RuntimeError) as e:
        raise UserError(f"the checkpoint does not fit model_{checkpoint['model_type']}.py: {e}".splitlines()[0]) from None
    return model


# --------------------------------------------------------------------------------------
# resuming: what ckpt.pt and best.pt hold, and reading ckpt.pt back into a run


def check_resume(checkpoint, config, model_args):
    """The checkpoint must hold the model the config asks for."""
    if checkpoint["model_type"] != config["model_type"]:
        raise UserError(
            f"cannot resume: the checkpoint holds model_type {checkpoint['model_type']!r}, "
            f"the config asks for {config['model_type']!r}"
        )
    saved = settings.saved_model_args(checkpoint["model_type"], checkpoint["model_args"])
    differ = [f"{key} (checkpoint {saved.get(key)!r}, config {value!r})"
              for key, value in model_args.items() if saved.get(key) != value]
    if differ:
        raise UserError(f"cannot resume: model settings differ from the checkpoint's: {', '.join(differ)}")


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


LAUNCH_KEYS = ("init_from", "overwrite", "new_data", "eval_only")  # how a launch starts, not what it trains


def changed_settings(checkpoint, config):
    """'key old → new, ...' for every setting of config that differs from the checkpoint's config
    (keys the checkpoint predates left out), or None."""
    saved = checkpoint["config"]
    changed = [f"{key} {saved[key]!r} → {value!r}" for key, value in config.items()
               if key in saved and key not in LAUNCH_KEYS and saved[key] != value]
    return ", ".join(changed) or None


def check_data_identity(checkpoint, identity, new_data, out_dir):
    """Resuming on other data is refused unless new_data; with it, best.pt starts afresh when the val
    data changed (a val loss compares only with those measured on the same val data): the previous
    best.pt is renamed, and the checkpoint's best_val_loss and first_val_loss are reset."""
    saved = checkpoint.get("data")
    if saved is None:  # written before checkpoints recorded their data
        print(f"note: {out_dir}/ckpt.pt does not record the data it trained on; from now on it records "
              f"{data.short_identity(identity)}")
        return
    same = [split for split in ("train", "val") if saved[f"{split}_sha256"] == identity[f"{split}_sha256"]]
    if len(same) == 2:
        return
    if not new_data:
        raise UserError(f"cannot resume: {out_dir}/ckpt.pt trained on other data, {data.short_identity(saved)}, than "
                        f"{data.short_identity(identity)}: resume with that data, or pass --new_data=True to train "
                        f"on this data from here")
    print(f"new_data=True: training on {data.short_identity(identity)} from here (before: {data.short_identity(saved)})")
    if "val" in same:
        return
    checkpoint["best_val_loss"], checkpoint["first_val_loss"] = float("inf"), None
    best = os.path.join(out_dir, "best.pt")
    if os.path.isfile(best):
        kept, number = os.path.join(out_dir, f"best-val-{saved['val_sha256'][:12]}.pt"), 1
        while os.path.exists(kept):  # a name no earlier change of data took
            number += 1
            kept = os.path.join(out_dir, f"best-val-{saved['val_sha256'][:12]}-{number}.pt")
        os.replace(best, kept)
        print(f"new_data=True: the val data changed, so best.pt starts afresh; the previous one is kept as {kept}")


def load_resumable(path, config, model_args):
    """The checkpoint at path, to resume the run config describes from: it must hold the training
    state, of the model the config asks for."""
    checkpoint = load_checkpoint(path, TRAINING_KEYS)
    check_resume(checkpoint, config, model_args)
    # a checkpoint without last_eval_iter was saved right after its evaluation
    checkpoint.setdefault("last_eval_iter", checkpoint["iter_num"])
    return checkpoint


def restore(checkpoint, model, optimizer, scaler, batch_generator, rank):
    """Loads a load_resumable checkpoint into the model, the optimizer, the fp16 scaler and this
    rank's random states; returns (iter_num, best_val_loss, last_eval_iter). The weights and
    AdamW's state leave the checkpoint as they go in, so training does not hold them twice."""
    model.load_state_dict(checkpoint.pop("model"))
    optimizer.load_state_dict(checkpoint.pop("optimizer"))
    if checkpoint["scaler"]:  # empty when saved without fp16
        scaler.load_state_dict(checkpoint["scaler"])
    if rank < len(checkpoint["rng"]):  # ranks beyond the saving run's keep their fresh seeds
        set_rng_state(checkpoint["rng"][rank], batch_generator)
    return checkpoint["iter_num"], checkpoint["best_val_loss"], checkpoint["last_eval_iter"]
