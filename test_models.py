"""
Tests of the three models: parameter counts, causality, loop references, gradients.

The references below are written as explicit loops over query positions, independently
of the vectorized code they check. Run: python -m pytest -q test_models.py
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import model_baseline as base
import model_encdec as ed
import model_future_attn as fa
from conftest import MODEL_VARIANTS, NEXT_STEP_COUNTS, SEED_COUNTS, TINY_MODEL, tiny
from conftest import one_thread  # noqa: F401 (a fixture: pytestmark below names it)

VOCAB, C = TINY_MODEL["vocab_size"], TINY_MODEL["block_size"]  # C: block_size of the tiny models

# the fixture of conftest.py, imported above: conftest.py serves only the files in tests/
pytestmark = pytest.mark.usefixtures("one_thread")


def full_logits(model, idx):
    """Logits at every position, in the model's current mode."""
    T = idx.size(1)
    if model.training and isinstance(model, fa.GPT) and T != C:
        # training with targets needs T == C here; the head is position-wise, so apply
        # it to the final hidden states that a targets-free forward computes
        captured = {}
        hook = model.transformer.ln_f.register_forward_hook(lambda m, i, o: captured.update(h=o))
        model(idx)
        hook.remove()
        return model.lm_head(captured["h"])
    logits, _, _ = model(idx, targets=idx)
    return logits


# --------------------------------------------------------------------------------------
# parameter counts: the write-ups' configurations (counted by hand in conftest.py), built from
# GPTConfig directly


@pytest.mark.parametrize("name,module,kwargs,expected", SEED_COUNTS,
                         ids=[s[0] for s in SEED_COUNTS])
def test_seed_parameter_counts(name, module, kwargs, expected):
    model = module.GPT(module.GPTConfig(**kwargs))
    assert model.get_num_params() == expected


@pytest.mark.parametrize("name,module,kwargs,expected", NEXT_STEP_COUNTS,
                         ids=[s[0] for s in NEXT_STEP_COUNTS])
def test_next_step_parameter_counts(name, module, kwargs, expected):
    with torch.device("meta"):  # shapes only
        model = module.GPT(module.GPTConfig(**kwargs))
    assert model.get_num_params() == expected


def test_gpt2_sized_models_are_within_two_percent():
    counts = [expected for name, _, _, expected in NEXT_STEP_COUNTS if name.startswith("gpt2_")]
    assert len(counts) == 3 and max(counts) / min(counts) < 1.02
    assert 123e6 < min(counts)  # GPT-2 small: 124M with its position table and biases


def test_parameter_count_convention():
    # tied weights once, position table out: count by hand for the tiny baseline
    d, L, V = 32, 2, VOCAB
    per_block = 2 * d + (3 * d * d + d * d) + 8 * d * d
    assert tiny(base).get_num_params() == V * d + L * per_block + d


# --------------------------------------------------------------------------------------
# causality: logits at i never depend on tokens after i


@pytest.mark.parametrize("name", MODEL_VARIANTS)
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("T", [C, C - 5])
def test_changing_later_tokens_leaves_earlier_logits(name, training, T):
    module, kwargs = MODEL_VARIANTS[name]
    model = tiny(module, **kwargs).train(training)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (2, T), generator=g)
    with torch.no_grad():
        reference = full_logits(model, idx)
        for i in range(T - 1):
            changed = idx.clone()
            changed[:, i + 1:] = torch.randint(0, VOCAB, (2, T - i - 1), generator=g)
            logits = full_logits(model, changed)
            torch.testing.assert_close(logits[:, :i + 1], reference[:, :i + 1], atol=1e-6, rtol=0)
            # the test can see a leak: the later positions did change
            assert not torch.allclose(logits[:, i + 1:], reference[:, i + 1:])


@pytest.mark.parametrize("name", MODEL_VARIANTS)
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("T", [C, C - 5])
def test_logit_gradient_is_zero_for_later_embeddings(name, training, T):
    module, kwargs = MODEL_VARIANTS[name]
    model = tiny(module, **kwargs).train(training)
    captured = {}

    def keep_embedding(module_, inputs, output):
        output.retain_grad()
        captured["emb"] = output

    hook = model.transformer.wte.register_forward_hook(keep_embedding)
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(2))
    for i in range(T):
        model.zero_grad(set_to_none=True)
        logits = full_logits(model, idx)
        direction = torch.randn(logits[:, i].shape, generator=torch.Generator().manual_seed(i))
        (logits[:, i] * direction).sum().backward()
        grad = captured["emb"].grad  # (B, T, d): d logits_i / d embedding_j
        assert torch.all(grad[:, i + 1:] == 0), f"position {i} depends on a later token"
        assert torch.all(grad[:, i].abs().sum(-1) > 0)  # and it does depend on its own
    hook.remove()


