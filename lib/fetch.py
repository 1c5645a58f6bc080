"""
What prepare_wikipedia.py fetches and reads: the write-ups' own files (their text, or their token
files) and the WikiText zips, pinned here, whose size and sha256 are checked before any of it is
read; how the text of each is read (WikiText's and your own files' in documents, split into train
and val, the write-ups' in pieces); and tiktoken's GPT-2 files, checked before a long download. A
download resumes its .part with an HTTP Range request and records its origin (the URL after
redirects, and the sha256); a cached zip that fails is renamed *.bad, never deleted; the cache is
keyed by URL; retries, backoff and Retry-After are urllib3's. A reader of the tutorial may skip
this file.
"""
import collections
import contextlib
import dataclasses
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import zipfile
from urllib.parse import urlparse

import numpy as np
import requests
import tiktoken
import urllib3
from requests.adapters import HTTPAdapter

from lib import cli, data, prepare_io

HEADING = re.compile(r"\s*= [^=].* =\s*")  # fullmatch: " = Title = " yes, " = = Section = = " no
MAX_DOC_CHARS = 1_000_000  # bounds memory on text without headings
WIKITEXT_MEMBERS = ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw")  # matched by basename
USER_AGENT = "wikipedia-prep/1.0 (research)"  # the WikiText host refuses some default user agents
# The answers worth another attempt; another 4xx would come again.
RETRY_STATUSES = (429, 500, 502, 503, 504)
# urllib3 waits 0, 2, 4, 8 ... s between attempts, or what the server's Retry-After asks.
BACKOFF_S = 1.0


# --------------------------------------------------------------------------- what is fetched

@dataclasses.dataclass(frozen=True)
class Dataset:
    """A published WikiText zip: where it is served and what its bytes must be."""
    file: str  # the zip's name, kept in --out_dir and reused by the next run
    urls: tuple  # tried in order; every one serves this same file
    size: int  # bytes of the zip
    sha256: str  # its published SHA-256: a download or cache with other bytes is not used
    out_dir: str  # the default --out_dir
    detokenize: bool  # the default of --detokenize (with --split=wikitext)


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
# The write-ups' own data: the folder datasets/wikipedia of GitHub yiphei/yif-AI at one commit, its
# files in Git LFS; the size and sha256 of each are those its Git LFS pointer gives.
WRITEUP_COMMIT = "55c3ac37884aef0e3a938337bcbae2b0a26c9cb5"
Pinned = collections.namedtuple("Pinned", "urls size sha256")


def served(name):
    """Where GitHub serves a Git LFS file of that folder: its LFS host, then the raw address that
    redirects there."""
    return (f"https://media.githubusercontent.com/media/yiphei/yif-AI/{WRITEUP_COMMIT}/"
            f"datasets/wikipedia/{name}",
            f"https://github.com/yiphei/yif-AI/raw/{WRITEUP_COMMIT}/datasets/wikipedia/{name}")


WRITEUP_FILES = {
    "wikipedia.txt": Pinned(served("wikipedia.txt"), 178_723_194,
                            "be17913eb060032dacc0155670c999d97e8ba57fd45135fe11b1a56c1b6d7bbf"),
    "wikipedia_train.bin": Pinned(
        served("wikipedia_train.bin"), 76_553_660,
        "eca4058f7bd8d508bfa8930f092fadffaa5d0b05b14dc6d3c0edc561348f4de1"),
    "wikipedia_val.bin": Pinned(
        served("wikipedia_val.bin"), 8_683_560,
        "93890178ee863dc019a8018eb99af7d2ec1385b4f340ae1e66d14a567accca09"),
}
WRITEUP_TOKENS = (38_276_830, 4_341_780)  # in the two .bin files: the write-ups' train and val
WRITEUP_TRAIN_SHARE = 0.9  # their train: the first 90% of their text's characters
PIECE_CHARS = 1 << 16  # their text goes to the tokenizer in pieces of about this many characters
# the last place in a text where a piece may end: after a character other than whitespace, before
# a space or a newline; Python's \S refuses every character str.isspace() accepts, which are all
# those tiktoken's \s matches (Unicode's White_Space) and a few more
LAST_CUT = re.compile(r".*\S(?=[ \n])", re.S)
# what GitHub sends for a Git LFS file it does not serve (the owner's quota spent, the file gone)
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


