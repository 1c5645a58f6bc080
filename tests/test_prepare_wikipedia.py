"""
Tests for prepare_wikipedia.py, and only for it: what belongs here is anything that module does,
from reading text to the files it leaves in --out_dir. Fixtures that other test files need too go
to conftest.py; tests of train.py's side of the data (data.py) go to that module's test file.

Covered: documents and splits on local text, tokens identical to tiktoken's own, a bounded stretch of
text in flight, the --max_chars cap, the write-ups' split (cut at the nearest document boundary), the
WikiText detokenizer, refusing binary input, the download against local HTTP servers (resume, a
connection cut half-way, servers that ignore Range, a busy server's Retry-After, redirects, fallback
URLs, bad zips, sha256 checks and pins, caches reused only for their own source, errors that are and
are not retried), the WikiText-2 download, that an interrupted run (an exception, Ctrl-C, SIGTERM,
a signal while tokenizing) or a failed write (a full disk, a read-only folder) leaves no output under
the final names and an earlier set as it was, the lock on the data folder (a second preparation, a
run that reads it), the warning about a val split too small to estimate a loss on, bench.py's
--prepare mode, and the write-ups' own data: the cut of their text into pieces (against every short
string and 3 MB of adversarial text, their own five lines the reference), their text and token
files downloaded, what GitHub answers when it does not serve them, a copy given with --input, and
hints that keep the failed run's settings.

    python -m pytest test_prepare_wikipedia.py

Offline, set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's GPT-2 files (see the README, Offline).
"""
import argparse
import contextlib
import dataclasses
import errno
import hashlib
import http.server
import io
import itertools
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import zipfile

import numpy as np
import pytest
import tiktoken

from lib import cli, data, fetch, prepare_io
import bench
import train
import prepare_wikipedia as pw
from conftest import REPO

try:
    ENC = tiktoken.get_encoding("gpt2")
except Exception as e:  # no skip: a tokenizer that cannot load is a failure, with the fix named
    raise RuntimeError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); offline, set TIKTOKEN_CACHE_DIR "
                       "to a folder holding tiktoken's GPT-2 files (see the README, Offline)") from None


def article(i):
    """A small WikiText-style article: a top-level heading, a section heading, paragraphs."""
    return (f" = Article {i} = \n \n Article {i} is about the number {i} , naïve café {i * 7} . \n \n"
            f" = = History = = \n \n In {1900 + i} it was {'long ' * i}known . \n \n")


ARTICLES = [article(i) for i in range(10)]


def read_docs(path):
    """Decode a .bin back to its documents, checking that each ends with <|endoftext|>."""
    tokens = np.memmap(path, dtype=np.uint16, mode="r").tolist()
    assert tokens and tokens[-1] == ENC.eot_token
    docs, start = [], 0
    for i, token in enumerate(tokens):
        if token == ENC.eot_token:
            docs.append(ENC.decode(tokens[start:i]))
            start = i + 1
    return docs


def outputs(out_dir):
    """The files a run left in out_dir, but for the lock it holds while it runs; [] if it left no
    out_dir (a failed run removes the folder it made, when it holds nothing)."""
    if not os.path.isdir(out_dir):
        return []
    return sorted(name for name in os.listdir(out_dir) if name != data.DATA_LOCK)


