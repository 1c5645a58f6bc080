"""
Prepare Wikipedia text for train.py: GPT-2 BPE tokens as flat uint16 arrays (nanoGPT layout).

    python prepare_wikipedia.py                          # download WikiText-103 raw (192 MB zip), tokenize all
    python prepare_wikipedia.py --dataset wikitext2      # WikiText-2 raw (4.7 MB), for a first run on a CPU
    python prepare_wikipedia.py --split=writeup --out_dir data/writeup    # the write-ups' regime (see Split)
    python prepare_wikipedia.py --zip wikitext-103-raw-v1.zip              # a zip you downloaded by hand
    python prepare_wikipedia.py --input wiki.train.raw wiki.valid.raw      # local text files, no network
    python prepare_wikipedia.py --input notes.txt --val held_out.txt       # your own text, val named
    TIKTOKEN_CACHE_DIR=~/.cache/tiktoken python prepare_wikipedia.py --input my.txt   # offline (see Offline)

Writes to --out_dir (default data/wikipedia, and data/wikitext2 for --dataset wikitext2): train.bin,
val.bin (read them with np.memmap(path, dtype=np.uint16, mode='r')) and meta.json (the split, token
and character counts, the largest token id and sha256 of each .bin, the source). The zip is kept
there and reused.

Datasets: --dataset wikitext103 (the default) and wikitext2 are WikiText's raw zips, each fetched
from its first URL that works (see DATASETS) and checked, before any of it is read, against the
published size and SHA-256. The check is the same wherever the zip comes from:
  - a download: a zip that fails is deleted (its bytes came from the network, maybe resumed onto a
    partial file of another source), and the next URL is tried; a partial download (.part) is
    resumed by the next run with an HTTP Range request;
  - the zip kept in --out_dir by an earlier run: one that fails is not used but renamed to *.bad
    (never deleted: the user may have put it there), the run says so and downloads again;
  - --zip FILE, downloaded by hand: checked against --dataset's published sha256 (WikiText-103's
    unless --dataset says otherwise); --sha256 HASH names another, for a zip of your own in WikiText's
    layout. A zip that fails is refused and left where it is; the message gives its sha256;
  - --url URL, a zip this script knows nothing of: its sha256 is printed and recorded, and
    --sha256 HASH pins it (other bytes are refused). With --dataset, a --url is taken for a mirror of
    that dataset and checked against its published sha256. Each --url has a cache of its own, named
    after the URL's file and a hash of the URL, so that two URLs with the same file name never share
    one; a cache is used only if its bytes still have the sha256 recorded when it was downloaded.
Beside a downloaded zip, ZIP.origin.json records the URL its bytes came from (after redirects) and
their sha256; meta.json's "source" repeats both, with the dataset and the sha256 that was checked.

Documents: a WikiText article starts at a top-level heading line ` = Title = ` (section lines
` = = Section = = ` do not start one). Text without such headings is cut at the first blank line
after 1M characters, and every file ends a document. Blank documents are dropped. Each document
is followed by <|endoftext|> (50256), as in nanoGPT. Input must be UTF-8 text: a file with a NUL or
an undecodable byte is refused, naming the byte's offset.

Split --split=wikitext (default): train = wiki.train.raw, val = wiki.valid.raw (wiki.test.raw is
unused). With --input, the --val files are val; without --val, an --input file named exactly
wiki.valid.raw is; with neither, the last --val_fraction of all documents (at least one) go to val.
--max_chars caps the training text only: it stops after the document that reaches the cap.

Split --split=writeup: the regime of the write-ups (Future Attention and the Auto-regressive
Encoder-Decoder Transformer, in the GitHub repository yiphei/yif-AI). They trained on 38,276,830
GPT-2 tokens of Wikipedia and validated on the 4,341,780 tokens that followed them in the same text,
so a run of 9,000 steps of 160,000 tokens made about 37.6 passes over its training text. Here
train = the first documents of wiki.train.raw (or of the --input files, in order) up to
--train_tokens, cut at the document boundary nearest that count (ties take the document); val = the
documents that follow, up to --val_tokens, cut the same way. Nothing past val is read.

--detokenize (on by default with --split=writeup and with --dataset wikitext2) undoes WikiText's
tokenization marks (` @-@ `, a space before punctuation, ...) so the text reads as ordinary text;
see detokenize().

Every output is written under a temporary name and renamed when complete (meta.json last), so an
interrupted run never leaves a half file under a final name; a killed run's temporary files are
removed by the next run. A failed write (a full disk, a read-only folder) ends the run with one line
naming the file, the cause and what to do; Ctrl-C (exit status 130) and SIGTERM (143) stop it the
same way.

The data folder is locked while this script writes it (see data.lock_data_dir()): a run that trains from
it holds out_dir/data.lock shared, and this script, which takes it exclusively, refuses such a folder
in one line, as it refuses a folder that another prepare_wikipedia.py is writing.

Offline: tiktoken downloads the GPT-2 BPE files on first use and caches them in the folder named by
TIKTOKEN_CACHE_DIR (by default data-gym-cache in the system's temporary folder). Fill one once on a
machine with a network (or copy such a folder from one), then set TIKTOKEN_CACHE_DIR to it:

    TIKTOKEN_CACHE_DIR=~/.cache/tiktoken python -c "import tiktoken; tiktoken.get_encoding('gpt2')"
"""
import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import errno
import functools
import hashlib
import io
import itertools
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
import typing
import zipfile
from urllib.parse import urlparse

import numpy as np
import requests
import tiktoken

from lib import cli, data



@dataclasses.dataclass(frozen=True)
class Dataset:
    """A published WikiText zip: where it is served and what its bytes must be."""
    file: str  # the zip's name, kept in --out_dir and reused by the next run
    urls: tuple  # tried in order; every one serves this same file
    size: int  # bytes of the zip
    sha256: str  # the zip's published SHA-256: a download or cache with other bytes is not used
    out_dir: str  # the default --out_dir
    detokenize: bool  # the default of --detokenize (with --split=wikitext)


