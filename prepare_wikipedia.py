"""
Prepare Wikipedia text for train.py: GPT-2 BPE tokens as flat uint16 arrays (nanoGPT layout).

    python prepare_wikipedia.py                       # the write-ups' text (179 MB), tokenized
    python prepare_wikipedia.py --tokens              # their token files (85 MB), no tokenizer
    python prepare_wikipedia.py --dataset=writeup --input wikipedia.txt  # their text, saved by hand
    python prepare_wikipedia.py --dataset wikitext2   # WikiText-2 raw (4.7 MB), a first CPU run
    python prepare_wikipedia.py --dataset wikitext103 --split=writeup  # WikiText-103, their regime
    python prepare_wikipedia.py --zip wikitext-103-raw-v1.zip         # a zip saved by hand
    python prepare_wikipedia.py --input notes.txt --val held_out.txt  # your own text, val named

It writes train.bin and val.bin (read them with np.memmap(path, dtype=np.uint16, mode='r')) and
meta.json to --out_dir (data/wikipedia; data/wikitext103 and data/wikitext2 for those datasets), and
keeps the download there for the next run. The write-ups (Future Attention and the Auto-regressive
Encoder-Decoder Transformer, GitHub yiphei/yif-AI) trained on the Wikipedia text of that repository:
with it, losses compare with their tables. docs/data.md says what is checked, how the text is cut
into documents and splits, how the files are written, and how to work offline.
"""
import argparse
import collections
import concurrent.futures
import contextlib
import datetime
import functools
import itertools
import json
import os
import re
import signal
import sys
import tempfile
import time

import numpy as np
import tiktoken

from lib import cli, data, fetch, prepare_io


WRITEUP = "writeup"  # the default --dataset: the write-ups' text and split (pinned in lib/fetch.py)
WRITEUP_OUT_DIR = data.DEFAULT_DATA_DIR  # where train.py looks by default; --input's default too
# The characters read ahead of the tokens written: all that memory holds, whatever the text.
READ_AHEAD_CHARS = 1_000_000
OUTPUTS = ("train.bin", "val.bin", "meta.json")  # meta.json last: its presence marks a complete set
# What an interrupted or failed run leaves.
NOTHING_REPLACED = "no output written under the final names"
# the write-ups' training text and their val text, which followed it, in GPT-2 tokens
WRITEUP_TRAIN_TOKENS, WRITEUP_VAL_TOKENS = fetch.WRITEUP_TOKENS
WRITEUP_RUN_TOKENS = 1_440_000_000  # config/future50_mse.py: 9,000 steps of 50 x 16 x 200 tokens
# train.py estimates the val loss on random windows of val.bin: with fewer tokens the windows
# overlap, and fewer documents are few topics.
MIN_VAL_TOKENS, MIN_VAL_DOCUMENTS = 100_000, 10


# --------------------------------------------------------------------------- tokenize and write

def groups(docs, detokenize_first, group_chars):
    """The documents (detokenized if asked) in lists of about group_chars characters: one task of
    a tokenizer thread each, for fewer hand-overs between threads than a task per document."""
    group, size = [], 0
    for doc in docs:
        group.append(fetch.detokenize(doc) if detokenize_first else doc)
        size += len(group[-1])
        if size >= group_chars:
            yield group
            group, size = [], 0
    if group:
        yield group


