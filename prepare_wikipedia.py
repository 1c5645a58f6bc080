"""
Prepare Wikipedia text for train.py: GPT-2 BPE tokens as flat uint16 arrays (nanoGPT's layout).

    python prepare_wikipedia.py                       # the write-ups' text (179 MB), tokenized
    python prepare_wikipedia.py --tokens              # their token files (85 MB), no tokenizer
    python prepare_wikipedia.py --dataset=writeup --input wikipedia.txt  # their text, saved by hand
    python prepare_wikipedia.py --dataset=wikitext2   # WikiText-2 raw (4.7 MB), a first CPU run
    python prepare_wikipedia.py --dataset=wikitext103 --split=writeup  # WikiText-103, their regime
    python prepare_wikipedia.py --input notes.txt --val held_out.txt   # your own text

It writes train.bin, val.bin and meta.json to --out_dir, and keeps the download there for the
next run. The write-ups (GitHub yiphei/yif-AI) trained on their own Wikipedia text: with it,
losses compare with their tables. docs/data.md tells the rest.
"""
import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import errno
import functools
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import sys
import time
import zipfile
from urllib.parse import urlparse

import numpy as np
import requests
import tiktoken
import urllib3
from requests.adapters import HTTPAdapter

from configurator import ConfigError, Stopped, UserError, lock_folder, say, script

WRITEUP = "writeup"  # the default --dataset: the write-ups' own text, split and tokens
DEFAULT_DATA_DIR = "data/wikipedia"  # where train.py looks by default
OUTPUTS = ("train.bin", "val.bin", "meta.json")  # meta.json last: its presence marks a whole set
NOTHING_REPLACED = "no output written under the final names"  # what a failed run leaves
READ_AHEAD_CHARS = 1_000_000  # The text read ahead of the tokens written: all that memory holds.
PROGRESS_S = 10  # Long work says how far it got every this many seconds.
# The write-ups' training text and their val text, which followed it, in GPT-2 tokens.
WRITEUP_TRAIN_TOKENS, WRITEUP_VAL_TOKENS = 38_276_830, 4_341_780
WRITEUP_RUN_TOKENS = 1_440_000_000  # config/future50_mse.py: 9,000 steps of 50 x 16 x 200 tokens
# With fewer val tokens train.py's random windows overlap; fewer documents are few topics.
MIN_VAL_TOKENS, MIN_VAL_DOCUMENTS = 100_000, 10


# --------------------------------------------------------------------------- what is fetched

Pinned = collections.namedtuple("Pinned", "urls size sha256")  # a file, and where it is served
# The write-ups' data: the folder datasets/wikipedia of GitHub yiphei/yif-AI, in Git LFS, with the
# sizes and sha256s its LFS pointers give.
WRITEUP_COMMIT = "55c3ac37884aef0e3a938337bcbae2b0a26c9cb5"


def served(name):
    """GitHub's LFS host, then the raw address that redirects there."""
    path = f"{WRITEUP_COMMIT}/datasets/wikipedia/{name}"
    return (f"https://media.githubusercontent.com/media/yiphei/yif-AI/{path}",
            f"https://github.com/yiphei/yif-AI/raw/{path}")


WRITEUP_FILES = {name: Pinned(served(name), size, sha256) for name, size, sha256 in [
    ("wikipedia.txt", 178_723_194,
     "be17913eb060032dacc0155670c999d97e8ba57fd45135fe11b1a56c1b6d7bbf"),
    ("wikipedia_train.bin", 76_553_660,
     "eca4058f7bd8d508bfa8930f092fadffaa5d0b05b14dc6d3c0edc561348f4de1"),
    ("wikipedia_val.bin", 8_683_560,
     "93890178ee863dc019a8018eb99af7d2ec1385b4f340ae1e66d14a567accca09")]}
# A published WikiText raw zip, the default --out_dir, and the default of --detokenize.
Dataset = collections.namedtuple("Dataset", "file urls size sha256 out_dir detokenize")
DATASETS = {
    "wikitext103": Dataset(  # 103M words of Wikipedia, about 118M GPT-2 tokens of training text
        file="wikitext-103-raw-v1.zip",
        urls=("https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
              "https://huggingface.co/datasets/mattdangerw/wikitext-103-raw/resolve/main/"
              "wikitext-103-raw-v1.zip"),
        size=191_984_949, sha256="91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794",
        out_dir="data/wikitext103", detokenize=False),
    # for a first run on a CPU; detokenized, so that a tiny model's samples read as text
    "wikitext2": Dataset(
        file="wikitext-2-raw-v1.zip",
        urls=("https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
              "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip"),
        size=4_721_645, sha256="ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
        out_dir="data/wikitext2", detokenize=True),
}
USER_AGENT = "wikipedia-prep/1.0 (research)"  # the WikiText host refuses some default user agents
ATTEMPTS = 5  # requests per URL
RETRY_STATUSES = (429, 500, 502, 503, 504)  # Another 4xx would come again.
BACKOFF_S = 1.0  # urllib3 waits 0, 2, 4, 8 ... s, or what the server's Retry-After asks.
# What GitHub sends for a Git LFS file it does not serve (the owner's quota spent, the file gone).
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
LFS_SENT = ("the server sent a Git LFS pointer, not the file: GitHub does not serve it now (its "
            "owner's LFS quota spent, or the file gone)")


