"""
Tests of bench.py on a CPU with tiny models: a timed step is train.py's optimizer step, --splits
and --sweep_block_size time the shapes they name, --compare prints per-round ratios, --impl,
--explain, --profile (torch.profiler's table), --memory, and --gpu_report's order, budget and
report. The tests marked cuda run where there is a CUDA GPU.

    python -m pytest -q tests/test_bench.py
"""

import re
import subprocess
import sys
import time

import pytest
import torch

import bench
import train
from conftest import ENV, REPO

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

# a small model so that a step takes milliseconds on a CPU
SMALL = ["config/tiny_cpu.py", "--device=cpu", "--vocab_size=256", "--n_layer=2", "--n_embd=32",
         "--n_head=2", "--block_size=16"]
FUTURE = ["config/future50_mse.py", *SMALL[1:], "--future_dim=4", "--batch_size=2", "--gradient_accumulation_steps=1"]


def recorded_steps(monkeypatch):
    """[(batch_size, block_size, micro-steps)] of every train.forward_backward call from here on."""
    steps, forward_backward = [], train.forward_backward

    def recording(model, batches, accum_steps, *args, **kwargs):
        X, _ = next(batches)  # bench.py's batches repeat one batch
        steps.append((*X.shape, accum_steps))
        return forward_backward(model, batches, accum_steps, *args, **kwargs)

    monkeypatch.setattr(train, "forward_backward", recording)
    return steps


def test_a_step_runs_every_micro_step_on_the_mean_loss():
    _, runs = bench.parse_args([*SMALL, "--batch_size=3", "--gradient_accumulation_steps=4"])
    run = bench.build(*runs[0])
    passes, model = [], run["step_model"]

    def counted(x, y):
        passes.append(x)
        return model(x, y)

    run["step_model"] = counted
    bench.step(run)
    assert len(passes) == 4
    # 4 passes over the same batch, each loss divided by 4: after one step AdamW's first
    # moment is (1 - beta1) x the gradient of a single pass
    _, runs = bench.parse_args([*SMALL, "--batch_size=3", "--gradient_accumulation_steps=1"])
    reference = bench.build(*runs[0])  # the same seed: the same weights and batch
    reference["model"](reference["x"], reference["y"])[1].backward()
    beta1 = run["config"]["beta1"]
    for p, q in zip(run["model"].parameters(), reference["model"].parameters()):
        torch.testing.assert_close(run["optimizer"].state[p]["exp_avg"], (1 - beta1) * q.grad, rtol=1e-4, atol=1e-7)


def test_a_step_is_train_pys_optimizer_step(monkeypatch):
    # as train.run takes a step: gradient_accumulation_steps passes, the gradients unscaled and
    # clipped, the one read from the device, then one AdamW step
    _, runs = bench.parse_args([*SMALL, "--batch_size=2", "--gradient_accumulation_steps=3", "--grad_clip=0.5"])
    run = bench.build(*runs[0])
    passes, model = [], run["step_model"]
    run["step_model"] = lambda x, y: passes.append(x) or model(x, y)
    calls, clip, read = [], torch.nn.utils.clip_grad_norm_, train.read_numbers
    monkeypatch.setattr(run["scaler"], "unscale_", lambda optimizer: calls.append("unscale"))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda params, max_norm: calls.append(("clip", max_norm)) or clip(params, max_norm))
    monkeypatch.setattr(train, "read_numbers", lambda numbers, ddp: calls.append(("read", "loss" in numbers and "grad_norm" in numbers)) or read(numbers, ddp))
    monkeypatch.setattr(run["optimizer"], "step", lambda *a: calls.append("AdamW"))
    bench.step(run)
    assert len(passes) == 3
    assert calls == ["unscale", ("clip", 0.5), ("read", True), "AdamW"]


def test_report_counts_every_micro_step(capsys):
    _, runs = bench.parse_args([*SMALL, "--batch_size=4", "--gradient_accumulation_steps=2"])
    run = dict(bench.build(*runs[0]), device="cuda", times=[0.1, 0.1, 0.1], peak_memory=2**30)  # as if on a GPU
    bench.report(run, dict(peak_flops=1e12))
    mfu = run["model"].flops_per_token() * 16 * 8 / 0.1 / 1e12  # 8 sequences of 16 tokens in 0.1 s
    assert capsys.readouterr().out.split()[1:] == [
        "100.0", "ms/iter", "1280", "tokens/s", "MFU", f"{mfu * 100:.1f}%", "peak", "memory", "1024.0", "MiB"]
    bench.report(run, dict(peak_flops=None))  # a GPU of unknown peak: no MFU rather than a wrong one
    assert "MFU" not in capsys.readouterr().out


