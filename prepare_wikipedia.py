"""
Prepare Wikipedia text for train.py: GPT-2 BPE tokens as flat uint16 arrays (nanoGPT layout).

    python prepare_wikipedia.py                          # download WikiText-103 raw (192 MB zip), tokenize all
    python prepare_wikipedia.py --max_chars 178000000    # the seeds' size: 178 MB of text, about 40M train tokens
    python prepare_wikipedia.py --zip wikitext-103-raw-v1.zip              # a zip you downloaded by hand
    python prepare_wikipedia.py --input wiki.train.raw wiki.valid.raw      # local text files, no network
    TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache python prepare_wikipedia.py --input my.txt   # offline tokenizer

Writes to --out_dir (default data/wikipedia): train.bin, val.bin (read them with
np.memmap(path, dtype=np.uint16, mode='r')) and meta.json (vocab size, token and character
counts, sha256 of each .bin, source). The zip is kept there too and reused on the next run.

Documents: a WikiText article starts at a top-level heading line ` = Title = ` (section lines
` = = Section = = ` do not start one). Text without such headings is cut at the first blank line
after 1M characters, and every file ends a document. Blank documents are dropped. Each document
is followed by <|endoftext|> (50256), as in nanoGPT.

Split: the zip gives train = wiki.train.raw, val = wiki.valid.raw (wiki.test.raw is unused).
With --input, files whose name contains "valid" are the val split; if there are none, the last
--val_fraction of all documents (at least one) go to val. --max_chars caps the training text only:
it stops after the document that reaches the cap, so the last article is whole.

Every output is written under a temporary name and renamed when complete (meta.json last), so an
interrupted run never leaves a half file under a final name.
"""
import argparse
import contextlib
import datetime
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
import zipfile
from urllib.parse import urlparse

import numpy as np
import requests
import tiktoken

WIKITEXT_URLS = [
    "https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
    "https://huggingface.co/datasets/mattdangerw/wikitext-103-raw/resolve/main/wikitext-103-raw-v1.zip",
]
WIKITEXT_SIZE = 191_984_949  # bytes of wikitext-103-raw-v1.zip
WIKITEXT_MEMBERS = ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw")  # matched by basename
USER_AGENT = "wikipedia-prep/1.0 (research)"  # the WikiText host refuses some default user agents
RETRY_WAIT_S = 2.0  # first wait between download attempts; doubles each time
HEADING = re.compile(r"\s*= [^=].* =\s*")  # fullmatch: " = Title = " yes, " = = Section = = " no
MAX_DOC_CHARS = 1_000_000  # bounds memory on text without headings
BATCH_CHARS = 1_000_000  # characters per task sent to a tokenizer process


class PrepareError(Exception):
    """A failure the user can fix; main prints its message (no traceback) and exits with 1."""


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

def download(url, part, expected_size=None, retries=5, timeout=(10, 60)):
    """Stream url into the file part, resuming from its current size with an HTTP Range request."""
    last_error = "no attempt made"
    for attempt in range(retries):
        if attempt:
            time.sleep(RETRY_WAIT_S * 2 ** (attempt - 1))
        done = os.path.getsize(part) if os.path.exists(part) else 0
        if expected_size and done == expected_size:
            return  # complete already: a previous run stopped before the rename
        # identity encoding, so byte counts and ranges refer to the file itself
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if done:
            headers["Range"] = f"bytes={done}-"
        try:
            with requests.get(url, headers=headers, stream=True, timeout=timeout) as response:
                if response.status_code == 416:  # our .part is longer than the server's file
                    os.remove(part)
                    last_error = "server rejected the resume range"
                    continue
                if 400 <= response.status_code < 500:  # retrying will not help
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
                        progress.show(f"{urlparse(url).netloc}: {done / 1e6:.1f} MB{percent}, {mb_s:.1f} MB/s")
            if total is None or done == total:
                return
            last_error = f"connection closed after {done:,} of {total:,} bytes"
        except requests.RequestException as e:
            last_error = str(e)
    raise PrepareError(f"gave up after {retries} attempts: {last_error}")


def check_zip(path, expected_size=None, delete_if_bad=True):
    """Raise PrepareError unless path is a zip holding the three WikiText files."""
    size = os.path.getsize(path)
    problem = None
    if expected_size and size != expected_size:
        problem = f"has {size:,} bytes, expected {expected_size:,}"
    else:
        try:
            with zipfile.ZipFile(path) as zf:
                names = {os.path.basename(name) for name in zf.namelist()}
            missing = [m for m in WIKITEXT_MEMBERS if m not in names]
            if missing:
                problem = f"lacks {', '.join(missing)}"
        except zipfile.BadZipFile as e:
            problem = f"is not a valid zip ({e})"
    if problem:
        if delete_if_bad:  # so the next run starts the download from scratch
            os.remove(path)
            problem += "; deleted it"
        raise PrepareError(f"{path} {problem}")


