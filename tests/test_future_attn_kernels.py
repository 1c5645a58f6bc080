"""
Tests of future_attn_kernels.py, the faster versions of future attention, against the
readable one of model_future_attn.py; and of the choice between them (FutureAttention.impl,
GPT.set_impl), including model_future_attn.py on its own, without the kernels beside it.
A new kernel, or a new rule for which version runs, gets its tests here; the readable
version's own tests are in test_models.py.

future_attention is the reference: future_attention_fast must give the same out,
out_future, out_future_star, losses and gradients (float32 tolerance), and a GPT must give
the same logits, losses and gradients whichever version runs; the fast path must
be causal. future_attention_flex is traced into one graph on a CPU, forward and backward, and
compared with the readable version there (its backward computed by torch's reference code,
which FlexAttention's CPU guard otherwise refuses); on a machine with a CUDA GPU the tests marked
`cuda` also check its Triton kernels' gradients, its compiled bf16 training step and its
causality. Every test here runs with TF32 off: they compare float32 kernels at float32
tolerances. Run:
python -m pytest -q test_future_attn_kernels.py
"""

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

import model_baseline as mb
import model_future_attn as mf
from conftest import REPO, tiny
from lib import future_attn_kernels as kernels

TOL = dict(rtol=1e-4, atol=2e-5)  # float32: the two paths sum in different orders

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(autouse=True)
def float32_matmuls():
    """TF32 off for every test here, then put back: a run or a benchmark earlier in the same
    process may have left it on, and its 10-bit mantissa exceeds the float32 tolerances."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_the_float32_comparisons_run_without_tf32():
    # cudnn's TF32 is on by default, and train.py or bench.py, run in this process before these
    # tests, turn on the matmuls' for as long as they run
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
# the sizes of the tiny models here
SIZES = dict(vocab_size=50, block_size=16, n_layer=2, n_head=3, n_embd=24, future_dim=5)

# (T, C, future_dim, head size, bias, queries_per_block): T < C and T = C, future_dim 1
# and C-1, odd head sizes, one block and many (uneven: 130 = 5 blocks of 26)
CASES = [
    (12, 12, 1, 4, False, 64),
    (12, 12, 11, 5, True, 64),
    (7, 12, 3, 3, True, 64),
    (1, 12, 4, 4, False, 64),
    (130, 130, 50, 16, True, 64),
    (100, 130, 129, 7, False, 64),
    (40, 40, 9, 6, True, 9),
]


def make_inputs(T, C, hs, bias, seed, B=2, H=3):
    """q, k, v, K_future, V_future (and the two biases, or None), all requiring grad."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, T, hs)] * 3 + [(H, hs, C - 1), (H, C - 1, hs)]
    if bias:
        shapes += [(H, 1, C - 1), (H, 1, hs)]
    tensors = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    return tensors + [None] * (7 - len(tensors))


def run_attention(fn, inputs, *, future_dim, with_target, detach_target, loss_type, seed,
                  fast_kw={}):
    """fn's three outputs, its future-attention loss, and the gradients of a random
    weighting of out plus that loss with respect to every input."""
    out, out_future, out_future_star = fn(*inputs, future_dim=future_dim, with_target=with_target,
                                          **fast_kw)
    g = torch.Generator().manual_seed(seed)
    total = (out * torch.randn(out.shape, generator=g).to(out.device)).sum()
    loss = None
    if with_target:
        star = out_future_star.detach() if detach_target else out_future_star
        loss = mf.future_attn_loss(out_future, star, loss_type)
        total = total + 100.0 * loss  # the loss is a mean: scale it to matter in the gradients
    leaves = [x for x in inputs if x is not None]
    grads = torch.autograd.grad(total, leaves)
    return (out, out_future, out_future_star), loss, grads


@pytest.mark.parametrize("T, C, future_dim, hs, bias, queries_per_block", CASES)
@pytest.mark.parametrize("with_target, detach_target, loss_type",
                         [(False, True, "mse"), (True, True, "mse"), (True, False, "mse"),
                          (True, False, "cosine")])
