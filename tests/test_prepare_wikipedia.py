"""
Tests for prepare_wikipedia.py, and only for it: what belongs here is anything that module does,
from reading text to the files it leaves in --out_dir. Fixtures that other test files need too go
to conftest.py; tests of train.py's side of the data go to test_train.py.

Covered: documents and splits on local text, tokens identical to tiktoken's own, a bounded stretch of
text in flight, the write-ups' split (cut at the nearest document boundary), the WikiText
detokenizer, refusing binary input, the download against local HTTP servers (resume, a connection
cut half-way, servers that ignore Range, a busy server's Retry-After, redirects, fallback URLs, bad
zips, sha256 pins, errors that are and are not retried, a mirror whose host name resolves when the
first's does not, working offline: "trying" each host, and no folder left behind), the WikiText-2
download, the flag forms of configurator.py and every documented command line, a failed run taking
away what it made (its lock, the folders it created) and only that,
that an interrupted run (an exception, Ctrl-C, SIGTERM, a signal while tokenizing) or a failed write
(a full disk, a read-only folder) leaves no output under the final names and an earlier set as it
was, one run at a time on a folder, progress lines, the warning about a val split too small to
estimate a loss on (whichever way val.bin is made), and the write-ups' own data: the cut of their
text into pieces (against every short string and 3 MB of adversarial text, their own five lines the
reference), their text and token files downloaded, what GitHub answers when it does not serve them,
and a copy given with --input.

    python -m pytest -q tests/test_prepare_wikipedia.py

Offline, set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's GPT-2 files (see the README, Offline).
"""
import contextlib
import errno
import glob
import hashlib
import http.server
import io
import itertools
import json
import os
import pathlib
import re
import shlex
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

import configurator
import train
import prepare_wikipedia as pw
from conftest import REPO

def gpt2():
    """tiktoken's GPT-2 encoding (tiktoken keeps the one it loaded), loaded by the tests that need
    it and not at import: this file is collected on a machine without the tokenizer's files, such
    as a GPU machine offline that runs `pytest -m cuda`. No skip: each test that needs it fails,
    naming the fix."""
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        pytest.fail(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); offline, set TIKTOKEN_CACHE_DIR "
                    "to a folder holding tiktoken's GPT-2 files (see the README, Offline)", pytrace=False)


def article(i):
    """A small WikiText-style article: a top-level heading, a section heading, paragraphs."""
    return (f" = Article {i} = \n \n Article {i} is about the number {i} , naïve café {i * 7} . \n \n"
            f" = = History = = \n \n In {1900 + i} it was {'long ' * i}known . \n \n")


ARTICLES = [article(i) for i in range(10)]


def read_docs(path):
    """Decode a .bin back to its documents, checking that each ends with <|endoftext|>."""
    tokens, enc = np.memmap(path, dtype=np.uint16, mode="r").tolist(), gpt2()
    assert tokens and tokens[-1] == enc.eot_token
    docs, start = [], 0
    for i, token in enumerate(tokens):
        if token == enc.eot_token:
            docs.append(enc.decode(tokens[start:i]))
            start = i + 1
    return docs


def outputs(out_dir):
    """The files a run left in out_dir, but its lock file; [] if there is no out_dir."""
    return sorted(set(os.listdir(out_dir)) - {"prepare.lock"}) if os.path.isdir(out_dir) else []


def tmp(name):
    """The temporary name under which a run writes the output called name."""
    return f"{name}.tmp"


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
    meta = pw.prepare_data(["--input", *paths, "--out_dir", str(out), "--threads", "1",
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
    for threads in ("1", "2"):
        pw.prepare_data(["--input", *paths, "--out_dir", str(tmp_path / threads), "--threads", threads])
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes()


@pytest.mark.parametrize("threads", ["1", "2"])
def test_tokens_are_tiktokens_own(tmp_path, monkeypatch, threads):
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 300)  # several documents in flight at a time
    docs = ARTICLES + [" = Ünïcödé 日本語 = \n \n an emoji 🎉 , a tab\there and  two  spaces <|endoftext|> . \n \n"]
    *paths, val = write_files(tmp_path, [docs[:4], docs[4:7], docs[7:]])
    out = tmp_path / "out"
    pw.prepare_data(["--input", *paths, "--val", val, "--out_dir", str(out), "--threads", threads])
    for split, split_docs in [("train", docs[:7]), ("val", docs[7:])]:  # tiktoken called directly, one by one
        expected = [token for doc in split_docs for token in gpt2().encode_ordinary(doc) + [gpt2().eot_token]]
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

    real_encode, calls = gpt2().encode_to_numpy, []

    def encode(text, **kwargs):
        calls.append(text)
        return real_encode(text, **kwargs)

    monkeypatch.setattr(gpt2(), "encode_to_numpy", encode)
    for i, (tokens, chars) in enumerate(pw.encoded_documents(documents(), num_threads, False)):
        encoded.append((tokens.tolist(), chars))
        ahead.append(sum(map(len, texts[i:len(read)])))  # read, not yet written: the one written now among them
    group = 4000 // (4 * num_threads) + max(map(len, texts))  # the last group read, at most
    assert max(ahead) < 4000 + group and max(ahead) >= 4000  # bounded, and reaching the bound
    assert sorted(calls) == sorted(texts) and len(calls) == len(texts)  # each document encoded once
    assert encoded == [(gpt2().encode_ordinary(t) + [gpt2().eot_token], len(t)) for t in texts]


def test_groups_of_documents():
    texts = [article(i) for i in range(30)]
    groups = list(pw.groups(iter(texts), detokenize_first=False, group_chars=1000))
    assert [t for g in groups for t in g] == texts and len(groups) > 3
    assert all(sum(map(len, g[:-1])) < 1000 <= sum(map(len, g)) for g in groups[:-1])  # the last one took it there
    assert sum(map(len, groups[-1][:-1])) < 1000
    one_each = list(pw.groups(iter(texts[:2]), detokenize_first=True, group_chars=0))
    assert one_each == [[pw.detokenize(t)] for t in texts[:2]]


def test_val_files_are_named_not_guessed(tmp_path):
    first, second, held_out = write_files(tmp_path, [ARTICLES[:4], ARTICLES[4:7], ARTICLES[7:]])
    valid = tmp_path / "wiki.valid.raw"  # WikiText's name for its val file: training text here all the same
    os.replace(second, valid)
    out = tmp_path / "out"
    meta = pw.prepare_data(["--input", first, str(valid), "--val", held_out, "--out_dir", str(out), "--threads", "1"])
    assert read_docs(out / "train.bin") == ARTICLES[:7]
    assert read_docs(out / "val.bin") == ARTICLES[7:]
    assert meta["source"] == {"input": [first, str(valid)], "val": [held_out]}
    # without --val, wiki.valid.raw stays train: val is the last documents
    pw.prepare_data(["--input", first, str(valid), "--out_dir", str(out), "--threads", "1", "--val_fraction", "0.2"])
    assert read_docs(out / "train.bin") == ARTICLES[:6] and read_docs(out / "val.bin") == ARTICLES[6:7]


def test_lines_read_as_text_mode_reads_them(tmp_path):
    path = tmp_path / "newlines.txt"
    path.write_bytes(b"unix\nwindows\r\nold mac\rcaf\xc3\xa9\nno newline at the end")
    with open(path, encoding="utf-8") as f:  # text mode: the reference
        expected = list(f)
    with open(path, "rb") as f:
        assert list(pw.text_lines(f, str(path))) == expected == [
            "unix\n", "windows\n", "old mac\n", "café\n", "no newline at the end"]
    # over many blocks of a quarter MB, where a \r\n may fall at a block's end
    path.write_bytes(b"".join(b"line %d\r\n" % i + b"x" * (i % 97) + b"\r" + "é\n".encode() for i in range(60_000)))
    with open(path, encoding="utf-8") as f:
        expected = list(f)
    with open(path, "rb") as f:
        assert list(pw.text_lines(f, str(path))) == expected and len(expected) == 180_000


def test_document_boundaries(monkeypatch):
    lines = "".join(ARTICLES[:3]).splitlines(keepends=True)
    # ` = = History = = ` starts no document
    assert list(pw.read_documents(lines)) == ARTICLES[:3]
    # text without headings: past MAX_DOC_CHARS, a document ends at the next blank line
    monkeypatch.setattr(pw, "MAX_DOC_CHARS", 40)
    paragraphs = [f"paragraph {i} has some words in it .\nand a second line .\n\n" for i in range(5)]
    assert list(pw.read_documents("".join(paragraphs).splitlines(keepends=True))) == paragraphs


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
    assert pw.detokenize(wikitext) == plain


def test_detokenize_a_whole_document():
    assert pw.detokenize("".join(WIKITEXT_LINES)) == "".join(PLAIN_LINES)


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
    assert pw.detokenize(text) == text


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
        assert pw.detokenize(text) == plain(text), repr(text)
    wikitext = "".join(WIKITEXT_LINES) * 3
    assert pw.detokenize(wikitext) == plain(wikitext)


def test_detokenize_flag(tmp_path):
    paths = write_files(tmp_path, [ARTICLES])
    for flags, detokenized in [([], False), (["--detokenize"], True)]:
        out = tmp_path / str(detokenized)
        meta = pw.prepare_data(["--input", *paths, "--out_dir", str(out), "--threads", "1", "--val_fraction", "0.2", *flags])
        expected = [pw.detokenize(a) for a in ARTICLES] if detokenized else ARTICLES
        assert read_docs(out / "train.bin") + read_docs(out / "val.bin") == expected
        assert meta["detokenize"] is detokenized
    assert pw.detokenize(ARTICLES[0]) != ARTICLES[0]  # the flag made a difference


# --------------------------------------------------------------------------- the write-ups' split

def nearest_boundary(counts, target):
    """Slow reference: how many documents (at least one) hold nearest target tokens; ties take more."""
    totals = np.cumsum(counts)
    return min(range(1, len(counts) + 1), key=lambda k: (abs(totals[k - 1] - target), -k))


def test_write_split_stops_at_the_nearest_boundary(tmp_path):
    counts = [5, 3, 8, 1, 6, 4]
    ids = [3, 9, 1, 4, 2, 8]  # each document repeats one token id
    encoded = [(np.full(n, i, dtype=np.uint16), 10 * n) for i, n in zip(ids, counts)]
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
    texts = [pw.detokenize(doc) if detokenized else doc for doc in docs]
    return [len(gpt2().encode_ordinary(text)) + 1 for text in texts]


@pytest.mark.parametrize("threads", ["1", "2"])
def test_writeup_split(tmp_path, monkeypatch, threads):
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 150)  # the cut falls among documents in flight
    paths = write_files(tmp_path, [[" \n"] + ARTICLES[:3], ARTICLES[3:]])  # documents run on across files
    counts = token_counts(ARTICLES)
    totals = np.cumsum(counts)
    train_tokens = int(totals[3]) + 2  # just past 4 documents: the boundary after the 4th is nearest
    val_tokens = counts[4] + counts[5] - 1  # just short of 2 documents
    out, running = tmp_path / "out", threading.active_count()
    meta = pw.prepare_data(["--split=writeup", "--input", *paths, "--out_dir", str(out), "--threads", threads,
                    "--train_tokens", str(train_tokens), "--val_tokens", str(val_tokens)])
    assert threading.active_count() == running  # the tokenizer's threads end with the run, though val stopped early
    # detokenized by default; val is what follows train
    assert read_docs(out / "train.bin") == [pw.detokenize(a) for a in ARTICLES[:4]]
    assert read_docs(out / "val.bin") == [pw.detokenize(a) for a in ARTICLES[4:6]]
    assert meta["split"] == "writeup" and meta["detokenize"] is True
    for split, tokens, asked in [("train", totals[3], train_tokens), ("val", counts[4] + counts[5], val_tokens)]:
        data = np.fromfile(out / f"{split}.bin", dtype=np.uint16)
        assert meta[split]["tokens"] == tokens == len(data) and meta[split]["tokens_asked"] == asked
        assert meta[split]["max_token_id"] == data.max() == gpt2().eot_token
    assert meta["passes_in_1.44B_tokens"] == round(1_440_000_000 / totals[3], 2)
    assert json.loads((out / "meta.json").read_text()) == meta