@pytest.mark.parametrize("name", MODEL_VARIANTS)
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_prefix_gives_the_same_logits(name, training):
    module, kwargs = MODEL_VARIANTS[name]
    model = tiny(module, **kwargs).train(training)
    idx = torch.randint(0, VOCAB, (3, C), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = full_logits(model, idx)
        for t in (1, 4, C - 1):
            torch.testing.assert_close(full_logits(model, idx[:, :t]), full[:, :t],
                                       atol=1e-6, rtol=0)
            last, _, _ = model(idx[:, :t])  # the inference path: last position only
            torch.testing.assert_close(last[:, 0], full[:, t - 1], atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------
# future attention against loops over query positions


def future_attention_loops(q, k, v, K_future, V_future, K_bias, V_bias, future_dim):
    """The write-up's definition, one query at a time: (out, out_future, out_future_star)."""
    B, H, T, hs = q.shape
    C_ = K_future.size(-1) + 1
    s = 1.0 / math.sqrt(hs)
    out = torch.zeros_like(q)
    out_future = torch.zeros_like(q)
    star = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                causal_keys = list(range(0, i + 1))
                future_cols = [m for m in range(C_ - 1)
                               if i + 1 <= m + 1 <= min(i + future_dim, C_ - 1)]
                scores = [s * (q[b, h, i] @ k[b, h, j]) for j in causal_keys]
                for m in future_cols:
                    bias = K_bias[h, 0, m] if K_bias is not None else 0.0
                    scores.append(s * (q[b, h, i] @ K_future[h, :, m] + bias))
                p = torch.softmax(torch.stack(scores), dim=0)
                unmasked = sum(p[n] * v[b, h, j] for n, j in enumerate(causal_keys))
                fut = torch.zeros(hs, dtype=q.dtype)
                for n, m in enumerate(future_cols):
                    fut = fut + p[len(causal_keys) + n] * V_future[h, m]
                if V_bias is not None:
                    fut = fut + V_bias[h, 0]
                out[b, h, i] = unmasked + fut
                out_future[b, h, i] = fut
                # the target: real scores over j <= min(i + fd, T-1), keep j > i
                keys = list(range(0, min(i + future_dim, T - 1) + 1))
                target_scores = torch.stack([s * (q[b, h, i] @ k[b, h, j]) for j in keys])
                p_star = torch.softmax(target_scores, dim=0)
                star[b, h, i] = sum((p_star[n] * v[b, h, j] for n, j in enumerate(keys) if j > i),
                                    torch.zeros(hs, dtype=q.dtype))
    return out, out_future, star


def mse_loops(a, b):
    total = 0.0
    for index in torch.cartesian_prod(*[torch.arange(n) for n in a.shape[:-1]]):
        total = total + ((a[tuple(index)] - b[tuple(index)]) ** 2).sum()
    return total / a.numel()


def cosine_dissimilarity_loops(a, b):
    total, count = 0.0, 0
    for index in torch.cartesian_prod(*[torch.arange(n) for n in a.shape[:-1]]):
        x, y = a[tuple(index)], b[tuple(index)]
        norms = x.norm() * y.norm()
        cos = (x @ y) / norms if norms > 0 else torch.tensor(0.0)
        total, count = total + (1 - (1 + cos) / 2), count + 1
    return total / count


def future_inputs(T, C_, hs, bias, H=2, B=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, hs, generator=g) for _ in range(3))
    K_future = torch.randn(H, hs, C_ - 1, generator=g)
    V_future = torch.randn(H, C_ - 1, hs, generator=g)
    K_bias = torch.randn(H, 1, C_ - 1, generator=g) if bias else None
    V_bias = torch.randn(H, 1, hs, generator=g) if bias else None
    return q, k, v, K_future, V_future, K_bias, V_bias


@pytest.mark.parametrize("T,C_,future_dim,hs,bias", [
    (9, 9, 8, 4, False),  # T = C, future_dim = C-1
    (9, 9, 3, 3, True),
    (5, 9, 2, 4, False),  # T < C: queries near T-1 still get future columns up to C-1
    (5, 9, 1, 5, True),
    (1, 6, 5, 4, False),
    (7, 7, 1, 4, False),
])
def test_future_attention_matches_loops(T, C_, future_dim, hs, bias):
    inputs = future_inputs(T, C_, hs, bias)
    out, out_future, star = fa.future_attention(*inputs, future_dim=future_dim, with_target=True)
    ref_out, ref_future, ref_star = future_attention_loops(*inputs, future_dim)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_future, ref_future, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(star, ref_star, atol=1e-5, rtol=1e-5)
    assert fa.future_attention(*inputs, future_dim=future_dim)[2] is None


@pytest.mark.parametrize("loss_type,loops",
                         [("mse", mse_loops), ("cosine", cosine_dissimilarity_loops)])
def test_future_attn_losses_match_loops(loss_type, loops):
    q, k, v, K_future, V_future, _, _ = future_inputs(6, 6, 4, bias=False)
    _, out_future, star = fa.future_attention(q, k, v, K_future, V_future, future_dim=3,
                                              with_target=True)
    # the last position has no future: both vectors are zero there (cosine 0 by definition)
    assert torch.all(out_future[:, :, -1] == 0) and torch.all(star[:, :, -1] == 0)
    got = fa.future_attn_loss(out_future, star, loss_type)
    torch.testing.assert_close(got, loops(out_future, star), atol=1e-5, rtol=1e-5)


def test_future_attention_layer_loss_matches_loops():
    # the whole layer: projections, per-head split, loops, loss, mean over the model's layers
    model = tiny(fa, future_dim=4, bias=True, future_attn_loss_type="cosine").train()
    layer = model.transformer.h[0].attn
    x = torch.randn(2, C, 32, generator=torch.Generator().manual_seed(5))
    y, loss = layer(x, with_target=True)
    q, k, v = layer.c_attn(x).split(32, dim=2)
    per_head = [t.view(2, C, 4, 8).transpose(1, 2) for t in (q, k, v)]
    out, out_future, star = future_attention_loops(
        *per_head, layer.K_future, layer.V_future, layer.K_future_bias, layer.V_future_bias, 4)
    expected_loss = cosine_dissimilarity_loops(out_future, star)
    torch.testing.assert_close(loss, expected_loss, atol=1e-5, rtol=1e-5)
    expected_y = layer.c_proj(out.transpose(1, 2).reshape(2, C, 32))
    torch.testing.assert_close(y, expected_y, atol=1e-5, rtol=1e-5)


def test_future_attn_loss_enters_the_loss_scaled_and_only_in_training():
    idx = torch.randint(0, VOCAB, (2, C), generator=torch.Generator().manual_seed(6))
    for use, coeff in ((True, 0.5), (False, 0.5)):
        model = tiny(fa, future_dim=3, future_attn_loss_coeff=coeff,
                     use_future_attn_loss=use).train()
        logits, loss, aux = model(idx, targets=idx)
        ce = F.cross_entropy(logits.view(-1, VOCAB), idx.view(-1))
        assert aux["future_attn_loss"] > 0  # logged either way
        expected = ce + coeff * aux["future_attn_loss"] if use else ce
        torch.testing.assert_close(loss, expected)
        model.eval()
        logits, loss, aux = model(idx, targets=idx)
        assert aux == {}
        torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, VOCAB), idx.view(-1)))