# --------------------------------------------------------------------------- downloads

class DownloadError(UserError):
    """A URL that did not give the file; the next URL may."""


class Offline(DownloadError):
    """A host name that does not resolve: a mirror's may; if none does, this machine is offline."""


def cause(error):
    """The innermost cause of error: requests wraps urllib3's error, which wraps the socket's."""
    while error.__cause__ or error.__context__:
        error = error.__cause__ or error.__context__
    return error


class Retry(urllib3.util.Retry):
    """urllib3's retries, each said in one line; none for an unknown host name or a failed TLS
    handshake, which would fail the same way again."""

    def increment(self, method=None, url=None, response=None, error=None, _pool=None,
                  _stacktrace=None):
        reason = cause(error) if error else None
        if isinstance(reason, socket.gaierror):
            raise Offline(f"cannot reach {_pool.host}")
        if isinstance(reason, ssl.SSLError):
            raise DownloadError(f"SSL error ({reason})")
        retry = super().increment(method, url, response, error, _pool, _stacktrace)
        wait = (response and retry.get_retry_after(response)) or retry.get_backoff_time()
        problem = f"HTTP {response.status}" if response else f"{type(reason).__name__}: {reason}"
        say(f"{_pool.host}: attempt {len(retry.history)} of {ATTEMPTS} failed: {problem}; "
            f"retrying in {wait:g} s")
        return retry


