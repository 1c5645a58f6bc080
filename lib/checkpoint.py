"""
Everything about a checkpoint: what it holds, writing it, reading it back and checking it.
out_dir/ckpt.pt holds the latest state, all a resumed run needs; out_dir/best.pt the model of the
best evaluation. Both are dicts of tensors and plain values, which weights_only=True loads.
"""

import os
import zipfile

import torch
import torch.distributed as dist

from lib import data, settings
from lib.cli import UserError, write_atomically

FORMAT = "train.py checkpoint v1"  # bump when the checkpoint layout changes
MODEL_KEYS = ("format", "model_type", "model_args", "model", "config", "iter_num", "best_val_loss")
TRAINING_KEYS = MODEL_KEYS + ("last_eval_iter", "first_val_loss", "data", "optimizer", "scaler",
                              "rng")
LAUNCH_KEYS = ("init_from", "overwrite", "new_data", "eval_only")  # not settings of the run


def states(config, model, optimizer, scaler, rng, **progress):
    """(best.pt's state, ckpt.pt's): the model, its settings and the run's progress (iter_num,
    best_val_loss, last_eval_iter, first_val_loss, data: its identity); ckpt.pt adds AdamW's,
    the scaler's and every rank's random states."""
    best = dict(format=FORMAT, model_type=config["model_type"], config=config,
                model_args=settings.model_args_of(config), model=model.state_dict(), **progress)
    return best, dict(best, optimizer=optimizer.state_dict(), scaler=scaler.state_dict(), rng=rng)


def named_tensors(value, name=""):
    """(name/key/..., tensor) for every tensor in nested dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (dict, list, tuple)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            yield from named_tensors(item, f"{name}/{key}" if name else str(key))


def save_checkpoint(path, state):
    """torch.save, atomically; the size given counts a shared storage (the tied embedding and
    head) once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for _, t in named_tensors(state)}
    write_atomically(path, lambda f: torch.save(state, f), size=sum(storages.values()))


def load_checkpoint(path, keys=MODEL_KEYS, mmap=False):
    """A checkpoint train.py wrote that holds `keys`, on the CPU; mmap maps its tensors."""
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path} — train one first")
    check_crc(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception:  # not torch's advice, weights_only=False: it would run the file's code
        raise UserError(f"{path} is not a checkpoint written by train.py, or it is damaged: "
                        "use a good copy, or train again") from None
    missing = [key for key in keys if not isinstance(state, dict) or key not in state]
    if missing:
        raise UserError(f"{path} is not a checkpoint written by train.py: it lacks "
                        f"{', '.join(missing)}")
    if state["format"] != FORMAT:
        raise UserError(f"{path} has format {state['format']!r}; this train.py reads {FORMAT!r}")
    return state


def check_crc(path):
    """Refuse a file whose bytes changed on disk: testzip() checks each member's CRC32."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # the first member that fails, or None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return  # not a zip: torch.load says so
    if damaged:
        raise UserError(f"{path} is damaged: its member {damaged} fails its CRC32 check — restore "
                        "a good copy of it, or train again")


def model_from_checkpoint(saved):
    try:
        model = settings.build_model(saved["model_type"], saved["model_args"])
        model.load_state_dict(saved["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:  # KeyError: an unknown model
        why = str(e).splitlines()[0]
        raise UserError(f"the checkpoint does not fit model_{saved['model_type']}: {why}") from None
    return model


def load_resumable(path, config):
    """ckpt.pt, checked to hold a training state of the model the config asks for."""
    saved = load_checkpoint(path, TRAINING_KEYS)
    if saved["model_type"] != config["model_type"]:
        raise UserError(f"cannot resume: the checkpoint holds model_type {saved['model_type']!r}, "
                        f"the config asks for {config['model_type']!r}")
    recorded = settings.saved_model_args(saved["model_type"], saved["model_args"])
    differ = [f"{key} (checkpoint {recorded.get(key)!r}, config {value!r})"
              for key, value in settings.model_args_of(config).items()
              if recorded.get(key) != value]
    if differ:
        raise UserError(f"cannot resume: model settings differ from the checkpoint's: "
                        f"{', '.join(differ)}")
    return saved


def check_resumed_data(saved, config, identity):
    """A resume on other data needs new_data; say which settings changed."""
    recorded, out_dir, iter_num = saved["data"], config["out_dir"], saved["iter_num"]
    new_val = recorded["val_sha256"] != identity["val_sha256"]
    if (new_val or recorded["train_sha256"] != identity["train_sha256"]) and not config["new_data"]:
        raise UserError(f"cannot resume: {out_dir}/ckpt.pt trained on other data, "
                        f"{data.short_identity(recorded)}, than {data.short_identity(identity)}: "
                        "resume with that data, or pass --new_data=True")
    if new_val:  # best.pt starts afresh, the old one kept: val losses compare on one val.bin only
        saved["best_val_loss"], saved["first_val_loss"] = float("inf"), None
        stem, number = os.path.join(out_dir, f"best-val-{recorded['val_sha256'][:12]}"), 1
        kept = f"{stem}.pt"
        while os.path.exists(kept):  # never over a file kept before
            number += 1
            kept = f"{stem}-{number}.pt"
        if os.path.isfile(f"{out_dir}/best.pt"):
            os.replace(f"{out_dir}/best.pt", kept)
            print(f"new_data=True: best.pt starts afresh; the previous one is kept as {kept}")
    before, max_iters = saved["config"], config["max_iters"]
    changed = [f"{key} {before[key]!r} → {value!r}" for key, value in config.items()
               if key in before and key not in LAUNCH_KEYS and before[key] != value]
    if changed:
        print(f"resumed with settings that differ from the checkpoint's: {', '.join(changed)}")
    if nothing_to_train(saved, config):
        print(f"{out_dir}/ckpt.pt is at iteration {iter_num} and max_iters is {max_iters}: "
              "nothing to train")
    else:
        print(f"resumed from iteration {iter_num} of {max_iters}")


def nothing_to_train(saved, config):
    return saved["iter_num"] >= config["max_iters"] and saved["last_eval_iter"] == saved["iter_num"]


def restore(saved, model, optimizer, scaler, batch_generator, rank):
    """Loads ckpt.pt into the model, AdamW, the scaler and this rank's random states (the
    weights leave `saved`, not to be held twice)."""
    model.load_state_dict(saved.pop("model"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    if saved["scaler"]:  # empty when saved without fp16
        scaler.load_state_dict(saved["scaler"])
    if rank < len(saved["rng"]):  # new ranks keep their seeds
        rng = saved["rng"][rank]
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_initialized():
            torch.cuda.set_rng_state(rng["cuda"])
        batch_generator.set_state(rng["batches"])


def rng_states(batch_generator, world_size):
    """Every rank's random states, on every rank: torch's (dropout), CUDA's and the batches'."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
    state = dict(torch=torch.get_rng_state(), cuda=cuda, batches=batch_generator.get_state())
    if world_size == 1:
        return [state]
    states = [None] * world_size
    dist.all_gather_object(states, state)
    return states