def encoded_documents(docs, num_threads, detokenize_first, end_of_text=True):
    """(tokens, chars, bytes) of each document, in order, its tokens ending with <|endoftext|> if
    end_of_text. tiktoken encodes them on num_threads threads (its Rust encoder releases the GIL)
    while this thread reads the documents ahead, up to READ_AHEAD_CHARS characters, and writes
    those behind."""
    enc = tiktoken.get_encoding("gpt2")
    assert enc.max_token_value < 2**16  # 50,257 token ids: uint16 holds them
    ends = [np.array([enc.eot_token])] if end_of_text else []

    def encode(texts):  # on a tokenizer thread; encode_to_numpy, with no special token allowed or
        # refused, gives encode_ordinary's ids as an array, not a Python int per token: 20% faster
        return [np.concatenate((enc.encode_to_numpy(text, disallowed_special=()), *ends),
                               dtype=np.uint16, casting="unsafe")  # uint32 to uint16: the ids fit
                for text in texts]

    in_flight, chars = collections.deque(), 0  # (texts, their tokens to come), oldest first
    pool = concurrent.futures.ThreadPoolExecutor(num_threads)
    # 4 groups a thread in flight: each thread has the next at hand while this one writes.
    group_chars = READ_AHEAD_CHARS // (4 * num_threads)
    try:
        for texts in itertools.chain(groups(docs, detokenize_first, group_chars), [None]):
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
    """Stream encoded documents into path; return (stats, left over). With tokens_asked it stops at
    the document boundary nearest that count (at least one document): a document that would
    overshoot by more than stopping before it undershoots is left over, returned unwritten."""
    stats = {"tokens": 0, "tokens_asked": tokens_asked, "documents": 0, "chars": 0, "bytes": 0,
             "max_token_id": 0}
    left_over = []
    with prepare_io.writing(path, after_failure=NOTHING_REPLACED):
        with open(path, "wb") as f, prepare_io.Progress() as progress:
            for tokens, n_chars, n_bytes in encoded:
                if tokens_asked and stats["documents"]:
                    # undershoot > 0, since the loop stops once the count is reached
                    undershoot = tokens_asked - stats["tokens"]
                    if stats["tokens"] + len(tokens) - tokens_asked > undershoot:
                        left_over.append((tokens, n_chars, n_bytes))
                        break
                f.write(tokens)
                stats.update(tokens=stats["tokens"] + len(tokens), documents=stats["documents"] + 1,
                             chars=stats["chars"] + n_chars, bytes=stats["bytes"] + n_bytes,
                             max_token_id=max(stats["max_token_id"], int(tokens.max())))
                mb = stats["bytes"] / 1e6
                of_asked = f" of {tokens_asked / 1e6:.2f}M" if tokens_asked else ""
                progress.show(f"{name}: {mb:.1f} MB of text, "
                              f"{stats['tokens'] / 1e6:.2f}M{of_asked} tokens, "
                              f"{mb / max(time.time() - progress.t0, 1e-9):.1f} MB/s")
                if tokens_asked and stats["tokens"] >= tokens_asked:
                    break
        stats["sha256"] = data.sha256_of(path)  # of the bytes on disk, read back
    return stats, left_over


def write_splits(train_docs, val_docs, temps, num_threads, detokenize_first,
                 train_tokens, val_tokens):
    """Tokenize and write both splits; val_docs None means val is the text that follows train."""
    train_encoded = encoded_documents(train_docs, num_threads, detokenize_first)
    train, left_over = write_split(train_encoded, temps["train.bin"], "train", train_tokens)
    if train["documents"] == 0:
        raise cli.UserError("the train split has no text; HINT: give more text")
    if val_docs is None:  # the same read goes on
        val_encoded = itertools.chain(left_over, train_encoded)
    else:
        val_encoded = encoded_documents(val_docs, num_threads, detokenize_first)
    val, val_left_over = write_split(val_encoded, temps["val.bin"], "val", val_tokens)
    if val_docs is None and val["documents"] == 0:
        raise cli.UserError(f"the text ran out: train took {train['tokens']:,} tokens "
                            f"({train_tokens:,} asked) and left nothing for val; "
                            "HINT: give more text, or lower --train_tokens")
    if val["documents"] == 0:
        raise cli.UserError("the val split has no text; "
                            "HINT: give more text, or name val files with --val")
    # Val came out short, and nothing was read past it.
    if val_docs is None and val["tokens"] < val_tokens and not val_left_over:
        print(f"warning: the text ran out: val has {val['tokens']:,} "
              f"of the {val_tokens:,} tokens asked "
              f"(train has {train['tokens']:,} of {train_tokens:,})", file=sys.stderr)
    return {"train": train, "val": val}


def writeup_splits(path, threads, compare):
    """A write_into for prepare: the write-ups' splits of their text at path (fetch.writeup_parts),
    each encoded as one string would be. compare: refuse tokens other than their token files'."""
    def write_into(temps):
        splits = {}
        for name, text in fetch.writeup_parts(path):
            encoded = encoded_documents(text, threads, detokenize_first=False, end_of_text=False)
            splits[name], _ = write_split(encoded, temps[f"{name}.bin"], name)
            del splits[name]["documents"]  # pieces of the text, not documents
            if not splits[name]["tokens"]:
                raise cli.UserError(f"{path} is too short to split; HINT: give the write-ups' text")
        if compare:
            ours = {name: split["sha256"] for name, split in splits.items()}
            fetch.check_identical(ours, NOTHING_REPLACED)
        return splits
    return write_into


