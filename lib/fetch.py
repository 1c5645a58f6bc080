"""
What prepare_wikipedia.py fetches: the zip, whose size and sha256 are checked before any of it is read, and tiktoken's
GPT-2 files, checked before a long download. A download resumes its .part with an HTTP Range request and records
its origin (the URL after redirects, and the sha256); a cached zip that fails is renamed *.bad, never deleted; the
cache is keyed by URL; retries, backoff and Retry-After are urllib3's. A reader of the tutorial may skip this file.
"""
import collections
import contextlib
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
import zipfile
from urllib.parse import urlparse

import requests
import tiktoken
import urllib3
from requests.adapters import HTTPAdapter

from lib import cli, data, prepare_io

WIKITEXT_MEMBERS = ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw")  # matched by basename
USER_AGENT = "wikipedia-prep/1.0 (research)"  # the WikiText host refuses some default user agents
RETRY_STATUSES = (429, 500, 502, 503, 504)  # answers worth another attempt; another 4xx would come again
BACKOFF_S = 1.0  # urllib3 waits 0, 2, 4, 8 ... s between attempts, or what the server's Retry-After asks


class DownloadError(cli.UserError):
    """A zip that cannot be had or is not the one expected; cli.main prints its message and exits with 1."""


def request_problem(error, host):
    """(the cause of a failed request as a phrase, whether another attempt may mend it)."""
    causes = [error]  # requests wraps urllib3's error, which wraps the socket's
    while causes[-1].__cause__ or causes[-1].__context__:
        causes.append(causes[-1].__cause__ or causes[-1].__context__)
    if any(isinstance(cause, socket.gaierror) for cause in causes):
        return f"cannot resolve the host name {host} ({causes[-1]}): offline, or a wrong name", False
    if any(isinstance(cause, (urllib3.exceptions.SSLError, requests.exceptions.SSLError)) for cause in causes):
        return f"SSL error ({causes[-1]})", False
    return f"{type(causes[-1]).__name__}: {causes[-1]}", True  # timeouts, refused or dropped connections


class Retry(urllib3.util.Retry):
    """urllib3's retries (backoff, the statuses worth another attempt, Retry-After), printing each failed
    attempt, and none for what would fail the same way again: an unknown host name, a failed TLS handshake."""

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None):
        problem, may_pass = request_problem(error, _pool.host) if error else (f"HTTP {response.status}", True)
        attempt, retry = len(self.history) + 1, None
        with contextlib.suppress(urllib3.exceptions.MaxRetryError):  # none left: retry stays None
            retry = super().increment(method, url, response, error, _pool, _stacktrace) if may_pass else None
        wait = retry and ((response and retry.get_retry_after(response)) or retry.get_backoff_time())
        next_step = f"retrying in {wait:g} s" if retry else "giving up" if may_pass else "a retry cannot help"
        print(f"{_pool.host}: attempt {attempt}/{attempt + self.total} failed: {problem}; {next_step}", file=sys.stderr)
        if retry is None:
            raise urllib3.exceptions.MaxRetryError(_pool, url, error) from error
        return retry


