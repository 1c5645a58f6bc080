"""
Tests of the devices a run may name (lib/machine.py's check_device, and what each device implies
in lib/settings.py, train.py and bench.py): `--device=mps`, an Apple-silicon GPU. This machine has
none, so the tests check the refusal as it is, and the rest with the MPS check replaced (the
tensors then stay on the CPU): float32 unless bf16 autocast works there, compile off unless asked,
AdamW not fused, no pinned memory, and bench.py waiting for the GPU around each timed step.
"""

import contextlib
import subprocess
import sys

import pytest
import torch

import bench
import model_baseline
import sample
import study
import train
from conftest import argv_for, last_error, read_log
from lib import machine
from lib.cli import ConfigError

HAS_MPS = torch.backends.mps.is_available()


# --------------------------------------------------------------------------------------
# a machine without MPS refuses it, in one line


@pytest.mark.skipif(HAS_MPS, reason="this machine has an MPS device")
def test_mps_is_refused_where_there_is_none(data_dir, tmp_path, capsys):
    refusal = "error: device='mps' but this machine has no MPS device (an Apple-silicon GPU): use --device=cpu\n"
    for main, argv in ((train.main, argv_for(data_dir, tmp_path, device="mps")),
                       (sample.main, [f"--out_dir={tmp_path}", "--device=mps"]),
                       (bench.main, ["config/tiny_cpu.py", "--device=mps"])):
        assert main(argv) == 2
        assert last_error(capsys) == refusal
    assert not list(tmp_path.iterdir())  # nothing written
    with pytest.raises(ConfigError, match="this machine has no MPS device"):  # study.py's runs
        study.plan_runs(["config/tiny_cpu.py"], [1], str(tmp_path), ["--device=mps"])
    machine.mps_bf16_autocast_works.cache_clear()
    assert machine.mps_bf16_autocast_works() is False  # its trial matmul fails here: a no


def test_an_unknown_device_names_the_ones_there_are():
    message = r"device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got 'gpu'"
    with pytest.raises(ConfigError, match=message):
        machine.check_device("gpu")


# --------------------------------------------------------------------------------------
# what each device implies, with the MPS check replaced


@pytest.fixture
def pretend_mps(monkeypatch):
    """MPS reported as there, with bf16 autocast working where the test sets bf16_works[0]; the
    tensors and modules sent to 'mps' stay on the CPU. Returns that list."""
    bf16_works = [False]
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(machine, "mps_bf16_autocast_works", lambda: bf16_works[0])
    to = torch.Tensor.to

    def to_the_cpu(self, *args, **kwargs):
        args = ["cpu" if str(arg).startswith("mps") else arg for arg in args]
        if str(kwargs.get("device", "")).startswith("mps"):
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_the_cpu)
    return bf16_works


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # autocast for CUDA, made here
def test_each_device_chooses_its_precision(pretend_mps, monkeypatch):
    assert machine.autocast_for("auto", "cpu")[0] == "float32"
    for bf16, dtype in ((True, "bfloat16"), (False, "float16")):  # CUDA's, as it was
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
        assert machine.autocast_for("auto", "cuda")[0] == dtype
    dtype, autocast = machine.autocast_for("auto", "mps")
    assert dtype == "float32" and isinstance(autocast, contextlib.nullcontext)
    pretend_mps[0] = True  # a torch and macOS where bf16 autocast runs on the Apple GPU
    dtype, autocast = machine.autocast_for("auto", "mps")
    assert dtype == "bfloat16" and isinstance(autocast, torch.autocast)
    assert autocast.device == "mps" and autocast.fast_dtype == torch.bfloat16
    pretend_mps[0] = False
    with pytest.raises(ConfigError, match="bf16 autocast does not work on this MPS device"):
        machine.check_device("mps", "bfloat16")
    machine.check_device("mps", "float16")  # what the user asks for, autocast's to refuse


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


# --------------------------------------------------------------------------------------
# the busy-CPU note: it speaks when other programs hold cores, read from /proc/stat


def fake_proc_stat(monkeypatch, *ticks):
    """/proc/stat as it reads at each call: ticks = (idle, all) since boot, all cores."""
    lines = iter(f"cpu  {total - idle} 0 0 {idle} 0 0 0 0\n" for idle, total in ticks)
    monkeypatch.setattr(machine, "open", lambda path: contextlib.nullcontext(
        __import__("io").StringIO(next(lines))), raising=False)
    monkeypatch.setattr(machine.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 2)


def test_the_busy_cpu_note_is_silent_on_an_idle_machine(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    fake_proc_stat(monkeypatch, (1000, 5000), (1020, 5020))  # every tick of the moment idle
    assert machine.busy_cpu_note() is None
    fake_proc_stat(monkeypatch, (1000, 5000), (1016, 5020))  # 0.4 of a core: none held
    assert machine.busy_cpu_note() is None


def test_the_busy_cpu_note_speaks_when_other_programs_hold_a_core(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    fake_proc_stat(monkeypatch, (1000, 5000), (1010, 5020))  # half the ticks: one core of 2
    assert machine.busy_cpu_note() == ("note: other programs keep 1 of 2 CPU cores busy; one "
                                       "thread per free core runs faster: OMP_NUM_THREADS=1")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # already one thread: nothing to gain
    assert machine.busy_cpu_note() is None


@pytest.mark.skipif(not machine.os.path.exists("/proc/stat"), reason="Linux's /proc/stat only")
def test_the_busy_cpu_note_speaks_under_a_real_busy_loop(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: machine.os.cpu_count())
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(machine.os.cpu_count())]  # every core, whatever else runs
    try:
        note = machine.busy_cpu_note(seconds=0.5)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert note is not None and "OMP_NUM_THREADS=1" in note
