"""
Prepare Wikipedia text for train.py: GPT-2 BPE tokens as flat uint16 arrays (nanoGPT layout).

    python prepare_wikipedia.py                          # download WikiText-103 raw (192 MB zip), tokenize all
    python prepare_wikipedia.py --dataset wikitext2      # WikiText-2 raw (4.7 MB), for a first run on a CPU
    python prepare_wikipedia.py --split=writeup --out_dir data/writeup    # the write-ups' regime
    python prepare_wikipedia.py --zip wikitext-103-raw-v1.zip              # a zip you downloaded by hand
    python prepare_wikipedia.py --input wiki.train.raw wiki.valid.raw      # local text files, no network
    python prepare_wikipedia.py --input notes.txt --val held_out.txt       # your own text, val named

It writes train.bin and val.bin (read them with np.memmap(path, dtype=np.uint16, mode='r')) and meta.json to
--out_dir (data/wikipedia; data/wikitext2 for --dataset wikitext2), and keeps the zip there for the next run.
--split=writeup takes the token counts of the write-ups (Future Attention and the Auto-regressive Encoder-Decoder
Transformer, GitHub yiphei/yif-AI). docs/data.md says what is checked, how the text is cut into documents and
splits, how the files are written, and how to work offline (tiktoken's GPT-2 files in $TIKTOKEN_CACHE_DIR).
"""
import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import io
import itertools
import json
import os
import re
import signal
import sys
import tempfile
import time
import zipfile

import numpy as np
import tiktoken

import configurator
from lib import cli, data, fetch, prepare_io


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
    "wikitext103": Dataset(  # the default: 103M words of Wikipedia, about 118M GPT-2 tokens of training text
        file="wikitext-103-raw-v1.zip",
        urls=("https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
              "https://huggingface.co/datasets/mattdangerw/wikitext-103-raw/resolve/main/wikitext-103-raw-v1.zip"),
        size=191_984_949, sha256="91c00ae287f0d699e18605c84afc9e45c192bc6b7797ff8837e5474655a33794",
        out_dir="data/wikipedia", detokenize=False),
    "wikitext2": Dataset(  # for a first run on a CPU; detokenized, so that a tiny model's samples read as text
        file="wikitext-2-raw-v1.zip",
        urls=("https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
              "https://huggingface.co/datasets/ggml-org/ci/resolve/main/wikitext-2-raw-v1.zip"),
        size=4_721_645, sha256="ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
        out_dir="data/wikitext2", detokenize=True),
}
DEFAULT_DATASET = "wikitext103"
HEADING = re.compile(r"\s*= [^=].* =\s*")  # fullmatch: " = Title = " yes, " = = Section = = " no
MAX_DOC_CHARS = 1_000_000  # bounds memory on text without headings
READ_AHEAD_CHARS = 1_000_000  # characters read ahead of the tokens written: all memory holds, whatever the text
OUTPUTS = ("train.bin", "val.bin", "meta.json")  # meta.json last: its presence marks a complete set
NOTHING_REPLACED = "no output written under the final names"  # what an interrupted or failed run leaves
WRITEUP_TRAIN_TOKENS = 38_276_830  # the write-ups' training text, in GPT-2 tokens
WRITEUP_VAL_TOKENS = 4_341_780  # their val text, which followed the training text
_run = configurator.read_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "config/future50_mse.py"))
WRITEUP_RUN_TOKENS = _run["max_iters"] * _run["batch_size"] * _run["gradient_accumulation_steps"] * _run["block_size"]
# train.py estimates the val loss on random windows of val.bin: fewer tokens overlap, fewer documents are few topics
MIN_VAL_TOKENS, MIN_VAL_DOCUMENTS = 100_000, 10


# --------------------------------------------------------------------------- documents

def text_lines(f, name):
    """Lines of the binary file f decoded as UTF-8, newlines as text mode reads them (\\r\\n, \\r -> \\n), a
    quarter MB of whole lines read at a time; a byte that is not UTF-8 text (a NUL too) is refused with its offset."""
    offset = 0  # bytes of f before this block
    while lines := f.readlines(2**18):
        block = b"".join(lines)
        yield from io.StringIO(prepare_io.utf8_text(block, offset, name), newline=None)  # splits at a lone \r too
        offset += len(block)


def read_documents(lines):
    """Yield documents from text lines: a new one starts at each top-level ' = Title = ' heading."""
    doc, size = [], 0
    for line in itertools.chain(lines, [None]):  # None: the end, which ends the last document
        # a heading starts a document; past MAX_DOC_CHARS, so does the line after a blank one
        if doc and (line is None or HEADING.fullmatch(line) or (size >= MAX_DOC_CHARS and doc[-1].isspace())):
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


