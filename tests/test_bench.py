"""
Tests of bench.py's tools that need no GPU: the kernel kinds of --profile, a CPU profile and
a CPU --splits run of a small model end to end, the MFU it reports, a step that is train.py's
optimizer step, --memory, and --gpu_report's arguments, refusal, orchestration and table.

    python -m pytest -q test_bench.py
"""

import json
import re
import types

import pytest
import torch

import bench
import train

# a small model so that a step takes milliseconds on a CPU
SMALL = ["config/tiny_cpu.py", "--device=cpu", "--vocab_size=256", "--n_layer=2", "--n_embd=32",
         "--n_head=2", "--block_size=16"]


@pytest.mark.parametrize("name, kind", [
    # CUDA kernels: cuBLAS and CUTLASS matmuls, Inductor's matmul template
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "matmul"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "matmul"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)", "matmul"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*)", "matmul"),
    ("triton_tem_fused_mm_0", "matmul"),
    # attention: FlashAttention (built with CUTLASS), memory-efficient, cuDNN, FlexAttention
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_kernel0_0", "attention"),
    ("triton_tem_fused_flex_attention_0", "attention"),
    # the loss: ATen's log-softmax and NLL, and the Triton kernel fusing them
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)", "head + loss"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)", "head + loss"),
    ("triton_red_fused__log_softmax_nll_loss_forward_3", "head + loss"),
    # Triton's fused kernels are pointwise even when named after the addmm whose bias they add
    ("triton_per_fused_add_native_layer_norm_native_layer_norm_backward_7", "norm + pointwise"),
    ("triton_poi_fused_addmm_gelu_5", "norm + pointwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)", "norm + pointwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4>)", "norm + pointwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, bool, float const*, float const*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, bool, float const*, float const*)", "optimizer"),
    ("Memcpy HtoD (Pageable -> Device)", "memory copies"),
    ("Memset (Device)", "memory copies"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1})", "memory copies"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "memory copies"),
    ("void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(long const*, float const*, float*, int, long, int, int)", "other"),
    # CPU ops
    ("aten::mm", "matmul"),
    ("aten::addmm", "matmul"),
    ("aten::bmm", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
    ("aten::_log_softmax_backward_data", "head + loss"),
    ("aten::nll_loss_forward", "head + loss"),
    ("aten::native_layer_norm_backward", "norm + pointwise"),
    ("aten::gelu_backward", "norm + pointwise"),
    ("aten::add", "norm + pointwise"),
    ("aten::_fused_adamw_", "optimizer"),
    ("aten::_foreach_lerp_", "optimizer"),
    ("Optimizer.step#AdamW.step", "optimizer"),
    ("aten::copy_", "memory copies"),
    ("aten::fill_", "memory copies"),
    # autograd's bookkeeping around the backward ops, whatever their kind
    ("autograd::engine::evaluate_function: LogSoftmaxBackward0", "other"),
    ("ScaledDotProductFlashAttentionForCpuBackward0", "other"),
    ("aten::view", "other"),
    ("aten::embedding_dense_backward", "other"),
])
def test_kind_of_kernel_and_op_names(name, kind):
    assert bench.kind_of(name) == kind


def event(name, parent=None):
    return types.SimpleNamespace(name=name, cpu_parent=parent)


def test_a_cpu_op_counts_as_its_outermost_callers_kind():
    engine = event("autograd::engine::evaluate_function: NllLossBackward0")
    nll_backward = event("aten::nll_loss_backward", event("NllLossBackward0", engine))
    assert bench.kind_of_op(event("aten::fill_", event("aten::zero_", nll_backward))) == "head + loss"
    assert bench.kind_of_op(event("aten::lerp_", event("Optimizer.step#AdamW.step"))) == "optimizer"
    assert bench.kind_of_op(event("aten::mm", event("MmBackward0", event("autograd::engine::evaluate_function: MmBackward0")))) == "matmul"
    assert bench.kind_of_op(engine) == "other"


def test_busy_time_is_the_union_of_intervals():
    assert bench.busy_time([(5, 6), (0, 2), (1, 3), (5.5, 5.7), (2, 2.5)]) == pytest.approx(4.0)
    assert bench.busy_time([]) == 0