@pytest.mark.parametrize("T", [2, C - 5, C])
def test_attention_weights_keep_the_future_columns_queries_reach(T):
    # the layer computes P_omni over all C-1 future columns, whatever T, so that every length
    # has one shape; attention_weights (visualize.py) keeps the columns that queries 0..T-1
    # reach: up to key min(T-1+fd, C-1)
    layer = tiny(fa, future_dim=3).transformer.h[0].attn
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(4))
    q, k, _ = layer.heads(x)
    P_full, P_star = fa.future_attention_weights(q, k, layer.K_future, future_dim=3,
                                                 with_target=True)
    P_omni, P_star_kept = layer.attention_weights(x)
    reached = min(T - 1 + 3, C - 1)
    assert P_full.shape == (2, 4, T, T + C - 1) and P_omni.shape == (2, 4, T, T + reached)
    assert torch.all(P_full[..., T + reached:] == 0)  # nothing is left out
    torch.testing.assert_close(P_omni, P_full[..., :T + reached], rtol=0, atol=0)
    torch.testing.assert_close(P_star_kept, P_star, rtol=0, atol=0)
    # in every head, some query reaches the last kept column
    assert torch.all(P_omni[:, :, :, T + reached - 1].amax(dim=-1) > 0)


def test_future_attn_training_with_targets_needs_full_length():
    model = tiny(fa).train()
    idx = torch.randint(0, VOCAB, (1, C - 1))
    with pytest.raises(ValueError, match="block_size"):
        model(idx, targets=idx)
    model(idx)  # without targets there is no target to compute: fine


# --------------------------------------------------------------------------------------
# computed future keys and values (future_kv='computed') against loops over queries and offsets