def test_fast_matches_readable(T, C, future_dim, hs, bias, queries_per_block, with_target,
                               detach_target, loss_type):
    inputs = make_inputs(T, C, hs, bias, seed=T + future_dim)
    kw = dict(future_dim=future_dim, with_target=with_target, detach_target=detach_target,
              loss_type=loss_type, seed=1)
    ref_outs, ref_loss, ref_grads = run_attention(mf.future_attention, inputs, **kw)
    outs, loss, grads = run_attention(kernels.future_attention_fast, inputs, fast_kw=dict(
        detach_target=detach_target, queries_per_block=queries_per_block), **kw)
    for name, a, b in zip(("out", "out_future", "out_future_star"), outs, ref_outs):
        if b is None:
            assert a is None, name
        else:
            torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")
    if with_target:
        torch.testing.assert_close(loss, ref_loss, **TOL)
        # a detached target has no graph, as the readable one after .detach()
        assert outs[2].requires_grad == (not detach_target)
    names = ["q", "k", "v", "K_future", "V_future", "K_future_bias", "V_future_bias"]
    for name, a, b in zip(names, grads, ref_grads):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"grad {name}: {m}")


def test_comparison_is_sensitive():
    # the comparison above must notice a wrong mask: one future key too many differs
    inputs = make_inputs(12, 12, 4, bias=False, seed=0)
    ref = mf.future_attention(*inputs, future_dim=3, with_target=True)
    fast = kernels.future_attention_fast(*inputs, future_dim=4, with_target=True)
    for a, b in zip(fast, ref):
        assert not torch.allclose(a, b, **TOL)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("T, C, future_dim, hs, with_v_bias",
                         [(12, 12, 1, 16, False), (12, 12, 11, 16, True), (7, 12, 3, 16, False),
                          (130, 130, 50, 16, True), (100, 130, 129, 32, False)])
def test_flex_forward_matches_readable(T, C, future_dim, hs, with_v_bias):
    inputs = [x.detach() for x in make_inputs(T, C, hs, bias=True, seed=T)]  # no backward on a CPU
    q, k, v, K_future, V_future, _, V_future_bias = inputs
    V_future_bias = V_future_bias if with_v_bias else None
    with torch.no_grad():
        ref = mf.future_attention(q, k, v, K_future, V_future, None, V_future_bias,
                                  future_dim=future_dim, with_target=True)
        flex = kernels.future_attention_flex(q, k, v, K_future, V_future, V_future_bias,
                                             future_dim=future_dim, with_target=True)
    for name, a, b in zip(("out", "out_future", "out_future_star"), flex, ref):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("training", [False, True])
