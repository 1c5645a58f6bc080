"""
Faster future attention: the function model_future_attn.future_attention computes, computed
leaner. That file holds the write-up's equations line by line; this one holds two versions
of the same function that trade readability for speed and memory:

- future_attention_fast: one block of queries at a time, each block scoring only the keys
  and future columns it can reach. On a CPU and wherever FlexAttention does not apply.
- future_attention_flex: FlexAttention's fused kernels on a GPU, O(T) memory.

Both return (out, out_future, out_future_star) as future_attention does, and with
detach_target compute out_future_star without a graph. Neither drops out P_omni, and
neither has computed future keys (future_kv='computed'): there the readable version runs.
FutureAttention.forward asks choose which of the three computes a call (its `impl`, 'auto'
by default), and future_attention_faster runs a faster one. Masks as in model_future_attn.py:
`allowed` True = may attend; the additive masks are 0 there and -inf elsewhere.
model_future_attn.py runs without this file; test_future_attn_kernels.py checks both
versions here against the readable one. Torch only.
"""

import math

import torch

# --------------------------------------------------------------------------------------
# which version computes a call (FutureAttention.set_impl checks, FutureAttention.forward asks)


def check_impl(impl, future_kv, K_future_bias):
    """Refuses the faster version impl ('fast' or 'flex', FutureAttention.set_impl) where it
    cannot compute the layer's function."""
    if future_kv == "computed":
        raise ValueError(f"impl={impl!r} has no computed future keys (future_kv='computed'); "
                         f"use impl='readable' or 'auto'")
    if impl == "flex" and K_future_bias is not None:
        raise ValueError("impl='flex' has no K_future_bias (bias=True); use impl='fast' or 'auto'")


def choose(impl, q, K_future, K_future_bias, dropout_p):
    """'fast', 'flex' or 'readable': the version that computes future_attention for learned
    future keys.

    impl 'fast' or 'flex' is taken as asked (FutureAttention.set_impl checked that it applies),
    but neither drops out P_omni: with dropout on, 'auto' takes the readable version and the
    others are refused. Without dropout, 'auto' takes flex_attention on a GPU at the full
    context T = C (training, evaluation, and generation once the window is full), without
    K_future_bias and with a head size that is a power of 2 >= 16 (what its Triton kernels
    handle); the blocked 'fast' version elsewhere at T = C; and the readable one at shorter
    lengths, which only generation runs: both faster versions are planned for one T, so under
    torch.compile(dynamic=True) they would compile once per length, while the readable one
    compiles once for all of them (at batch 1 its T x (T+C-1) buffer is small).
    """
    if dropout_p > 0.0:
        if impl == "auto":
            return "readable"
        raise ValueError(f"impl={impl!r} has no attention dropout; use impl='readable' or 'auto'")
    if impl != "auto":
        return impl
    T, hs = q.size(2), q.size(-1)
    if T != K_future.size(-1) + 1:  # T < C: generation before the window is full
        return "readable"
    flex_ok = q.is_cuda and K_future_bias is None and hs >= 16 and (hs & (hs - 1)) == 0
    return "flex" if flex_ok else "fast"


def future_attention_faster(impl, q, k, v, K_future, V_future, K_future_bias, V_future_bias, *,
                            future_dim, with_target, detach_target):
    """future_attention, without dropout, by the faster version impl names ('fast' or 'flex',
    as choose gives it): (out, out_future, out_future_star)."""
    if impl == "flex":  # FlexAttention's fused GPU kernels, O(T) memory
        return future_attention_flex(q, k, v, K_future, V_future, V_future_bias,
                                     future_dim=future_dim, with_target=with_target,
                                     detach_target=detach_target)
    # one block of queries at a time, each with only the keys it reaches
    return future_attention_fast(q, k, v, K_future, V_future, K_future_bias, V_future_bias,
                                 future_dim=future_dim, with_target=with_target,
                                 detach_target=detach_target)


# --------------------------------------------------------------------------------------
# blocked: the queries in blocks, each with only the keys and future columns it reaches


_fast_plans = {}  # (T, C, future_dim, queries_per_block, device, dtype) -> list of blocks


def fast_plan(T, C, future_dim, queries_per_block, device, dtype):
    """Splits the queries into even blocks [a, b) and builds each block's masks, once.

    Per block: kt, the keys the target reads (j <= b-1+future_dim); fb, the end of its
    future columns (m+1 <= b-1+future_dim); `mask`, 0 where [A | A_future] may attend
    and -inf elsewhere, over keys 0..b-1 then future columns a..fb-1; `band`, the same
    for A* over keys 0..kt-1; `above`, 1 where j > i over keys a..kt-1 and 0 elsewhere:
    the part of P* that out*_future sums.
    """
    if torch.compiler.is_compiling():
        # a compiled graph builds them once per graph anyway; reading the cache there would only
        # add a guard on its contents, and a recompile when the first call fills it
        return build_fast_plan(T, C, future_dim, queries_per_block, device, dtype)
    key = (T, C, future_dim, queries_per_block, device, dtype)
    if key not in _fast_plans:
        _fast_plans[key] = build_fast_plan(*key)
    return _fast_plans[key]