def detokenize(text):
    """WikiText's tokenized text back to ordinary text, line by line; for example

         = Robert Boulter =                                 Robert Boulter
         = = Early life = =                             ->  Early life
         He had a guest @-@ starring role ( 2000 ) .        He had a guest-starring role (2000).
         The show 's 1 @,@ 000 " best " of 3 @.@ 5 , and    The show's 1,000 "best" of 3.5, and

    Each rule asks for WikiText's pattern, a space on both sides of a mark and at both ends of a line, so
    ordinary prose and code pass unchanged; text that spaces its own marks that way (French `Attention !`,
    C's `a ? b : c`) would be changed: leave --detokenize off for it.
    """
    text = re.sub(r"^ (?:= )+(.*?)(?: =)+ $", r"\1", text, flags=re.M)  # headings, any level
    text = re.sub(r"^ (?:(\S.*) )?$", r"\1", text, flags=re.M)  # the space at both ends of a line
    text = re.sub(r" @([-,.])@ ", r"\1", text)  # inside words and numbers: guest-starring, 1,000, 3.5
    # each lookbehind comes after its literal, which the regex engine finds quickly: (?<!\S)\( is slow
    text = re.sub(r'" (?<!\S" )([^"\n]*?) "(?!\S)', r'"\1"', text)  # a pair of double quotes
    text = re.sub(r" '(s|t|re|ve|ll|d|m)\b", r"'\1", text)  # clitics: it's, don't, they're
    text = re.sub(r" '(?<=s ')(?= )", "'", text)  # plural possessive: the players' union
    text = re.sub(r"\( (?<!\S\( )", "(", text)  # no space after an opening parenthesis
    return re.sub(r" ([,.;:!?)])(?=\s|$)", r"\1", text)  # no space before punctuation


# --------------------------------------------------------------------------- tokenize and write

def groups(docs, detokenize_first, group_chars):
    """The documents (detokenized if asked) in lists of about group_chars characters: one task of a tokenizer
    thread each, for fewer hand-overs between threads than a task per document."""
    group, size = [], 0
    for doc in docs:
        group.append(detokenize(doc) if detokenize_first else doc)
        size += len(group[-1])
        if size >= group_chars:
            yield group
            group, size = [], 0
    if group:
        yield group