def test_writeup_split_from_the_zip_ignores_wiki_valid(tmp_path, monkeypatch):
    zip_path = tmp_path / "wt.zip"
    zip_path.write_bytes(wikitext_zip(tmp_path))  # train.raw: ARTICLES[:8], valid.raw: ARTICLES[8:]
    publish(monkeypatch, "wikitext103", [], zip_path.stat().st_size, sha256(zip_path.read_bytes()))
    counts = token_counts(ARTICLES, detokenized=False)
    out = tmp_path / "out"
    meta = pw.prepare_data(["--split=writeup", "--detokenize=False", "--zip", str(zip_path), "--out_dir", str(out),
                            "--threads", "1", "--train_tokens", str(sum(counts[:2])), "--val_tokens", str(counts[2])])
    assert read_docs(out / "train.bin") == ARTICLES[:2] and read_docs(out / "val.bin") == [ARTICLES[2]]
    assert meta["detokenize"] is False
    assert meta["source"] == {"dataset": "wikitext103", "zip": str(zip_path), "sha256": sha256(zip_path.read_bytes())}


def test_writeup_split_when_the_text_runs_out(tmp_path, capsys):
    paths = write_files(tmp_path, [ARTICLES[:3]])
    counts = token_counts(ARTICLES[:3])
    out = tmp_path / "out"
    meta = pw.prepare_data(["--split=writeup", "--input", *paths, "--out_dir", str(out), "--threads", "1",
                    "--train_tokens", str(counts[0]), "--val_tokens", "100000"])
    assert meta["val"]["tokens"] == counts[1] + counts[2] and meta["val"]["documents"] == 2
    assert (f"warning: the text ran out: val has {counts[1] + counts[2]:,} of the 100,000 tokens asked"
            in capsys.readouterr().err)
    # train takes everything: no val at all is an error, and nothing is written
    message = exit_message(["--split=writeup", "--input", *paths, "--out_dir", str(tmp_path / "none"),
                            "--threads", "1", "--train_tokens", "100000"])
    assert "the val split has no text" in message and "--train_tokens" in message
    assert outputs(tmp_path / "none") == []


def test_writeup_defaults_are_the_write_ups_counts():
    config, given = pw.read_settings(["--dataset=wikitext103", "--split=writeup"])
    pw.check_settings(config, given)
    assert (config["train_tokens"], config["val_tokens"], config["detokenize"]) == (38_276_830, 4_341_780, True)
    assert config["out_dir"] == "data/wikitext103"
    assert 1_440_000_000 / config["train_tokens"] == pytest.approx(37.62, abs=0.01)  # the write-ups' 37.6 passes
    config, _ = pw.read_settings(["--dataset=wikitext103", "--split=writeup", "--val_tokens=5", "--detokenize=False"])
    assert (config["train_tokens"], config["val_tokens"], config["detokenize"]) == (38_276_830, 5, False)


def test_the_write_ups_run_length_comes_from_their_config():
    config = train.get_config([os.path.join(REPO, "config", "future50_mse.py")])
    run_tokens = config["max_iters"] * config["batch_size"] * config["gradient_accumulation_steps"] * config["block_size"]
    assert pw.WRITEUP_RUN_TOKENS == run_tokens == 1_440_000_000  # the write-ups' 1.44B tokens