def exit_message(argv):
    """Run main and return the message it ends with on stderr (progress lines come before it);
    fails if it does not exit with an error."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = pw.main(argv)
    assert status not in (0, None) and "Traceback" not in err.getvalue()
    text = err.getvalue()
    return text[text.rindex("error: "):].strip() if "error: " in text else text.strip().splitlines()[-1]


def write_files(tmp_path, groups):
    """Write each group of articles to its own file; return the paths."""
    paths = []
    for i, group in enumerate(groups):
        path = tmp_path / f"part{i}.txt"
        path.write_text("".join(group), encoding="utf-8")
        paths.append(str(path))
    return paths


# --------------------------------------------------------------------------- local text

@pytest.mark.parametrize("val_fraction, n_val", [(0.2, 2), (0.005, 1)])
def test_input_round_trip(tmp_path, val_fraction, n_val):
    paths = write_files(tmp_path, [[" \n"] + ARTICLES[:6], ARTICLES[6:]])  # a blank start, as in WikiText
    out = tmp_path / "out"
    meta = pw.prepare_data(["--input", *paths, "--out_dir", str(out), "--num_proc", "1",
                    "--val_fraction", str(val_fraction)])
    assert read_docs(out / "train.bin") == ARTICLES[:-n_val]
    assert read_docs(out / "val.bin") == ARTICLES[-n_val:]  # val gets the last documents
    assert json.loads((out / "meta.json").read_text()) == meta
    for split, docs in [("train", ARTICLES[:-n_val]), ("val", ARTICLES[-n_val:])]:
        data = (out / f"{split}.bin").read_bytes()
        assert meta[split]["tokens"] * 2 == len(data)
        assert meta[split]["sha256"] == hashlib.sha256(data).hexdigest()
        assert meta[split]["chars"] == sum(len(d) for d in docs)
        assert meta[split]["documents"] == len(docs)
        assert meta[split]["max_token_id"] == max(np.frombuffer(data, dtype=np.uint16))
    assert meta["split"] == "wikitext" and meta["detokenize"] is False  # WikiText's text as it is, by default
    assert meta["passes_in_1.44B_tokens"] == round(1_440_000_000 / meta["train"]["tokens"], 2)
    assert meta["vocab_size"] == 50257 and meta["tokenizer"] == "gpt2" and meta["source"] == paths
    assert outputs(out) == ["meta.json", "train.bin", "val.bin"]


def test_parallel_matches_serial(tmp_path, monkeypatch):
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 150)  # a few documents in flight, so the pool's ordering matters
    paths = write_files(tmp_path, [ARTICLES])
    for num_proc in ("1", "2"):
        pw.prepare_data(["--input", *paths, "--out_dir", str(tmp_path / num_proc), "--num_proc", num_proc])
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes()


@pytest.mark.parametrize("num_proc", ["1", "2"])
def test_tokens_are_tiktokens_own(tmp_path, monkeypatch, num_proc):
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 300)  # several documents in flight at a time
    docs = ARTICLES + [" = Ünïcödé 日本語 = \n \n an emoji 🎉 , a tab\there and  two  spaces <|endoftext|> . \n \n"]
    *paths, val = write_files(tmp_path, [docs[:4], docs[4:7], docs[7:]])
    out = tmp_path / "out"
    pw.prepare_data(["--input", *paths, "--val", val, "--out_dir", str(out), "--num_proc", num_proc])
    for split, split_docs in [("train", docs[:7]), ("val", docs[7:])]:  # tiktoken called directly, one by one
        expected = [token for doc in split_docs for token in ENC.encode_ordinary(doc) + [ENC.eot_token]]
        assert np.fromfile(out / f"{split}.bin", dtype=np.uint16).tolist() == expected


@pytest.mark.parametrize("num_threads", [1, 2])
def test_the_text_is_read_a_bounded_way_ahead_of_the_tokens_written(monkeypatch, num_threads):
    # memory holds about READ_AHEAD_CHARS characters of documents in flight, whatever the size of the text;
    # reading runs that far ahead, so that the tokenizer's threads have work while those before are written
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 4000)
    texts, read, encoded, ahead = [article(i) for i in range(120)], [], [], []

    def documents():  # notes how far the text has been read
        for text in texts:
            read.append(text)
            yield text

    real_encode, calls = ENC.encode_to_numpy, []

    def encode(text, **kwargs):
        calls.append(text)
        return real_encode(text, **kwargs)

    monkeypatch.setattr(ENC, "encode_to_numpy", encode)
    for i, (tokens, chars, n_bytes) in enumerate(pw.encoded_documents(documents(), num_threads, False)):
        encoded.append((tokens.tolist(), chars, n_bytes))
        ahead.append(sum(map(len, texts[i:len(read)])))  # read, not yet written: the one written now among them
    group = 4000 // (4 * num_threads) + max(map(len, texts))  # the last group read, at most
    assert max(ahead) < 4000 + group and max(ahead) >= 4000  # bounded, and reaching the bound
    assert sorted(calls) == sorted(texts) and len(calls) == len(texts)  # each document encoded once
    assert encoded == [(ENC.encode_ordinary(t) + [ENC.eot_token], len(t), len(t.encode())) for t in texts]


def test_groups_of_documents():
    texts = [article(i) for i in range(30)]
    groups = list(pw.groups(iter(texts), detokenize_first=False, group_chars=1000))
    assert [t for g in groups for t in g] == texts and len(groups) > 3
    assert all(sum(map(len, g[:-1])) < 1000 <= sum(map(len, g)) for g in groups[:-1])  # the last one took it there
    assert sum(map(len, groups[-1][:-1])) < 1000
    one_each = list(pw.groups(iter(texts[:2]), detokenize_first=True, group_chars=0))
    assert one_each == [[fetch.detokenize(t)] for t in texts[:2]]


def test_max_chars_caps_train_only(tmp_path):
    paths = write_files(tmp_path, [ARTICLES])
    out = tmp_path / "out"
    cap = len(ARTICLES[0]) + len(ARTICLES[1]) + 1  # reached inside the third article
    meta = pw.prepare_data(["--input", *paths, "--out_dir", str(out), "--num_proc", "1",
                    "--val_fraction", "0.2", "--max_chars", str(cap)])
    assert read_docs(out / "train.bin") == ARTICLES[:3]  # stops after the article that crosses the cap
    assert read_docs(out / "val.bin") == ARTICLES[-2:]
    assert meta["train"]["chars"] == sum(len(a) for a in ARTICLES[:3]) and meta["max_chars"] == cap


def test_valid_file_is_val(tmp_path):
    train_path, = write_files(tmp_path, [ARTICLES[:7]])
    valid_path = tmp_path / "wiki.valid.raw"
    valid_path.write_text("".join(ARTICLES[7:]), encoding="utf-8")
    out = tmp_path / "out"
    pw.prepare_data(["--input", str(valid_path), train_path, "--out_dir", str(out), "--num_proc", "1"])
    assert read_docs(out / "train.bin") == ARTICLES[:7]
    assert read_docs(out / "val.bin") == ARTICLES[7:]


def test_val_files_are_named_not_guessed(tmp_path):
    first, second, held_out = write_files(tmp_path, [ARTICLES[:4], ARTICLES[4:7], ARTICLES[7:]])
    invalid = tmp_path / "invalid.txt"  # holds "valid" in its name, and is still training text
    os.replace(second, invalid)
    out = tmp_path / "out"
    meta = pw.prepare_data(["--input", first, str(invalid), "--val", held_out, "--out_dir", str(out), "--num_proc", "1"])
    assert read_docs(out / "train.bin") == ARTICLES[:7]
    assert read_docs(out / "val.bin") == ARTICLES[7:]
    assert meta["source"] == {"input": [first, str(invalid)], "val": [held_out]}
    # without --val, invalid.txt stays train: val is the last documents
    pw.prepare_data(["--input", first, str(invalid), "--out_dir", str(out), "--num_proc", "1", "--val_fraction", "0.2"])
    assert read_docs(out / "train.bin") == ARTICLES[:6] and read_docs(out / "val.bin") == ARTICLES[6:7]


def test_lines_read_as_text_mode_reads_them(tmp_path):
    path = tmp_path / "newlines.txt"
    path.write_bytes(b"unix\nwindows\r\nold mac\rcaf\xc3\xa9\nno newline at the end")
    with open(path, encoding="utf-8") as f:  # text mode: the reference
        expected = list(f)
    with open(path, "rb") as f:
        assert list(fetch.text_lines(f, str(path))) == expected == [
            "unix\n", "windows\n", "old mac\n", "café\n", "no newline at the end"]
    # over many blocks of a quarter MB, where a \r\n may fall at a block's end
    path.write_bytes(b"".join(b"line %d\r\n" % i + b"x" * (i % 97) + b"\r" + "é\n".encode() for i in range(60_000)))
    with open(path, encoding="utf-8") as f:
        expected = list(f)
    with open(path, "rb") as f:
        assert list(fetch.text_lines(f, str(path))) == expected and len(expected) == 180_000


def test_document_boundaries(monkeypatch):
    lines = "".join(ARTICLES[:3]).splitlines(keepends=True)
    # ` = = History = = ` starts no document
    assert list(fetch.read_documents(lines)) == ARTICLES[:3]
    # text without headings: past MAX_DOC_CHARS, a document ends at the next blank line
    monkeypatch.setattr(fetch, "MAX_DOC_CHARS", 40)
    paragraphs = [f"paragraph {i} has some words in it .\nand a second line .\n\n" for i in range(5)]
    assert list(fetch.read_documents("".join(paragraphs).splitlines(keepends=True))) == paragraphs


# --------------------------------------------------------------------------- detokenize

WIKITEXT_LINES = [  # lines as WikiText-103 writes them: a space at both ends, around every mark
    " = Robert Boulter = \n",
    " \n",
    " Robert Boulter is an English film , television and theatre actor . He had a guest @-@ starring role on "
    "the television series The Bill in 2000 . \n",
    " \n",
    " = = Career = = \n",
    " = = = 2000 – 2005 = = = \n",
    " In 2006 Boulter starred as \" Stuart \" in the film Coming Soon ( born 1984 ) ; he portrayed \" Scott "
    "Parry \" in the episode , \" In Safe Hands \" . \n",
    " The film 's budget rose from 1 @,@ 000 to 3 @.@ 5 million . It didn 't sell ! Why ? The players ' "
    "union : they 're sure . \n",
]
PLAIN_LINES = [
    "Robert Boulter\n",
    "\n",
    "Robert Boulter is an English film, television and theatre actor. He had a guest-starring role on "
    "the television series The Bill in 2000.\n",
    "\n",
    "Career\n",
    "2000 – 2005\n",
    "In 2006 Boulter starred as \"Stuart\" in the film Coming Soon (born 1984); he portrayed \"Scott "
    "Parry\" in the episode, \"In Safe Hands\".\n",
    "The film's budget rose from 1,000 to 3.5 million. It didn't sell! Why? The players' "
    "union: they're sure.\n",
]


@pytest.mark.parametrize("wikitext, plain", list(zip(WIKITEXT_LINES, PLAIN_LINES)))
def test_detokenize_wikitext_lines(wikitext, plain):
    assert fetch.detokenize(wikitext) == plain


def test_detokenize_a_whole_document():
    assert fetch.detokenize("".join(WIKITEXT_LINES)) == "".join(PLAIN_LINES)


def test_detokenize_leaves_ordinary_text_unchanged():
    text = (
        "# Notes on the 1984 season\n"
        "\n"
        "Boulter (born 1984) said \"it's fine,\" then left; the players' union didn't agree! Why? Costs rose\n"
        "from 1,000 to 3.5 million (about 12%), i.e. a lot: see https://example.org/a?b=c&d=e. Mr. O'Brien's\n"
        "'rock 'n' roll' era, the '90s, and == Section == in wiki markup stay as they are.\n"
        "    def f(x, y):  # indented code\n"
        "        return {\"a\": x[0], 'b': y.get(1, None)} if x else (y or [])\n"
        "  two leading spaces, a tab\there, and an empty line:\n"
        "\n"
        "last line without a newline; path ./data/train.bin, version 2.0.1, 3 - 2 = 1")
    assert fetch.detokenize(text) == text


def test_detokenize_rules_match_their_plain_forms():
    # detokenize() writes each lookbehind after its literal, for speed; the plain forms, with the
    # lookbehind first, are the reference
    def plain(text):
        text = re.sub(r"^ (?:= )+(.*?)(?: =)+ $", r"\1", text, flags=re.M)
        text = re.sub(r"^ (?:(\S.*) )?$", r"\1", text, flags=re.M)
        text = re.sub(r" @([-,.])@ ", r"\1", text)
        text = re.sub(r'(?<!\S)" ([^"\n]*?) "(?!\S)', r'"\1"', text)
        text = re.sub(r" '(s|t|re|ve|ll|d|m)\b", r"'\1", text)
        text = re.sub(r"(?<=s) '(?= )", "'", text)
        text = re.sub(r"(?<!\S)\( ", "(", text)
        return re.sub(r" ([,.;:!?)])(?=\s|$)", r"\1", text)

    rng = np.random.default_rng(0)
    pieces = [" ", "\n", '"', "'", "(", ")", "s", "t", "a", ",", ".", "@", "-", "=", "s '", '" ', "( ", " = "]
    for _ in range(3000):
        text = "".join(rng.choice(pieces, size=rng.integers(0, 30)))
        assert fetch.detokenize(text) == plain(text), repr(text)
    wikitext = "".join(WIKITEXT_LINES) * 3
    assert fetch.detokenize(wikitext) == plain(wikitext)


def test_detokenize_flag(tmp_path):
    paths = write_files(tmp_path, [ARTICLES])
    for flags, detokenized in [([], False), (["--detokenize"], True)]:
        out = tmp_path / str(detokenized)
        meta = pw.prepare_data(["--input", *paths, "--out_dir", str(out), "--num_proc", "1", "--val_fraction", "0.2", *flags])
        expected = [fetch.detokenize(a) for a in ARTICLES] if detokenized else ARTICLES
        assert read_docs(out / "train.bin") + read_docs(out / "val.bin") == expected
        assert meta["detokenize"] is detokenized
    assert fetch.detokenize(ARTICLES[0]) != ARTICLES[0]  # the flag made a difference


# --------------------------------------------------------------------------- the write-ups' split

def nearest_boundary(counts, target):
    """Slow reference: how many documents (at least one) hold nearest target tokens; ties take more."""
    totals = np.cumsum(counts)
    return min(range(1, len(counts) + 1), key=lambda k: (abs(totals[k - 1] - target), -k))


def test_write_split_stops_at_the_nearest_boundary(tmp_path):
    counts = [5, 3, 8, 1, 6, 4]
    ids = [3, 9, 1, 4, 2, 8]  # each document repeats one token id
    encoded = [(np.full(n, i, dtype=np.uint16), 10 * n, 20 * n) for i, n in zip(ids, counts)]
    for target in range(1, sum(counts) + 3):
        stats, left_over = pw.write_split(iter(encoded), tmp_path / "split.bin", "train", target)
        k = nearest_boundary(counts, target)
        assert stats["documents"] == k, target
        assert stats["tokens"] == sum(counts[:k]) and stats["tokens_asked"] == target
        assert stats["chars"] == 10 * stats["tokens"] and stats["max_token_id"] == max(ids[:k])
        assert (tmp_path / "split.bin").read_bytes() == np.concatenate([e[0] for e in encoded[:k]]).tobytes()
        reached = sum(counts[:k]) >= target  # stopped on reaching the count, or before a document that overshoots
        assert [doc[0].tolist() for doc in left_over] == ([] if reached or k == len(counts) else
                                                         [encoded[k][0].tolist()])


def token_counts(docs, detokenized=True):
    """Tokens of each document (detokenized or as it is), <|endoftext|> included."""
    texts = [fetch.detokenize(doc) if detokenized else doc for doc in docs]
    return [len(ENC.encode_ordinary(text)) + 1 for text in texts]


@pytest.mark.parametrize("num_proc", ["1", "2"])
def test_writeup_split(tmp_path, monkeypatch, num_proc):
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 150)  # the cut falls among documents in flight
    paths = write_files(tmp_path, [[" \n"] + ARTICLES[:3], ARTICLES[3:]])  # documents run on across files
    counts = token_counts(ARTICLES)
    totals = np.cumsum(counts)
    train_tokens = int(totals[3]) + 2  # just past 4 documents: the boundary after the 4th is nearest
    val_tokens = counts[4] + counts[5] - 1  # just short of 2 documents
    out, threads = tmp_path / "out", threading.active_count()
    meta = pw.prepare_data(["--split=writeup", "--input", *paths, "--out_dir", str(out), "--num_proc", num_proc,
                    "--train_tokens", str(train_tokens), "--val_tokens", str(val_tokens)])
    assert threading.active_count() == threads  # the tokenizer's threads end with the run, though val stopped early
    # detokenized by default; val is what follows train
    assert read_docs(out / "train.bin") == [fetch.detokenize(a) for a in ARTICLES[:4]]
    assert read_docs(out / "val.bin") == [fetch.detokenize(a) for a in ARTICLES[4:6]]
    assert meta["split"] == "writeup" and meta["detokenize"] is True and meta["max_chars"] is None
    for split, tokens, asked in [("train", totals[3], train_tokens), ("val", counts[4] + counts[5], val_tokens)]:
        data = np.fromfile(out / f"{split}.bin", dtype=np.uint16)
        assert meta[split]["tokens"] == tokens == len(data) and meta[split]["tokens_asked"] == asked
        assert meta[split]["max_token_id"] == data.max() == ENC.eot_token
    assert meta["passes_in_1.44B_tokens"] == round(1_440_000_000 / totals[3], 2)
    assert json.loads((out / "meta.json").read_text()) == meta


def test_writeup_split_from_the_zip_ignores_wiki_valid(tmp_path):
    zip_path = tmp_path / "wt.zip"
    zip_path.write_bytes(wikitext_zip(tmp_path))  # train.raw: ARTICLES[:8], valid.raw: ARTICLES[8:]
    digest = hashlib.sha256(zip_path.read_bytes()).hexdigest()  # a zip of our own: its sha256 is given
    counts = token_counts(ARTICLES, detokenized=False)
    out = tmp_path / "out"
    meta = pw.prepare_data(["--split=writeup", "--no-detokenize", "--zip", str(zip_path), "--sha256", digest,
                            "--out_dir", str(out),
                    "--num_proc", "1", "--train_tokens", str(sum(counts[:2])), "--val_tokens", str(counts[2])])
    assert read_docs(out / "train.bin") == ARTICLES[:2] and read_docs(out / "val.bin") == [ARTICLES[2]]
    assert meta["detokenize"] is False
    assert meta["source"] == {"dataset": None, "zip": str(zip_path), "sha256": digest, "expected_sha256": digest}


def test_writeup_split_when_the_text_runs_out(tmp_path, capsys):
    paths = write_files(tmp_path, [ARTICLES[:3]])
    counts = token_counts(ARTICLES[:3])
    out = tmp_path / "out"
    meta = pw.prepare_data(["--split=writeup", "--input", *paths, "--out_dir", str(out), "--num_proc", "1",
                    "--train_tokens", str(counts[0]), "--val_tokens", "100000"])
    assert meta["val"]["tokens"] == counts[1] + counts[2] and meta["val"]["documents"] == 2
    assert (f"warning: the text ran out: val has {counts[1] + counts[2]:,} of the 100,000 tokens asked"
            in capsys.readouterr().err)
    # train takes everything: no val at all is an error, and nothing is written
    message = exit_message(["--split=writeup", "--input", *paths, "--out_dir", str(tmp_path / "none"),
                            "--num_proc", "1", "--train_tokens", "100000"])
    assert f"train took {sum(counts):,} tokens (100,000 asked)" in message and "--train_tokens" in message
    assert outputs(tmp_path / "none") == []


def test_writeup_defaults_are_the_write_ups_counts():
    args = argparse.Namespace(split="writeup", input=None, val=None, max_chars=None, val_fraction=None,
                              train_tokens=None, val_tokens=None, threads=1, retries=1,
                              detokenize=None,
                              dataset="wikitext103", zip=None, url=None, sha256=None, out_dir=None,
                              tokens=False)
    pw.check_settings(args)
    assert (args.train_tokens, args.val_tokens, args.detokenize) == (38_276_830, 4_341_780, True)
    assert 1_440_000_000 / args.train_tokens == pytest.approx(37.62, abs=0.01)  # the write-ups' 37.6 passes


def test_the_write_ups_run_length_comes_from_their_config():
    config = train.get_config([os.path.join(REPO, "config", "future50_mse.py")])
    run_tokens = config["max_iters"] * config["batch_size"] * config["gradient_accumulation_steps"] * config["block_size"]
    assert pw.WRITEUP_RUN_TOKENS == run_tokens == 1_440_000_000  # the write-ups' 1.44B tokens


@pytest.mark.parametrize("flags, problem", [
    (["--split=writeup", "--max_chars", "1000"], "--max_chars does not apply to --split=writeup"),
    (["--split=writeup", "--val", "v.txt"], "--val does not apply to --split=writeup"),
    (["--split=writeup", "--val_fraction", "0.1"], "--val_fraction does not apply to --split=writeup"),
    (["--train_tokens", "1000"], "need --split=writeup"),
    (["--split=writeup", "--val_tokens", "0"], "--val_tokens must be 1 or more"),
    (["--val_fraction", "1.5"], "--val_fraction must be between 0 and 1"),
])
def test_settings_that_contradict(tmp_path, flags, problem):
    path, = write_files(tmp_path, [ARTICLES])
    message = exit_message(["--input", path, "--out_dir", str(tmp_path / "out"), *flags])
    assert message.startswith("error: ") and problem in message and "\n" not in message
    assert "--val needs --input" in exit_message(["--val", path, "--out_dir", str(tmp_path / "out")])
    message = exit_message(["--input", path, "--val", str(tmp_path / "." / "part0.txt"), "--out_dir", str(tmp_path)])
    assert "given to both --input and --val" in message  # a document in both splits would flatter val


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        pw.main(["--help"])
    assert e.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage:") and "--split" in usage and "--no-detokenize" in usage


def test_a_tokenizer_that_cannot_load_is_one_short_error_line(tmp_path, monkeypatch):
    def offline(name):  # what tiktoken raises without a network or a cache: a long urllib3 text
        raise ConnectionError("HTTPSConnectionPool(host='x', port=443): Max retries exceeded " + "(Caused by ...)" * 20)
    monkeypatch.setattr(fetch.tiktoken, "get_encoding", offline)
    text, = write_files(tmp_path, [ARTICLES[:5]])
    message = exit_message(["--input", text, "--out_dir", str(tmp_path / "out")])
    assert message.startswith("error: cannot load the GPT-2 tokenizer (ConnectionError); HINT:")
    assert "Max retries" not in message and "\n" not in message and "TIKTOKEN_CACHE_DIR" in message


@pytest.mark.parametrize("tiktoken_of", ["0.8", "0.10"])
def test_a_tiktoken_too_old_is_refused(tmp_path, monkeypatch, tiktoken_of):
    old = types.SimpleNamespace(encode_ordinary=ENC.encode_ordinary)  # 0.8: no encode_to_numpy yet
    if tiktoken_of == "0.10":  # encode_to_numpy, but a special token's text encoded as the token, unlike encode_ordinary
        old.encode_to_numpy = lambda text, **kwargs: ENC.encode_to_numpy(text, allowed_special="all")
    monkeypatch.setattr(fetch.tiktoken, "get_encoding", lambda name: old)
    monkeypatch.setattr(fetch.tiktoken, "__version__", tiktoken_of)
    text, = write_files(tmp_path, [ARTICLES[:5]])
    message = exit_message(["--input", text, "--out_dir", str(tmp_path / "out")])
    assert message == (f"error: tiktoken {tiktoken_of} is too old for prepare_wikipedia.py, which needs 0.11 or later; "
                       "HINT: pip install -U 'tiktoken>=0.11'")
    assert outputs(tmp_path / "out") == []


# --------------------------------------------------------------------------- input that is not text

@pytest.mark.parametrize("bad_bytes, what", [(b"\xff\xfe", "not UTF-8"), (b"\x00", "a NUL"),
                                            (b"caf\xe9", "not UTF-8")])  # latin-1 é
@pytest.mark.parametrize("num_proc", ["1", "2"])
def test_input_that_is_not_utf8_text_is_refused(tmp_path, bad_bytes, what, num_proc):
    good, = write_files(tmp_path, [ARTICLES[:5]])
    head = "".join(ARTICLES[5:7]).encode("utf-8")  # whole documents before the bad byte
    bad = tmp_path / "bad.txt"
    bad.write_bytes(head + b" = Broken = \n" + bad_bytes + b" text\n" + "".join(ARTICLES[7:]).encode("utf-8"))
    offset = len(head) + len(b" = Broken = \n") + bad_bytes.find(b"\xe9" if bad_bytes == b"caf\xe9" else bad_bytes[:1])
    out = tmp_path / "out"
    for flags in (["--val_fraction", "0.2"], ["--split=writeup", "--train_tokens", "100000"]):  # a first pass, a pool
        message = exit_message(["--input", good, str(bad), "--out_dir", str(out), "--num_proc", num_proc, *flags])
        assert f"{bad} is not UTF-8 text: byte {offset:,}" in message and what in message
        assert "convert it to UTF-8" in message and "\n" not in message
        assert outputs(out) == []


def test_bad_byte_offset_counts_earlier_lines(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes("é\n".encode("utf-8") * 400_000 + b"ok\x80\n")  # 3 bytes a line: 1.2 MB, blocks later
    with open(path, "rb") as f, pytest.raises(cli.UserError, match="byte 1,200,002 \\(0x80\\) is not UTF-8"):
        list(fetch.text_lines(f, str(path)))


# --------------------------------------------------------------------------- errors and interruption


def test_missing_input(tmp_path):
    message = exit_message(["--input", str(tmp_path / "nope.txt"), "--out_dir", str(tmp_path / "out")])
    assert "not found" in message and "nope.txt" in message and "HINT" in message


def test_missing_input_exits_without_traceback(tmp_path):
    script = os.path.join(REPO, "prepare_wikipedia.py")
    result = subprocess.run([sys.executable, script, "--input", str(tmp_path / "nope.txt"),
                             "--out_dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("error: input file not found") and "Traceback" not in result.stderr


def test_too_little_text_and_unwritable_out_dir(tmp_path):
    one, = write_files(tmp_path, [ARTICLES[:1]])
    assert "need 2 or more" in exit_message(["--input", one, "--out_dir", str(tmp_path / "out")])
    assert "cannot write" in exit_message(["--input", one, "--out_dir", os.path.join(one, "sub")])


def test_stale_temporary_files_are_removed(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    stale = ["train.bin.tmp", "val.bin.tmp", "meta.json.tmp"]  # what a killed run leaves behind
    kept = ["wikitext-103-raw-v1.zip.part", "notes.tmp"]  # a download to resume, and a file of the user's
    for name in stale + kept:
        (out / name).write_bytes(b"left over")
    exit_message(["--input", str(tmp_path / "nope.txt"), "--out_dir", str(out)])  # even a run that fails early
    assert outputs(out) == sorted(kept)
    printed = capsys.readouterr().out
    assert all(f"removed {out / name}, left by an interrupted run" in printed for name in stale)


LOCK_HOLDER = """
import fcntl, os, sys, time
lock = open(os.path.join(sys.argv[1], "data.lock"), "a+")  # what a preparation holds while it writes
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_run_on_a_busy_out_dir_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.bin.tmp").write_bytes(b"being written by the first run")
    (path,) = write_files(tmp_path, [ARTICLES])
    argv = ["--input", str(path), "--out_dir", str(out), "--num_proc", "1"]
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert "is in use by another prepare_wikipedia.py" in exit_message(argv)
        assert (out / "train.bin.tmp").read_bytes() == b"being written by the first run"  # not cleaned away
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the lock ends with the process all the same
        holder.wait()
    pw.prepare_data(argv)
    assert outputs(out) == ["meta.json", "train.bin", "val.bin"]


