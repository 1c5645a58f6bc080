"""
Tests of sample.py: text from a checkpoint train.py wrote, best.pt or ckpt.pt, a prompt longer
than the model sees, and settings, prompts and checkpoints it refuses in one line. Tiny models
with the GPT-2 vocabulary on a CPU; offline, export TIKTOKEN_CACHE_DIR first.
Run: python -m pytest -q test_sample.py
"""

import os
import shutil

import pytest
import torch

import configurator
import model_baseline
import model_encdec
import model_future_attn
import sample
import train
from train import load_checkpoint, model_from_checkpoint
from conftest import argv_for, flip_bits, last_error

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# --------------------------------------------------------------------------------------
# sampling


def test_sample_from_a_checkpoint(trained_runs, tmp_path, capsys):
    argv = ["--out_dir=" + trained_runs["baseline"], "--device=cpu", "--num_samples=2", "--max_new_tokens=5"]
    assert sample.main(argv + ["--start=Hello world"]) == 0
    out, err = capsys.readouterr()
    assert out.count("Hello world") == 2 and out.count("---------------") == 2
    assert "sampling from" not in out  # stdout holds the samples alone
    best = load_checkpoint(os.path.join(trained_runs["baseline"], "best.pt"))
    assert err == (f"sampling from {os.path.join(trained_runs['baseline'], 'best.pt')}: baseline at iteration "
                   f"{best['iter_num']}, val loss {best['best_val_loss']:.4f}\n")
    # the same flags written --key value
    assert sample.main(["--out_dir", trained_runs["baseline"], "--device", "cpu", "--num_samples", "2",
                        "--max_new_tokens", "5", "--start", "Hello world"]) == 0
    assert capsys.readouterr().out == out
    # the run folder as a plain word, as report.py and visualize.py take it
    assert sample.main([trained_runs["baseline"], *argv[1:], "--start=Hello world"]) == 0
    assert capsys.readouterr().out == out
    assert sample.main([trained_runs["baseline"], trained_runs["future_attn"], *argv[1:]]) == 2
    assert last_error(capsys) == (f"error: one run to sample from, not 2: {trained_runs['baseline']} "
                                  f"{trained_runs['future_attn']}\n")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Once upon a time<|endoftext|>")
    texts = sample.sample(configurator.merge(sample.DEFAULTS, *configurator.parse(argv + [f"--start=FILE:{prompt}"])))
    assert len(texts) == 2 and all(t.startswith("Once upon a time<|endoftext|>") for t in texts)


def test_sample_reads_best_or_latest(data_dir, tmp_path, capsys, monkeypatch):
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, vocab_size=50257, max_iters=2, eval_interval=2)) == 0
    loaded = []
    monkeypatch.setattr(sample, "load_checkpoint", lambda path: loaded.append(path) or load_checkpoint(path))
    for which, name in (("best", "best.pt"), ("latest", "ckpt.pt")):
        assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--max_new_tokens=1", f"--checkpoint={which}"]) == 0
        assert loaded[-1] == os.path.join(str(out_dir), name)
        saved = load_checkpoint(loaded[-1])
        val = "val loss" if which == "best" else "best val loss so far"  # ckpt.pt may be past the best
        assert f"{name}: baseline at iteration {saved['iter_num']}, {val} {saved['best_val_loss']:.4f}" in \
            capsys.readouterr().err
    os.remove(out_dir / "best.pt")  # a run from before best.pt: its latest state, said so
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--max_new_tokens=1"]) == 0
    out, err = capsys.readouterr()
    assert loaded[-1].endswith("ckpt.pt") and "has no best.pt" in err and "note" not in out


