"""
The data folder's guards. The token files prepare_wikipedia.py writes (data_dir/train.bin, val.bin:
flat uint16 GPT-2 token ids, nanoGPT's layout, and meta.json; train.py's get_batch reads them) are
checked before training starts; the sha256 of each file identifies the data a run trains on; and a
lock keeps prepare_wikipedia.py from rewriting a folder a run reads. A reader of the tutorial may
skip this file.
"""

import fcntl
import hashlib
import json
import os

import numpy as np

from lib.cli import UserError

DEFAULT_DATA_DIR = "data/wikipedia"  # where prepare_wikipedia.py writes by default
# the commands that make prepare_wikipedia.py's default folders (any other: --out_dir)
PREPARE_COMMANDS = {"data/wikipedia": "python prepare_wikipedia.py",
                    "data/wikitext2": "python prepare_wikipedia.py --dataset wikitext2"}
SNIFF_BYTES = 1 << 20  # how much of a .bin without meta.json is read to tell its format
DATA_LOCK = "data.lock"  # in a data folder: see lock_data_dir()
SLOW_HASH_BYTES = 1 << 30  # a file this large takes seconds to hash: say so first


def check_data(data_dir, block_size, vocab_size):
    """Refuse, before training starts, data that would fail mid-run: missing, damaged or short
    files, token ids beyond the vocabulary, or a train.bin and val.bin from two preparations.
    Returns the data's identity: {"data_dir", "train_sha256", "val_sha256"}, the hashes that
    meta.json records (checked against the files), or computed when there is no meta.json."""
    meta_path = os.path.join(data_dir, "meta.json")
    meta, identity = {}, {"data_dir": data_dir}
    if os.path.isfile(meta_path):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(f"{meta_path} cannot be read ({e}) — run prepare_wikipedia.py again") from None
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            command = PREPARE_COMMANDS.get(os.path.normpath(data_dir), f"python prepare_wikipedia.py --out_dir {data_dir}")
            raise UserError(f"no data at {path} — run `{command}` first")
        if not meta:  # nothing says how the file was made: make sure it is not something else
            check_format(path)
        n_bytes = os.path.getsize(path)
        if n_bytes % 2:
            raise UserError(f"{path} has an odd number of bytes ({n_bytes:,}), so it is not whole uint16 "
                            f"tokens: the file is damaged — prepare the data again")
        n_tokens = n_bytes // 2
        if n_tokens < block_size + 1:
            raise UserError(
                f"{path} holds {n_tokens} tokens, fewer than block_size + 1 = {block_size + 1}: "
                f"prepare more text or lower --block_size"
            )
        recorded = meta.get(split, {})
        # meta.json is written last by prepare_wikipedia.py: a .bin that disagrees with it comes
        # from another preparation (one interrupted between its renames, say)
        if "tokens" in recorded and recorded["tokens"] != n_tokens:
            raise UserError(f"{path} holds {n_tokens:,} tokens but {meta_path} records {recorded['tokens']:,}: "
                            f"the files come from different preparations — prepare the data again")
        if n_bytes >= SLOW_HASH_BYTES:
            print(f"hashing {path} ({n_bytes / 1e9:,.1f} GB) to identify the data, once per launch")
        identity[f"{split}_sha256"] = sha256_of(path)
        if "sha256" in recorded and identity[f"{split}_sha256"] != recorded["sha256"]:
            raise UserError(f"{path} does not match the sha256 in {meta_path}: the file changed after it was "
                            f"prepared — prepare the data again")
        max_token_id = recorded.get("max_token_id")
        if max_token_id is None:  # not recorded: scan the tokens once
            max_token_id = int(np.memmap(path, dtype=np.uint16, mode="r").max())
        if max_token_id >= vocab_size:
            raise UserError(f"{path} holds token id {max_token_id}, beyond vocab_size {vocab_size}: "
                            f"set --vocab_size={max_token_id + 1} or more, or prepare the data with this vocabulary")
    if not meta:
        print(f"note: {data_dir} has no meta.json, so train.bin and val.bin cannot be checked against "
              f"each other (prepare_wikipedia.py writes it last; without it, the preparation may not have finished)")
    return identity


def short_identity(identity):
    """'data/x (train 1a2b3c4d5e6f, val 7a8b9c0d1e2f)': a data identity in a message."""
    return f"{identity['data_dir']} (train {identity['train_sha256'][:12]}, val {identity['val_sha256'][:12]})"