def computed_future_attention_loops(q, k, v, K_offset, V_offset, K_bias, V_bias, C_):
    """The computed variant one query at a time: query i's future key at offset o is
    k_i + K_offset[o-1], its value v_i + V_offset[o-1], for keys i+o <= C-1. Returns (out,
    out_future, out_future_star, P_omni) with P_omni's rows laid out as the model's:
    T real keys, then future column m for key position m+1, m = 0..C-2."""
    B, H, T, hs = q.shape
    future_dim = K_offset.size(1)
    s = 1.0 / math.sqrt(hs)
    out, out_future, star = torch.zeros_like(q), torch.zeros_like(q), torch.zeros_like(q)
    P_omni = torch.zeros(B, H, T, T + C_ - 1, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                offsets = [o for o in range(1, future_dim + 1) if i + o <= C_ - 1]
                scores = [s * (q[b, h, i] @ k[b, h, j]) for j in range(i + 1)]
                for o in offsets:
                    future_key = k[b, h, i] + K_offset[h, o - 1]
                    bias = K_bias[h, 0, o - 1] if K_bias is not None else 0.0
                    scores.append(s * (q[b, h, i] @ future_key + bias))
                p = torch.softmax(torch.stack(scores), dim=0)
                fut = torch.zeros(hs, dtype=q.dtype)
                for n, o in enumerate(offsets):
                    future_value = v[b, h, i] + V_offset[h, o - 1]
                    fut = fut + p[i + 1 + n] * future_value
                    P_omni[b, h, i, T + (i + o - 1)] = p[i + 1 + n]  # key i+o is column i+o-1
                if V_bias is not None:
                    fut = fut + V_bias[h, 0]
                P_omni[b, h, i, :i + 1] = p[:i + 1]
                out_future[b, h, i] = fut
                out[b, h, i] = sum(p[j] * v[b, h, j] for j in range(i + 1)) + fut
                # the target is the learned variant's: real scores over j <= min(i + fd, T-1)
                keys = list(range(0, min(i + future_dim, T - 1) + 1))
                target_scores = torch.stack([s * (q[b, h, i] @ k[b, h, j]) for j in keys])
                p_star = torch.softmax(target_scores, dim=0)
                star[b, h, i] = sum((p_star[n] * v[b, h, j] for n, j in enumerate(keys) if j > i),
                                    torch.zeros(hs, dtype=q.dtype))
    return out, out_future, star, P_omni


def computed_inputs(T, future_dim, hs, bias, H=2, B=2, seed=0):
    """q, k, v, K_offset, V_offset and the two biases (or None), float64, requiring grad."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, T, hs)] * 3 + [(H, future_dim, hs)] * 2  # q, k, v, K_offset, V_offset
    if bias:
        shapes += [(H, 1, future_dim), (H, 1, hs)]  # K_offset_bias, V_offset_bias
    tensors = [torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_()
               for shape in shapes]
    return tensors + [None] * (7 - len(tensors))


@pytest.mark.parametrize("T,C_,future_dim,hs,bias", [
    (9, 9, 8, 4, False),  # T = C, future_dim = C-1
    (9, 9, 3, 3, True),
    (5, 9, 2, 4, False),  # T < C: queries near T-1 still get offsets up to key C-1
    (5, 9, 6, 5, True),
    (1, 6, 5, 4, True),
    (7, 7, 1, 4, False),
])
def test_computed_future_attention_matches_loops(T, C_, future_dim, hs, bias):
    inputs = computed_inputs(T, future_dim, hs, bias)
    got = fa.computed_future_attention(*inputs, block_size=C_, with_target=True)
    P_omni, _ = fa.computed_future_attention_weights(inputs[0], inputs[1], inputs[3], inputs[5],
                                                     block_size=C_)
    ref = computed_future_attention_loops(*inputs, C_)
    for name, a, b in zip(("out", "out_future", "out_future_star", "P_omni"), (*got, P_omni), ref):
        torch.testing.assert_close(a, b, msg=lambda m: f"{name}: {m}")
    # the gradients of every input, through the outputs and the future attention loss
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in ref[:2]]

    def total(out, out_future, star):
        return ((out * weights[0]).sum() + (out_future * weights[1]).sum()
                + fa.future_attn_loss(out_future, star, "mse"))

    leaves = [t for t in inputs if t is not None]
    got_grads = torch.autograd.grad(total(*got), leaves)
    ref_grads = torch.autograd.grad(total(*ref[:3]), leaves)
    names = ("q", "k", "v", "K_offset", "V_offset", "K_offset_bias", "V_offset_bias")
    for name, a, b in zip(names, got_grads, ref_grads):
        torch.testing.assert_close(a, b, msg=lambda m: f"grad {name}: {m}")
    assert got_grads[3].abs().sum() > 0 and got_grads[4].abs().sum() > 0  # the offsets do learn


def test_computed_future_keys_fill_the_learned_layout():
    # P_omni's future columns are the same band for both ways of making the future keys
    q, k, v, K_offset, V_offset, _, _ = computed_inputs(6, 3, 4, bias=False)
    learned = future_inputs(6, 9, 4, bias=False)
    K_future = learned[3].double()
    P_learned, P_star_learned = fa.future_attention_weights(q, k, K_future, future_dim=3,
                                                            with_target=True)
    P_computed, P_star = fa.computed_future_attention_weights(q, k, K_offset, block_size=9,
                                                              with_target=True)
    assert P_computed.shape == P_learned.shape == (2, 2, 6, 6 + 8)
    assert torch.equal(P_computed > 0, P_learned > 0)
    torch.testing.assert_close(P_star, P_star_learned, atol=0, rtol=0)  # the same target
    torch.testing.assert_close(P_computed.sum(-1), torch.ones(2, 2, 6, dtype=torch.float64))


@pytest.mark.parametrize("T", [C, C - 5])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_computed_future_attention_layer_matches_loops(T, bias, training):
    # the whole layer: projections, per-head split, loops, loss; train mode with the target
    model = tiny(fa, future_kv="computed", future_dim=4, bias=bias).train(training)
    layer = model.transformer.h[0].attn
    assert not hasattr(layer, "K_future")
    assert layer.K_offset.shape == layer.V_offset.shape == (4, 4, 8)
    if bias:
        with torch.no_grad():  # zero-initialized: make them matter
            layer.K_offset_bias.normal_()
            layer.V_offset_bias.normal_()
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(5))
    y, loss = layer(x, with_target=training)
    q, k, v = layer.c_attn(x).split(32, dim=2)
    per_head = [t.view(2, T, 4, 8).transpose(1, 2) for t in (q, k, v)]
    out, out_future, star, P_omni = computed_future_attention_loops(
        *per_head, layer.K_offset, layer.V_offset, layer.K_offset_bias, layer.V_offset_bias, C)
    expected_y = layer.c_proj(out.transpose(1, 2).reshape(2, T, 32))
    torch.testing.assert_close(y, expected_y, atol=1e-5, rtol=1e-5)
    if training:
        torch.testing.assert_close(loss, mse_loops(out_future, star.detach()), atol=1e-5, rtol=1e-5)
        params = [layer.K_offset, layer.V_offset, layer.c_attn.weight]
        got = torch.autograd.grad(y.sum() + loss, params)
        expected = torch.autograd.grad(
            expected_y.sum() + mse_loops(out_future, star.detach()), params)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    else:
        assert loss is None
    # attention_weights gives the layer's P_omni in the learned layout (visualize.py draws it),
    # up to the last future column a query reaches: key min(T-1+future_dim, C-1)
    reached = T + min(T - 1 + 4, C - 1)
    torch.testing.assert_close(layer.attention_weights(x)[0], P_omni[..., :reached],
                               atol=1e-6, rtol=1e-5)


def test_computed_future_parameters_replace_the_learned_ones():
    C_, H, L, d, fd = C, 4, 2, 32, 5
    for bias in (False, True):
        learned = tiny(fa, future_dim=fd, bias=bias)
        computed = tiny(fa, future_dim=fd, bias=bias, future_kv="computed")
        # per layer, the future keys and values and their biases: K_future, V_future (learned)
        # or K_offset, V_offset (computed)
        per_layer_learned = 2 * d * (C_ - 1) + (H * (C_ - 1) + d if bias else 0)
        per_layer_computed = 2 * d * fd + (H * fd + d if bias else 0)
        expected = learned.get_num_params() - L * per_layer_learned + L * per_layer_computed
        assert computed.get_num_params() == expected
    names = {n for n, _ in computed.named_parameters()}
    assert not any("K_future" in n or "V_future" in n for n in names)
    params_by_name = dict(computed.named_parameters())
    for name in ("K_offset", "V_offset"):  # initialized as K_future: N(0, 0.02)
        p = torch.cat([params_by_name[f"transformer.h.{i}.attn.{name}"].flatten()
                       for i in range(L)])
        assert abs(p.std().item() - 0.02) < 0.004


# --------------------------------------------------------------------------------------
# the encoder-decoder against loops


def test_causal_cross_attention_matches_loops():
    torch.manual_seed(7)
    config = ed.GPTConfig(**TINY_MODEL, cross_n_head=8)
    attn = ed.CausalCrossAttention(config)
    enc, dec = torch.randn(2, 7, 32), torch.randn(2, 7, 32)
    got = attn(enc, dec)
    k, v = attn.c_kv(enc).split(32, dim=2)
    q = attn.c_q(dec)
    H, hs = 8, 4
    out = torch.zeros(2, 7, 32)
    for b in range(2):
        for i in range(7):
            for h in range(H):
                cols = slice(h * hs, (h + 1) * hs)
                scores = torch.stack([q[b, i, cols] @ k[b, j, cols] / math.sqrt(hs)
                                      for j in range(i + 1)])
                p = torch.softmax(scores, dim=0)
                out[b, i, cols] = sum(p[j] * v[b, j, cols] for j in range(i + 1))
    torch.testing.assert_close(got, attn.c_proj(out), atol=1e-5, rtol=1e-5)


def embedding_loss_loops(model, E, encoder_out):
    cfg = model.config
    tr = model.transformer
    enc = tr.ln_b(encoder_out) if cfg.ln_encoder_out else encoder_out
    E_ln = tr.ln_a(E) if cfg.embedding_ln == "init" else E
    B, T, d = E.shape
    E_avg = torch.zeros(B, T, d)
    for b in range(B):
        for i in range(T):
            E_avg[b, i] = sum(E_ln[b, k] for k in range(i + 1)) / (i + 1)
            if cfg.embedding_ln == "avg":
                E_avg[b, i] = tr.ln_a(E_avg[b, i])
    total = 0.0
    for b in range(B):
        for i in range(T):
            x, y = E_avg[b, i], enc[b, i]
            if cfg.embedding_loss_type == "mse":
                total = total + ((x - y) ** 2).sum() / d
            else:
                cos = (x @ y) / (x.norm() * y.norm())
                total = total + (1 - (1 + cos) / 2 if cfg.embedding_loss_type == "cosine"
                                 else -torch.log((1 + cos) / 2))
    return total / (B * T)


@pytest.mark.parametrize("loss_type", ["mse", "cosine", "log_cosine"])
@pytest.mark.parametrize("embedding_ln", ["init", "avg", "none"])
@pytest.mark.parametrize("ln_encoder_out", [True, False])
@pytest.mark.parametrize("detach", ["encoder_out", "embedding", "none"])
def test_embedding_loss_matches_loops(loss_type, embedding_ln, ln_encoder_out, detach):
    model = tiny(ed, embedding_loss_type=loss_type, embedding_ln=embedding_ln,
                 ln_encoder_out=ln_encoder_out, detach=detach)
    with torch.no_grad():  # non-trivial LayerNorm gains and biases
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    g = torch.Generator().manual_seed(8)
    E, encoder_out = torch.randn(2, 6, 32, generator=g), torch.randn(2, 6, 32, generator=g)
    got = model.embedding_loss(E, encoder_out)
    expected = embedding_loss_loops(model, E, encoder_out)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_embedding_loss_enters_the_loss_scaled_and_only_in_training():
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(9))
    model = tiny(ed, embedding_loss_coeff=8.0).train()
    logits, loss, aux = model(idx, targets=idx)
    ce = F.cross_entropy(logits.view(-1, VOCAB), idx.view(-1))
    torch.testing.assert_close(loss, ce + 8.0 * aux["embedding_loss"])
    model.eval()
    assert model(idx, targets=idx)[2] == {}
    assert tiny(ed, embedding_loss_type="none").train()(idx, targets=idx)[2] == {}


def test_decoder_output_subtracts_the_next_positions():
    idx = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(10))
    with_sub, without = tiny(ed, sub_pos="yes").eval(), tiny(ed, sub_pos="yes").eval()
    without.config.sub_pos = "no"  # same weights, no subtraction
    captured = {}
    hook = without.transformer.ln_f.register_forward_hook(lambda m, i, o: captured.update(h=o))
    without(idx, targets=idx)
    hook.remove()
    expected = without.lm_head(captured["h"] - without.transformer.wpe.weight[1:8])
    torch.testing.assert_close(with_sub(idx, targets=idx)[0], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("sub_pos", ["yes", "yes_ln"])
@pytest.mark.parametrize("T", [C, 7])
def test_baseline_subtracts_the_next_positions(sub_pos, T):
    # the decoder-only model with the encoder-decoder's position subtraction, computed directly
    model = tiny(base, sub_pos=sub_pos, bias=True).eval()
    tr = model.transformer
    assert tr.wpe.weight.shape == (C + 1, 32)  # one more row: the next position of the last token
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:  # non-trivial LayerNorm gains and biases
                p.add_(0.3 * torch.randn_like(p))
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(16))
    x = tr.wte(idx) + tr.wpe.weight[:T]
    for block in tr.h:
        x = block(x)
    h = tr.ln_f(x) - tr.wpe.weight[1:T + 1]  # the positions of the tokens to predict
    if sub_pos == "yes_ln":
        h = F.layer_norm(h, (32,), tr.ln_sub.weight, tr.ln_sub.bias, 1e-5)
    expected = h @ tr.wte.weight.T
    torch.testing.assert_close(model(idx, targets=idx)[0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(idx)[0][:, 0], expected[:, -1], atol=1e-5, rtol=1e-5)


def test_baseline_without_sub_pos_is_unchanged():
    model = tiny(base)
    assert model.config.sub_pos == "no" and model.transformer.wpe.weight.shape == (C, 32)
    assert "ln_sub" not in model.transformer
    # 'yes' adds only a position row, which the count leaves out; 'yes_ln' one LayerNorm gain
    assert tiny(base, sub_pos="yes").get_num_params() == model.get_num_params()
    assert tiny(base, sub_pos="yes_ln").get_num_params() == model.get_num_params() + 32


def test_encdec_stacks_of_their_own_depth():
    model = tiny(ed, n_layer_encoder=3, n_layer_decoder=1)
    assert (len(model.transformer.encoder), len(model.transformer.decoder)) == (3, 1)
    d, equal = 32, tiny(ed)  # 2 + 2 blocks
    # one encoder block more, one decoder block (which adds cross-attention) fewer
    encoder_block, decoder_block = 12 * d * d + 2 * d, 16 * d * d + 4 * d
    assert model.get_num_params() == equal.get_num_params() + encoder_block - decoder_block
    # None is n_layer for each, so one name never means two things
    config = ed.GPTConfig(**TINY_MODEL)
    assert (config.n_layer_encoder, config.n_layer_decoder) == (2, 2)
    config = ed.GPTConfig(**{**TINY_MODEL, "n_layer": 4, "n_layer_decoder": 1})
    assert (config.n_layer_encoder, config.n_layer_decoder) == (4, 1)


def test_encdec_equal_depths_given_apart_are_the_same_model():
    # the same weights, draw for draw, as n_layer alone (the residual init reduces to today's)
    equal = tiny(ed, n_layer=3)
    given = tiny(ed, n_layer=5, n_layer_encoder=3, n_layer_decoder=3)
    assert equal.state_dict().keys() == given.state_dict().keys()
    for name, p in equal.state_dict().items():
        assert torch.equal(p, given.state_dict()[name]), name


def test_encdec_residual_init_follows_each_stack_depth():
    model = tiny(ed, n_layer_encoder=1, n_layer_decoder=8, n_embd=64)
    for stack, depth in (("encoder", 1), ("decoder", 8)):
        weights = torch.cat([p.flatten() for n, p in model.named_parameters()
                             if n.startswith(f"transformer.{stack}.")
                             and n.endswith("c_proj.weight")])
        assert weights.std().item() == pytest.approx(0.02 / math.sqrt(2 * depth), rel=0.03), stack


# --------------------------------------------------------------------------------------
# the three files' shared blocks compute the same thing


def test_shared_blocks_agree_across_files():
    baseline = tiny(base)
    x = torch.randn(2, C, 32, generator=torch.Generator().manual_seed(11))
    expected = baseline.transformer.h[0](x)
    block_state = baseline.transformer.h[0].state_dict()

    future_model = tiny(fa, n_layer=3, start_layer=2, end_layer=3)  # block 0 is plain
    future_model.transformer.h[0].load_state_dict(block_state)
    got, loss = future_model.transformer.h[0](x, with_target=True)
    assert loss is None
    torch.testing.assert_close(got, expected, atol=0, rtol=0)

    encdec = tiny(ed)
    encdec.transformer.encoder[0].load_state_dict(block_state)
    torch.testing.assert_close(encdec.transformer.encoder[0](x), expected, atol=0, rtol=0)

    # and the decoder's self-attention and MLP are the baseline's modules too
    decoder_attn = encdec.transformer.decoder[0].attn
    baseline_attn = baseline.transformer.h[0].attn
    decoder_attn.load_state_dict(baseline_attn.state_dict())
    torch.testing.assert_close(decoder_attn(x), baseline_attn(x))


def test_embeddings_and_head_agree_across_files():
    # a one-block baseline and a future model whose future layer cannot matter are equal
    baseline = tiny(base, n_layer=2)
    future_model = tiny(fa, n_layer=2, start_layer=2, end_layer=2)
    state = {k: v for k, v in baseline.state_dict().items() if not k.startswith("transformer.h.1")}
    future_model.load_state_dict(state, strict=False)
    for model in (baseline, future_model):  # silence block 1's residual branches
        with torch.no_grad():
            model.transformer.h[1].attn.c_proj.weight.zero_()
            model.transformer.h[1].mlp.c_proj.weight.zero_()
    idx = torch.randint(0, VOCAB, (2, C))
    torch.testing.assert_close(future_model(idx, idx)[0], baseline(idx, idx)[0], atol=0, rtol=0)


# --------------------------------------------------------------------------------------
# behaviour: learning, generation, modes


@pytest.mark.parametrize("module,kwargs", [(base, {}), (fa, dict(future_dim=4)), (ed, {})],
                         ids=["baseline", "future_attn", "encdec"])
def test_overfits_one_batch(module, kwargs):
    model = tiny(module, **kwargs).train()
    idx = torch.randint(0, VOCAB, (4, C + 1), generator=torch.Generator().manual_seed(12))
    x, y = idx[:, :-1], idx[:, 1:]
    optimizer = model.configure_optimizers(0.0, 3e-3, (0.9, 0.95), "cpu")
    first = None
    for _ in range(80):
        _, loss, _ = model(x, targets=y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first = loss.item() if first is None else first
    model.eval()
    final = model(x, targets=y)[1].item()
    assert final < 0.2 * first, (first, final)


@pytest.mark.parametrize("module", [base, fa, ed], ids=["baseline", "future_attn", "encdec"])
@pytest.mark.parametrize("prompt_len", [3, C + 7])
def test_generate_crops_to_block_size(module, prompt_len):
    model = tiny(module).eval()
    prompt = torch.randint(0, VOCAB, (2, prompt_len), generator=torch.Generator().manual_seed(13))
    out = model.generate(prompt, max_new_tokens=5, top_k=1)  # top_k=1 is greedy
    assert out.shape == (2, prompt_len + 5)
    assert torch.equal(out[:, :prompt_len], prompt)
    for n in range(5):  # each new token is the argmax given the last block_size tokens
        context = out[:, :prompt_len + n][:, -C:]
        logits, _, _ = model(context)
        assert torch.equal(out[:, prompt_len + n], logits[:, -1].argmax(-1))


class VocabularyOps(TorchDispatchMode):
    """Records the dtype that each op over a (B, vocab) tensor gets: the sampling's own ops."""

    def __init__(self):
        super().__init__()
        self.dtypes = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.dim() == 2 and first.size(-1) == VOCAB:
            self.dtypes.setdefault(func.overloadpacket.__name__, set()).add(first.dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("module", [base, fa, ed], ids=["baseline", "future_attn", "encdec"])
def test_generate_samples_in_float32_under_bf16(module):
    # bf16 keeps 8 bits of a logit: the temperature, top-k and the softmax are taken in float32
    model = tiny(module).eval()
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(13))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), VocabularyOps() as ops:
        model.generate(prompt, max_new_tokens=2, temperature=0.8, top_k=5)
    sampling = {name: ops.dtypes.get(name)
                for name in ("div", "topk", "lt", "_softmax", "multinomial")}
    assert all(dtypes == {torch.float32} for dtypes in sampling.values()), sampling