READER = """
import fcntl, os, sys, time
lock = open(os.path.join(sys.argv[1], "data.lock"), "a+")  # what train.py holds while it trains
fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
print("reading", flush=True)
time.sleep(120)
"""


def test_a_folder_a_run_reads_is_not_written(tmp_path):
    out, earlier = earlier_set(tmp_path)
    (out / "train.bin.tmp").write_bytes(b"a stale file, removed only by a run that may write here")
    (path,) = write_files(tmp_path, [ARTICLES])
    argv = ["--input", str(path), "--out_dir", str(out), "--num_proc", "1"]
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(out)], stdout=subprocess.PIPE, text=True)
               for _ in range(2)]  # two runs on one data folder: a shared lock admits both
    try:
        assert [reader.stdout.readline().strip() for reader in readers] == ["reading", "reading"]
        assert exit_message(argv) == (
            f"error: a run is training from {out} (it holds {out / 'data.lock'}), so its files cannot change now; "
            "HINT: wait for the run to end, or prepare into another --out_dir")
        assert {name: (out / name).read_bytes() for name in pw.OUTPUTS} == earlier  # nothing written
        assert outputs(out) == ["meta.json", "train.bin", "train.bin.tmp", "val.bin"]
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()
    pw.prepare_data(argv)  # the runs have ended
    assert read_docs(out / "train.bin") + read_docs(out / "val.bin") == ARTICLES


@pytest.mark.parametrize("crash", [RuntimeError, KeyboardInterrupt])
def test_interrupted_run_leaves_no_output(tmp_path, monkeypatch, crash):
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 1)  # one document in flight at a time
    real_encode, calls = ENC.encode_to_numpy, []

    def failing_encode(text, **kwargs):
        calls.append(text)
        if len(calls) == 4:
            raise crash("simulated crash mid-tokenization")
        return real_encode(text, **kwargs)

    monkeypatch.setattr(ENC, "encode_to_numpy", failing_encode)  # tiktoken's one gpt2 Encoding, pw's too
    paths = write_files(tmp_path, [ARTICLES])
    out = tmp_path / "out"
    argv = ["--input", *paths, "--out_dir", str(out), "--num_proc", "1"]
    if crash is KeyboardInterrupt:
        assert "stopped by SIGINT: no output written under the final names" in exit_message(argv)
    else:
        with pytest.raises(RuntimeError):
            pw.prepare_data(argv)
    assert len(calls) == 4
    assert outputs(out) == []  # no final files, and no temporary ones left behind


# --------------------------------------------------------------------------- failed writes