@pytest.mark.parametrize("flags, problem", [
    (["--split=writeup", "--val", "v.txt"], "--val does not apply to --split=writeup"),
    (["--split=writeup", "--val_fraction", "0.1"], "--val_fraction does not apply to --split=writeup"),
    (["--train_tokens", "1000"], "--train_tokens does not apply to WikiText's own splits"),
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
    assert pw.main(["--input", path, "--val_fraction", "1.5"]) == 2  # a bad setting, as configurator.py says


def test_a_val_fraction_that_leaves_train_no_document_is_refused(tmp_path):
    path, = write_files(tmp_path, [ARTICLES])  # 10 documents: 0.96 of them rounds to all 10
    argv = ["--input", path, "--out_dir", str(tmp_path / "out"), "--threads", "1", "--val_fraction", "0.96"]
    assert exit_message(argv) == "error: --val_fraction 0.96 leaves none of the 10 documents for train; HINT: lower it"
    assert pw.main(argv) == 2 and outputs(tmp_path / "out") == []
    meta = pw.prepare_data(argv[:-1] + ["0.9"])  # 9 documents for val, 1 for train
    assert (meta["train"]["documents"], meta["val"]["documents"]) == (1, 9)


def test_help_prints_the_docstring_and_every_key_with_its_value(capsys):
    assert pw.main(["--dataset", "wikitext2", "--help"]) == 0
    usage = capsys.readouterr().out
    assert usage.startswith(pw.__doc__.strip())
    keys = [line.split("=")[0] for line in usage.splitlines() if line.startswith("  --")]
    assert keys == [f"  --{key}" for key in pw.DEFAULTS]
    assert "  --out_dir='data/wikitext2'" in usage and "  --detokenize=True" in usage  # filled in from --dataset


@pytest.mark.parametrize("argv, expected", [
    (["--dataset=wikitext2"], {"dataset": "wikitext2", "out_dir": "data/wikitext2", "detokenize": True}),
    (["--dataset", "wikitext2"], {"dataset": "wikitext2", "out_dir": "data/wikitext2", "detokenize": True}),
    (["--dataset", "wikitext2", "--detokenize=False"], {"detokenize": False}),
    (["--input", "a.txt", "--detokenize"], {"dataset": "", "input": ["a.txt"], "detokenize": True}),
    (["--input", "a.txt", "--detokenize=True"], {"detokenize": True, "split": "wikitext"}),
    (["--input", "a.txt"], {"detokenize": False, "out_dir": "data/wikipedia", "val_fraction": 0.005}),
    # a word ending in .py after --input is a text file to tokenize, not a config file
    (["--input", "a.txt", "b.py", "--val", "c.txt", "--threads", "3", "--out_dir=o"],
     {"input": ["a.txt", "b.py"], "val": ["c.txt"], "threads": 3, "out_dir": "o"}),
    (["--input=a.txt", "b.txt", "--val=c.txt", "--val_fraction", "0.1"],
     {"input": ["a.txt", "b.txt"], "val": ["c.txt"], "val_fraction": 0.1}),
    (["--tokens"], {"dataset": "writeup", "tokens": True, "split": "writeup", "out_dir": "data/wikipedia"}),
    (["--tokens=True", "--out_dir", "d"], {"tokens": True, "out_dir": "d"}),
    (["--split=writeup", "--zip", "w.zip", "--train_tokens", "1000"],
     {"dataset": "wikitext103", "train_tokens": 1000, "val_tokens": 4_341_780, "detokenize": True}),
])
def test_every_form_of_flag(tmp_path, monkeypatch, argv, expected):
    monkeypatch.chdir(tmp_path)
    config, given = accepted(argv)
    assert {key: config[key] for key in expected} == expected


def documented_commands():
    """The arguments of every `python prepare_wikipedia.py` command in the README, docs/, config/
    and the script's own docstring, with the shell's expansion of docs/pictures.md's file list."""
    names = ["README.md", "prepare_wikipedia.py", *sorted(glob.glob("docs/*.md", root_dir=REPO)),
             *sorted(glob.glob("config/*.py", root_dir=REPO))]
    commands = []
    for name in names:
        text = pathlib.Path(REPO, name).read_text(encoding="utf-8")
        text = text.replace("\\\n", " ")  # a shell command continued on the next line
        text = text.replace("\n--", " --")  # a command wrapped before one of its flags
        for match in re.finditer(r"python prepare_wikipedia\.py([^`#\n]*)", text):
            words = match[1].replace("$(git ls-files '*.py')", "train.py sample.py")
            commands.append(shlex.split(words))
    return commands


def test_one_text_without_title_lines_holds_out_its_last_lines(tmp_path):
    # no ` = Title = ` line: one document, whose last lines of text (a share of them) are val
    lines = [f"Line {i} of a text without titles ." for i in range(40)]
    path = tmp_path / "notes.txt"
    path.write_text("\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:]) + "\n\n", encoding="utf-8")
    out = tmp_path / "out"
    meta = pw.prepare_data(["--input", str(path), "--val_fraction", "0.1", "--out_dir", str(out), "--threads", "1"])
    assert (meta["train"]["documents"], meta["val"]["documents"]) == (1, 1)
    assert read_docs(out / "val.bin") == ["\n".join(lines[36:]) + "\n\n"]  # the last 4 of 40 lines
    assert read_docs(out / "train.bin") == ["\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:36]) + "\n"]


def test_a_config_file_names_its_text_files_as_the_command_line_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pathlib.Path("mine.py").write_text('input = "a.txt \'b c.txt\'"\nval = "held_out.txt"\n')
    config, given = accepted(["mine.py"])
    assert (config["input"], config["val"]) == (["a.txt", "b c.txt"], ["held_out.txt"])
    config, _ = accepted(["mine.py", "--input", "d.txt"])  # the command line wins
    assert (config["input"], config["val"]) == (["d.txt"], ["held_out.txt"])
    pathlib.Path("bad.py").write_text('input = ["a.txt"]\n')
    assert exit_message(["bad.py"]).startswith("error: bad.py: input = ['a.txt'] is a list")
    pathlib.Path("bad.py").write_text('input = 3\n')
    assert exit_message(["bad.py"]) == (
        'error: input = 3 in bad.py: name the files in one text, as on the command line: input = "a.txt b.txt"')
    assert exit_message(["--num_proc=4"]) == "error: --num_proc is now --threads"


def test_a_config_file_sets_keys_and_flags_win_over_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pathlib.Path("small.py").write_text('dataset = "wikitext2"\nthreads = 3\ndetokenize = False\n')
    config, given = accepted(["small.py", "--threads=1"])
    assert (config["dataset"], config["threads"], config["out_dir"], config["detokenize"]) == (
        "wikitext2", 1, "data/wikitext2", False)  # the file's detokenize, not wikitext2's default


def accepted(argv):
    """read_settings and check_settings of argv, with the files it names made (empty, in their
    folders) under the current folder."""
    config, given = pw.read_settings(argv)
    for path in [*config["input"], *config["val"], *([config["zip"]] if config["zip"] else [])]:
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(path).touch()
    pw.check_settings(config, given)  # raises for a command that does not work
    return config, given


def test_every_documented_command_line_is_accepted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    commands = documented_commands()
    assert len(commands) > 10 and ["--dataset=wikitext2"] in commands and ["--tokens"] in commands
    assert ["--input", "my_text.txt", "--val", "held_out.txt", "--out_dir=data/mytext"] in commands
    # docs/results.md's, continued on a second line
    assert ["--input", "wikitext-2/test.txt", "--val", "wikitext-2/valid.txt", "--detokenize",
            "--out_dir=data/wikitext2_test_valid"] in commands
    for argv in commands:
        accepted(argv)


@pytest.mark.parametrize("flags, problem", [
    (["--threads=two"], "error: --threads=two: expected an integer"),
    (["--dataset=wikitext5"], "error: --dataset must be one of writeup, wikitext103, wikitext2, got 'wikitext5'"),
    (["--split", "mine"], "error: --split must be one of wikitext, writeup, got 'mine'"),
    (["--input", "--detokenize"], "error: --input names no file: write --input FILE ..."),
    (["--detokenise"], "error: unknown key detokenise; did you mean detokenize?"),
    (["--detokenize=maybe", "--input", "a.txt"], "error: --detokenize=maybe: expected True or False"),
])
def test_a_bad_flag_is_one_line_and_status_2(tmp_path, flags, problem):
    message = exit_message([*flags, "--out_dir", str(tmp_path / "out")])
    assert message.startswith(problem) and "\n" not in message
    assert pw.main([*flags, "--out_dir", str(tmp_path / "out")]) == 2 and not (tmp_path / "out").exists()


def test_a_tokenizer_that_cannot_load_is_one_short_error_line(tmp_path, monkeypatch):
    def offline(name):  # what tiktoken raises without a network or a cache: a long urllib3 text
        raise ConnectionError("HTTPSConnectionPool(host='x', port=443): Max retries exceeded " + "(Caused by ...)" * 20)
    monkeypatch.setattr(pw.tiktoken, "get_encoding", offline)
    text, = write_files(tmp_path, [ARTICLES[:5]])
    message = exit_message(["--input", text, "--out_dir", str(tmp_path / "out")])
    assert message.startswith("error: cannot load the GPT-2 tokenizer (ConnectionError); HINT:")
    assert "Max retries" not in message and "\n" not in message and "TIKTOKEN_CACHE_DIR" in message


# --------------------------------------------------------------------------- input that is not text

@pytest.mark.parametrize("bad_bytes, value", [(b"\xff\xfe", 0xff), (b"\x00", 0x00), (b"caf\xe9", 0xe9)])  # latin-1 é
@pytest.mark.parametrize("threads", ["1", "2"])
def test_input_that_is_not_utf8_text_is_refused(tmp_path, bad_bytes, value, threads):
    good, = write_files(tmp_path, [ARTICLES[:5]])
    head = "".join(ARTICLES[5:7]).encode("utf-8")  # whole documents before the bad byte
    bad = tmp_path / "bad.txt"
    bad.write_bytes(head + b" = Broken = \n" + bad_bytes + b" text\n" + "".join(ARTICLES[7:]).encode("utf-8"))
    offset = len(head) + len(b" = Broken = \n") + bad_bytes.index(bytes([value]))
    out = tmp_path / "out"
    for flags in (["--val_fraction", "0.2"], ["--split=writeup", "--train_tokens", "100000"]):  # a first pass, a pool
        message = exit_message(["--input", good, str(bad), "--out_dir", str(out), "--threads", threads, *flags])
        assert f"{bad} is not UTF-8 text: byte {offset:,} is 0x{value:02x}" in message
        assert "converted to UTF-8" in message and "\n" not in message
        assert outputs(out) == []


def test_bad_byte_offset_counts_earlier_lines(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes("é\n".encode("utf-8") * 400_000 + b"ok\x80\n")  # 3 bytes a line: 1.2 MB, blocks later
    with open(path, "rb") as f, pytest.raises(pw.UserError, match="byte 1,200,002 is 0x80"):
        list(pw.text_lines(f, str(path)))


# --------------------------------------------------------------------------- errors and interruption


def test_missing_input(tmp_path):
    message = exit_message(["--input", str(tmp_path / "nope.txt"), "--out_dir", str(tmp_path / "out")])
    assert message == f"error: cannot read {tmp_path / 'nope.txt'}: no such file or directory"
    assert not (tmp_path / "out").exists()  # refused before --out_dir is made or the tokenizer loaded


def test_missing_input_exits_without_traceback(tmp_path):
    script = os.path.join(REPO, "prepare_wikipedia.py")
    result = subprocess.run([sys.executable, script, "--input", str(tmp_path / "nope.txt"),
                             "--out_dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot read") and "Traceback" not in result.stderr


def test_too_little_text_and_unwritable_out_dir(tmp_path):
    one = tmp_path / "one_line.txt"
    one.write_text("\n A single line of text , and blank lines . \n\n", encoding="utf-8")
    assert exit_message(["--input", str(one), "--out_dir", str(tmp_path / "out")]) == (
        f"error: found 1 line(s) of text in {one}, need 2 or more to hold some out for val; HINT: give "
        "more text, or use --val")
    one = str(one)
    assert exit_message(["--input", one, "--out_dir", os.path.join(one, "sub")]) == (
        f"error: cannot create {os.path.join(one, 'sub')}: not a directory; choose another folder")


@pytest.mark.parametrize("blank", ["train", "val"])
def test_a_split_with_no_text_is_refused(tmp_path, blank):
    text, = write_files(tmp_path, [ARTICLES[:3]])
    (tmp_path / "blank.txt").write_text("\n \n\n", encoding="utf-8")  # no document at all
    files = {"train": text, "val": text, blank: str(tmp_path / "blank.txt")}
    out = tmp_path / "out"
    argv = ["--input", files["train"], "--val", files["val"], "--out_dir", str(out), "--threads", "1"]
    assert exit_message(argv) == f"error: the {blank} split has no text; HINT: give more text"
    assert outputs(out) == []  # nothing written, no temporary file left


def test_writeup_text_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "wikipedia.txt"
    path.write_bytes("".join(ARTICLES[:3]).encode("utf-8") + b"caf\xe9\n")  # a Latin-1 byte
    out = tmp_path / "out"
    message = exit_message(["--dataset=writeup", "--input", str(path), "--out_dir", str(out)])
    assert message.startswith(f"error: {path} is not UTF-8 text (invalid continuation byte, after ")
    assert message.endswith("HINT: convert it to UTF-8 first") and outputs(out) == []


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_holds_it(tmp_path):
    # two runs on one out_dir would write the same files, the download's .part among them
    paths = write_files(tmp_path, [ARTICLES])
    out = tmp_path / "out"
    argv = ["--input", *paths, "--out_dir", str(out), "--threads", "1"]
    with configurator.lock_folder(str(out), "prepare.lock", "prepare_wikipedia.py"):  # the first run, still going
        (out / "wikitext-103-raw-v1.zip.part").write_bytes(b"the first run's download")
        (out / "train.bin.tmp").write_bytes(b"the first run's tokens")
        assert exit_message(argv) == (f"error: {out} is in use by prepare_wikipedia.py (process {os.getpid()} on "
                                      f"{socket.gethostname()}): wait for it to end, or use another folder")
        assert outputs(out) == ["train.bin.tmp", "wikitext-103-raw-v1.zip.part"]  # untouched
    pw.prepare_data(argv)  # once the first has ended
    assert outputs(out) == ["meta.json", "train.bin", "val.bin", "wikitext-103-raw-v1.zip.part"]


def test_the_temporary_files_of_a_killed_run_are_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in [*map(tmp, pw.OUTPUTS), "notes.tmp"]:  # a killed run's, and a file of the user's
        (out / name).write_bytes(b"left over")
    one = tmp_path / "one_line.txt"
    one.write_text("A single line of text.\n", encoding="utf-8")
    assert "need 2 or more" in exit_message(["--input", str(one), "--out_dir", str(out)])  # even a run that fails
    assert outputs(out) == ["notes.tmp"]


@pytest.mark.parametrize("crash", [RuntimeError("simulated crash mid-tokenization"),
                                   configurator.Stopped(signal.SIGINT)])  # as Ctrl-C raises it
def test_interrupted_run_leaves_no_output(tmp_path, monkeypatch, crash):
    monkeypatch.setattr(pw, "READ_AHEAD_CHARS", 1)  # one document in flight at a time
    real_encode, calls = gpt2().encode_to_numpy, []

    def failing_encode(text, **kwargs):
        calls.append(text)
        if len(calls) == 4:
            raise crash
        return real_encode(text, **kwargs)

    monkeypatch.setattr(gpt2(), "encode_to_numpy", failing_encode)  # tiktoken's one gpt2 Encoding, pw's too
    paths = write_files(tmp_path, [ARTICLES])
    out = tmp_path / "out"
    argv = ["--input", *paths, "--out_dir", str(out), "--threads", "1"]
    if isinstance(crash, configurator.Stopped):
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
    """Make prepare_wikipedia's open() of the file called name fail: with the errno error at once, or, given
    room, as a file on a disk that fills up after room bytes. Returns the paths it broke."""
    broken, real_open = [], open

    def open_on_a_bad_disk(path, mode="r", *args, **kwargs):
        if os.path.basename(path) != name:
            return real_open(path, mode, *args, **kwargs)
        broken.append(path)
        if room is None:
            raise OSError(error, os.strerror(error), path)  # as open() raises it: naming the file
        return io.BufferedWriter(FullDisk(path, room), buffer_size=buffer_size)

    monkeypatch.setattr(pw, "open", open_on_a_bad_disk, raising=False)  # shadows the builtin there only
    return broken


def earlier_set(tmp_path):
    """An out_dir holding the outputs of an earlier preparation, and their bytes."""
    path = tmp_path / "earlier.txt"
    path.write_text("".join(ARTICLES[:4]), encoding="utf-8")
    out = tmp_path / "out"
    pw.prepare_data(["--input", str(path), "--out_dir", str(out), "--threads", "1"])
    return out, {name: (out / name).read_bytes() for name in pw.OUTPUTS}


@pytest.mark.parametrize("name, error, room, buffer_size", [
    ("train.bin", errno.ENOSPC, 300, 64),  # partway through: a write() fails
    ("val.bin", errno.ENOSPC, 0, io.DEFAULT_BUFFER_SIZE),  # the buffered bytes, flushed at close
    ("meta.json", errno.EROFS, None, None),  # at open
    ("train.bin", errno.EACCES, None, None),
])
def test_a_failed_write_keeps_the_earlier_set(tmp_path, monkeypatch, name, error, room, buffer_size):
    out, earlier = earlier_set(tmp_path)
    paths = write_files(tmp_path, [ARTICLES])  # a new text: new outputs, if they were written
    broken = break_open(monkeypatch, tmp(name), error, room, buffer_size)
    message = exit_message(["--input", *paths, "--out_dir", str(out), "--threads", "1"])
    cause = {errno.ENOSPC: "no space left on device", errno.EROFS: "read-only file system",
             errno.EACCES: "permission denied"}[error]
    assert message == (f"error: cannot write {out / tmp(name)}: {cause}; "
                       "no output written under the final names")
    assert broken == [str(out / tmp(name))]
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
    argv = ["--input", *paths, "--out_dir", str(out), "--threads", "1"]
    message = exit_message(argv)
    assert message == (f"error: cannot write {out / 'val.bin'}: no space left on device; "
                       f"{out} is left without meta.json: the next run redoes the set")
    # without meta.json, train.py cannot take the mixed set for a checked one
    assert outputs(out) == ["train.bin", "val.bin"] and (out / "val.bin").read_bytes() == earlier["val.bin"]
    monkeypatch.setattr(os, "replace", real_replace)
    meta = pw.prepare_data(argv)  # the next run redoes it
    assert read_docs(out / "train.bin") + read_docs(out / "val.bin") == ARTICLES
    assert json.loads((out / "meta.json").read_text()) == meta


def test_an_unreadable_input_is_named(tmp_path, monkeypatch):
    paths = write_files(tmp_path, [ARTICLES[:5], ARTICLES[5:]])
    break_open(monkeypatch, "part1.txt", errno.EACCES)
    message = exit_message(["--input", *paths, "--out_dir", str(tmp_path / "out"), "--threads", "1"])
    assert message == f"error: cannot read {paths[1]}: permission denied"  # not a write error of train.bin's temporary file


# --------------------------------------------------------------------------- a small val

def test_a_small_val_is_warned_about(tmp_path, monkeypatch, capsys):
    paths = write_files(tmp_path, [ARTICLES])
    argv = ["--input", *paths, "--out_dir", str(tmp_path / "out"), "--threads", "1", "--val_fraction", "0.2"]
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
    ({"input": ["a.txt"], "val": ["b.txt"]}, "give more held-out text with --input and --val"),
    ({"input": ["a.txt"], "val_fraction": 0.005},
     "name held-out files with --val, or raise --val_fraction (now 0.005)"),
    ({"split": "writeup", "input": ["a.txt"], "val_tokens": 50_000},
     "raise --val_tokens (now 50,000); if the text ran out, give more or lower --train_tokens"),
    ({"dataset": "wikitext103", "zip": "wt.zip"}, "give more held-out text with --input and --val"),
])
def test_the_small_val_warning_names_the_setting_that_applies(settings, hint):
    config = {"dataset": "", "split": "wikitext", "input": [], "val": [], **settings}
    warning = pw.small_val_warning({"tokens": 3343, "documents": 1}, config)
    assert warning == ("warning: val has 3,343 tokens in 1 document: too few to estimate a loss (aim for 100,000+ "
                       f"tokens and 10+ documents); HINT: {hint}")
    assert pw.small_val_warning({"tokens": 100_000, "documents": 10}, config) is None


@pytest.mark.parametrize("way", ["--val_fraction", "--val", "--split=writeup", "a zip", "the write-ups' text",
                                 "their token files"])
def test_the_small_val_warning_comes_whichever_way_val_is_made(tmp_path, monkeypatch, capsys, way):
    paths = write_files(tmp_path, [ARTICLES[:8], ARTICLES[8:]])
    argv = {"--val_fraction": ["--input", *paths],
            "--val": ["--input", paths[0], "--val", paths[1]],
            "--split=writeup": ["--input", *paths, "--split=writeup", "--train_tokens", "150", "--val_tokens", "100"],
            "a zip": ["--zip", str(tmp_path / "wt.zip")],
            "the write-ups' text": ["--dataset=writeup", "--input", paths[0]],
            "their token files": ["--tokens"]}[way]
    (tmp_path / "wt.zip").write_bytes(wikitext_zip(tmp_path))
    publish(monkeypatch, "wikitext103", [], (tmp_path / "wt.zip").stat().st_size,
            sha256((tmp_path / "wt.zip").read_bytes()))
    for name in ("wikipedia_train.bin", "wikipedia_val.bin"):  # token files kept from an earlier run
        body = np.arange(200, dtype=np.uint16).tobytes()
        (tmp_path / "out").mkdir(exist_ok=True)
        (tmp_path / "out" / name).write_bytes(body)
        monkeypatch.setitem(pw.WRITEUP_FILES, name, pw.Pinned((), len(body), sha256(body)))
    meta = pw.prepare_data([*argv, "--out_dir", str(tmp_path / "out"), "--threads", "1"])
    counted = f" in {meta['val']['documents']:,} document" if "documents" in meta["val"] else ":"
    assert f"warning: val has {meta['val']['tokens']:,} tokens{counted}" in capsys.readouterr().err


# --------------------------------------------------------------------------- stopped by a signal

SLOW_RUN = """
import signal, sys, time
import prepare_wikipedia as pw
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal, whatever the test runner's
pw.READ_AHEAD_CHARS = 1  # one document in flight at a time
real_read_documents = pw.read_documents

def slow_read_documents(lines):  # a few ms a document: a run long enough to be stopped while it writes
    for doc in real_read_documents(lines):
        time.sleep(0.005)
        yield doc

pw.read_documents = slow_read_documents
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
    real_encode, calls = gpt2().encode_to_numpy, []

    def encode_then_signal(text, **kwargs):
        calls.append(text)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered while the threads tokenize
        return real_encode(text, **kwargs)

    monkeypatch.setattr(gpt2(), "encode_to_numpy", encode_then_signal)
    paths = write_files(tmp_path, [ARTICLES])
    threads = threading.active_count()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = pw.main(["--input", *paths, "--out_dir", str(out), "--threads", "2"])
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
                            "--out_dir", str(out), "--threads", "2"],
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
    dataset = pw.DATASETS[name]._replace(urls=tuple(urls), size=size, sha256=digest)
    monkeypatch.setitem(pw.DATASETS, name, dataset)


def test_download_and_prepare(tmp_path, server, monkeypatch, capsys):
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    publish(monkeypatch, "wikitext103", [url(server)], len(data), sha256(data))
    out = tmp_path / "out"
    argv = ["--dataset", "wikitext103", "--out_dir", str(out), "--threads", "1"]
    meta = pw.prepare_data(argv)
    assert server.log == [("/wt.zip", None, pw.USER_AGENT)]
    zip_path = out / "wikitext-103-raw-v1.zip"
    assert zip_path.read_bytes() == data and not pathlib.Path(f"{zip_path}.part").exists()
    assert read_docs(out / "train.bin") == ARTICLES[:8]
    assert read_docs(out / "val.bin") == ARTICLES[8:]
    assert meta["source"] == {"dataset": "wikitext103", "zip": str(zip_path), "sha256": sha256(data)}
    assert f"downloading {url(server)} ({len(data):,} bytes)" in capsys.readouterr().err
    assert pw.prepare_data(argv)["source"] == meta["source"]  # the checked zip is reused: no second request
    assert len(server.log) == 1
    assert f"using {zip_path}, downloaded before (its sha256 checked)" in capsys.readouterr().out


def test_a_full_disk_during_the_download(tmp_path, server, monkeypatch):
    data = wikitext_zip(tmp_path, padding=300_000)
    server.files["/wt.zip"] = data
    publish(monkeypatch, "wikitext103", [url(server), url(server, "/mirror.zip")], len(data), sha256(data))
    out = tmp_path / "out"
    argv = ["--dataset", "wikitext103", "--out_dir", str(out), "--threads", "1"]
    part = out / "wikitext-103-raw-v1.zip.part"
    break_open(monkeypatch, part.name, errno.ENOSPC, room=100_000)  # full after 100 kB
    message = exit_message(argv)
    assert message == (f"error: cannot write {part}: no space left on device; the next run resumes "
                       "the download")
    assert len(server.log) == 1  # not retried, and no other URL tried: the server was not at fault
    kept = part.read_bytes()
    assert 0 < len(kept) <= 100_000 and data.startswith(kept)  # what was downloaded is kept, and sound
    monkeypatch.setattr(pw, "open", open)  # space freed
    pw.prepare_data(argv)
    assert server.log[1][1] == f"bytes={len(kept)}-"  # resumed
    assert (out / "wikitext-103-raw-v1.zip").read_bytes() == data and read_docs(out / "val.bin") == ARTICLES[8:]


def test_resume_from_part(tmp_path, server):
    data = wikitext_zip(tmp_path)
    server.files["/wt.zip"] = data
    part = tmp_path / "wt.zip.part"
    part.write_bytes(data[:1000])
    pw.download(pw.http_session(), url(server), str(part), len(data))
    assert server.log == [("/wt.zip", "bytes=1000-", pw.USER_AGENT)]
    assert part.read_bytes() == data


def test_resume_after_dropped_connection(tmp_path, server, monkeypatch):
    monkeypatch.setattr(pw, "BACKOFF_S", 0)
    data = wikitext_zip(tmp_path, padding=300_000)
    server.files["/wt.zip"], server.drop_after = data, 200_000
    part = tmp_path / "wt.zip.part"
    pw.download(pw.http_session(), url(server), str(part), len(data))
    assert [entry[1] is None for entry in server.log] == [True, False]
    resumed_at = int(server.log[1][1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 200_000  # the second request asks for what the first did not deliver
    assert part.read_bytes() == data


def test_a_download_cut_half_way_resumes_from_its_part(tmp_path, server, monkeypatch, capsys):
    data = wikitext_zip(tmp_path, padding=300_000)
    server.files["/wt.zip"], server.drop_after = data, 150_000  # the connection drops after 150 kB
    publish(monkeypatch, "wikitext103", [url(server)], len(data), sha256(data))
    out = tmp_path / "out"
    pw.prepare_data(["--dataset", "wikitext103", "--out_dir", str(out), "--threads", "1"])
    first, second = server.log
    resumed_at = int(second[1].removeprefix("bytes=").rstrip("-"))
    assert first[1] is None and 0 < resumed_at <= 150_000  # the second request asks for the rest only
    assert f"connection closed after {resumed_at:,} of {len(data):,} bytes; resuming" in capsys.readouterr().err
    assert (out / "wikitext-103-raw-v1.zip").read_bytes() == data
    assert read_docs(out / "train.bin") == ARTICLES[:8] and read_docs(out / "val.bin") == ARTICLES[8:]


def test_a_busy_server_is_asked_again_when_its_retry_after_says(tmp_path, server, monkeypatch, capsys):
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    server.busy, server.retry_after = 2, 7  # two 503 answers that say "come back in 7 s", then the file
    publish(monkeypatch, "wikitext103", [url(server)], len(data), sha256(data))
    monkeypatch.setattr(pw, "ATTEMPTS", 3)
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)  # urllib3 waits with time.sleep: note the waits instead
    out = tmp_path / "out"
    pw.prepare_data(["--dataset", "wikitext103", "--out_dir", str(out), "--threads", "1"])
    assert waits == [7, 7]  # the server's wait, not the backoff's (none, then 2 s)
    assert len(server.log) == 3 and read_docs(out / "train.bin") == ARTICLES[:8]
    failures = [line for line in capsys.readouterr().err.splitlines() if "failed" in line]
    assert failures == [f"127.0.0.1: attempt {i} of 3 failed: HTTP 503; retrying in 7 s" for i in (1, 2)]


def test_a_part_longer_than_the_file_is_downloaded_again(tmp_path, server):
    data = wikitext_zip(tmp_path)
    server.files["/wt.zip"] = data
    part = tmp_path / "wt.zip.part"
    part.write_bytes(data + b"bytes of a longer file")
    pw.download(pw.http_session(), url(server), str(part), len(data))
    assert server.log == [("/wt.zip", None, pw.USER_AGENT)]  # the whole file, from the same URL
    assert part.read_bytes() == data


def test_server_ignoring_range_restarts(tmp_path, server):
    data = wikitext_zip(tmp_path)
    server.files["/wt.zip"], server.honor_range = data, False
    part = tmp_path / "wt.zip.part"
    part.write_bytes(b"stale bytes from another file")
    pw.download(pw.http_session(), url(server), str(part), len(data))
    assert server.log[0][1] == f"bytes={len(b'stale bytes from another file')}-"
    assert part.read_bytes() == data  # the 200 answer replaced the stale part instead of appending


def test_a_download_with_other_bytes_is_deleted(tmp_path, server, monkeypatch):
    data = wikitext_zip(tmp_path)
    server.files["/wt.zip"] = data[:-1] + b"!"  # the right size, other bytes
    publish(monkeypatch, "wikitext103", [url(server)], len(data), sha256(data))
    out = tmp_path / "out"
    message = exit_message(["--dataset", "wikitext103", "--out_dir", str(out), "--threads", "1"])
    part = out / "wikitext-103-raw-v1.zip.part"
    assert message == (f"error: could not download wikitext-103-raw-v1.zip: {url(server)}: {part} has sha256 "
                       f"{sha256(data[:-1] + b'!')}, not {sha256(data)}; deleted it; HINT: save {url(server)} by "
                       "hand and add --zip wikitext-103-raw-v1.zip to this command")
    assert outputs(out) == []
    pinned = pw.Pinned((), len(data), sha256(data))
    (tmp_path / "half.zip").write_bytes(data[:len(data) // 2])
    assert pw.wrong_bytes(tmp_path / "half.zip", pinned) == f"has {len(data) // 2:,} bytes, expected {len(data):,}"


def test_http_404_and_refused_connection(tmp_path, server, monkeypatch):
    monkeypatch.setattr(pw, "BACKOFF_S", 0)
    monkeypatch.setattr(pw, "ATTEMPTS", 2)
    publish(monkeypatch, "wikitext2", [url(server, "/missing.zip")], 100, "0" * 64)
    message = exit_message(["--dataset", "wikitext2", "--out_dir", str(tmp_path / "a")])
    assert "/missing.zip: HTTP 404 Not Found; HINT: save" in message
    assert len(server.log) == 1  # a 4xx answer is not retried
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    publish(monkeypatch, "wikitext2", [f"http://127.0.0.1:{port}/wt.zip"], 100, "0" * 64)
    message = exit_message(["--dataset", "wikitext2", "--out_dir", str(tmp_path / "b")])
    assert "gave up after 2 attempts: ConnectionRefusedError" in message and "HINT" in message


def test_falls_back_to_the_next_url(tmp_path, server, monkeypatch):
    monkeypatch.setattr(pw, "BACKOFF_S", 0)
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    urls = [url(server, "/gone.zip"), url(server, "/wt.zip")]  # the main host fails, the mirror works
    path = pw.fetch(pw.Pinned(urls, len(data), sha256(data)), str(tmp_path / "wt.zip"), hint="")
    assert [entry[0] for entry in server.log] == ["/gone.zip", "/wt.zip"]
    assert path == str(tmp_path / "wt.zip") and (tmp_path / "wt.zip").read_bytes() == data


def test_server_errors_are_retried(tmp_path, server, monkeypatch, capsys):
    monkeypatch.setattr(pw, "BACKOFF_S", 0)
    monkeypatch.setattr(pw, "ATTEMPTS", 3)
    server.files["/busy.zip"] = 503
    with pytest.raises(pw.DownloadError, match="HTTP 503 Service Unavailable"):
        pw.download(pw.http_session(), url(server, "/busy.zip"), str(tmp_path / "busy.zip.part"), 100)
    assert len(server.log) == 3
    assert capsys.readouterr().err.splitlines() == [f"127.0.0.1: attempt {i} of 3 failed: HTTP 503; retrying in 0 s"
                                                    for i in (1, 2)]


def offline(monkeypatch):
    """Make every host name but 127.0.0.1 fail to resolve, as it does without a network; returns the names
    looked up."""
    real_getaddrinfo, lookups = socket.getaddrinfo, []

    def getaddrinfo(host, *args, **kwargs):
        if host != "127.0.0.1":
            lookups.append(host)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


def test_an_unknown_host_is_not_retried_and_its_mirror_is_tried(tmp_path, server, monkeypatch, capsys):
    lookups = offline(monkeypatch)
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    urls = ["http://nonexistent.invalid/wt.zip", url(server, "/wt.zip")]  # the first host's name is gone
    path = pw.fetch(pw.Pinned(urls, len(data), sha256(data)), str(tmp_path / "wt.zip"), hint="do this")
    assert lookups == ["nonexistent.invalid"] and server.log == [("/wt.zip", None, pw.USER_AGENT)]
    assert pathlib.Path(path).read_bytes() == data
    assert capsys.readouterr().err.splitlines() == [  # one attempt: no retry
        "trying nonexistent.invalid", "trying 127.0.0.1", f"downloading {urls[1]} ({len(data):,} bytes)"]


def test_offline_the_first_failure_says_how_to_go_on_in_one_line(tmp_path, monkeypatch):
    # a fresh clone without a network: the default run names the one way on, their text saved by hand
    monkeypatch.chdir(tmp_path)
    lookups = offline(monkeypatch)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert pw.main([]) == 1
    text_url, mirror = pw.WRITEUP_FILES["wikipedia.txt"].urls
    assert err.getvalue().splitlines() == [  # trying each host: no bytes came, so nothing downloads
        "trying media.githubusercontent.com",
        "trying github.com",
        f"error: cannot reach media.githubusercontent.com, github.com: offline? save {text_url} by hand and run "
        "`python prepare_wikipedia.py --dataset=writeup --input wikipedia.txt`"]
    assert lookups == ["media.githubusercontent.com", "github.com"]  # each asked once: no retry
    assert os.listdir(tmp_path) == []  # data/wikipedia, which the run made, is gone with its lock file


def test_a_failed_prepare_takes_away_what_it_made_and_only_that(tmp_path, server, monkeypatch, capsys):
    monkeypatch.setattr(pw, "ATTEMPTS", 1)
    publish(monkeypatch, "wikitext2", [url(server, "/missing.zip")], 100, "0" * 64)
    argv = ["--dataset", "wikitext2", "--out_dir"]
    # a folder of the user's, with a file of theirs: the file and the folder stay, the lock goes
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert pw.main([*argv, str(mine)]) == 1
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "mine"
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "trying 127.0.0.1" and "HTTP 404" in err[1] and len(err) == 2  # no byte came: no "downloading"
    # a lock file left by an earlier run holds this run's name once it is locked: it goes too
    (mine / "prepare.lock").write_text("prepare_wikipedia.py (an earlier run)")
    assert pw.main([*argv, str(mine)]) == 1
    assert os.listdir(mine) == ["notes.txt"]
    # folders the run made go, the deepest first, but not the folder that held them before
    assert pw.main([*argv, str(tmp_path / "new" / "deeper")]) == 1
    assert sorted(os.listdir(tmp_path)) == ["mine"]
    # a download cut short is kept for the next run to resume, and with it the folder that holds it
    data = wikitext_zip(tmp_path, padding=200_000)
    server.files["/wt.zip"], server.drop_after = data, 100_000
    publish(monkeypatch, "wikitext2", [url(server, "/wt.zip")], len(data), sha256(data))
    out = tmp_path / "new" / "out"
    capsys.readouterr()
    assert pw.main([*argv, str(out)]) == 1
    assert os.listdir(out) == ["wikitext-2-raw-v1.zip.part"]
    kept = (out / "wikitext-2-raw-v1.zip.part").read_bytes()
    assert 0 < len(kept) <= 100_000 and data.startswith(kept)
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == ["trying 127.0.0.1", f"downloading {url(server, '/wt.zip')} ({len(data):,} bytes)"]
    assert err[-1].startswith("error: could not download wikitext-2-raw-v1.zip: ")
    pw.prepare_data([*argv, str(out), "--threads", "1"])  # resumed: what it kept was of use
    assert server.log[-1][1] == f"bytes={len(kept)}-" and (out / "wikitext-2-raw-v1.zip").read_bytes() == data


# --------------------------------------------------------------------------- WikiText-2, and what a zip must be

def test_the_datasets_are_the_published_files():
    wikitext2 = pw.DATASETS["wikitext2"]
    assert wikitext2.urls == ("https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
                              "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip")
    assert (wikitext2.file, wikitext2.size, wikitext2.out_dir, wikitext2.detokenize) == (
        "wikitext-2-raw-v1.zip", 4_721_645, "data/wikitext2", True)
    assert wikitext2.sha256 == "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11"
    wikitext103 = pw.DATASETS["wikitext103"]
    assert (wikitext103.file, wikitext103.size, wikitext103.out_dir, wikitext103.detokenize) == (
        "wikitext-103-raw-v1.zip", 191_984_949, "data/wikitext103", False)  # the fallback's folder
    assert wikitext103.sha256 == "91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794"
    config = {}
    with open(os.path.join(REPO, "config", "tiny_cpu.py")) as f:
        exec(f.read(), config)  # a config file is plain Python
    assert config["data_dir"] == wikitext2.out_dir  # the CPU quick start reads what --dataset wikitext2 writes


def test_wikitext2_is_checked_then_prepared(tmp_path, server, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default --out_dir, data/wikitext2, lands here
    monkeypatch.setattr(pw, "BACKOFF_S", 0)
    data = wikitext_zip(tmp_path, folder="wikitext-2-raw")
    server.files["/wikitext-2-raw-v1.zip"] = data
    urls = [url(server, "/gone.zip"), url(server, "/wikitext-2-raw-v1.zip")]  # the main host fails, the mirror works
    out = tmp_path / "data" / "wikitext2"
    argv = ["--dataset", "wikitext2", "--threads", "1"]
    # the real size and hash: the server's 10 kB are refused before they are downloaded
    publish(monkeypatch, "wikitext2", urls, 4_721_645, pw.DATASETS["wikitext2"].sha256)
    message = exit_message(argv)
    assert f"server offers {len(data):,} bytes, expected 4,721,645" in message
    assert message.endswith(f"HINT: save {urls[0]} by hand and add --zip wikitext-2-raw-v1.zip to this command")
    # the real hash pinned: downloaded, refused, deleted
    publish(monkeypatch, "wikitext2", urls, len(data), pw.DATASETS["wikitext2"].sha256)
    message = exit_message(argv)
    part = "data/wikitext2/wikitext-2-raw-v1.zip.part"  # relative, as the default --out_dir is
    published = "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11"
    assert f"{urls[1]}: {part} has sha256 {sha256(data)}, not {published}; deleted it" in message
    assert message.startswith("error: could not download wikitext-2-raw-v1.zip: ") and "\n" not in message
    assert outputs(out) == []
    # the hash replaced by the test's: it prepares, detokenized by default
    publish(monkeypatch, "wikitext2", urls, len(data), sha256(data))
    meta = pw.prepare_data(argv)
    # wiki.train.raw, then wiki.valid.raw
    assert read_docs(out / "train.bin") == [pw.detokenize(a) for a in ARTICLES[:8]]
    assert read_docs(out / "val.bin") == [pw.detokenize(a) for a in ARTICLES[8:]]
    assert meta["detokenize"] is True and meta["split"] == "wikitext"
    assert meta["source"] == {"dataset": "wikitext2", "zip": "data/wikitext2/wikitext-2-raw-v1.zip",
                              "sha256": sha256(data)}
    assert outputs(out) == ["meta.json", "train.bin", "val.bin", "wikitext-2-raw-v1.zip"]
    assert "error" not in capsys.readouterr().out


def test_wikitext2_download_resumes(tmp_path, server, monkeypatch):
    data = wikitext_zip(tmp_path, folder="wikitext-2-raw", padding=100_000)
    server.files["/wikitext-2-raw-v1.zip"] = data
    publish(monkeypatch, "wikitext2", [url(server, "/wikitext-2-raw-v1.zip")], len(data), sha256(data))
    out = tmp_path / "out"
    out.mkdir()
    (out / "wikitext-2-raw-v1.zip.part").write_bytes(data[:30_000])  # what an interrupted run left
    pw.prepare_data(["--dataset", "wikitext2", "--out_dir", str(out), "--threads", "1"])
    assert server.log == [("/wikitext-2-raw-v1.zip", "bytes=30000-", pw.USER_AGENT)]
    assert (out / "wikitext-2-raw-v1.zip").read_bytes() == data
    assert read_docs(out / "val.bin") == [pw.detokenize(a) for a in ARTICLES[8:]]


def test_a_cached_zip_with_other_bytes_is_refused_and_left_as_it_is(tmp_path, server, monkeypatch):
    data = wikitext_zip(tmp_path)
    other = wikitext_zip(tmp_path, articles=[a.replace("History", "Mystery") for a in ARTICLES])
    assert len(other) == len(data) and other != data  # the right size, and a sound zip of other text
    server.files["/wikitext-103-raw-v1.zip"] = data
    publish(monkeypatch, "wikitext103", [url(server, "/wikitext-103-raw-v1.zip")], len(data), sha256(data))
    out = tmp_path / "out"
    out.mkdir()
    zip_path = out / "wikitext-103-raw-v1.zip"
    zip_path.write_bytes(other)  # put there by the user, perhaps
    argv = ["--dataset", "wikitext103", "--out_dir", str(out), "--threads", "1"]
    assert exit_message(argv) == (f"error: {zip_path} has sha256 {sha256(other)}, not {sha256(data)}: not the file "
                                  "expected; HINT: move it away to download it again")
    assert zip_path.read_bytes() == other and server.log == []
    zip_path.unlink()
    pw.prepare_data(argv)
    assert zip_path.read_bytes() == data and read_docs(out / "train.bin") == ARTICLES[:8]


def test_a_redirect_is_followed(tmp_path, server, other_server, monkeypatch):
    # GitHub's raw address redirects to its LFS host
    other_server.files["/files/wt.zip"] = data = wikitext_zip(tmp_path)
    server.files["/wt.zip"] = url(other_server, "/files/wt.zip")
    publish(monkeypatch, "wikitext103", [url(server)], len(data), sha256(data))
    out = tmp_path / "out"
    pw.prepare_data(["--dataset", "wikitext103", "--out_dir", str(out), "--threads", "1"])
    assert len(server.log) == len(other_server.log) == 1
    assert read_docs(out / "train.bin") == ARTICLES[:8]


def test_a_zip_given_by_hand_is_checked(tmp_path, monkeypatch):
    zip_path = tmp_path / "mine.zip"
    zip_path.write_bytes(data := wikitext_zip(tmp_path))
    argv = ["--zip", str(zip_path), "--out_dir", str(tmp_path / "out"), "--threads", "1"]
    message = exit_message(argv)  # checked against WikiText-103's published size and sha256
    assert message == (f"error: {zip_path} has {len(data):,} bytes, expected 191,984,949: not the published "
                       "wikitext-103-raw-v1.zip; HINT: add --dataset=wikitext2 for WikiText-2's, or give your own "
                       "text with --input")
    assert zip_path.read_bytes() == data  # the user's file, left as it was
    assert exit_message(["--zip", str(tmp_path / "nope.zip")]).startswith(f"error: cannot read {tmp_path / 'nope.zip'}")
    publish(monkeypatch, "wikitext103", [], len(data), sha256(data))  # as if it were the published zip
    meta = pw.prepare_data(argv)
    assert meta["source"]["sha256"] == sha256(data) and read_docs(tmp_path / "out" / "train.bin") == ARTICLES[:8]
    assert outputs(tmp_path / "out") == ["meta.json", "train.bin", "val.bin"]  # nothing downloaded


@pytest.mark.parametrize("flags, problem", [
    (["--input", "a.txt", "--dataset", "wikitext2"], "--dataset names a zip to read, and --input names text files"),
    (["--input", "a.txt", "--zip", "a.zip"], "--zip names a zip to read, and --input names text files"),
])
def test_zip_settings_that_contradict(tmp_path, flags, problem):
    message = exit_message([*flags, "--out_dir", str(tmp_path / "out")])
    assert message.startswith("error: ") and problem in message and "\n" not in message


# ----------------------------------------------------------------- the write-ups' own data

def writeups_tokens(path):
    """The write-ups' own method (datasets/prepare_data.py of yiphei/yif-AI), line for line: the
    reference. Returns the bytes of their train and val token files."""
    data = open(path, "r", encoding="utf-8").read()
    n = len(data)
    train_ids = gpt2().encode_ordinary(data[:int(n * 0.9)])
    val_ids = gpt2().encode_ordinary(data[int(n * 0.9):])
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
    allowed_cuts, other_cuts_that_differ, encode = 0, 0, gpt2().encode_ordinary
    for text in texts:
        whole, allowed = encode(text), cuts_allowed(text)
        for p in range(1, len(text)):
            same = encode(text[:p]) + encode(text[p:]) == whole
            assert same or p not in allowed, (text, p)
            allowed_cuts += p in allowed
            other_cuts_that_differ += not same
        last = pw.LAST_CUT.match(text)
        assert (last.end() if last else None) == (allowed[-1] if allowed else None), text
    assert allowed_cuts > 5000 and other_cuts_that_differ > 1000  # the test can fail


def test_the_pieces_tokenize_as_the_write_ups_whole_parts(tmp_path, monkeypatch):
    # 3 MB of adversarial text (\r\n and a lone \r among them), cut into more than 1,000 pieces
    monkeypatch.setattr(pw, "PIECE_CHARS", 2000)
    path = tmp_path / "wikipedia.txt"
    path.write_bytes(adversarial_text(700_000).encode())  # bytes: the \r stay as they are
    assert path.stat().st_size >= 3_000_000
    theirs = writeups_tokens(path)
    text = open(path, encoding="utf-8").read()
    cut = int(len(text) * 0.9)
    n_pieces = 0
    for (name, pieces), part, expected in zip(pw.writeup_parts(str(path)),
                                              (text[:cut], text[cut:]), theirs):
        pieces = list(pieces)
        n_pieces += len(pieces)
        assert "".join(pieces) == part  # the pieces are the part, \r\n and \r read as \n
        ours = [token for piece in pieces for token in gpt2().encode_ordinary(piece)]
        assert np.array(ours, dtype=np.uint16).tobytes() == expected, name
    assert n_pieces > 1000
    # a naive cut, just after the last newline, does not tokenize alike: the test can fail
    monkeypatch.setattr(pw, "LAST_CUT", re.compile(r".*\n", re.S))
    train_pieces = pw.writeup_parts(str(path))[0][1]
    naive = [token for piece in train_pieces for token in gpt2().encode_ordinary(piece)]
    assert np.array(naive, dtype=np.uint16).tobytes() != theirs[0]


def publish_writeup(monkeypatch, server, files, paths=("/media", "/raw")):
    """Make the write-ups' files, {name: bytes}, those of the test's server: served under each of
    paths, pinned with their size and sha256. Returns the URLs of each, by name."""
    urls = {}
    for name, body in files.items():
        urls[name] = [url(server, f"{path}/{name}") for path in paths]
        for path in paths:
            server.files[f"{path}/{name}"] = body
        pinned = pw.Pinned(tuple(urls[name]), len(body), sha256(body))
        monkeypatch.setitem(pw.WRITEUP_FILES, name, pinned)
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
    monkeypatch.setattr(pw, "PIECE_CHARS", 500)  # many pieces, on several threads
    files = writeup_files(tmp_path)
    urls = publish_writeup(monkeypatch, server, files)
    meta = pw.prepare_data(["--threads", "2"])  # the default: the write-ups' text
    out = tmp_path / "data" / "wikipedia"
    assert (out / "train.bin").read_bytes() == files["wikipedia_train.bin"]
    assert (out / "val.bin").read_bytes() == files["wikipedia_val.bin"]
    assert IDENTICAL in capsys.readouterr().out.splitlines()
    assert server.log == [("/media/wikipedia.txt", None, pw.USER_AGENT)]  # the text only
    assert (meta["dataset"], meta["split"], meta["detokenize"]) == ("writeup", "writeup", False)
    assert meta["source"] == {"dataset": "writeup", "commit": pw.WRITEUP_COMMIT,
                              "text": "data/wikipedia/wikipedia.txt", "sha256": sha256(files["wikipedia.txt"])}
    assert urls["wikipedia.txt"][0] == pw.WRITEUP_FILES["wikipedia.txt"].urls[0]
    for split in ("train", "val"):
        assert meta[split]["tokens"] * 2 == len(files[f"wikipedia_{split}.bin"])
        assert meta[split]["sha256"] == sha256(files[f"wikipedia_{split}.bin"])
        assert meta[split]["max_token_id"] == max(np.frombuffer(files[f"wikipedia_{split}.bin"], dtype=np.uint16))
    assert outputs(out) == ["meta.json", "train.bin", "val.bin", "wikipedia.txt"]
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
    assert outputs(out) == ["wikipedia.txt"]  # kept for next time


def test_the_write_ups_token_files(tmp_path, server, monkeypatch, capsys):
    files = writeup_files(tmp_path)
    publish_writeup(monkeypatch, server, files)

    def no_tokenizer(name):
        raise AssertionError("--tokens needs no tokenizer")

    monkeypatch.setattr(pw.tiktoken, "get_encoding", no_tokenizer)
    out = tmp_path / "out"
    meta = pw.prepare_data(["--tokens", "--out_dir", str(out)])
    assert (out / "train.bin").read_bytes() == files["wikipedia_train.bin"]
    assert (out / "val.bin").read_bytes() == files["wikipedia_val.bin"]
    assert [entry[0] for entry in server.log] == [f"/media/{name}" for name in TOKEN_FILES]
    assert meta["source"] == {"dataset": "writeup", "commit": pw.WRITEUP_COMMIT,
                              "token_files": [str(out / name) for name in TOKEN_FILES]}
    tokens = np.frombuffer(files["wikipedia_train.bin"], dtype=np.uint16)
    assert meta["train"] == {"tokens": len(tokens), "max_token_id": tokens.max(),
                             "sha256": sha256(files["wikipedia_train.bin"])}
    assert outputs(out) == ["meta.json", "train.bin", "val.bin", "wikipedia_train.bin", "wikipedia_val.bin"]


LFS_POINTER_TEXT = (b"version https://git-lfs.github.com/spec/v1\noid sha256:"
                    b"be17913eb060032dacc0155670c999d97e8ba57fd45135fe11b1a56c1b6d7bbf\n"
                    b"size 178723194\n")


POINTER_SENT = "the server sent a Git LFS pointer, not the file"


@pytest.mark.parametrize("answer, problem, no_length", [
    (403, "HTTP 403 Forbidden", False),  # the owner's LFS quota spent
    (LFS_POINTER_TEXT, POINTER_SENT, False),
    (LFS_POINTER_TEXT, POINTER_SENT, True),  # sent without its size: known once it is read
    (b"x" * 5000, "the server offers 5,000 bytes, expected {size:,}", False),
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
    assert message == (
        f"error: could not download wikipedia.txt: {urls[0]}: {problem}; {urls[1]}: {problem}; HINT: save "
        f"{urls[0]} by hand and run `python prepare_wikipedia.py --dataset=writeup --input wikipedia.txt`")
    assert outputs(tmp_path / "data" / "wikipedia") == []  # nothing left: no pointer text kept as a part


def test_their_token_files_not_served_point_to_their_text_saved_by_hand(tmp_path, server, monkeypatch):
    publish_writeup(monkeypatch, server, {name: b"\0\0" for name in TOKEN_FILES})
    server.files["/media/wikipedia_train.bin"] = server.files["/raw/wikipedia_train.bin"] = 404
    out = tmp_path / "mine"
    out.mkdir()
    message = exit_message(["--tokens", "--out_dir", str(out)])
    text_url = pw.WRITEUP_FILES["wikipedia.txt"].urls[0]
    assert message.endswith(f"HINT: save {text_url} by hand and run `python prepare_wikipedia.py "
                            f"--dataset=writeup --input wikipedia.txt --out_dir {out}`")  # the same folder
    assert out.is_dir() and outputs(out) == []  # the user's folder stays


@pytest.mark.parametrize("pinned", [True, False])
def test_a_copy_of_the_text_given_with_input(tmp_path, monkeypatch, capsys, pinned):
    files = writeup_files(tmp_path)
    path = tmp_path / "wikipedia.txt"
    path.write_bytes(files["wikipedia.txt"])
    if pinned:  # the test's text as the write-ups' own, and its tokens as theirs
        for name, body in files.items():
            pin = pw.Pinned(pw.WRITEUP_FILES[name].urls, len(body), sha256(body))
            monkeypatch.setitem(pw.WRITEUP_FILES, name, pin)
    out = tmp_path / "out"
    meta = pw.prepare_data(["--dataset=writeup", "--input", str(path), "--out_dir", str(out),
                            "--threads", "1"])
    assert (out / "train.bin").read_bytes() == files["wikipedia_train.bin"]  # their method
    assert (out / "val.bin").read_bytes() == files["wikipedia_val.bin"]
    captured = capsys.readouterr()
    warning = (f"warning: {path} is not the write-ups' wikipedia.txt (sha256 "
               f"{sha256(files['wikipedia.txt'])}): its tokens are not compared with theirs")
    assert (warning in captured.err.splitlines()) is not pinned
    assert (IDENTICAL in captured.out.splitlines()) is pinned  # compared only when it is theirs
    assert meta["source"]["text"] == str(path) and meta["source"]["sha256"] == sha256(files["wikipedia.txt"])
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
    (["--val_tokens", "100"], "error: --val_tokens does not apply to the write-ups' own text"),
    (["--tokens", "--input", "a.txt"], "error: --tokens fetches the write-ups' token files, "),
    (["--tokens", "--dataset", "wikitext2"], "error: --tokens fetches the write-ups' token files: "
                                             "--dataset=writeup only"),
    (["--dataset=writeup", "--input", "a", "b"], "error: --dataset=writeup takes one --input file"),
    (["--threads", "0"], "error: --threads must be 1 or more, got 0"),  # one setting, two names
])
def test_writeup_settings_that_contradict(tmp_path, flags, problem):
    message = exit_message([*flags, "--out_dir", str(tmp_path / "out")])
    assert message.startswith(problem) and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_progress_lines_report_work_done(tmp_path, monkeypatch, capsys):
    paths = write_files(tmp_path, [ARTICLES])
    argv = ["--input", *paths, "--out_dir", str(tmp_path / "out"), "--threads", "1"]
    pw.prepare_data(argv)  # short work: no progress line, only what was written
    captured = capsys.readouterr()
    assert "tokens/s" not in captured.err and not re.search(r"\b0\.0+\b", captured.out + captured.err)
    clock = itertools.count(1000.0, 5.0)  # each look at the clock, 5 s later
    monkeypatch.setattr(pw, "time", types.SimpleNamespace(time=lambda: next(clock)))
    pw.prepare_data(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if "tokens/s" in line]
    counts = [int(m[1].replace(",", "")) for m in map(re.compile(r"(?:train|val): ([\d,]+) tokens, [\d,]+ tokens/s$").match, lines) if m]
    assert len(counts) == len(lines) > 3 and min(counts) > 0  # each a line of its own, and none before work was done
    assert len(lines) < sum(1 for _ in ARTICLES)  # one an interval (every second document here), not one a document
