"""
Tests of the devices a run may name (train.py's check_device, and what each device implies in
train.py, bench.py and sample.py): `--device=mps`, an Apple-silicon GPU. This machine has none, so
the tests check the refusal as it is, and the rest with the MPS check replaced (the tensors then
stay on the CPU): float32 unless asked for bf16, compile off unless asked, AdamW not fused, no
pinned memory, and bench.py waiting for the GPU around each timed step. On CUDA: the GPU named
made the current one, and TF32 on for a run or a benchmark alone.
Run: python -m pytest -q tests/test_devices.py
"""

import contextlib
import dataclasses
import re

import pytest
import torch

import bench
import model_baseline
import sample
import study
import train
from configurator import ConfigError
from conftest import argv_for, last_error, read_log

HAS_MPS = torch.backends.mps.is_available()


# --------------------------------------------------------------------------------------
# a machine without MPS refuses it, in one line


@pytest.mark.skipif(HAS_MPS, reason="this machine has an MPS device")
def test_mps_is_refused_where_there_is_none(data_dir, tmp_path, capsys):
    refusal = ("error: device='mps' is not on this machine: use cpu, or cuda, cuda:N or mps where there "
               "is one\n")
    for main, argv in ((train.main, argv_for(data_dir, tmp_path, device="mps")),
                       (sample.main, [f"--out_dir={tmp_path}", "--device=mps"]),
                       (bench.main, ["config/tiny_cpu.py", "--device=mps"])):
        assert main(argv) == 2
        assert last_error(capsys) == refusal
    assert not list(tmp_path.iterdir())  # nothing written
    with pytest.raises(ConfigError, match="is not on this machine"):  # study.py's runs
        study.plan_runs(["config/tiny_cpu.py"], [1], str(tmp_path), ["--device=mps"])


@pytest.mark.parametrize("device, problem", [
    ("gpu", "is not a device name: the names are cpu, cuda, cuda:N (the GPU numbered N) and mps"),
    ("CPU", "is not a device name"), ("cpu:0", "is not a device name"), ("cuda:x", "is not a device name"),
    ("cuda:99", "is not on this machine: use cpu, or cuda"),
])
def test_an_unknown_device_names_the_ones_there_are(device, problem):
    with pytest.raises(ConfigError, match=re.escape(f"device='{device}' {problem}")):
        train.check_device(device)
    train.check_device("cpu")  # no error


# --------------------------------------------------------------------------------------
# what each device implies, with the MPS check replaced


@pytest.fixture
def pretend_mps(monkeypatch):
    """MPS reported as there; the tensors and modules sent to 'mps' stay on the CPU."""
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    to = torch.Tensor.to

    def to_the_cpu(self, *args, **kwargs):
        args = ["cpu" if str(arg).startswith("mps") else arg for arg in args]
        if str(kwargs.get("device", "")).startswith("mps"):
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_the_cpu)


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # autocast for CUDA, made here
def test_each_device_chooses_its_precision(pretend_mps, monkeypatch):
    assert train.autocast_for("auto", "cpu")[0] == "float32"
    # a GPU before Ampere emulates bf16, slower than fp16: what counts is native bf16
    for native, dtype in ((True, "bfloat16"), (False, "float16")):
        def is_bf16_supported(including_emulation=True):
            return native or including_emulation
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
        assert train.autocast_for("auto", "cuda")[0] == dtype
    dtype, autocast = train.autocast_for("auto", "mps")  # fp32 unless asked: old macOS lack bf16
    assert dtype == "float32" and isinstance(autocast, contextlib.nullcontext)
    dtype, autocast = train.autocast_for("bfloat16", "mps")  # asked for
    assert dtype == "bfloat16" and isinstance(autocast, torch.autocast)
    assert autocast.device == "mps" and autocast.fast_dtype == torch.bfloat16


def test_compile_is_off_on_mps_and_cpus_unless_asked(pretend_mps, tmp_path):
    (tmp_path / "compiled.py").write_text("compile = True\n")
    assert train.DEFAULTS["compile"] is True  # on CUDA
    assert train.get_config(["--device=cpu"])["compile"] is False
    assert train.get_config(["--device=cpu", "--compile"])["compile"] is True
    assert train.get_config(["--device=mps"])["compile"] is False
    assert train.get_config(["--device=mps", "--compile=True"])["compile"] is True
    assert train.get_config([str(tmp_path / "compiled.py"), "--device=mps"])["compile"] is True


def test_study_runs_take_mps(pretend_mps, tmp_path):
    run, = study.plan_runs(["config/tiny_cpu.py"], [1], str(tmp_path), ["--device=mps"])
    assert run.config["device"] == "mps"


def test_adamw_is_fused_on_cuda_only():
    config = model_baseline.GPTConfig(vocab_size=16, block_size=4, n_layer=1, n_head=1, n_embd=8)
    model = model_baseline.GPT(config)
    fused = {}
    for device_type in ("cpu", "mps", "cuda"):
        optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), device_type)
        fused[device_type] = optimizer.defaults["fused"]
    assert fused == {"cpu": None, "mps": None, "cuda": True}


