"""
Checkpoints: what train.py saves in out_dir/ckpt.pt, and how it is read back (train.py to
resume, sample.py and the other scripts to load the model).

A checkpoint is a dict of plain tensors and Python values (torch.load with weights_only=True
reads it): the model's type and GPTConfig fields, its weights, AdamW's state, the config, the
iteration, the best val loss so far, and every random state training reads, one per process,
so that a resumed run draws exactly what an unbroken one would.
"""

import os
import random

import numpy as np
import torch

import settings
from cli import UserError

FORMAT = "train.py checkpoint v1"  # bump when the checkpoint layout changes
KEYS = ("format", "model_type", "model_args", "model", "optimizer", "scaler",
        "config", "iter_num", "best_val_loss", "rng")


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
    """Write atomically: a crash mid-save leaves the previous checkpoint whole."""
    tmp_path = path + ".tmp"
    torch.save(checkpoint, tmp_path)
    os.replace(tmp_path, path)


def load_checkpoint(path):
    """A checkpoint train.py wrote (on the CPU); UserError saying what is wrong otherwise."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path} — train one first (python train.py CONFIG --out_dir={os.path.dirname(path) or '.'})")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged or foreign file; torch's own advice (weights_only=False) would run its code
        reason = "not a complete torch file" if isinstance(e, RuntimeError) else "it holds objects train.py never saves"
        raise UserError(f"{path} is not a checkpoint written by train.py, or it is damaged ({reason}): "
                        f"train again into a new --out_dir, or resume from a good copy") from None
    missing = [key for key in KEYS if not isinstance(checkpoint, dict) or key not in checkpoint]
    if missing:
        raise UserError(f"{path} is not a checkpoint written by train.py: it lacks {', '.join(missing)}")
    if checkpoint["format"] != FORMAT:
        raise UserError(f"{path} has format {checkpoint['format']!r}; this train.py reads {FORMAT!r}")
    if checkpoint["model_type"] not in settings.MODELS:
        raise UserError(f"{path} holds an unknown model_type {checkpoint['model_type']!r} (known: {', '.join(settings.MODELS)})")
    return checkpoint


def model_from_checkpoint(checkpoint):
    """The GPT of the checkpoint's model_type, with its weights."""
    try:
        model = settings.build_model(checkpoint["model_type"], checkpoint["model_args"])
        model.load_state_dict(checkpoint["model"])
    except (TypeError, ValueError, RuntimeError) as e:
        raise UserError(f"the checkpoint does not fit model_{checkpoint['model_type']}.py: {e}".splitlines()[0]) from None
    return model


def check_resume(checkpoint, config, model_args):
    """The checkpoint must hold the model the config asks for."""
    if checkpoint["model_type"] != config["model_type"]:
        raise UserError(
            f"cannot resume: the checkpoint holds model_type {checkpoint['model_type']!r}, "
            f"the config asks for {config['model_type']!r}"
        )
    differ = [f"{key} (checkpoint {checkpoint['model_args'].get(key)!r}, config {value!r})"
              for key, value in model_args.items() if checkpoint["model_args"].get(key) != value]
    if differ:
        raise UserError(f"cannot resume: model settings differ from the checkpoint's: {', '.join(differ)}")


def training_state(config, model_args, model, optimizer, scaler, iter_num, best_val_loss, rng):
    """The checkpoint of a run at iter_num: everything a resumed run needs."""
    return dict(format=FORMAT, model_type=config["model_type"], model_args=model_args,
                model=model.state_dict(), optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                config=config, iter_num=iter_num, best_val_loss=best_val_loss, rng=rng)


def resume(path, config, model_args, model, optimizer, scaler, batch_generator, rank):
    """Loads the checkpoint at path into the model, the optimizer, the fp16 scaler and this rank's
    random states; returns (iter_num, best_val_loss)."""
    checkpoint = load_checkpoint(path)
    check_resume(checkpoint, config, model_args)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if checkpoint["scaler"]:  # empty when saved without fp16
        scaler.load_state_dict(checkpoint["scaler"])
    if rank < len(checkpoint["rng"]):  # ranks beyond the saving run's keep their fresh seeds
        set_rng_state(checkpoint["rng"][rank], batch_generator)
    return checkpoint["iter_num"], checkpoint["best_val_loss"]