@pytest.mark.parametrize("module", [base, fa, ed], ids=["baseline", "future_attn", "encdec"])
def test_eval_is_deterministic_with_dropout(module):
    model = tiny(module, dropout=0.5)
    idx = torch.randint(0, VOCAB, (2, C))
    model.eval()
    torch.testing.assert_close(model(idx, idx)[0], model(idx, idx)[0], atol=0, rtol=0)
    model.train()
    assert not torch.allclose(model(idx, idx)[0], model(idx, idx)[0])  # dropout is on


@pytest.mark.parametrize("module,keys", [
    (base, []),
    (fa, ["cross_entropy", "future_attn_loss", "future_attn_loss_per_layer"]),
    (ed, ["cross_entropy", "embedding_loss"])],
                         ids=["baseline", "future_attn", "encdec"])
def test_aux_loss_only_in_training(module, keys):
    model = tiny(module)
    idx = torch.randint(0, VOCAB, (2, C))
    model.train()
    logits, _, aux = model(idx, targets=idx)
    assert list(aux) == keys
    if "cross_entropy" in aux:  # the plain cross-entropy, beside the auxiliary loss, for the log
        cross_entropy = F.cross_entropy(logits.flatten(0, 1), idx.flatten())
        torch.testing.assert_close(aux["cross_entropy"], cross_entropy)
    assert all(torch.isfinite(v).all() for v in aux.values())
    assert all(aux[k].dim() == 0 for k in keys if not k.endswith("_per_layer"))
    assert model(idx)[2] == {}  # no targets, no auxiliary loss
    model.eval()
    assert model(idx, targets=idx)[2] == {}


