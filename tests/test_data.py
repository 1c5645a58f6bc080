"""
Tests of data.py: batches are shifted windows of the token files, and train.py refuses data that
is missing, short, of another format or another preparation, in one line, before it writes
anything. Token files written here.
Run: python -m pytest -q test_data.py
"""

import json
import os

import numpy as np
import pytest

import train
from lib import data
from lib.cli import UserError
from conftest import DATA_VOCAB, TINY, argv_for, flags, last_error

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# --------------------------------------------------------------------------------------
# the checks before training


def test_missing_or_short_data_is_one_clear_message(tmp_path, capsys, monkeypatch):
    argv = flags(**{**TINY, "data_dir": str(tmp_path), "out_dir": str(tmp_path / "out")})
    assert train.main(argv) == 1
    err = capsys.readouterr().err
    assert f"no data at {tmp_path}/train.bin — run `python prepare_wikipedia.py --out_dir {tmp_path}` first" in err
    assert "Traceback" not in err
    with monkeypatch.context() as patch:  # prepare_wikipedia.py's own folders get the command that makes them
        patch.chdir(tmp_path)
        for folder, command in (("data/wikitext2", "python prepare_wikipedia.py --dataset wikitext2"),  # tiny_cpu's
                                ("data/wikipedia", "python prepare_wikipedia.py")):
            with pytest.raises(UserError, match=f"no data at {folder}/train.bin — run `{command}` first"):
                data.check_data(folder, block_size=16, vocab_size=256)
    for split in ("train", "val"):
        np.arange(10, dtype=np.uint16).tofile(tmp_path / f"{split}.bin")
    assert train.main(argv) == 1
    assert "holds 10 tokens, fewer than block_size + 1 = 17" in capsys.readouterr().err


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
        meta[split] = dict(tokens=len(tokens), sha256=data.sha256_of(path / f"{split}.bin"),
                           max_token_id=int(tokens.max()))
    return meta


def test_data_is_checked_before_training(tmp_path, capsys):
    good = np.arange(100) % DATA_VOCAB
    data = tmp_path / "data"
    argv = argv_for(str(data), tmp_path / "out", max_iters=1)

    write_data(data, good, good)
    (data / "val.bin").write_bytes((data / "val.bin").read_bytes() + b"\x01")  # a half token
    assert train.main(argv) == 1
    assert f"{data}/val.bin has an odd number of bytes (201)" in last_error(capsys)

    beyond = good.copy()
    beyond[57] = DATA_VOCAB + 5
    write_data(data, beyond, good)  # no meta.json: the tokens are scanned
    assert train.main(argv) == 1
    assert f"{data}/train.bin holds token id {DATA_VOCAB + 5}, beyond vocab_size {DATA_VOCAB}" in last_error(capsys)
    write_data(data, good, good)
    meta = meta_of(data)
    meta["val"]["max_token_id"] = DATA_VOCAB  # a recorded range is trusted, not rescanned
    write_data(data, good, good, meta=meta)
    assert train.main(argv) == 1
    assert f"{data}/val.bin holds token id {DATA_VOCAB}, beyond vocab_size {DATA_VOCAB}" in last_error(capsys)

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
    os.remove(data / "meta.json")
    assert train.main(argv) == 0
    assert "has no meta.json, so train.bin and val.bin cannot be checked" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["int32", "int64", "text"])
def test_data_that_is_not_uint16_tokens_is_refused(kind, tmp_path, capsys):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        path = tmp_path / f"{split}.bin"
        if kind == "text":
            path.write_text("A file of text renamed to .bin, which is not made of token ids. " * 100)
        else:
            rng.integers(0, 50257, 3000).astype(kind).tofile(path)
    assert train.main(argv_for(str(tmp_path), tmp_path / "out", vocab_size=50257)) == 1
    err = capsys.readouterr().err
    looks_like = "text" if kind == "text" else "int32 or int64 token ids"
    assert f"{tmp_path}/train.bin does not hold uint16 token ids: it looks like {looks_like}" in err
    assert "--vocab_size" not in err and not (tmp_path / "out").exists()


def test_uint16_tokens_pass_the_format_check(tmp_path):
    rng = np.random.default_rng(0)
    rng.integers(0, 50257, 3000).astype(np.uint16).tofile(tmp_path / "a.bin")
    data.check_format(str(tmp_path / "a.bin"))  # no error