def fetch_zip(urls, path, expected_size, retries):
    """Return path holding a verified zip, downloaded from the first of urls that works."""
    if os.path.exists(path):
        with contextlib.suppress(PrepareError):  # a bad cached zip is deleted and fetched again
            check_zip(path, expected_size)
            print(f"using {path} (already downloaded)")
            return path
    failures = []
    for url in urls:
        try:
            download(url, path + ".part", expected_size, retries)
            check_zip(path + ".part", expected_size)
            os.replace(path + ".part", path)
            return path
        except PrepareError as e:
            failures.append(f"{url}: {e}")
    raise PrepareError(
        "could not download the data:\n  " + "\n  ".join(failures) + "\n"
        f"HINT: download {urls[0]} by hand and run `python prepare_wikipedia.py --zip FILE`, "
        "or unzip it and run `python prepare_wikipedia.py --input wiki.train.raw wiki.valid.raw`")


# --------------------------------------------------------------------------- documents

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
    """Documents of several text files in order; undecodable bytes become U+FFFD."""
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from read_documents(f)


def zip_documents(zip_path, member):
    """Documents of one wiki.*.raw file, decompressed as it is read."""
    with zipfile.ZipFile(zip_path) as zf:
        name = next(n for n in zf.namelist() if os.path.basename(n) == member)
        with zf.open(name) as raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as f:
            yield from read_documents(f)


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


# --------------------------------------------------------------------------- tokenize and write

def encode_batch(docs):
    """Worker: tokens of the documents, each followed by <|endoftext|>, plus their text sizes."""
    enc = tiktoken.get_encoding("gpt2")  # tiktoken caches it, so this loads once per process
    ids = []
    for doc in docs:
        ids.extend(enc.encode_ordinary(doc))
        ids.append(enc.eot_token)
    tokens = np.array(ids, dtype=np.uint32)
    assert tokens.max() < 2**16, "GPT-2 token ids must fit in uint16"
    n_bytes = sum(len(doc.encode("utf-8")) for doc in docs)
    return tokens.astype(np.uint16), len(docs), sum(len(doc) for doc in docs), n_bytes


def write_split(docs, path, imap, name):
    """Tokenize docs (in order) and stream the tokens to path, hashing them as they go."""
    stats = {"tokens": 0, "documents": 0, "chars": 0, "bytes": 0}
    sha = hashlib.sha256()
    with open(path, "wb") as f, Progress() as progress:
        for tokens, n_docs, n_chars, n_bytes in imap(encode_batch, batches(docs)):
            buf = tokens.tobytes()
            f.write(buf)
            sha.update(buf)
            stats["tokens"] += len(tokens)
            stats["documents"] += n_docs
            stats["chars"] += n_chars
            stats["bytes"] += n_bytes
            mb, seconds = stats["bytes"] / 1e6, max(time.time() - progress.t0, 1e-9)
            progress.show(f"{name}: {mb:.1f} MB of text, {stats['tokens'] / 1e6:.2f}M tokens, "
                          f"{mb / seconds:.1f} MB/s")
    if stats["documents"] == 0:
        raise PrepareError(f"the {name} split has no text; HINT: give more text, or a file *valid* for val")
    stats["sha256"] = sha.hexdigest()
    return stats


def input_splits(paths, val_fraction):
    """(train docs, val docs) from local files: *valid* files are val, else the last documents."""
    for path in paths:
        if not os.path.isfile(path):
            raise PrepareError(f"input file not found (or not a file): {path}; "
                               "HINT: check the path, or drop --input to download WikiText-103")
    val_paths = [p for p in paths if "valid" in os.path.basename(p)]
    if val_paths:
        return file_documents([p for p in paths if p not in val_paths]), file_documents(val_paths)
    n_docs = sum(1 for _ in file_documents(paths))  # a first pass finds where the last documents begin
    if n_docs < 2:
        raise PrepareError(f"found {n_docs} document(s) in {' '.join(paths)}, need 2 or more to hold some "
                           "out for val; HINT: start articles with ` = Title = ` lines, or add a file *valid*")
    n_train = n_docs - max(1, round(n_docs * val_fraction))
    docs = file_documents(paths)
    train_docs = itertools.islice(docs, n_train)
    return train_docs, rest_after(train_docs, docs)


def rest_after(head, docs):
    """Val continues the same read, past the train documents that --max_chars left unread."""
    for _ in head:
        pass
    yield from docs