def http_session(attempts):
    """The one session of the downloads: urllib3 makes up to `attempts` requests per URL."""
    session = requests.Session()
    retry = Retry(total=attempts - 1, status_forcelist=RETRY_STATUSES, backoff_factor=BACKOFF_S, raise_on_status=False)
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=retry))
    # identity encoding, so that byte counts and ranges refer to the file itself
    session.headers.update({"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
    return session


def download(session, url, part, expected_size, attempts):
    """Stream url into the file part, resuming from its current size with an HTTP Range request; return the
    URL the bytes came from, after redirects (None if part was complete already). The session retries a
    request until its body starts; a body cut half-way is resumed here, up to `attempts` times."""
    host = urlparse(url).netloc
    print(f"downloading {url}", file=sys.stderr)
    for _ in range(attempts):
        done = os.path.getsize(part) if os.path.exists(part) else 0
        if expected_size and done == expected_size:
            return None  # complete already: a previous run stopped before the rename
        try:
            response = session.get(url, headers={"Range": f"bytes={done}-"} if done else None, stream=True,
                                   timeout=(10, 60))  # to connect, and between two reads
        except requests.RequestException as e:
            problem, may_pass = request_problem(e, urlparse(url).hostname)
            raise DownloadError(f"gave up after {attempts} attempts: {problem}" if may_pass else problem) from None
        with response:
            if response.url != url:
                print(f"{host}: redirected to {response.url}", file=sys.stderr)
            if response.status_code == 416:  # our .part is longer than the server's file: start over
                os.remove(part)
                problem = "the server refused to resume the download"
                continue
            if not response.ok:
                gave_up = f"gave up after {attempts} attempts: " if response.status_code in RETRY_STATUSES else ""
                raise DownloadError(f"{gave_up}HTTP {response.status_code} {response.reason}")
            if response.status_code == 200:
                done = 0  # the server ignored Range and sends the whole file
            length, start = response.headers.get("Content-Length"), done
            total = done + int(length) if length else expected_size
            if expected_size and total != expected_size:
                raise DownloadError(f"server offers {total:,} bytes, expected {expected_size:,}")
            with open(part, "ab" if done else "wb") as f, prepare_io.Progress() as progress:
                with contextlib.suppress(requests.RequestException):  # a dropped connection: resumed below
                    for chunk in response.iter_content(chunk_size=1 << 16):
                        done += f.write(chunk)
                        percent = f" {100 * done / total:5.1f}%" if total else ""
                        mb_s = (done - start) / 1e6 / max(time.time() - progress.t0, 1e-9)
                        progress.show(f"{host}: {done / 1e6:.1f} MB{percent}, {mb_s:.1f} MB/s")
        if total is None or done == total:
            return response.url
        problem = f"connection closed after {done:,} of {total:,} bytes"
        print(f"{host}: {problem}; resuming", file=sys.stderr)
    raise DownloadError(f"gave up after {attempts} attempts: {problem}")


# what a zip must be (None: not checked); whose: where the sha256 comes from, for messages
Expected = collections.namedtuple("Expected", "size sha256 whose")


def examine_zip(path, expected):
    """(what is wrong with the zip at path as a phrase, or None; its SHA-256, None when its size is wrong)."""
    size = os.path.getsize(path)
    if expected.size is not None and size != expected.size:
        return f"has {size:,} bytes, expected {expected.size:,}", None
    digest = data.sha256_of(path)
    if expected.sha256 is not None and digest != expected.sha256:
        return f"has sha256 {digest}, not {expected.sha256}, {expected.whose}", digest
    try:
        with zipfile.ZipFile(path) as zf:
            missing = [m for m in WIKITEXT_MEMBERS if m not in {os.path.basename(n) for n in zf.namelist()}]
    except zipfile.BadZipFile as e:
        return f"is not a valid zip ({e})", digest
    return (f"lacks {', '.join(missing)}" if missing else None), digest


def cache_path(out_dir, url, dataset):
    """Where a download is kept: the dataset's file name for its own URLs (which serve one file); for a --url,
    its file name and a hash of the URL, so that two URLs never share a cache."""
    if url is None:
        return os.path.join(out_dir, dataset.file)
    stem, ext = os.path.splitext(os.path.basename(urlparse(url).path) or "download.zip")
    return os.path.join(out_dir, f"{stem}-{hashlib.sha256(url.encode()).hexdigest()[:8]}{ext}")


def fetch_zip(urls, path, expected, attempts, hint):
    """Make path hold a zip that passes the check, kept from an earlier run or downloaded from the first of
    urls that gives one; return its origin: the URL its bytes came from, and their sha256."""
    if os.path.exists(path):
        try:
            with open(path + ".origin.json") as f:
                origin = json.load(f)
        except (OSError, ValueError):
            origin = {"url": None, "sha256": None}  # a zip put there by hand
        if expected.sha256 is None:  # a --url without --sha256: the sha256 recorded at the download, if any
            expected = expected._replace(sha256=origin["sha256"], whose="the one recorded when it was downloaded")
        problem, digest = examine_zip(path, expected)
        if problem is None and expected.sha256 is None:
            problem = f"has no record of its download in {path}.origin.json, so its bytes cannot be checked"
        if problem is None:
            print(f"using {path} (already downloaded from {origin['url'] or 'an unrecorded URL'}; sha256 {digest})")
            return {"url": origin["url"], "sha256": digest}
        bad, n = path + ".bad", 0
        while os.path.exists(bad):  # never over an earlier one
            n += 1
            bad = f"{path}.bad.{n}"
        with prepare_io.writing(path):
            os.replace(path, bad)  # not deleted: the user may have put it there
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + ".origin.json")  # it described the file moved aside
        print(f"warning: {path} {problem}: not used; renamed it to {bad}; downloading again", file=sys.stderr)
    failures, part = [], path + ".part"
    # a failed write is not the server's fault: it ends the run (the next one resumes) rather than trying another URL
    with http_session(attempts) as session, prepare_io.writing(part, after_failure="the next run resumes the download"):
        for url in urls:
            try:
                final_url = download(session, url, part, expected.size, attempts)
                problem, digest = examine_zip(part, expected)
                if problem:
                    os.remove(part)  # maybe resumed onto another source's bytes: the next run starts over
                    raise DownloadError(f"{part} {problem}; deleted it")
            except DownloadError as e:
                failures.append(f"{url}: {e}")
                continue
            origin = {"url": final_url, "sha256": digest}  # recorded first: a zip without its record is not trusted
            cli.write_atomically(path + ".origin.json", lambda f: f.write(json.dumps(origin).encode()))
            os.replace(part, path)
            return origin
    raise DownloadError(f"could not download the data: {'; '.join(failures)}; HINT: {hint}")


def check_tokenizer():
    """Load tiktoken's GPT-2 BPE files, which it downloads on first use; without them, one line on working offline.
    Refuse a tiktoken too old to give encode_ordinary's tokens as an array."""
    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise cli.UserError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); HINT: tiktoken downloads its "
                            "files on first use and caches them in $TIKTOKEN_CACHE_DIR (default "
                            f"{os.path.join(tempfile.gettempdir(), 'data-gym-cache')}); offline, set "
                            "TIKTOKEN_CACHE_DIR to a cache filled on a machine with a network "
                            "(see docs/data.md, Offline)")
    special = "<|endoftext|>"  # in a text, ordinary characters
    # encode_to_numpy came with tiktoken 0.9; before 0.11 it encoded a special token's text as the token itself
    if (not hasattr(encoding, "encode_to_numpy")
            or encoding.encode_to_numpy(special, disallowed_special=()).tolist() != encoding.encode_ordinary(special)):
        raise cli.UserError(f"tiktoken {tiktoken.__version__} is too old for prepare_wikipedia.py, which needs 0.11 or "
                            "later; HINT: pip install -U 'tiktoken>=0.11'")


