"""
Future Attention: a GPT whose attention also predicts what it may not see.

The Future Attention write-up (github.com/yiphei/yif-AI, future_attention/README.md)
starts from the scores a causal mask throws away: query i against keys j > i. Future
attention lets each query score future_dim learned "future keys" K_future as well, puts
those scores A_future into ONE softmax with the causal scores A (the joint A_omni), and
adds the future part's output, read from learned "future values" V_future, to the usual
one. The model cannot peek (K_future, V_future are parameters, not tokens), and a
training loss pulls out_future towards out*_future, what the real future keys and
values would have given.

For query i, with s = 1/sqrt(hs), and future column m standing for key position m+1:
    A[i, j]        = s * q_i . k_j              j <= i
    A_future[i, m] = s * q_i . K_future[:, m]   i < m+1 <= min(i + future_dim, C-1)
    P_omni = softmax([A | A_future])            one softmax over both sets
    out_i  = sum_j P[i, j] v_j  +  sum_m P[i, m] V_future[m]   (out_unmasked + out_future)
The target, from the real scores over j <= min(i + future_dim, T-1):
    out*_future_i = sum_{j > i} softmax(A*)[i, j] v_j
    future_attn_loss = MSE(out_future, out*_future) or mean(1 - (1 + cos) / 2)
The future set of query i depends on i and C only, never on T, so the layer is causal:
a prefix of length T gives the same outputs as the full sequence at its positions. The
last position C-1 has no future entries: it is plain causal attention there.
The write-up's first next step, future_kv='computed', builds the future key and value of
query i at offset o = m+1-i from its own token instead: k_i + K_offset[o-1], v_i + V_offset[o-1].

Read top to bottom: future_attention computes exactly these lines (computed_future_attention
the computed variant), FutureAttention is the layer, then the blocks, the config and the
GPT. future_attn_kernels.py, beside this file, computes the same function faster (blocked,
and FlexAttention on a GPU); FutureAttention.forward picks a version where it computes the
attention, and test_future_attn_kernels.py checks the fast ones against future_attention.
This file runs on its own too, with the readable version.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

try:  # the faster versions of future_attention (lib/future_attn_kernels.py), when present
    from lib import future_attn_kernels as kernels
except ImportError:
    kernels = None

# --------------------------------------------------------------------------------------
# future attention (masks: True = may attend, everywhere in this file)


def future_attention_weights(q, k, K_future, K_future_bias=None, *, future_dim, with_target=False):
    """The attention weights of the write-up's equations, for per-head q, k of shape (B, H, T, hs).

    K_future is (H, hs, C-1), the optional K_future_bias (H, 1, C-1). Returns (P_omni, P_star):
    P_omni = softmax([A | A_future]), (B, H, T, T+C-1), over the T real keys and then the C-1
    future columns, column m standing for key position m+1 (0 where no query i < T reaches);
    P_star = softmax(A*), (B, H, T, T), over the real keys j <= i + future_dim, the target's
    weights (None unless with_target). visualize.py draws both (FutureAttention.attention_weights).
    """
    # A_future: scores against the learned future keys; column m stands for key m+1. All C-1
    # columns at every T: one shape, so a model compiled for all lengths needs no graph per T.
    A_future = q @ K_future  # (B, H, T, hs) @ (H, hs, C-1) -> (B, H, T, C-1)
    if K_future_bias is not None:
        A_future = A_future + K_future_bias  # (H, 1, C-1) broadcasts
    return joint_softmax(q, k, A_future, future_dim=future_dim, with_target=with_target)


def joint_softmax(q, k, A_future, *, future_dim, with_target):
    """(P_omni, P_star) from q, k (B, H, T, hs) and the unscaled future scores A_future
    (B, H, T, C-1), column m standing for key position m+1, whichever way they were made."""
    B, H, T, hs = q.shape
    n_future = A_future.size(-1)
    s = 1.0 / math.sqrt(hs)
    i = torch.arange(T, device=q.device).view(T, 1)  # query positions

    # A: the causal scores q_i . k_j, j <= i
    A = (q @ k.transpose(-2, -1)) * s  # (B, H, T, hs) @ (B, H, hs, T) -> (B, H, T, T)
    j = torch.arange(T, device=q.device).view(1, T)  # key positions
    causal = j <= i  # (T, T)

    # the future band: query i scores the keys i < m+1 <= i+fd (the columns stop at C-1)
    key = torch.arange(1, n_future + 1, device=q.device).view(1, n_future)  # m + 1
    future = (key > i) & (key <= i + future_dim)  # (T, C-1)

    # A_omni: both sets side by side under ONE softmax
    A_unmasked = A.masked_fill(~causal, float("-inf"))  # (B, H, T, T)
    A_future = (A_future * s).masked_fill(~future, float("-inf"))  # (B, H, T, C-1)
    A_omni = torch.cat([A_unmasked, A_future], dim=-1)  # (B, H, T, T+C-1)
    P_omni = F.softmax(A_omni, dim=-1)

    P_star = None
    if with_target:
        # A*_omni: the REAL scores over j <= min(i + future_dim, T-1), one softmax
        A_star = A.masked_fill(~(j <= i + future_dim), float("-inf"))  # (B, H, T, T)
        P_star = F.softmax(A_star, dim=-1)
    return P_omni, P_star


def future_attention(q, k, v, K_future, V_future, K_future_bias=None, V_future_bias=None,
                     *, future_dim, dropout_p=0.0, with_target=False):
    """The write-up's equations, step by step, for per-head q, k, v of shape (B, H, T, hs).

    K_future (H, hs, C-1) and V_future (H, C-1, hs); the optional biases are (H, 1, C-1)
    on the future scores and (H, 1, hs) on out_future. Returns (out, out_future,
    out_future_star), the last None unless with_target.
    """
    T = q.size(2)
    P_omni, P_star = future_attention_weights(q, k, K_future, K_future_bias, future_dim=future_dim,
                                              with_target=with_target)
    P_omni = F.dropout(P_omni, p=dropout_p, training=dropout_p > 0.0)
    # (B, H, T, T) and (B, H, T, C-1)
    P_unmasked, P_future = P_omni.split([T, V_future.size(1)], dim=-1)

    out_unmasked = P_unmasked @ v  # (B, H, T, T) @ (B, H, T, hs) -> (B, H, T, hs)
    out_future = P_future @ V_future  # (B, H, T, C-1) @ (H, C-1, hs) -> (B, H, T, hs)
    if V_future_bias is not None:
        out_future = out_future + V_future_bias  # (H, 1, hs) broadcasts
    out = out_unmasked + out_future

    out_future_star = None
    if with_target:
        # out*_future: the part of P* above the diagonal, the real future keys j > i
        # (B, H, T, T) @ (B, H, T, hs) -> (B, H, T, hs)
        out_future_star = P_star.triu(diagonal=1) @ v
    return out, out_future, out_future_star


# The write-up's first next step: "let K_future and V_future be computed values (just like Q,
# K, and V) ... ideally reusing or closely deriving from K and V". With future_kv='computed',
# query i's future key and value at offset o = 1..future_dim (key position i+o) are
#     k_i + K_offset[o-1]    and    v_i + V_offset[o-1]
# from its own token's k_i, v_i: in context, causal, and 2 * d * future_dim parameters per layer
# instead of 2 * d * (C-1). P_omni keeps the layout above: column m is key position m+1 = i+o.


def future_offsets(T, n_future, future_dim, device):
    """(T, C-1) offset row o-1 = m-i of future column m for query i, clamped into 0..future_dim-1
    (outside the band the value is unused: joint_softmax masks those columns)."""
    i = torch.arange(T, device=device).view(T, 1)
    m = torch.arange(n_future, device=device).view(1, n_future)
    return (m - i).clamp(0, future_dim - 1)


def computed_future_attention_weights(q, k, K_offset, K_offset_bias=None,
                                      *, block_size, with_target=False):
    """(P_omni, P_star) as future_attention_weights gives them, same layout, for the computed
    future keys k_i + K_offset[o-1]: K_offset (H, future_dim, hs), the optional K_offset_bias
    (H, 1, future_dim)."""
    B, H, T, hs = q.shape
    future_dim, n_future = K_offset.size(1), block_size - 1
    # A_band[i, o-1] = q_i . (k_i + K_offset[o-1]) = q_i . k_i + q_i . K_offset[o-1]
    # (B, H, T, 1) + (B, H, T, hs) @ (H, hs, fd) -> (B, H, T, fd)
    A_band = (q * k).sum(-1, keepdim=True) + q @ K_offset.transpose(-2, -1)
    if K_offset_bias is not None:
        A_band = A_band + K_offset_bias  # (H, 1, fd) broadcasts
    # into P_omni's columns: column m of query i is key m+1 = i+o, offset row m-i
    offsets = future_offsets(T, n_future, future_dim, q.device).expand(B, H, T, n_future)
    A_future = A_band.gather(-1, offsets)  # (B, H, T, fd) -> (B, H, T, C-1)
    return joint_softmax(q, k, A_future, future_dim=future_dim, with_target=with_target)


def computed_future_attention(q, k, v, K_offset, V_offset, K_offset_bias=None, V_offset_bias=None,
                              *, block_size, dropout_p=0.0, with_target=False):
    """future_attention with computed future keys and values, for per-head q, k, v (B, H, T, hs).

    K_offset and V_offset are (H, future_dim, hs); the optional biases (H, 1, future_dim) on the
    future scores and (H, 1, hs) on out_future. Returns (out, out_future, out_future_star).
    """
    B, H, T, hs = q.shape
    future_dim = K_offset.size(1)
    P_omni, P_star = computed_future_attention_weights(q, k, K_offset, K_offset_bias,
                                                       block_size=block_size,
                                                       with_target=with_target)
    P_omni = F.dropout(P_omni, p=dropout_p, training=dropout_p > 0.0)
    n_future = P_omni.size(-1) - T
    # (B, H, T, T) and (B, H, T, C-1)
    P_unmasked, P_future = P_omni.split([T, n_future], dim=-1)
    out_unmasked = P_unmasked @ v  # (B, H, T, T) @ (B, H, T, hs) -> (B, H, T, hs)

    # back from columns to offsets: P_band[i, o-1] = P_future[i, i+o-1], 0 where key i+o > C-1
    i = torch.arange(T, device=q.device).view(T, 1)
    column = i + torch.arange(future_dim, device=q.device).view(1, future_dim)  # (T, fd): i + o - 1
    column_in_range = column.clamp(max=n_future - 1).expand(B, H, T, future_dim)
    P_band = P_future.gather(-1, column_in_range)  # (B, H, T, fd)
    P_band = P_band.masked_fill(column >= block_size - 1, 0.0)
    # out_future_i = sum_o P_band[i, o-1] (v_i + V_offset[o-1])
    # (B, H, T, fd) @ (H, fd, hs) -> (B, H, T, hs), plus (B, H, T, 1) * (B, H, T, hs)
    out_future = P_band @ V_offset + P_band.sum(-1, keepdim=True) * v
    if V_offset_bias is not None:
        out_future = out_future + V_offset_bias  # (H, 1, hs) broadcasts
    out = out_unmasked + out_future

    out_future_star = None
    if with_target:  # the same target as future_attention's: the real keys do not change
        # (B, H, T, T) @ (B, H, T, hs) -> (B, H, T, hs)
        out_future_star = P_star.triu(diagonal=1) @ v
    return out, out_future, out_future_star


def future_attn_loss(out_future, out_future_star, loss_type):
    """Distance between the predicted and the true future output, (B, H, T, hs) each."""
    if loss_type == "mse":
        return F.mse_loss(out_future, out_future_star)
    # cosine dissimilarity: 0 when aligned, 1 when opposite; cos of a zero vector is 0
    cos = F.cosine_similarity(out_future, out_future_star, dim=-1)  # (B, H, T)
    return (1.0 - (1.0 + cos) / 2.0).mean()


IMPLS = ("auto", "readable", "fast", "flex")  # the versions FutureAttention.impl can name


class FutureAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.future_dim = config.future_dim
        self.loss_type = config.future_attn_loss_type
        self.detach_target = config.detach_future_ground_truth
        self.impl = "auto"  # which version computes the attention (set_impl)
        H, hs = config.n_head, config.n_embd // config.n_head
        C, fd = config.block_size, config.future_dim
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.future_kv = config.future_kv
        self.block_size = C
        if config.future_kv == "learned":
            # one future key and value per key position 1..C-1, per head (init in GPT)
            self.K_future = nn.Parameter(torch.empty(H, hs, C - 1))
            self.V_future = nn.Parameter(torch.empty(H, C - 1, hs))
            if config.bias:
                self.K_future_bias = nn.Parameter(torch.zeros(H, 1, C - 1))
                self.V_future_bias = nn.Parameter(torch.zeros(H, 1, hs))
            else:
                self.K_future_bias = self.V_future_bias = None
        else:
            # 'computed': one offset per future step o = 1..fd, per head, added to the query's
            # own k_i and v_i (init in GPT); the biases are per offset
            self.K_offset = nn.Parameter(torch.empty(H, fd, hs))
            self.V_offset = nn.Parameter(torch.empty(H, fd, hs))
            if config.bias:
                self.K_offset_bias = nn.Parameter(torch.zeros(H, 1, fd))
                self.V_offset_bias = nn.Parameter(torch.zeros(H, 1, hs))
            else:
                self.K_offset_bias = self.V_offset_bias = None
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def heads(self, x):
        """q, k, v of the layer input x (B, T, d), each split into heads: (B, nh, T, hs)."""
        B, T, d = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        return q, k, v

    def attention_weights(self, x):
        """(P_omni, P_star) of future_attention_weights for the layer input x (B, T, d), for
        visualize.py, in one layout whether the future keys are learned or computed; P_omni keeps
        the future columns that queries 0..T-1 reach, up to key min(T-1+future_dim, C-1)."""
        q, k, _ = self.heads(x)
        if self.future_kv == "computed":
            P_omni, P_star = computed_future_attention_weights(
                q, k, self.K_offset, self.K_offset_bias,
                block_size=self.block_size, with_target=True)
        else:
            P_omni, P_star = future_attention_weights(q, k, self.K_future, self.K_future_bias,
                                                      future_dim=self.future_dim, with_target=True)
        T = x.size(1)
        return P_omni[..., :T + min(T - 1 + self.future_dim, self.block_size - 1)], P_star

    def set_impl(self, impl):
        """Which version computes this layer, checked once here: 'readable' (the functions above),
        'fast' or 'flex' (lib/future_attn_kernels.py), or 'auto': the readable one while dropout is
        on (the only one that drops out P_omni), for computed future keys (the only version of
        them) and without the kernels file; elsewhere kernels.choose picks a faster one at T = C."""
        if impl not in IMPLS:
            raise ValueError(f"unknown future attention impl {impl!r}: "
                             "use 'auto', 'readable', 'fast' or 'flex'")
        if impl in ("fast", "flex"):
            if kernels is None:
                raise ValueError(f"impl={impl!r} needs future_attn_kernels.py beside "
                                 "model_future_attn.py; use impl='readable' or 'auto'")
            kernels.check_impl(impl, self.future_kv, getattr(self, "K_future_bias", None))
        self.impl = impl

    def forward(self, x, with_target=False):
        """Returns (y, future_attn_loss); the loss is None unless with_target."""
        B, T, d = x.size()
        q, k, v = self.heads(x)
        dropout_p = self.dropout if self.training else 0.0
        faster = self.impl != "readable" and self.future_kv == "learned" and kernels is not None
        impl = "readable"
        if faster:
            impl = kernels.choose(self.impl, q, self.K_future, self.K_future_bias, dropout_p)
        if impl != "readable":  # the same function, faster: blocked on a CPU, FlexAttention on GPU
            y, out_future, out_future_star = kernels.future_attention_faster(
                impl, q, k, v, self.K_future, self.V_future, self.K_future_bias, self.V_future_bias,
                future_dim=self.future_dim, with_target=with_target,
                detach_target=self.detach_target)
        elif self.future_kv == "computed":
            y, out_future, out_future_star = computed_future_attention(
                q, k, v, self.K_offset, self.V_offset, self.K_offset_bias, self.V_offset_bias,
                block_size=self.block_size, dropout_p=dropout_p, with_target=with_target)
        else:
            y, out_future, out_future_star = future_attention(
                q, k, v, self.K_future, self.V_future, self.K_future_bias, self.V_future_bias,
                future_dim=self.future_dim, dropout_p=dropout_p, with_target=with_target)
        # re-assemble the heads: (B, nh, T, hs) -> (B, T, d)
        y = y.transpose(1, 2).contiguous().view(B, T, d)
        y = self.resid_dropout(self.c_proj(y))
        loss = None
        if with_target:
            if self.detach_target:
                out_future_star = out_future_star.detach()
            loss = future_attn_loss(out_future, out_future_star, self.loss_type)
        return y, loss


# --------------------------------------------------------------------------------------
# modules shared with model_baseline.py (repeated so this file reads on its own; LayerNorm is
# torch's: nn.LayerNorm(d, bias=False) keeps the gain and drops the bias)


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        B, T, d = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, d)  # re-assemble the heads
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """A pre-LayerNorm block whose attention is causal or, if `future`, future attention."""

    def __init__(self, config, future):
        super().__init__()
        self.future = future
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = FutureAttention(config) if future else CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, with_target=False):
        loss = None
        if self.future:
            y, loss = self.attn(self.ln_1(x), with_target=with_target)
        else:
            y = self.attn(self.ln_1(x))
        x = x + y
        x = x + self.mlp(self.ln_2(x))
        return x, loss


# --------------------------------------------------------------------------------------
# config


def is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def is_non_negative(value):
    return isinstance(value, (int, float)) and value >= 0


def one_of(*allowed):
    """A check's test and what it must be (check_fields): one of the allowed values."""
    return (lambda value: value in allowed), f"one of {', '.join(map(repr, allowed))}"