def encoded_documents(docs, num_threads, detokenize_first):
    """(tokens, chars, bytes) of each document, in order, its tokens ending with <|endoftext|>. tiktoken encodes
    them on num_threads threads (its Rust encoder releases the GIL) while this thread reads the documents ahead,
    up to READ_AHEAD_CHARS characters, and writes those behind."""
    enc = tiktoken.get_encoding("gpt2")
    assert enc.max_token_value < 2**16  # 50,257 token ids: uint16 holds them
    eot = np.array([enc.eot_token])

    def encode(texts):  # on a tokenizer thread; encode_to_numpy, with no special token allowed or refused, gives
        # encode_ordinary's ids as an array, not a Python int per token to convert back: a fifth less time
        return [np.concatenate((enc.encode_to_numpy(text, disallowed_special=()), eot), dtype=np.uint16,
                               casting="unsafe") for text in texts]  # uint32 to uint16: the ids fit, as asserted

    in_flight, chars = collections.deque(), 0  # (texts, their tokens to come), oldest first
    pool = concurrent.futures.ThreadPoolExecutor(num_threads)
    try:  # 4 groups a thread in flight: each thread has the next at hand while this one writes
        for texts in itertools.chain(groups(docs, detokenize_first, READ_AHEAD_CHARS // (4 * num_threads)), [None]):
            if texts is not None:  # None: the end, which empties in_flight
                in_flight.append((texts, pool.submit(encode, texts)))
                chars += sum(map(len, texts))
            while in_flight and (texts is None or chars >= READ_AHEAD_CHARS):
                done, tokens = in_flight.popleft()
                chars -= sum(map(len, done))
                for text, ids in zip(done, tokens.result()):
                    yield ids, len(text), len(text.encode())
    finally:  # at the end, or as the run stops: the groups not yet begun are dropped
        pool.shutdown(cancel_futures=True)


def write_split(encoded, path, name, tokens_asked=None):
    """Stream encoded documents into path; return (stats, left over). With tokens_asked it stops at the document
    boundary nearest that count (at least one document): a document that would overshoot by more than stopping
    before it undershoots is left over, returned unwritten."""
    stats = {"tokens": 0, "tokens_asked": tokens_asked, "documents": 0, "chars": 0, "bytes": 0, "max_token_id": 0}
    left_over = []
    with prepare_io.writing(path, after_failure=NOTHING_REPLACED):
        with open(path, "wb") as f, prepare_io.Progress() as progress:
            for tokens, n_chars, n_bytes in encoded:
                if tokens_asked and stats["documents"]:
                    undershoot = tokens_asked - stats["tokens"]  # > 0: the loop stops once the count is reached
                    if stats["tokens"] + len(tokens) - tokens_asked > undershoot:
                        left_over.append((tokens, n_chars, n_bytes))
                        break
                f.write(tokens)
                stats.update(tokens=stats["tokens"] + len(tokens), documents=stats["documents"] + 1,
                             chars=stats["chars"] + n_chars, bytes=stats["bytes"] + n_bytes,
                             max_token_id=max(stats["max_token_id"], int(tokens.max())))
                mb, of_asked = stats["bytes"] / 1e6, f" of {tokens_asked / 1e6:.2f}M" if tokens_asked else ""
                progress.show(f"{name}: {mb:.1f} MB of text, {stats['tokens'] / 1e6:.2f}M{of_asked} tokens, "
                              f"{mb / max(time.time() - progress.t0, 1e-9):.1f} MB/s")
                if tokens_asked and stats["tokens"] >= tokens_asked:
                    break
        stats["sha256"] = data.sha256_of(path)  # of the bytes on disk, read back
    return stats, left_over


def write_splits(train_docs, val_docs, temps, num_threads, detokenize_first, train_tokens, val_tokens):
    """Tokenize and write both splits; val_docs None means val is the text that follows train."""
    train_encoded = encoded_documents(train_docs, num_threads, detokenize_first)
    train, left_over = write_split(train_encoded, temps["train.bin"], "train", train_tokens)
    if train["documents"] == 0:
        raise cli.UserError("the train split has no text; HINT: give more text")
    val_encoded = (itertools.chain(left_over, train_encoded) if val_docs is None  # the same read goes on
                   else encoded_documents(val_docs, num_threads, detokenize_first))
    val, val_left_over = write_split(val_encoded, temps["val.bin"], "val", val_tokens)
    if val_docs is None and val["documents"] == 0:
        raise cli.UserError(f"the text ran out: train took {train['tokens']:,} tokens ({train_tokens:,} asked) and "
                            "left nothing for val; HINT: give more text, or lower --train_tokens")
    if val["documents"] == 0:
        raise cli.UserError("the val split has no text; HINT: give more text, or name val files with --val")
    if val_docs is None and val["tokens"] < val_tokens and not val_left_over:  # short, and nothing read past it
        print(f"warning: the text ran out: val has {val['tokens']:,} of the {val_tokens:,} tokens asked "
              f"(train has {train['tokens']:,} of {train_tokens:,})", file=sys.stderr)
    return {"train": train, "val": val}


def prepare(train_docs, val_docs, args, source, t0):
    """Write train.bin, val.bin and meta.json into args.out_dir, each under a temporary name first; meta.json
    records the settings of args and the text's source."""
    finals = {name: os.path.join(args.out_dir, name) for name in OUTPUTS}
    temps = {name: path + ".tmp" for name, path in finals.items()}
    try:
        splits = write_splits(cap_chars(train_docs, args.max_chars), val_docs, temps, args.num_proc, args.detokenize,
                              args.train_tokens, args.val_tokens)
        passes = WRITEUP_RUN_TOKENS / splits["train"]["tokens"]
        meta = {"tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256, "dtype": "uint16",
                "split": args.split, "detokenize": args.detokenize, "source": source,
                "max_chars": args.max_chars, "passes_in_1.44B_tokens": round(passes, 2), **splits,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        with prepare_io.writing(temps["meta.json"], after_failure=NOTHING_REPLACED), open(temps["meta.json"], "w") as f:
            json.dump(meta, f, indent=2)
        # meta.json goes first and comes back last, so its presence marks a complete set: a failure up
        # to here leaves an earlier set whole, one between the renames leaves a set without meta.json
        with prepare_io.writing(finals["meta.json"], after_failure=NOTHING_REPLACED), contextlib.suppress(FileNotFoundError):
            os.remove(finals["meta.json"])
        incomplete = f"{args.out_dir} is left without meta.json, an incomplete set that the next run redoes"
        for name in OUTPUTS:
            with prepare_io.writing(finals[name], after_failure=incomplete):
                os.replace(temps[name], finals[name])
    finally:
        for path in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    seconds, tokens = time.time() - t0, sum(s["tokens"] for s in splits.values())
    mb = sum(s["bytes"] for s in splits.values()) / 1e6
    for name, s in splits.items():
        asked = f" ({s['tokens_asked']:,} asked)" if s["tokens_asked"] else ""
        print(f"{name}: {s['tokens']:,} tokens{asked}, {s['chars']:,} chars, {s['documents']:,} documents "
              f"-> {finals[name + '.bin']}")
    print(f"a run of {WRITEUP_RUN_TOKENS / 1e9:.2f}B tokens (the write-ups' 9,000 steps) makes {passes:.1f} passes "
          f"over this training text")
    print(f"done in {seconds:.1f} s: {mb:.1f} MB of text at {mb / seconds:.1f} MB/s, "
          f"{tokens / seconds / 1e6:.2f}M tokens/s")
    return meta


# --------------------------------------------------------------------------- the command line

def check_settings(args):
    """Refuse settings that contradict each other; fill in the defaults that depend on others."""
    writeup = args.split == "writeup"
    if args.val and not args.input:
        raise cli.UserError("--val needs --input: it names the val files among local text")
    both = {os.path.realpath(p) for p in args.input or []} & {os.path.realpath(p) for p in args.val or []}
    if both:
        raise cli.UserError(f"{min(both)} is given to both --input and --val; HINT: name each file once, "
                            "the training text with --input, the val text with --val")
    for flag in ("val", "max_chars", "val_fraction"):
        if writeup and getattr(args, flag) is not None:
            raise cli.UserError(f"--{flag} does not apply to --split=writeup, which takes val from the text "
                                "that follows train; HINT: size the splits with --train_tokens and --val_tokens")
    if not writeup and (args.train_tokens is not None or args.val_tokens is not None):
        raise cli.UserError("--train_tokens and --val_tokens need --split=writeup")
    for flag in ("train_tokens", "val_tokens", "max_chars", "num_proc", "retries"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise cli.UserError(f"--{flag} must be 1 or more, got {getattr(args, flag)}")
    zip_flags = [flag for flag in ("dataset", "zip", "url", "sha256") if getattr(args, flag)]
    if args.input and zip_flags:
        raise cli.UserError(f"--{zip_flags[0]} names a zip to read, and --input names text files instead; "
                            "HINT: give one of them")
    if args.zip and args.url:
        raise cli.UserError("--zip names a zip on disk, --url one to download; HINT: give one of them")
    if args.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", args.sha256):
        raise cli.UserError(f"--sha256 must be 64 hexadecimal digits, got {args.sha256!r}")
    if args.sha256 is not None and not (args.url or args.zip):
        raise cli.UserError("--sha256 pins the zip of a --url or a --zip; the datasets' own downloads are checked "
                            "against their published sha256 already; HINT: drop --sha256")
    if args.val_fraction is not None and not 0 < args.val_fraction < 1:
        raise cli.UserError(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    args.sha256 = args.sha256 and args.sha256.lower()
    args.dataset_given = args.dataset is not None  # a --url with --dataset is a mirror of the published zip
    args.dataset = args.dataset or DEFAULT_DATASET
    args.out_dir = args.out_dir or DATASETS[args.dataset].out_dir
    args.train_tokens = args.train_tokens or (WRITEUP_TRAIN_TOKENS if writeup else None)
    args.val_tokens = args.val_tokens or (WRITEUP_VAL_TOKENS if writeup else None)
    args.val_fraction = 0.005 if args.val_fraction is None else args.val_fraction
    if args.detokenize is None:
        args.detokenize = writeup or (not args.input and DATASETS[args.dataset].detokenize)


def named_val_files(paths, val_paths):
    """The --val files, else an --input file named exactly wiki.valid.raw (not invalid.txt); [] if neither."""
    return val_paths or [p for p in paths if os.path.basename(p) == "wiki.valid.raw"]


def input_splits(paths, val_paths, val_fraction):
    """(train docs, val docs) from local files: the val files if named, else the last documents."""
    val_paths = named_val_files(paths, val_paths)
    if val_paths:
        return file_documents([p for p in paths if p not in val_paths]), file_documents(val_paths)
    n_docs = sum(1 for _ in file_documents(paths))  # a first pass finds where the last documents begin
    if n_docs < 2:
        raise cli.UserError(f"found {n_docs} document(s) in {' '.join(paths)}, need 2 or more to hold some out for "
                            "val; HINT: start articles with ` = Title = ` lines, or name val files with --val")
    docs = file_documents(paths)
    train_docs = itertools.islice(docs, n_docs - max(1, round(n_docs * val_fraction)))
    return train_docs, rest_after(train_docs, docs)


def rest_after(head, docs):
    """Val continues the same read, past the train documents that --max_chars left unread."""
    collections.deque(head, maxlen=0)  # reads head to its end
    yield from docs


def run(args):
    """Find the text that args name (downloading it if need be), then prepare it into args.out_dir."""
    for path in [os.path.join(args.out_dir, name + ".tmp") for name in OUTPUTS]:  # what a killed run left
        if os.path.exists(path):
            os.remove(path)
            print(f"removed {path}, left by an interrupted run")
    fetch.check_tokenizer()  # fail before a long download, not after it
    t0 = time.time()
    if args.input:
        for path in args.input + (args.val or []):
            if not os.path.isfile(path):
                raise cli.UserError(f"input file not found (or not a file): {path}; "
                                    "HINT: check the path, or drop --input to download WikiText-103")
            try:  # now, rather than as a write error of the .bin that reads it later
                open(path, "rb").close()
            except OSError as e:
                raise cli.UserError(f"cannot read {path}: {e.strerror.lower()}; HINT: check its permissions, or leave it out")
        source = {"input": args.input, "val": args.val} if args.val else args.input
        train_docs, val_docs = ((file_documents(args.input), None) if args.split == "writeup"
                                else input_splits(args.input, args.val, args.val_fraction))
    else:
        zip_path, source = fetch.zip_source(args, DATASETS)
        t0 = time.time()  # the summary's speed is that of the text work, not of the download
        train_docs = zip_documents(zip_path, "wiki.train.raw")
        val_docs = None if args.split == "writeup" else zip_documents(zip_path, "wiki.valid.raw")
    meta = prepare(train_docs, val_docs, args, source, t0)
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
    add = parser.add_argument
    add("--split", choices=["wikitext", "writeup"], default="wikitext",
        help="wikitext: WikiText's own train and val files; writeup: the write-ups' token counts")
    add("--input", nargs="+", help="local text files to use instead of the download")
    add("--val", nargs="+", help="with --input: the files of the val split")
    add("--dataset", choices=list(DATASETS), help=f"the WikiText zip to download (default {DEFAULT_DATASET})")
    add("--zip", help="a WikiText raw zip already on disk (checked against --dataset's sha256)")
    add("--url", help="download the zip from here (checked against --dataset's sha256 if given, else printed)")
    add("--sha256", help="with --url or --zip: the zip's SHA-256; other bytes are refused")
    add("--out_dir", help="gets train.bin, val.bin, meta.json and the zip (default: "
        + ", ".join(f"{d.out_dir} for {name}" for name, d in DATASETS.items()) + ")")
    add("--detokenize", action=argparse.BooleanOptionalAction,
        help="undo WikiText's tokenization marks (default: on with --split=writeup or --dataset wikitext2)")
    add("--train_tokens", type=int, help=f"--split=writeup: training tokens (default {WRITEUP_TRAIN_TOKENS:,})")
    add("--val_tokens", type=int, help=f"--split=writeup: val tokens (default {WRITEUP_VAL_TOKENS:,})")
    add("--max_chars", type=int, help="--split=wikitext: a cap on the characters of the training text")
    add("--val_fraction", type=float, help="with --input and no val file: the share of documents, from the end, "
        "for val (default 0.005)")
    add("--num_proc", type=int, default=os.cpu_count(), help="tokenizer threads")
    add("--retries", type=int, default=5, help="download attempts per URL")
    args = parser.parse_args(argv)
    try:
        check_settings(args)
        with prepare_io.writing(args.out_dir):  # an out_dir that cannot be written fails now, not after a download
            os.makedirs(args.out_dir, exist_ok=True)
            tempfile.TemporaryFile(dir=args.out_dir).close()
            lock = prepare_io.hold_for_writing(args.out_dir)
        with lock:
            return run(args)
    except (KeyboardInterrupt, cli.Stopped) as e:  # Ctrl-C, or a SIGTERM that cli.main made an exception
        signum = getattr(e, "signum", signal.SIGINT)
        raise cli.Stopped(signum, f"stopped by {signal.Signals(signum).name}: {NOTHING_REPLACED}") from None


@cli.main
def main(argv):
    """Exit status: 0 done, 1 an error, 130 Ctrl-C, 143 SIGTERM (128 + the signal, what a shell reports for a
    command a signal ended: a scheduler sees a termination, not an error)."""
    prepare_data(argv)


if __name__ == "__main__":
    sys.exit(main())
