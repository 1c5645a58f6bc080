"""
Prepare Wikipedia text for train.py: GPT-2 BPE tokens as flat uint16 arrays (nanoGPT's layout).

    python prepare_wikipedia.py                       # the write-ups' text (179 MB), tokenized
    python prepare_wikipedia.py --tokens              # their token files (85 MB), no tokenizer
    python prepare_wikipedia.py --dataset=wikitext2   # WikiText-2 raw (4.7 MB), a first CPU run
    python prepare_wikipedia.py --dataset=wikitext103 --split=writeup  # WikiText-103, their regime
    python prepare_wikipedia.py --input a.txt b.txt --val held_out.txt  # your own text

It writes train.bin, val.bin and meta.json to --out_dir; docs/data.md tells the rest.
"""
import collections
import concurrent.futures
import contextlib
import datetime
import hashlib
import io
import itertools
import json
import os
import pathlib
import re
import shlex
import shutil
import socket
import sys
import time
import zipfile
from urllib.parse import urlparse

import numpy as np
import requests
import tiktoken
import urllib3
from requests.adapters import HTTPAdapter

import configurator
from configurator import ConfigError, Stopped, UserError, lock_folder, say, script

WRITEUP = "writeup"  # the --dataset of the write-ups' own data
DEFAULT_DATA_DIR = "data/wikipedia"  # where train.py looks by default
OUTPUTS = ("train.bin", "val.bin", "meta.json")  # meta.json last: its presence marks a whole set
NOTHING_REPLACED = "no output written under the final names"  # what a failed run leaves
READ_AHEAD_CHARS = 1_000_000  # The most text read ahead of the tokens written, in characters.
PROGRESS_S = 10  # Long work says how far it got this often, in seconds.
WRITEUP_RUN_TOKENS = 1_440_000_000  # config/future50_mse.py: 9,000 steps of 50 x 16 x 200 tokens
# With fewer val tokens train.py's random windows overlap; fewer documents are few topics.
MIN_VAL_TOKENS, MIN_VAL_DOCUMENTS = 100_000, 10

# The settings; an empty one is filled in from the others (read_settings).
DEFAULTS = dict(
    dataset="",  # writeup: the write-ups' own text, split and tokens; wikitext103, wikitext2
    tokens=False,  # with writeup: fetch their token files instead of tokenizing their text
    split="",  # wikitext: WikiText's own train and val files; writeup: the write-ups' counts
    # Text files of your own (with --dataset=writeup: a copy of their wikipedia.txt); in a config
    # file, named as on the command line: input = "a.txt b.txt".
    input="",
    val="",  # with --input: the files of the val split
    zip="",  # the dataset's zip, saved by hand
    out_dir="",  # for the outputs and the download
    detokenize=False,  # undo WikiText's marks (the default with --split=writeup and wikitext2)
    train_tokens=38_276_830,  # with --split=writeup: train's tokens, the write-ups' count
    val_tokens=4_341_780,  # with --split=writeup: val's tokens, those that followed theirs
    # With --input and no val file: the share of documents, the last, for val (or of the lines,
    # of one text without ` = Title = ` lines).
    val_fraction=0.005,
    threads=os.cpu_count(),  # the tokenizer's threads
)
FILE_LISTS = ("input", "val")  # the keys that take every word up to the next flag
RENAMED = {"num_proc": "threads"}  # the settings of earlier versions, and their names now


# ---------------------------------------- downloads

Pinned = collections.namedtuple("Pinned", "urls size sha256")  # a file, and where it is served
# The write-ups' data in Git LFS (docs/data.md): GitHub's LFS host, then the raw address that
# redirects there.
WRITEUP_COMMIT = "55c3ac37884aef0e3a938337bcbae2b0a26c9cb5"
WRITEUP_HOSTS = ("https://media.githubusercontent.com/media/yiphei/yif-AI/",
                 "https://github.com/yiphei/yif-AI/raw/")