class FullDisk(io.FileIO):
    """A file on a disk that fills up after room bytes: a write past them fails with ENOSPC."""

    def __init__(self, path, room):
        super().__init__(path, "w")
        self.room = room

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as the kernel's: naming no file
        return super().write(data)


def break_open(monkeypatch, name, error, room=None, buffer_size=io.DEFAULT_BUFFER_SIZE):
    """Make prepare_wikipedia's and lib/fetch.py's open() of the file called name fail: with the errno error
    at once, or, given room, as a file on a disk that fills up after room bytes. Returns the paths it broke."""
    broken, real_open = [], open

    def open_on_a_bad_disk(path, mode="r", *args, **kwargs):
        if os.path.basename(path) != name:
            return real_open(path, mode, *args, **kwargs)
        broken.append(path)
        if room is None:
            raise OSError(error, os.strerror(error), path)  # as open() raises it: naming the file
        return io.BufferedWriter(FullDisk(path, room), buffer_size=buffer_size)

    for module in (pw, fetch):  # shadows the builtin in these modules only; fetch writes the download
        monkeypatch.setattr(module, "open", open_on_a_bad_disk, raising=False)
    return broken


def earlier_set(tmp_path):
    """An out_dir holding the outputs of an earlier preparation, and their bytes."""
    path = tmp_path / "earlier.txt"
    path.write_text("".join(ARTICLES[:4]), encoding="utf-8")
    out = tmp_path / "out"
    pw.prepare_data(["--input", str(path), "--out_dir", str(out), "--num_proc", "1"])
    return out, {name: (out / name).read_bytes() for name in pw.OUTPUTS}


FULL = cli.ADVICE[errno.ENOSPC]  # what to do, in the words train.py's messages use too


@pytest.mark.parametrize("name, error, room, buffer_size", [
    ("train.bin.tmp", errno.ENOSPC, 300, 64),  # partway through: a write() fails
    ("val.bin.tmp", errno.ENOSPC, 0, io.DEFAULT_BUFFER_SIZE),  # the buffered bytes, flushed at close
    ("meta.json.tmp", errno.EROFS, None, None),  # at open
    ("train.bin.tmp", errno.EACCES, None, None),
])
def test_a_failed_write_keeps_the_earlier_set(tmp_path, monkeypatch, name, error, room, buffer_size):
    out, earlier = earlier_set(tmp_path)
    paths = write_files(tmp_path, [ARTICLES])  # a new text: new outputs, if they were written
    broken = break_open(monkeypatch, name, error, room, buffer_size)
    message = exit_message(["--input", *paths, "--out_dir", str(out), "--num_proc", "1"])
    cause = {errno.ENOSPC: "no space left on device", errno.EROFS: "read-only file system",
             errno.EACCES: "permission denied"}[error]
    assert message == (f"error: cannot write {out / name}: {cause}; {cli.ADVICE[error]}; "
                       "no output written under the final names")
    assert broken == [str(out / name)]
    assert outputs(out) == ["meta.json", "train.bin", "val.bin"]  # no temporary file left
    assert {name: (out / name).read_bytes() for name in pw.OUTPUTS} == earlier


def test_a_failed_rename_says_the_set_is_incomplete(tmp_path, monkeypatch):
    out, earlier = earlier_set(tmp_path)
    paths = write_files(tmp_path, [ARTICLES])
    real_replace = os.replace

    def replace_on_a_full_disk(src, dst):
        if os.path.basename(dst) == "val.bin":  # train.bin is renamed already: the set is mixed now
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src, None, dst)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_on_a_full_disk)
    argv = ["--input", *paths, "--out_dir", str(out), "--num_proc", "1"]
    message = exit_message(argv)
    assert message == (f"error: cannot write {out / 'val.bin'}: no space left on device; {FULL}; "
                       f"{out} is left without meta.json, an incomplete set that the next run redoes")
    # without meta.json, train.py cannot take the mixed set for a checked one
    assert outputs(out) == ["train.bin", "val.bin"] and (out / "val.bin").read_bytes() == earlier["val.bin"]
    monkeypatch.setattr(os, "replace", real_replace)
    meta = pw.prepare_data(argv)  # the next run redoes it
    assert read_docs(out / "train.bin") + read_docs(out / "val.bin") == ARTICLES
    assert json.loads((out / "meta.json").read_text()) == meta


def test_an_unreadable_input_is_named(tmp_path, monkeypatch):
    paths = write_files(tmp_path, [ARTICLES[:5], ARTICLES[5:]])
    break_open(monkeypatch, "part1.txt", errno.EACCES)
    message = exit_message(["--input", *paths, "--out_dir", str(tmp_path / "out"), "--num_proc", "1"])
    assert message == (f"error: cannot read {paths[1]}: permission denied; "
                       "HINT: check its permissions, or leave it out")  # not a write error of train.bin.tmp


# --------------------------------------------------------------------------- a small val

def test_a_small_val_is_warned_about(tmp_path, monkeypatch, capsys):
    paths = write_files(tmp_path, [ARTICLES])
    argv = ["--input", *paths, "--out_dir", str(tmp_path / "out"), "--num_proc", "1", "--val_fraction", "0.2"]
    meta = pw.prepare_data(argv)
    tokens = meta["val"]["tokens"]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"warning: val has {tokens:,} tokens in 2 documents: too few to estimate a loss (aim for 100,000+ tokens "
        "and 10+ documents); HINT: name held-out files with --val, or raise --val_fraction (now 0.2)")
    # the thresholds lowered to this val's counts: it passes; one above either of them: it does not
    for min_tokens, min_documents, warned in [(tokens, 2, False), (tokens + 1, 2, True), (tokens, 3, True)]:
        monkeypatch.setattr(pw, "MIN_VAL_TOKENS", min_tokens)
        monkeypatch.setattr(pw, "MIN_VAL_DOCUMENTS", min_documents)
        pw.prepare_data(argv)
        assert ("warning: val has" in capsys.readouterr().err) is warned, (min_tokens, min_documents)


@pytest.mark.parametrize("settings, hint", [
    ({"input": ["a.txt"], "val": ["b.txt"]}, "give more held-out text with --val"),
    ({"input": ["a.txt", "wiki.valid.raw"]}, "give more held-out text with --val"),
    ({"input": ["a.txt"], "val_fraction": 0.005},
     "name held-out files with --val, or raise --val_fraction (now 0.005)"),
    ({"split": "writeup", "input": ["a.txt"], "val_tokens": 50_000},
     "raise --val_tokens (now 50,000); if the text ran out, give more or lower --train_tokens"),
    ({"zip": "wt.zip"}, "use a zip whose wiki.valid.raw holds more text, or give text files with --input and --val"),
])
def test_the_small_val_warning_names_the_setting_that_applies(settings, hint):
    args = argparse.Namespace(**{"split": "wikitext", "input": None, "val": None, **settings})
    warning = pw.small_val_warning({"tokens": 3343, "documents": 1}, args)
    assert warning == ("warning: val has 3,343 tokens in 1 document: too few to estimate a loss (aim for 100,000+ "
                       f"tokens and 10+ documents); HINT: {hint}")
    assert pw.small_val_warning({"tokens": 100_000, "documents": 10}, args) is None


# --------------------------------------------------------------------------- stopped by a signal

SLOW_RUN = """
import signal, sys, time
import prepare_wikipedia as pw
from lib import fetch
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal, whatever the test runner's
pw.READ_AHEAD_CHARS = 1  # one document in flight at a time
real_read_documents = fetch.read_documents

def slow_read_documents(lines):  # a few ms a document: a run long enough to be stopped while it writes
    for doc in real_read_documents(lines):
        time.sleep(0.005)
        yield doc

fetch.read_documents = slow_read_documents
sys.exit(pw.main(sys.argv[1:]))
"""


def processes_in_session(session):
    """The live processes (zombies aside) of a session, from /proc: the run, and any it started."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat") as f:
                state, _, _, sid = f.read().rpartition(")")[2].split()[:4]  # after the command's name
            if int(sid) == session and state != "Z":
                pids.append(int(pid))
    return pids


def size(path):
    """Bytes in the file at path, 0 if there is none."""
    with contextlib.suppress(FileNotFoundError):
        return path.stat().st_size
    return 0


def test_a_signal_while_tokenizing_stops_the_run_cleanly(tmp_path, monkeypatch):
    # the tokenizer's threads never see a signal (only the main thread does): one that arrives while they
    # work is raised in the main thread once it runs again, and the run stops as for any other signal
    out, earlier = earlier_set(tmp_path)
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 1)  # one document in flight at a time
    real_encode, calls = ENC.encode_to_numpy, []

    def encode_then_signal(text, **kwargs):
        calls.append(text)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered while the threads tokenize
        return real_encode(text, **kwargs)

    monkeypatch.setattr(ENC, "encode_to_numpy", encode_then_signal)
    paths = write_files(tmp_path, [ARTICLES])
    threads = threading.active_count()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = pw.main(["--input", *paths, "--out_dir", str(out), "--num_proc", "2"])
    assert status == 143 and err.getvalue().splitlines()[-1] == "stopped by SIGTERM: no output written under the final names"
    assert len(calls) == 3  # stopped at once: no document tokenized after it
    assert outputs(out) == ["meta.json", "train.bin", "val.bin"]  # no temporary file left
    assert {name: (out / name).read_bytes() for name in pw.OUTPUTS} == earlier
    assert threading.active_count() == threads  # no tokenizer thread left running


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the run's processes in /proc")
@pytest.mark.parametrize("sig, whole_group, status, message", [
    (signal.SIGTERM, False, 143, "stopped by SIGTERM: no output written under the final names"),  # kill PID
    (signal.SIGTERM, True, 143, "stopped by SIGTERM: no output written under the final names"),  # a scheduler
    (signal.SIGINT, True, 130, "stopped by SIGINT: no output written under the final names"),  # Ctrl-C in a terminal
])
def test_a_run_stopped_by_a_signal_cleans_up(tmp_path, sig, whole_group, status, message):
    out, earlier = earlier_set(tmp_path)
    text, held_out = tmp_path / "long.txt", tmp_path / "held_out.txt"
    text.write_text("".join(ARTICLES) * 200, encoding="utf-8")  # 10 s of slow reading, if not stopped
    held_out.write_text(ARTICLES[0], encoding="utf-8")
    run = subprocess.Popen([sys.executable, "-c", SLOW_RUN, "--input", str(text), "--val", str(held_out),
                            "--out_dir", str(out), "--num_proc", "2"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # its own process group and session: run.pid is both ids
    try:
        deadline = time.monotonic() + 60
        while size(out / "train.bin.tmp") == 0:  # tokens on disk: it is writing
            assert run.poll() is None and time.monotonic() < deadline, "the run ended or stalled before writing"
            time.sleep(0.01)
        if whole_group:
            os.killpg(run.pid, sig)
        else:
            os.kill(run.pid, sig)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == status, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1] == message, stderr
    assert all(line.startswith("train: ") for line in lines[:-1]), stderr  # progress lines only: no traceback
    assert outputs(out) == ["meta.json", "train.bin", "val.bin"]  # no temporary file left
    assert {name: (out / name).read_bytes() for name in pw.OUTPUTS} == earlier
    deadline = time.monotonic() + 5
    while processes_in_session(run.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_in_session(run.pid) == []  # nothing left running


# --------------------------------------------------------------------------- download

class Handler(http.server.BaseHTTPRequestHandler):
    """Serves server.files (bytes, an HTTP error code, or a URL to redirect to), honouring Range unless
    told not to; answers the first server.busy requests with 503 and Retry-After; logs (path, Range,
    User-Agent)."""

    def do_GET(self):
        server = self.server
        server.log.append((self.path, self.headers.get("Range"), self.headers.get("User-Agent")))
        if server.busy:  # overloaded for a while: come back in Retry-After seconds
            server.busy -= 1
            self.send_response(503)
            self.send_header("Retry-After", str(server.retry_after))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = server.files.get(self.path, 404)
        if isinstance(data, int):
            self.send_error(data)
            return
        if isinstance(data, str):  # moved elsewhere, as a mirror's front door does
            self.send_response(302)
            self.send_header("Location", data)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        if self.headers.get("Range") and server.honor_range:
            start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        if not server.no_length:  # without it, the body ends where the connection closes
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if server.drop_after is not None:  # send part of the body, then close the connection
            body, server.drop_after = body[:server.drop_after], None
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving():
    """A Handler server on 127.0.0.1, on a free port, for the duration of the block."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.files, srv.log, srv.honor_range, srv.drop_after, srv.busy, srv.retry_after = {}, [], True, None, 0, None
    srv.no_length = False
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