def zip_source(args, datasets):
    """(the zip that prepare_wikipedia.py's args name, checked, and meta.json's source): the --zip, or the cache,
    or a download. datasets: the published zips, by --dataset name."""
    dataset = datasets[args.dataset]
    if args.sha256:
        expected = Expected(size=None, sha256=args.sha256, whose="given by --sha256")
    elif args.url and not args.dataset_given:  # a zip this script knows nothing of: its sha256 is printed instead
        expected = Expected(size=None, sha256=None, whose="")
    else:  # a --zip is WikiText-103's unless --dataset says otherwise
        expected = Expected(size=dataset.size, sha256=dataset.sha256, whose=f"the published sha256 of {dataset.file}")
    if args.zip:
        zip_path, origin = args.zip, {"sha256": given_zip_sha256(args.zip, expected, datasets)}
    else:
        zip_path, urls = cache_path(args.out_dir, args.url, dataset), [args.url] if args.url else list(dataset.urls)
        flags = "".join(f" --{flag} {value}" for flag, value in [("dataset", args.dataset_given and args.dataset),
                                                                   ("sha256", args.sha256)] if value)
        hint = (f"download {urls[0]} by hand and run `python prepare_wikipedia.py{flags} --zip FILE`, or unzip it and "
                "run `python prepare_wikipedia.py --input wiki.train.raw wiki.valid.raw`")
        origin = {**fetch_zip(urls, zip_path, expected, args.retries, hint), "urls": urls}
    if expected.sha256 is None:
        print(f"sha256 of {zip_path}: {origin['sha256']} (not checked; pass --sha256 {origin['sha256']} to insist "
              "on these bytes next time)")
    published = expected.sha256 == dataset.sha256  # the bytes are the dataset's published zip
    return zip_path, {"dataset": args.dataset if published else None, "zip": zip_path, **origin,
                      "expected_sha256": expected.sha256}


def given_zip_sha256(path, expected, datasets):
    """The sha256 of a --zip that passes the check; else a DownloadError that says what to do (the file is the
    user's: it is left where it is)."""
    if not os.path.isfile(path):
        raise DownloadError(f"zip not found: {path}; HINT: check the path, or drop --zip")
    problem, digest = examine_zip(path, expected._replace(size=None))  # the sha256 checks the size too
    if problem is None:
        return digest
    known = [name for name, d in datasets.items() if d.sha256 == digest]
    if known:
        hint = f"it is the published {datasets[known[0]].file}: add --dataset {known[0]}"
    elif digest != expected.sha256:
        hint = (f"if it is a zip of your own in WikiText's layout, pass --sha256 {digest} to use it; "
                "if it should be the published one, download it again")
    else:  # the bytes expected, yet not WikiText's layout
        hint = "give a zip that holds wiki.train.raw and wiki.valid.raw, or unzip yours and pass its files with --input"
    raise DownloadError(f"{path} {problem}; HINT: {hint}")