def build_fast_plan(T, C, future_dim, queries_per_block, device, dtype):
    n_blocks = -(-T // queries_per_block)
    rows = -(-T // n_blocks)  # even blocks: T = 200 gives 4 x 50, not 64+64+64+8
    blocks = []
    for a in range(0, T, rows):
        b = min(a + rows, T)
        kt, fb = min(b + future_dim, T), min(b - 1 + future_dim, C - 1)
        i = torch.arange(a, b, device=device).view(-1, 1)  # query positions
        j = torch.arange(kt, device=device).view(1, -1)  # key positions
        key_m = torch.arange(a + 1, fb + 1, device=device).view(1, -1)  # m + 1
        allowed = torch.cat([j[:, :b] <= i, (key_m > i) & (key_m <= i + future_dim)], dim=1)
        mask = torch.where(allowed, 0.0, float("-inf")).to(dtype)  # (Tb, b+F)
        band = torch.where(j <= i + future_dim, 0.0, float("-inf")).to(dtype)  # (Tb, kt)
        blocks.append((a, b, kt, fb, mask, band, (j[:, a:] > i).to(dtype)))
    return blocks


def future_attention_fast(q, k, v, K_future, V_future, K_future_bias=None, V_future_bias=None,
                          *, future_dim, with_target=False, detach_target=True,
                          queries_per_block=64):
    """future_attention without dropout, one block of queries at a time.

    Queries a..b-1 see keys 0..b-1 and future columns a..b-2+future_dim only, so each
    block computes just that rectangle: ONE matmul gives [A | A_future], one cached
    additive mask and ONE softmax give P_omni, and its two slices give out_unmasked and
    out_future. The target reuses the block's scores A and adds only the band's keys
    b..kt-1 (a Tb x future_dim matmul). Per block and layer this keeps one score buffer
    (masked in place) and P_omni, plus A* and P* for the target. On a CPU at T = 200,
    future_dim = 50, the layer's forward and backward run about 2.5x faster than future_attention's.
    """
    B, H, T, hs = q.shape
    C = K_future.size(-1) + 1
    s = 1.0 / math.sqrt(hs)
    q = q * s  # scale the (T, hs) queries instead of the (T, T+F) scores
    K_future = K_future.transpose(-2, -1)  # (H, C-1, hs): future key m is row m
    target_grad = torch.is_grad_enabled() and not detach_target
    outs, outs_future, outs_future_star = [], [], []
    plan = fast_plan(T, C, future_dim, queries_per_block, q.device, q.dtype)
    for a, b, kt, fb, mask, band, above in plan:
        q_blk = q[:, :, a:b]  # (B, H, Tb, hs)
        future_keys = K_future[:, a:fb].expand(B, H, fb - a, hs)  # (B, H, F, hs)
        keys = torch.cat([k[:, :, :b], future_keys], dim=2)  # (B, H, b+F, hs)
        # (B, H, Tb, hs) @ (B, H, hs, b+F) -> (B, H, Tb, b+F)
        A_omni = q_blk @ keys.transpose(-2, -1)
        if with_target:
            with torch.set_grad_enabled(target_grad):
                A_band = q_blk @ k[:, :, b:kt].transpose(-2, -1)  # (B, H, Tb, kt-b), keys past b-1
                A_star = torch.cat([A_omni[..., :b], A_band], dim=-1).add_(band)  # (B, H, Tb, kt)
                # out*_future sums over j > i >= a only: the columns a..kt-1 of P*
                P_star = torch.softmax(A_star, dim=-1)[..., a:] * above  # (B, H, Tb, kt-a)
                # (B, H, Tb, kt-a) @ (B, H, kt-a, hs) -> (B, H, Tb, hs)
                outs_future_star.append(P_star @ v[:, :, a:kt])
        if K_future_bias is not None:
            zeros = torch.zeros(H, 1, b, device=q.device, dtype=mask.dtype)
            mask = mask + torch.cat([zeros, K_future_bias[:, :, a:fb] * s], dim=-1)  # (H, Tb, b+F)
        P_omni = torch.softmax(A_omni.add_(mask), dim=-1)  # masked in place: one buffer
        P_unmasked, P_future = P_omni.split([b, fb - a], dim=-1)  # (B, H, Tb, b), (B, H, Tb, F)
        out_future = P_future @ V_future[:, a:fb]  # (B, H, Tb, F) @ (H, F, hs) -> (B, H, Tb, hs)
        if V_future_bias is not None:
            out_future = out_future + V_future_bias
        outs.append(P_unmasked @ v[:, :, :b] + out_future)  # (B, H, Tb, hs)
        outs_future.append(out_future)
    out_future_star = torch.cat(outs_future_star, dim=2) if with_target else None
    return torch.cat(outs, dim=2), torch.cat(outs_future, dim=2), out_future_star


# --------------------------------------------------------------------------------------
# FlexAttention: fused kernels, one call per mask, merged by their log-sum-exps


_flex_attention_compiled = None  # torch.compile(flex_attention), made on first use on a GPU
_flex_masks = {}  # (mask, T, n_keys, future_dim, device) -> its BlockMask


def flex_mask(mask, T, n_keys, future_dim, device):
    """A block mask of future_attention_flex, built once per shape and shared by every layer
    (it depends on T and future_dim only): 'causal' j <= i over the keys k, 'future'
    i < m+1 <= i+future_dim over the future columns m, 'band' i < j <= i+future_dim over the
    keys k, the real future keys the target reads."""
    from torch.nn.attention.flex_attention import create_block_mask
    allowed = {"causal": lambda b, h, i, j: j <= i,
               "future": lambda b, h, i, m: (m + 1 > i) & (m + 1 <= i + future_dim),
               "band": lambda b, h, i, j: (j > i) & (j <= i + future_dim)}[mask]
    # inside a compiled graph the mask is built there, as fast_plan's masks are: no guard on
    # the cache
    if torch.compiler.is_compiling():
        return create_block_mask(allowed, None, None, T, n_keys, device=device)
    key = (mask, T, n_keys, future_dim, device)
    if key not in _flex_masks:
        _flex_masks[key] = create_block_mask(allowed, None, None, T, n_keys, device=device)
    return _flex_masks[key]


def future_attention_flex(q, k, v, K_future, V_future, V_future_bias=None, *, future_dim,
                          with_target=False, detach_target=True):
    """future_attention through FlexAttention: fused kernels, O(T) memory (no T x T buffer).

    P_omni is one softmax over two sets of keys, so it is computed as two calls, each
    normalized over its own set and returning its log-sum-exp: the causal keys k (lse_A) and
    the future keys K_future (lse_future). Their joint log-normalizer is lse = logaddexp(lse_A,
    lse_future), and each call's output, rescaled by exp(its lse - lse), is its part of P_omni
    times its values: out_unmasked and out_future. The target's softmax A* spans the same
    causal keys plus the band i < j <= i+future_dim, so one more call over the band, merged
    with lse_A the same way, gives out*_future. Each score is computed once, at the head width
    (a query with no future column, i = C-1, gets lse -inf there and weight 0). Masks only, no
    score_mod: with both, gradients can be NaN at lengths that are not multiples of 128
    (pytorch/pytorch#153799), which is why K_future_bias is left to the fast path.
    """
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention
    global _flex_attention_compiled
    if torch.compiler.is_compiling() or not q.is_cuda:
        flex = flex_attention  # inside a compiled model, or the CPU reference (tests)
    else:
        if _flex_attention_compiled is None:
            _flex_attention_compiled = torch.compile(flex_attention)
        flex = _flex_attention_compiled
    # inductor's CPU flex template wants 4-d buffers, not views of c_attn's output
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()

    def attend(keys, values, block_mask):  # (B, H, T, hs) and its (B, H, T) log-sum-exp, float32
        out, aux = flex(q, keys, values, block_mask=block_mask, return_aux=AuxRequest(lse=True))
        return out, aux.lse

    B, H, T, hs = q.shape
    C = K_future.size(-1) + 1
    n_future = min(T - 1 + future_dim, C - 1)  # future columns any query reaches
    # dense per-batch copies, laid out as k and v are: (B, H, F, hs)
    K_fut = K_future[:, :, :n_future].transpose(-2, -1).to(q.dtype)
    K_fut = K_fut.expand(B, H, n_future, hs).contiguous()
    V_fut = V_future[:, :n_future].to(q.dtype).expand(B, H, n_future, hs).contiguous()
    # a view of a parameter still requires grad, which flex on a CPU refuses
    if not torch.is_grad_enabled():
        K_fut, V_fut = K_fut.detach(), V_fut.detach()

    # softmax(A) v over j <= i
    out_A, lse_A = attend(k, v, flex_mask("causal", T, T, future_dim, q.device))
    out_F, lse_future = attend(K_fut, V_fut, flex_mask("future", T, n_future, future_dim, q.device))
    lse = torch.logaddexp(lse_A, lse_future)  # (B, H, T): log of P_omni's normalizer
    out_unmasked = out_A * torch.exp(lse_A - lse).unsqueeze(-1)  # (B, H, T, hs)
    out_future = (out_F * torch.exp(lse_future - lse).unsqueeze(-1)).to(q.dtype)  # (B, H, T, hs)
    if V_future_bias is not None:
        out_future = out_future + V_future_bias
    out = (out_unmasked + out_future).to(q.dtype)

    out_future_star = None
    if with_target:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not detach_target):
            out_band, lse_band = attend(k, v, flex_mask("band", T, T, future_dim, q.device))
            # P*'s share of the band
            weight = torch.exp(lse_band - torch.logaddexp(lse_A, lse_band)).unsqueeze(-1)
            out_future_star = (out_band * weight).to(q.dtype)  # (B, H, T, hs)
    return out, out_future, out_future_star
