"""
Tests of train.py's check of the data: it refuses data that is missing, short, beyond the
vocabulary or of another preparation, in one line, before it writes anything. Token files written
here.
Run: python -m pytest -q tests/test_train_data.py
"""

import hashlib
import json
import os

import numpy as np
import pytest

import train
from conftest import DATA_VOCAB, TINY, argv_for, flags, last_error

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# --------------------------------------------------------------------------------------
# the checks before training


def test_missing_or_short_data_is_one_clear_message(tmp_path, capsys):
    argv = flags(**{**TINY, "data_dir": str(tmp_path), "out_dir": str(tmp_path / "out")})
    assert train.main(argv) == 1
    assert last_error(capsys) == (f"error: no data at {tmp_path}/train.bin: prepare it with `python "
                                  f"prepare_wikipedia.py --input TEXT --out_dir={tmp_path}`\n")
    for split in ("train", "val"):
        np.arange(16, dtype=np.uint16).tofile(tmp_path / f"{split}.bin")  # a window needs 17 tokens
    assert train.main(argv) == 1
    assert last_error(capsys) == (f"error: {tmp_path}/train.bin must hold whole uint16 tokens, more than "
                                  "block_size: prepare the data again, or more of it\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("data_dir, command", [
    ("data/wikipedia", "python prepare_wikipedia.py"),
    ("data/wikitext2", "python prepare_wikipedia.py --dataset=wikitext2"),
    ("./data/wikitext103/", "python prepare_wikipedia.py --dataset=wikitext103"),
])
def test_missing_data_names_the_command_that_prepares_it(data_dir, command, tmp_path, monkeypatch, capsys):
    # the folders prepare_wikipedia.py writes by default: each has its own command
    monkeypatch.chdir(tmp_path)
    assert train.main(flags(**{**TINY, "data_dir": data_dir, "out_dir": "out"})) == 1
    assert last_error(capsys).endswith(f"train.bin: prepare it with `{command}`\n")


def write_data(path, train_tokens, val_tokens, meta=None):
    path.mkdir(exist_ok=True)
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        np.asarray(tokens, dtype=np.uint16).tofile(path / f"{split}.bin")
    if meta is not None:
        (path / "meta.json").write_text(json.dumps(meta))


def meta_of(path):
    """meta.json as prepare_wikipedia.py writes it for the .bin files in path."""
    meta = {}
    for split in ("train", "val"):
        tokens = np.fromfile(path / f"{split}.bin", dtype=np.uint16)
        sha256 = hashlib.sha256((path / f"{split}.bin").read_bytes()).hexdigest()
        meta[split] = dict(tokens=len(tokens), sha256=sha256,
                           max_token_id=int(tokens.max()))
    return meta


def test_data_is_checked_before_training(tmp_path, capsys):
    good = np.arange(100) % DATA_VOCAB
    data = tmp_path / "data"
    argv = argv_for(str(data), tmp_path / "out", max_iters=1)

    write_data(data, good, good)
    (data / "val.bin").write_bytes((data / "val.bin").read_bytes() + b"\x01")  # a half token
    assert train.main(argv) == 1
    assert f"{data}/val.bin must hold whole uint16 tokens" in last_error(capsys)

    beyond = good.copy()
    beyond[57] = DATA_VOCAB + 5
    write_data(data, beyond, good)  # no meta.json: the tokens are scanned
    assert train.main(argv) == 1
    assert f"{data}/train.bin holds token id {DATA_VOCAB + 5}: set --vocab_size to more" in last_error(capsys)
    write_data(data, good, good)
    meta = meta_of(data)
    meta["val"]["max_token_id"] = DATA_VOCAB  # a recorded range is trusted, not rescanned
    write_data(data, good, good, meta=meta)
    assert train.main(argv) == 1
    assert f"{data}/val.bin holds token id {DATA_VOCAB}: set --vocab_size to more" in last_error(capsys)

    # val.bin of another preparation: another length, or the same length and other tokens
    write_data(data, good, good)
    meta = meta_of(data)
    write_data(data, good, good[:-10], meta=meta)
    assert train.main(argv) == 1
    assert f"{data}/val.bin does not match the sha256 in {data}/meta.json" in last_error(capsys)
    write_data(data, good, good[::-1], meta=meta)
    assert train.main(argv) == 1
    assert f"{data}/val.bin does not match the sha256 in {data}/meta.json" in last_error(capsys)
    (data / "meta.json").write_text('{"train": {"tok')
    assert train.main(argv) == 1
    assert f"{data}/meta.json cannot be read" in last_error(capsys)
    assert not os.path.exists(tmp_path / "out" / "log.jsonl")  # none of these started a run

    write_data(data, good, good[::-1], meta=meta_of(data))
    os.remove(data / "meta.json")  # data made elsewhere: what can be checked without it is
    assert train.main(argv) == 0


@pytest.mark.parametrize("written_as", ["int32", "int64", "text"])
def test_token_files_that_are_not_uint16_ids_are_refused(written_as, tmp_path, capsys):
    # np.save-style ids of 32 or 64 bits, below 65,536, read as uint16 would be a token and a 0 in
    # turn; text would be pairs of characters: neither trains without a word unless refused
    ids = np.random.default_rng(0).integers(1, DATA_VOCAB, 5000)
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        path = data / f"{split}.bin"
        if written_as == "text":
            path.write_text("The history of the region begins in the Bronze Age. " * 100)
        else:
            ids.astype(written_as).tofile(path)
    assert train.main(argv_for(str(data), tmp_path / "out", max_iters=1)) == 1
    found = "text" if written_as == "text" else "int32 or int64 ids (every other uint16 word is 0)"
    assert last_error(capsys) == (f"error: {data}/train.bin holds {found}, not uint16 token ids: tokenize it with "
                                  "prepare_wikipedia.py --input, or write the ids as np.uint16\n")
    assert not (tmp_path / "out").exists()
    # the same ids as uint16 train
    write_data(data, ids, ids)
    assert train.main(argv_for(str(data), tmp_path / "out", max_iters=1)) == 0