def test_splits_time_whole_optimizer_steps(capsys, monkeypatch):
    steps = recorded_steps(monkeypatch)
    assert bench.main([*SMALL, "--splits=4x2,8x1", "--warmup=1", "--iters=2"]) == 0
    assert steps == [(4, 16, 2)] * 3 + [(8, 16, 1)] * 3  # warm-up and timed steps of each split
    rows = re.findall(r"^tiny_cpu (\d+x\d+) +([\d.]+) ms/iter +(\d+) tokens/s", capsys.readouterr().out, re.MULTILINE)
    assert [split for split, _, _ in rows] == ["4x2", "8x1"]
    for _, ms, tokens_per_s in rows:  # 128 tokens per step, whatever the split
        rounding = 0.05 / float(ms)  # ms/iter is printed to 0.1 ms
        assert int(tokens_per_s) == pytest.approx(128 / (float(ms) / 1000), rel=0.01 + rounding, abs=1)


def test_sweep_block_size_times_one_micro_step_at_each_length(capsys, monkeypatch):
    steps = recorded_steps(monkeypatch)
    assert bench.main([*SMALL, "--batch_size=2", "--gradient_accumulation_steps=3", "--sweep_block_size=8,16",
                       "--warmup=0", "--iters=2"]) == 0
    assert steps == [(2, 8, 1)] * 2 + [(2, 16, 1)] * 2
    assert re.findall(r"^tiny_cpu (T=\d+) ", capsys.readouterr().out, re.MULTILINE) == ["T=8", "T=16"]


def test_compare_interleaves_the_runs_and_prints_the_median_of_per_round_ratios(capsys, monkeypatch):
    # the steps "take" these seconds: the median of the per-round ratios is 2, the ratio of the
    # medians 3, and a busy round slows both runs alike
    seconds = {"future50_mse[readable]": [1.0, 1.0, 4.0], "future50_mse[fast]": [2.0, 3.0, 4.0]}
    order = []
    monkeypatch.setattr(bench, "step", lambda run: order.append(run["label"]) or seconds[run["label"]][len(run["times"])])
    assert bench.main([*FUTURE, "--compare", "--impl=readable,fast", "--warmup=0", "--iters=3"]) == 0
    assert order == ["future50_mse[readable]", "future50_mse[fast]"] * 3
    out = capsys.readouterr().out
    assert re.search(r"^future50_mse\[readable\] +1000.0 ms/iter .* ratio 1.000 \(rounds 1.00-1.00\)$", out, re.MULTILINE)
    assert re.search(r"^future50_mse\[fast\] +3000.0 ms/iter .* ratio 2.000 \(rounds 1.00-3.00\)$", out, re.MULTILINE)


def test_a_run_is_labelled_with_its_config_and_the_model_type_a_flag_gives():
    labels = [label for label, _, _ in bench.parse_args(["config/tiny_cpu.py", "config/future50_mse.py"])[1]]
    assert labels == ["tiny_cpu", "future50_mse[auto]"]
    labels = [label for label, _, _ in bench.parse_args(["config/tiny_cpu.py", "--model_type=encdec"])[1]]
    assert labels == ["tiny_cpu as encdec"]
    assert [label for label, _, _ in bench.parse_args(["--model_type=future_attn"])[1]] == ["future_attn[auto]"]


def test_impl_sets_every_future_attention_layer():
    _, runs = bench.parse_args([*FUTURE, "--impl=readable,fast"])
    assert [(label, impl) for label, _, impl in runs] == [("future50_mse[readable]", "readable"), ("future50_mse[fast]", "fast")]
    for run in runs:
        model = bench.build(*run)["model"]
        impl = run[2]
        assert {block.attn.impl for block in model.transformer.h if block.future} == {impl}


