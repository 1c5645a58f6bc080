"""
Tests of train.py, on a CPU with tiny models on random tokens (conftest.py): a run trains, logs
and saves; resume reproduces an unbroken run; signals stop after the step with the state saved;
the out_dir guard and lock; --eval_only; non-finite losses and diverging runs; damaged
checkpoints; the identity of the data; what a GPU would wait on (host reads of device values)
and logits kept across micro-steps; gradient accumulation and DDP.
Run: python -m pytest -q tests/test_train.py
"""

import collections
import contextlib
import errno
import fcntl
import hashlib
import itertools
import importlib.machinery
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import termios
import time
import types
import weakref

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import model_baseline
import model_encdec
import model_future_attn
import report
import train
from configurator import UserError
from train import TRAINING_KEYS, load_checkpoint, model_from_checkpoint
from conftest import (DATA_VOCAB, ENV, REPO, TINY, argv_for, config_for, flags, flip_bits, last_error, line_reader,
                      next_line_with, read_log, start, tiny, trained_to, wait_for)

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

AUX_KEY = {"baseline": None, "future_attn": "future_attn_loss", "encdec": "embedding_loss"}
# long enough to be signalled mid-run: 150 steps of a few ms; evaluations of 20 batches
RUN = dict(TINY, max_iters=150, eval_interval=50, eval_iters=20)
Usage = collections.namedtuple("Usage", "total used free")  # as shutil.disk_usage returns it


def run_argv(data_dir, out_dir, **overrides):
    """The flags of a RUN, long enough to be signalled mid-run."""
    return flags(**{**RUN, "data_dir": data_dir, "out_dir": str(out_dir), **overrides})


# --------------------------------------------------------------------------------------
# batches


def test_batches_are_shifted_windows(data_dir):
    generator = torch.Generator().manual_seed(0)
    x, y = train.get_batch(data_dir, "train", generator, batch_size=3, block_size=16, device="cpu")
    tokens = np.fromfile(os.path.join(data_dir, "train.bin"), dtype=np.uint16).astype(np.int64)
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    windows = np.lib.stride_tricks.sliding_window_view(tokens, 16)  # (N - 15, 16)
    starts = np.flatnonzero((windows == x[0].numpy()).all(axis=1))  # where x[0] comes from
    assert any(np.array_equal(tokens[i + 1:i + 17], y[0].numpy()) for i in starts)


# --------------------------------------------------------------------------------------
# the learning rate


def test_lr_schedule():
    config = dict(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110, decay_lr=True)
    assert train.get_lr(0, config) == pytest.approx(1 / 11)
    assert train.get_lr(9, config) == pytest.approx(10 / 11)
    assert train.get_lr(10, config) == pytest.approx(1.0)
    assert train.get_lr(60, config) == pytest.approx(0.55)  # half way down the cosine
    assert train.get_lr(110, config) == pytest.approx(0.1) and train.get_lr(500, config) == 0.1
    assert train.get_lr(60, dict(config, decay_lr=False)) == 1.0


# --------------------------------------------------------------------------------------
# training runs


@pytest.mark.parametrize("model_type", ["baseline", "future_attn", "encdec"])
def test_each_model_trains_logs_and_saves(model_type, data_dir, tmp_path):
    result = train.train(config_for(data_dir, tmp_path, model_type=model_type, max_iters=4, eval_interval=2))
    assert result["iter_num"] == 4
    records = read_log(tmp_path)
    start = records[0]
    assert start["type"] == "start" and start["model_type"] == model_type and start["world_size"] == 1
    assert start["num_params"] == result["model"].get_num_params()
    assert start["tokens_per_iter"] == 2 * 4 * 16 and start["config"]["batch_size"] == 4
    trains = [r for r in records if r["type"] == "train"]
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["iter"] for r in trains] == [1, 2, 3, 4] and [r["iter"] for r in evals] == [0, 2, 4]
    for r in trains:
        assert np.isfinite(r["loss"]) and r["ms_per_iter"] > 0 and r["tokens_per_s"] > 0 and r["mfu"] is None
        expected_aux = [AUX_KEY[model_type]] if AUX_KEY[model_type] else []
        if model_type == "future_attn":  # and the loss of each future-attention layer (2 here)
            expected_aux.append("future_attn_loss_per_layer")
            per_layer = r["aux"]["future_attn_loss_per_layer"]
            assert len(per_layer) == 2 and np.mean(per_layer) == pytest.approx(r["aux"]["future_attn_loss"])
        assert list(r["aux"]) == expected_aux and all(np.isfinite(v).all() for v in r["aux"].values())
    assert all(np.isfinite(r["val_loss"]) and np.isfinite(r["train_loss"]) for r in evals)
    checkpoint = load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))
    assert checkpoint["iter_num"] == 4 and checkpoint["model_type"] == model_type
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in checkpoint["model"])
    restored = model_from_checkpoint(checkpoint)
    for name, p in result["model"].state_dict().items():
        assert torch.equal(p, restored.state_dict()[name])


def test_a_resume_names_the_settings_that_differ_and_holds_no_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "run"
    assert train.main(run_argv(data_dir, out_dir, max_iters=2, eval_interval=2)) == 0
    loaded, alive = [], []  # weak references to the model tensors of each checkpoint read

    def load_traced(*args, load_checkpoint=train.load_checkpoint, **kwargs):
        checkpoint = load_checkpoint(*args, **kwargs)
        loaded.extend(weakref.ref(t) for t in checkpoint["model"].values())
        return checkpoint

    def step(*args, forward_backward=train.forward_backward):
        alive.append(sum(ref() is not None for ref in loaded))
        return forward_backward(*args)

    monkeypatch.setattr(train, "load_checkpoint", load_traced)
    monkeypatch.setattr(train, "forward_backward", step)
    capsys.readouterr()
    argv = run_argv(data_dir, out_dir, max_iters=4, eval_interval=2, batch_size=8, init_from="resume")
    assert train.main(argv) == 0
    # a forgotten or mistyped flag shows, in one line
    assert "settings other than the checkpoint's: batch_size 4 -> 8, max_iters 2 -> 4\n" in capsys.readouterr().out
    # the weights are in the model: the checkpoint is not held through the run (host memory)
    assert loaded and alive == [0, 0]


def test_a_temporary_file_of_a_killed_write_is_removed_by_the_next_run(data_dir, tmp_path):
    # a process killed (SIGKILL, a lost node) while it wrote ckpt.pt leaves ckpt.pt.tmp behind
    out_dir = tmp_path / "run"
    argv = run_argv(data_dir, out_dir, max_iters=2, eval_interval=2)
    assert train.main(argv) == 0
    (out_dir / "ckpt.pt.tmp").write_bytes(b"half a checkpoint")
    assert train.main(argv + ["--init_from=resume", "--max_iters=3"]) == 0
    assert sorted(os.listdir(out_dir)) == ["best.pt", "ckpt.pt", "log.jsonl"]  # the lock is gone with the run