class DownloadError(cli.UserError):
    """A file that cannot be had or is not the one expected; cli.main prints its message and exits
    with 1."""


def request_problem(error, host):
    """(the cause of a failed request as a phrase, whether another attempt may mend it)."""
    causes = [error]  # requests wraps urllib3's error, which wraps the socket's
    while causes[-1].__cause__ or causes[-1].__context__:
        causes.append(causes[-1].__cause__ or causes[-1].__context__)
    if any(isinstance(cause, socket.gaierror) for cause in causes):
        problem = f"cannot resolve the host name {host} ({causes[-1]}): offline, or a wrong name"
        return problem, False
    ssl_errors = (urllib3.exceptions.SSLError, requests.exceptions.SSLError)
    if any(isinstance(cause, ssl_errors) for cause in causes):
        return f"SSL error ({causes[-1]})", False
    # timeouts, refused or dropped connections
    return f"{type(causes[-1]).__name__}: {causes[-1]}", True


class Retry(urllib3.util.Retry):
    """urllib3's retries (backoff, the statuses worth another attempt, Retry-After), printing each
    failed attempt, and none for what would fail the same way again: an unknown host name, a failed
    TLS handshake."""

    def increment(self, method=None, url=None, response=None, error=None, _pool=None,
                  _stacktrace=None):
        if error:
            problem, may_pass = request_problem(error, _pool.host)
        else:
            problem, may_pass = f"HTTP {response.status}", True
        attempt, retry = len(self.history) + 1, None
        with contextlib.suppress(urllib3.exceptions.MaxRetryError):  # none left: retry stays None
            if may_pass:
                retry = super().increment(method, url, response, error, _pool, _stacktrace)
        wait = retry and ((response and retry.get_retry_after(response))
                          or retry.get_backoff_time())
        if retry:
            next_step = f"retrying in {wait:g} s"
        else:
            next_step = "giving up" if may_pass else "a retry cannot help"
        print(f"{_pool.host}: attempt {attempt}/{attempt + self.total} failed: "
              f"{problem}; {next_step}", file=sys.stderr)
        if retry is None:
            raise urllib3.exceptions.MaxRetryError(_pool, url, error) from error
        return retry