def check_fields(config, checks):
    """A ValueError naming the first field that fails its check: (field, test of its value, what
    it must be), in order, so that a test may rely on the fields above it."""
    for name, valid, must_be in checks:
        if not valid(getattr(config, name)):
            raise ValueError(f"{name} must be {must_be}, got {getattr(config, name)!r}")


@dataclass
class GPTConfig:
    vocab_size: int = 50257  # GPT-2 BPE; padding to 50304 is faster but not the write-ups'
    block_size: int = 200  # C, the context length (the write-ups' context_size)
    n_layer: int = 28  # L, number of blocks
    n_head: int = 9  # H, attention heads per block
    n_embd: int = 144  # d, the residual width; head size hs = d / H
    dropout: float = 0.0  # the write-ups use 0.0
    bias: bool = False  # biases in Linear, LayerNorm and on the future scores/outputs
    future_dim: int = None  # fd, future keys per query, 1..C-1; None -> C-1; 50 was best
    # 'learned' K_future, V_future (the write-up's) or 'computed' from k_i, v_i
    future_kv: str = "learned"
    start_layer: int = 1  # first future-attention layer, 1-indexed
    end_layer: int = None  # last future-attention layer, inclusive; None -> n_layer
    future_attn_loss_type: str = "mse"  # 'mse' or 'cosine'; mse was best
    future_attn_loss_coeff: float = 1.0  # scale of the future attention loss
    use_future_attn_loss: bool = True  # add it to the loss (it is logged either way)
    detach_future_ground_truth: bool = True  # no gradient through out*_future; True

    def __post_init__(self):
        sizes = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
        check_fields(self, [(name, is_count, "a positive integer") for name in sizes] + [
            ("n_embd", lambda v: v % self.n_head == 0, f"divisible by n_head ({self.n_head})"),
            ("dropout", lambda v: isinstance(v, (int, float)) and 0.0 <= v < 1.0, "in [0, 1)"),
            *[(name, lambda v: isinstance(v, bool), "True or False")
              for name in ("bias", "use_future_attn_loss", "detach_future_ground_truth")],
            ("block_size", lambda v: v >= 2, ">= 2 for future attention"),
        ])
        # valid now: the None fields take their meaning from them
        C, L = self.block_size, self.n_layer
        self.future_dim = C - 1 if self.future_dim is None else self.future_dim
        self.end_layer = L if self.end_layer is None else self.end_layer
        check_fields(self, [
            ("future_dim", lambda v: is_count(v) and v <= C - 1,
             f"an integer in 1..block_size-1 (1..{C - 1})"),
            ("start_layer", lambda v: is_count(v) and v <= L, f"in 1..n_layer (1..{L})"),
            ("end_layer", lambda v: isinstance(v, int) and self.start_layer <= v <= L,
             f"in start_layer..n_layer ({self.start_layer}..{L}), or unset for the last layer"),
            ("future_kv", *one_of("learned", "computed")),
            ("future_attn_loss_type", *one_of("mse", "cosine")),
            ("future_attn_loss_coeff", is_non_negative, "a number >= 0"),
        ])