@pytest.mark.parametrize("start_layer, end_layer", [(1, 3), (2, 2)])
def test_future_attn_loss_per_layer(start_layer, end_layer):
    # each future-attention layer's own loss, in layer order; their mean is the loss trained on
    torch.manual_seed(0)
    model = tiny(fa, n_layer=3, start_layer=start_layer, end_layer=end_layer,
                 future_attn_loss_coeff=0.5)
    model.train()
    idx, targets = torch.randint(0, VOCAB, (2, C)), torch.randint(0, VOCAB, (2, C))
    logits, loss, aux = model(idx, targets=targets)
    x = model.transformer.drop(model.transformer.wte(idx) + model.transformer.wpe(torch.arange(C)))
    expected = []
    for block in model.transformer.h:  # the layers one by one, each future one's loss kept
        h = block.ln_1(x)
        y, layer_loss = block.attn(h, with_target=True) if block.future else (block.attn(h), None)
        x = x + y
        x = x + block.mlp(block.ln_2(x))
        if layer_loss is not None:
            expected.append(layer_loss)
    per_layer = aux["future_attn_loss_per_layer"]
    assert per_layer.shape == (end_layer - start_layer + 1,) and not per_layer.requires_grad
    torch.testing.assert_close(per_layer, torch.stack(expected).detach(), rtol=0, atol=0)
    torch.testing.assert_close(aux["future_attn_loss"], per_layer.mean(), rtol=0, atol=0)
    cross_entropy = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    # the loss trained on is unchanged: the cross-entropy plus the scaled mean
    torch.testing.assert_close(loss, cross_entropy + 0.5 * per_layer.mean())