def http_session(attempts):
    """The one session of the downloads: urllib3 makes up to `attempts` requests per URL."""
    session = requests.Session()
    retry = Retry(total=attempts - 1, status_forcelist=RETRY_STATUSES, backoff_factor=BACKOFF_S,
                  raise_on_status=False)
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=retry))
    # identity encoding, so that byte counts and ranges refer to the file itself
    session.headers.update({"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
    return session


def download(session, url, part, expected_size, attempts):
    """Stream url into the file part, resuming from its current size with an HTTP Range request;
    return the URL the bytes came from, after redirects (None if part was complete already). The
    session retries a request until its body starts; a body cut half-way is resumed here, up to
    `attempts` times."""
    host = urlparse(url).netloc
    print(f"downloading {url}", file=sys.stderr)
    for _ in range(attempts):
        done = os.path.getsize(part) if os.path.exists(part) else 0
        if expected_size and done == expected_size:
            return None  # complete already: a previous run stopped before the rename
        try:
            resume_from = {"Range": f"bytes={done}-"} if done else None
            response = session.get(url, headers=resume_from, stream=True,
                                   timeout=(10, 60))  # to connect, and between two reads
        except requests.RequestException as e:
            problem, may_pass = request_problem(e, urlparse(url).hostname)
            if may_pass:
                problem = f"gave up after {attempts} attempts: {problem}"
            raise DownloadError(problem) from None
        with response:
            if response.url != url:
                print(f"{host}: redirected to {response.url}", file=sys.stderr)
            # Our .part is longer than the server's file: start over.
            if response.status_code == 416:
                os.remove(part)
                problem = "the server refused to resume the download"
                continue
            if not response.ok:
                retried = response.status_code in RETRY_STATUSES
                gave_up = f"gave up after {attempts} attempts: " if retried else ""
                raise DownloadError(f"{gave_up}HTTP {response.status_code} {response.reason}")
            if response.status_code == 200:
                done = 0  # the server ignored Range and sends the whole file
            length, start = response.headers.get("Content-Length"), done
            total = done + int(length) if length else expected_size
            if expected_size and total != expected_size:
                raise DownloadError(wrong_size(response, total, expected_size))
            with open(part, "ab" if done else "wb") as f, prepare_io.Progress() as progress:
                # A dropped connection is resumed below.
                with contextlib.suppress(requests.RequestException):
                    for chunk in response.iter_content(chunk_size=1 << 16):
                        done += f.write(chunk)
                        percent = f" {100 * done / total:5.1f}%" if total else ""
                        mb_s = (done - start) / 1e6 / max(time.time() - progress.t0, 1e-9)
                        progress.show(f"{host}: {done / 1e6:.1f} MB{percent}, {mb_s:.1f} MB/s")
        if total is None or done == total:
            return response.url
        if start == 0 and done < 1024 and starts_with_lfs_pointer(part):  # sent without its size
            os.remove(part)  # not bytes to resume from
            raise DownloadError(lfs_pointer_problem(done))
        problem = f"connection closed after {done:,} of {total:,} bytes"
        print(f"{host}: {problem}; resuming", file=sys.stderr)
    raise DownloadError(f"gave up after {attempts} attempts: {problem}")


def wrong_size(response, total, expected_size):
    """What a body of the wrong size is, as a phrase: GitHub's pointer text, or just the sizes."""
    small = response.status_code == 200 and total < 1024
    if small and response.raw.read(total).startswith(LFS_POINTER):
        return lfs_pointer_problem(total)
    return f"server offers {total:,} bytes, expected {expected_size:,}"


def lfs_pointer_problem(size):
    return (f"the server sent a Git LFS pointer ({size} bytes), not the file: GitHub does not "
            "serve it now (its owner's LFS quota spent, or the file gone)")


def starts_with_lfs_pointer(path):
    """Does the file at path start as a Git LFS pointer text does?"""
    with open(path, "rb") as f:
        return f.read(len(LFS_POINTER)) == LFS_POINTER


# what a zip must be (None: not checked); whose: where the sha256 comes from, for messages
Expected = collections.namedtuple("Expected", "size sha256 whose")


def examine_file(path, expected):
    """(what is wrong with the file at path as a phrase, or None; its SHA-256, None when its size
    is wrong)."""
    size = os.path.getsize(path)
    if expected.size is not None and size != expected.size:
        return f"has {size:,} bytes, expected {expected.size:,}", None
    digest = data.sha256_of(path)
    if expected.sha256 is not None and digest != expected.sha256:
        return f"has sha256 {digest}, not {expected.sha256}, {expected.whose}", digest
    return None, digest


def examine_zip(path, expected):
    """examine_file, and then whether the zip holds WikiText's files."""
    problem, digest = examine_file(path, expected)
    if problem:
        return problem, digest
    try:
        with zipfile.ZipFile(path) as zf:
            members = {os.path.basename(n) for n in zf.namelist()}
            missing = [m for m in WIKITEXT_MEMBERS if m not in members]
    except zipfile.BadZipFile as e:
        return f"is not a valid zip ({e})", digest
    return (f"lacks {', '.join(missing)}" if missing else None), digest


def cache_path(out_dir, url, dataset):
    """Where a download is kept: the dataset's file name for its own URLs (which serve one file);
    for a --url, its file name and a hash of the URL, so that two URLs never share a cache."""
    if url is None:
        return os.path.join(out_dir, dataset.file)
    stem, ext = os.path.splitext(os.path.basename(urlparse(url).path) or "download.zip")
    return os.path.join(out_dir, f"{stem}-{hashlib.sha256(url.encode()).hexdigest()[:8]}{ext}")


def fetch_file(urls, path, expected, attempts, hint, examine=examine_zip):
    """Make path hold a file that passes the check (examine: a zip's, by default), kept from an
    earlier run or downloaded from the first of urls that gives one; return its origin: the URL its
    bytes came from, and their sha256."""
    if os.path.exists(path):
        try:
            with open(path + ".origin.json") as f:
                origin = json.load(f)
        except (OSError, ValueError):
            origin = {"url": None, "sha256": None}  # a zip put there by hand
        # A --url without --sha256 is checked against the sha256 recorded at the download, if any.
        if expected.sha256 is None:
            expected = expected._replace(sha256=origin["sha256"],
                                         whose="the one recorded when it was downloaded")
        problem, digest = examine(path, expected)
        if problem is None and expected.sha256 is None:
            problem = (f"has no record of its download in {path}.origin.json, "
                       "so its bytes cannot be checked")
        if problem is None:
            source = origin["url"] or "an unrecorded URL"
            print(f"using {path} (already downloaded from {source}; sha256 {digest})")
            return {"url": origin["url"], "sha256": digest}
        bad, n = path + ".bad", 0
        while os.path.exists(bad):  # never over an earlier one
            n += 1
            bad = f"{path}.bad.{n}"
        with prepare_io.writing(path):
            os.replace(path, bad)  # not deleted: the user may have put it there
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + ".origin.json")  # it described the file moved aside
        print(f"warning: {path} {problem}: not used; renamed it to {bad}; downloading again",
              file=sys.stderr)
    failures, part = [], path + ".part"
    # A failed write is not the server's fault: it ends the run (the next one resumes) rather than
    # trying another URL.
    with (http_session(attempts) as session,
          prepare_io.writing(part, after_failure="the next run resumes the download")):
        for url in urls:
            try:
                final_url = download(session, url, part, expected.size, attempts)
                problem, digest = examine(part, expected)
                if problem:
                    # Maybe resumed onto another source's bytes: the next run starts over.
                    os.remove(part)
                    raise DownloadError(f"{part} {problem}; deleted it")
            except DownloadError as e:
                failures.append(f"{url}: {e}")
                continue
            # The origin is recorded first: a zip without its record is not trusted.
            origin = {"url": final_url, "sha256": digest}
            cli.write_atomically(path + ".origin.json",
                                 lambda f: f.write(json.dumps(origin).encode()))
            os.replace(part, path)
            return origin
    raise DownloadError(f"could not download the data: {'; '.join(failures)}; HINT: {hint}")


def writeup_file(name, out_dir, attempts, hint):
    """(the path in out_dir of the write-ups' file called name, downloaded or kept from an earlier
    run and checked against its pin; its origin, for meta.json)."""
    pinned, path = WRITEUP_FILES[name], os.path.join(out_dir, name)
    expected = Expected(pinned.size, pinned.sha256, f"the pinned sha256 of the write-ups' {name}")
    origin = fetch_file(list(pinned.urls), path, expected, attempts, hint, examine=examine_file)
    return path, {**origin, "urls": list(pinned.urls)}


# ------------------------------------------------------------ the text of the sources

def text_lines(f, name):
    """Lines of the binary file f decoded as UTF-8, newlines as text mode reads them (\\r\\n, \\r
    -> \\n), a quarter MB of whole lines read at a time; a byte that is not UTF-8 text (a NUL too)
    is refused with its offset."""
    offset = 0  # bytes of f before this block
    while lines := f.readlines(2**18):
        block = b"".join(lines)
        text = prepare_io.utf8_text(block, offset, name)
        yield from io.StringIO(text, newline=None)  # splits at a lone \r too
        offset += len(block)


def read_documents(lines):
    """Yield documents from text lines: a new one starts at each top-level ' = Title = ' heading."""
    doc, size = [], 0
    for line in itertools.chain(lines, [None]):  # None: the end, which ends the last document
        # a heading starts a document; past MAX_DOC_CHARS, so does the line after a blank one
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


def named_val_files(paths, val_paths):
    """The --val files, else an --input file named exactly wiki.valid.raw (not invalid.txt);
    [] if neither."""
    return val_paths or [p for p in paths if os.path.basename(p) == "wiki.valid.raw"]


def input_splits(paths, val_paths, val_fraction):
    """(train docs, val docs) from local files: the val files if named, else the last documents."""
    val_paths = named_val_files(paths, val_paths)
    if val_paths:
        train_paths = [p for p in paths if p not in val_paths]
        return file_documents(train_paths), file_documents(val_paths)
    n_docs = sum(1 for _ in file_documents(paths))  # a first pass finds where val begins
    if n_docs < 2:
        raise cli.UserError(f"found {n_docs} document(s) in {' '.join(paths)}, need 2 or more to "
                            "hold some out for val; HINT: start articles with ` = Title = ` lines, "
                            "or name val files with --val")
    docs = file_documents(paths)
    train_docs = itertools.islice(docs, n_docs - max(1, round(n_docs * val_fraction)))
    return train_docs, rest_after(train_docs, docs)


def rest_after(head, docs):
    """Val continues the same read, past the train documents that --max_chars left unread."""
    collections.deque(head, maxlen=0)  # reads head to its end
    yield from docs


def detokenize(text):
    """WikiText's tokenized text back to ordinary text, line by line; for example

         = Robert Boulter =                                 Robert Boulter
         = = Early life = =                             ->  Early life
         He had a guest @-@ starring role ( 2000 ) .        He had a guest-starring role (2000).
         The show 's 1 @,@ 000 " best " of 3 @.@ 5 , and    The show's 1,000 "best" of 3.5, and

    Each rule asks for WikiText's pattern, a space on both sides of a mark and at both ends of a
    line, so ordinary prose and code pass unchanged; text that spaces its own marks that way (French
    `Attention !`, C's `a ? b : c`) would be changed: leave --detokenize off for it.
    """
    text = re.sub(r"^ (?:= )+(.*?)(?: =)+ $", r"\1", text, flags=re.M)  # headings, any level
    text = re.sub(r"^ (?:(\S.*) )?$", r"\1", text, flags=re.M)  # the space at both ends of a line
    text = re.sub(r" @([-,.])@ ", r"\1", text)  # inside words and numbers: guest-starring, 1,000
    # each lookbehind comes after its literal, which the regex engine finds quickly: (?<!\S)\( is
    # slow
    text = re.sub(r'" (?<!\S" )([^"\n]*?) "(?!\S)', r'"\1"', text)  # a pair of double quotes
    text = re.sub(r" '(s|t|re|ve|ll|d|m)\b", r"'\1", text)  # clitics: it's, don't, they're
    text = re.sub(r" '(?<=s ')(?= )", "'", text)  # plural possessive: the players' union
    text = re.sub(r"\( (?<!\S\( )", "(", text)  # no space after an opening parenthesis
    return re.sub(r" ([,.;:!?)])(?=\s|$)", r"\1", text)  # no space before punctuation


def text_between(path, start, stop):
    """Characters start to stop of the text at path as the write-ups read it, with Python's text
    mode (UTF-8, \\r\\n and \\r become \\n), in blocks of at most PIECE_CHARS characters."""
    position = 0  # characters read before this block
    with open(path, encoding="utf-8") as f:
        try:
            while position < stop and (block := f.read(PIECE_CHARS)):
                yield block[max(start - position, 0):stop - position]
                position += len(block)
        except UnicodeDecodeError as e:
            raise cli.UserError(f"{path} is not UTF-8 text ({e.reason}, after {position:,} "
                                "characters); HINT: convert it to UTF-8 first") from None


def writeup_parts(path):
    """[("train", its pieces), ("val", its pieces)] of the text at path, split as the write-ups
    split theirs (datasets/prepare_data.py of yiphei/yif-AI): train is the first int(n * 0.9) of its
    n characters, val the rest, each tokenized as one string; its pieces tokenize alike (pieces)."""
    n = sum(map(len, text_between(path, 0, sys.maxsize)))  # a first pass counts the characters
    cut = int(n * WRITEUP_TRAIN_SHARE)
    return [("train", pieces(text_between(path, 0, cut))),
            ("val", pieces(text_between(path, cut, n)))]


def pieces(blocks):
    """The text of blocks in pieces of about PIECE_CHARS characters, each ending where LAST_CUT
    says: after a character other than whitespace, before a space or a newline. GPT-2's
    pre-tokenizer splits there anyway: none of its matches holds whitespace after anything else,
    and what it makes of either side does not depend on the other (its lookahead, (?!\\S), and its
    end of text, $, follow whitespace only, and the left side ends with none), so the tokens of the
    pieces, concatenated, are encode_ordinary's of the whole text (tested)."""
    text = ""
    for block in blocks:
        text += block
        if len(text) >= PIECE_CHARS and (cut := LAST_CUT.match(text)):
            yield text[:cut.end()]
            text = text[cut.end():]
    if text:
        yield text


# -------------------------------------------------- what prepare_wikipedia.py's settings name

def check_tokenizer():
    """Load tiktoken's GPT-2 BPE files, which it downloads on first use; without them, one line on
    working offline. Refuse a tiktoken too old to give encode_ordinary's tokens as an array."""
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as e:
        default_cache = os.path.join(tempfile.gettempdir(), "data-gym-cache")
        raise cli.UserError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); "
                            "HINT: tiktoken downloads its files on first use and caches them in "
                            f"$TIKTOKEN_CACHE_DIR (default {default_cache}); offline, set "
                            "TIKTOKEN_CACHE_DIR to a cache filled on a machine with a network "
                            "(see docs/data.md, Offline)")
    special = "<|endoftext|>"  # in a text, ordinary characters
    # encode_to_numpy came with tiktoken 0.9; before 0.11 it encoded a special token's text as the
    # token itself.
    if (not hasattr(encoding, "encode_to_numpy")
            or encoding.encode_to_numpy(special, disallowed_special=()).tolist()
            != encoding.encode_ordinary(special)):
        raise cli.UserError(f"tiktoken {tiktoken.__version__} is too old for prepare_wikipedia.py, "
                            "which needs 0.11 or later; HINT: pip install -U 'tiktoken>=0.11'")