def table_rows(out):
    """{kind: (ms per step, %)} from the printed --profile table."""
    rows = re.findall(r"^  (\S.*?)\s+(\d+\.\d\d)\s+(\d+\.\d)%$", out, re.MULTILINE)
    return {kind: (float(ms), float(pct)) for kind, ms, pct in rows}


def test_profile_on_cpu_adds_up(capsys, tmp_path):
    trace = tmp_path / "trace.json"
    assert bench.main([*SMALL, "--batch_size=4", "--profile=2", "--warmup=1", f"--profile_trace={trace}"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert list(rows) == [*bench.KINDS, "outside ops (Python)", "total (wall)"]
    total, percent = rows.pop("total (wall)")
    assert percent == 100.0
    # each op's self time counts once: the kinds and the time outside ops make up the wall time
    assert sum(ms for ms, _ in rows.values()) == pytest.approx(total, abs=0.01 * len(rows))
    assert sum(pct for _, pct in rows.values()) == pytest.approx(100.0, abs=0.1 * len(rows))
    for kind in ("matmul", "head + loss", "optimizer", "attention"):
        assert rows[kind][0] > 0, kind
    assert "top 15 ops by time:" in out and "aten::mm" in out
    assert json.loads(trace.read_text())["traceEvents"]


def test_splits_time_whole_optimizer_steps(capsys):
    assert bench.main([*SMALL, "--splits=4x2,8x1", "--warmup=1", "--iters=2"]) == 0
    out = capsys.readouterr().out
    assert "128 tokens per optimizer step (8 sequences of 16)" in out
    rows = re.findall(r"^tiny_cpu (\d+x\d+) +([\d.]+) ms/iter .*? (\d+) tokens/s", out, re.MULTILINE)
    assert [split for split, _, _ in rows] == ["4x2", "8x1"]
    for _, ms, tokens_per_s in rows:  # 128 tokens per step, whatever the split
        # ms/iter is printed to 0.1 ms: on a fast machine that rounding alone is over 1%
        rounding = 0.05 / float(ms)
        assert int(tokens_per_s) == pytest.approx(128 / (float(ms) / 1000), rel=0.01 + rounding, abs=1)


def test_a_step_runs_every_micro_step_on_the_mean_loss():
    _, runs = bench.parse_args([*SMALL, "--batch_size=3"])
    run = bench.build(*runs[0], micro_steps=4)
    passes, model = [], run["step_model"]

    def counted(x, y):
        passes.append(x)
        return model(x, y)

    run["step_model"] = counted
    bench.step(run)
    assert len(passes) == 4
    # 4 passes over the same batch, each loss divided by 4: after one step AdamW's first
    # moment is (1 - beta1) x the gradient of a single pass
    reference = bench.build(*runs[0])  # the same seed: the same weights and batch
    _, loss, _ = reference["model"](reference["x"], reference["y"])
    loss.backward()
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
    monkeypatch.setattr(train, "read_numbers", lambda numbers, ddp: calls.append(("read", sorted(numbers))) or read(numbers, ddp))
    monkeypatch.setattr(run["optimizer"], "step", lambda *a: calls.append("AdamW"))
    bench.step(run)
    assert len(passes) == 3
    assert calls == ["unscale", ("clip", 0.5), ("read", ["cross_entropy", "grad_norm", "loss"]), "AdamW"]


def test_memory_reports_the_peak_of_one_step(capsys):
    assert bench.main([*SMALL, "--batch_size=4", "--gradient_accumulation_steps=2", "--memory", "--warmup=1"]) == 0
    found = re.search(r"peak tensor memory of one step \(2 x \(forward, backward\) of batch 4 x 16, then AdamW\): "
                      r"([\d,.]+) MiB above its start", capsys.readouterr().out)
    logits = 4 * 16 * 256 * 4 / 2**20  # the (B, T, vocab) float32 logits, alive at the peak
    assert found and float(found.group(1).replace(",", "")) > 3 * logits


@pytest.mark.parametrize("splits, message", [
    ("4x2,4x1", "split 4x1 trains on 4 sequences per optimizer step but 4x2 on 8"),
    ("4-2", "write splits as BATCHxACCUM"),
    ("4x0", "write splits as BATCHxACCUM"),
])
def test_bad_splits_are_one_line(splits, message, capsys):
    assert bench.main([*SMALL, f"--splits={splits}"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_modes_do_not_mix(capsys):
    assert bench.main([*SMALL, "--splits=4x2", "--profile"]) == 2
    assert "--splits and --profile do not go together" in capsys.readouterr().err
    assert bench.main([*SMALL, "--profile_trace=t.json"]) == 2
    assert "add --profile" in capsys.readouterr().err


def test_an_implementation_that_cannot_compute_the_config_is_one_line(capsys):
    computed = ["config/future50_mse_computed.py", *SMALL[1:], "--future_dim=4", "--iters=1", "--warmup=0"]
    assert bench.main([*computed, "--impl=fast"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: impl='fast' has no computed future keys") and err.count("\n") == 1


def test_flags_as_key_space_value(capsys):
    spaced = ["config/tiny_cpu.py", "--iters", "3", "--compare", "--impl", "readable,fast", "--batch_size", "2",
              "--profile", "0", "--device", "cpu"]
    joined = ["config/tiny_cpu.py", "--iters=3", "--compare=True", "--impl=readable,fast", "--batch_size=2",
              "--profile=0", "--device=cpu"]
    assert bench.parse_args(spaced) == bench.parse_args(joined)
    assert bench.main(["config/tiny_cpu.py", "--iter", "3"]) == 2  # a misspelt bench key: the closest one
    assert capsys.readouterr().err == "error: unknown key iter; did you mean iters?\n"


def test_report_counts_every_micro_step(capsys):
    _, runs = bench.parse_args([*SMALL, "--batch_size=4"])
    run = dict(bench.build(*runs[0], micro_steps=2), device="cuda", times=[0.1, 0.1, 0.1])  # as if on a GPU
    bench.report(run, dict(peak_flops=1e12))
    mfu = run["model"].flops_per_token() * 16 * 8 / 0.1 / 1e12  # 8 sequences of 16 tokens in 0.1 s
    out = capsys.readouterr().out
    assert "1280 tokens/s" in out and f"MFU {mfu * 100:5.1f}%" in out
    bench.report(run, dict(peak_flops=None))
    assert "MFU n/a" in capsys.readouterr().out


CAUSAL_MODELS = """
from torch import nn


class Tiny(nn.Module):
    block_size = 8

    def __init__(self, leak):
        super().__init__()
        self.leak, self.embed, self.head = leak, nn.Embedding(16, 8), nn.Linear(8, 16)

    def forward(self, idx):
        x = self.embed(idx)
        return self.head(x + x.roll(-1, dims=1) if self.leak else x)  # roll: position i reads i+1


def causal():
    return Tiny(leak=False)


def leaky():
    return Tiny(leak=True)
"""


def test_causal_times_check_causal_in_a_fresh_process_per_model(tmp_path, monkeypatch, capsys):
    (tmp_path / "models.py").write_text(CAUSAL_MODELS)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--causal=models.py:causal,models.py:leaky"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["models.py:causal"][-1] == "causal" and rows["models.py:leaky"][-2:] == ["-", "leak"]
    wall, cpu, checks = (float(x) for x in rows["models.py:causal"][:3])
    assert 0 <= checks < wall and cpu > 0  # a tiny model's checks may take less than the 0.1 s printed


# --------------------------------------------------------------------------------------
# --gpu_report: what a CPU can check


def test_gpu_report_arguments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the configs are the repository's, wherever it runs
    settings, runs = bench.parse_args(["--gpu_report"])
    assert settings["gpu_report"] == "out-bench/gpu_report.md" and settings["profile"] == 5
    assert settings["splits"] == [(50, 16), (100, 8), (200, 4), (400, 2), (800, 1)]
    assert [label for label, _, _ in runs] == ["baseline", "future50_mse[auto]", "encdec_mse_possub"]
    for _, config, _ in runs:  # the write-ups' settings: 800 sequences of 200 tokens per step
        assert config["batch_size"] * config["gradient_accumulation_steps"] * config["block_size"] == 160_000
    settings, runs = bench.parse_args(["--gpu_report", "mine.md", "--iters", "3", "--n_layer=3"])
    assert settings["gpu_report"] == "mine.md" and settings["iters"] == 3
    assert all(config["n_layer"] == 3 for _, config, _ in runs)  # train.py's flags go to every config


@pytest.mark.parametrize("argv, message", [
    (["--gpu_report", "config/baseline.py"], "--gpu_report times the write-ups' three configs: give no config file"),
    (["--gpu_report", "--splits=4x2"], "--splits and --gpu_report do not go together: pick one"),
    (["--gpu_report", "--profile"], "--profile and --gpu_report do not go together: pick one"),
])
def test_gpu_report_bad_arguments_are_one_line(argv, message, capsys):
    assert bench.main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="refuses only where there is no CUDA GPU")
def test_gpu_report_refuses_a_machine_without_cuda(tmp_path, capsys):
    assert bench.main([f"--gpu_report={tmp_path / 'report.md'}"]) == 1
    assert capsys.readouterr() == ("", "error: --gpu_report measures a CUDA GPU, and the device here is cpu: "
                                       "run it on a machine with one\n")
    assert not (tmp_path / "report.md").exists()


def test_gpu_report_skips_a_split_out_of_memory_and_profiles_the_fastest(tmp_path, monkeypatch, capsys):
    # the whole mode on a CPU with a small model: 8 sequences at once run "out of memory"
    settings, runs = bench.parse_args([*SMALL, "--splits=2x4,4x2,8x1", "--warmup=1", "--iters=2"])
    settings.update(gpu_report=str(tmp_path / "out" / "report.md"), profile=1, peak_flops=None)
    build, profile, profiled = bench.build, bench.profile, []

    def build_within_memory(label, config, impl, micro_steps=None):
        if config["batch_size"] == 8:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return build(label, config, impl, micro_steps=micro_steps)

    monkeypatch.setattr(bench, "build", build_within_memory)
    monkeypatch.setattr(bench, "profile", lambda run, s: profiled.append(run["label"]) or profile(run, s))
    assert bench.gpu_report(runs, settings, "a CPU") == 0
    out = capsys.readouterr().out
    assert "tiny_cpu 8x1: out of memory, skipped" in out and out.endswith(f"wrote {tmp_path}/out/report.md\n")
    text = (tmp_path / "out" / "report.md").read_text()
    rows = dict(re.findall(r"^\| tiny_cpu \| (\dx\d) \| ([\d.]+|out of memory) \|", text, re.MULTILINE))
    assert list(rows) == ["2x4", "4x2", "8x1"] and rows["8x1"] == "out of memory"
    [fastest] = profiled  # the split with the fewest ms per step, as printed to 0.1 ms
    other = {"tiny_cpu 2x4": "4x2", "tiny_cpu 4x2": "2x4"}[fastest]
    assert float(rows[fastest.split()[1]]) <= float(rows[other])
    assert f"| kind | {fastest} | % |" in text and "| outside ops (Python) |" in text


def test_gpu_report_markdown_with_made_up_numbers():
    numbers = dict(ms=512.34, min_ms=500.0, max_ms=530.0, tokens_per_s=312_289.6, mfu=0.2345,
                   peak_memory=12.5 * 2**30)
    profile = {**dict.fromkeys(bench.KINDS, 0.0), "matmul": 300.0, "attention": 100.0,
               "host gaps (GPU idle)": 100.0, "total (wall)": 500.0}
    text = bench.gpu_report_markdown(
        "H100, torch 2.11. Each config ...", [(50, 16), (800, 1)],
        {"baseline": [numbers, None], "encdec_mse_possub": [dict(numbers, mfu=None, peak_memory=None), None]},
        {"baseline 50x16": profile}, profiled_steps=5)
    assert text.splitlines()[:10] == [
        "# bench.py --gpu_report", "", "H100, torch 2.11. Each config ...", "",
        "| config | split | ms per step | tokens/s | MFU | peak memory |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
        "| baseline | 50x16 | 512.3 | 312,290 | 23.4% | 12.5 GiB |",
        "| baseline | 800x1 | out of memory | | | |",
        "| encdec_mse_possub | 50x16 | 512.3 | 312,290 | - | - |",
        "| encdec_mse_possub | 800x1 | out of memory | | | |",
    ]
    kinds = text.split("| --- | ---: | ---: |\n")[1].splitlines()
    assert text.count("| kind | baseline 50x16 | % |") == 1 and len(kinds) == len(bench.KINDS) + 2
    assert kinds[0] == "| matmul | 300.00 | 60.0% |" and kinds[-2:] == [
        "| host gaps (GPU idle) | 100.00 | 20.0% |", "| total (wall) | 500.00 | 100.0% |"]