def test_an_implementation_that_cannot_compute_the_config_is_one_line(capsys):
    computed = ["config/future50_mse_computed.py", *SMALL[1:], "--future_dim=4", "--iters=1", "--warmup=0"]
    assert bench.main([*computed, "--impl=fast"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: impl='fast' has no computed future keys") and err.count("\n") == 1
    assert bench.main([*FUTURE, "--impl=flex"]) == 2
    assert capsys.readouterr().err == "error: impl=flex needs --device=cuda: no backward on a CPU\n"


def test_explain_counts_graphs_and_graph_breaks(capsys):
    assert bench.main([*SMALL, "--batch_size=2", "--explain"]) == 0
    assert "tiny_cpu: 1 graphs, 0 graph breaks\n" in capsys.readouterr().out


def test_profile_prints_the_table_of_the_traced_steps_only(capsys):
    _, runs = bench.parse_args([*SMALL, "--batch_size=4"])
    run = bench.build(*runs[0])
    with torch.profiler.profile() as prof:  # the reference: one step, traced here
        bench.step(run)
    mm_per_step = next(event.count for event in prof.key_averages() if event.key == "aten::mm")
    assert bench.main([*SMALL, "--batch_size=4", "--profile=2", "--warmup=1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"tiny_cpu: [\d.]+ ms per traced step", out) and "Self CPU" in out
    # the two traced steps, not the warm-up's
    assert re.search(r"^ *aten::mm .* (\d+) *$", out, re.MULTILINE).group(1) == str(2 * mm_per_step)


def test_memory_on_a_cpu_is_the_first_steps_growth_of_the_peak():
    # a process of its own, started by a shell as a user starts it: a process forked from pytest
    # would begin with pytest's peak memory
    argv = [*SMALL, "--vocab_size=16384", "--n_layer=1", "--n_embd=128", "--batch_size=4", "--gradient_accumulation_steps=1"]
    command = " ".join([sys.executable, "bench.py", *argv, "--memory"])
    done = subprocess.run(["sh", "-c", f"{command}; exit $?"], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    mib = float(re.search(r"tiny_cpu: peak memory of a step: ([\d,.]+) MiB above its start", done.stdout).group(1).replace(",", ""))
    model = bench.build(*bench.parse_args(argv)[1][0])["model"]
    state = 3 * sum(p.numel() for p in model.parameters()) * 4 / 2**20  # float32 gradients, AdamW's two moments
    # at least what the first step makes to stay; far less than the process (the imports, the
    # weights), which was there before it
    assert state < mib < 4 * state


@pytest.mark.parametrize("splits", ["4x2,4x1", "4-2", "4x0", "4x2x1"])
def test_bad_splits_are_one_line(splits, capsys):
    assert bench.main([*SMALL, f"--splits={splits}"]) == 2
    assert capsys.readouterr().err == ("error: write splits as BATCHxACCUM, all of the same product, e.g. "
                                       f"--splits=50x16,100x8; got '{splits}'\n")


def test_modes_do_not_mix(capsys):
    assert bench.main([*SMALL, "--splits=4x2", "--profile"]) == 2
    assert capsys.readouterr().err == "error: --splits and --profile do not go together: pick one\n"


def test_flags_as_key_space_value(capsys):
    spaced = ["config/tiny_cpu.py", "--iters", "3", "--compare", "--impl", "readable,fast", "--batch_size", "2",
              "--profile", "0", "--device", "cpu"]
    joined = ["config/tiny_cpu.py", "--iters=3", "--compare=True", "--impl=readable,fast", "--batch_size=2",
              "--profile=0", "--device=cpu"]
    assert bench.parse_args(spaced) == bench.parse_args(joined)
    assert bench.main(["config/tiny_cpu.py", "--iter", "3"]) == 2  # a misspelt bench key: the closest one
    assert capsys.readouterr().err == "error: unknown key iter; did you mean iters?\n"
    assert bench.main([*spaced, "--help"]) == 0  # the values that the rest of the command line gives
    assert "\n  --iters=3\n" in capsys.readouterr().out


# ----------------------------------------
# --gpu_report: what a CPU can check


def test_gpu_report_arguments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the configs are the repository's, wherever it runs
    monkeypatch.setattr(train, "check_device", lambda device: None)  # as on a GPU
    settings, runs = bench.parse_args(["--gpu_report", "--device=cuda"])
    assert settings["gpu_report"] == "out-bench/gpu_report.md" and settings["budget_s"] == 300
    assert [label for label, _, _ in runs] == ["baseline", "future50_mse[auto]", "encdec_mse_possub"]
    settings, runs = bench.parse_args(["--gpu_report", "mine.md", "--budget_s", "60", "--n_layer=3", "--commit=abc123",
                                       "--device=cuda"])
    assert settings["gpu_report"] == "mine.md" and settings["budget_s"] == 60 and settings["commit"] == "abc123"
    assert all(config["n_layer"] == 3 for _, config, _ in runs)  # train.py's flags go to every config


def test_gpu_report_on_a_gpu_measures_the_writeups_own_shapes(monkeypatch):
    # the configs as a GPU measures them, whatever this machine has: their own sizes, 50 x 16 first
    monkeypatch.setattr(train, "check_device", lambda device: None)
    settings, runs = bench.parse_args(["--gpu_report", "--device=cuda"])
    assert not settings["rehearsal"] and (settings["warmup"], settings["iters"]) == (5, 20)
    assert bench.parse_splits(settings["splits"]) == [(50, 16), (200, 4), (800, 1), (100, 8), (400, 2)]
    for (_, config, _), name in zip(runs, bench.GPU_REPORT_CONFIGS):
        assert config == train.get_config([f"{REPO}/config/{name}.py", "--device=cuda"])


def test_the_rehearsal_shrinks_every_config_and_keeps_its_options():
    settings, runs = bench.parse_args(["--gpu_report", "--device=cpu"])
    assert settings["rehearsal"] and (settings["warmup"], settings["iters"], settings["profile"]) == (1, 2, 1)
    # the same micro-steps per optimizer step as the GPU's splits, of 32 sequences in all
    assert [k for _, k in bench.parse_splits(settings["splits"])] == [16, 4, 1, 8, 2]
    assert {b * k for b, k in bench.parse_splits(settings["splits"])} == {32}
    for (_, config, _), name in zip(runs, bench.GPU_REPORT_CONFIGS):
        full = train.get_config([f"{REPO}/config/{name}.py", "--device=cpu"])
        changed = {key for key in config if config[key] != full[key]}
        assert changed <= {"n_layer", "n_embd", "block_size", "vocab_size", "future_dim"}
        assert (config["n_layer"], config["block_size"], config["vocab_size"]) == (2, 32, 256)
        train.model_args_of(config)  # a model the config's checks accept
    future = runs[1][1]
    assert future["future_dim"] == 8  # 50 of 199 later positions, 8 of 31


@pytest.mark.parametrize("argv, message", [
    (["--gpu_report", "config/baseline.py"], "--gpu_report times the write-ups' configs: give none"),
    (["--gpu_report", "--splits=4x2"], "--splits and --gpu_report do not go together: pick one"),
    ([*SMALL, "--commit=abc123"], "--commit names the commit of a --gpu_report"),
])
def test_gpu_report_bad_arguments_are_one_line(argv, message, capsys):
    assert bench.main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_gpu_report_refuses_a_device_that_is_neither_cuda_nor_a_cpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)  # an Apple GPU
    assert bench.main([f"--gpu_report={tmp_path / 'report.md'}", "--device=mps"]) == 1
    assert capsys.readouterr().err == "error: --gpu_report measures a CUDA GPU, or rehearses on a CPU: not mps\n"
    assert not (tmp_path / "report.md").exists()


def fake_measurements(monkeypatch, path, seconds):
    """Measurements that "take" seconds[what] of a patched clock, steps of 1 s; returns the names
    of those started, and checks that the report on disk holds all those before each one."""
    clock, started = [0.0], []

    def measuring(what, label, split):
        if started:  # every measurement before this one is in the report on disk
            assert len(re.findall(r"^(\| [\w\[\]]+ \| sdpa|## Profile)", path.read_text(), re.MULTILINE)) == len(started)
        started.append(f"{what} {label} {split[0]}x{split[1]}")
        clock[0] += seconds[what]

    def measure(label, config, impl, split, settings):
        measuring("time", label, split)
        run = dict(label=label, times=[1.0] * settings["iters"])
        row = dict(config=label, attention="sdpa", dtype="bfloat16", compile=True, split="b × k",
                   ms_per_micro_step=1.0, ms_per_step=1.0, tokens_per_s=1.0, mfu=None, peak_mib=0)
        return row, run

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "profile", lambda run, s: measuring("profile", run["label"], (50, 16)) or "a table")
    return started


TIMINGS = ["time baseline 50x16", "time future50_mse[auto] 50x16", "time encdec_mse_possub 50x16"]
PROFILES = ["profile baseline 50x16", "profile future50_mse[auto] 50x16"]
LARGER = ["time baseline 200x4", "time future50_mse[auto] 200x4"]


@pytest.mark.parametrize("budget_s, measured, first_not_measured", [
    # each timing "takes" 60 s: 35 s to build and compile, then 25 steps of 1 s; a profile 7 s (5 +
    # 2 steps). 3 timings and 2 profiles end at 194 s, a timing more at 254 s: it fits 300 s, and
    # then none does (60 s, 46 s left). With 150 s the third timing does not fit, the profiles do.
    (300, TIMINGS + PROFILES + LARGER[:1], LARGER[1]),
    (330, TIMINGS + PROFILES + LARGER, "time encdec_mse_possub 200x4"),
    (150, TIMINGS[:2] + PROFILES, TIMINGS[2]),
])
def test_gpu_report_starts_no_measurement_it_expects_to_end_past_its_budget(budget_s, measured, first_not_measured,
                                                                              tmp_path, monkeypatch):
    path = tmp_path / "out" / "report.md"
    settings, runs = bench.parse_args([f"--gpu_report={path}", f"--budget_s={budget_s}", "--device=cpu"])
    settings.update(rehearsal=False, warmup=5, iters=20, profile=2, splits=bench.GPU_REPORT_SPLITS)
    started = fake_measurements(monkeypatch, path, dict(time=60, profile=7))
    assert bench.gpu_report(runs, settings, dict(device="a fake GPU")) == 0
    assert started == measured
    text = path.read_text()
    timings = [name for name in measured if name.startswith("time")]
    assert len(re.findall(r"^\| [\w\[\]]+ \| sdpa", text, re.MULTILINE)) == len(timings)  # their rows
    assert f"Not measured: {first_not_measured} (about 60 s, " in text


def test_the_rehearsal_writes_the_gpus_report_and_goes_on_past_a_failed_measurement(tmp_path, monkeypatch, capsys):
    # the one command a GPU runs, on a CPU in seconds; one measurement made to fail as a GPU's
    # compile or kernel can, with an error that is not "out of memory"
    build = bench.build

    def build_failing_once(label, config, impl):
        if label.startswith("future50_mse") and config["gradient_accumulation_steps"] == 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore | lines")
        return build(label, config, impl)

    monkeypatch.setattr(bench, "build", build_failing_once)
    path = tmp_path / "out" / "report.md"
    assert bench.main([f"--gpu_report={path}", "--device=cpu", "--commit=abc123"]) == 0
    text = path.read_text()
    assert "**A rehearsal on a CPU: not a measurement.**" in text
    assert f"| torch | {torch.__version__} |" in text and "| commit | abc123 |" in text
    rows = re.findall(r"^\| (\S+) \| (\S+) \| float32 \| no \| (\d+) × (\d+) \| (.*) \| [\d.]+ \|$", text, re.MULTILINE)
    expected = [("baseline", "sdpa"), ("future50_mse[auto]", "fast"), ("encdec_mse_possub", "sdpa")] * 5
    expected[4] = ("future50_mse[auto]", "-")  # failed before it ran
    assert [(name, attention) for name, attention, *_ in rows] == expected
    assert [(int(b), int(k)) for _, _, b, k, _ in rows] == [split for split in bench.parse_splits(bench.REHEARSAL_SPLITS) for _ in range(3)]
    failed = rows[4][4]  # future attention at 8 x 4: its one line, and the rest measured after it
    assert failed.startswith("failed: RuntimeError: CUDA error: an illegal memory access was encountered |")
    for _, _, b, k, cells in rows[:4] + rows[5:]:
        micro_ms, step_ms, tokens_per_s, mfu, peak = cells.split(" | ")
        assert float(step_ms) == pytest.approx(float(micro_ms) * int(k), rel=0.01)
        assert float(tokens_per_s.replace(",", "")) == pytest.approx(int(b) * int(k) * 32 / float(step_ms) * 1000, rel=0.01)
    assert re.findall(r"^## Profile: profile (\S+) 2x16$", text, re.MULTILINE) == ["baseline", "future50_mse[auto]"]
    assert "Not measured: nothing." in text
    assert "Traceback" in capsys.readouterr().err  # the whole failure on the console


# ----------------------------------------
# on a CUDA GPU


@pytest.mark.cuda  # conftest.py skips it without a CUDA GPU
def test_a_cuda_step_reports_its_peak_memory(capsys):
    gpu = ["--device=cuda", "--dtype=float32", "--compile=False", "--batch_size=4", "--gradient_accumulation_steps=1"]
    assert bench.main([*SMALL, *gpu, "--memory", "--warmup=1"]) == 0
    mib = float(re.search(r"peak memory of a step: ([\d,.]+) MiB", capsys.readouterr().out).group(1).replace(",", ""))
    logits = 4 * 16 * 256 * 4 / 2**20  # the float32 (B, T, vocab) logits, alive at the peak
    assert logits < mib < 1000 * logits
    assert bench.main([*SMALL, *gpu, "--iters=2", "--warmup=1"]) == 0
    assert re.search(r"tokens/s .*peak memory +[\d.]+ MiB", capsys.readouterr().out)