# --------------------------------------------------------------------------------------
# model


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([
                Block(config, future=config.start_layer <= layer <= config.end_layer)
                for layer in range(1, config.n_layer + 1)
            ]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual out-projections (GPT-2)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            elif name.endswith(("K_future", "V_future", "K_offset", "V_offset")):
                nn.init.normal_(p, mean=0.0, std=0.02)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def set_impl(self, impl):
        """Which version computes every future-attention layer: 'auto' (the default), 'readable',
        'fast' or 'flex' (FutureAttention.set_impl). A setting of the run, not a GPTConfig
        field: every version computes the same function, so checkpoints do not carry it."""
        for block in self.transformer.h:
            if block.future:
                block.attn.set_impl(impl)
        return self

    def get_num_params(self):
        """All parameters, tied weights once, without the position table.

        This is nanoGPT's count, and the one the write-ups report."""
        n_params = sum(p.numel() for p in self.parameters())
        return n_params - self.transformer.wpe.weight.numel()

    def forward(self, idx, targets=None):
        """Returns (logits, loss, aux); in training aux = {'cross_entropy': the loss before the
        auxiliary one, 'future_attn_loss': the unscaled mean over layers,
        'future_attn_loss_per_layer': each future-attention layer's}, for the log."""
        B, T = idx.size()
        C = self.config.block_size
        if T > C:
            raise ValueError(f"sequence length {T} exceeds block_size {C}")
        with_target = self.training and targets is not None
        if with_target and T != C:
            raise ValueError(f"training with targets needs sequences of exactly block_size ({C}) "
                             f"tokens, got {T}: out*_future reads real keys up to position C-1")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        layer_losses = []
        for block in self.transformer.h:
            x, layer_loss = block(x, with_target=with_target)
            if layer_loss is not None:
                layer_losses.append(layer_loss)
        x = self.transformer.ln_f(x)  # (B, T, d)

        if targets is None:
            return self.lm_head(x[:, [-1], :]), None, {}
        logits = self.lm_head(x)  # (B, T, vocab)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        aux = {}
        if with_target:
            aux["cross_entropy"] = loss.detach()  # taken here, where the logits already are
            per_layer = torch.stack(layer_losses)  # (future-attention layers,)
            aux["future_attn_loss"] = per_layer.mean()  # mean over layers: the loss trained on
            # the write-up's conclusion reads the mean as L objectives, none converging: each
            # layer's loss is kept on its own
            aux["future_attn_loss_per_layer"] = per_layer.detach()
            if self.config.use_future_attn_loss:
                loss = loss + self.config.future_attn_loss_coeff * aux["future_attn_loss"]
        return logits, loss, aux

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # matrices decay, K_future and V_future (or K_offset and V_offset) included;
        # biases and gains do not
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if p.requires_grad:
                is_matrix = p.dim() >= 2 and not name.endswith("_bias")
                (decay if is_matrix else no_decay).append(p)
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        fused = True if device_type == "cuda" else None  # one kernel for every parameter on a GPU
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self):
        """Training FLOPs (forward + backward) per token at T = block_size."""
        cfg = self.config
        T, d = cfg.block_size, cfg.n_embd
        # 6 per weight per token; K_future and V_future are weights of the q . K_future
        # and P_future V_future matmuls (C-1 columns), so they count there too, and so do
        # K_offset and V_offset with 'computed' (q . K_offset and P_band V_offset, fd columns;
        # its q_i . k_i, gathers and sum_o p * v_i are O(d) elementwise work, uncounted like
        # the softmax)
        flops = 6 * self.get_num_params() + cfg.n_layer * 12 * d * T
        # the target's extra P* v matmul, forward only when detached
        n_future_layers = cfg.end_layer - cfg.start_layer + 1
        flops += n_future_layers * 2 * d * T * (1 if cfg.detach_future_ground_truth else 3)
        return flops

    def estimate_mfu(self, fwdbwd_per_iter, dt, flops_promised):
        """Model FLOPs utilization: achieved FLOP/s over `flops_promised`, the device's peak
        (A100 bf16: 312e12)."""
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / flops_promised

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Samples max_new_tokens after idx (B, T), feeding back the last block_size."""
        for _ in range(max_new_tokens):
            # a copy: a view's stride grows with idx, and a compiled forward (sample.py)
            # would recompile
            idx_cond = idx[:, -self.config.block_size:].clone(memory_format=torch.contiguous_format)
            logits, _, _ = self(idx_cond)
            # in float32: under bf16 autocast the logits are bf16, too coarse to divide and
            # rank the probabilities of 50,257 tokens
            logits = logits[:, -1, :].float() / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