def prepare(write_into, args, source, t0):
    """Write train.bin, val.bin and meta.json into args.out_dir, each under a temporary name first:
    write_into(temps) writes the .bin files there and returns their stats; meta.json records them,
    the settings of args and the data's source."""
    finals = {name: os.path.join(args.out_dir, name) for name in OUTPUTS}
    temps = {name: path + ".tmp" for name, path in finals.items()}
    try:
        splits = write_into(temps)
        passes = WRITEUP_RUN_TOKENS / splits["train"]["tokens"]
        now = datetime.datetime.now(datetime.timezone.utc)
        meta = {"tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256, "dtype": "uint16",
                "dataset": args.dataset, "split": args.split, "detokenize": args.detokenize,
                "source": source, "max_chars": args.max_chars,
                "passes_in_1.44B_tokens": round(passes, 2), **splits,
                "created": now.isoformat(timespec="seconds")}
        with (prepare_io.writing(temps["meta.json"], after_failure=NOTHING_REPLACED),
              open(temps["meta.json"], "w") as f):
            json.dump(meta, f, indent=2)
        # meta.json goes first and comes back last, so its presence marks a complete set: a failure
        # up to here leaves an earlier set whole, one between the renames leaves a set without
        # meta.json.
        with (prepare_io.writing(finals["meta.json"], after_failure=NOTHING_REPLACED),
              contextlib.suppress(FileNotFoundError)):
            os.remove(finals["meta.json"])
        incomplete = (f"{args.out_dir} is left without meta.json, "
                      "an incomplete set that the next run redoes")
        for name in OUTPUTS:
            with prepare_io.writing(finals[name], after_failure=incomplete):
                os.replace(temps[name], finals[name])
    finally:
        for path in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    seconds, tokens = time.time() - t0, sum(s["tokens"] for s in splits.values())
    mb = sum(s.get("bytes", 0) for s in splits.values()) / 1e6
    for name, s in splits.items():
        asked = f" ({s['tokens_asked']:,} asked)" if s.get("tokens_asked") else ""
        counts = "".join(f", {s[key]:,} {key}" for key in ("chars", "documents") if key in s)
        print(f"{name}: {s['tokens']:,} tokens{asked}{counts} -> {finals[name + '.bin']}")
    print(f"a run of {WRITEUP_RUN_TOKENS / 1e9:.2f}B tokens (the write-ups' 9,000 steps) makes "
          f"{passes:.1f} passes over this training text")
    text = f"{mb:.1f} MB of text at {mb / seconds:.1f} MB/s, " if mb else ""
    print(f"done in {seconds:.1f} s: {text}{tokens / seconds / 1e6:.2f}M tokens/s")
    return meta


# --------------------------------------------------------------------------- the command line

