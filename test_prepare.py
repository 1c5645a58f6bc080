"""
Tests for prepare_wikipedia.py: documents and splits on local text, the --max_chars cap, the
download against a local HTTP server (resume, servers that ignore Range, bad zips, errors),
and that an interrupted run leaves no output under the final names.

    TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache python -m pytest test_prepare.py
"""
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest
import tiktoken

import prepare_wikipedia as pw

try:
    ENC = tiktoken.get_encoding("gpt2")
except Exception as e:  # no skip: a tokenizer that cannot load is a failure, with the fix named
    raise RuntimeError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); offline, run the tests with "
                       "TIKTOKEN_CACHE_DIR=../shared/tiktoken_cache (a filled cache)") from None


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


def exit_message(argv):
    """Run main and return the message it exits with; fails if it does not exit with an error."""
    with pytest.raises(SystemExit) as e:
        pw.main(argv)
    assert e.value.code not in (0, None)
    return str(e.value.code)


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
    meta = pw.main(["--input", *paths, "--out_dir", str(out), "--num_proc", "1",
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
    assert meta["vocab_size"] == 50257 and meta["tokenizer"] == "gpt2" and meta["source"] == paths
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_parallel_matches_serial(tmp_path, monkeypatch):
    monkeypatch.setattr(pw, "BATCH_CHARS", 150)  # several batches, so the pool's ordering matters
    paths = write_files(tmp_path, [ARTICLES])
    for num_proc in ("1", "2"):
        pw.main(["--input", *paths, "--out_dir", str(tmp_path / num_proc), "--num_proc", num_proc])
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes()


def test_max_chars_caps_train_only(tmp_path):
    paths = write_files(tmp_path, [ARTICLES])
    out = tmp_path / "out"
    cap = len(ARTICLES[0]) + len(ARTICLES[1]) + 1  # reached inside the third article
    meta = pw.main(["--input", *paths, "--out_dir", str(out), "--num_proc", "1",
                    "--val_fraction", "0.2", "--max_chars", str(cap)])
    assert read_docs(out / "train.bin") == ARTICLES[:3]  # stops after the article that crosses the cap
    assert read_docs(out / "val.bin") == ARTICLES[-2:]
    assert meta["train"]["chars"] == sum(len(a) for a in ARTICLES[:3]) and meta["max_chars"] == cap


def test_valid_file_is_val(tmp_path):
    train_path, = write_files(tmp_path, [ARTICLES[:7]])
    valid_path = tmp_path / "wiki.valid.raw"
    valid_path.write_text("".join(ARTICLES[7:]), encoding="utf-8")
    out = tmp_path / "out"
    pw.main(["--input", str(valid_path), train_path, "--out_dir", str(out), "--num_proc", "1"])
    assert read_docs(out / "train.bin") == ARTICLES[:7]
    assert read_docs(out / "val.bin") == ARTICLES[7:]


def test_document_boundaries(monkeypatch):
    lines = "".join(ARTICLES[:3]).splitlines(keepends=True)
    assert list(pw.read_documents(lines)) == ARTICLES[:3]  # ` = = History = = ` starts no document
    # text without headings: past MAX_DOC_CHARS, a document ends at the next blank line
    monkeypatch.setattr(pw, "MAX_DOC_CHARS", 40)
    paragraphs = [f"paragraph {i} has some words in it .\nand a second line .\n\n" for i in range(5)]
    assert list(pw.read_documents("".join(paragraphs).splitlines(keepends=True))) == paragraphs


# --------------------------------------------------------------------------- errors and interruption

def test_missing_input(tmp_path):
    message = exit_message(["--input", str(tmp_path / "nope.txt"), "--out_dir", str(tmp_path / "out")])
    assert "not found" in message and "nope.txt" in message and "HINT" in message


def test_missing_input_exits_without_traceback(tmp_path):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prepare_wikipedia.py")
    result = subprocess.run([sys.executable, script, "--input", str(tmp_path / "nope.txt"),
                             "--out_dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("error: input file not found") and "Traceback" not in result.stderr


def test_too_little_text_and_unwritable_out_dir(tmp_path):
    one, = write_files(tmp_path, [ARTICLES[:1]])
    assert "need 2 or more" in exit_message(["--input", one, "--out_dir", str(tmp_path / "out")])
    assert "cannot write" in exit_message(["--input", one, "--out_dir", os.path.join(one, "sub")])


@pytest.mark.parametrize("crash", [RuntimeError, KeyboardInterrupt])
def test_interrupted_run_leaves_no_output(tmp_path, monkeypatch, crash):
    monkeypatch.setattr(pw, "BATCH_CHARS", 1)  # one document per batch
    real_encode_batch, calls = pw.encode_batch, []

    def failing_encode_batch(docs):
        calls.append(docs)
        if len(calls) == 4:
            raise crash("simulated crash mid-tokenization")
        return real_encode_batch(docs)

    monkeypatch.setattr(pw, "encode_batch", failing_encode_batch)
    paths = write_files(tmp_path, [ARTICLES])
    out = tmp_path / "out"
    argv = ["--input", *paths, "--out_dir", str(out), "--num_proc", "1"]
    if crash is KeyboardInterrupt:
        assert "interrupted" in exit_message(argv)
    else:
        with pytest.raises(RuntimeError):
            pw.main(argv)
    assert len(calls) == 4
    assert os.listdir(out) == []  # no final files, and no temporary ones left behind


# --------------------------------------------------------------------------- download

class Handler(http.server.BaseHTTPRequestHandler):
    """Serves server.files, honouring Range unless told not to; logs (path, Range, User-Agent)."""

    def do_GET(self):
        server = self.server
        server.log.append((self.path, self.headers.get("Range"), self.headers.get("User-Agent")))
        data = server.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start = 0
        if self.headers.get("Range") and server.honor_range:
            start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if server.drop_after is not None:  # send part of the body, then close the connection
            body, server.drop_after = body[:server.drop_after], None
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.files, srv.log, srv.honor_range, srv.drop_after = {}, [], True, None
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def wikitext_zip(tmp_path, padding=0):
    """A small zip laid out like WikiText-103 raw; padding adds incompressible test-file bytes."""
    path = tmp_path / "made.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("wikitext-103-raw/wiki.train.raw", " \n" + "".join(ARTICLES[:8]))
        zf.writestr("wikitext-103-raw/wiki.valid.raw", " \n" + "".join(ARTICLES[8:]))
        zf.writestr("wikitext-103-raw/wiki.test.raw", np.random.default_rng(0).bytes(padding) + b"\n")
    return path.read_bytes()


def url(server, path="/wt.zip"):
    return f"http://127.0.0.1:{server.server_port}{path}"


def test_download_and_prepare(tmp_path, server):
    server.files["/wt.zip"] = wikitext_zip(tmp_path)
    out = tmp_path / "out"
    argv = ["--url", url(server), "--out_dir", str(out), "--num_proc", "1"]
    meta = pw.main(argv)
    assert server.log == [("/wt.zip", None, pw.USER_AGENT)]
    assert (out / "wt.zip").read_bytes() == server.files["/wt.zip"] and not (out / "wt.zip.part").exists()
    assert read_docs(out / "train.bin") == ARTICLES[:8]
    assert read_docs(out / "val.bin") == ARTICLES[8:]
    assert meta["source"]["urls"] == [url(server)]
    pw.main(argv)  # the verified zip is reused: no second request
    assert len(server.log) == 1


def test_resume_from_part(tmp_path, server):
    data = wikitext_zip(tmp_path)
    server.files["/wt.zip"] = data
    part = tmp_path / "wt.zip.part"
    part.write_bytes(data[:1000])
    pw.download(url(server), str(part), expected_size=len(data), retries=1)
    assert server.log == [("/wt.zip", "bytes=1000-", pw.USER_AGENT)]
    assert part.read_bytes() == data


def test_resume_after_dropped_connection(tmp_path, server, monkeypatch):
    monkeypatch.setattr(pw, "RETRY_WAIT_S", 0)
    data = wikitext_zip(tmp_path, padding=300_000)
    server.files["/wt.zip"], server.drop_after = data, 200_000
    part = tmp_path / "wt.zip.part"
    pw.download(url(server), str(part), expected_size=len(data), retries=3)
    assert [entry[1] is None for entry in server.log] == [True, False]
    resumed_at = int(server.log[1][1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 200_000  # the second request asks for what the first did not deliver
    assert part.read_bytes() == data


def test_server_ignoring_range_restarts(tmp_path, server):
    data = wikitext_zip(tmp_path)
    server.files["/wt.zip"], server.honor_range = data, False
    part = tmp_path / "wt.zip.part"
    part.write_bytes(b"stale bytes from another file")
    pw.download(url(server), str(part), expected_size=len(data), retries=1)
    assert server.log[0][1] == f"bytes={len(b'stale bytes from another file')}-"
    assert part.read_bytes() == data  # the 200 answer replaced the stale part instead of appending


def test_bad_zip_is_rejected_and_deleted(tmp_path, server):
    server.files["/bad.zip"] = b"this is not a zip file\n" * 100
    out = tmp_path / "out"
    message = exit_message(["--url", url(server, "/bad.zip"), "--out_dir", str(out), "--num_proc", "1"])
    assert "not a valid zip" in message and "deleted" in message and "--zip" in message
    assert os.listdir(out) == []
    # a truncated download: wrong size when the size is known, a broken zip when it is not
    data = wikitext_zip(tmp_path)
    for expected_size, problem in [(len(data), "expected"), (None, "not a valid zip")]:
        truncated = tmp_path / "truncated.zip"
        truncated.write_bytes(data[:len(data) // 2])
        with pytest.raises(pw.PrepareError, match=problem):
            pw.check_zip(str(truncated), expected_size)
        assert not truncated.exists()


def test_http_404_and_refused_connection(tmp_path, server, monkeypatch):
    monkeypatch.setattr(pw, "RETRY_WAIT_S", 0)
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
    monkeypatch.setattr(pw, "RETRY_WAIT_S", 0)
    server.files["/wt.zip"] = data = wikitext_zip(tmp_path)
    urls = [url(server, "/gone.zip"), url(server, "/wt.zip")]  # the main host fails, the mirror works
    path = pw.fetch_zip(urls, str(tmp_path / "wt.zip"), len(data), retries=1)
    assert [entry[0] for entry in server.log] == ["/gone.zip", "/wt.zip"]
    assert open(path, "rb").read() == data