@pytest.fixture
def server():
    with serving() as srv:
        yield srv


@pytest.fixture
def other_server():
    """A second server, on another port: another host, as far as a URL is concerned."""
    with serving() as srv:
        yield srv


def wikitext_zip(tmp_path, padding=0, folder="wikitext-103-raw", articles=ARTICLES):
    """A small zip laid out like WikiText raw (train.raw: articles[:8], valid.raw: the rest); padding
    adds incompressible test-file bytes."""
    path = tmp_path / "made.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{folder}/wiki.train.raw", " \n" + "".join(articles[:8]))
        zf.writestr(f"{folder}/wiki.valid.raw", " \n" + "".join(articles[8:]))
        zf.writestr(f"{folder}/wiki.test.raw", np.random.default_rng(0).bytes(padding) + b"\n")
    return path.read_bytes()


def url(server, path="/wt.zip"):
    return f"http://127.0.0.1:{server.server_port}{path}"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def publish(monkeypatch, name, urls, size, digest):
    """Make the dataset called name one served by the test's servers, with the size and sha256 given."""
    dataset = dataclasses.replace(fetch.DATASETS[name], urls=tuple(urls), size=size, sha256=digest)
    monkeypatch.setitem(fetch.DATASETS, name, dataset)


def cached(out, address):
    """Where a --url's zip is kept in out."""
    return pathlib.Path(fetch.cache_path(str(out), address, None))


def test_download_and_prepare(tmp_path, server, capsys):
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    out = tmp_path / "out"
    argv = ["--url", url(server), "--out_dir", str(out), "--num_proc", "1"]
    meta = pw.prepare_data(argv)
    assert server.log == [("/wt.zip", None, fetch.USER_AGENT)]
    zip_path = cached(out, url(server))
    assert zip_path.read_bytes() == data and not pathlib.Path(f"{zip_path}.part").exists()
    assert read_docs(out / "train.bin") == ARTICLES[:8]
    assert read_docs(out / "val.bin") == ARTICLES[8:]
    assert meta["source"] == {"dataset": None, "zip": str(zip_path), "url": url(server), "sha256": sha256(data),
                              "urls": [url(server)], "expected_sha256": None}
    # a zip the script knows nothing of: its sha256 is printed, to pin it with next time
    assert (f"sha256 of {zip_path}: {sha256(data)} (not checked; pass --sha256 {sha256(data)} to insist on these "
            "bytes next time)") in capsys.readouterr().out
    assert pw.prepare_data(argv)["source"] == meta["source"]  # the checked zip is reused: no second request
    assert len(server.log) == 1


def test_a_full_disk_during_the_download(tmp_path, server, monkeypatch):
    data = wikitext_zip(tmp_path, padding=300_000)
    server.files["/wt.zip"] = data
    out = tmp_path / "out"
    argv = ["--url", url(server), "--out_dir", str(out), "--num_proc", "1"]
    part = pathlib.Path(f"{cached(out, url(server))}.part")
    break_open(monkeypatch, part.name, errno.ENOSPC, room=100_000)  # full after 100 kB
    message = exit_message(argv)
    assert message == (f"error: cannot write {part}: no space left on device; {FULL}; the next run resumes "
                       "the download")
    assert len(server.log) == 1  # not retried, and no other URL tried: the server was not at fault
    kept = part.read_bytes()
    assert 0 < len(kept) <= 100_000 and data.startswith(kept)  # what was downloaded is kept, and sound
    monkeypatch.undo()  # space freed
    pw.prepare_data(argv)
    assert server.log[1][1] == f"bytes={len(kept)}-"  # resumed
    assert cached(out, url(server)).read_bytes() == data and read_docs(out / "val.bin") == ARTICLES[8:]


def test_resume_from_part(tmp_path, server):
    data = wikitext_zip(tmp_path)
    server.files["/wt.zip"] = data
    part = tmp_path / "wt.zip.part"
    part.write_bytes(data[:1000])
    fetch.download(fetch.http_session(1), url(server), str(part), expected_size=len(data), attempts=1)
    assert server.log == [("/wt.zip", "bytes=1000-", fetch.USER_AGENT)]
    assert part.read_bytes() == data