WRITEUP_FILES = {name: Pinned(tuple(f"{host}{WRITEUP_COMMIT}/datasets/wikipedia/{name}"
                                    for host in WRITEUP_HOSTS), size, sha256)
                 for name, size, sha256 in [
    ("wikipedia.txt", 178_723_194,
     "be17913eb060032dacc0155670c999d97e8ba57fd45135fe11b1a56c1b6d7bbf"),
    ("wikipedia_train.bin", 76_553_660,
     "eca4058f7bd8d508bfa8930f092fadffaa5d0b05b14dc6d3c0edc561348f4de1"),
    ("wikipedia_val.bin", 8_683_560,
     "93890178ee863dc019a8018eb99af7d2ec1385b4f340ae1e66d14a567accca09")]}
Dataset = collections.namedtuple("Dataset", "file urls size sha256 out_dir detokenize")
DATASETS = {
    "wikitext103": Dataset(
        file="wikitext-103-raw-v1.zip",
        urls=("https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
              "https://huggingface.co/datasets/mattdangerw/wikitext-103-raw/resolve/main/"
              "wikitext-103-raw-v1.zip"),
        size=191_984_949, sha256="91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794",
        out_dir="data/wikitext103", detokenize=False),
    "wikitext2": Dataset(
        file="wikitext-2-raw-v1.zip",
        urls=("https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
              "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip"),
        size=4_721_645, sha256="ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
        out_dir="data/wikitext2", detokenize=True),
}
USER_AGENT = "wikipedia-prep/1.0 (research)"  # the WikiText host refuses some default user agents
ATTEMPTS = 5  # requests per URL
BACKOFF_S = 1.0  # urllib3 waits 0, 2, 4, 8 ... s, or what the server's Retry-After asks.
# GitHub sends this text in place of a Git LFS file that it does not serve.
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


class DownloadError(UserError):
    """A URL that did not give the file; the next URL may."""


class Offline(DownloadError):
    """A host name that does not resolve."""


def cause(error):
    """The innermost cause of error: requests wraps urllib3's error, which wraps the socket's."""
    while error.__cause__ or error.__context__:
        error = error.__cause__ or error.__context__
    return error


class Retry(urllib3.util.Retry):
    """urllib3's retries, each said in one line; none for a host name that does not resolve."""

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, **kwargs):
        reason = cause(error) if error else None
        if isinstance(reason, socket.gaierror):
            raise Offline(f"cannot reach {_pool.host}")
        retry = super().increment(method, url, response, error, _pool, **kwargs)
        wait = (response and retry.get_retry_after(response)) or retry.get_backoff_time()
        problem = f"HTTP {response.status}" if response else f"{type(reason).__name__}: {reason}"
        say(f"{_pool.host}: attempt {len(retry.history)} of {ATTEMPTS} failed: {problem}; "
            f"retrying in {wait:g} s")
        return retry