def http_session():
    session = requests.Session()
    retry = Retry(total=ATTEMPTS - 1, status_forcelist=RETRY_STATUSES, backoff_factor=BACKOFF_S,
                  raise_on_status=False)
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=retry))
    # The identity encoding makes byte counts and ranges refer to the file itself.
    session.headers.update({"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
    return session


def download(session, url, part, size):
    """Stream url into the file part, resuming from what it holds. The session retries a request
    until its body starts; a body cut half-way is resumed here."""
    host = urlparse(url).hostname
    for _ in range(ATTEMPTS):
        done = os.path.getsize(part) if os.path.exists(part) else 0
        if done > size:  # It is no start of this file: the whole file is asked for, written over.
            done = 0
        if done == size:
            return  # An earlier run stopped before the rename; the sha256 check follows.
        try:  # It waits 10 s to connect, and 60 s between two reads.
            response = session.get(url, headers={"Range": f"bytes={done}-"} if done else None,
                                   stream=True, timeout=(10, 60))
        except requests.RequestException as e:  # Retries of a timeout or a refusal ran out.
            reason = cause(e)
            raise DownloadError(f"gave up after {ATTEMPTS} attempts: "
                                f"{type(reason).__name__}: {reason}") from None
        with response:
            if not response.ok:
                raise DownloadError(f"HTTP {response.status_code} {response.reason}")
            if response.status_code == 200:
                done = 0  # The server ignored Range and sends the whole file.
            start, length = done, response.headers.get("Content-Length")
            if length and start + int(length) != size:
                if response.raw.read(len(LFS_POINTER)) == LFS_POINTER:
                    raise DownloadError(LFS_SENT)
                raise DownloadError(f"the server offers {start + int(length):,} bytes, "
                                    f"expected {size:,}")
            with open(part, "ab" if start else "wb") as f:
                progress = Progress()
                # A dropped connection is resumed below.
                with contextlib.suppress(requests.RequestException):
                    for chunk in response.iter_content(chunk_size=1 << 16):
                        done += f.write(chunk)
                        if progress.due():
                            mb_s = (done - start) / 1e6 / (time.time() - progress.t0)
                            say(f"{host}: {done:,} of {size:,} bytes, {mb_s:.1f} MB/s")
        if done >= size:
            return
        if start == 0 and starts_with(part, LFS_POINTER):  # It came without its length.
            os.remove(part)
            raise DownloadError(LFS_SENT)
        say(f"{host}: connection closed after {done:,} of {size:,} bytes; resuming")
    raise DownloadError(f"gave up after {ATTEMPTS} attempts: the connection closed after "
                        f"{done:,} of {size:,} bytes")


def fetch(pinned, path, hint):
    """Make path hold the pinned file: one kept from an earlier run, or a download from the first
    URL that gives it. hint: what to do when none does."""
    if os.path.exists(path):  # Only a file that passed is renamed there, unless the user put it.
        problem = wrong_bytes(path, pinned)
        if problem:
            raise UserError(f"{path} {problem}: not the file expected; HINT: move it away (it is "
                            "left as it is), and run again to download it")
        print(f"using {path}, downloaded before (its sha256 checked)")
        return path
    failures, offline, part = [], 0, path + ".part"
    # A failed write is not the server's fault: it ends the run rather than trying another URL.
    with (http_session() as session,
          writing(part, after_failure="the next run resumes the download")):
        for url in pinned.urls:
            say(f"downloading {url} ({pinned.size:,} bytes)")
            try:
                download(session, url, part, pinned.size)
            except DownloadError as e:
                failures.append(f"{url}: {e}")
                offline += isinstance(e, Offline)
                continue
            problem = wrong_bytes(part, pinned)
            if problem is None:
                os.replace(part, path)
                return path
            os.remove(part)  # It may hold two sources' bytes: the next run starts over.
            failures.append(f"{url}: {part} {problem}; deleted it")
    if offline == len(pinned.urls):  # No host name resolved.
        hosts = ", ".join(urlparse(url).hostname for url in pinned.urls)
        raise UserError(f"cannot reach {hosts}: offline? {hint}")
    raise UserError(f"could not download {os.path.basename(path)}: {'; '.join(failures)}; "
                    f"HINT: {hint}")


def wrong_bytes(path, pinned):
    """What is wrong with the file at path, or None."""
    if os.path.getsize(path) != pinned.size:
        return f"has {os.path.getsize(path):,} bytes, expected {pinned.size:,}"
    digest = sha256_of(path)
    return None if digest == pinned.sha256 else f"has sha256 {digest}, not {pinned.sha256}"


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def starts_with(path, head):
    with open(path, "rb") as f:
        return f.read(len(head)) == head


# --------------------------------------------------------------------------- reading the text

# A top-level heading, " = Title = ", not " = = Section = = ", starts a document.
HEADING = re.compile(r"\s*= [^=].* =\s*")
MAX_DOC_CHARS = 1_000_000  # On text without headings, a document ends past this many characters.
WRITEUP_TRAIN_SHARE = 0.9  # Their train is the first 90% of their text's characters.
PIECE_CHARS = 1 << 16  # Their text goes to the tokenizer in pieces of about this many characters.
# The last place in a text where a piece may end: after a character other than whitespace, before
# a space or a newline. Python's \S refuses every character that str.isspace() accepts, which are
# all those that tiktoken's \s matches (Unicode's White_Space) and a few more.
LAST_CUT = re.compile(r".*\S(?=[ \n])", re.S)


def text_lines(f, name):
    """The lines of the binary file f as text mode reads them, a quarter MB at a time; a byte that
    is not UTF-8, or a NUL (binary files hold them), is refused with its offset."""
    offset = 0  # This many bytes of f come before this block.
    while lines := f.readlines(1 << 18):
        block = b"".join(lines)
        bad = block.find(b"\0")
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError as e:
            bad = e.start if bad < 0 else min(bad, e.start)
        if bad >= 0:
            raise UserError(f"{name} is not UTF-8 text: byte {offset + bad:,} is "
                            f"0x{block[bad]:02x}; HINT: give text files only, converted to UTF-8 "
                            "(`iconv -f latin1 -t utf-8` for Latin-1 text)")
        yield from io.StringIO(text, newline=None)  # It splits at a lone \r too.
        offset += len(block)


def read_documents(lines):
    doc, size = [], 0
    for line in itertools.chain(lines, [None]):  # The None ends the last document.
        # Past MAX_DOC_CHARS, the line after a blank one starts a document too.
        long_enough = size >= MAX_DOC_CHARS and doc[-1].isspace()
        if doc and (line is None or HEADING.fullmatch(line) or long_enough):
            text = "".join(doc)
            if text.strip():
                yield text
            doc, size = [], 0
        if line is not None:
            doc.append(line)
            size += len(line)


def file_documents(paths):
    for path in paths:
        with open(path, "rb") as f:
            yield from read_documents(text_lines(f, path))


def zip_documents(zip_path, member):
    with zipfile.ZipFile(zip_path) as zf:
        name = next(n for n in zf.namelist() if os.path.basename(n) == member)
        with zf.open(name) as f:  # It is decompressed as it is read.
            yield from read_documents(text_lines(f, f"{zip_path}:{name}"))


def input_splits(paths, val_paths, val_fraction):
    """(train docs, val docs): the val files if named, else the last documents."""
    val_paths = named_val_files(paths, val_paths)
    if val_paths:
        return file_documents([p for p in paths if p not in val_paths]), file_documents(val_paths)
    n_docs = sum(1 for _ in file_documents(paths))  # A first pass finds where val begins.
    if n_docs < 2:
        raise UserError(f"found {n_docs} document(s) in {' '.join(paths)}, need 2 or more to hold "
                        "some out for val; HINT: start articles with ` = Title = ` lines, or name "
                        "val files with --val")
    n_val = max(1, round(n_docs * val_fraction))
    if n_val == n_docs:
        raise ConfigError(f"--val_fraction {val_fraction:g} leaves none of the {n_docs} documents "
                          "for train; HINT: lower it")
    docs = file_documents(paths)
    train_docs = itertools.islice(docs, n_docs - n_val)
    return train_docs, docs  # val goes on with the same read, after train's documents


def named_val_files(paths, val_paths):
    """The --val files, else an --input file named exactly wiki.valid.raw (not invalid.txt)."""
    return val_paths or [p for p in paths if os.path.basename(p) == "wiki.valid.raw"]


def detokenize(text):
    """WikiText's tokenized text back to ordinary text, line by line:

         = = Early life = =                             ->  Early life
         He had a guest @-@ starring role ( 2000 ) .        He had a guest-starring role (2000).

    Each rule asks for a space on both sides of a mark, so ordinary text passes unchanged; text
    that spaces its own marks (C's `a ? b : c`) would be changed.
    """
    # Each lookbehind comes after its literal, which the regex engine finds quickly.
    text = re.sub(r"^ (?:= )+(.*?)(?: =)+ $", r"\1", text, flags=re.M)
    text = re.sub(r"^ (?:(\S.*) )?$", r"\1", text, flags=re.M)
    text = re.sub(r" @([-,.])@ ", r"\1", text)
    text = re.sub(r'" (?<!\S" )([^"\n]*?) "(?!\S)', r'"\1"', text)
    text = re.sub(r" '(s|t|re|ve|ll|d|m)\b", r"'\1", text)
    text = re.sub(r" '(?<=s ')(?= )", "'", text)
    text = re.sub(r"\( (?<!\S\( )", "(", text)
    return re.sub(r" ([,.;:!?)])(?=\s|$)", r"\1", text)


def text_between(path, start, stop):
    """Characters start to stop of the text at path, read in text mode as the write-ups read it."""
    position = 0  # This many characters come before this block.
    with open(path, encoding="utf-8") as f:
        try:
            while position < stop and (block := f.read(PIECE_CHARS)):
                yield block[max(start - position, 0):stop - position]
                position += len(block)
        except UnicodeDecodeError as e:
            raise UserError(f"{path} is not UTF-8 text ({e.reason}, after {position:,} "
                            "characters); HINT: convert it to UTF-8 first") from None


def writeup_parts(path):
    """[("train", its pieces), ("val", its pieces)] of the text at path, split as the write-ups
    split theirs: train is the first int(n * 0.9) of its n characters, val the rest."""
    n = sum(map(len, text_between(path, 0, sys.maxsize)))  # A first pass counts the characters.
    cut = int(n * WRITEUP_TRAIN_SHARE)
    return [("train", pieces(text_between(path, 0, cut))),
            ("val", pieces(text_between(path, cut, n)))]


def pieces(blocks):
    """The text of blocks in pieces of about PIECE_CHARS characters, each ending where LAST_CUT
    says: their tokens, concatenated, are the whole text's (docs/data.md says why)."""
    text = ""
    for block in blocks:
        text += block
        if len(text) >= PIECE_CHARS and (cut := LAST_CUT.match(text)):
            yield text[:cut.end()]
            text = text[cut.end():]
    if text:
        yield text


# --------------------------------------------------------------------------- tokenize and write

def check_tokenizer():
    """Load tiktoken's GPT-2 BPE files, downloaded on first use; refuse a tiktoken too old."""
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Stopped:
        raise
    except Exception as e:  # Offline, tiktoken raises a long error of urllib3.
        raise UserError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); HINT: tiktoken "
                        "downloads its files once; offline, point TIKTOKEN_CACHE_DIR to a cache "
                        "filled elsewhere (docs/data.md, Offline)") from None
    # encode_to_numpy came with tiktoken 0.9; before 0.11 it encoded "<|endoftext|>" as the token.
    special = "<|endoftext|>"
    if (not hasattr(encoding, "encode_to_numpy")
            or encoding.encode_to_numpy(special, disallowed_special=()).tolist()
            != encoding.encode_ordinary(special)):
        raise UserError(f"tiktoken {tiktoken.__version__} is too old for prepare_wikipedia.py, "
                        "which needs 0.11 or later; HINT: pip install -U 'tiktoken>=0.11'")


