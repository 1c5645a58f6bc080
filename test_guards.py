"""
Tests that nothing a user made is lost and that every mistake a user can make is one clear
message: train.py's out_dir guard and lock, its data checks and setting checks, sample.py's
settings, --help, and gradient accumulation. On a CPU, with the tiny models of test_train.py.
Run: python -m pytest -q test_guards.py
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import bench
import check_causal
import data
import sample
import settings
import train
from checkpoint import load_checkpoint
from test_train import REPO, TINY, VOCAB, config_for, flags, read_log

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def argv_for(data_dir, out_dir, **overrides):
    return flags(**{**TINY, "data_dir": data_dir, "out_dir": str(out_dir), **overrides})


def snapshot(out_dir):
    """Every file of out_dir, by name, with its bytes."""
    return {name: (out_dir / name).read_bytes() for name in sorted(os.listdir(out_dir))}


def last_error(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------------------------
# a run's folder


def test_new_run_refuses_a_folder_that_holds_a_run(data_dir, tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, max_iters=2, eval_interval=2)) == 0
    before = snapshot(out_dir)
    assert {"ckpt.pt", "best.pt", "log.jsonl"} <= set(before)
    capsys.readouterr()
    assert train.main(argv_for(data_dir, out_dir, max_iters=4)) == 1
    err = last_error(capsys)
    assert f"{out_dir} already holds a run (ckpt.pt, best.pt, log.jsonl)" in err
    assert "--init_from=resume" in err and "--overwrite=True" in err
    assert snapshot(out_dir) == before  # nothing deleted, nothing appended
    # --eval_only evaluates a saved run: without --init_from=resume it is a bad setting
    assert train.main(argv_for(data_dir, out_dir, max_iters=4, eval_only=True)) == 2
    assert "add --init_from=resume" in last_error(capsys)
    assert snapshot(out_dir) == before

    # a run killed before its first checkpoint leaves only its log: that is refused too, and
    # both ways out say that --overwrite=True starts it again
    for name in ("ckpt.pt", "best.pt"):
        os.remove(out_dir / name)
    for extra in ({}, {"init_from": "resume"}):
        assert train.main(argv_for(data_dir, out_dir, max_iters=4, **extra)) == 1
        err = last_error(capsys)
        assert "stopped before its first" in err and "again with --overwrite=True" in err

    # asked for explicitly, the old run is replaced by the new one
    assert train.main(argv_for(data_dir, out_dir, max_iters=3, eval_interval=3, overwrite=True)) == 0
    assert "overwrite=True: deleted log.jsonl" in capsys.readouterr().out
    records = read_log(out_dir)
    assert [r["type"] for r in records].count("start") == 1 and records[-1]["iter"] == 3


LOCK_HOLDER = """
import sys, time
import checkpoint
lock = checkpoint.claim_out_dir(dict(out_dir=sys.argv[1], init_from="resume", overwrite=False))
print("locked", flush=True)
time.sleep(120)
"""


def test_a_folder_in_use_is_refused_until_its_holder_dies(data_dir, tmp_path, capsys):
    out_dir = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out_dir)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert train.main(argv_for(data_dir, out_dir, max_iters=1)) == 1
        err = last_error(capsys)
        assert f"{out_dir} is in use by train.py (process {holder.pid} on" in err
        assert not os.path.exists(out_dir / "log.jsonl")
    finally:
        holder.send_signal(signal.SIGKILL)  # the harshest end: no cleanup code runs
        holder.wait()
    assert train.main(argv_for(data_dir, out_dir, max_iters=1)) == 0  # the kernel released the lock
    assert read_log(out_dir)[-1]["iter"] == 1


def test_out_dir_that_cannot_be_created(data_dir, tmp_path, capsys):
    (tmp_path / "a_file").write_text("not a folder")
    assert train.main(argv_for(data_dir, tmp_path / "a_file" / "out")) == 1
    assert f"cannot create out_dir {tmp_path}/a_file/out" in last_error(capsys)


def test_resume_after_a_record_cut_mid_write(data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"type": "train", "iter": 3, "lo')  # a kill -9 in the middle of a record
    assert train.main(argv_for(data_dir, tmp_path, max_iters=4, eval_interval=2, init_from="resume")) == 0
    assert "resumed from iteration 2" in capsys.readouterr().out
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    broken = [line for line in lines if not line.startswith("{") or not line.endswith("}")]
    assert broken == ['{"type": "train", "iter": 3, "lo']  # alone on its line; all others parse
    records = [json.loads(line) for line in lines if line not in broken]
    assert records[-1]["type"] == "eval" and records[-1]["iter"] == 4


def test_resume_at_max_iters_says_so(data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, init_from="resume")) == 0
    assert "is at iteration 2 and max_iters is 2: nothing to train" in capsys.readouterr().out
    assert snapshot(tmp_path) == before


def test_damaged_checkpoint_message_gives_no_unsafe_advice(data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    data = (tmp_path / "ckpt.pt").read_bytes()
    for damaged in (data[: len(data) // 2], os.urandom(2000)):  # cut short; random bytes
        (tmp_path / "ckpt.pt").write_bytes(damaged)
        assert train.main(argv_for(data_dir, tmp_path, max_iters=4, init_from="resume")) == 1
        err = last_error(capsys)
        assert "is not a checkpoint written by train.py, or it is damaged" in err
        assert "weights_only" not in err and len(err.strip().splitlines()) == 1


def test_non_finite_loss_at_the_first_step(data_dir, tmp_path, monkeypatch, capsys):
    module = settings.MODELS["baseline"]
    forward = module.GPT.forward

    def poisoned_forward(self, idx, targets=None):
        logits, loss, aux = forward(self, idx, targets)
        return logits, loss * float("nan") if self.training else loss, aux

    monkeypatch.setattr(module.GPT, "forward", poisoned_forward)
    assert train.main(argv_for(data_dir, tmp_path, max_iters=3)) == 1
    err = last_error(capsys)
    assert "iteration 1: non-finite loss" in err and f"{tmp_path}/ckpt.pt keeps the last saved state" in err
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 0  # the evaluation at 0 saved it


# --------------------------------------------------------------------------------------
# data


def write_data(path, train_tokens, val_tokens, meta=None):
    path.mkdir(exist_ok=True)
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        np.asarray(tokens, dtype=np.uint16).tofile(path / f"{split}.bin")
    if meta is not None:
        (path / "meta.json").write_text(json.dumps(meta))


def meta_of(path):
    """meta.json as prepare_wikipedia.py writes it for the .bin files in path."""
    meta = {}
    for split in ("train", "val"):
        tokens = np.fromfile(path / f"{split}.bin", dtype=np.uint16)
        meta[split] = dict(tokens=len(tokens), sha256=data.sha256_of(path / f"{split}.bin"),
                           max_token_id=int(tokens.max()))
    return meta


def test_data_is_checked_before_training(tmp_path, capsys):
    good = np.arange(100) % VOCAB
    data = tmp_path / "data"
    argv = argv_for(str(data), tmp_path / "out", max_iters=1)

    write_data(data, good, good)
    (data / "val.bin").write_bytes((data / "val.bin").read_bytes() + b"\x01")  # a half token
    assert train.main(argv) == 1
    assert f"{data}/val.bin has an odd number of bytes (201)" in last_error(capsys)

    beyond = good.copy()
    beyond[57] = VOCAB + 5
    write_data(data, beyond, good)  # no meta.json: the tokens are scanned
    assert train.main(argv) == 1
    assert f"{data}/train.bin holds token id {VOCAB + 5}, beyond vocab_size {VOCAB}" in last_error(capsys)
    write_data(data, good, good)
    meta = meta_of(data)
    meta["val"]["max_token_id"] = VOCAB  # a recorded range is trusted, not rescanned
    write_data(data, good, good, meta=meta)
    assert train.main(argv) == 1
    assert f"{data}/val.bin holds token id {VOCAB}, beyond vocab_size {VOCAB}" in last_error(capsys)

    # val.bin of another preparation: another length, or the same length and other tokens
    write_data(data, good, good)
    meta = meta_of(data)
    write_data(data, good, good[:-10], meta=meta)
    assert train.main(argv) == 1
    assert f"{data}/val.bin holds 90 tokens but {data}/meta.json records 100" in last_error(capsys)
    write_data(data, good, good[::-1], meta=meta)
    assert train.main(argv) == 1
    assert f"{data}/val.bin does not match the sha256 in {data}/meta.json" in last_error(capsys)
    (data / "meta.json").write_text('{"train": {"tok')
    assert train.main(argv) == 1
    assert f"{data}/meta.json cannot be read" in last_error(capsys)
    assert not os.path.exists(tmp_path / "out" / "log.jsonl")  # none of these started a run

    write_data(data, good, good[::-1], meta=meta_of(data))
    os.remove(data / "meta.json")
    assert train.main(argv) == 0
    assert "has no meta.json, so train.bin and val.bin cannot be checked" in capsys.readouterr().out


# --------------------------------------------------------------------------------------
# settings


@pytest.mark.parametrize("setting, message", [
    ("--learning_rate=0", "learning_rate must be > 0"),
    ("--learning_rate=-1e-3", "learning_rate must be > 0"),
    ("--beta1=1.0", "beta1 must be in [0, 1)"),
    ("--beta2=-0.1", "beta2 must be in [0, 1)"),
    ("--seed=-1", "seed must be >= 0"),
    ("--max_iters=-5", "max_iters must be >= 0"),
    ("--warmup_iters=700000", "warmup_iters (700000) must be below lr_decay_iters (700000)"),
    ("--min_lr=0.1", "min_lr (0.1) must not exceed learning_rate (0.001)"),
    ("--device=gpu", "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    pytest.param("--device=cuda", "this machine has no CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_bad_setting_is_one_line(setting, message, data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, lr_decay_iters=700000) + [setting]) == 2
    err = last_error(capsys)
    assert message in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "log.jsonl")


def test_warmup_as_long_as_decay_fails_before_training_not_after(data_dir, tmp_path, capsys):
    # it used to divide by zero once training reached lr_decay_iters
    argv = argv_for(data_dir, tmp_path, warmup_iters=3, lr_decay_iters=3, max_iters=5)
    assert train.main(argv) == 2
    assert "warmup_iters (3) must be below lr_decay_iters (3)" in last_error(capsys)
    assert train.main(argv + ["--decay_lr=False"]) == 0


def test_gpu_config_on_a_cpu_says_it_will_be_slow(capsys):
    for path, slow in (("config/baseline.py", True), ("config/tiny_cpu.py", False)):
        config = settings.get_config([os.path.join(REPO, path), "--device=cpu", "--compile=False"])
        module = settings.MODELS[config["model_type"]]
        with torch.device("meta"):  # the FLOP count needs the shapes only
            model = module.GPT(module.GPTConfig(**settings.model_args_of(config)))
        tokens_per_iter = config["gradient_accumulation_steps"] * config["batch_size"] * config["block_size"]
        settings.warn_if_slow_on_cpu(config, model.flops_per_token() * tokens_per_iter)
        out = capsys.readouterr().out
        assert ("this config is sized for a GPU: 17 TFLOP per optimizer step" in out) == slow, out
        assert ("use config/tiny_cpu.py" in out) == slow


@pytest.mark.parametrize("main, doc_line, key", [
    (train.main, "Trains one of the three models", "--learning_rate=0.0009"),
    (sample.main, "Samples text from a model", "--max_new_tokens=200"),
    (bench.main, "Times one training step", "--iters=20"),
    (check_causal.main, "Checks that a model cannot see the future", "--probe_steps=0"),
])
def test_help_prints_usage_and_keys(main, doc_line, key, capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert doc_line in out and key in out


def test_train_help_shows_the_values_a_config_gives(capsys):
    assert train.main([os.path.join(REPO, "config/future50_mse.py"), "--max_iters=7", "-h"]) == 0
    out = capsys.readouterr().out
    assert "--future_dim=50" in out and "--max_iters=7" in out and "--model_type='future_attn'" in out


@pytest.mark.parametrize("setting, message", [
    ("--temperature=0", "temperature must be > 0, got 0.0 (for greedy decoding use --top_k=1)"),
    ("--temperature=-1", "temperature must be > 0"),
    ("--top_k=-3", "top_k must be >= 0"),
    ("--num_samples=0", "num_samples must be at least 1"),
    ("--dtype=half", "dtype must be one of"),
    ("--device=gpu", "device must be 'cpu', 'cuda' or 'cuda:N'"),
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


# --------------------------------------------------------------------------------------
# gradient accumulation


@pytest.mark.parametrize("model_type", ["baseline", "future_attn", "encdec"])
def test_accumulated_micro_steps_equal_one_large_batch(model_type, data_dir, tmp_path):
    """k micro-steps of batch B give the gradients of one step of batch k·B (the mean loss).

    One optimizer step from the same initial weights; AdamW's first moment after it is
    (1 - beta1) · gradient, read back from the checkpoint. torch.randint draws two batches of
    4 exactly as it draws one batch of 8, so both runs see the same 8 sequences."""
    settings = dict(model_type=model_type, max_iters=1, eval_interval=1)
    for name, batch_size, accum in (("split", 4, 2), ("whole", 8, 1)):
        train.train(config_for(data_dir, tmp_path / name, batch_size=batch_size,
                               gradient_accumulation_steps=accum, **settings))
    split, whole = (load_checkpoint(tmp_path / name / "ckpt.pt")["optimizer"]["state"] for name in ("split", "whole"))
    assert split.keys() == whole.keys()
    for index in split:
        torch.testing.assert_close(split[index]["exp_avg"], whole[index]["exp_avg"], rtol=1e-4, atol=1e-9)
    # and the check can fail: a different batch gives different gradients
    train.train(config_for(data_dir, tmp_path / "other", batch_size=8, seed=7, **settings))
    other = load_checkpoint(tmp_path / "other" / "ckpt.pt")["optimizer"]["state"]
    assert not torch.allclose(other[0]["exp_avg"], whole[0]["exp_avg"], rtol=1e-4, atol=1e-9)