DATASETS = {
    # the default: 103M words of Wikipedia, about 118M GPT-2 tokens of training text
    "wikitext103": Dataset(
        file="wikitext-103-raw-v1.zip",
        urls=("https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
              "https://huggingface.co/datasets/mattdangerw/wikitext-103-raw/resolve/main/wikitext-103-raw-v1.zip"),
        size=191_984_949, sha256="91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794",
        out_dir="data/wikipedia", detokenize=False),
    # the small one, for a first run on a CPU: 2M words, a 4.7 MB download; detokenized so that a tiny
    # model's samples read as text rather than ` @-@ ` marks
    "wikitext2": Dataset(
        file="wikitext-2-raw-v1.zip",
        urls=("https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
              "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip"),
        size=4_721_645, sha256="ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
        out_dir="data/wikitext2", detokenize=True),
}
DEFAULT_DATASET = "wikitext103"
WIKITEXT_MEMBERS = ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw")  # matched by basename
USER_AGENT = "wikipedia-prep/1.0 (research)"  # the WikiText host refuses some default user agents
RETRY_WAIT_S = 2.0  # first wait between download attempts; doubles each time
HEADING = re.compile(r"\s*= [^=].* =\s*")  # fullmatch: " = Title = " yes, " = = Section = = " no
MAX_DOC_CHARS = 1_000_000  # bounds memory on text without headings
BATCH_CHARS = 1_000_000  # characters per task sent to a tokenizer process
OUTPUTS = ("train.bin", "val.bin", "meta.json")  # meta.json last: its presence marks a complete set
NOTHING_REPLACED = "no output written under the final names"  # what an interrupted or failed run leaves
WRITEUP_TRAIN_TOKENS = 38_276_830  # the write-ups' training text, in GPT-2 tokens
WRITEUP_VAL_TOKENS = 4_341_780  # their val text, which followed the training text
WRITEUP_RUN_TOKENS = 9000 * 50 * 16 * 200  # max_iters × batch_size × accumulation × block_size = 1.44B
# train.py estimates the val loss on eval_iters random windows of val.bin: with fewer tokens they
# overlap, and with fewer documents val is a handful of topics, so the estimate says more about
# those passages than about the model
MIN_VAL_TOKENS = 100_000
MIN_VAL_DOCUMENTS = 10


class PrepareError(cli.UserError):
    """A failure the user can fix; main prints its message (no traceback) and exits with 1."""


def stopped(signum):
    """The exception a signal becomes: cli.Stopped, a BaseException, so that no `except Exception`
    swallows it and every `finally` cleans up, for SIGTERM as for Ctrl-C."""
    return cli.Stopped(signum, f"stopped by {signal.Signals(signum).name}: {NOTHING_REPLACED}")


HOLD = {"on": False, "signal": None}  # see signals_held()


def on_signal(signum, frame):
    """Ctrl-C and SIGTERM raise cli.Stopped, so that the same cleanup runs for both; while signals
    are held, the signal is noted instead, and raised when the hold ends."""
    if HOLD["on"]:
        HOLD["signal"] = signum
    else:
        raise stopped(signum)


@contextlib.contextmanager
def signals_held():
    """Raise Ctrl-C or SIGTERM only once the block ends. Around the forks that start the tokenizer
    processes: raised during one, the exception could be printed and dropped by a fork hook (logging
    has some), or leave a started process unknown to the executor and never stopped."""
    HOLD["on"] = True
    try:
        yield
    finally:
        HOLD["on"] = False
        signum, HOLD["signal"] = HOLD["signal"], None
        if signum is not None:
            on_signal(signum, None)


def in_words(error):
    """The cause of an OSError as a phrase: "no space left on device", "permission denied", ..."""
    cause = os.strerror(error.errno) if error.errno else str(error)
    return cause[:1].lower() + cause[1:]


@contextlib.contextmanager
def writing(path, after_failure=None):
    """Turn an OSError while writing path (or renaming it) into a PrepareError of one line: the file,
    the cause in words, what the failure left behind, and what to do."""
    try:
        yield
    except OSError as e:
        name = e.filename or path  # a failed write() names no file; a failed open() or rename() does
        what = f"rename {name} to {e.filename2}" if e.filename2 else f"write {name}"
        left = f"; {after_failure}" if after_failure else ""
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free some space on that disk, or pass --out_dir DIR on one with room"
        else:
            fix = "pass --out_dir DIR somewhere writable"
        raise PrepareError(f"cannot {what}: {in_words(e)}{left}; HINT: {fix}") from None