def groups(docs, detokenize_first, group_chars):
    """The documents (detokenized if asked) in lists of about group_chars characters: a task of a
    tokenizer thread each."""
    group, size = [], 0
    for doc in docs:
        group.append(detokenize(doc) if detokenize_first else doc)
        size += len(group[-1])
        if size >= group_chars:
            yield group
            group, size = [], 0
    if group:
        yield group


def encoded_documents(docs, num_threads, detokenize_first, end_of_text=True):
    """(tokens, characters) of each document, in order. tiktoken encodes them on num_threads
    threads (it releases the GIL) while this one reads up to READ_AHEAD_CHARS ahead."""
    enc = tiktoken.get_encoding("gpt2")
    assert enc.max_token_value < 2**16  # uint16 holds GPT-2's 50,257 token ids.
    ends = [np.array([enc.eot_token])] if end_of_text else []

    def encode(texts):  # This runs on a tokenizer thread.
        # With no special token allowed or refused, it gives encode_ordinary's ids, 20% faster.
        return [np.concatenate((enc.encode_to_numpy(text, disallowed_special=()), *ends),
                               dtype=np.uint16, casting="unsafe")
                for text in texts]

    in_flight, chars = collections.deque(), 0  # It holds (texts, their tokens), oldest first.
    pool = concurrent.futures.ThreadPoolExecutor(num_threads)
    # Four groups a thread are in flight, so that each has the next at hand while this one writes.
    group_chars = READ_AHEAD_CHARS // (4 * num_threads)
    try:
        for texts in itertools.chain(groups(docs, detokenize_first, group_chars), [None]):
            if texts is not None:  # The None at the end empties in_flight.
                in_flight.append((texts, pool.submit(encode, texts)))
                chars += sum(map(len, texts))
            while in_flight and (texts is None or chars >= READ_AHEAD_CHARS):
                done, tokens = in_flight.popleft()
                chars -= sum(map(len, done))
                yield from zip(tokens.result(), map(len, done))
    finally:  # At the end, or as the run stops, the groups not yet begun are dropped.
        pool.shutdown(cancel_futures=True)