def check_settings(args):
    """Refuse settings that contradict each other; fill in the defaults that depend on others."""
    args.dataset_given = args.dataset is not None  # a --url with --dataset: a mirror of its zip
    if args.val and not args.input:
        raise cli.UserError("--val needs --input: it names the val files among local text")
    others = args.input or args.zip or args.url  # without --dataset, each names other data
    if args.dataset == WRITEUP or not (args.dataset_given or (others and not args.tokens)):
        return check_writeup_settings(args)
    if args.tokens:
        raise cli.UserError("--tokens fetches the write-ups' token files: --dataset=writeup only")
    args.split = args.split or "wikitext"
    writeup = args.split == "writeup"
    input_files = {os.path.realpath(p) for p in args.input or []}
    both = input_files & {os.path.realpath(p) for p in args.val or []}
    if both:
        raise cli.UserError(f"{min(both)} is given to both --input and --val; "
                            "HINT: name each file once, "
                            "the training text with --input, the val text with --val")
    for flag in ("val", "max_chars", "val_fraction"):
        if writeup and getattr(args, flag) is not None:
            raise cli.UserError(f"--{flag} does not apply to --split=writeup, which takes val "
                                "from the text that follows train; "
                                "HINT: size the splits with --train_tokens and --val_tokens")
    if not writeup and (args.train_tokens is not None or args.val_tokens is not None):
        raise cli.UserError("--train_tokens and --val_tokens need --split=writeup")
    check_counts(args, ("train_tokens", "val_tokens", "max_chars", "threads", "retries"))
    zip_flags = [flag for flag in ("dataset", "zip", "url", "sha256") if getattr(args, flag)]
    if args.input and zip_flags:
        raise cli.UserError(f"--{zip_flags[0]} names a zip to read, "
                            "and --input names text files instead; HINT: give one of them")
    if args.zip and args.url:
        raise cli.UserError("--zip names a zip on disk, --url one to download; "
                            "HINT: give one of them")
    if args.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", args.sha256):
        raise cli.UserError(f"--sha256 must be 64 hexadecimal digits, got {args.sha256!r}")
    if args.sha256 is not None and not (args.url or args.zip):
        raise cli.UserError("--sha256 pins the zip of a --url or a --zip; "
                            "the datasets' own downloads are checked "
                            "against their published sha256 already; HINT: drop --sha256")
    if args.val_fraction is not None and not 0 < args.val_fraction < 1:
        raise cli.UserError(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    args.sha256 = args.sha256 and args.sha256.lower()
    args.dataset = args.dataset or (None if args.input else "wikitext103")  # --input: your own text
    default_out_dir = fetch.DATASETS[args.dataset].out_dir if args.dataset else WRITEUP_OUT_DIR
    args.out_dir = args.out_dir or default_out_dir
    args.train_tokens = args.train_tokens or (WRITEUP_TRAIN_TOKENS if writeup else None)
    args.val_tokens = args.val_tokens or (WRITEUP_VAL_TOKENS if writeup else None)
    args.val_fraction = 0.005 if args.val_fraction is None else args.val_fraction
    if args.detokenize is None:
        args.detokenize = writeup or (not args.input and fetch.DATASETS[args.dataset].detokenize)


def check_writeup_settings(args):
    """check_settings for the write-ups' own data: their text and split, all set but where."""
    given = [flag for flag in ("split", "val", "max_chars", "val_fraction", "train_tokens",
                               "val_tokens", "detokenize", "zip", "url", "sha256")
             if getattr(args, flag) is not None]
    if given:
        raise cli.UserError(f"--{given[0]} does not apply to the write-ups' own text and split "
                            "(--dataset=writeup, the default); HINT: drop it, or add "
                            "--dataset=wikitext103")
    if args.tokens and args.input:
        raise cli.UserError("--tokens fetches the write-ups' token files, --input tokenizes a copy "
                            "of their text; HINT: give one of them")
    if args.input and len(args.input) > 1:
        raise cli.UserError("--dataset=writeup takes one --input file: their wikipedia.txt")
    check_counts(args, ("threads", "retries"))
    args.dataset, args.split, args.detokenize = WRITEUP, "writeup", False
    args.out_dir = args.out_dir or WRITEUP_OUT_DIR


def check_counts(args, flags):
    """Refuse a count below 1 for any of flags."""
    for flag in flags:
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise cli.UserError(f"--{flag} must be 1 or more, got {getattr(args, flag)}")


def run(args):
    """Find the data that args name (downloading it if need be), then prepare it in args.out_dir."""
    left_by_a_killed_run = [os.path.join(args.out_dir, name + ".tmp") for name in OUTPUTS]
    for path in left_by_a_killed_run:
        if os.path.exists(path):
            os.remove(path)
            print(f"removed {path}, left by an interrupted run")
    if not args.tokens:
        fetch.check_tokenizer()  # fail before a long download, not after it
    t0 = time.time()
    fetch.check_readable((args.input or []) + (args.val or []))
    if args.dataset == WRITEUP:
        paths, source, pinned = fetch.writeup_source(args, WRITEUP_OUT_DIR)
        t0 = time.time()  # the summary's speed is that of the text work, not of the download
        write_into = (functools.partial(fetch.copy_token_files, paths) if args.tokens
                      else writeup_splits(paths["text"], args.threads, compare=pinned))
    elif args.input:
        source = {"input": args.input, "val": args.val} if args.val else args.input
        train_docs, val_docs = ((fetch.file_documents(args.input), None) if args.split == "writeup"
                                else fetch.input_splits(args.input, args.val, args.val_fraction))
    else:
        zip_path, source = fetch.zip_source(args, fetch.DATASETS)
        t0 = time.time()
        train_docs = fetch.zip_documents(zip_path, "wiki.train.raw")
        val_docs = (None if args.split == "writeup"
                    else fetch.zip_documents(zip_path, "wiki.valid.raw"))
    if args.dataset != WRITEUP:
        def write_into(temps):
            return write_splits(fetch.cap_chars(train_docs, args.max_chars), val_docs, temps,
                                args.threads, args.detokenize, args.train_tokens, args.val_tokens)
    meta = prepare(write_into, args, source, t0)
    if args.dataset == WRITEUP:
        if pinned:
            print("identical to the write-ups' own token files "
                  "(wikipedia_train.bin, wikipedia_val.bin)")
    elif warning := small_val_warning(meta["val"], args):
        print(warning, file=sys.stderr)
    return meta


def small_val_warning(val, args):
    """A warning naming the setting that grows val, when val is too small to estimate a loss on;
    else None."""
    if val["tokens"] >= MIN_VAL_TOKENS and val["documents"] >= MIN_VAL_DOCUMENTS:
        return None
    if args.split == "writeup":
        hint = (f"raise --val_tokens (now {args.val_tokens:,}); "
                "if the text ran out, give more or lower --train_tokens")
    elif not args.input:
        hint = ("use a zip whose wiki.valid.raw holds more text, "
                "or give text files with --input and --val")
    elif fetch.named_val_files(args.input, args.val):
        hint = "give more held-out text with --val"
    else:
        hint = ("name held-out files with --val, "
                f"or raise --val_fraction (now {args.val_fraction:g})")
    documents = "document" if val["documents"] == 1 else "documents"
    return (f"warning: val has {val['tokens']:,} tokens in {val['documents']:,} {documents}: "
            f"too few to estimate a loss (aim for {MIN_VAL_TOKENS:,}+ tokens "
            f"and {MIN_VAL_DOCUMENTS}+ documents); HINT: {hint}")


def prepare_data(argv):
    """The command line's preparation; returns meta.json's contents (tests read them)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--dataset", choices=[WRITEUP, *fetch.DATASETS], help="writeup (the default): the "
        "write-ups' own text, split and tokens; wikitext103, wikitext2: a WikiText zip to download")
    add("--tokens", action="store_true", help="writeup: their token files, not their text")
    add("--split", choices=["wikitext", "writeup"], help="WikiText and --input: wikitext (the "
        "default) takes WikiText's own train and val files; writeup the write-ups' token counts")
    add("--input", nargs="+", help="local text files to use instead of the download (with "
        "--dataset=writeup, a copy of the write-ups' wikipedia.txt)")
    add("--val", nargs="+", help="with --input: the files of the val split")
    add("--zip", help="a WikiText raw zip already on disk (checked against --dataset's sha256)")
    add("--url", help="download the zip from here "
        "(checked against --dataset's sha256 if given, else printed)")
    add("--sha256", help="with --url or --zip: the zip's SHA-256; other bytes are refused")
    defaults = ", ".join(f"{d.out_dir} for {name}" for name, d in fetch.DATASETS.items())
    add("--out_dir", help="gets train.bin, val.bin, meta.json and the download (default: "
        f"{defaults}, else {WRITEUP_OUT_DIR})")
    add("--detokenize", action=argparse.BooleanOptionalAction,
        help="undo WikiText's tokenization marks "
        "(default: on with --split=writeup or --dataset wikitext2)")
    add("--train_tokens", type=int,
        help=f"--split=writeup: training tokens (default {WRITEUP_TRAIN_TOKENS:,})")
    add("--val_tokens", type=int,
        help=f"--split=writeup: val tokens (default {WRITEUP_VAL_TOKENS:,})")
    add("--max_chars", type=int,
        help="--split=wikitext: a cap on the characters of the training text")
    add("--val_fraction", type=float, help="with --input and no val file: "
        "the share of documents, from the end, for val (default 0.005)")
    add("--threads", "--num_proc", type=int, default=os.cpu_count(), help="tokenizer threads")
    add("--retries", type=int, default=5, help="download attempts per URL")
    args = parser.parse_args(argv)
    try:
        check_settings(args)
        made, lock_path = folders_to_make(args.out_dir), os.path.join(args.out_dir, data.DATA_LOCK)
        # An out_dir that cannot be written fails now, not after a download.
        with prepare_io.writing(args.out_dir):
            os.makedirs(args.out_dir, exist_ok=True)
            tempfile.TemporaryFile(dir=args.out_dir).close()
            lock_made = not os.path.exists(lock_path)
            lock = prepare_io.hold_for_writing(args.out_dir)
        with lock:
            try:
                return run(args)
            except BaseException:  # a failed run leaves no lock and no empty folder it made
                if lock_made:
                    os.remove(lock_path)
                for folder in made:
                    with contextlib.suppress(OSError):  # one that holds something stays
                        os.rmdir(folder)
                raise
    except (KeyboardInterrupt, cli.Stopped) as e:
        # Ctrl-C, or a SIGTERM that cli.main made an exception
        signum = getattr(e, "signum", signal.SIGINT)
        signal_name = signal.Signals(signum).name
        raise cli.Stopped(signum, f"stopped by {signal_name}: {NOTHING_REPLACED}") from None


def folders_to_make(path):
    """The folders that os.makedirs(path) would make, innermost first."""
    if not path or os.path.exists(path):
        return []
    return [path, *folders_to_make(os.path.dirname(path))]


@cli.main
def main(argv):
    """Exit status: 0 done, 1 an error, 130 Ctrl-C, 143 SIGTERM (128 + the signal, what a shell
    reports for a command a signal ended: a scheduler sees a termination, not an error)."""
    prepare_data(argv)


if __name__ == "__main__":
    sys.exit(main())