def test_resume_after_dropped_connection(tmp_path, server, monkeypatch):
    monkeypatch.setattr(fetch, "BACKOFF_S", 0)
    data = wikitext_zip(tmp_path, padding=300_000)
    server.files["/wt.zip"], server.drop_after = data, 200_000
    part = tmp_path / "wt.zip.part"
    fetch.download(fetch.http_session(3), url(server), str(part), expected_size=len(data), attempts=3)
    assert [entry[1] is None for entry in server.log] == [True, False]
    resumed_at = int(server.log[1][1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 200_000  # the second request asks for what the first did not deliver
    assert part.read_bytes() == data


def test_a_download_cut_half_way_resumes_from_its_part(tmp_path, server, capsys):
    data = wikitext_zip(tmp_path, padding=300_000)
    server.files["/wt.zip"], server.drop_after = data, 150_000  # the connection drops after 150 kB
    out = tmp_path / "out"
    meta = pw.prepare_data(["--url", url(server), "--out_dir", str(out), "--num_proc", "1"])
    first, second = server.log
    resumed_at = int(second[1].removeprefix("bytes=").rstrip("-"))
    assert first[1] is None and 0 < resumed_at <= 150_000  # the second request asks for the rest only
    assert f"connection closed after {resumed_at:,} of {len(data):,} bytes; resuming" in capsys.readouterr().err
    assert cached(out, url(server)).read_bytes() == data and meta["source"]["sha256"] == sha256(data)
    assert read_docs(out / "train.bin") == ARTICLES[:8] and read_docs(out / "val.bin") == ARTICLES[8:]


def test_a_busy_server_is_asked_again_when_its_retry_after_says(tmp_path, server, monkeypatch, capsys):
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    server.busy, server.retry_after = 2, 7  # two 503 answers that say "come back in 7 s", then the file
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)  # urllib3 waits with time.sleep: note the waits instead
    out = tmp_path / "out"
    meta = pw.prepare_data(["--url", url(server), "--out_dir", str(out), "--num_proc", "1", "--retries", "3"])
    assert waits == [7, 7]  # the server's wait, not the backoff's (none, then 2 s)
    assert len(server.log) == 3 and meta["source"]["sha256"] == sha256(data)
    assert read_docs(out / "train.bin") == ARTICLES[:8]
    failures = [line for line in capsys.readouterr().err.splitlines() if "failed" in line]
    assert failures == [f"127.0.0.1: attempt {i}/3 failed: HTTP 503; retrying in 7 s" for i in (1, 2)]


def test_server_ignoring_range_restarts(tmp_path, server):
    data = wikitext_zip(tmp_path)
    server.files["/wt.zip"], server.honor_range = data, False
    part = tmp_path / "wt.zip.part"
    part.write_bytes(b"stale bytes from another file")
    fetch.download(fetch.http_session(1), url(server), str(part), expected_size=len(data), attempts=1)
    assert server.log[0][1] == f"bytes={len(b'stale bytes from another file')}-"
    assert part.read_bytes() == data  # the 200 answer replaced the stale part instead of appending


def test_bad_zip_is_rejected_and_deleted(tmp_path, server):
    server.files["/bad.zip"] = b"this is not a zip file\n" * 100
    out = tmp_path / "out"
    message = exit_message(["--url", url(server, "/bad.zip"), "--out_dir", str(out), "--num_proc", "1"])
    assert "not a valid zip" in message and "deleted" in message and "--zip" in message
    assert outputs(out) == []
    # a truncated download: wrong size when the size is known, a broken zip when it is not
    data = wikitext_zip(tmp_path)
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(data[:len(data) // 2])
    for expected_size, problem in [(len(data), f"has {len(data) // 2:,} bytes, expected {len(data):,}"),
                                   (None, "is not a valid zip (File is not a zip file)")]:
        assert fetch.examine_zip(str(truncated), fetch.Expected(expected_size, None, ""))[0] == problem


def test_http_404_and_refused_connection(tmp_path, server, monkeypatch):
    monkeypatch.setattr(fetch, "BACKOFF_S", 0)
    message = exit_message(["--url", url(server, "/missing.zip"), "--out_dir", str(tmp_path / "a")])
    assert "404" in message and "HINT" in message and "--input" in message
    assert len(server.log) == 1  # a 4xx answer is not retried
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    message = exit_message(["--url", f"http://127.0.0.1:{port}/wt.zip", "--out_dir", str(tmp_path / "b"),
                            "--retries", "2"])
    assert "gave up after 2 attempts" in message and "HINT" in message


def test_falls_back_to_the_next_url(tmp_path, server, monkeypatch):
    monkeypatch.setattr(fetch, "BACKOFF_S", 0)
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    urls = [url(server, "/gone.zip"), url(server, "/wt.zip")]  # the main host fails, the mirror works
    expected = fetch.Expected(len(data), sha256(data), "the test's")
    origin = fetch.fetch_file(urls, str(tmp_path / "wt.zip"), expected, attempts=1, hint="")
    assert [entry[0] for entry in server.log] == ["/gone.zip", "/wt.zip"]
    assert (tmp_path / "wt.zip").read_bytes() == data and origin == {"url": urls[1], "sha256": sha256(data)}


def test_server_errors_are_retried(tmp_path, server, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "BACKOFF_S", 0)
    server.files["/busy.zip"] = 503
    with pytest.raises(fetch.DownloadError, match="gave up after 3 attempts: HTTP 503 Service Unavailable"):
        fetch.download(fetch.http_session(3), url(server, "/busy.zip"), str(tmp_path / "busy.zip.part"), None, attempts=3)
    assert len(server.log) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"downloading {url(server, '/busy.zip')}"
    assert lines[1:] == [f"127.0.0.1: attempt {i}/3 failed: HTTP 503; {next_step}"
                         for i, next_step in [(1, "retrying in 0 s"), (2, "retrying in 0 s"), (3, "giving up")]]


def test_unknown_host_is_not_retried(tmp_path, server, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "BACKOFF_S", 0)
    real_getaddrinfo, lookups = socket.getaddrinfo, []

    def getaddrinfo(host, *args, **kwargs):  # what a resolver answers for .invalid, without asking one
        if host.endswith(".invalid"):
            lookups.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    urls = ["http://nonexistent.invalid/wt.zip", url(server, "/wt.zip")]  # offline host first, then a mirror
    expected = fetch.Expected(len(data), None, "")
    fetch.fetch_file(urls, str(tmp_path / "wt.zip"), expected, attempts=5, hint="")
    assert (tmp_path / "wt.zip").read_bytes() == data
    assert lookups == ["nonexistent.invalid"]  # one attempt, then the next URL at once
    failure = [line for line in capsys.readouterr().err.splitlines() if "failed" in line]
    assert failure == ["nonexistent.invalid: attempt 1/5 failed: cannot resolve the host name nonexistent.invalid "
                       "([Errno -2] Name or service not known): offline, or a wrong name; a retry cannot help"]


def test_ssl_failure_is_not_retried(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "BACKOFF_S", 0)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    connections, done = [], threading.Event()

    def answer_in_plain_text():  # an HTTP server where the URL promises HTTPS: the TLS handshake fails
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = listener.accept()
                connections.append(conn)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
                conn.close()

    thread = threading.Thread(target=answer_in_plain_text, daemon=True)
    thread.start()
    try:
        with pytest.raises(fetch.DownloadError, match="SSL error"):
            fetch.download(fetch.http_session(3), f"https://127.0.0.1:{listener.getsockname()[1]}/wt.zip",
                        str(tmp_path / "wt.zip.part"), None, attempts=3)
    finally:
        done.set()
        thread.join(timeout=5)
        listener.close()
    assert len(connections) == 1  # one attempt only


# --------------------------------------------------------------------------- WikiText-2, and what a zip must be

def test_the_datasets_are_the_published_files():
    wikitext2 = fetch.DATASETS["wikitext2"]
    assert wikitext2.urls == ("https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
                              "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip")
    assert (wikitext2.file, wikitext2.size, wikitext2.out_dir, wikitext2.detokenize) == (
        "wikitext-2-raw-v1.zip", 4_721_645, "data/wikitext2", True)
    assert wikitext2.sha256 == "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11"
    wikitext103 = fetch.DATASETS["wikitext103"]
    assert (wikitext103.file, wikitext103.size, wikitext103.out_dir, wikitext103.detokenize) == (
        "wikitext-103-raw-v1.zip", 191_984_949, "data/wikitext103", False)  # the fallback's folder
    assert wikitext103.sha256 == "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794"
    config = {}
    with open(os.path.join(REPO, "config", "tiny_cpu.py")) as f:
        exec(f.read(), config)  # a config file is plain Python
    assert config["data_dir"] == wikitext2.out_dir  # the CPU quick start reads what --dataset wikitext2 writes


def test_wikitext2_is_checked_then_prepared(tmp_path, server, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default --out_dir, data/wikitext2, lands here
    monkeypatch.setattr(fetch, "BACKOFF_S", 0)
    data = wikitext_zip(tmp_path, folder="wikitext-2-raw")
    server.files["/wikitext-2-raw-v1.zip"] = data
    urls = [url(server, "/gone.zip"), url(server, "/wikitext-2-raw-v1.zip")]  # the main host fails, the mirror works
    out = tmp_path / "data" / "wikitext2"
    argv = ["--dataset", "wikitext2", "--num_proc", "1"]
    # the real size and hash: the server's 10 kB are refused before they are downloaded
    publish(monkeypatch, "wikitext2", urls, 4_721_645, fetch.DATASETS["wikitext2"].sha256)
    message = exit_message(argv)
    assert f"server offers {len(data):,} bytes, expected 4,721,645" in message
    assert "`python prepare_wikipedia.py --zip FILE --dataset wikitext2`" in message  # what to do
    # unzipped, the same settings: detokenized into data/wikitext2, where config/tiny_cpu.py reads
    assert ("`python prepare_wikipedia.py --input wiki.train.raw wiki.valid.raw --detokenize "
            "--out_dir data/wikitext2`") in message
    # the real hash pinned: downloaded, refused, deleted
    publish(monkeypatch, "wikitext2", urls, len(data), fetch.DATASETS["wikitext2"].sha256)
    message = exit_message(argv)
    part = "data/wikitext2/wikitext-2-raw-v1.zip.part"  # relative, as the default --out_dir is
    published = "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11"
    assert (f"{urls[1]}: {part} has sha256 {sha256(data)}, not {published}, the published sha256 of "
            "wikitext-2-raw-v1.zip; deleted it") in message
    assert message.startswith("error: could not download the data: ") and "\n" not in message
    assert outputs(out) == []
    # the hash replaced by the test's: it prepares, detokenized by default
    publish(monkeypatch, "wikitext2", urls, len(data), sha256(data))
    meta = pw.prepare_data(argv)
    # wiki.train.raw, then wiki.valid.raw
    assert read_docs(out / "train.bin") == [fetch.detokenize(a) for a in ARTICLES[:8]]
    assert read_docs(out / "val.bin") == [fetch.detokenize(a) for a in ARTICLES[8:]]
    assert meta["detokenize"] is True and meta["split"] == "wikitext"
    assert meta["source"] == {"dataset": "wikitext2", "zip": "data/wikitext2/wikitext-2-raw-v1.zip", "url": urls[1],
                              "sha256": sha256(data), "urls": urls, "expected_sha256": sha256(data)}
    assert outputs(out) == ["meta.json", "train.bin", "val.bin", "wikitext-2-raw-v1.zip",
                            "wikitext-2-raw-v1.zip.origin.json"]
    assert "error" not in capsys.readouterr().out


def test_wikitext2_download_resumes(tmp_path, server, monkeypatch):
    data = wikitext_zip(tmp_path, folder="wikitext-2-raw", padding=100_000)
    server.files["/wikitext-2-raw-v1.zip"] = data
    publish(monkeypatch, "wikitext2", [url(server, "/wikitext-2-raw-v1.zip")], len(data), sha256(data))
    out = tmp_path / "out"
    out.mkdir()
    (out / "wikitext-2-raw-v1.zip.part").write_bytes(data[:30_000])  # what an interrupted run left
    pw.prepare_data(["--dataset", "wikitext2", "--out_dir", str(out), "--num_proc", "1"])
    assert server.log == [("/wikitext-2-raw-v1.zip", "bytes=30000-", fetch.USER_AGENT)]
    assert (out / "wikitext-2-raw-v1.zip").read_bytes() == data
    assert read_docs(out / "val.bin") == [fetch.detokenize(a) for a in ARTICLES[8:]]


def test_a_cached_zip_with_other_bytes_is_not_used(tmp_path, server, monkeypatch, capsys):
    data = wikitext_zip(tmp_path)
    other = wikitext_zip(tmp_path, articles=[a.replace("History", "Mystery") for a in ARTICLES])
    assert len(other) == len(data) and other != data  # the right size, and a sound zip of other text
    server.files["/wikitext-103-raw-v1.zip"] = data
    publish(monkeypatch, "wikitext103", [url(server, "/wikitext-103-raw-v1.zip")], len(data), sha256(data))
    out = tmp_path / "out"
    out.mkdir()
    zip_path = out / "wikitext-103-raw-v1.zip"
    zip_path.write_bytes(other)
    argv = ["--dataset", "wikitext103", "--out_dir", str(out), "--num_proc", "1"]
    meta = pw.prepare_data(argv)
    assert (f"warning: {zip_path} has sha256 {sha256(other)}, not {sha256(data)}, the published sha256 of "
            f"wikitext-103-raw-v1.zip: not used; renamed it to {zip_path}.bad; downloading again"
            in capsys.readouterr().err)
    assert (out / "wikitext-103-raw-v1.zip.bad").read_bytes() == other  # moved aside, not deleted
    assert zip_path.read_bytes() == data and read_docs(out / "train.bin") == ARTICLES[:8]
    assert meta["source"]["sha256"] == sha256(data) and len(server.log) == 1
    zip_path.write_bytes(other)  # once more: a second .bad does not replace the first
    pw.prepare_data(argv)
    assert (out / "wikitext-103-raw-v1.zip.bad.1").read_bytes() == other and len(server.log) == 2


def test_a_redirect_is_recorded(tmp_path, server, other_server, capsys):
    other_server.files["/files/wt.zip"] = wikitext_zip(tmp_path)
    server.files["/wt.zip"] = url(other_server, "/files/wt.zip")
    out = tmp_path / "out"
    meta = pw.prepare_data(["--url", url(server), "--out_dir", str(out), "--num_proc", "1"])
    assert meta["source"]["url"] == url(other_server, "/files/wt.zip") and meta["source"]["urls"] == [url(server)]
    redirected = f"127.0.0.1:{server.server_port}: redirected to {url(other_server, '/files/wt.zip')}"
    assert redirected in capsys.readouterr().err
    assert read_docs(out / "train.bin") == ARTICLES[:8]
    # reused from the cache, the zip still names where its bytes came from
    assert pw.prepare_data(["--url", url(server), "--out_dir", str(out), "--num_proc", "1"])["source"] == meta["source"]


def test_a_second_url_with_the_same_file_name_has_a_cache_of_its_own(tmp_path, server):
    server.files["/a/wt.zip"] = wikitext_zip(tmp_path)
    server.files["/b/wt.zip"] = wikitext_zip(tmp_path, articles=ARTICLES[::-1])
    out = tmp_path / "out"
    first = pw.prepare_data(["--url", url(server, "/a/wt.zip"), "--out_dir", str(out), "--num_proc", "1"])
    second = pw.prepare_data(["--url", url(server, "/b/wt.zip"), "--out_dir", str(out), "--num_proc", "1"])
    assert [entry[0] for entry in server.log] == ["/a/wt.zip", "/b/wt.zip"]
    assert read_docs(out / "train.bin") == ARTICLES[::-1][:8]  # the second URL's text
    assert second["source"]["url"] == url(server, "/b/wt.zip")
    assert second["source"]["sha256"] == sha256(server.files["/b/wt.zip"]) != first["source"]["sha256"]
    assert cached(out, url(server, "/a/wt.zip")).read_bytes() == server.files["/a/wt.zip"]  # the first's, kept


def test_sha256_pins_a_url(tmp_path, server):
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    out = tmp_path / "out"
    argv = ["--url", url(server), "--out_dir", str(out), "--num_proc", "1"]
    wrong = sha256(b"other bytes")
    message = exit_message([*argv, "--sha256", wrong.upper()])  # either case
    part = f"{cached(out, url(server))}.part"
    assert message == (f"error: could not download the data: {url(server)}: {part} has sha256 {sha256(data)}, not "
                       f"{wrong}, given by --sha256; deleted it; HINT: download {url(server)} by hand and run "
                       f"`python prepare_wikipedia.py --zip FILE --sha256 {wrong} --out_dir "
                       f"{out}`, or unzip it and run `python prepare_wikipedia.py --input "
                       f"wiki.train.raw wiki.valid.raw --out_dir {out}`")
    assert outputs(out) == []
    meta = pw.prepare_data([*argv, "--sha256", sha256(data)])
    assert meta["source"]["sha256"] == meta["source"]["expected_sha256"] == sha256(data)
    # a cached zip whose bytes changed since it was downloaded: refused, even with no --sha256
    zip_path = cached(out, url(server))
    zip_path.write_bytes(data[:-1] + b"!")
    pw.prepare_data(argv)
    assert pathlib.Path(f"{zip_path}.bad").exists() and zip_path.read_bytes() == data and len(server.log) == 3


def test_a_zip_given_by_hand_is_checked(tmp_path, monkeypatch):
    zip_path = tmp_path / "mine.zip"
    zip_path.write_bytes(data := wikitext_zip(tmp_path))
    argv = ["--zip", str(zip_path), "--out_dir", str(tmp_path / "out"), "--num_proc", "1"]
    message = exit_message(argv)  # checked against WikiText-103's published sha256
    published = fetch.DATASETS['wikitext103'].sha256
    assert message == (f"error: {zip_path} has sha256 {sha256(data)}, not {published}, the "
                       f"published sha256 of wikitext-103-raw-v1.zip; HINT: if it is a zip of your own in WikiText's "
                       f"layout, pass --sha256 {sha256(data)} to use it; if it should be the published one, download "
                       "it again")
    assert zip_path.read_bytes() == data  # the user's file, left as it was
    meta = pw.prepare_data([*argv, "--sha256", sha256(data)])
    assert meta["source"]["sha256"] == sha256(data) and read_docs(tmp_path / "out" / "train.bin") == ARTICLES[:8]
    # the published WikiText-2 zip, given without --dataset: the message says which flag is missing
    publish(monkeypatch, "wikitext2", [], len(data), sha256(data))
    assert exit_message(argv).endswith("HINT: it is the published wikitext-2-raw-v1.zip: add --dataset wikitext2")


@pytest.mark.parametrize("flags, problem", [
    (["--input", "a.txt", "--dataset", "wikitext2"], "--dataset names a zip to read, and --input names text files"),
    (["--input", "a.txt", "--sha256", "0" * 64], "--sha256 names a zip to read, and --input names text files"),
    (["--zip", "a.zip", "--url", "http://127.0.0.1:9/a.zip"], "--zip names a zip on disk, --url one to download"),
    (["--url", "http://127.0.0.1:9/a.zip", "--sha256", "abc"], "--sha256 must be 64 hexadecimal digits, got 'abc'"),
    (["--dataset", "wikitext2", "--sha256", "0" * 64], "--sha256 pins the zip of a --url or a --zip"),
])
def test_zip_settings_that_contradict(tmp_path, flags, problem):
    message = exit_message([*flags, "--out_dir", str(tmp_path / "out")])
    assert message.startswith("error: ") and problem in message and "\n" not in message


# --------------------------------------------------------------------------- bench.py --prepare

def test_the_bench_corpus_is_wikitext_like(tmp_path):
    path = tmp_path / "corpus.txt"
    bench.write_corpus(str(path), 300_000)
    text = path.read_text()
    assert len(text) == 300_000 and " @-@ " in text and " , " in text
    docs = list(fetch.file_documents([str(path)]))
    assert len(docs) > 10  # articles, each under its heading
    assert all(fetch.HEADING.fullmatch(doc.splitlines()[0]) for doc in docs)


@pytest.mark.parametrize("path", ["documents", "the write-ups' text path"])
def test_bench_prepare_sets_prepare_beside_tiktoken(tmp_path, capsys, path):
    # one round on a small corpus: bench_prepare itself checks that prepare and tiktoken made the
    # same tokens (on the write-ups' path, tiktoken's batch API gets the pieces prepare cuts)
    writeup = ["--writeup"] if path != "documents" else []
    argv = ["--prepare", *writeup, "--mb", "0.3", "--rounds", "1", "--memory_at", ""]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert re.search(rf"prepare_wikipedia.py \({path}\), \d+ tokenizer threads; load average "
                     r"[\d.]+ on \d+ CPUs", printed)
    assert re.search(r"M tokens: tiktoken [\d.]+M tokens/s, prepare [\d.]+M tokens/s: ratio [\d.]+; prepare's "
                     r"encoder alone [\d.]+M tokens/s, prepare keeps [\d.]+ of it\n", printed)
    assert re.search(r"ratio, median of 1: ([\d.]+) \(goal: 0.85 or more; from \1 to \1\); of prepare's own "
                     r"encoder: [\d.]+\n", printed)
    assert re.search(r"1x \(0 MB of text\): peak memory \d+ MiB, -?\d+ MiB above the imports' \d+ MiB", printed)


# ----------------------------------------------------------------- the write-ups' own data

def writeups_tokens(path):
    """The write-ups' own method (datasets/prepare_data.py of yiphei/yif-AI), line for line: the
    reference. Returns the bytes of their train and val token files."""
    data = open(path, "r", encoding="utf-8").read()
    n = len(data)
    train_ids = ENC.encode_ordinary(data[:int(n * 0.9)])
    val_ids = ENC.encode_ordinary(data[int(n * 0.9):])
    return tuple(np.array(ids, dtype=np.uint16).tobytes() for ids in (train_ids, val_ids))


# Unicode's White_Space characters, all of which tiktoken's \s matches
WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200b)))
               + "\u2028\u2029\u202f\u205f\u3000")
