"""
The data folder of prepare_wikipedia.py: train.bin and val.bin (uint16 GPT-2 token ids) and
meta.json. A run checks it, identifies it by sha256, and holds a shared lock on it.
"""

import codecs
import contextlib
import fcntl
import hashlib
import json
import os

import numpy as np

from lib.cli import UserError

DEFAULT_DATA_DIR = "data/wikipedia"  # where prepare_wikipedia.py writes by default
PREPARE_COMMANDS = {"data/wikipedia": "python prepare_wikipedia.py",
                    "data/wikitext103": "python prepare_wikipedia.py --dataset wikitext103",
                    "data/wikitext2": "python prepare_wikipedia.py --dataset wikitext2"}
DATA_LOCK = "data.lock"


def check_data(data_dir, block_size, vocab_size):
    """Refuse data that would fail mid-run; returns its identity: data_dir and the sha256s."""
    identity = {"data_dir": data_dir}
    meta_path = os.path.join(data_dir, "meta.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        meta = {}
    except (OSError, ValueError) as e:
        raise UserError(f"{meta_path} cannot be read ({e}): prepare the data again") from None
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            command = PREPARE_COMMANDS.get(os.path.normpath(data_dir),
                                           f"python prepare_wikipedia.py --out_dir {data_dir}")
            raise UserError(f"no data at {path} — run `{command}` first")
        if not meta:  # nothing says how the file was made
            check_format(path)
        n_bytes = os.path.getsize(path)
        if n_bytes % 2:
            raise UserError(f"{path} has an odd number of bytes ({n_bytes:,}): prepare the data "
                            "again")
        if n_bytes // 2 < block_size + 1:
            raise UserError(f"{path} holds {n_bytes // 2} tokens, fewer than block_size + 1 = "
                            f"{block_size + 1}: prepare more text or lower --block_size")
        sha256 = identity[f"{split}_sha256"] = sha256_of(path)
        # meta.json is written last: a .bin that disagrees is of another preparation
        recorded = meta.get(split, {})
        if recorded.get("sha256", sha256) != sha256:
            raise UserError(f"{path} does not match the sha256 in {meta_path}: prepare it again")
        max_token_id = recorded.get("max_token_id")
        if max_token_id is None:  # not recorded: scan the tokens once
            max_token_id = int(np.memmap(path, dtype=np.uint16, mode="r").max())
        if max_token_id >= vocab_size:
            raise UserError(f"{path} holds token id {max_token_id}, beyond vocab_size "
                            f"{vocab_size}: set --vocab_size={max_token_id + 1} or more")
    if not meta:
        print(f"note: {data_dir} has no meta.json, so train.bin and val.bin cannot be checked "
              "against each other")
    return identity


def short_identity(identity):
    """'data/x (train 1a2b3c4d5e6f, val 7a8b9c0d1e2f)': a data identity in a message."""
    train, val = identity["train_sha256"][:12], identity["val_sha256"][:12]
    return f"{identity['data_dir']} (train {train}, val {val})"


def stamps(data_dir):
    """{name: (size, mtime)} of the data's files: a cheap look at whether they were rewritten."""
    found = {}
    for name in ("train.bin", "val.bin", "meta.json"):
        with contextlib.suppress(FileNotFoundError):
            stat = os.stat(os.path.join(data_dir, name))
            found[name] = (stat.st_size, stat.st_mtime_ns)
    return found


def lock_data_dir(data_dir, shared):
    """data_dir/data.lock, held shared by runs and exclusively by prepare_wikipedia.py; None
    if it is held the other way."""
    path = os.path.join(data_dir, DATA_LOCK)
    try:
        lock = open(path, "a+")
    except OSError:
        if not shared:
            raise
        lock = open(path, "r")
    try:
        fcntl.flock(lock, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def hold_for_reading(data_dir):
    """A run's shared lock on its data, a file to close; none if no lock file can be had."""
    try:
        lock = lock_data_dir(data_dir, shared=True)
    except OSError:
        return contextlib.nullcontext()
    if lock is None:
        raise UserError(f"{data_dir} is being written by prepare_wikipedia.py: wait for it to "
                        "end, or train from another --data_dir")
    return lock


def check_format(path):
    """Refuse a .bin of int32 or int64 ids or of text, which uint16 token data never looks like:
    ids below 65,536 leave every upper uint16 word zero, and text holds no zero byte."""
    words = np.fromfile(path, dtype=np.uint16, count=1 << 19)
    head, found = words.tobytes(), None
    if len(words) >= 4 and words.any() and not words[1::2].any():
        found = "int32 or int64 token ids"
    elif head and b"\0" not in head:
        with contextlib.suppress(UnicodeDecodeError):
            codecs.getincrementaldecoder("utf-8")().decode(head)  # may end mid-character
            found = "text"
    if found:
        raise UserError(f"{path} does not hold uint16 token ids: it looks like {found}; prepare "
                        "text with prepare_wikipedia.py --input, or write ids as np.uint16")


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