class Progress:
    """One status line on stderr, rewritten in place at most 4 times a second; ended on exit."""

    def __enter__(self):
        self.t0, self.last, self.message, self.shown = time.time(), 0.0, "", ""
        return self

    def show(self, message):
        self.message = message
        if time.time() - self.last >= 0.25:
            self.last, self.shown = time.time(), message
            print(f"\r{message}", end="", file=sys.stderr, flush=True)

    def __exit__(self, *exc_info):
        if self.message:  # the final numbers, and a newline so later messages start clean
            print(f"\r{self.message}" if self.message != self.shown else "", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- download

def request_problem(error, host):
    """(a one-line reason, whether another attempt may succeed) for a failed request."""
    causes = [error]  # requests wraps urllib3's error, which wraps the socket's: follow the chain
    while causes[-1].__cause__ or causes[-1].__context__:
        causes.append(causes[-1].__cause__ or causes[-1].__context__)
    root = causes[-1]
    if any(isinstance(cause, socket.gaierror) for cause in causes):
        return f"cannot resolve the host name {host} ({root}): offline, or a wrong name", False
    if isinstance(error, requests.exceptions.SSLError):
        return f"SSL error ({root})", False
    return f"{type(root).__name__}: {root}", True  # timeouts, refused or dropped connections, HTTP 5xx


def download(url, part, expected_size=None, retries=5, timeout=(10, 60)):
    """Stream url into the file part, resuming from its current size with an HTTP Range request;
    return the URL the bytes came from, after redirects (None if part was complete already).

    Timeouts, dropped connections and server errors (5xx) are retried; an unknown host name, an SSL
    failure or an HTTP 4xx answer would fail the same way again, so they raise PrepareError at once."""
    host = urlparse(url).netloc
    print(f"downloading {url}", file=sys.stderr)
    final_url = url
    for attempt in range(1, retries + 1):
        done = os.path.getsize(part) if os.path.exists(part) else 0
        if expected_size and done == expected_size:
            return None  # complete already: a previous run stopped before the rename
        # identity encoding, so byte counts and ranges refer to the file itself
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if done:
            headers["Range"] = f"bytes={done}-"
        try:
            with requests.get(url, headers=headers, stream=True, timeout=timeout) as response:
                if response.url != final_url:  # redirected: say where the bytes come from
                    final_url = response.url
                    print(f"{host}: redirected to {final_url}", file=sys.stderr)
                if response.status_code == 416:  # our .part is longer than the server's file
                    os.remove(part)
                    raise requests.RequestException("server rejected the resume range; starting over")
                if 400 <= response.status_code < 500:
                    raise PrepareError(f"HTTP {response.status_code} {response.reason}")
                response.raise_for_status()  # 5xx: retried below
                if response.status_code == 200:
                    done = 0  # the server ignored Range and sends the whole file
                length = response.headers.get("Content-Length")
                total = done + int(length) if length else expected_size
                if expected_size and total != expected_size:
                    raise PrepareError(f"server offers {total:,} bytes, expected {expected_size:,}")
                start = done
                with open(part, "ab" if done else "wb") as f, Progress() as progress:
                    for chunk in response.iter_content(chunk_size=1 << 16):
                        f.write(chunk)
                        done += len(chunk)
                        mb_s = (done - start) / 1e6 / max(time.time() - progress.t0, 1e-9)
                        percent = f" {100 * done / total:5.1f}%" if total else ""
                        progress.show(f"{host}: {done / 1e6:.1f} MB{percent}, {mb_s:.1f} MB/s")
            if total is None or done == total:
                return final_url
            problem, may_pass = f"connection closed after {done:,} of {total:,} bytes", True
        except PrepareError as e:  # the server's answer will be the same next time
            problem, may_pass = str(e), False
        except requests.RequestException as e:
            problem, may_pass = request_problem(e, host)
        wait = RETRY_WAIT_S * 2 ** (attempt - 1)
        next_step = ("a retry cannot help" if not may_pass else "giving up" if attempt == retries
                     else f"retrying in {wait:g} s")
        print(f"{host}: attempt {attempt}/{retries} failed: {problem}; {next_step}", file=sys.stderr)
        if not may_pass:
            raise PrepareError(problem)
        if attempt == retries:
            raise PrepareError(f"gave up after {retries} attempts: {problem}")
        time.sleep(wait)
    raise PrepareError(f"no download attempt made (--retries {retries})")


class Expected(typing.NamedTuple):
    """What a zip must be. None: not checked."""
    size: int | None  # bytes
    sha256: str | None
    whose: str  # where the sha256 comes from, for messages: "the published sha256 of wikitext-2-raw-v1.zip"


def examine_zip(path, expected):
    """(problem, sha256) of the zip at path: what is wrong with it as a phrase (None if nothing) and its
    SHA-256 (None when its size is wrong already). Checked in order: the size, the sha256, and that it
    is a zip holding the three WikiText files."""
    size = os.path.getsize(path)
    if expected.size is not None and size != expected.size:
        return f"has {size:,} bytes, expected {expected.size:,}", None
    digest = data.sha256_of(path)
    if expected.sha256 is not None and digest != expected.sha256:
        return f"has sha256 {digest}, not {expected.sha256}, {expected.whose}", digest
    try:
        with zipfile.ZipFile(path) as zf:
            names = {os.path.basename(name) for name in zf.namelist()}
    except zipfile.BadZipFile as e:
        return f"is not a valid zip ({e})", digest
    missing = [m for m in WIKITEXT_MEMBERS if m not in names]
    return (f"lacks {', '.join(missing)}" if missing else None), digest


def cache_path(out_dir, url, dataset):
    """Where a download is kept for the next run: under the dataset's own name for its own URLs (all
    of which serve the one published file); for a --url, under its file name and a short hash of the
    URL, so that two URLs that end in the same file name never share a cache."""
    if url is None:
        return os.path.join(out_dir, dataset.file)
    stem, ext = os.path.splitext(os.path.basename(urlparse(url).path) or "download.zip")
    return os.path.join(out_dir, f"{stem}-{hashlib.sha256(url.encode()).hexdigest()[:8]}{ext}")


def origin_path(zip_path):
    """The small json file kept beside a downloaded zip: the URL its bytes came from and their sha256."""
    return zip_path + ".origin.json"


def move_aside(path):
    """Rename path to path.bad (or path.bad.1, ... when taken), never over a file; return the new name."""
    bad = path + ".bad"
    for n in itertools.count(1):
        if not os.path.exists(bad):
            os.replace(path, bad)
            return bad
        bad = f"{path}.bad.{n}"


def cached_zip(path, expected):
    """The origin of the zip kept at path (what origin_path() recorded) if it passes the check, else None.

    Without an expected sha256 (a --url without --sha256), the cache must still have the sha256 recorded
    when it was downloaded. A cache that fails is not used: it is renamed to *.bad, never deleted, since
    the user may have put it there, and the reason is printed."""
    if not os.path.exists(path):
        return None
    try:
        with open(origin_path(path)) as f:
            origin = json.load(f)
    except (OSError, ValueError):
        origin = {"url": None, "sha256": None}  # a zip put there by hand, or by an older version of this script
    if expected.sha256 is None:
        expected = expected._replace(sha256=origin["sha256"], whose="the one recorded when it was downloaded")
    problem, digest = examine_zip(path, expected)
    if problem is None and expected.sha256 is None:
        problem = f"has no record of its download in {origin_path(path)}, so its bytes cannot be checked"
    if problem is None:
        print(f"using {path} (already downloaded from {origin['url'] or 'an unrecorded URL'}; sha256 {digest})")
        return {"url": origin["url"], "sha256": digest}
    with writing(path):
        bad = move_aside(path)
        with contextlib.suppress(FileNotFoundError):
            os.remove(origin_path(path))  # it described the file moved aside
    print(f"warning: {path} {problem}: not used; renamed it to {bad}; downloading again", file=sys.stderr)
    return None


def fetch_zip(urls, path, expected, retries, hint):
    """Make path hold a zip that passes the check, from the cache or from the first of urls that gives
    one; return its origin: the URL its bytes finally came from (after redirects) and their sha256.

    A download that fails the check is deleted: its bytes came from the network, maybe resumed onto a
    partial file of another source, and the next run starts over."""
    origin = cached_zip(path, expected)
    if origin:
        return origin
    failures = []
    part = path + ".part"
    # a failed write is not the server's fault: it ends the run (the next one resumes from part)
    # instead of trying the next URL
    with writing(part, after_failure="the next run resumes the download"):
        for url in urls:
            try:
                final_url = download(url, part, expected.size, retries)
                problem, digest = examine_zip(part, expected)
                if problem:
                    os.remove(part)
                    raise PrepareError(f"{part} {problem}; deleted it")
                origin = {"url": final_url, "sha256": digest}
                # recorded before the zip takes its final name: a zip without its record is not trusted
                cli.write_atomically(origin_path(path), lambda f: f.write(json.dumps(origin).encode()))
                os.replace(part, path)
                return origin
            except PrepareError as e:
                failures.append(f"{url}: {e}")
    raise PrepareError(f"could not download the data: {'; '.join(failures)}; HINT: {hint}")


# --------------------------------------------------------------------------- documents

def text_lines(f, name):
    """Lines of the binary file f decoded as UTF-8, newlines as text mode reads them (\\r\\n, \\r -> \\n).

    Decoding line by line finds the byte offset of the first bad byte without a second pass; a NUL
    counts as bad too, since text does not hold one and binary files do."""
    offset = 0  # bytes of f before this line
    for raw in f:
        bad = raw.find(b"\0")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad = e.start if bad < 0 else min(bad, e.start)
        if bad >= 0 and raw[bad] == 0:
            raise PrepareError(f"{name} is not UTF-8 text: byte {offset + bad:,} is a NUL, as in binary files; "
                               "HINT: give text files only; if it is text, convert it to UTF-8 first")
        if bad >= 0:
            raise PrepareError(f"{name} is not UTF-8 text: byte {offset + bad:,} (0x{raw[bad]:02x}) is not UTF-8; "
                               "HINT: convert it to UTF-8 first, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.txt` "
                               "for Latin-1 text, or leave it out")
        if "\r" in line:
            yield from io.StringIO(line, newline=None)  # splits at a lone \r and turns \r\n into \n
        else:
            yield line
        offset += len(raw)


def read_documents(lines):
    """Yield documents from text lines: a new one starts at each top-level ' = Title = ' heading."""
    doc, size = [], 0
    for line in lines:
        # a heading starts a document; past MAX_DOC_CHARS, so does the line after a blank one
        if doc and (HEADING.fullmatch(line) or (size >= MAX_DOC_CHARS and doc[-1].isspace())):
            text = "".join(doc)
            if text.strip():
                yield text
            doc, size = [], 0
        doc.append(line)
        size += len(line)
    text = "".join(doc)
    if text.strip():
        yield text


def file_documents(paths):
    """Documents of several text files, in order."""
    for path in paths:
        with open(path, "rb") as f:
            yield from read_documents(text_lines(f, path))


def zip_documents(zip_path, member):
    """Documents of one wiki.*.raw file, decompressed as it is read."""
    with zipfile.ZipFile(zip_path) as zf:
        name = next(n for n in zf.namelist() if os.path.basename(n) == member)
        with zf.open(name) as f:
            yield from read_documents(text_lines(f, f"{zip_path}:{name}"))


def cap_chars(docs, max_chars):
    """Stop after the document that reaches max_chars (no cap when max_chars is None)."""
    total = 0
    for doc in docs:
        yield doc
        total += len(doc)
        if max_chars is not None and total >= max_chars:
            return


def batches(docs):
    """Group documents into lists of about BATCH_CHARS characters, one task per list."""
    batch, size = [], 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def detokenize(text):
    """WikiText's tokenized text back to ordinary text, line by line; for example

         = Robert Boulter =                                 Robert Boulter
         = = Early life = =                             ->  Early life
         He had a guest @-@ starring role ( 2000 ) .        He had a guest-starring role (2000).
         The show 's 1 @,@ 000 " best " of 3 @.@ 5 , and    The show's 1,000 "best" of 3.5, and

    WikiText puts a space on both sides of every punctuation mark and one space at both ends of each
    line; each rule below asks for that pattern, so ordinary prose and code pass through unchanged.
    Text that itself spaces its punctuation that way (French `Attention !`, C's `a ? b : c`) would
    be changed: leave --detokenize off for it.
    """
    text = re.sub(r"^ (?:= )+(.*?)(?: =)+ $", r"\1", text, flags=re.M)  # headings, any level
    text = re.sub(r"^ (?:(\S.*) )?$", r"\1", text, flags=re.M)  # the space at both ends of a line
    text = re.sub(r" @([-,.])@ ", r"\1", text)  # inside words and numbers: guest-starring, 1,000, 3.5
    text = re.sub(r'(?<!\S)" ([^"\n]*?) "(?!\S)', r'"\1"', text)  # a pair of double quotes
    text = re.sub(r" '(s|t|re|ve|ll|d|m)\b", r"'\1", text)  # clitics: it's, don't, they're
    text = re.sub(r"(?<=s) '(?= )", "'", text)  # plural possessive: the players' union
    text = re.sub(r"(?<!\S)\( ", "(", text)  # no space after an opening parenthesis
    return re.sub(r" ([,.;:!?)])(?=\s|$)", r"\1", text)  # no space before punctuation


# --------------------------------------------------------------------------- tokenize and write

def quiet_worker():
    """Initializer of a tokenizer process: Ctrl-C is the main process's to handle (it stops the others),
    and SIGTERM, sent to every process of a job by some schedulers, ends it at once and silently
    rather than running the main process's handler, which it inherits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def encode_batch(docs, detokenize_first=False):
    """Worker: for each document, its tokens followed by <|endoftext|>, and its characters and bytes."""
    enc = tiktoken.get_encoding("gpt2")  # tiktoken caches it, so this loads once per process
    encoded = []
    for doc in docs:
        if detokenize_first:
            doc = detokenize(doc)
        tokens = np.array(enc.encode_ordinary(doc) + [enc.eot_token], dtype=np.uint32)
        assert tokens.max() < 2**16, "GPT-2 token ids must fit in uint16"
        encoded.append((tokens.astype(np.uint16), len(doc), len(doc.encode("utf-8"))))
    return encoded


def encoded_documents(docs, imap, detokenize_first):
    """(tokens, chars, bytes) of each document, in order; imap tokenizes batches in parallel."""
    encode = functools.partial(encode_batch, detokenize_first=detokenize_first)
    for batch in imap(encode, batches(docs)):
        yield from batch


def map_ahead(executor, ahead, function, items):
    """map(function, items) on executor's processes, in order, with at most `ahead` items in flight:
    the input is read only as the processes free up (executor.map would read all of it at once)."""
    in_flight = collections.deque()
    for item in items:
        with signals_held():  # the first submit forks the processes
            in_flight.append(executor.submit(function, item))
        if len(in_flight) >= ahead:
            yield in_flight.popleft().result()
    while in_flight:
        yield in_flight.popleft().result()


@contextlib.contextmanager
def tokenizer_map(num_proc):
    """A map() that runs on num_proc processes (the built-in map for one).

    A ProcessPoolExecutor rather than a multiprocessing.Pool: a worker killed at any moment (some
    schedulers send SIGTERM to every process of a job) can leave a Pool's shared queue locked, and
    Pool.terminate() then waits for ever; the executor notices the death and stops the others."""
    if num_proc == 1:
        yield map
        return
    executor = concurrent.futures.ProcessPoolExecutor(num_proc, initializer=quiet_worker)
    try:
        yield functools.partial(map_ahead, executor, 2 * num_proc)  # a batch being tokenized, one waiting
    finally:  # after an error or a signal, the batches being tokenized are finished and the rest dropped
        executor.shutdown(cancel_futures=True)


def write_split(encoded, path, name, tokens_asked=None):
    """Stream encoded documents into path, hashing them as they go; return (stats, left over).

    With tokens_asked it stops at the document boundary nearest that count (at least one document):
    a document that would overshoot by more than stopping before it undershoots is left over, returned
    unwritten in a list for the next split."""
    stats = {"tokens": 0, "tokens_asked": tokens_asked, "documents": 0, "chars": 0, "bytes": 0, "max_token_id": 0}
    sha = hashlib.sha256()
    left_over = []
    with writing(path, after_failure=NOTHING_REPLACED), open(path, "wb") as f, Progress() as progress:
        for tokens, n_chars, n_bytes in encoded:
            if tokens_asked is not None and stats["documents"]:
                undershoot = tokens_asked - stats["tokens"]  # > 0: the loop stops once the count is reached
                if stats["tokens"] + len(tokens) - tokens_asked > undershoot:
                    left_over.append((tokens, n_chars, n_bytes))
                    break
            buf = tokens.tobytes()
            f.write(buf)
            sha.update(buf)
            stats["tokens"] += len(tokens)
            stats["documents"] += 1
            stats["chars"] += n_chars
            stats["bytes"] += n_bytes
            stats["max_token_id"] = max(stats["max_token_id"], int(tokens.max()))
            mb, seconds = stats["bytes"] / 1e6, max(time.time() - progress.t0, 1e-9)
            of_asked = f" of {tokens_asked / 1e6:.2f}M" if tokens_asked else ""
            progress.show(f"{name}: {mb:.1f} MB of text, {stats['tokens'] / 1e6:.2f}M{of_asked} tokens, "
                          f"{mb / seconds:.1f} MB/s")
            if tokens_asked is not None and stats["tokens"] >= tokens_asked:
                break
    stats["sha256"] = sha.hexdigest()
    return stats, left_over


def write_splits(train_docs, val_docs, temps, imap, detokenize_first, train_tokens, val_tokens):
    """Tokenize and write both splits; val_docs None means val is the text that follows train."""
    train_encoded = encoded_documents(train_docs, imap, detokenize_first)
    train, left_over = write_split(train_encoded, temps["train.bin"], "train", train_tokens)
    if train["documents"] == 0:
        raise PrepareError("the train split has no text; HINT: give more text")
    if val_docs is None:
        val_encoded = itertools.chain(left_over, train_encoded)  # the same read goes on
    else:
        val_encoded = encoded_documents(val_docs, imap, detokenize_first)
    val, val_left_over = write_split(val_encoded, temps["val.bin"], "val", val_tokens)
    if val_docs is None and val["documents"] == 0:
        raise PrepareError(f"the text ran out: train took {train['tokens']:,} tokens ({train_tokens:,} asked) and "
                           "left nothing for val; HINT: give more text, or lower --train_tokens")
    if val["documents"] == 0:
        raise PrepareError("the val split has no text; HINT: give more text, or name val files with --val")
    if val_docs is None and val["tokens"] < val_tokens and not val_left_over:  # short, and nothing read past it
        print(f"warning: the text ran out: val has {val['tokens']:,} of the {val_tokens:,} tokens asked "
              f"(train has {train['tokens']:,} of {train_tokens:,})", file=sys.stderr)
    return {"train": train, "val": val}


def lock_out_dir(out_dir):
    """Hold out_dir's data lock exclusively while this run writes there, so that neither a run that
    trains on the folder nor a second preparation sees its files change under it."""
    lock = data.lock_data_dir(out_dir, shared=False)
    if lock:
        return lock
    reader = data.lock_data_dir(out_dir, shared=True)  # taken: shared holders are runs, an exclusive one a preparation
    if reader:
        reader.close()
        raise PrepareError(f"a run is training from {out_dir} (it holds {os.path.join(out_dir, data.DATA_LOCK)}), so its "
                           "files cannot change now; HINT: wait for the run to end, or prepare into another --out_dir")
    raise PrepareError(f"{out_dir} is in use by another prepare_wikipedia.py; HINT: wait for it to end, "
                       "or pass another --out_dir")


def remove_stale_temps(out_dir):
    """Delete the temporary files of a run that was killed before it could clean up after itself."""
    for name in OUTPUTS:
        path = os.path.join(out_dir, name + ".tmp")
        if os.path.exists(path):
            os.remove(path)
            print(f"removed {path}, left by an interrupted run")


def prepare(train_docs, val_docs, out_dir, num_proc, settings, t0):
    """Write train.bin, val.bin and meta.json into out_dir, each under a temporary name first.

    settings: split, detokenize, train_tokens, val_tokens, max_chars and source (recorded in meta.json)."""
    finals = {name: os.path.join(out_dir, name) for name in OUTPUTS}
    temps = {name: path + ".tmp" for name, path in finals.items()}
    try:
        with tokenizer_map(num_proc) as imap:
            splits = write_splits(cap_chars(train_docs, settings["max_chars"]), val_docs, temps, imap,
                                  settings["detokenize"], settings["train_tokens"], settings["val_tokens"])
        passes = WRITEUP_RUN_TOKENS / splits["train"]["tokens"]
        meta = {"tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256, "dtype": "uint16",
                "split": settings["split"], "detokenize": settings["detokenize"], "source": settings["source"],
                "max_chars": settings["max_chars"], "passes_in_1.44B_tokens": round(passes, 2), **splits,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        with writing(temps["meta.json"], after_failure=NOTHING_REPLACED), open(temps["meta.json"], "w") as f:
            json.dump(meta, f, indent=2)
        # meta.json goes first and comes back last, so its presence marks a complete set: a failure up
        # to here leaves an earlier set whole, one between the renames leaves a set without meta.json
        with writing(finals["meta.json"], after_failure=NOTHING_REPLACED), contextlib.suppress(FileNotFoundError):
            os.remove(finals["meta.json"])
        incomplete = f"{out_dir} is left without meta.json, an incomplete set that the next run redoes"
        for name in OUTPUTS:
            with writing(temps[name], after_failure=incomplete):
                os.replace(temps[name], finals[name])
    finally:
        for path in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    seconds = time.time() - t0
    mb = sum(s["bytes"] for s in splits.values()) / 1e6
    tokens = sum(s["tokens"] for s in splits.values())
    for name, s in splits.items():
        asked = f" ({s['tokens_asked']:,} asked)" if s["tokens_asked"] else ""
        print(f"{name}: {s['tokens']:,} tokens{asked}, {s['chars']:,} chars, {s['documents']:,} documents "
              f"-> {finals[name + '.bin']}")
    print(f"a run of {WRITEUP_RUN_TOKENS / 1e9:.2f}B tokens (the write-ups' 9,000 steps) makes {passes:.1f} passes "
          f"over this training text")
    print(f"done in {seconds:.1f} s: {mb:.1f} MB of text at {mb / seconds:.1f} MB/s, "
          f"{tokens / seconds / 1e6:.2f}M tokens/s")
    return meta


def check_files(paths):
    """Raise PrepareError naming the first of paths that is not a file, or cannot be read."""
    for path in paths:
        if not os.path.isfile(path):
            raise PrepareError(f"input file not found (or not a file): {path}; "
                               "HINT: check the path, or drop --input to download WikiText-103")
        try:  # now, rather than as a write error of the .bin that reads it later
            with open(path, "rb"):
                pass
        except OSError as e:
            raise PrepareError(f"cannot read {path}: {in_words(e)}; HINT: check its permissions, or leave it out")


def named_val_files(paths, val_paths):
    """The files that are val: the --val files, else an --input file named exactly wiki.valid.raw,
    WikiText's own (a substring, as in invalid.txt, does not count). None: val is the last documents."""
    return val_paths or [p for p in paths if os.path.basename(p) == "wiki.valid.raw"]


def input_splits(paths, val_paths, val_fraction):
    """(train docs, val docs) from local files: the val files if named, else the last documents."""
    val_paths = named_val_files(paths, val_paths)
    if val_paths:
        return file_documents([p for p in paths if p not in val_paths]), file_documents(val_paths)
    n_docs = sum(1 for _ in file_documents(paths))  # a first pass finds where the last documents begin
    if n_docs < 2:
        raise PrepareError(f"found {n_docs} document(s) in {' '.join(paths)}, need 2 or more to hold some "
                           "out for val; HINT: start articles with ` = Title = ` lines, or name val files with --val")
    n_train = n_docs - max(1, round(n_docs * val_fraction))
    docs = file_documents(paths)
    train_docs = itertools.islice(docs, n_train)
    return train_docs, rest_after(train_docs, docs)


def rest_after(head, docs):
    """Val continues the same read, past the train documents that --max_chars left unread."""
    for _ in head:
        pass
    yield from docs


def check_settings(args):
    """Refuse settings that contradict each other; fill in the defaults that depend on --split."""
    writeup = args.split == "writeup"
    if args.val and not args.input:
        raise PrepareError("--val needs --input: it names the val files among local text")
    both = {os.path.realpath(p) for p in args.input or []} & {os.path.realpath(p) for p in args.val or []}
    if both:
        raise PrepareError(f"{sorted(both)[0]} is given to both --input and --val; HINT: name each file once, "
                           "the training text with --input, the val text with --val")
    if writeup:
        for flag, value in [("--val", args.val), ("--max_chars", args.max_chars),
                            ("--val_fraction", args.val_fraction)]:
            if value is not None:
                raise PrepareError(f"{flag} does not apply to --split=writeup, which takes val from the text "
                                   "that follows train; HINT: size the splits with --train_tokens and --val_tokens")
    elif args.train_tokens is not None or args.val_tokens is not None:
        raise PrepareError("--train_tokens and --val_tokens need --split=writeup")
    for flag, value in [("--train_tokens", args.train_tokens), ("--val_tokens", args.val_tokens),
                        ("--max_chars", args.max_chars), ("--num_proc", args.num_proc), ("--retries", args.retries)]:
        if value is not None and value < 1:
            raise PrepareError(f"{flag} must be 1 or more, got {value}")
    if args.input and (args.dataset or args.zip or args.url or args.sha256):
        flag = next(f for f, v in [("--dataset", args.dataset), ("--zip", args.zip), ("--url", args.url),
                                   ("--sha256", args.sha256)] if v)
        raise PrepareError(f"{flag} names a zip to read, and --input names text files instead; HINT: give one of them")
    if args.zip and args.url:
        raise PrepareError("--zip names a zip on disk, --url one to download; HINT: give one of them")
    if args.sha256 is not None:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", args.sha256):
            raise PrepareError(f"--sha256 must be 64 hexadecimal digits, got {args.sha256!r}")
        if not (args.url or args.zip):
            raise PrepareError("--sha256 pins the zip of a --url or a --zip; the datasets' own downloads are checked "
                               "against their published sha256 already; HINT: drop --sha256")
        args.sha256 = args.sha256.lower()
    args.dataset_given = args.dataset is not None  # a --url with --dataset is a mirror of the published zip
    args.dataset = args.dataset or DEFAULT_DATASET
    if args.out_dir is None:
        args.out_dir = DATASETS[args.dataset].out_dir
    if writeup and args.train_tokens is None:
        args.train_tokens = WRITEUP_TRAIN_TOKENS
    if writeup and args.val_tokens is None:
        args.val_tokens = WRITEUP_VAL_TOKENS
    if args.val_fraction is None:
        args.val_fraction = 0.005
    if not 0 < args.val_fraction < 1:
        raise PrepareError(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    if args.detokenize is None:
        args.detokenize = writeup or (not args.input and DATASETS[args.dataset].detokenize)


def expected_zip(args, dataset):
    """What the zip must be: the --sha256 given, else the dataset's published size and sha256; nothing
    for a --url without --dataset, a file this script knows nothing of (its sha256 is printed and
    recorded instead). A --zip is the dataset's (WikiText-103 unless --dataset says otherwise)."""
    if args.sha256:
        return Expected(size=None, sha256=args.sha256, whose="given by --sha256")
    if args.url and not args.dataset_given:
        return Expected(size=None, sha256=None, whose="")
    return Expected(size=dataset.size, sha256=dataset.sha256, whose=f"the published sha256 of {dataset.file}")


def given_zip_sha256(path, expected):
    """The sha256 of a --zip that passes the check; a PrepareError that says what to do if it fails (the
    file is the user's: it is left where it is)."""
    if not os.path.isfile(path):
        raise PrepareError(f"zip not found: {path}; HINT: check the path, or drop --zip")
    problem, digest = examine_zip(path, expected._replace(size=None))  # the sha256 checks the size too
    if problem is None:
        return digest
    known = [name for name, d in DATASETS.items() if d.sha256 == digest]
    if known:
        hint = f"it is the published {DATASETS[known[0]].file}: add --dataset {known[0]}"
    elif expected.sha256 and digest:
        hint = (f"if it is a zip of your own in WikiText's layout, pass --sha256 {digest} to use it; "
                "if it should be the published one, download it again")
    else:
        hint = "give a zip that holds wiki.train.raw and wiki.valid.raw, or unzip yours and pass its files with --input"
    raise PrepareError(f"{path} {problem}; HINT: {hint}")


def download_hint(args, dataset, url):
    """What to do when no URL gave a zip that passes the check."""
    flags = "".join(f" --{flag} {value}" for flag, value in [("dataset", args.dataset_given and args.dataset),
                                                               ("sha256", args.sha256)] if value)
    return (f"download {url} by hand and run `python prepare_wikipedia.py{flags} --zip FILE`, or unzip it and run "
            "`python prepare_wikipedia.py --input wiki.train.raw wiki.valid.raw`")


def run(args):
    """Find the text that args name (downloading it if need be), then prepare it into args.out_dir."""
    remove_stale_temps(args.out_dir)
    try:
        tiktoken.get_encoding("gpt2")  # fail before a long download, not after it
    except Exception as e:
        default_cache = os.path.join(tempfile.gettempdir(), "data-gym-cache")  # tiktoken's, see its load.py
        raise PrepareError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); HINT: tiktoken downloads its files on first use "
                           f"and caches them in $TIKTOKEN_CACHE_DIR (default {default_cache}); offline, set "
                           "TIKTOKEN_CACHE_DIR to a cache filled on a machine with a network (see the README, Offline)")
    t0 = time.time()
    if args.input:
        check_files(args.input + (args.val or []))
        source = {"input": args.input, "val": args.val} if args.val else args.input
        if args.split == "writeup":
            train_docs, val_docs = file_documents(args.input), None
        else:
            train_docs, val_docs = input_splits(args.input, args.val, args.val_fraction)
    else:
        dataset = DATASETS[args.dataset]
        expected = expected_zip(args, dataset)
        if args.zip:
            zip_path = args.zip
            origin = {"sha256": given_zip_sha256(zip_path, expected)}
        else:
            zip_path = cache_path(args.out_dir, args.url, dataset)
            urls = [args.url] if args.url else list(dataset.urls)
            origin = fetch_zip(urls, zip_path, expected, args.retries, download_hint(args, dataset, urls[0]))
            origin["urls"] = urls
            t0 = time.time()  # the summary's speed is that of the text work, not of the download
        if expected.sha256 is None:
            print(f"sha256 of {zip_path}: {origin['sha256']} (not checked; pass --sha256 {origin['sha256']} to "
                  "insist on these bytes next time)")
        published = expected.sha256 == dataset.sha256  # the bytes are the dataset's published zip
        source = {"dataset": args.dataset if published else None, "zip": zip_path, **origin,
                  "expected_sha256": expected.sha256}
        train_docs = zip_documents(zip_path, "wiki.train.raw")
        val_docs = None if args.split == "writeup" else zip_documents(zip_path, "wiki.valid.raw")
    settings = {"split": args.split, "detokenize": args.detokenize, "train_tokens": args.train_tokens,
                "val_tokens": args.val_tokens, "max_chars": args.max_chars, "source": source}
    meta = prepare(train_docs, val_docs, args.out_dir, args.num_proc, settings, t0)
    warning = small_val_warning(meta["val"], args)
    if warning:
        print(warning, file=sys.stderr)
    return meta