# what the pre-tokenizer treats in its own ways: newlines of every kind, runs of spaces and
# newlines, digits, contractions, non-Latin scripts, emoji (with modifiers and joiners), the
# special token's text, and characters that look like spaces but are not White_Space
FRAGMENTS = ["\r\n", "\r", "\n", "\n\n", "\n\n\n", "\r\r\n", "  ", " " * 7, " " * 40, "\n" * 30,
             " \n", "\n ", "\t", " \t\n", "the", " the", "Word", " 1984", "3.14159", "0", " 12",
             "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", " don't", "I'm", " they'LL", "''", " '",
             "日本語", " 中文", "Привет", " مرحبا", "हिन्दी", "🎉", " 👍🏽", "🏳️‍🌈",
             "<|endoftext|>", " <|endoftext|>", ".", ",", "!?", " ...", "(", ")", "—", " -", "@-@",
             " = Title = ", "é", "e\u0301", "ß", "\x1c", "\x1d", "\x1e", "\x1f", "\u180e", "\u200b",
             "\ufeff", *WHITE_SPACE]


def adversarial_text(n_fragments, seed=0):
    rng = np.random.default_rng(seed)
    return "".join(rng.choice(np.array(FRAGMENTS, dtype=object), size=n_fragments))


def cuts_allowed(text):
    """Slow reference of LAST_CUT: every place where a piece may end, after a character that is
    not whitespace and before a space or a newline."""
    return [p for p in range(1, len(text)) if not text[p - 1].isspace() and text[p] in " \n"]


def test_every_white_space_character_is_a_space_to_python():
    # LAST_CUT's \S (not str.isspace()) must never be a character that tiktoken's \s matches
    assert all(character.isspace() for character in WHITE_SPACE)


def test_a_cut_where_last_cut_allows_tokenizes_as_the_whole():
    # every string of up to 4 characters of an alphabet of the pre-tokenizer's cases, and longer
    # random ones: at each allowed cut, the two sides' tokens are the whole's; elsewhere they often
    # are not
    alphabet = ["a", "1", "'", "s", " ", "\n", "\t", ".", "\u3000", "\x1c", "日"]
    texts = ["".join(t) for n in range(2, 5) for t in itertools.product(alphabet, repeat=n)]
    rng = np.random.default_rng(1)
    texts += ["".join(rng.choice(alphabet, size=rng.integers(5, 15))) for _ in range(2000)]
    allowed_cuts, other_cuts_that_differ = 0, 0
    for text in texts:
        whole, allowed = ENC.encode_ordinary(text), cuts_allowed(text)
        for p in range(1, len(text)):
            same = ENC.encode_ordinary(text[:p]) + ENC.encode_ordinary(text[p:]) == whole
            assert same or p not in allowed, (text, p)
            allowed_cuts += p in allowed
            other_cuts_that_differ += not same
        last = fetch.LAST_CUT.match(text)
        assert (last.end() if last else None) == (allowed[-1] if allowed else None), text
    assert allowed_cuts > 5000 and other_cuts_that_differ > 1000  # the test can fail


def test_the_pieces_tokenize_as_the_write_ups_whole_parts(tmp_path, monkeypatch):
    # 3 MB of adversarial text (\r\n and a lone \r among them), cut into more than 1,000 pieces
    monkeypatch.setattr(fetch, "PIECE_CHARS", 2000)
    path = tmp_path / "wikipedia.txt"
    path.write_bytes(adversarial_text(700_000).encode())  # bytes: the \r stay as they are
    assert path.stat().st_size >= 3_000_000
    theirs = writeups_tokens(path)
    text = open(path, encoding="utf-8").read()
    cut = int(len(text) * 0.9)
    n_pieces = 0
    for (name, pieces), part, expected in zip(fetch.writeup_parts(str(path)),
                                              (text[:cut], text[cut:]), theirs):
        pieces = list(pieces)
        n_pieces += len(pieces)
        assert "".join(pieces) == part  # the pieces are the part, \r\n and \r read as \n
        ours = [token for piece in pieces for token in ENC.encode_ordinary(piece)]
        assert np.array(ours, dtype=np.uint16).tobytes() == expected, name
    assert n_pieces > 1000
    # a naive cut, just after the last newline, does not tokenize alike: the test can fail
    monkeypatch.setattr(fetch, "LAST_CUT", re.compile(r".*\n", re.S))
    train_pieces = fetch.writeup_parts(str(path))[0][1]
    naive = [token for piece in train_pieces for token in ENC.encode_ordinary(piece)]
    assert np.array(naive, dtype=np.uint16).tobytes() != theirs[0]


def publish_writeup(monkeypatch, server, files, paths=("/media", "/raw")):
    """Make the write-ups' files, {name: bytes}, those of the test's server: served under each of
    paths, pinned with their size and sha256. Returns the URLs of each, by name."""
    urls = {}
    for name, body in files.items():
        urls[name] = [url(server, f"{path}/{name}") for path in paths]
        for path in paths:
            server.files[f"{path}/{name}"] = body
        pinned = fetch.Pinned(tuple(urls[name]), len(body), sha256(body))
        monkeypatch.setitem(fetch.WRITEUP_FILES, name, pinned)
    return urls


def writeup_files(tmp_path, n_fragments=3000):
    """{name: bytes} of a small adversarial wikipedia.txt and of the token files that the
    write-ups' method makes of it."""
    text = tmp_path / "made.txt"
    text.write_bytes(adversarial_text(n_fragments, seed=2).encode())
    train, val = writeups_tokens(text)
    return {"wikipedia.txt": text.read_bytes(), "wikipedia_train.bin": train,
            "wikipedia_val.bin": val}


IDENTICAL = "identical to the write-ups' own token files (wikipedia_train.bin, wikipedia_val.bin)"
TOKEN_FILES = ("wikipedia_train.bin", "wikipedia_val.bin")