def zip_source(args, datasets):
    """(the zip that prepare_wikipedia.py's args name, checked, and meta.json's source): the --zip,
    or the cache, or a download. datasets: the published zips, by --dataset name."""
    dataset = datasets[args.dataset]
    if args.sha256:
        expected = Expected(size=None, sha256=args.sha256, whose="given by --sha256")
    elif args.url and not args.dataset_given:
        # a zip this script knows nothing of: its sha256 is printed instead
        expected = Expected(size=None, sha256=None, whose="")
    else:  # a --zip is WikiText-103's unless --dataset says otherwise
        expected = Expected(size=dataset.size, sha256=dataset.sha256,
                            whose=f"the published sha256 of {dataset.file}")
    if args.zip:
        zip_path, origin = args.zip, {"sha256": given_zip_sha256(args.zip, expected, datasets)}
    else:
        zip_path = cache_path(args.out_dir, args.url, dataset)
        urls = [args.url] if args.url else list(dataset.urls)
        by_hand = command("--zip FILE", *zip_flags(args, dataset))
        unzipped = command("--input", *input_files(args), *input_flags(args))
        hint = f"download {urls[0]} by hand and run `{by_hand}`, or unzip it and run `{unzipped}`"
        origin = {**fetch_file(urls, zip_path, expected, args.retries, hint), "urls": urls}
    if expected.sha256 is None:
        print(f"sha256 of {zip_path}: {origin['sha256']} "
              f"(not checked; pass --sha256 {origin['sha256']} to insist on these bytes next time)")
    published = expected.sha256 == dataset.sha256  # the bytes are the dataset's published zip
    return zip_path, {"dataset": args.dataset if published else None, "zip": zip_path, **origin,
                      "expected_sha256": expected.sha256}