def test_no_loss_is_kept_as_module_state():
    for module in (base, fa, ed):
        model = tiny(module).train()
        before = set(vars(model)) | {n for m in model.modules() for n in vars(m)}
        model(torch.randint(0, VOCAB, (1, C)), targets=torch.randint(0, VOCAB, (1, C)))
        after = set(vars(model)) | {n for m in model.modules() for n in vars(m)}
        assert after == before


# --------------------------------------------------------------------------------------
# where the auxiliary gradients go


def grads_of(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: (p.grad if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters()}


@pytest.mark.parametrize("detach", [True, False])
def test_future_loss_gradient_reaches_target_kv_only_without_detach(detach):
    model = tiny(fa, n_layer=1, future_dim=3, detach_future_ground_truth=detach).train()
    layer = model.transformer.h[0].attn
    x = torch.randn(2, C, 32, generator=torch.Generator().manual_seed(14))
    _, loss = layer(x, with_target=True)
    grad = torch.autograd.grad(loss, layer.c_attn.weight)[0]  # rows: q, then k, then v

    # the same loss with out*_future as a constant: only the prediction path trains
    q, k, v = (t.view(2, C, 4, 8).transpose(1, 2) for t in layer.c_attn(x).split(32, dim=2))
    future = (layer.K_future, layer.V_future)
    with torch.no_grad():
        out_future_star = fa.future_attention(q, k, v, *future, future_dim=3, with_target=True)[2]
    out_future = fa.future_attention(q, k, v, *future, future_dim=3)[1]
    grad_prediction = torch.autograd.grad(fa.future_attn_loss(out_future, out_future_star, "mse"),
                                          layer.c_attn.weight)[0]
    v_rows = grad[64:]
    if detach:
        torch.testing.assert_close(grad, grad_prediction, atol=1e-9, rtol=1e-6)
        assert torch.all(v_rows == 0)  # v enters only through the target
        assert grad[:64].abs().sum() > 0  # q, k: through the joint softmax of the prediction
    else:
        assert v_rows.abs().sum() > 0
        assert not torch.allclose(grad, grad_prediction)


@pytest.mark.parametrize("detach", ["encoder_out", "embedding", "none"])
def test_embedding_loss_gradient_routing(detach):
    model = tiny(ed, detach=detach).train()
    idx = torch.randint(0, VOCAB, (2, C), generator=torch.Generator().manual_seed(15))
    grads = grads_of(model, model(idx, targets=idx)[2]["embedding_loss"])
    encoder = sum(g.abs().sum() for n, g in grads.items() if n.startswith("transformer.encoder."))
    embeddings = (grads["transformer.wte.weight"].abs().sum()
                  + grads["transformer.wpe.weight"].abs().sum())
    decoder_side = ("transformer.decoder.", "transformer.bridge")
    decoder = sum(g.abs().sum() for n, g in grads.items() if n.startswith(decoder_side))
    assert decoder == 0  # the decoder never sees this loss
    assert grads["transformer.ln_a.weight"].abs().sum() > 0
    assert grads["transformer.ln_b.weight"].abs().sum() > 0
    if detach == "encoder_out":
        assert encoder == 0 and embeddings > 0
    elif detach == "embedding":
        # E is detached on the average's side; embeddings still learn through the encoder
        assert encoder > 0
    else:
        assert encoder > 0 and embeddings > 0


def test_embedding_detach_stops_the_average_side():
    # with detach='embedding' and a frozen encoder path, the embeddings get nothing
    model = tiny(ed, detach="embedding", n_layer=1).train()
    E = torch.randn(2, 5, 32, requires_grad=True)
    encoder_out = torch.randn(2, 5, 32)
    model.embedding_loss(E, encoder_out).backward()
    assert E.grad is None
    E.grad = None
    model.config.detach = "none"
    model.embedding_loss(E, encoder_out).backward()
    assert E.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------
# FLOP counts and the optimizer


FLOP_CASES = {
    "baseline": (base, {}),
    "baseline_sub_pos": (base, dict(sub_pos="yes_ln")),
    "future_attn": (fa, dict(future_dim=5)),
    "fa_not_detached": (fa, dict(future_dim=5, detach_future_ground_truth=False)),
    "fa_computed": (fa, dict(future_dim=5, future_kv="computed")),
    "fa_computed_not_detached": (fa, dict(future_dim=11, future_kv="computed",
                                          detach_future_ground_truth=False)),
    "encdec": (ed, {}),
    "encdec_enc3_dec1": (ed, dict(n_layer_encoder=3, n_layer_decoder=1)),
    "encdec_enc1_dec3": (ed, dict(n_layer_encoder=1, n_layer_decoder=3)),
}


@pytest.mark.parametrize("module,kwargs", FLOP_CASES.values(), ids=FLOP_CASES)
def test_flops_per_token_match_torch_flop_counter(module, kwargs):
    # flops_per_token (used by estimate_mfu) counts this architecture's matmuls, as the readable
    # future attention computes them (the faster versions trade a few for speed or memory)
    model = tiny(module, **kwargs).train()
    if module is fa:
        model.set_impl("readable")
    idx = torch.randint(0, VOCAB, (2, C))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:  # the math backend's matmuls are visible
        model(idx, targets=idx)[1].backward()
    measured = counter.get_total_flops() / idx.numel()
    assert model.flops_per_token() == pytest.approx(measured, rel=0.01)
    assert model.estimate_mfu(fwdbwd_per_iter=2, dt=1.0, flops_promised=1.0) == pytest.approx(
        model.flops_per_token() * C * 2)


@pytest.mark.parametrize("module,kwargs",
                         [(base, {}), (fa, {}), (fa, dict(future_kv="computed")), (ed, {})],
                         ids=["baseline", "future_attn", "fa_computed", "encdec"])
def test_optimizer_decays_matrices_only(module, kwargs):
    model = tiny(module, bias=True, **kwargs)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.dim() >= 2 and not names[id(p)].endswith("bias") for p in decay["params"])
    assert all(p.dim() == 1 or names[id(p)].endswith("bias") for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    if module is fa:  # the future keys and values decay like K_future, their biases do not
        kind = "offset" if kwargs else "future"
        decayed = {names[id(p)].rsplit(".", 1)[-1] for p in decay["params"]}
        kept = {names[id(p)].rsplit(".", 1)[-1] for p in no_decay["params"]}
        assert {f"K_{kind}", f"V_{kind}"} <= decayed
        assert {f"K_{kind}_bias", f"V_{kind}_bias"} <= kept


# --------------------------------------------------------------------------------------
# bad configurations


BAD_VALUES = [
    (base, "n_layer", 0), (base, "n_head", 5), (base, "dropout", 1.0), (base, "block_size", -1),
    (base, "bias", "yes"),
    (fa, "future_dim", 0), (fa, "future_dim", C), (fa, "start_layer", 0), (fa, "start_layer", 3),
    (fa, "end_layer", 3), (fa, "future_attn_loss_type", "l1"), (fa, "future_attn_loss_coeff", -1.0),
    (fa, "use_future_attn_loss", "true"), (fa, "detach_future_ground_truth", None),
    (ed, "sub_pos", "YES_NO_LN"), (ed, "order", "reversed"), (ed, "embedding_loss_type", "l2"),
    (ed, "detach", "decoder"), (ed, "embedding_ln", "both"), (ed, "cross_n_head", 5),
    (ed, "embedding_loss_coeff", -2.0), (ed, "ln_encoder_out", 1), (ed, "add_pos_to_decoder", "no"),
    (ed, "ln_before_bridge", None),
    (fa, "future_kv", "offsets"), (base, "sub_pos", "YES_NO_LN"), (base, "sub_pos", True),
    (ed, "n_layer_encoder", 0), (ed, "n_layer_decoder", 2.5),
]


@pytest.mark.parametrize("module,field,value", BAD_VALUES,
                         ids=[f"{m.__name__}-{f}-{v!r}" for m, f, v in BAD_VALUES])
def test_bad_config_value_names_the_field(module, field, value):
    with pytest.raises(ValueError, match=field):
        module.GPTConfig(**{**TINY_MODEL, field: value})


def test_end_layer_unset_is_the_last_layer_and_above_it_says_so():
    # a config that leaves end_layer unset follows --n_layer; an explicit one past the last layer
    # is refused by name, with what to do
    assert fa.GPTConfig(**{**TINY_MODEL, "n_layer": 3}).end_layer == 3
    assert fa.GPTConfig(**{**TINY_MODEL, "n_layer": 3, "start_layer": 2}).end_layer == 3
    with pytest.raises(ValueError) as refused:
        fa.GPTConfig(**{**TINY_MODEL, "end_layer": 28})
    assert str(refused.value) == ("end_layer must be in start_layer..n_layer (1..2), "
                                  "or unset for the last layer, got 28")


@pytest.mark.parametrize("module", [base, fa, ed], ids=["baseline", "future_attn", "encdec"])
@pytest.mark.parametrize("bias", [False, True])
def test_layer_norms_keep_their_checkpoint_keys_and_function(module, bias):
    # torch's nn.LayerNorm(d, bias=...) in place of a hand-written one: the same state_dict keys (a
    # gain 'weight', a 'bias' only with bias=True; the encdec's LN_a and LN_b always have one), so
    # checkpoints keep loading, and the same function: F.layer_norm with eps 1e-5
    model = tiny(module, bias=bias, **({"sub_pos": "yes_ln"} if module is not fa else {}))
    norms = {name: m for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1].startswith("ln_")}
    assert "transformer.ln_f" in norms and len(norms) > 3
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(17))
    for name, norm in norms.items():
        with_bias = bias or name in ("transformer.ln_a", "transformer.ln_b")
        assert set(norm.state_dict()) == ({"weight", "bias"} if with_bias else {"weight"}), name
        with torch.no_grad():
            for p in norm.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(18)))
            expected = F.layer_norm(x, (32,), norm.weight, norm.bias, 1e-5)
            torch.testing.assert_close(norm(x), expected, rtol=0, atol=0, msg=name)