def test_a_run_says_how_it_ended(data_dir, tmp_path, capsys):
    out_dir = tmp_path / "run"
    argv = run_argv(data_dir, out_dir, max_iters=2, eval_interval=2)
    assert train.main(argv) == 0
    best = min(r["val_loss"] for r in read_log(out_dir) if r["type"] == "eval")
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"trained to iteration 2: best val loss {best:.4f}, its model in {out_dir}/best.pt"
    assert "never reaches its peak" not in out  # TINY's warmup_iters is 2
    # a resume of a finished run does nothing, and says how to train on
    assert train.main(argv + ["--init_from=resume"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"nothing to train: {out_dir}/ckpt.pt is at iteration 2, max_iters; to train on, resume with a larger "
        "--max_iters")
    assert train.main(run_argv(data_dir, tmp_path / "short", max_iters=1, warmup_iters=5)) == 0
    assert ("note: max_iters 1 is below warmup_iters 5: the learning rate never reaches its peak\n"
            in capsys.readouterr().out)


def test_resume_reproduces_an_unbroken_run(data_dir, tmp_path):
    # dropout makes the losses depend on the torch RNG; 4 is no eval step, so the stopped
    # run's final evaluation must not move the training batches either
    settings = dict(model_type="future_attn", dropout=0.1, eval_interval=3)
    straight = train.train(config_for(data_dir, tmp_path / "a", max_iters=8, **settings))
    train.train(config_for(data_dir, tmp_path / "b", max_iters=4, **settings))
    resumed = train.train(config_for(data_dir, tmp_path / "b", max_iters=8, init_from="resume", **settings))
    assert resumed["iter_num"] == 8

    def after_4(records):
        return [(r["type"], r["iter"], r.get("loss"), r.get("aux"), r.get("val_loss"))
                for r in records if r["type"] != "start" and r["iter"] > 4]

    a, b = after_4(read_log(tmp_path / "a")), after_4(read_log(tmp_path / "b"))
    assert len(a) == 6 and a == b  # train 5..8 and evals at 6 and 8: the same numbers
    for name, p in straight["model"].state_dict().items():
        assert torch.equal(p, resumed["model"].state_dict()[name])


def test_resume_checks_the_model(trained_runs, data_dir, capsys):
    out_dir = trained_runs["baseline"]
    base = dict(max_iters=5, eval_interval=2, init_from="resume", vocab_size=50257)
    assert train.main(flags(**{**TINY, **base, "data_dir": data_dir, "out_dir": out_dir, "model_type": "encdec"})) == 1
    assert "the checkpoint holds another model (model_type 'baseline')" in capsys.readouterr().err
    assert train.main(flags(**{**TINY, **base, "data_dir": data_dir, "out_dir": out_dir, "n_layer": 3})) == 1
    err = capsys.readouterr().err
    assert "the checkpoint holds another model (n_layer 2)" in err and "Traceback" not in err


def test_foreign_or_missing_checkpoint_is_refused(data_dir, tmp_path, capsys):
    config = flags(**{**TINY, "data_dir": data_dir, "out_dir": str(tmp_path), "init_from": "resume"})
    assert train.main(config) == 1
    assert f"no checkpoint at {tmp_path}/ckpt.pt" in capsys.readouterr().err
    torch.save({"model": {}, "iter_num": 3}, tmp_path / "ckpt.pt")  # e.g. another trainer's file
    assert train.main(config) == 1
    assert "is damaged, or not a checkpoint of this train.py" in capsys.readouterr().err
    (tmp_path / "ckpt.pt").write_text("hello")
    assert train.main(config) == 1
    assert "is damaged, or not a checkpoint of this train.py" in capsys.readouterr().err
    saved = load_checkpoint(trained_ckpt(data_dir, tmp_path / "run"))
    del saved["optimizer"]  # best.pt, say, which holds the model alone
    torch.save(saved, tmp_path / "ckpt.pt")
    assert train.main(config) == 1
    assert f"{tmp_path}/ckpt.pt lacks optimizer: it is not a training state" in capsys.readouterr().err


def trained_ckpt(data_dir, out_dir):
    assert train.main(argv_for(data_dir, out_dir, max_iters=2, eval_interval=2)) == 0
    return out_dir / "ckpt.pt"


def test_damaged_checkpoint_message_gives_no_unsafe_advice(data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    data = (tmp_path / "ckpt.pt").read_bytes()
    for damaged in (data[: len(data) // 2], os.urandom(2000)):  # cut short; random bytes
        (tmp_path / "ckpt.pt").write_bytes(damaged)
        assert train.main(argv_for(data_dir, tmp_path, max_iters=4, init_from="resume")) == 1
        err = last_error(capsys)
        assert "is damaged, or not a checkpoint of this train.py: use a good copy" in err
        assert "weights_only" not in err and len(err.strip().splitlines()) == 1


def test_flipped_bits_in_a_checkpoint_are_refused_on_resume(data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    flip_bits(tmp_path / "ckpt.pt")
    before = (tmp_path / "ckpt.pt").read_bytes()
    torch.load(tmp_path / "ckpt.pt", weights_only=True)  # torch alone does not see the damage
    assert train.main(argv_for(data_dir, tmp_path, max_iters=4, init_from="resume")) == 1
    err = last_error(capsys)
    assert err == (f"error: {tmp_path}/ckpt.pt is damaged, or not a checkpoint of this train.py: use a "
                   "good copy, or train again\n")
    assert (tmp_path / "ckpt.pt").read_bytes() == before and max(r.get("iter", 0) for r in read_log(tmp_path)) == 2


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


def test_resume_at_max_iters_says_so_and_trains_nothing(data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, init_from="resume")) == 0
    assert "resumed from iteration 2 of 2\n" in capsys.readouterr().out
    after = snapshot(tmp_path)
    assert {name: after[name] for name in ("ckpt.pt", "best.pt")} == {
        name: before[name] for name in ("ckpt.pt", "best.pt")}
    assert [r["type"] for r in read_log(tmp_path)][-2:] == ["eval", "start"]  # no step, no evaluation


def data_copy(data_dir, path, val_seed=None):
    """A copy of the data folder; with val_seed, its val.bin holds other tokens."""
    shutil.copytree(data_dir, path)
    if val_seed is not None:
        np.random.default_rng(val_seed).integers(0, 256, 1000).astype(np.uint16).tofile(path / "val.bin")
    return str(path)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_a_run_records_its_data_and_resumes_only_on_it(data_dir, tmp_path, capsys):
    ours, other = data_copy(data_dir, tmp_path / "ours"), data_copy(data_dir, tmp_path / "other", val_seed=1)
    out = tmp_path / "out"
    assert train.main(argv_for(ours, out, max_iters=2, eval_interval=2)) == 0
    identity = {"data_dir": ours, "train_sha256": sha256(f"{ours}/train.bin"), "val_sha256": sha256(f"{ours}/val.bin")}
    assert read_log(out)[0]["data"] == identity
    assert load_checkpoint(out / "ckpt.pt")["data"] == load_checkpoint(out / "best.pt")["data"] == identity
    best_before = (out / "best.pt").read_bytes()

    # other val data, in another folder, or prepared again into the same folder: refused
    capsys.readouterr()
    assert train.main(argv_for(other, out, max_iters=4, eval_interval=2, init_from="resume")) == 1
    err = last_error(capsys)
    assert err == (f"error: cannot resume: {out}/ckpt.pt trained on other data ({ours}, sha256 train "
                   f"{identity['train_sha256'][:12]}, val {identity['val_sha256'][:12]}): resume on that data, "
                   "or start a new run\n")
    shutil.copy(f"{other}/val.bin", f"{ours}/val.bin")
    assert train.main(argv_for(ours, out, max_iters=4, eval_interval=2, init_from="resume")) == 1
    assert "cannot resume" in last_error(capsys)
    assert (out / "best.pt").read_bytes() == best_before and max(r.get("iter", 0) for r in read_log(out)) == 2

    # the same data in another folder (moved, or copied to a faster disk) is the same data
    shutil.copy(f"{data_dir}/val.bin", f"{ours}/val.bin")
    moved = data_copy(data_dir, tmp_path / "moved")
    assert train.main(argv_for(moved, out, max_iters=4, eval_interval=2, init_from="resume")) == 0
    assert read_log(out)[-1]["iter"] == 4


def test_data_rewritten_during_a_run_stops_it_at_the_next_evaluation(data_dir, tmp_path, monkeypatch, capsys):
    ours = data_copy(data_dir, tmp_path / "data")
    get_batch, calls = train.get_batch, []

    def rewriting_get_batch(folder, split, *args, **kwargs):  # val.bin written by hand at the first step
        calls.append(split)
        if calls.count("train") == 1 and split == "train":
            np.random.default_rng(1).integers(0, 256, 1000).astype(np.uint16).tofile(f"{ours}/val.bin")
        return get_batch(folder, split, *args, **kwargs)

    monkeypatch.setattr(train, "get_batch", rewriting_get_batch)
    assert train.main(argv_for(ours, tmp_path / "out", max_iters=4, eval_interval=2)) == 1
    err = last_error(capsys)
    assert err.startswith(f"error: the data in {ours} changed during the run") and err.count("\n") == 1
    assert load_checkpoint(tmp_path / "out" / "ckpt.pt")["iter_num"] == 0  # nothing saved after the change


def test_a_run_saved_before_a_model_field_existed_resumes(data_dir, tmp_path):
    # a checkpoint and log written before future_kv existed: it takes its default, 'learned'
    train.train(config_for(data_dir, tmp_path, model_type="future_attn", max_iters=2, eval_interval=2))
    saved = load_checkpoint(str(tmp_path / "ckpt.pt"), TRAINING_KEYS)
    del saved["model_args"]["future_kv"]
    torch.save(saved, tmp_path / "ckpt.pt")
    result = train.train(config_for(data_dir, tmp_path, model_type="future_attn", max_iters=4, eval_interval=2,
                                    init_from="resume"))
    assert result["iter_num"] == 4
    start = read_log(tmp_path)[0]
    del start["model_args"]["future_kv"]
    assert train.saved_model_args("future_attn", start["model_args"]) == \
        json.loads(json.dumps(train.model_args_of(start["config"])))
    # the setting it lacks must still be the default: another value is a change of model
    with pytest.raises(UserError, match=r"another model \(future_kv 'learned'\)"):
        train.train(config_for(data_dir, tmp_path, model_type="future_attn", future_kv="computed", max_iters=6,
                               init_from="resume"))


# --------------------------------------------------------------------------------------
# a run's folder: one run per folder, nothing a user made lost


def snapshot(out_dir):
    """Every file of out_dir, by name, with its bytes."""
    return {name: (out_dir / name).read_bytes() for name in sorted(os.listdir(out_dir))}


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

    # a launch that saved nothing leaves only its log: there is nothing to resume, and a new run
    # adds its records to that log
    for name in ("ckpt.pt", "best.pt"):
        os.remove(out_dir / name)
    assert train.main(argv_for(data_dir, out_dir, max_iters=4, init_from="resume")) == 1
    assert f"no checkpoint at {out_dir}/ckpt.pt" in last_error(capsys)
    assert train.main(argv_for(data_dir, out_dir, max_iters=1)) == 0
    assert [r["type"] for r in read_log(out_dir)].count("start") == 2

    # asked for explicitly, the old run is replaced by the new one
    assert train.main(argv_for(data_dir, out_dir, max_iters=3, eval_interval=3, overwrite=True)) == 0
    assert "overwrite=True: deleted ckpt.pt, best.pt, log.jsonl" in capsys.readouterr().out
    records = read_log(out_dir)
    assert [r["type"] for r in records].count("start") == 1 and records[-1]["iter"] == 3


LOCK_HOLDER = """
import sys, time
import train
with train.claim_out_dir(dict(out_dir=sys.argv[1], init_from="resume", overwrite=False)):
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
    assert last_error(capsys) == f"error: cannot create {tmp_path}/a_file/out: not a directory; choose another folder\n"


def test_a_failed_resume_leaves_nothing_behind(data_dir, tmp_path, capsys):
    # a folder that does not exist: refused, and neither it nor its lock file is created
    out_dir = tmp_path / "new" / "run"
    assert train.main(argv_for(data_dir, out_dir, init_from="resume")) == 1
    assert f"no checkpoint at {out_dir}/ckpt.pt" in last_error(capsys)
    assert os.listdir(tmp_path) == []
    # a folder of a launch that saved nothing: refused, the folder as it was
    out_dir.mkdir(parents=True)
    (out_dir / "log.jsonl").write_text('{"type": "start"}\n')
    assert train.main(argv_for(data_dir, out_dir, init_from="resume")) == 1
    assert f"no checkpoint at {out_dir}/ckpt.pt" in last_error(capsys)
    assert os.listdir(out_dir) == ["log.jsonl"]


def test_wandb_gets_the_records_that_the_log_gets(data_dir, tmp_path, monkeypatch):
    calls = []
    wandb = types.ModuleType("wandb")  # a stand-in: what train.py hands to wandb
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.init = lambda **kwargs: calls.append(("init", kwargs))
    wandb.log = lambda numbers: calls.append(("log", numbers))
    wandb.finish = lambda: calls.append(("finish", None))
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2, wandb_log=True,
                               wandb_run_name="tiny")) == 0
    (first, init), *logged, last = calls
    assert first == "init" and init["name"] == "tiny" and init["config"]["max_iters"] == 2
    assert last == ("finish", None)
    records = [r for r in read_log(tmp_path) if r["type"] != "start"]
    assert [numbers for _, numbers in logged][1:] == [  # the start record first, then each record's numbers
        {f"{r['type']}/{name}": value for name, value in train.leaves(r) if name != "time"} | {
            f"{r['type']}/time": r["time"]} for r in records]


def test_missing_wandb_writes_nothing(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails
    out_dir = tmp_path / "run"
    assert train.main(run_argv(data_dir, out_dir, wandb_log=True)) == 2
    assert "wandb_log=True needs wandb" in capsys.readouterr().err
    assert not out_dir.exists()  # so the corrected command is not refused
    assert train.main(run_argv(data_dir, out_dir, max_iters=2)) == 0


# --------------------------------------------------------------------------------------
# what is saved when


def test_an_overfitting_run_resumes_from_its_latest_evaluation_not_its_best(data_dir, tmp_path, monkeypatch):
    # val improves until iteration 2, then worsens: best.pt stays at 2, ckpt.pt follows training
    val_at = {0: 5.0, 2: 4.0, 4: 4.5, 6: 4.8, 8: 5.1}
    estimate = train.estimate_loss
    iteration = iter(sorted(val_at))

    def overfitting(*args, **kwargs):
        losses = estimate(*args, **kwargs)
        return dict(losses, val_loss=val_at[next(iteration)])

    monkeypatch.setattr(train, "estimate_loss", overfitting)
    out_dir = tmp_path / "run"
    assert train.main(run_argv(data_dir, out_dir, max_iters=6, eval_interval=2)) == 0
    best, latest = load_checkpoint(str(out_dir / "best.pt")), load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)
    assert best["iter_num"] == 2 and best["best_val_loss"] == 4.0
    assert latest["iter_num"] == 6 and latest["best_val_loss"] == 4.0
    assert set(os.listdir(out_dir)) == {"ckpt.pt", "best.pt", "log.jsonl"}  # two checkpoints at most
    assert "optimizer" not in best  # the model only
    for name, p in best["model"].items():  # best.pt is not the latest model
        if not torch.equal(p, latest["model"][name]):
            break
    else:
        pytest.fail("best.pt holds the latest model")
    assert train.main(run_argv(data_dir, out_dir, max_iters=8, eval_interval=2, init_from="resume")) == 0
    assert [r["iter_num"] for r in read_log(out_dir) if r["type"] == "start"] == [0, 6]


def test_the_free_space_a_save_needs_counts_the_tied_weights_once(data_dir, tmp_path, monkeypatch):
    # the token embedding and the output head share one tensor: the space asked for before a save
    # is at most what torch.save writes, not that plus a second copy of the embedding
    write_atomically, asked = train.write_atomically, {}

    def recorded(path, write, size=0):
        asked[os.path.basename(path)] = size
        return write_atomically(path, write, size)

    monkeypatch.setattr(train, "write_atomically", recorded)
    assert train.main(argv_for(data_dir, tmp_path, max_iters=1, eval_interval=1)) == 0
    for name in ("ckpt.pt", "best.pt"):
        written = os.path.getsize(tmp_path / name)
        assert 0.8 * written < asked[name] <= written, (name, asked[name], written)


def test_out_of_memory_is_one_line_and_leaves_no_run_in_out_dir(data_dir, tmp_path, monkeypatch, capsys):
    # a model too large for the memory fails at its first forward, the evaluation at iteration 0:
    # one line that says what to change, and no checkpoint that the next run would refuse
    module = train.MODELS["baseline"]
    forward = module.GPT.forward

    def too_large(self, idx, targets=None):
        torch.empty(10**13)  # 40 TB: the allocator refuses, as it does for --block_size=100000
        return forward(self, idx, targets)

    monkeypatch.setattr(module.GPT, "forward", too_large)
    out_dir = tmp_path / "run"
    assert train.main(argv_for(data_dir, out_dir, max_iters=3)) == 1
    err = last_error(capsys)
    assert err == ("error: out of memory: 4 sequences of 16 tokens do not fit on cpu; lower "
                   "--batch_size or --block_size\n")
    assert not {"ckpt.pt", "best.pt"} & set(os.listdir(out_dir))
    monkeypatch.setattr(module.GPT, "forward", forward)
    assert train.main(argv_for(data_dir, out_dir, max_iters=3)) == 0  # no --overwrite needed


def test_a_closed_pipe_stops_the_run_with_its_state_saved(data_dir, tmp_path):
    # `python train.py ... | head`: once head has its lines, the run stops after the step under way,
    # saved, as after a signal (SIGPIPE), instead of dying in a traceback at its next print
    out_dir = tmp_path / "run"
    process = start(run_argv(data_dir, out_dir, max_iters=100_000, eval_interval=100_000))
    try:
        for line in process.stdout:
            if line.startswith("iter 5:"):
                break
        process.stdout.close()  # what head does after its lines
        err = process.stderr.read()
        assert process.wait(timeout=60) == 128 + signal.SIGPIPE
    finally:
        process.kill()
        process.wait()
    assert "Traceback" not in err and err.startswith("SIGPIPE: stopping after the step under way, with its state "
                                                     "saved; a second signal stops at once\n")
    stopped_at = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert f"stopped by SIGPIPE after iteration {stopped_at}: {out_dir}/ckpt.pt holds iteration {stopped_at}" in err
    assert stopped_at > 5
    assert max(r["iter"] for r in read_log(out_dir) if r["type"] == "train") == stopped_at  # no step lost


@pytest.mark.parametrize("lines, stderr_too", [(2, False), (6, True)])
def test_a_run_read_through_head_saves_its_state(lines, stderr_too, data_dir, tmp_path):
    # `train.py ... | head -2` and `train.py ... 2>&1 | head -6`, through a real shell pipe: head
    # leaves after the first evaluation's line, or mid-run with stderr in the same pipe, where no
    # message can be read; the state of the last step is saved all the same
    out_dir = tmp_path / "run"
    command = " ".join(["exec", sys.executable, "train.py", *run_argv(data_dir, out_dir, max_iters=100_000,
                                                                      eval_interval=100_000)])
    redirect = " 2>&1" if stderr_too else " 2>/dev/null"
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {command}{redirect} | head -{lines}"], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGPIPE and len(done.stdout.splitlines()) == lines
    assert "Traceback" not in done.stdout + done.stderr
    stopped_at = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert stopped_at >= 1 and max(r["iter"] for r in read_log(out_dir) if r["type"] == "train") == stopped_at


def test_a_full_disk_leaves_the_previous_checkpoint_and_no_temporary_file(data_dir, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "run"
    assert train.main(run_argv(data_dir, out_dir, max_iters=2, eval_interval=2)) == 0
    before = {name: (out_dir / name).read_bytes() for name in ("ckpt.pt", "best.pt")}
    save = torch.save

    def disk_full(obj, f):  # part of the file, then the disk is full
        save(obj, f)
        f.truncate(100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(train.torch, "save", disk_full)
    assert train.main(run_argv(data_dir, out_dir, max_iters=4, eval_interval=2, init_from="resume")) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"error: cannot write {out_dir}/" in err and "no space left on device (" in err
    assert "MB free); make space, or write elsewhere" in err
    assert {name: (out_dir / name).read_bytes() for name in before} == before
    assert not [name for name in os.listdir(out_dir) if name.endswith(".tmp")]

    # torch.save itself reports a full disk as a RuntimeError without errno: the free space tells
    def torch_full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    def disk_usage(path):  # the disk full
        return Usage(total=10**9, used=10**9, free=1000)

    monkeypatch.setattr(train.torch, "save", torch_full)
    monkeypatch.setattr(train.shutil, "disk_usage", disk_usage)
    assert train.main(run_argv(data_dir, out_dir, max_iters=4, eval_interval=2, init_from="resume")) == 1
    err = capsys.readouterr().err
    assert "no space left on device (0.0 MB free)" in err
    assert {name: (out_dir / name).read_bytes() for name in before} == before


def test_eval_only_is_kept_apart_from_the_run(data_dir, tmp_path, capsys):
    out_dir = tmp_path / "run"
    assert train.main(run_argv(data_dir, out_dir, max_iters=4, eval_interval=2)) == 0
    before = report.summarize(str(out_dir), *report.read_log(str(out_dir)))[0]
    other_data = tmp_path / "other"
    other_data.mkdir()
    rng = np.random.default_rng(5)
    for split in ("train", "val"):  # another text: other numbers
        rng.integers(0, 64, 2000).astype(np.uint16).tofile(other_data / f"{split}.bin")
    capsys.readouterr()
    assert train.main(run_argv(str(other_data), out_dir, max_iters=4, eval_iters=3, eval_only=True,
                               init_from="resume")) == 0
    out = capsys.readouterr().out
    assert f"evaluation only, of iteration 4 on {other_data}: train loss " in out
    record = read_log(out_dir)[-1]
    assert record["type"] == "eval_only" and record["data_dir"] == str(other_data)
    assert [r["type"] for r in read_log(out_dir)].count("start") == 1  # no launch of the run's
    row, _, notes = report.summarize(str(out_dir), *report.read_log(str(out_dir)))
    assert row == before  # the run's losses, best val and wall time: unchanged
    assert f"evaluated with --eval_only (not the run's numbers) at iter 4 on {other_data}" in notes[0]


# --------------------------------------------------------------------------------------
# non-finite losses


@pytest.mark.parametrize("model_type, poisoned", [("baseline", "loss"), ("future_attn", "future_attn_loss")])
def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(model_type, poisoned, data_dir, tmp_path,
                                                             monkeypatch, capsys):
    module = train.MODELS[model_type]
    forward, calls = module.GPT.forward, []

    def poisoned_forward(self, idx, targets=None):
        logits, loss, aux = forward(self, idx, targets)
        if self.training:
            calls.append(1)
            if len(calls) > 6:  # micro-steps 7 and on: iteration 4 with 2 micro-steps each
                if poisoned == "loss":
                    loss = loss * float("nan")
                else:
                    aux = dict(aux, future_attn_loss=aux["future_attn_loss"] * float("inf"))
        return logits, loss, aux

    monkeypatch.setattr(module.GPT, "forward", poisoned_forward)
    argv = flags(**{**TINY, "data_dir": data_dir, "out_dir": str(tmp_path), "model_type": model_type,
                    "max_iters": 6, "eval_interval": 2})
    assert train.main(argv) == 1
    err = capsys.readouterr().err
    assert f"iteration 4: non-finite {poisoned}" in err and "Traceback" not in err
    checkpoint = load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))
    assert checkpoint["iter_num"] == 2  # saved at the eval of step 2, never after
    assert all(torch.isfinite(p).all() for p in checkpoint["model"].values())
    assert max(r.get("iter", 0) for r in read_log(tmp_path)) == 3


def test_non_finite_loss_at_the_first_step(data_dir, tmp_path, monkeypatch, capsys):
    module = train.MODELS["baseline"]
    forward = module.GPT.forward

    def poisoned_forward(self, idx, targets=None):
        logits, loss, aux = forward(self, idx, targets)
        return logits, loss * float("nan") if self.training else loss, aux

    monkeypatch.setattr(module.GPT, "forward", poisoned_forward)
    assert train.main(argv_for(data_dir, tmp_path, max_iters=3)) == 1
    err = last_error(capsys)
    assert "iteration 1: non-finite loss" in err and f"{tmp_path}/ckpt.pt holds iteration 0," in err
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 0  # the evaluation at 0 saved it


def test_fp16_leaves_an_overflowing_step_to_the_gradient_scaler(data_dir, tmp_path, monkeypatch):
    module = train.MODELS["baseline"]
    forward, calls = module.GPT.forward, []

    def overflowing_forward(self, idx, targets=None):  # iteration 2's loss, finite, overflows once scaled
        logits, loss, aux = forward(self, idx, targets)
        if self.training:
            calls.append(1)
        return logits, loss * 1e36 if self.training and len(calls) in (3, 4) else loss, aux

    monkeypatch.setattr(module.GPT, "forward", overflowing_forward)
    assert train.main(argv_for(data_dir, tmp_path, dtype="float16", max_iters=4, eval_interval=4)) == 0
    saved = load_checkpoint(tmp_path / "ckpt.pt", TRAINING_KEYS)
    assert saved["iter_num"] == 4 and saved["scaler"]["scale"] == 2.0 ** 15  # skipped, and the scale halved
    assert finite(tmp_path / "ckpt.pt")


def strict_records(out_dir):
    """log.jsonl through a strict parser: a bare NaN or Infinity, which jq rejects, fails."""
    def refuse(constant):
        raise AssertionError(f"{constant} in log.jsonl")
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line, parse_constant=refuse) for line in f]


def finite(path):
    """Whether every floating-point tensor of a saved model and optimizer state is finite."""
    state = torch.load(path, weights_only=True)
    tensors = [*state["model"].values(), *(t for s in state.get("optimizer", {"state": {}})["state"].values()
                                           for t in s.values())]
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


DIVERGING = dict(learning_rate=1000.0, max_iters=8, eval_interval=1)  # non-finite gradients within a few steps


@pytest.mark.parametrize("grad_clip", [0.0, 1.0])
def test_a_diverging_run_saves_no_non_finite_value(grad_clip, data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, **DIVERGING, grad_clip=grad_clip)) == 1
    *warnings, error = last_error(capsys).splitlines()  # the warnings of a finite divergence first
    assert all(line.startswith("warning: val loss") and f"{tmp_path}/ckpt.pt keeps iteration" in line
               for line in warnings)
    iteration = load_checkpoint(tmp_path / "ckpt.pt")["iter_num"]
    evals = {r["iter"]: r for r in strict_records(tmp_path) if r["type"] == "eval"}
    assert error.startswith(f"error: iteration {max(evals) + 1}: non-finite gradient norm")
    # the state named is one a resume can go on from: its val loss is within a nat of the run's best
    assert f"{tmp_path}/ckpt.pt holds iteration {iteration}, the last good one" in error
    assert evals[iteration]["val_loss"] < min(r["val_loss"] for r in evals.values()) + 1
    assert finite(tmp_path / "ckpt.pt") and finite(tmp_path / "best.pt")
    assert max(r.get("iter", 0) for r in strict_records(tmp_path)) == max(evals)  # strict JSON, and nothing after


def test_the_flags_a_diverged_run_gives_resume_it(data_dir, tmp_path, capsys):
    argv = argv_for(data_dir, tmp_path, **DIVERGING, grad_clip=1.0)
    assert train.main(argv) == 1
    iteration = load_checkpoint(tmp_path / "ckpt.pt")["iter_num"]
    err = last_error(capsys)
    # half of 1000 would diverge again: at most the write-ups' learning rate, 9e-4
    assert "resume it with the same command and --init_from=resume --learning_rate=0.0009\n" in err
    assert train.main(argv + err.split("the same command and ")[1].split()) == 0
    resumed = capsys.readouterr()
    assert f"resumed from iteration {iteration} " in resumed.out and "Traceback" not in resumed.err
    assert [r["config"]["learning_rate"] for r in strict_records(tmp_path) if r["type"] == "start"] == [1000.0, 0.0009]
    assert finite(tmp_path / "ckpt.pt") and finite(tmp_path / "best.pt")


def test_a_finite_divergence_keeps_the_last_good_state(data_dir, tmp_path, monkeypatch, capsys):
    # val goes more than a nat above the best at iteration 4, then comes back at 6
    val_losses, estimate = iter([5.0, 4.0, 5.5, 3.9, 3.8]), train.estimate_loss
    monkeypatch.setattr(train, "estimate_loss", lambda *a, **kw: dict(estimate(*a, **kw),
                                                                     val_loss=next(val_losses)))
    assert train.main(argv_for(data_dir, tmp_path, max_iters=4, eval_interval=2)) == 0
    assert last_error(capsys) == f"warning: val loss 5.5000 is far above the best: {tmp_path}/ckpt.pt keeps iteration 2\n"
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 2
    # the resume goes on from iteration 2, and its evaluations at 4 and 6 are good again: saved
    assert train.main(argv_for(data_dir, tmp_path, max_iters=6, eval_interval=2, init_from="resume")) == 0
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == 6


def test_a_non_finite_evaluation_saves_nothing_and_logs_null(data_dir, tmp_path, monkeypatch, capsys):
    estimate_loss, calls = train.estimate_loss, []

    def poisoned(*args, **kwargs):  # the second evaluation's val loss is NaN
        calls.append(1)
        losses = estimate_loss(*args, **kwargs)
        return dict(losses, val_loss=float("nan")) if len(calls) == 2 else losses

    monkeypatch.setattr(train, "estimate_loss", poisoned)
    assert train.main(argv_for(data_dir, tmp_path, max_iters=4, eval_interval=2)) == 1
    err = last_error(capsys)
    assert err.startswith("error: non-finite losses at the evaluation of iteration 2: stopped")
    assert f"{tmp_path}/ckpt.pt holds iteration 0, the last good one" in err
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == load_checkpoint(tmp_path / "best.pt")["iter_num"] == 0
    last = strict_records(tmp_path)[-1]
    assert last["type"] == "eval" and last["val_loss"] is None and last["nonfinite"] == ["val_loss"]
    assert report.main([str(tmp_path)]) == 0
    assert "non-finite" in capsys.readouterr().out.splitlines()[1]


def test_a_non_finite_weight_is_never_saved(data_dir, tmp_path, monkeypatch, capsys):
    # finite losses, but a weight gone NaN by the second evaluation: neither best.pt nor ckpt.pt takes it
    estimate_loss, calls = train.estimate_loss, []

    def poisoning(model, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            with torch.no_grad():
                next(model.parameters())[0, 0] = float("nan")
        return dict(estimate_loss(model, *args, **kwargs), train_loss=1.0, val_loss=1.0 / len(calls))  # finite, and better

    monkeypatch.setattr(train, "estimate_loss", poisoning)
    assert train.main(argv_for(data_dir, tmp_path, max_iters=4, eval_interval=2)) == 1
    err = last_error(capsys)
    assert err.startswith("error: iteration 2: non-finite values in model/transformer.wte.weight: stopped, and "
                          "nothing non-finite was saved; ") and f"{tmp_path}/ckpt.pt holds iteration 0," in err
    assert load_checkpoint(tmp_path / "ckpt.pt")["iter_num"] == load_checkpoint(tmp_path / "best.pt")["iter_num"] == 0
    assert finite(tmp_path / "ckpt.pt") and finite(tmp_path / "best.pt")


# --------------------------------------------------------------------------------------
# signals: real ones, to real processes


def numbers(out_dir):
    """What a run computed, launch by launch merged as report.py reads it: every train and eval
    record's iteration and losses."""
    records, _ = report.read_log(str(out_dir))
    return [(r["type"], r["iter"], r.get("loss"), r.get("aux"), r.get("train_loss"), r.get("val_loss"))
            for r in records if r["type"] in ("train", "eval")]


@pytest.fixture(scope="module")
def unbroken(data_dir, tmp_path_factory):
    """The reference: RUN trained without a stop, for each model type asked for."""
    runs = {}

    def get(model_type):
        if model_type not in runs:
            out_dir = tmp_path_factory.mktemp(f"unbroken-{model_type}")
            assert train.main(run_argv(data_dir, out_dir, model_type=model_type)) == 0
            runs[model_type] = numbers(out_dir)
        return runs[model_type]
    return get


# Ctrl-C; kill and schedulers; a closed terminal or a dropped ssh session; SLURM before a time limit
@pytest.mark.parametrize("signum, model_type", [(signal.SIGTERM, "future_attn"), (signal.SIGINT, "baseline"),
                                                (signal.SIGHUP, "future_attn"), (signal.SIGUSR1, "baseline")])
def test_a_signal_stops_after_the_step_and_the_resumed_run_matches_an_unbroken_one(
        signum, model_type, data_dir, tmp_path, unbroken):
    out_dir = tmp_path / "run"
    process = start(run_argv(data_dir, out_dir, model_type=model_type))
    wait_for(trained_to(out_dir, 60), process)  # past the evaluation at 50
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    stopped_at = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert 60 <= stopped_at < RUN["max_iters"]
    assert max(r["iter"] for r in read_log(out_dir) if r["type"] == "train") == stopped_at  # no step lost
    name = signal.Signals(signum).name
    # answered at once with the step it stops after, then stopped there
    acknowledgement, stopped = err.strip().splitlines()
    assert acknowledgement == f"{name}: stopping after the step under way, with its state saved; a second signal stops at once"
    assert stopped == (f"stopped by {name} after iteration {stopped_at}: {out_dir}/ckpt.pt holds iteration "
                       f"{stopped_at}; continue with the same command and --init_from=resume")

    # what the message says continues the run, to the numbers of a run never stopped
    if signum in (signal.SIGHUP, signal.SIGUSR1):
        return  # what was saved is the same after every signal: resuming it once per model is enough
    command = ["train.py", *run_argv(data_dir, out_dir, model_type=model_type), "--init_from=resume"]
    resumed = subprocess.run([sys.executable, *command], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from iteration {stopped_at}" in resumed.stdout
    assert numbers(out_dir) == unbroken(model_type)


def test_a_closed_terminal_stops_the_run_with_its_state_saved(data_dir, tmp_path):
    # the run's terminal (a pty) closes mid-run: the kernel sends SIGHUP, and what the run prints
    # from then on cannot reach a terminal
    out_dir = tmp_path / "run"
    terminal, its_end = os.openpty()
    process = subprocess.Popen([sys.executable, "train.py", *run_argv(data_dir, out_dir)], cwd=REPO, env=ENV,
                               stdin=its_end, stdout=its_end, stderr=its_end, start_new_session=True,
                               preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # its controlling terminal
    os.close(its_end)
    try:
        deadline, reached = time.time() + 90, trained_to(out_dir, 60)
        while not reached():
            assert process.poll() is None and time.time() < deadline
            if select.select([terminal], [], [], 0.05)[0]:
                os.read(terminal, 65536)  # the terminal shows the output: the run never waits for it
    finally:
        os.close(terminal)
    assert process.wait(timeout=60) == 128 + signal.SIGHUP
    stopped_at = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert 60 <= stopped_at < RUN["max_iters"]
    assert max(r["iter"] for r in read_log(out_dir) if r["type"] == "train") == stopped_at  # no step lost


def test_a_signal_during_an_evaluation(data_dir, tmp_path, unbroken):
    # evaluations of 500 batches take a second or so; the signal comes right after step 50,
    # when the evaluation at 50 begins: it completes, is saved, and the run stops there
    out_dir = tmp_path / "run"
    process = start(run_argv(data_dir, out_dir, eval_iters=500, eval_interval=50))
    wait_for(trained_to(out_dir, 50), process)
    process.send_signal(signal.SIGTERM)
    sent = time.time()
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert err.startswith("SIGTERM: stopping after the step under way, with its state saved; ")
    assert "stopped by SIGTERM after iteration 50" in err
    evals = [r for r in read_log(out_dir) if r["type"] == "eval"]
    assert [r["iter"] for r in evals] == [0, 50]  # the evaluation was made
    assert sent < evals[-1]["time"]  # and the signal came while it ran: its record is written after it
    assert train.main(run_argv(data_dir, out_dir, eval_iters=500, max_iters=60, eval_interval=50,
                               init_from="resume")) == 0
    assert load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"] == 60


SAVE_INTERRUPTED = """
import os, signal, sys, torch
import train
save = torch.save
def interrupted_save(obj, f):
    save(obj, f)
    f.truncate(f.tell() // 2)  # half the file written, then a Ctrl-C and a kill arrive
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
torch.save = interrupted_save
sys.exit(train.main(sys.argv[1:]))
"""


def test_a_second_signal_while_saving_leaves_the_previous_checkpoint_whole(data_dir, tmp_path):
    out_dir = tmp_path / "run"
    assert train.main(run_argv(data_dir, out_dir, max_iters=4, eval_interval=2)) == 0
    before = (out_dir / "ckpt.pt").read_bytes()
    argv = run_argv(data_dir, out_dir, max_iters=8, eval_interval=2, init_from="resume")
    done = subprocess.run([sys.executable, "-c", SAVE_INTERRUPTED, *argv], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM
    assert done.stderr.endswith("a second signal stops at once\nstopped at once by a second SIGTERM\n")
    assert (out_dir / "ckpt.pt").read_bytes() == before
    assert not (out_dir / "ckpt.pt.tmp").exists()  # the half-written file is removed
    # the next launch goes on from the checkpoint, and its save replaces the half-written file
    assert train.main(run_argv(data_dir, out_dir, max_iters=6, eval_interval=2, init_from="resume")) == 0
    assert load_checkpoint(out_dir / "ckpt.pt")["iter_num"] == 6 and not (out_dir / "ckpt.pt.tmp").exists()


PRESSED_TWICE = """
import os, signal, sys, time
import train
forward_backward = train.forward_backward
def pressed_twice(*args, steps=[]):
    steps.append(1)
    if len(steps) == 3:  # Ctrl-C, and Ctrl-C again after a gap, during the third step
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(float(os.environ["GAP"]))
        os.kill(os.getpid(), signal.SIGINT)
    return forward_backward(*args)
train.forward_backward = pressed_twice
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("gap", [0.5, 1.5])
def test_a_double_ctrl_c_is_one_request_and_a_later_one_stops_at_once(gap, data_dir, tmp_path):
    # many press Ctrl-C twice by habit: within a second it asks for the same stop, with the save
    out_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", PRESSED_TWICE, *run_argv(data_dir, out_dir)], cwd=REPO,
                          env=dict(ENV, GAP=str(gap)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGINT
    saved = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    if gap < 1:
        assert saved == 3 and "stopped at once" not in done.stderr
    else:
        assert saved == 0 and done.stderr.endswith("stopped at once by a second SIGINT\n")
    # no .tmp; the lock's file goes with a run that ends, and stays, as after a kill, at once
    left = ["best.pt", "ckpt.pt", "log.jsonl"] + (["train.lock"] if gap > 1 else [])
    assert sorted(os.listdir(out_dir)) == left


@pytest.mark.parametrize("while_", ["compiling", "evaluating"])
def test_a_second_signal_stops_at_once(while_, data_dir, tmp_path):
    # compiling (a fresh compile cache) or evaluating takes a while before the first step
    out_dir = tmp_path / "run"
    slow = dict(compile=True) if while_ == "compiling" else dict(eval_iters=100_000)
    env = dict(ENV, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    process = start(run_argv(data_dir, out_dir, **slow), env=env)
    err = line_reader(process.stderr)
    try:
        # the start record written, then the first evaluation begins
        wait_for(lambda: (out_dir / "log.jsonl").exists() and (out_dir / "log.jsonl").read_text().endswith("\n"),
                 process, timeout=60)
        process.send_signal(signal.SIGTERM)
        assert next_line_with(err, "SIGTERM", timeout=10).startswith("SIGTERM: stopping after the step under way")
        process.send_signal(signal.SIGINT)  # after the acknowledgement: a second signal, not the same one twice
        assert process.wait(timeout=30) == 128 + signal.SIGINT
        assert next_line_with(err, "stopped", timeout=5) == "stopped at once by a second SIGINT\n"
    finally:
        process.kill()
        process.wait()
    assert [r["type"] for r in read_log(out_dir)] == ["start"]  # stopped before the evaluation's record


@pytest.mark.parametrize("signum, sent_to", [
    # a closed terminal: the process group, which holds torchrun alone (its processes have sessions
    # of their own); torchrun passes it on to both, as it does SIGTERM and SIGINT
    (signal.SIGHUP, "the process group"),
    (signal.SIGUSR1, "every process"),  # SLURM signals every process, and torchrun, told to, passes it on again
])
def test_a_two_process_run_stopped_by_a_signal_resumes(signum, sent_to, data_dir, tmp_path):
    out_dir = tmp_path / "ddp"
    argv = run_argv(data_dir, out_dir, model_type="encdec", gradient_accumulation_steps=4, max_iters=300)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py")
    env = dict(ENV, TORCHELASTIC_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")  # as docs/training.md says
    process = start(argv, launcher=torchrun, env=env)
    wait_for(trained_to(out_dir, 20), process)
    if sent_to == "the process group":
        os.killpg(process.pid, signum)
    else:
        workers = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2
        for pid in (*map(int, workers), process.pid):
            os.kill(pid, signum)
    out, err = process.communicate(timeout=60)
    stopped_at = load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"]
    assert 20 <= stopped_at < 300
    # one line from the processes (rank 0's) each time; torchrun adds its own report of the signal
    name = signal.Signals(signum).name
    # answered at once by rank 0, with the step it stops after at the latest (another process may
    # have had the signal before rank 0 looked for one)
    acknowledgements = [line for line in err.splitlines() if line.startswith(f"{name}: stopping after the step ")]
    assert len(acknowledgements) == 1, err[-3000:]
    assert err.count(f"stopped by {name}") == 1 and f"after iteration {stopped_at}: {out_dir}/ckpt.pt holds iteration {stopped_at};" in err, err[-3000:]
    assert "train.py" not in "".join(line for line in err.splitlines() if line.startswith("  File"))
    assert max(r["iter"] for r in read_log(out_dir) if r["type"] == "train") == stopped_at
    if signum != signal.SIGHUP:
        return  # resuming is the same after every signal: once is enough
    resumed = subprocess.run([*torchrun, *argv, "--max_iters=" + str(stopped_at + 5), "--init_from=resume"],
                             cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    if resumed.returncode != 0:  # gloo's threads now and then abort a process in the interpreter's teardown,
        # after train() returned (a torch issue, see WORKER below): then the run's work is what counts
        assert "Signal 6 (SIGABRT)" in resumed.stderr and 'train.py", line' not in resumed.stderr, resumed.stderr[-2000:]
    records, _ = report.read_log(str(out_dir))
    trains = [r["iter"] for r in records if r["type"] == "train"]
    assert trains == list(range(1, stopped_at + 6))  # every step once, none lost, none twice
    assert records[-1]["type"] == "eval" and records[-1]["iter"] == stopped_at + 5
    assert load_checkpoint(str(out_dir / "ckpt.pt"), TRAINING_KEYS)["iter_num"] == stopped_at + 5


# --------------------------------------------------------------------------------------
# the splits of one optimizer step (50 x 16, 200 x 4, 800 x 1) train the same step


def step_windows(data_dir, batch_size, accum_steps, block_size):
    """x and y of one optimizer step's micro-batches as train.py draws them, from one generator,
    concatenated: (batch_size * accum_steps, block_size) each."""
    generator = torch.Generator().manual_seed(1337)
    batches = [train.get_batch(data_dir, "train", generator, batch_size, block_size, "cpu")
               for _ in range(accum_steps)]
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def test_the_writeups_splits_draw_the_same_windows(data_dir):
    # the write-ups' 800 windows of 200 tokens per step, in 16, 4 or 1 draws
    x, y = step_windows(data_dir, 50, 16, 200)
    assert x.shape == y.shape == (800, 200) and torch.equal(y[:, :-1], x[:, 1:])
    for batch_size, accum_steps in ((200, 4), (800, 1)):
        x_split, y_split = step_windows(data_dir, batch_size, accum_steps, 200)
        assert torch.equal(x_split, x) and torch.equal(y_split, y), f"{batch_size}x{accum_steps}"


# The write-ups' 50 x 16, 200 x 4 and 800 x 1 scaled down by 6.25 to 128 sequences per step, with
# their 16, 4 and 1 micro-steps; tiny models, float32.
SMALL_SPLITS = [(8, 16), (32, 4), (128, 1)]
SPLIT_MODEL = dict(vocab_size=DATA_VOCAB, block_size=16, dropout=0.0)
# float32: the same sums taken in another order differ by about 1e-7 of their size
GRADIENT_RTOL = 1e-5


def step_gradients(model, data_dir, batch_size, accum_steps):
    """(the step's loss, {name: gradient}) of one optimizer step as train.py takes it."""
    generator = torch.Generator().manual_seed(1337)
    batches = (train.get_batch(data_dir, "train", generator, batch_size, 16, "cpu")
               for _ in itertools.count())
    model.zero_grad(set_to_none=True)
    numbers = train.forward_backward(model, batches, accum_steps, contextlib.nullcontext(),
                                     torch.amp.GradScaler("cpu", enabled=False))
    return numbers["loss"].item(), {name: p.grad.clone() for name, p in model.named_parameters()}


def sequence_by_sequence(model, x, y):
    """(the mean loss, {name: its gradient}) over the sequences of x and y, slowly: a forward
    and backward pass per sequence, each loss divided by their number."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for i in range(len(x)):
        _, loss, _ = model(x[i:i + 1], y[i:i + 1])
        (loss / len(x)).backward()
        total += loss.item() / len(x)
    return total, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("module", [model_baseline, model_future_attn, model_encdec],
                         ids=["baseline", "future_attn", "encdec"])
def test_every_split_gives_the_gradients_of_the_mean_loss(module, data_dir):
    model = tiny(module, **SPLIT_MODEL)
    (b0, k0), T = SMALL_SPLITS[0], SPLIT_MODEL["block_size"]
    loss, gradients = sequence_by_sequence(model, *step_windows(data_dir, b0, k0, T))
    for batch_size, accum_steps in SMALL_SPLITS:
        split_loss, split_gradients = step_gradients(model, data_dir, batch_size, accum_steps)
        assert split_loss == pytest.approx(loss, rel=GRADIENT_RTOL)
        for name, gradient in split_gradients.items():
            error = (gradient - gradients[name]).norm()
            assert error <= GRADIENT_RTOL * gradients[name].norm(), \
                f"{batch_size}x{accum_steps} {name}: {error / gradients[name].norm():.1e} of its norm"


# --------------------------------------------------------------------------------------
# what a GPU would wait on: host reads of device values, and memory kept across micro-steps


class DeviceReads(TorchDispatchMode):
    """Counts the reads of device values by the host, the syncs a GPU would make, on a CPU.

    On a CPU no tensor is on a device, so this marks the ones that would be: the model's
    parameters, the batches (train.get_batch's outputs) and everything computed from them
    (any op with such an input). A read is an op that hands a device value to Python
    (item, bool(), float(), int() all end in aten._local_scalar_dense; equal and nonzero
    too), or tolist/numpy/cpu of a marked tensor; .cpu() gives an unmarked copy, so reading
    it afterwards is free, as it would be on a GPU. Host tensors (the batch sampler's
    indices, AdamW's step counts) stay unmarked and their reads are not counted.
    """

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default,
             torch.ops.aten.nonzero.default, torch.ops.aten.is_nonzero.default}

    def __init__(self, monkeypatch):
        super().__init__()
        self.on_device, self.reads = torch.utils.weak.WeakTensorKeyDictionary(), 0
        get_batch = train.get_batch
        monkeypatch.setattr(train, "get_batch", lambda *a, **kw: self.mark(get_batch(*a, **kw)))
        for name in ("tolist", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, self.counted(getattr(torch.Tensor, name)))
        cpu = torch.Tensor.cpu  # a copy on a GPU, the same tensor on a CPU: copy it, unmarked
        monkeypatch.setattr(torch.Tensor, "cpu", self.counted(lambda t, *a, **kw: cpu(t, *a, **kw).clone()))

    def mark(self, tensors):
        for t in tensors:
            self.on_device[t] = True
        return tensors

    def marked(self, t):
        return isinstance(t, torch.nn.Parameter) or t in self.on_device

    def counted(self, method):
        def read(t, *args, **kwargs):
            self.reads += self.marked(t)
            with torch._C._DisableTorchDispatch():  # the copy .cpu() makes is a host tensor
                return method(t, *args, **kwargs)
        return read

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        from_device = any(self.marked(t) for t in inputs)
        self.reads += from_device and func in self.READS
        out = func(*args, **(kwargs or {}))
        if from_device:
            self.mark(t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


@pytest.mark.parametrize("model_type", ["baseline", "future_attn", "encdec"])
def test_host_reads_one_per_step_and_a_constant_per_evaluation(model_type, data_dir, tmp_path, monkeypatch):
    # what a GPU waits on: one read per optimizer step (forward_backward's), and per evaluation
    # (its loss estimate, the finiteness check of the state, the saves of best.pt and ckpt.pt) a
    # number that does not grow with eval_iters
    steps = 3
    per_evaluation = {}
    for eval_iters in (1, 3):
        config = config_for(data_dir, tmp_path / str(eval_iters), model_type=model_type, max_iters=steps,
                            eval_interval=100, eval_iters=eval_iters, grad_clip=1.0)
        with monkeypatch.context() as patch, DeviceReads(patch) as counter:
            evaluations, step_reads, opened = [], [], []

            def counted_estimate(*args, estimate_loss=train.estimate_loss):
                opened.append(counter.reads)  # an evaluation starts with its estimate ...
                return estimate_loss(*args)

            def counted_save(path, *args, save_checkpoint=train.save_checkpoint):
                save_checkpoint(path, *args)
                if os.path.basename(path) == "ckpt.pt" and opened:  # ... and ends with the save of ckpt.pt
                    evaluations.append(counter.reads - opened.pop())

            # a step starts with its forward and backward passes and ends with the read of its numbers
            def counted_step(*args, forward_backward=train.forward_backward):
                step_started.append(counter.reads)
                return forward_backward(*args)

            def counted_read(*args, read_numbers=train.read_numbers):
                numbers = read_numbers(*args)
                step_reads.append(counter.reads - step_started.pop())
                return numbers

            step_started = []
            patch.setattr(train, "estimate_loss", counted_estimate)
            patch.setattr(train, "save_checkpoint", counted_save)
            patch.setattr(train, "forward_backward", counted_step)
            patch.setattr(train, "read_numbers", counted_read)
            train.train(config)
        assert len(evaluations) == 2 and step_reads == [1] * steps  # evaluations at iterations 0 and max_iters
        assert counter.reads == sum(evaluations) + sum(step_reads)  # no read elsewhere in the run
        assert evaluations[0] == evaluations[1] <= 4, f"eval_iters={eval_iters}: {evaluations} reads per evaluation"
        per_evaluation[eval_iters] = evaluations[0]
    assert per_evaluation[1] == per_evaluation[3]


@pytest.mark.parametrize("model_type", ["baseline", "future_attn", "encdec"])
def test_no_micro_steps_logits_live_through_the_next_forward(model_type, data_dir, tmp_path, monkeypatch):
    # the logits, (B, T, vocab), are a step's largest tensor: kept, they add their size to the next forward's peak
    alive, last_logits = [], [None]

    def check_previous(module, inputs):  # before each forward
        alive.append(last_logits[0] is not None and last_logits[0]() is not None)

    def keep_weakref(module, inputs, output):
        last_logits[0] = weakref.ref(output[0])

    build_model = train.build_model

    def hooked(*args, **kwargs):
        model = build_model(*args, **kwargs)
        model.register_forward_pre_hook(check_previous)
        model.register_forward_hook(keep_weakref)
        return model

    monkeypatch.setattr(train, "build_model", hooked)
    train.train(config_for(data_dir, tmp_path, model_type=model_type, max_iters=2, gradient_accumulation_steps=3,
                           eval_interval=2, eval_iters=2))
    assert len(alive) == 2 * 3 + 2 * 2 * 2  # the micro-steps, and two evaluations of both splits
    assert not any(alive), f"logits alive at forwards {[i for i, a in enumerate(alive) if a]}"


class Float32Outputs(TorchDispatchMode):
    """Counts the float32 tensors of `numel` elements that ops make: under bf16 autocast, the
    float32 copies of the (B, T, vocab) logits."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count += sum(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() == self.numel
                          for t in torch.utils._pytree.tree_leaves(out))
        return out


@pytest.mark.parametrize("model_type", ["baseline", "future_attn", "encdec"])
def test_the_logged_cross_entropy_makes_no_float32_copy_of_the_logits(model_type, data_dir, tmp_path):
    # On a GPU each float32 copy of the logits is 2 GB at 50 x 200 tokens of 50,257 words: a
    # micro-step of forward_backward makes no more of them than the model's own passes do.
    config = config_for(data_dir, tmp_path, model_type=model_type, vocab_size=300)  # 300: no other size
    model = train.build_model(model_type, train.model_args_of(config))
    batch = train.get_batch(data_dir, "train", torch.Generator().manual_seed(0), 4, 16, "cpu")
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    with Float32Outputs(4 * 16 * 300) as model_alone:
        with autocast:
            loss = model(*batch)[1]
        loss.backward()
    model.zero_grad(set_to_none=True)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with Float32Outputs(4 * 16 * 300) as step:
        numbers = train.forward_backward(model, iter([batch]), 1, autocast, scaler)
    assert model_alone.count > 0 and step.count == model_alone.count
    # the logged cross-entropy is the model's, without its auxiliary losses
    model.eval()
    with torch.no_grad(), autocast:
        logits = model(*batch)[0]
    model.train()
    cross_entropy = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[1].flatten())
    if model_type != "baseline":  # dropout is 0: train mode differs only by the auxiliary losses
        assert numbers["loss"] > numbers["cross_entropy"]
    assert numbers["cross_entropy"].item() == pytest.approx(cross_entropy.item(), rel=2e-2)


# --------------------------------------------------------------------------------------
# gradient accumulation and processes


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


def test_accumulation_must_divide_the_world_size(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it
    assert train.main(argv_for(data_dir, tmp_path, gradient_accumulation_steps=3)) == 2
    assert "gradient_accumulation_steps must be divisible by the 2 processes" in last_error(capsys)
    assert not (tmp_path / "log.jsonl").exists()


WORKER = """
import os, sys, torch
import train
config = train.get_config(sys.argv[1:])
result = train.train(config)
torch.save(result["model"].state_dict(), os.path.join(config["out_dir"], f"rank{os.environ['RANK']}.pt"))
# all done: skip the interpreter's teardown, where gloo's threads abort a process now and
# then ("terminate called without an active exception", a torch issue, not this code's)
sys.stdout.flush()
os._exit(0)
"""


RANK0_POISONED = """
import os, sys
import train
estimate, calls = train.estimate_loss, []
def poisoned(*args, **kwargs):  # rank 0 alone evaluates: its second val loss is NaN
    calls.append(1)
    losses = estimate(*args, **kwargs)
    return dict(losses, val_loss=float("nan")) if len(calls) == 2 else losses
train.estimate_loss = poisoned
status = train.main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)  # without the teardown in which gloo's threads may abort a process
"""


@pytest.mark.parametrize("what", ["a folder that holds a run", "a non-finite evaluation"])
def test_what_stops_rank_0_stops_every_process(what, data_dir, tmp_path):
    # rank 0 alone checks out_dir and evaluates: what stops it there ends the other process too,
    # which would otherwise wait for it forever in the next collective
    out_dir, worker = tmp_path / "run", tmp_path / "worker.py"
    worker.write_text(RANK0_POISONED if what == "a non-finite evaluation" else
                      "import sys, train\nsys.exit(train.main(sys.argv[1:]))\n")
    if what == "a folder that holds a run":
        assert train.main(argv_for(data_dir, out_dir, max_iters=2, eval_interval=2)) == 0
    env = dict(ENV, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(worker), *argv_for(data_dir, out_dir, max_iters=4, eval_interval=2,
                                                  gradient_accumulation_steps=2)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    expected = (f"error: {out_dir} already holds a run" if what == "a folder that holds a run" else
                "error: non-finite losses at the evaluation of iteration 2: stopped")
    assert len(errors) == 1 and errors[0].startswith(expected), done.stderr[-3000:]  # rank 0's alone
    assert load_checkpoint(out_dir / "ckpt.pt", TRAINING_KEYS)["iter_num"] == (2 if "folder" in what else 0)


def test_two_process_ddp_on_gloo(data_dir, tmp_path):
    # encdec without embedding loss owns an unused LayerNorm: DDP must be told (find_unused_parameters)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    settings = {**TINY, "data_dir": data_dir, "model_type": "encdec", "embedding_loss_type": "none",
                "ln_encoder_out": False, "dropout": 0.1, "gradient_accumulation_steps": 4,
                "max_iters": 3, "eval_interval": 3, "out_dir": str(tmp_path)}
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(worker), *flags(**settings)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = read_log(tmp_path)[0]
    assert start["world_size"] == 2 and start["tokens_per_iter"] == 4 * 4 * 16
    assert proc.stdout.startswith("encdec: 67,040 parameters, 256 tokens per iteration\n")
    assert [r["iter"] for r in read_log(tmp_path) if r["type"] == "train"] == [1, 2, 3]
    checkpoint = load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))
    assert checkpoint["iter_num"] == 3 and len(checkpoint["rng"]) == 2
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for name, p in rank0.items():  # DDP kept the replicas identical
        assert torch.equal(p, rank1[name]), name
        assert torch.equal(p, checkpoint["model"][name]), name