def command(*flags):
    """prepare_wikipedia.py's command line with flags (those None or empty left out), for a HINT."""
    return " ".join(["python prepare_wikipedia.py", *filter(None, flags)])


def zip_flags(args, dataset):
    """The flags that, with --zip, prepare what args ask for into the same --out_dir."""
    return [args.dataset_given and f"--dataset {args.dataset}",
            args.sha256 and f"--sha256 {args.sha256}",
            args.split == "writeup" and "--split=writeup", *token_flags(args),
            args.out_dir != dataset.out_dir and f"--out_dir {args.out_dir}"]


def input_flags(args):
    """The flags that, with --input and the zip's text files, prepare what args ask for: the same
    split, detokenized or not as args are, into the same --out_dir (always named: --input's default
    is another)."""
    writeup = args.split == "writeup"
    detokenize = "--detokenize" if args.detokenize else "--no-detokenize"
    return [writeup and "--split=writeup", *token_flags(args),
            args.detokenize != writeup and detokenize, f"--out_dir {args.out_dir}"]


def token_flags(args):
    """--train_tokens and --val_tokens, where args give counts other than the write-ups'."""
    counts = {"train_tokens": WRITEUP_TOKENS[0], "val_tokens": WRITEUP_TOKENS[1]}
    return [f"--{key} {getattr(args, key)}" for key, default in counts.items()
            if getattr(args, key) not in (None, default)]