def stamps(data_dir):
    """{file name: (size, modification time)} of the data's files (None for a missing one): a cheap
    check, at each evaluation, that nothing rewrote them since the run hashed them."""
    found = {}
    for name in ("train.bin", "val.bin", "meta.json"):
        try:
            stat = os.stat(os.path.join(data_dir, name))
            found[name] = (stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            found[name] = None
    return found


def lock_data_dir(data_dir, shared):
    """The lock between the runs that read a data folder and prepare_wikipedia.py, which writes it.

    A run holds a shared lock (fcntl.LOCK_SH) on data_dir/data.lock for as long as it trains; any
    number of runs can hold it together. prepare_wikipedia.py takes the same lock exclusively
    (LOCK_EX) while it writes: it cannot while a run reads the folder, a run cannot start while it
    writes, and two preparations exclude each other. Neither side waits (LOCK_NB).

    Returns the open lock file, which holds the lock until it is closed (or its process ends, however
    it ends), or None when the lock is held the other way. A reader opens an existing lock file
    read-only where it cannot write the folder; OSError where no lock file can be opened."""
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
    """A run's shared lock on its data folder (lock_data_dir), held until the returned file is
    closed. A folder being prepared now is refused. None where no lock file can be opened (a
    read-only folder, say): the run then relies on stamps() alone."""
    try:
        lock = lock_data_dir(data_dir, shared=True)
    except OSError:
        return None
    if lock is None:
        raise UserError(f"{data_dir} is being written by prepare_wikipedia.py (it holds "
                        f"{os.path.join(data_dir, DATA_LOCK)}): wait for it to end, or train from another --data_dir")
    return lock


def hold_for_writing(out_dir):
    """prepare_wikipedia.py's exclusive lock on out_dir (lock_data_dir) while it writes there, so that neither
    a run that trains from the folder nor a second preparation sees its files change under it."""
    if lock := lock_data_dir(out_dir, shared=False):
        return lock
    if reader := lock_data_dir(out_dir, shared=True):  # shared holders are runs, an exclusive one a preparation
        reader.close()
        raise UserError(f"a run is training from {out_dir} (it holds {os.path.join(out_dir, DATA_LOCK)}), "
                        "so its files cannot change now; HINT: wait for the run to end, or prepare into another "
                        "--out_dir")
    raise UserError(f"{out_dir} is in use by another prepare_wikipedia.py; HINT: wait for it to end, "
                    "or pass another --out_dir")


def check_format(path):
    """Refuse a .bin that holds something other than uint16 token ids, read from its start:
    int32 or int64 ids (of a vocabulary below 65,536, their upper halves are zeros) or text.
    Real token data has neither pattern: its common tokens (punctuation, ids below 256) give
    zero bytes that text has not, and its tokens vary at every position."""
    head = np.fromfile(path, dtype=np.uint8, count=SNIFF_BYTES)
    found = None
    for width, name in ((4, "int64"), (2, "int32")):  # uint16 words per token id
        words = head[: len(head) // (2 * width) * 2 * width].view(np.uint16).reshape(-1, width)
        if len(words) >= 2 and words[:, 0].any() and not words[:, 1:].any():
            found = f"{name} token ids (every token's upper {2 * width - 2} bytes are zeros)"
            break
    if found is None and len(head) and not (head == 0).any() and is_utf8(head.tobytes()):
        found = "text (UTF-8 without a single zero byte, which token ids would have)"
    if found:
        raise UserError(f"{path} does not hold uint16 token ids: it looks like {found}. Prepare text with "
                        f"`python prepare_wikipedia.py --input FILE --out_dir DIR`, or write your ids as uint16 "
                        f"(np.array(ids, dtype=np.uint16).tofile(path))")


def utf8_text(block, offset, name):
    """block, bytes of the file name from byte offset on, decoded as UTF-8; a UserError naming the first byte
    that is not UTF-8 text. A NUL is refused too: binary files hold them."""
    bad = block.find(b"\0")
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = e.start if bad < 0 else min(bad, e.start)
    if bad >= 0 and block[bad] == 0:
        raise UserError(f"{name} is not UTF-8 text: byte {offset + bad:,} is a NUL, as in binary files; "
                        "HINT: give text files only; if it is text, convert it to UTF-8 first")
    if bad >= 0:
        raise UserError(f"{name} is not UTF-8 text: byte {offset + bad:,} (0x{block[bad]:02x}) is not UTF-8; "
                        "HINT: convert it to UTF-8 first, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.txt` "
                        "for Latin-1 text, or leave it out")
    return text


def is_utf8(head):
    """Is head UTF-8, but for a character cut at its end?"""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 3
    return True


def sha256_of(path):
    """The SHA-256 of the file at path, as 64 hex digits."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