def prepare(train_docs, val_docs, out_dir, num_proc, source, max_chars, t0):
    """Write train.bin, val.bin and meta.json into out_dir, each under a temporary name first."""
    finals = {name: os.path.join(out_dir, name) for name in ("train.bin", "val.bin", "meta.json")}
    temps = {name: path + ".tmp" for name, path in finals.items()}
    try:
        with multiprocessing.Pool(num_proc) if num_proc > 1 else contextlib.nullcontext() as pool:
            imap = pool.imap if pool else map  # imap keeps the order and reads input as workers free up
            train_docs = cap_chars(train_docs, max_chars)
            splits = {"train": write_split(train_docs, temps["train.bin"], imap, "train"),
                      "val": write_split(val_docs, temps["val.bin"], imap, "val")}
        meta = {"tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256, "dtype": "uint16",
                "source": source, "max_chars": max_chars, **splits,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        with open(temps["meta.json"], "w") as f:
            json.dump(meta, f, indent=2)
        with contextlib.suppress(FileNotFoundError):
            os.remove(finals["meta.json"])  # meta.json is renamed last, so its presence marks a complete set
        for name in ("train.bin", "val.bin", "meta.json"):
            os.replace(temps[name], finals[name])
    finally:
        for path in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    seconds = time.time() - t0
    mb = sum(s["bytes"] for s in splits.values()) / 1e6
    tokens = sum(s["tokens"] for s in splits.values())
    for name, s in splits.items():
        print(f"{name}: {s['tokens']:,} tokens, {s['chars']:,} chars, {s['documents']:,} documents "
              f"-> {finals[name + '.bin']}")
    print(f"done in {seconds:.1f} s: {mb:.1f} MB of text at {mb / seconds:.1f} MB/s, "
          f"{tokens / seconds / 1e6:.2f}M tokens/s")
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", help="local text files to use instead of the download")
    parser.add_argument("--zip", help="a WikiText-103 raw zip already on disk")
    parser.add_argument("--url", help="download the zip from here (size checked only if the server sends one)")
    parser.add_argument("--out_dir", default="data/wikipedia", help="gets train.bin, val.bin, meta.json and the zip")
    parser.add_argument("--max_chars", type=int, help="cap on the training text; 178000000 = the seeds' size")
    parser.add_argument("--val_fraction", type=float, default=0.005,
                        help="with --input and no *valid* file: share of documents, taken from the end, for val")
    parser.add_argument("--num_proc", type=int, default=os.cpu_count(), help="tokenizer processes")
    parser.add_argument("--retries", type=int, default=5, help="download attempts per URL")
    args = parser.parse_args(argv)
    if not 0 < args.val_fraction < 1:
        parser.error("--val_fraction must be between 0 and 1")
    try:
        try:
            os.makedirs(args.out_dir, exist_ok=True)
            with tempfile.TemporaryFile(dir=args.out_dir):
                pass
        except OSError as e:
            raise PrepareError(f"cannot write to {args.out_dir} ({e}); HINT: pass --out_dir DIR somewhere writable")
        try:
            tiktoken.get_encoding("gpt2")  # fail before a long download, not after it
        except Exception as e:
            raise PrepareError(f"cannot load the GPT-2 tokenizer ({e}); HINT: tiktoken downloads it once; offline, "
                               "point TIKTOKEN_CACHE_DIR at a filled cache, e.g. ../shared/tiktoken_cache")
        t0 = time.time()
        if args.input:
            source = args.input
            train_docs, val_docs = input_splits(args.input, args.val_fraction)
        else:
            if args.zip:
                if not os.path.isfile(args.zip):
                    raise PrepareError(f"zip not found: {args.zip}; HINT: check the path, or drop --zip")
                check_zip(args.zip, delete_if_bad=False)
                zip_path = source = args.zip
            else:
                urls = [args.url] if args.url else WIKITEXT_URLS
                name = os.path.basename(urlparse(urls[0]).path) or "download.zip"
                expected_size = None if args.url else WIKITEXT_SIZE
                zip_path = fetch_zip(urls, os.path.join(args.out_dir, name), expected_size, args.retries)
                source = {"zip": zip_path, "urls": urls}
                t0 = time.time()  # the summary's speed is that of the text work, not of the download
            train_docs = zip_documents(zip_path, "wiki.train.raw")
            val_docs = zip_documents(zip_path, "wiki.valid.raw")
        return prepare(train_docs, val_docs, args.out_dir, args.num_proc, source, args.max_chars, t0)
    except PrepareError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted: no output written under the final names")


if __name__ == "__main__":
    main()