def write_split(encoded, path, name, tokens_asked=None):
    """Stream encoded documents into path; return (stats, left over). With tokens_asked it stops at
    the document boundary nearest that count (at least one document); a document it stops before
    is left over, unwritten."""
    stats = {"tokens": 0, "tokens_asked": tokens_asked, "documents": 0, "chars": 0,
             "max_token_id": 0}
    left_over = []
    with writing(path, after_failure=NOTHING_REPLACED):
        with open(path, "wb") as f:
            progress = Progress()
            for tokens, n_chars in encoded:
                if tokens_asked and stats["documents"]:
                    # The undershoot is above 0, since the loop stops once the count is reached.
                    undershoot = tokens_asked - stats["tokens"]
                    if stats["tokens"] + len(tokens) - tokens_asked > undershoot:
                        left_over.append((tokens, n_chars))
                        break
                f.write(tokens)
                stats.update(tokens=stats["tokens"] + len(tokens), documents=stats["documents"] + 1,
                             chars=stats["chars"] + n_chars,
                             max_token_id=max(stats["max_token_id"], int(tokens.max())))
                if progress.due():
                    of_asked = f" of {tokens_asked:,}" if tokens_asked else ""
                    rate = stats["tokens"] / (time.time() - progress.t0)
                    say(f"{name}: {stats['tokens']:,}{of_asked} tokens, {rate:,.0f} tokens/s")
                if tokens_asked and stats["tokens"] >= tokens_asked:
                    break
        stats["sha256"] = sha256_of(path)  # It reads back the bytes on disk.
    return stats, left_over


def write_splits(train_docs, val_docs, args, temps):
    """Tokenize and write both splits; val_docs None means val is the text that follows train."""
    train_encoded = encoded_documents(train_docs, args.threads, args.detokenize)
    train, left_over = write_split(train_encoded, temps["train.bin"], "train", args.train_tokens)
    if train["documents"] == 0:
        raise UserError("the train split has no text; HINT: give more text")
    if val_docs is None:  # Val goes on with the same read.
        val_encoded = itertools.chain(left_over, train_encoded)
    else:
        val_encoded = encoded_documents(val_docs, args.threads, args.detokenize)
    val, val_left_over = write_split(val_encoded, temps["val.bin"], "val", args.val_tokens)
    if val_docs is None and val["documents"] == 0:
        raise UserError(f"the text ran out: train took {train['tokens']:,} tokens "
                        f"({args.train_tokens:,} asked) and left nothing for val; "
                        "HINT: give more text, or lower --train_tokens")
    if val["documents"] == 0:
        raise UserError("the val split has no text; "
                        "HINT: give more text, or name val files with --val")
    # Val came out short, and nothing was read past it.
    if val_docs is None and val["tokens"] < args.val_tokens and not val_left_over:
        say(f"warning: the text ran out: val has {val['tokens']:,} of the {args.val_tokens:,} "
            f"tokens asked (train has {train['tokens']:,} of {args.train_tokens:,})")
    return {"train": train, "val": val}