def http_session():
    session = requests.Session()
    # Another 4xx would come again, so it is not retried.
    retry = Retry(total=ATTEMPTS - 1, status_forcelist=(429, 500, 502, 503, 504),
                  backoff_factor=BACKOFF_S, raise_on_status=False)
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=retry))
    # The identity encoding makes byte counts and ranges refer to the file itself.
    session.headers.update({"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
    return session


def download(session, url, part, size):
    """Stream url into the file part, resuming from what it holds. The session retries a request
    until its body starts; a body cut half-way is resumed here."""
    host = urlparse(url).hostname
    for attempt in range(ATTEMPTS):
        done = os.path.getsize(part) if os.path.exists(part) else 0
        if done == size:
            return  # An earlier run stopped before the rename; the sha256 check follows.
        # A part longer than the file is no start of it: the whole file is asked for.
        resume = {"Range": f"bytes={done}-"} if 0 < done < size else None
        try:
            response = session.get(url, headers=resume, stream=True, timeout=(10, 60))
        except requests.RequestException as e:  # Retries of a timeout or a refusal ran out.
            reason = cause(e)
            raise DownloadError(f"gave up after {ATTEMPTS} attempts: "
                                f"{type(reason).__name__}: {reason}") from None
        with response:
            if not response.ok:
                raise DownloadError(f"HTTP {response.status_code} {response.reason}")
            # A 200 sends the whole file: no Range was asked for, or the server ignored it.
            start = done = done if response.status_code == 206 else 0
            head = b"" if start else response.raw.read(len(LFS_POINTER))
            if head == LFS_POINTER:
                raise DownloadError("the server sent a Git LFS pointer, not the file")
            length = response.headers.get("Content-Length")
            if length and start + int(length) != size:
                raise DownloadError(f"the server offers {start + int(length):,} bytes, "
                                    f"expected {size:,}")
            if attempt == 0:
                say(f"downloading {url} ({size:,} bytes)")
            began = said = time.time()
            # A dropped connection is resumed below.
            with (open(part, "ab" if start else "wb") as f,
                  contextlib.suppress(requests.RequestException)):
                done += f.write(head)
                for chunk in response.iter_content(chunk_size=1 << 16):
                    done += f.write(chunk)
                    if time.time() - said >= PROGRESS_S:
                        said = time.time()
                        mb_s = (done - start) / 1e6 / (said - began)
                        say(f"{host}: {done:,} of {size:,} bytes, {mb_s:.1f} MB/s")
        if done >= size:
            return
        say(f"{host}: connection closed after {done:,} of {size:,} bytes; resuming")
    raise DownloadError(f"gave up after {ATTEMPTS} attempts: the connection closed after "
                        f"{done:,} of {size:,} bytes")


def fetch(pinned, path, hint):
    """Make path hold the pinned file: one kept from an earlier run, or a download from the first
    URL that gives it. hint: what to do when none does."""
    if os.path.exists(path):  # Only a file that passed is renamed there, unless the user put it.
        if problem := wrong_bytes(path, pinned):
            raise UserError(f"{path} {problem}: not the file expected; HINT: move it away to "
                            "download it again")
        print(f"using {path}, downloaded before (its sha256 checked)")
        return path
    failures, part = {}, path + ".part"
    # A failed write is not the server's fault: it ends the run rather than trying another URL.
    with (http_session() as session,
          writing(part, after_failure="the next run resumes the download")):
        for url in pinned.urls:
            say(f"trying {urlparse(url).hostname}")
            try:
                download(session, url, part, pinned.size)
                if problem := wrong_bytes(part, pinned):
                    os.remove(part)  # It may hold two sources' bytes: the next run starts over.
                    raise DownloadError(f"{part} {problem}; deleted it")
            except DownloadError as e:
                failures[url] = e
            else:
                os.replace(part, path)
                return path
    if all(isinstance(e, Offline) for e in failures.values()):  # No host name resolved.
        hosts = ", ".join(urlparse(url).hostname for url in failures)
        raise UserError(f"cannot reach {hosts}: offline? {hint}")
    reasons = "; ".join(f"{url}: {e}" for url, e in failures.items())
    raise UserError(f"could not download {os.path.basename(path)}: {reasons}; HINT: {hint}")


def wrong_bytes(path, pinned):
    """What is wrong with the file at path, or None."""
    if os.path.getsize(path) != pinned.size:
        return f"has {os.path.getsize(path):,} bytes, expected {pinned.size:,}"
    digest = sha256_of(path)
    return None if digest == pinned.sha256 else f"has sha256 {digest}, not {pinned.sha256}"


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---------------------------------------- reading the text

# A top-level heading, " = Title = ", not " = = Section = = ", starts a document.
HEADING = re.compile(r"\s*= [^=].* =\s*")
MAX_DOC_CHARS = 1_000_000  # On text without headings, a document ends past this many characters.
PIECE_CHARS = 1 << 16  # Their text goes to the tokenizer in pieces of about this many characters.
# The last place in a text where a piece may end: after a character other than whitespace, before
# a space or a newline (docs/data.md says why the tokens do not change).
LAST_CUT = re.compile(r".*\S(?=[ \n])", re.S)


def text_lines(f, name):
    """The lines of the binary file f as text mode reads them; a byte that is not UTF-8, or a NUL,
    is refused with its offset."""
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
                            f"0x{block[bad]:02x}; HINT: give text files only, converted to UTF-8")
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


def file_lines(paths):
    for path in paths:
        with open(path, "rb") as f:
            yield from text_lines(f, path)


def input_splits(paths, val_paths, val_fraction):
    """(train docs, val docs): the val files if named, else the last documents; of one document,
    its last lines."""
    if val_paths:
        return file_documents(paths), file_documents(val_paths)
    n_docs = sum(1 for _ in file_documents(paths))  # A first pass finds where val begins.
    if n_docs >= 2:
        n_val = max(1, round(n_docs * val_fraction))
        if n_val == n_docs:
            raise ConfigError(f"--val_fraction {val_fraction:g} leaves none of the {n_docs} "
                              "documents for train; HINT: lower it")
        docs = file_documents(paths)  # Val goes on with the same read, after train's documents.
        return itertools.islice(docs, n_docs - n_val), docs
    # One text without title lines: its last lines of text are val, each side one document.
    text_at = [number for number, line in enumerate(file_lines(paths)) if line.strip()]
    n_val = max(1, round(len(text_at) * val_fraction))
    if n_val >= len(text_at):
        raise UserError(f"found {len(text_at)} line(s) of text in {' '.join(paths)}, need 2 or "
                        "more to hold some out for val; HINT: give more text, or use --val")
    lines = file_lines(paths)  # Val goes on with the same read, after train's lines.
    return read_documents(itertools.islice(lines, text_at[-n_val])), read_documents(lines)


def detokenize(text):
    """WikiText's tokenized text back to ordinary text (docs/data.md). Each rule asks for a space
    on both sides of a mark, so ordinary text passes unchanged."""
    # Each lookbehind comes after its literal, which the regex engine finds quickly.
    text = re.sub(r"^ (?:= )+(.*?)(?: =)+ $", r"\1", text, flags=re.M)
    text = re.sub(r"^ (?:(\S.*) )?$", r"\1", text, flags=re.M)
    text = re.sub(r" @([-,.])@ ", r"\1", text)
    text = re.sub(r'" (?<!\S" )([^"\n]*?) "(?!\S)', r'"\1"', text)
    text = re.sub(r" '(s|t|re|ve|ll|d|m)\b", r"'\1", text)
    text = re.sub(r" '(?<=s ')(?= )", "'", text)
    text = re.sub(r"\( (?<!\S\( )", "(", text)
    return re.sub(r" ([,.;:!?)])(?=\s|$)", r"\1", text)


def writeup_parts(path):
    """[("train", its pieces), ("val", its pieces)] of the text at path, split as the write-ups
    split theirs."""
    n = sum(map(len, pieces(path, 0, sys.maxsize)))  # A first pass counts the characters.
    cut = int(n * 0.9)
    return [("train", pieces(path, 0, cut)), ("val", pieces(path, cut, n))]


def pieces(path, start, stop):
    """Characters start to stop of the text at path, read in text mode as the write-ups read it,
    in pieces that end where LAST_CUT says."""
    position, text = 0, ""  # This many characters come before the block read next.
    with open(path, encoding="utf-8") as f:
        try:
            while position < stop and (block := f.read(PIECE_CHARS)):
                text += block[max(start - position, 0):stop - position]
                position += len(block)
                if len(text) >= PIECE_CHARS and (cut := LAST_CUT.match(text)):
                    yield text[:cut.end()]
                    text = text[cut.end():]
        except UnicodeDecodeError as e:
            raise UserError(f"{path} is not UTF-8 text ({e.reason}, after {position:,} "
                            "characters); HINT: convert it to UTF-8 first") from None
    if text:
        yield text


# ---------------------------------------- tokenize and write

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
        for texts in groups(docs, detokenize_first, group_chars):
            in_flight.append((texts, pool.submit(encode, texts)))
            chars += sum(map(len, texts))
            while chars >= READ_AHEAD_CHARS:  # The oldest group is written.
                texts, tokens = in_flight.popleft()
                chars -= sum(map(len, texts))
                yield from zip(tokens.result(), map(len, texts))
        for texts, tokens in in_flight:
            yield from zip(tokens.result(), map(len, texts))
    finally:  # At the end, or as the run stops, the groups not yet begun are dropped.
        pool.shutdown(cancel_futures=True)


def write_split(encoded, path, name, tokens_asked=None):
    """Stream encoded documents into path; return (stats, left over). With tokens_asked it stops at
    the document boundary nearest that count (at least one document), and leaves the next over."""
    stats = collections.Counter(tokens=0, documents=0, chars=0, max_token_id=0)
    left_over = []
    with writing(path), open(path, "wb") as f:
        began = said = time.time()
        for tokens, n_chars in encoded:
            # The boundary nearest the count comes before this document if its middle lies past it.
            middle = stats["tokens"] + len(tokens) / 2
            if tokens_asked and stats["documents"] and middle > tokens_asked:
                left_over.append((tokens, n_chars))
                break
            f.write(tokens)
            stats.update(tokens=len(tokens), documents=1, chars=n_chars)  # It adds them.
            stats["max_token_id"] = max(stats["max_token_id"], int(tokens.max()))
            if time.time() - said >= PROGRESS_S:
                said = time.time()
                of_asked = f" of {tokens_asked:,}" if tokens_asked else ""
                rate = stats["tokens"] / (said - began)
                say(f"{name}: {stats['tokens']:,}{of_asked} tokens, {rate:,.0f} tokens/s")
            if tokens_asked and stats["tokens"] >= tokens_asked:
                break
    # The sha256 reads back the bytes on disk.
    stats = {**stats, "tokens_asked": tokens_asked, "sha256": sha256_of(path)}
    return stats, left_over


def write_splits(train_docs, val_docs, config, temps):
    """Tokenize and write both splits. val_docs None means the write-ups' split: val is the text
    that follows train, and both stop at their counts."""
    threads, detokenize_first = config["threads"], config["detokenize"]
    follows = val_docs is None
    train_asked = config["train_tokens"] if follows else None
    val_asked = config["val_tokens"] if follows else None
    train_encoded = encoded_documents(train_docs, threads, detokenize_first)
    train, left_over = write_split(train_encoded, temps["train.bin"], "train", train_asked)
    # In the write-ups' split, val goes on with the same read.
    val_encoded = (itertools.chain(left_over, train_encoded) if follows
                   else encoded_documents(val_docs, threads, detokenize_first))
    val, val_left_over = write_split(val_encoded, temps["val.bin"], "val", val_asked)
    splits = {"train": train, "val": val}
    for name, split in splits.items():
        if split["documents"] == 0:
            lower = ", or lower --train_tokens" if follows else ""
            raise UserError(f"the {name} split has no text; HINT: give more text{lower}")
    if follows and val["tokens"] < val_asked and not val_left_over:
        say(f"warning: the text ran out: val has {val['tokens']:,} of the {val_asked:,} "
            f"tokens asked (train has {train['tokens']:,} of {train_asked:,})")
    return splits


@contextlib.contextmanager
def writing(path, after_failure=NOTHING_REPLACED):
    """An OSError while writing path ends the run in one line: its cause, and after_failure."""
    try:
        yield
    except OSError as e:
        name = e.filename2 or e.filename or path  # A failed write() names no file, a rename two.
        reason = e.strerror.lower() if e.strerror else e
        raise UserError(f"cannot write {name}: {reason}; {after_failure}") from None


# ---------------------------------------- the data asked for

def writeup_data(config, temps):
    """(meta.json's source, the splits' stats) of the write-ups' token files, or their text's
    tokens, written to temps."""
    pinned = WRITEUP_FILES["wikipedia.txt"]
    out_dir = f" --out_dir {config['out_dir']}" if config["out_dir"] != DEFAULT_DATA_DIR else ""
    by_hand = (f"save {pinned.urls[0]} by hand and run `python "
               f"prepare_wikipedia.py --dataset=writeup --input wikipedia.txt{out_dir}`")
    source = {"dataset": WRITEUP, "commit": WRITEUP_COMMIT}
    if config["tokens"]:
        splits, token_files = {}, []
        for split in ("train", "val"):
            name, temp = f"wikipedia_{split}.bin", temps[f"{split}.bin"]
            path = fetch(WRITEUP_FILES[name], os.path.join(config["out_dir"], name), by_hand)
            with writing(temp):
                shutil.copyfile(path, temp)
            tokens = np.memmap(temp, dtype=np.uint16, mode="r")
            splits[split] = {"tokens": len(tokens), "max_token_id": int(tokens.max()),
                             "sha256": sha256_of(temp)}
            token_files.append(path)
        return {**source, "token_files": token_files}, splits
    if config["input"]:
        path = config["input"][0]
        with open(path, "rb") as f:
            pointer = f.read(len(LFS_POINTER)) == LFS_POINTER
        if pointer:
            raise UserError(f"{path} is a Git LFS pointer, not the text; HINT: `git lfs pull` in "
                            "your clone of yiphei/yif-AI, or drop --input to download it")
    else:
        path = fetch(pinned, os.path.join(config["out_dir"], "wikipedia.txt"), by_hand)
    digest = sha256_of(path)
    theirs = digest == pinned.sha256
    if not theirs:
        say(f"warning: {path} is not the write-ups' wikipedia.txt (sha256 {digest}): its "
            "tokens are not compared with theirs")
    splits = {}
    for name, text in writeup_parts(path):  # Each part is encoded as one string would be.
        encoded = encoded_documents(text, config["threads"], detokenize_first=False,
                                    end_of_text=False)
        split, _ = write_split(encoded, temps[f"{name}.bin"], name)
        del split["documents"]  # They were pieces of one text, not documents.
        if not split["tokens"]:
            raise UserError(f"{path} is too short to split; HINT: give the write-ups' text")
        their_sha256 = WRITEUP_FILES[f"wikipedia_{name}.bin"].sha256
        if theirs and split["sha256"] != their_sha256:
            raise UserError(f"{name}.bin differs from the write-ups' wikipedia_{name}.bin: sha256 "
                            f"{split['sha256']}, theirs {their_sha256}; {NOTHING_REPLACED}; "
                            "HINT: --tokens fetches their token files directly")
        splits[name] = split
    if theirs:
        print("identical to the write-ups' own token files "
              "(wikipedia_train.bin, wikipedia_val.bin)")
    return {**source, "text": path, "sha256": digest}, splits


def document_data(config, temps):
    """writeup_data for text in documents: a WikiText zip, or your own --input files."""
    files, val_files = config["input"], config["val"]
    if files:
        source = {"input": files, "val": val_files} if val_files else files
        train_docs, val_docs = ((file_documents(files), None) if config["split"] == "writeup"
                                else input_splits(files, val_files, config["val_fraction"]))
    else:
        dataset = DATASETS[config["dataset"]]
        zip_path = config["zip"]
        if not zip_path:
            hint = f"save {dataset.urls[0]} by hand and add --zip {dataset.file} to this command"
            zip_path = fetch(dataset, os.path.join(config["out_dir"], dataset.file), hint)
        elif problem := wrong_bytes(zip_path, dataset):
            raise UserError(f"{zip_path} {problem}: not the published {dataset.file}; HINT: add "
                            "--dataset=wikitext2 for WikiText-2's, or give your own text with "
                            "--input")
        source = {"dataset": config["dataset"], "zip": zip_path, "sha256": dataset.sha256}
        train_docs = zip_documents(zip_path, "wiki.train.raw")
        val_docs = (None if config["split"] == "writeup"
                    else zip_documents(zip_path, "wiki.valid.raw"))
    return source, write_splits(train_docs, val_docs, config, temps)


def write_outputs(config, source, splits, temps):
    """Write meta.json, then give it, train.bin and val.bin their final names."""
    finals = {name: os.path.join(config["out_dir"], name) for name in OUTPUTS}
    meta = {"tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256, "dtype": "uint16",
            "dataset": config["dataset"] or None, "split": config["split"],
            "detokenize": config["detokenize"], "source": source,
            "passes_in_1.44B_tokens": round(WRITEUP_RUN_TOKENS / splits["train"]["tokens"], 2),
            **splits,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with writing(temps["meta.json"]), open(temps["meta.json"], "w") as f:
        json.dump(meta, f, indent=2)
    # meta.json goes first, so that a rename that fails leaves a set seen as incomplete.
    with writing(finals["meta.json"]):
        pathlib.Path(finals["meta.json"]).unlink(missing_ok=True)
    incomplete = f"{config['out_dir']} is left without meta.json: the next run redoes the set"
    for name in OUTPUTS:
        with writing(finals[name], after_failure=incomplete):
            os.replace(temps[name], finals[name])
    for name, split in splits.items():
        print(f"{name}: {split['tokens']:,} tokens -> {finals[name + '.bin']}")
    return meta


def small_val_warning(val, config):
    """A warning naming the setting that grows a val too small to estimate a loss on, or None."""
    documents = val.get("documents")  # The write-ups' text is one text, of no documents.
    if val["tokens"] >= MIN_VAL_TOKENS and (documents or MIN_VAL_DOCUMENTS) >= MIN_VAL_DOCUMENTS:
        return None
    if config["dataset"] == WRITEUP:
        hint = "val is the last 10% of the text: give a longer text"
    elif config["split"] == "writeup":
        hint = (f"raise --val_tokens (now {config['val_tokens']:,}); "
                "if the text ran out, give more or lower --train_tokens")
    elif config["val"] or not config["input"]:
        hint = "give more held-out text with --input and --val"
    else:
        hint = ("name held-out files with --val, "
                f"or raise --val_fraction (now {config['val_fraction']:g})")
    counted = f" in {documents:,} document{'s' * (documents != 1)}" if documents else ""
    return (f"warning: val has {val['tokens']:,} tokens{counted}: too few to estimate a loss (aim "
            f"for {MIN_VAL_TOKENS:,}+ tokens and {MIN_VAL_DOCUMENTS}+ documents); HINT: {hint}")


# ---------------------------------------- the command line

def file_lists(argv):
    """({key: its files} for the FILE_LISTS that argv gives, the rest of argv). A .py file among
    the files is text to tokenize, not a config file."""
    lists, rest = {}, []
    words = rest  # where the next plain word goes
    for arg in argv:
        key, equals, value = arg.removeprefix("--").partition("=")
        if arg.startswith("--") and key in FILE_LISTS:
            words = lists[key] = [value] if equals else []
        elif arg.startswith("-"):
            words = rest  # A flag's value, if it has one, follows it.
            rest.append(arg)
        else:
            words.append(arg)
    return lists, rest


def read_settings(argv):
    """(the settings, the keys that argv gives), with the defaults that depend on other settings
    filled in."""
    lists, rest = file_lists(argv)
    files, overrides = configurator.parse(rest)
    for old, new in RENAMED.items():
        if old in {**files, **overrides}:
            raise ConfigError(f"--{old} is now --{new}")
    for key in FILE_LISTS:  # A config file's, unless the command line names them.
        if key in files and key not in lists:
            value, path = files.pop(key)
            if not isinstance(value, str):
                raise ConfigError(f"{key} = {value!r} in {path}: name the files in one text, as "
                                  f'on the command line: {key} = "a.txt b.txt"')
            lists[key] = shlex.split(value)
    given = {*files, *overrides, *lists}
    config = configurator.merge(DEFAULTS, files, overrides, script_keys=FILE_LISTS)
    config.update({key: lists.get(key, []) for key in FILE_LISTS})
    name = config["dataset"]
    if not name and (config["tokens"] or not (config["input"] or config["zip"])):
        name = WRITEUP
    elif not name and config["zip"]:
        name = "wikitext103"  # A --zip is WikiText-103's; --input alone is your own.
    dataset = DATASETS.get(name)
    split = config["split"] or ("writeup" if name == WRITEUP else "wikitext")
    config.update(dataset=name, split=split,
                  out_dir=config["out_dir"] or (dataset.out_dir if dataset else DEFAULT_DATA_DIR))
    if "detokenize" not in given:
        writeup_split = split == "writeup" and name != WRITEUP
        config["detokenize"] = writeup_split or bool(dataset and dataset.detokenize)
    return config, given


def check_settings(config, given):
    """Refuse settings that do not apply or contradict, and files that cannot be read."""
    dataset, files, val_files = config["dataset"], config["input"], config["val"]
    for key, choices in (("dataset", [WRITEUP, *DATASETS]), ("split", ["wikitext", "writeup"])):
        if config[key] not in ["", *choices]:  # Your own text's dataset is "".
            raise ConfigError(f"--{key} must be one of {', '.join(choices)}, got {config[key]!r}")
    for key in FILE_LISTS:
        if key in given and not config[key]:
            raise ConfigError(f"--{key} names no file: write --{key} FILE ...")
    if val_files and not files:
        raise ConfigError("--val needs --input: it holds out files of your own text")
    if config["tokens"] and dataset != WRITEUP:
        raise ConfigError("--tokens fetches the write-ups' token files: --dataset=writeup only")
    if dataset == WRITEUP:
        applies = "tokens input"
        where = ("the write-ups' own text and split (the default); HINT: drop it, or add "
                 "--dataset=wikitext103")
    elif config["split"] == "writeup":
        applies = "split input zip detokenize train_tokens val_tokens"
        where = "--split=writeup, sized by --train_tokens and --val_tokens"
    else:
        applies = "split input val zip detokenize val_fraction"
        where = "WikiText's own splits (--split=wikitext, the default); HINT: add --split=writeup"
    for key in DEFAULTS:
        if key in given and key not in ["dataset", "out_dir", "threads", *applies.split()]:
            raise ConfigError(f"--{key} does not apply to {where}")
    if dataset == WRITEUP and config["tokens"] and files:
        raise ConfigError("--tokens fetches the write-ups' token files, --input tokenizes a copy "
                          "of their text; HINT: give one of them")
    if dataset == WRITEUP and len(files) > 1:
        raise ConfigError("--dataset=writeup takes one --input file: their wikipedia.txt")
    if files and dataset in DATASETS:
        raise ConfigError(f"--{'zip' if config['zip'] else 'dataset'} names a zip to read, and "
                          "--input names text files instead; HINT: give one of them")
    for key in ("threads", "train_tokens", "val_tokens"):
        if key in given and config[key] < 1:
            raise ConfigError(f"--{key} must be 1 or more, got {config[key]}")
    if not 0 < config["val_fraction"] < 1:
        raise ConfigError(f"--val_fraction must be between 0 and 1, got {config['val_fraction']}")
    if both := set(map(os.path.realpath, files)) & set(map(os.path.realpath, val_files)):
        raise ConfigError(f"{min(both)} is given to both --input and --val")
    # An unreadable file is refused now, not as a write error of the .bin later.
    for path in [*files, *val_files, *filter(None, [config["zip"]])]:
        try:
            open(path, "rb").close()
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror.lower()}") from None


@contextlib.contextmanager
def holding(out_dir):
    """The run's lock on out_dir, and its temporary files' paths; a run that fails takes away
    what it made (docs/data.md)."""
    temps = {name: os.path.join(out_dir, f"{name}.tmp") for name in OUTPUTS}
    folder = pathlib.Path(out_dir).absolute()
    # A run that fails takes away the folders that lock_folder makes.
    made = [path for path in [folder, *folder.parents] if not path.exists()]
    try:
        with lock_folder(out_dir, "prepare.lock", "prepare_wikipedia.py"):
            try:
                yield temps
            except BaseException:
                for path in temps.values():  # This run's temporary files go, and a killed run's.
                    pathlib.Path(path).unlink(missing_ok=True)
                raise
    except BaseException as e:
        for folder in made:  # Now that the lock's file is gone too.
            with contextlib.suppress(OSError):  # One that is not empty stays.
                os.rmdir(folder)
        if isinstance(e, Stopped):  # script() raises it for a stop signal.
            raise Stopped(e.signum, f"{e}: {NOTHING_REPLACED}") from None
        raise


def prepare_data(argv):
    """The command line's preparation; returns meta.json's contents."""
    config, given = read_settings(argv)
    check_settings(config, given)
    with holding(config["out_dir"]) as temps:
        # tiktoken fetches its GPT-2 files on first use: fail now, not after a download.
        if not config["tokens"]:
            try:
                tiktoken.get_encoding("gpt2")
            except Exception as e:  # Offline, tiktoken raises a long error of urllib3.
                raise UserError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); HINT: "
                                "offline, set TIKTOKEN_CACHE_DIR to a filled cache (docs/data.md, "
                                "Offline)") from None
        write = writeup_data if config["dataset"] == WRITEUP else document_data
        meta = write_outputs(config, *write(config, temps), temps)
    if warning := small_val_warning(meta["val"], config):
        say(warning)
    return meta


@script
def main(argv):
    if configurator.wants_help(argv):
        config = read_settings(argv)[0]
        for key in FILE_LISTS:  # shown as a config file names them
            config[key] = shlex.join(config[key])
        print(configurator.usage(__doc__, config))
        return 0
    prepare_data(argv)


if __name__ == "__main__":
    sys.exit(main())