def test_the_write_ups_text_is_downloaded_and_tokenized_as_theirs(tmp_path, server, monkeypatch,
                                                                  capsys):
    monkeypatch.chdir(tmp_path)  # the default --out_dir, data/wikipedia, lands here
    monkeypatch.setattr(fetch, "PIECE_CHARS", 500)  # many pieces, on several threads
    files = writeup_files(tmp_path)
    urls = publish_writeup(monkeypatch, server, files)
    meta = pw.prepare_data(["--threads", "2"])  # the default: the write-ups' text
    out = tmp_path / "data" / "wikipedia"
    assert (out / "train.bin").read_bytes() == files["wikipedia_train.bin"]
    assert (out / "val.bin").read_bytes() == files["wikipedia_val.bin"]
    assert IDENTICAL in capsys.readouterr().out.splitlines()
    assert server.log == [("/media/wikipedia.txt", None, fetch.USER_AGENT)]  # the text only
    assert (meta["dataset"], meta["split"], meta["detokenize"]) == ("writeup", "writeup", False)
    assert meta["source"] == {
        "dataset": "writeup", "commit": fetch.WRITEUP_COMMIT,
        "text": "data/wikipedia/wikipedia.txt",
        "url": urls["wikipedia.txt"][0], "sha256": sha256(files["wikipedia.txt"]),
        "urls": urls["wikipedia.txt"],
        "token_files_sha256": {name: sha256(files[name]) for name in TOKEN_FILES}}
    for split in ("train", "val"):
        assert meta[split]["tokens"] * 2 == len(files[f"wikipedia_{split}.bin"])
        assert meta[split]["sha256"] == sha256(files[f"wikipedia_{split}.bin"])
    assert outputs(out) == ["meta.json", "train.bin", "val.bin", "wikipedia.txt",
                            "wikipedia.txt.origin.json"]
    identity = data.check_data(str(out), block_size=8, vocab_size=50257)  # what train.py checks
    assert identity["train_sha256"] == meta["train"]["sha256"]
    pw.prepare_data([])  # the text kept in data/wikipedia is used again: no second download
    assert len(server.log) == 1 and IDENTICAL in capsys.readouterr().out


def test_tokens_other_than_the_write_ups_are_not_written(tmp_path, server, monkeypatch):
    files = writeup_files(tmp_path)
    files["wikipedia_val.bin"] = b"other tokens"  # pinned, as if their val file were another
    publish_writeup(monkeypatch, server, files)
    out = tmp_path / "out"
    message = exit_message(["--out_dir", str(out), "--threads", "1"])
    val = sha256(writeups_tokens(tmp_path / "made.txt")[1])
    assert message == (f"error: val.bin differs from the write-ups' wikipedia_val.bin: sha256 "
                       f"{val}, theirs {sha256(b'other tokens')}; no output written under the "
                       "final names; HINT: --tokens fetches their token files directly")
    assert outputs(out) == ["wikipedia.txt", "wikipedia.txt.origin.json"]  # kept for next time


def test_the_write_ups_token_files(tmp_path, server, monkeypatch, capsys):
    files = writeup_files(tmp_path)
    urls = publish_writeup(monkeypatch, server, files)

    def no_tokenizer(name):
        raise AssertionError("--tokens needs no tokenizer")

    monkeypatch.setattr(fetch.tiktoken, "get_encoding", no_tokenizer)
    out = tmp_path / "out"
    meta = pw.prepare_data(["--tokens", "--out_dir", str(out)])
    assert (out / "train.bin").read_bytes() == files["wikipedia_train.bin"]
    assert (out / "val.bin").read_bytes() == files["wikipedia_val.bin"]
    assert [entry[0] for entry in server.log] == [f"/media/{name}" for name in TOKEN_FILES]
    assert meta["source"] == {"dataset": "writeup", "commit": fetch.WRITEUP_COMMIT, **{
        name: {"url": urls[name][0], "sha256": sha256(files[name]), "urls": urls[name]}
        for name in TOKEN_FILES}}
    tokens = np.frombuffer(files["wikipedia_train.bin"], dtype=np.uint16)
    assert meta["train"] == {"tokens": len(tokens), "max_token_id": tokens.max(),
                             "sha256": sha256(files["wikipedia_train.bin"])}
    assert IDENTICAL in capsys.readouterr().out.splitlines()
    assert outputs(out) == ["meta.json", "train.bin", "val.bin", "wikipedia_train.bin",
                            "wikipedia_train.bin.origin.json", "wikipedia_val.bin",
                            "wikipedia_val.bin.origin.json"]


LFS_POINTER_TEXT = (b"version https://git-lfs.github.com/spec/v1\noid sha256:"
                    b"be17913eb060032dacc0155670c999d97e8ba57fd45135fe11b1a56c1b6d7bbf\n"
                    b"size 178723194\n")


POINTER_SENT = (f"the server sent a Git LFS pointer ({len(LFS_POINTER_TEXT)} bytes), not the file: "
                "GitHub does not serve it now (its owner's LFS quota spent, or the file gone)")


@pytest.mark.parametrize("answer, problem, no_length", [
    (403, "HTTP 403 Forbidden", False),  # the owner's LFS quota spent
    (LFS_POINTER_TEXT, POINTER_SENT, False),
    (LFS_POINTER_TEXT, POINTER_SENT, True),  # sent without its size: known once it is read
    (b"x" * 5000, "server offers 5,000 bytes, expected {size:,}", False),
])
def test_a_text_github_does_not_serve(tmp_path, server, monkeypatch, answer, problem, no_length):
    monkeypatch.chdir(tmp_path)
    server.no_length = no_length
    files = writeup_files(tmp_path)
    urls = publish_writeup(monkeypatch, server, files)["wikipedia.txt"]
    for path in ("/media/wikipedia.txt", "/raw/wikipedia.txt"):
        server.files[path] = answer
    message = exit_message([])
    problem = problem.format(size=len(files["wikipedia.txt"]))
    # both ways on write where the quick start reads
    assert message == (
        f"error: could not download the data: {urls[0]}: {problem}; {urls[1]}: {problem}; HINT: "
        "`python prepare_wikipedia.py --tokens` fetches their token files instead, or `python "
        "prepare_wikipedia.py --dataset=wikitext103 --split=writeup --out_dir data/wikipedia` "
        "prepares WikiText-103 in their regime")
    assert not (tmp_path / "data").exists()  # no folder made, no data.lock left in one


def test_a_failed_download_into_a_folder_of_the_users_keeps_the_folder(tmp_path, server,
                                                                       monkeypatch):
    publish_writeup(monkeypatch, server, {name: b"\0\0" for name in TOKEN_FILES})
    server.files["/media/wikipedia_train.bin"] = server.files["/raw/wikipedia_train.bin"] = 404
    out = tmp_path / "mine"
    out.mkdir()
    message = exit_message(["--tokens", "--out_dir", str(out)])
    # not back to a download of their text, which would fail too offline: by hand, or WikiText-103
    text_url = fetch.WRITEUP_FILES["wikipedia.txt"].urls[0]
    assert message.endswith(
        f"HINT: download {text_url} by hand and run `python prepare_wikipedia.py --dataset=writeup "
        f"--input wikipedia.txt --out_dir {out}`, or `python prepare_wikipedia.py "
        f"--dataset=wikitext103 --split=writeup --out_dir {out}` prepares WikiText-103 in their "
        "regime")
    assert out.is_dir() and os.listdir(out) == []  # the user's folder stays, without the lock


def test_a_wikitext_hint_keeps_the_split_and_the_folder(tmp_path, server, monkeypatch):
    monkeypatch.setattr(fetch, "BACKOFF_S", 0)
    publish(monkeypatch, "wikitext103", [url(server, "/gone.zip")], 100, "0" * 64)
    out = tmp_path / "wt"
    message = exit_message(["--dataset", "wikitext103", "--split=writeup", "--train_tokens", "1000",
                            "--out_dir", str(out)])
    assert message.endswith(
        "`python prepare_wikipedia.py --zip FILE --dataset wikitext103 --split=writeup "
        f"--train_tokens 1000 --out_dir {out}`, or unzip it and run `python prepare_wikipedia.py "
        f"--input wiki.train.raw --split=writeup --train_tokens 1000 --out_dir {out}`")


@pytest.mark.parametrize("pinned", [True, False])
def test_a_copy_of_the_text_given_with_input(tmp_path, monkeypatch, capsys, pinned):
    files = writeup_files(tmp_path)
    path = tmp_path / "wikipedia.txt"
    path.write_bytes(files["wikipedia.txt"])
    if pinned:  # the test's text as the write-ups' own, and its tokens as theirs
        for name, body in files.items():
            pin = fetch.Pinned((), len(body), sha256(body))
            monkeypatch.setitem(fetch.WRITEUP_FILES, name, pin)
    out = tmp_path / "out"
    meta = pw.prepare_data(["--dataset=writeup", "--input", str(path), "--out_dir", str(out),
                            "--threads", "1"])
    assert (out / "train.bin").read_bytes() == files["wikipedia_train.bin"]  # their method
    assert (out / "val.bin").read_bytes() == files["wikipedia_val.bin"]
    captured = capsys.readouterr()
    warning = (f"warning: {path} is not the write-ups' wikipedia.txt (sha256 "
               f"{sha256(files['wikipedia.txt'])}): it is tokenized their way, but its tokens will "
               "not be theirs, and are not compared with theirs")
    assert (warning in captured.err.splitlines()) is not pinned
    assert (IDENTICAL in captured.out.splitlines()) is pinned  # compared only when it is theirs
    assert meta["source"]["text"] == str(path)
    assert (meta["source"]["token_files_sha256"] is None) is not pinned
    assert outputs(out) == ["meta.json", "train.bin", "val.bin"]  # nothing downloaded


def test_an_lfs_pointer_given_with_input_is_refused(tmp_path):
    path = tmp_path / "wikipedia.txt"  # what a clone of yiphei/yif-AI without Git LFS holds
    path.write_bytes(LFS_POINTER_TEXT)
    message = exit_message(["--input", str(path), "--dataset", "writeup",
                            "--out_dir", str(tmp_path / "out")])
    assert message == (f"error: {path} is a Git LFS pointer, not the text; HINT: `git lfs pull` in "
                       "your clone of yiphei/yif-AI, or drop --input to download it")


@pytest.mark.parametrize("flags, problem", [
    (["--split=writeup"], "error: --split does not apply to the write-ups' own text and split"),
    (["--dataset=writeup", "--zip", "a.zip"], "error: --zip does not apply to the write-ups'"),
    (["--max_chars", "100"], "error: --max_chars does not apply to the write-ups' own text"),
    (["--tokens", "--input", "a.txt"], "error: --tokens fetches the write-ups' token files, "),
    (["--tokens", "--dataset", "wikitext2"], "error: --tokens fetches the write-ups' token files: "
                                             "--dataset=writeup only"),
    (["--dataset=writeup", "--input", "a", "b"], "error: --dataset=writeup takes one --input file"),
    (["--num_proc", "0"], "error: --threads must be 1 or more, got 0"),  # one setting, two names
])
def test_writeup_settings_that_contradict(tmp_path, flags, problem):
    message = exit_message([*flags, "--out_dir", str(tmp_path / "out")])
    assert message.startswith(problem) and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_threads_is_the_name_and_num_proc_its_alias(capsys):
    with pytest.raises(SystemExit):
        pw.main(["--help"])
    assert "--threads THREADS, --num_proc THREADS" in capsys.readouterr().out


def test_progress_to_a_file_or_a_pipe_is_whole_lines(capsys, monkeypatch):
    with prepare_io.Progress() as progress:  # stderr is not a terminal here
        for i in range(3):
            progress.show(f"step {i}")
    assert capsys.readouterr().err == "step 0\nstep 2\n"  # the first at once, then the last
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with prepare_io.Progress() as progress:
        progress.show("step 0")
    assert capsys.readouterr().err == "\rstep 0\n"  # on a terminal, one line rewritten in place