def write_writeup_splits(path, threads, compare, temps):
    """The write-ups' splits of their text at path, each encoded as one string would be. compare:
    refuse tokens other than those of their token files."""
    splits = {}
    for name, text in writeup_parts(path):
        encoded = encoded_documents(text, threads, detokenize_first=False, end_of_text=False)
        splits[name], _ = write_split(encoded, temps[f"{name}.bin"], name)
        del splits[name]["documents"]  # They were pieces of one text, not documents.
        if not splits[name]["tokens"]:
            raise UserError(f"{path} is too short to split; HINT: give the write-ups' text")
    if compare:
        for name, split in splits.items():
            theirs = WRITEUP_FILES[f"wikipedia_{name}.bin"].sha256
            if split["sha256"] != theirs:
                raise UserError(f"{name}.bin differs from the write-ups' wikipedia_{name}.bin: "
                                f"sha256 {split['sha256']}, theirs {theirs}; {NOTHING_REPLACED}; "
                                "HINT: --tokens fetches their token files directly")
        print("identical to the write-ups' own token files "
              "(wikipedia_train.bin, wikipedia_val.bin)")
    return splits


def copy_token_files(paths, temps):
    """Copy the write-ups' token files paths["train"] and paths["val"] to train.bin and val.bin."""
    splits = {}
    for split, path in paths.items():
        temp = temps[f"{split}.bin"]
        with writing(temp, after_failure=NOTHING_REPLACED):
            shutil.copyfile(path, temp)
        tokens = np.memmap(temp, dtype=np.uint16, mode="r")
        splits[split] = {"tokens": len(tokens), "max_token_id": int(tokens.max()),
                         "sha256": sha256_of(temp)}
    return splits


class Progress:
    """A progress line is due every PROGRESS_S seconds, the first after one interval, so that each
    reports work done."""

    def __init__(self):
        self.t0 = self.last = time.time()

    def due(self):
        if time.time() - self.last < PROGRESS_S:
            return False
        self.last = time.time()
        return True


# What to do when a write fails, by errno.
ADVICE = {errno.ENOSPC: "free some space, or write to another disk",
          errno.EACCES: "check the folder's permissions, or write elsewhere",
          errno.EROFS: "the file system is read-only: write elsewhere"}


@contextlib.contextmanager
def writing(path, after_failure=None):
    """An OSError while writing path ends the run in one line: what to do, and after_failure."""
    try:
        yield
    except OSError as e:
        name = e.filename2 or e.filename or path  # A failed write() names no file, a rename two.
        cause = e.strerror.lower() if e.strerror else e
        advice = ADVICE.get(e.errno, "check the disk and the path")
        problem = f"cannot write {name}: {cause}; {advice}"
        raise UserError(f"{problem}; {after_failure}" if after_failure else problem) from None


# --------------------------------------------------------------------------- the data asked for

def writeup_data(args):
    """(meta.json's source, a function that writes train.bin and val.bin given their temporary
    paths) for the write-ups' token files or text."""
    out_dir = f" --out_dir {args.out_dir}" if args.out_dir != DEFAULT_DATA_DIR else ""
    by_hand = (f"save {WRITEUP_FILES['wikipedia.txt'].urls[0]} by hand and run `python "
               f"prepare_wikipedia.py --dataset=writeup --input wikipedia.txt{out_dir}`")
    source = {"dataset": WRITEUP, "commit": WRITEUP_COMMIT}
    if args.tokens:
        paths = {}
        for split in ("train", "val"):
            name = f"wikipedia_{split}.bin"
            paths[split] = fetch(WRITEUP_FILES[name], os.path.join(args.out_dir, name), by_hand)
        return {**source, "token_files": list(paths.values())}, functools.partial(
            copy_token_files, paths)
    if args.input:
        path, digest = args.input[0], sha256_of(args.input[0])
        if starts_with(path, LFS_POINTER):
            raise UserError(f"{path} is a Git LFS pointer, not the text; HINT: `git lfs pull` in "
                            "your clone of yiphei/yif-AI, or drop --input to download it")
    else:
        pinned = WRITEUP_FILES["wikipedia.txt"]
        path = fetch(pinned, os.path.join(args.out_dir, "wikipedia.txt"), by_hand)
        digest = pinned.sha256
    theirs = digest == WRITEUP_FILES["wikipedia.txt"].sha256
    if not theirs:
        say(f"warning: {path} is not the write-ups' wikipedia.txt (sha256 {digest}): it is "
            "tokenized their way, but its tokens will not be theirs, and are not compared")
    source = {**source, "text": path, "sha256": digest}
    return source, functools.partial(write_writeup_splits, path, args.threads, theirs)


def document_data(args):
    """writeup_data for text read in documents: a WikiText zip, or your own --input files."""
    if args.input:
        source = {"input": args.input, "val": args.val} if args.val else args.input
        train_docs, val_docs = ((file_documents(args.input), None) if args.split == "writeup"
                                else input_splits(args.input, args.val, args.val_fraction))
    else:
        dataset = DATASETS[args.dataset]
        if args.zip:
            zip_path = args.zip
            if problem := wrong_bytes(zip_path, dataset):
                raise UserError(f"{zip_path} {problem}: not the published {dataset.file}; HINT: "
                                "add --dataset=wikitext2 if it is WikiText-2's zip; unzip a zip "
                                "of your own and give its files with --input")
        else:
            hint = (f"save {dataset.urls[0]} by hand and add --zip {dataset.file} to this "
                    "command")
            zip_path = fetch(dataset, os.path.join(args.out_dir, dataset.file), hint)
        source = {"dataset": args.dataset, "zip": zip_path, "sha256": dataset.sha256}
        train_docs = zip_documents(zip_path, "wiki.train.raw")
        val_docs = (None if args.split == "writeup"
                    else zip_documents(zip_path, "wiki.valid.raw"))
    return source, functools.partial(write_splits, train_docs, val_docs, args)