def input_files(args):
    """The zip's files that --input takes: with --split=writeup, val follows train in
    wiki.train.raw."""
    return ["wiki.train.raw"] if args.split == "writeup" else ["wiki.train.raw", "wiki.valid.raw"]


def writeup_source(args, default_out_dir):
    """(the paths of the write-ups' files that prepare_wikipedia.py's args ask for: {"train", "val"}
    for --tokens, else {"text"}; meta.json's source; whether the files are the pinned ones). Their
    text is downloaded, or given with --input: another copy is used, with a warning."""
    out_dir = args.out_dir != default_out_dir and f"--out_dir {args.out_dir}"
    wikitext = command("--dataset=wikitext103 --split=writeup", f"--out_dir {args.out_dir}")
    wikitext = f"`{wikitext}` prepares WikiText-103 in their regime"
    source = {"dataset": "writeup", "commit": WRITEUP_COMMIT}
    if args.tokens:  # offline, the text's download would fail too: by hand, then
        by_hand = command("--dataset=writeup --input wikipedia.txt", out_dir)
        hint = (f"download {WRITEUP_FILES['wikipedia.txt'].urls[0]} by hand and run `{by_hand}`, "
                f"or {wikitext}")
        paths = {}
        for split in ("train", "val"):
            name = f"wikipedia_{split}.bin"
            paths[split], source[name] = writeup_file(name, args.out_dir, args.retries, hint)
        return paths, source, True
    if args.input:
        path, origin = args.input[0], {"sha256": data.sha256_of(args.input[0])}
        if starts_with_lfs_pointer(path):
            raise cli.UserError(f"{path} is a Git LFS pointer, not the text; HINT: `git lfs pull` "
                                "in your clone of yiphei/yif-AI, or drop --input to download it")
    else:
        hint = f"`{command('--tokens', out_dir)}` fetches their token files instead, or {wikitext}"
        path, origin = writeup_file("wikipedia.txt", args.out_dir, args.retries, hint)
    pinned = origin["sha256"] == WRITEUP_FILES["wikipedia.txt"].sha256
    if not pinned:
        print(f"warning: {path} is not the write-ups' wikipedia.txt (sha256 {origin['sha256']}): "
              "it is tokenized their way, but its tokens will not be theirs, and are not compared "
              "with theirs", file=sys.stderr)
    theirs = {name: WRITEUP_FILES[name].sha256
              for name in ("wikipedia_train.bin", "wikipedia_val.bin")}
    source.update({"text": path, **origin, "token_files_sha256": theirs if pinned else None})
    return {"text": path}, source, pinned