def test_config_round_trips_through_asdict():
    from dataclasses import asdict
    for module in (base, fa, ed):
        config = module.GPTConfig(**TINY_MODEL)
        assert asdict(module.GPTConfig(**asdict(config))) == asdict(config)


@pytest.mark.parametrize("ln_before_bridge,add_pos", [(False, True), (True, False)])
def test_decoder_input_is_the_bridged_encoder_output(ln_before_bridge, add_pos):
    model = tiny(ed, ln_before_bridge=ln_before_bridge, add_pos_to_decoder=add_pos).eval()
    tr = model.transformer
    captured = {}
    hooks = [tr.encoder[-1].register_forward_hook(lambda m, i, o: captured.update(enc=o)),
             tr.decoder[0].register_forward_hook(lambda m, i, o: captured.update(dec_in=i[0]))]
    model(torch.randint(0, VOCAB, (2, 7)), targets=torch.randint(0, VOCAB, (2, 7)))
    for hook in hooks:
        hook.remove()
    encoder_out = captured["enc"]
    expected = tr.bridge(tr.ln_bridge(encoder_out) if ln_before_bridge else encoder_out)
    if add_pos:
        expected = expected + tr.wpe.weight[1:8]  # the next positions, 1..T
    torch.testing.assert_close(captured["dec_in"], expected, atol=1e-6, rtol=0)