def write_outputs(args, source, write):
    """Write train.bin and val.bin (write(temps) returns their stats) and meta.json into
    args.out_dir, each under a temporary name first, then renamed."""
    finals = {name: os.path.join(args.out_dir, name) for name in OUTPUTS}
    temps = {name: f"{path}.tmp" for name, path in finals.items()}
    try:
        splits = write(temps)
        passes = WRITEUP_RUN_TOKENS / splits["train"]["tokens"]
        now = datetime.datetime.now(datetime.timezone.utc)
        meta = {"tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256, "dtype": "uint16",
                "dataset": args.dataset, "split": args.split, "detokenize": args.detokenize,
                "source": source, "passes_in_1.44B_tokens": round(passes, 2), **splits,
                "created": now.isoformat(timespec="seconds")}
        with writing(temps["meta.json"], NOTHING_REPLACED), open(temps["meta.json"], "w") as f:
            json.dump(meta, f, indent=2)
        # meta.json goes first and comes back last, so its presence marks a whole set: a failure
        # up to here leaves an earlier set whole, one between the renames a set without meta.json.
        with (writing(finals["meta.json"], NOTHING_REPLACED),
              contextlib.suppress(FileNotFoundError)):
            os.remove(finals["meta.json"])
        incomplete = (f"{args.out_dir} is left without meta.json, "
                      "an incomplete set that the next run redoes")
        for name in OUTPUTS:
            with writing(finals[name], after_failure=incomplete):
                os.replace(temps[name], finals[name])
    finally:
        for path in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    for name, split in splits.items():
        print(f"{name}: {split['tokens']:,} tokens -> {finals[name + '.bin']}")
    print(f"a run of {WRITEUP_RUN_TOKENS / 1e9:.2f}B tokens (the write-ups' 9,000 steps) makes "
          f"{passes:,.1f} passes over this training text")
    return meta


def small_val_warning(val, args):
    """A warning naming the setting that grows a val too small to estimate a loss on, or None."""
    documents = val.get("documents")  # The write-ups' text is one text, of no documents.
    if val["tokens"] >= MIN_VAL_TOKENS and (documents or MIN_VAL_DOCUMENTS) >= MIN_VAL_DOCUMENTS:
        return None
    if args.dataset == WRITEUP:
        hint = "val is the last 10% of the text: give a longer text"
    elif args.split == "writeup":
        hint = (f"raise --val_tokens (now {args.val_tokens:,}); "
                "if the text ran out, give more or lower --train_tokens")
    elif not args.input:
        hint = "give more held-out text with --input and --val"
    elif named_val_files(args.input, args.val):
        hint = "give more held-out text with --val"
    else:
        hint = ("name held-out files with --val, "
                f"or raise --val_fraction (now {args.val_fraction:g})")
    counted = f" in {documents:,} document{'s' * (documents != 1)}" if documents else ""
    return (f"warning: val has {val['tokens']:,} tokens{counted}: too few to estimate a loss (aim "
            f"for {MIN_VAL_TOKENS:,}+ tokens and {MIN_VAL_DOCUMENTS}+ documents); HINT: {hint}")


# --------------------------------------------------------------------------- the command line