def copy_token_files(paths, temps):
    """Copy the token files paths["train"] and paths["val"] to temps["train.bin"] and
    temps["val.bin"]; return their stats for meta.json."""
    splits = {}
    for split, path in paths.items():
        temp = temps[f"{split}.bin"]
        with prepare_io.writing(temp):
            shutil.copyfile(path, temp)
        tokens = np.memmap(temp, dtype=np.uint16, mode="r")
        splits[split] = {"tokens": len(tokens), "max_token_id": int(tokens.max()),
                         "sha256": data.sha256_of(temp)}
    return splits


def check_readable(paths):
    """Refuse a --input or --val file that is missing or cannot be read: now, rather than as a
    write error of the .bin that reads it later."""
    for path in paths:
        if not os.path.isfile(path):
            raise cli.UserError(f"input file not found (or not a file): {path}; "
                                "HINT: check the path, or drop --input to download the data")
        try:
            open(path, "rb").close()
        except OSError as e:
            raise cli.UserError(f"cannot read {path}: {e.strerror.lower()}; HINT: check its "
                                "permissions, or leave it out")


def check_identical(sha256s, outcome):
    """Refuse tokens whose sha256s ({"train": ..., "val": ...}) are not those of the write-ups' own
    token files; outcome: what the refusal leaves, for its message."""
    for split, ours in sha256s.items():
        theirs = WRITEUP_FILES[f"wikipedia_{split}.bin"].sha256
        if ours != theirs:
            raise cli.UserError(f"{split}.bin differs from the write-ups' wikipedia_{split}.bin: "
                                f"sha256 {ours}, theirs {theirs}; {outcome}; HINT: --tokens "
                                "fetches their token files directly")


def given_zip_sha256(path, expected, datasets):
    """The sha256 of a --zip that passes the check; else a DownloadError that says what to do (the
    file is the user's: it is left where it is)."""
    if not os.path.isfile(path):
        raise DownloadError(f"zip not found: {path}; HINT: check the path, or drop --zip")
    # The sha256 checks the size too.
    problem, digest = examine_zip(path, expected._replace(size=None))
    if problem is None:
        return digest
    known = [name for name, d in datasets.items() if d.sha256 == digest]
    if known:
        hint = f"it is the published {datasets[known[0]].file}: add --dataset {known[0]}"
    elif digest != expected.sha256:
        hint = (f"if it is a zip of your own in WikiText's layout, "
                f"pass --sha256 {digest} to use it; "
                "if it should be the published one, download it again")
    else:  # the bytes expected, yet not WikiText's layout
        hint = ("give a zip that holds wiki.train.raw and wiki.valid.raw, "
                "or unzip yours and pass its files with --input")
    raise DownloadError(f"{path} {problem}; HINT: {hint}")