def test_batches_go_to_mps_without_pinned_memory(pretend_mps, data_dir, monkeypatch):
    moved = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to",
                        lambda self, device, **kw: moved.append(device) or to(self, device, **kw))
    monkeypatch.setattr(torch.Tensor, "pin_memory",
                        lambda self: pytest.fail("pinned memory on MPS"))
    x, y = train.get_batch(data_dir, "train", torch.Generator().manual_seed(0), 4, 16, "mps")
    assert moved == ["mps", "mps"] and x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_training_runs_the_mps_path(pretend_mps, data_dir, tmp_path, monkeypatch):
    # train.py end to end with --device=mps: what reaches autocast and AdamW is 'mps'
    device_types = []
    configure = model_baseline.GPT.configure_optimizers

    def recorded(self, weight_decay, learning_rate, betas, device_type):
        device_types.append(device_type)
        return configure(self, weight_decay, learning_rate, betas, device_type)

    monkeypatch.setattr(model_baseline.GPT, "configure_optimizers", recorded)
    monkeypatch.setattr(torch.Tensor, "pin_memory",
                        lambda self: pytest.fail("pinned memory on MPS"))
    assert train.main(argv_for(data_dir, tmp_path, device="mps", dtype="auto", max_iters=2,
                               eval_interval=2)) == 0
    assert device_types == ["mps"]
    config = read_log(tmp_path)[0]["config"]
    assert (config["device"], config["dtype"]) == ("mps", "float32")


def test_bench_waits_for_the_mps_device_around_each_step(monkeypatch):
    waits = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: waits.append("mps"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: waits.append("cuda"))
    _, runs = bench.parse_args(["config/tiny_cpu.py", "--device=cpu", "--batch_size=2",
                                "--gradient_accumulation_steps=1"])
    run = bench.build(*runs[0])
    bench.step(run)
    assert waits == []  # a CPU has nothing to wait for
    run["device"] = "mps"  # the same step, timed as on the Apple GPU
    assert bench.step(run) > 0
    assert waits == ["mps", "mps"]  # before the clock starts and before it stops


class DeviceChosen(Exception):
    pass


@pytest.mark.parametrize("environment, device, current", [
    ({}, "cuda:1", "cuda:1"),  # one process, on the GPU asked for
    ({}, "cuda", "cuda"),
    (dict(WORLD_SIZE="4", RANK="3", LOCAL_RANK="1"), "cuda", "cuda:1"),  # torchrun: its node's GPU
])
def test_a_cuda_device_is_made_the_current_one_in_every_process(environment, device, current, data_dir, tmp_path,
                                                                monkeypatch):
    # the CUDA random states that a checkpoint saves and the pinned copies of the batches are the
    # current device's: cuda:0's unless the run's GPU is made current, before anything else
    chosen = []

    def set_device(device):
        chosen.append(str(device))
        raise DeviceChosen  # no GPU here to go on with

    config = dict(train.get_config(argv_for(data_dir, tmp_path)), device=device)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DeviceChosen):
        train.train(config)
    assert chosen == [current]


@pytest.mark.parametrize("script", ["bench", "sample"])
def test_bench_and_sample_make_a_cuda_device_the_current_one(script, tmp_path, monkeypatch):
    # before they build or read anything, as train.py does: bf16's support, the CUDA random
    # state and what is made without naming a device are then cuda:1's, not cuda:0's
    chosen = []

    def set_device(device):
        chosen.append(str(device))
        raise DeviceChosen  # no GPU here to go on with

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(train, "check_device", lambda device: None)  # as if there were a cuda:1
    if script == "bench":
        with pytest.raises(DeviceChosen):
            bench.main(["config/tiny_cpu.py", "--device=cuda:1", "--iters=1", "--warmup=0"])
    else:
        out = tmp_path / "out"
        out.mkdir()
        model = model_baseline.GPT(model_baseline.GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2,
                                                            n_embd=16))
        torch.save(dict(format=train.FORMAT, model_type="baseline", model_args=dataclasses.asdict(model.config),
                        model=model.state_dict(), iter_num=0, best_val_loss=float("inf"), config={}),
                   out / "best.pt")
        with pytest.raises(DeviceChosen):
            sample.sample(dict(sample.DEFAULTS, out_dir=str(out), device="cuda:1"))
    assert chosen == ["cuda:1"]


def tf32():
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_tf32_is_on_for_a_run_or_a_benchmark_alone_and_put_back_after(data_dir, tmp_path, monkeypatch):
    # TF32 is a setting of the run, made where it starts: a model built, or a benchmark's step,
    # leaves it as it was, so that float32 kernels tested later in the same process stay float32
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    during, run, time_runs = [], train.run, bench.time_runs
    monkeypatch.setattr(train, "run", lambda *args: during.append(tf32()) or run(*args))
    monkeypatch.setattr(bench, "time_runs", lambda *args: during.append(tf32()) or time_runs(*args))
    train.build(train.get_config(argv_for(data_dir, tmp_path)), 0, torch.Generator())
    _, runs = bench.parse_args(["config/tiny_cpu.py", "--device=cpu", "--batch_size=2", "--gradient_accumulation_steps=1"])
    bench.step(bench.build(*runs[0]))
    assert tf32() == (False, False) and during == []
    train.train(train.get_config(argv_for(data_dir, tmp_path, max_iters=1, eval_interval=1)))
    assert tf32() == (False, False)
    assert bench.main(["config/tiny_cpu.py", "--device=cpu", "--batch_size=2", "--iters=1", "--warmup=0"]) == 0
    assert tf32() == (False, False)
    assert during == [(True, True), (True, True)]  # on while the run and the benchmark ran