def small_val_warning(val, args):
    """A warning naming the setting that grows val, when val is too small to estimate a loss on; else None."""
    if val["tokens"] >= MIN_VAL_TOKENS and val["documents"] >= MIN_VAL_DOCUMENTS:
        return None
    if args.split == "writeup":
        hint = f"raise --val_tokens (now {args.val_tokens:,}); if the text ran out, give more or lower --train_tokens"
    elif not args.input:
        hint = "use a zip whose wiki.valid.raw holds more text, or give text files with --input and --val"
    elif named_val_files(args.input, args.val):
        hint = "give more held-out text with --val"
    else:
        hint = f"name held-out files with --val, or raise --val_fraction (now {args.val_fraction:g})"
    documents = "document" if val["documents"] == 1 else "documents"
    return (f"warning: val has {val['tokens']:,} tokens in {val['documents']:,} {documents}: too few to estimate "
            f"a loss (aim for {MIN_VAL_TOKENS:,}+ tokens and {MIN_VAL_DOCUMENTS}+ documents); HINT: {hint}")


def prepare_data(argv):
    """The command line's preparation; returns meta.json's contents (tests read them)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=["wikitext", "writeup"], default="wikitext",
                        help="wikitext: WikiText's own train and val files; writeup: the write-ups' token counts")
    parser.add_argument("--input", nargs="+", help="local text files to use instead of the download")
    parser.add_argument("--val", nargs="+", help="with --input: the files of the val split")
    parser.add_argument("--dataset", choices=list(DATASETS),
                        help=f"the WikiText zip to download (default {DEFAULT_DATASET}); wikitext2 is the small one, "
                             "for a CPU")
    parser.add_argument("--zip", help="a WikiText raw zip already on disk (checked against --dataset's sha256)")
    parser.add_argument("--url", help="download the zip from here (checked against --dataset's sha256 if --dataset "
                                      "is given; else its sha256 is printed)")
    parser.add_argument("--sha256", help="with --url or --zip: the zip's SHA-256; other bytes are refused")
    parser.add_argument("--out_dir", help="gets train.bin, val.bin, meta.json and the zip (default: "
                        + ", ".join(f"{d.out_dir} for {name}" for name, d in DATASETS.items()) + ")")
    parser.add_argument("--detokenize", action=argparse.BooleanOptionalAction,
                        help="undo WikiText's tokenization marks (default: on with --split=writeup or --dataset "
                             "wikitext2, else off)")
    parser.add_argument("--train_tokens", type=int,
                        help=f"--split=writeup: training tokens (default {WRITEUP_TRAIN_TOKENS:,})")
    parser.add_argument("--val_tokens", type=int, help=f"--split=writeup: val tokens (default {WRITEUP_VAL_TOKENS:,})")
    parser.add_argument("--max_chars", type=int, help="--split=wikitext: a cap on the characters of the training text")
    parser.add_argument("--val_fraction", type=float,
                        help="with --input and no val file: share of documents, taken from the end, for val "
                             "(default 0.005)")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(), help="tokenizer processes")
    parser.add_argument("--retries", type=int, default=5, help="download attempts per URL")
    args = parser.parse_args(argv)
    handled = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored, as in a background job
        handled.append(signal.SIGINT)
    previous_handlers = {signum: signal.signal(signum, on_signal) for signum in handled}
    try:
        check_settings(args)
        with writing(args.out_dir):
            os.makedirs(args.out_dir, exist_ok=True)
            with tempfile.TemporaryFile(dir=args.out_dir):
                pass
        with lock_out_dir(args.out_dir):
            return run(args)
    except KeyboardInterrupt:  # a Ctrl-C raised before on_signal was in place
        raise stopped(signal.SIGINT) from None
    finally:
        for signum, handler in previous_handlers.items():  # main() may be called from other code, as tests do
            signal.signal(signum, handler)


@cli.main
def main(argv):
    """Exit status: 0 done, 1 an error, 130 Ctrl-C, 143 SIGTERM (128 + the signal, what a shell
    reports for a command a signal ended: a scheduler sees a termination, not an error)."""
    prepare_data(argv)


if __name__ == "__main__":
    sys.exit(main())