def check_settings(args):
    """Refuse flags that do not apply or contradict; fill in the defaults that depend on others."""
    if args.val and not args.input:
        raise ConfigError("--val needs --input: it names the val files among your text files")
    if args.dataset is None and (args.tokens or not (args.input or args.zip)):
        args.dataset = WRITEUP
    elif args.dataset is None and args.zip:
        args.dataset = "wikitext103"  # A --zip is WikiText-103's; --input alone is your own.
    if args.tokens and args.dataset != WRITEUP:
        raise ConfigError("--tokens fetches the write-ups' token files: --dataset=writeup only")
    if args.dataset == WRITEUP:
        applies = "tokens input"
        where = ("the write-ups' own text and split (--dataset=writeup, the default); HINT: drop "
                 "it, or add --dataset=wikitext103")
    elif args.split == "writeup":
        applies = "split input zip detokenize train_tokens val_tokens"
        where = "--split=writeup, which sizes the splits with --train_tokens and --val_tokens"
    else:
        applies = "split input val zip detokenize val_fraction"
        where = "WikiText's own splits (--split=wikitext, the default); HINT: add --split=writeup"
    for flag, value in vars(args).items():
        if value is not None and flag not in ["dataset", "out_dir", "threads", *applies.split()]:
            raise ConfigError(f"--{flag} does not apply to {where}")
    if args.dataset == WRITEUP and args.tokens and args.input:
        raise ConfigError("--tokens fetches the write-ups' token files, --input tokenizes a copy "
                          "of their text; HINT: give one of them")
    if args.dataset == WRITEUP and args.input and len(args.input) > 1:
        raise ConfigError("--dataset=writeup takes one --input file: their wikipedia.txt")
    if args.input and args.dataset in DATASETS:
        raise ConfigError(f"--{'zip' if args.zip else 'dataset'} names a zip to read, and --input "
                          "names text files instead; HINT: give one of them")
    for flag in ("threads", "train_tokens", "val_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag} must be 1 or more, got {value}")
    if args.val_fraction is not None and not 0 < args.val_fraction < 1:
        raise ConfigError(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    both = set(map(os.path.realpath, args.input or [])) & set(map(os.path.realpath, args.val or []))
    if both:
        raise ConfigError(f"{min(both)} is given to both --input and --val; HINT: name each file "
                          "once")
    dataset = DATASETS.get(args.dataset)
    args.split = args.split or ("writeup" if args.dataset == WRITEUP else "wikitext")
    writeup_split = args.split == "writeup" and args.dataset != WRITEUP
    args.out_dir = args.out_dir or (dataset.out_dir if dataset else DEFAULT_DATA_DIR)
    args.train_tokens = args.train_tokens or (WRITEUP_TRAIN_TOKENS if writeup_split else None)
    args.val_tokens = args.val_tokens or (WRITEUP_VAL_TOKENS if writeup_split else None)
    args.val_fraction = args.val_fraction or 0.005
    if args.detokenize is None:
        args.detokenize = writeup_split or bool(dataset and dataset.detokenize)


def check_readable(paths):
    """Refuse a file that cannot be read: now, rather than as a write error of the .bin later."""
    for path in paths:
        try:
            open(path, "rb").close()
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror.lower()}; HINT: check the path and "
                            "its permissions") from None


def prepare_data(argv):
    """The command line's preparation; returns meta.json's contents."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--dataset", choices=[WRITEUP, *DATASETS], help="writeup (the default): the write-ups' "
        "own text, split and tokens; wikitext103, wikitext2: a WikiText raw zip")
    add("--tokens", action="store_true", default=None, help="writeup: their token files instead")
    add("--split", choices=["wikitext", "writeup"], help="wikitext (the default): WikiText's own "
        "train and val files; writeup: the write-ups' token counts")
    add("--input", nargs="+", help="text files of your own (with --dataset=writeup, a copy of "
        "their wikipedia.txt)")
    add("--val", nargs="+", help="with --input: the files of the val split")
    add("--zip", help="the dataset's zip, saved by hand")
    add("--out_dir", help=f"for the outputs and the download (default {DEFAULT_DATA_DIR}, or "
        "data/DATASET)")
    add("--detokenize", action=argparse.BooleanOptionalAction, help="undo WikiText's marks "
        "(default: on with --split=writeup or --dataset=wikitext2)")
    add("--train_tokens", type=int,
        help=f"--split=writeup: train's tokens (default {WRITEUP_TRAIN_TOKENS:,})")
    add("--val_tokens", type=int,
        help=f"--split=writeup: val's tokens (default {WRITEUP_VAL_TOKENS:,})")
    add("--val_fraction", type=float, help="with --input and no val file: the share of "
        "documents, from the end, for val (default 0.005)")
    add("--threads", "--num_proc", type=int, default=os.cpu_count(), help="tokenizer threads")
    args = parser.parse_args(argv)
    check_settings(args)
    check_readable([*(args.input or []), *(args.val or []), *([args.zip] if args.zip else [])])
    try:
        # The lock makes out_dir, and keeps a second run out of it while this one lasts: the two
        # would write the same files, the download's .part among them.
        with lock_folder(args.out_dir, "prepare.lock", "prepare_wikipedia.py"):
            for name in OUTPUTS:  # A killed run's temporary files go; no other run writes now.
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(args.out_dir, f"{name}.tmp"))
            if not args.tokens:
                check_tokenizer()  # fail before a long download, not after it
            find = writeup_data if args.dataset == WRITEUP else document_data
            meta = write_outputs(args, *find(args))
    except (KeyboardInterrupt, Stopped) as e:  # script() raises Stopped for a stop signal.
        signum = getattr(e, "signum", signal.SIGINT)
        raise Stopped(signum, f"stopped by {signal.Signals(signum).name}: "
                              f"{NOTHING_REPLACED}") from None
    if warning := small_val_warning(meta["val"], args):
        say(warning)
    return meta


@script
def main(argv):
    """Exit status: 0 done, 1 an error, 2 a bad setting, 128 + the signal for a stop signal."""
    prepare_data(argv)


if __name__ == "__main__":
    sys.exit(main())