def test_sample_says_once_that_it_crops_a_long_prompt(data_dir, tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, vocab_size=50257, max_iters=2, eval_interval=2)) == 0
    capsys.readouterr()
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--num_samples=2", "--max_new_tokens=3",
                        "--start=word" + " word" * 39]) == 0
    out, err = capsys.readouterr()
    assert err.count("note: the prompt has 40 tokens; the model sees only the last 16") == 1
    assert "note:" not in out  # stdout holds the samples alone
    assert sample.main([f"--out_dir={out_dir}", "--device=cpu", "--max_new_tokens=3", "--start=word"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_sample_draws_the_tokens_generate_draws(trained_runs):
    # the seed decides the samples, and --top_k=0 samples among all tokens
    argv = [f"--out_dir={trained_runs['baseline']}", "--device=cpu", "--num_samples=2", "--max_new_tokens=7",
            "--start=Hello world", "--top_k=0", "--seed=5"]
    texts = sample.sample(configurator.merge(sample.DEFAULTS, *configurator.parse(argv)))
    model = model_from_checkpoint(load_checkpoint(os.path.join(trained_runs["baseline"], "best.pt"))).eval()
    enc = sample.gpt2_tokenizer()
    x = torch.tensor([enc.encode("Hello world")])
    torch.manual_seed(5)
    with torch.no_grad():
        expected = [enc.decode(model.generate(x, 7, temperature=0.8)[0].tolist()) for _ in range(2)]
    assert texts == expected and texts[0] != texts[1]


@pytest.mark.parametrize("module, options", [(model_baseline, {}), (model_future_attn, dict(future_dim=3)),
                                             (model_encdec, {})], ids=["baseline", "future_attn", "encdec"])
def test_compiled_sampling_compiles_a_few_graphs_for_all_lengths(module, options):
    # --compile=True: generate() runs the model at T = 1, 2, ..., block_size, then at block_size
    # on a sliding window; recompiling at every length would hit dynamo's recompile limit and
    # run eagerly from there on (fail_on_recompile_limit_hit makes that an error here)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = module.GPT(module.GPTConfig(vocab_size=61, block_size=12, n_layer=2, n_head=4, n_embd=32, **options))
    graphs = []

    def counting_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    model.eval().forward = sample.compiled_forward(model, backend=counting_backend)
    with torch.no_grad(), torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        model.generate(torch.zeros(1, 1, dtype=torch.long), max_new_tokens=12 + 3)
    # the baseline and the encoder-decoder: one graph for T = 1, one for every longer T (dynamic);
    # future attention at most one more (pinned: tests/test_future_attn_kernels.py)
    assert len(graphs) == (3 if module is model_future_attn else 2)


# --------------------------------------------------------------------------------------
# what it refuses


def test_sample_refuses_missing_or_foreign_checkpoint(tmp_path, capsys):
    assert sample.main([f"--out_dir={tmp_path}", "--device=cpu"]) == 1
    assert f"no checkpoint at {tmp_path}/best.pt" in capsys.readouterr().err
    torch.save({"model_args": {}}, tmp_path / "ckpt.pt")
    assert sample.main([f"--out_dir={tmp_path}", "--device=cpu"]) == 1
    err = last_error(capsys).splitlines()
    assert err[0].startswith(f"note: {tmp_path} has no best.pt") and len(err) == 2
    assert err[1] == f"error: {tmp_path}/ckpt.pt is damaged, or not a checkpoint of this train.py: use a good copy, or train again"


def test_sample_refuses_a_checkpoint_with_flipped_bits(trained_runs, tmp_path, capsys):
    shutil.copytree(trained_runs["baseline"], tmp_path / "run")
    flip_bits(tmp_path / "run" / "best.pt")
    assert sample.main([f"--out_dir={tmp_path / 'run'}", "--device=cpu", "--max_new_tokens=2"]) == 1
    assert last_error(capsys) == (f"error: {tmp_path / 'run'}/best.pt is damaged, or not a checkpoint of this "
                                  "train.py: use a good copy, or train again\n")


def test_sample_without_a_tokenizer_is_one_error_line(trained_runs, monkeypatch, capsys):
    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(sample.tiktoken, "get_encoding", offline)
    assert sample.main([f"--out_dir={trained_runs['baseline']}", "--device=cpu"]) == 1
    err = last_error(capsys).splitlines()
    assert err[-1].startswith("error: cannot load the GPT-2 tokenizer (ConnectionError); offline, set TIKTOKEN_CACHE_DIR")
    assert err[:-1] == [line for line in err[:-1] if line.startswith("sampling from")]  # nothing else


@pytest.mark.parametrize("setting, message", [
    ("--temperature=0", "temperature must be > 0, got 0.0 (for greedy decoding use --top_k=1)"),
    ("--temperature=-1", "temperature must be > 0"),
    ("--top_k=-3", "top_k must be >= 0"),
    ("--num_samples=0", "num_samples must be at least 1"),
    ("--dtype=half", "dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got 'half'"),
    ("--seed=-1", "seed must be >= 0, got -1"),
    ("--device=gpu", "device='gpu' is not a device name"),
    ("--checkpoint=final", "checkpoint must be 'best' or 'latest', got 'final'"),
])
def test_sample_bad_setting_is_one_line(setting, message, tmp_path, capsys):
    assert sample.main([f"--out_dir={tmp_path}", setting]) == 2
    err = last_error(capsys)
    assert message in err and len(err.strip().splitlines()) == 1


def test_sample_prompt_file_must_be_utf8(tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes("Café au lait".encode("latin-1"))
    assert sample.main([f"--out_dir={tmp_path}", f"--start=FILE:{prompt}", "--device=cpu"]) == 2
    assert f"prompt file {prompt} is not UTF-8 text (byte 0xe9 at offset 3)" in last_error(capsys)


def test_a_setting_the_checkpoint_decides_says_so(capsys):
    # not "did you mean dtype?": sample.py has no model_type because the checkpoint names it
    assert sample.main(["--model_type=encdec"]) == 2
    assert last_error(capsys) == ("error: model_type is not a setting here: the checkpoint decides "
                                  "the model\n")