def test_flex_builds_each_block_mask_once_for_all_layers(training, monkeypatch):
    # the masks depend on T and future_dim only: built once (causal, future; in training the
    # target's band too), then shared by every layer and every later forward
    from torch.nn.attention import flex_attention as flex_module
    monkeypatch.setattr(kernels, "_flex_masks", {})
    built = spy(monkeypatch, flex_module, "create_block_mask")
    model = tiny(mf, SIZES, n_layer=4, n_head=2, n_embd=32).set_impl("flex").train(training)
    idx = torch.randint(50, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(idx, idx)
        assert len(built) == (3 if training else 2)
        model(idx, idx)
    assert len(built) == (3 if training else 2)


def test_fast_is_causal():
    # out and out_future at positions <= i must not change when q, k, v after i do
    inputs = make_inputs(40, 40, 4, bias=True, seed=3)
    q, k, v, K_future, V_future, K_future_bias, V_future_bias = inputs
    i = 17
    with torch.no_grad():
        before = kernels.future_attention_fast(q, k, v, K_future, V_future, K_future_bias,
                                               V_future_bias, future_dim=9, queries_per_block=8)
        for x in (q, k, v):
            x[:, :, i + 1:] += 5.0
        after = kernels.future_attention_fast(q, k, v, K_future, V_future, K_future_bias,
                                              V_future_bias, future_dim=9, queries_per_block=8)
    for a, b in zip(before[:2], after[:2]):
        torch.testing.assert_close(a[:, :, :i + 1], b[:, :, :i + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(a[:, :, i + 1:], b[:, :, i + 1:])  # the change did arrive


# --------------------------------------------------------------------------------------
# which version runs: FutureAttention.impl ('auto' unless GPT.set_impl says otherwise)


def spy(monkeypatch, module, name):
    """Counts the calls of module.<name>."""
    calls = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or original(*a, **kw))
    return calls




def first_layer(**overrides):
    """The first FutureAttention layer of a tiny model (its weights initialized), and an input
    (2, 16, 24)."""
    layer = tiny(mf, SIZES, **overrides).transformer.h[0].attn
    return layer, torch.randn(2, 16, 24, generator=torch.Generator().manual_seed(0))


def test_auto_picks_fast_on_cpu_and_readable_with_dropout(monkeypatch):
    fast = spy(monkeypatch, kernels, "future_attention_fast")
    readable = spy(monkeypatch, mf, "future_attention")
    layer, x = first_layer(dropout=0.1)
    assert layer.impl == "auto"
    layer.eval()(x)  # no dropout outside training
    assert (len(fast), len(readable)) == (1, 0)
    layer.train()(x)  # dropout on P_omni: only the readable version has it
    assert (len(fast), len(readable)) == (1, 1)
    layer.impl = "readable"
    layer.eval()(x)
    assert (len(fast), len(readable)) == (1, 2)


def test_auto_picks_readable_before_the_window_is_full(monkeypatch):
    # generation's lengths T < C: the faster versions plan for one T, and would compile once
    # per length
    fast = spy(monkeypatch, kernels, "future_attention_fast")
    readable = spy(monkeypatch, mf, "future_attention")
    layer, x = first_layer()
    layer.eval()(x[:, :7])
    assert (len(fast), len(readable)) == (0, 1)
    layer(x)  # T = C
    assert (len(fast), len(readable)) == (1, 1)


def test_dispatch_errors():
    # a name, and whether its version applies to the layer, are checked once, when it is set
    layer, x = first_layer(bias=True, dropout=0.1)
    with pytest.raises(ValueError, match="unknown future attention impl"):
        layer.set_impl("quick")
    with pytest.raises(ValueError, match="K_future_bias"):
        layer.set_impl("flex")
    assert layer.impl == "auto"  # unchanged by the refusals
    layer.set_impl("fast")  # dropout depends on the mode: checked at the call
    layer.eval()(x)
    with pytest.raises(ValueError, match="no attention dropout"):
        layer.train()(x)


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_auto_runs_the_readable_computed_attention(dropout_p, monkeypatch):
    # future_kv='computed' has the readable version only: 'auto' and 'readable' take it
    readable = spy(monkeypatch, mf, "computed_future_attention")
    fast = spy(monkeypatch, kernels, "future_attention_fast")
    layer, x = first_layer(future_kv="computed", dropout=dropout_p)
    B, T, C = x.shape
    for impl in ("auto", "readable"):
        layer.impl = impl
        torch.manual_seed(0)
        got = layer(x, with_target=True)
        torch.manual_seed(0)  # the same dropout masks, drawn in the same order
        q, k, v = layer.heads(x)
        out, out_future, out_future_star = mf.computed_future_attention(
            q, k, v, layer.K_offset, layer.V_offset, block_size=T, dropout_p=dropout_p,
            with_target=True)
        # (B, nh, T, hs) -> (B, T, C)
        y = layer.resid_dropout(layer.c_proj(out.transpose(1, 2).reshape(B, T, C)))
        expected = (y, mf.future_attn_loss(out_future, out_future_star.detach(), "mse"))
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert (len(readable), len(fast)) == (4, 0)  # two through the layer, two direct


@pytest.mark.parametrize("impl", ["fast", "flex"])
def test_computed_future_keys_refuse_the_fast_paths(impl):
    layer, x = first_layer(future_kv="computed")
    with pytest.raises(ValueError, match=f"impl='{impl}' has no computed future keys"):
        layer.set_impl(impl)
    # and so does a model set onto them (bench.py --impl=fast), with a message that says what to use
    model = tiny(mf, SIZES, future_kv="computed")
    with pytest.raises(ValueError, match="future_kv='computed'.*use impl='readable' or 'auto'"):
        model.set_impl(impl)


def test_set_impl_sets_every_future_layer_and_nothing_saved():
    model = tiny(mf, SIZES, n_layer=4, start_layer=2, end_layer=3)
    state_keys, args = set(model.state_dict()), dataclasses.asdict(model.config)
    blocks = model.transformer.h
    assert [getattr(block.attn, "impl", None) for block in blocks] == [None, "auto", "auto", None]
    assert model.set_impl("fast") is model
    assert [getattr(block.attn, "impl", None) for block in blocks] == [None, "fast", "fast", None]
    # a setting of the run: checkpoints (state_dict, model_args) stay as they were
    assert set(model.state_dict()) == state_keys and dataclasses.asdict(model.config) == args
    assert "impl" not in args


ALONE = """
import importlib.util, json, math, os, sys
import torch
import model_future_attn as mf

torch.set_num_threads(1)
calls = []
readable = mf.future_attention
# counts the calls of the readable path
mf.future_attention = lambda *a, **kw: calls.append(1) or readable(*a, **kw)
torch.manual_seed(0)
model = mf.GPT(mf.GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=16,
                            future_dim=4))
optimizer = model.configure_optimizers(0.0, 1e-2, (0.9, 0.99), "cpu")
x = torch.randint(32, (4, 17))
losses = []
for _ in range(8):
    _, loss, aux = model(x[:, :-1], x[:, 1:])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
try:
    model.set_impl("fast")(x[:, :-1], x[:, 1:])
    error = None
except ValueError as e:
    error = str(e)
print(json.dumps(dict(
    model_file=os.path.abspath(mf.__file__), kernels=mf.kernels,
    others=[name for name in ("future_attn_kernels", "model_baseline", "settings")
            if importlib.util.find_spec(name) is not None],
    losses=losses, readable_calls=len(calls), error=error)))
"""


def test_the_model_file_runs_alone(tmp_path):
    # model_future_attn.py copied by itself into an empty folder: it builds and trains with the
    # readable version
    shutil.copy(os.path.join(REPO, "model_future_attn.py"), tmp_path)
    (tmp_path / "alone.py").write_text(ALONE)
    # without PYTHONPATH, the repository is not on sys.path
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "alone.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["model_file"] == str(tmp_path / "model_future_attn.py")
    # nothing of the repository is in reach
    assert result["kernels"] is None and result["others"] == []
    losses = result["losses"]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert result["readable_calls"] == 2 * 8  # both future layers, every step
    assert "impl='fast' needs future_attn_kernels.py" in result["error"]


# --------------------------------------------------------------------------------------
# the whole model


def forward_backward(model, idx, targets, impl):
    model.set_impl(impl)
    model.zero_grad(set_to_none=True)
    logits, loss, aux = model(idx, targets)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logits, loss, aux, grads


@pytest.mark.parametrize("overrides", [{}, dict(bias=True, future_attn_loss_type="cosine"),
                                       dict(detach_future_ground_truth=False, future_dim=15,
                                            start_layer=2)])
@pytest.mark.parametrize("training", [True, False])
def test_model_same_with_readable_and_fast(overrides, training, monkeypatch):
    model = tiny(mf, SIZES, **overrides).train(training)
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(50, (3, 16), generator=g), torch.randint(50, (3, 16), generator=g)
    ref = forward_backward(model, idx, targets, "readable")
    fast_calls = spy(monkeypatch, kernels, "future_attention_fast")
    got = forward_backward(model, idx, targets, "fast")
    n_future_layers = model.config.end_layer - model.config.start_layer + 1
    assert len(fast_calls) == n_future_layers  # the fast path really ran
    torch.testing.assert_close(got[0], ref[0], **TOL)  # logits
    torch.testing.assert_close(got[1], ref[1], **TOL)  # loss
    aux_keys = {"cross_entropy", "future_attn_loss", "future_attn_loss_per_layer"} if training else set()
    assert got[2].keys() == ref[2].keys() == aux_keys
    for key in ref[2]:
        torch.testing.assert_close(got[2][key], ref[2][key], **TOL)
    assert got[3].keys() == ref[3].keys()
    for name in ref[3]:
        torch.testing.assert_close(got[3][name], ref[3][name], **TOL,
                                   msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("training", [True, False])
def test_model_fast_is_causal(training):
    model = tiny(mf, SIZES).set_impl("fast").train(training)
    g = torch.Generator().manual_seed(2)
    idx, targets = torch.randint(50, (2, 16), generator=g), torch.randint(50, (2, 16), generator=g)
    assert_causal(model, idx, targets, positions=(0, 6, 14), vocab_size=50)


def assert_causal(model, idx, targets, positions, vocab_size):
    """Changing every token after i leaves the logits at positions <= i as they were."""
    for i in positions:
        changed = idx.clone()
        changed[:, i + 1:] = (changed[:, i + 1:] + 1) % vocab_size
        with torch.no_grad():
            before, _, _ = model(idx, targets)
            after, _, _ = model(changed, targets)
        torch.testing.assert_close(before[:, :i + 1], after[:, :i + 1], rtol=0, atol=1e-5,
                                   msg=f"position {i}")
        assert not torch.allclose(before[:, i + 1:], after[:, i + 1:])  # the change did arrive


# --------------------------------------------------------------------------------------
# graphs under torch.compile: on a GPU each one is a compile of tens of seconds, so future
# attention compiles no more of them than the baseline needs, plus one where a faster version
# takes over. The backends here count dynamo's graphs and run them as they are: the count is
# the same whichever backend compiles them in earnest.


def one_layer(module, **options):
    """A one-layer model of the sizes here: tracing costs time per layer, and one layer shows
    every graph."""
    sizes = {key: value for key, value in SIZES.items() if module is mf or key != "future_dim"}
    return tiny(module, sizes, n_layer=1, **options)


def sampling_graphs(module):
    """The graphs generate() compiles under torch.compile(dynamic=True), as sample.py compiles
    the forward, from a 1-token prompt past the window: T = 1, 2, ..., C, then C sliding."""
    torch._dynamo.reset()
    model = one_layer(module).eval()
    graphs = []
    model.forward = torch.compile(model.forward, dynamic=True,
                                  backend=lambda gm, _: graphs.append(gm) or gm.forward)
    with torch.no_grad(), torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        prompt = torch.zeros(1, 1, dtype=torch.long)  # one token
        model.generate(prompt, max_new_tokens=SIZES["block_size"] + 3, top_k=1)
    return len(graphs)


def test_sampling_compiles_one_graph_more_than_the_baseline():
    # the baseline: T = 1 (dynamo specializes length 1), then every other length and the window in
    # one graph; future attention: one more at T = C, where the blocked version takes over
    baseline = sampling_graphs(mb)
    assert baseline == 2
    assert sampling_graphs(mf) == baseline + 1  # at most 3


def training_graphs(module, device="cpu", **options):
    """Dynamo's graphs for two rounds of a training step (forward and backward) then an evaluation
    (no gradients) of a compiled model, as train.py compiles it."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    model = one_layer(module, **options).to(device)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(50, (2, SIZES["block_size"]), generator=g).to(device)
    for _ in range(2):
        compiled.train()(idx, idx)[1].backward()
        with torch.no_grad():
            compiled.eval()(idx, idx)
    return counter.frame_count


def test_training_compiles_as_many_graphs_as_the_baseline(monkeypatch):
    # one for training and one for evaluation: the blocked version's masks, cached for eager
    # calls, are built in the graph instead of read from a cache that the first call fills
    monkeypatch.setattr(kernels, "_fast_plans", {})  # empty, as train.py's first step finds it
    assert training_graphs(mf) == training_graphs(mb) == 2


@pytest.mark.parametrize("training", [False, True])
def test_flex_traces_into_one_graph_on_a_cpu(training):
    # Off a GPU, choose() takes the blocked version, so the tests above compile that one; here
    # flex is forced, so that a graph break or a tracing error in its path fails without a GPU.
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    model = one_layer(mf).set_impl("flex").train(training)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    idx = torch.randint(50, (2, SIZES["block_size"]), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, loss, aux = compiled(idx, idx)
        expected = model.set_impl("readable")(idx, idx)
    assert counter.frame_count == 1
    torch.testing.assert_close(logits, expected[0], **TOL)
    for name, value in aux.items():
        torch.testing.assert_close(value, expected[2][name], **TOL, msg=lambda m: f"{name}: {m}")


def test_flex_training_step_traces_into_one_graph_with_its_backward_on_a_cpu(monkeypatch):
    # The backward a GPU compiles, traced on a CPU: AOTAutograd derives the joint graph of
    # FlexAttention's forward and backward, and aot_eager runs both with torch's reference code.
    # FlexAttention refuses a backward on a CPU at its entry (its Triton kernels are for GPUs);
    # that guard alone is lifted here.
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.nn.attention import flex_attention
    monkeypatch.setattr(flex_attention, "_validate_device", lambda query, key, value: None)
    torch._dynamo.reset()
    model = one_layer(mf).set_impl("flex")
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    idx = torch.randint(50, (2, SIZES["block_size"]), generator=torch.Generator().manual_seed(0))
    _, loss, aux = compiled(idx, idx)
    loss.backward()
    assert counter.frame_count == 1  # forward and backward of the step, one graph
    flex_grads = {name: p.grad for name, p in model.named_parameters()}
    model.set_impl("readable").zero_grad(set_to_none=True)
    _, expected_loss, _ = model(idx, idx)
    expected_loss.backward()
    torch.testing.assert_close(loss, expected_loss, **TOL)
    for name, p in model.named_parameters():
        torch.testing.assert_close(flex_grads[name], p.grad, **TOL, msg=lambda m: f"grad {name}: {m}")


# --------------------------------------------------------------------------------------
# FlexAttention on a GPU (skipped without one; CI has none, run them on a GPU machine)

cuda = pytest.mark.cuda  # skipped without CUDA (conftest.py); `python -m pytest -m cuda` runs them
CUDA_TOL = dict(rtol=1e-3, atol=1e-4)  # Triton's float32 kernels sum in their own order


def on_cuda(inputs):
    return [None if x is None else x.detach().cuda().requires_grad_() for x in inputs]


def flex_as_readable(q, k, v, K_future, V_future, K_future_bias, V_future_bias, **kw):
    assert K_future_bias is None
    return kernels.future_attention_flex(q, k, v, K_future, V_future, V_future_bias, **kw)


# Each shape compiles FlexAttention's kernels afresh, which is most of these tests' time on a GPU:
# every shape in training (the target, MSE), two in evaluation and two with the cosine loss and
# a target not detached, ten compiles in all rather than eighteen.
FLEX_CASES = [
    *[(*shape, True, True, "mse") for shape in [(12, 12, 1, 16), (1, 200, 50, 16), (200, 200, 50, 16),
                                                (130, 200, 199, 32), (256, 256, 50, 16), (300, 300, 7, 64)]],
    (1, 200, 50, 16, False, True, "mse"), (200, 200, 50, 16, False, True, "mse"),
    (130, 200, 199, 32, True, False, "cosine"), (300, 300, 7, 64, True, False, "cosine"),
]


@cuda
@pytest.mark.parametrize("T, C, future_dim, hs, with_target, detach_target, loss_type", FLEX_CASES)
def test_flex_matches_readable_cuda(T, C, future_dim, hs, with_target, detach_target, loss_type):
    # lengths that are not multiples of 128 included: where masks and score_mod together gave
    # NaN gradients
    inputs = on_cuda(make_inputs(T, C, hs, bias=True, seed=T + hs))
    inputs[5] = None  # no K_future_bias on the flex path
    kw = dict(future_dim=future_dim, with_target=with_target, detach_target=detach_target,
              loss_type=loss_type, seed=1)
    ref_outs, ref_loss, ref_grads = run_attention(mf.future_attention, inputs, **kw)
    outs, loss, grads = run_attention(flex_as_readable, inputs,
                                      fast_kw=dict(detach_target=detach_target), **kw)
    for name, a, b in zip(("out", "out_future", "out_future_star"), outs, ref_outs):
        if b is not None:
            torch.testing.assert_close(a, b, **CUDA_TOL, msg=lambda m: f"{name}: {m}")
    if with_target:
        torch.testing.assert_close(loss, ref_loss, **CUDA_TOL)
    names = ["q", "k", "v", "K_future", "V_future", "V_future_bias"]
    for name, a, b in zip(names, grads, ref_grads):
        assert torch.isfinite(a).all(), f"grad {name} is not finite"
        torch.testing.assert_close(a, b, **CUDA_TOL, msg=lambda m: f"grad {name}: {m}")


@cuda
def test_flex_training_compiles_as_many_graphs_as_the_baseline(monkeypatch):
    # the block masks as the blocked version's: built in the graph, not read from their cache
    monkeypatch.setattr(kernels, "_flex_masks", {})
    sizes = dict(n_head=2, n_embd=32)  # head size 16
    assert training_graphs(mf, "cuda", **sizes) == training_graphs(mb, "cuda", **sizes) == 2


@cuda
def test_auto_picks_flex_on_cuda(monkeypatch):
    flex = spy(monkeypatch, kernels, "future_attention_flex")
    fast = spy(monkeypatch, kernels, "future_attention_fast")
    sizes = dict(block_size=8, n_head=2, n_embd=32, future_dim=3)  # head size 16
    layer = tiny(mf, SIZES, **sizes).transformer.h[0].attn.cuda()
    x = torch.randn(2, 8, 32, device="cuda")
    layer(x)
    assert (len(flex), len(fast)) == (1, 0)
    tiny(mf, SIZES, bias=True, **sizes).transformer.h[0].attn.cuda()(x)  # K_future_bias: fast
    assert (len(flex), len(fast)) == (1, 1)
    layer(x[:, :6])  # T < C: readable
    assert (len(flex), len(fast)) == (1, 1)


def compiled_step(model, idx, targets):
    """Loss, aux and gradients of one compiled bf16 training step."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss, aux = torch.compile(model)(idx, targets)
    loss.backward()
    grads = {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}
    return loss, aux, grads


@cuda
def test_compiled_bf16_flex_model_matches_readable(monkeypatch):
    torch._dynamo.reset()
    model = mf.GPT(mf.GPTConfig(vocab_size=512, block_size=200, n_layer=3, n_head=4, n_embd=64,
                                future_dim=50)).cuda()
    g = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(512, (4, 200), generator=g).cuda() for _ in range(2))
    model.set_impl("readable")
    model.zero_grad(set_to_none=True)
    _, ref_loss, ref_aux = model(idx, targets)  # float32, eager: the reference
    ref_loss.backward()
    ref_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.set_impl("flex")
    flex_calls = spy(monkeypatch, kernels, "future_attention_flex")
    loss, aux, grads = compiled_step(model, idx, targets)
    assert flex_calls  # traced through the flex path
    torch.testing.assert_close(loss.float(), ref_loss, rtol=2e-2, atol=0)
    torch.testing.assert_close(aux["future_attn_loss"].float(), ref_aux["future_attn_loss"],
                               rtol=5e-2, atol=1e-4)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:  # bf16: compare directions, not digits
        cos = F.cosine_similarity(grads[name].flatten(), ref_grads[name].flatten(), dim=0)
        assert cos > 0.99, f"grad {name}: cosine {cos:.4f}"


@cuda
@pytest.mark.parametrize("training", [True, False])
def test_compiled_flex_model_is_causal(training):
    torch._dynamo.reset()
    model = mf.GPT(mf.GPTConfig(vocab_size=512, block_size=200, n_layer=2, n_head=4, n_embd=64,
                                future_dim=50)).cuda().train(training).set_impl("flex")
    g = torch.Generator().manual_seed(3)
    idx, targets = (torch.randint(512, (2, 200), generator=g).cuda() for _ in range(2))
    # both sides of the 128-wide kernel blocks
    assert_causal(torch.compile(model), idx, targets, positions=(0, 127, 128, 150, 198),
                  vocab_size=512)
