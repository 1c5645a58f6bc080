"""
The baseline: a decoder-only GPT in the nanoGPT mould.

Tokens are embedded, given a learned absolute position, and passed through
pre-LayerNorm blocks of causal self-attention and an MLP; a final LayerNorm and an
output head tied to the token embedding give the next-token logits. This is the model
that the Future Attention write-up and the Auto-regressive Encoder-Decoder Transformer
write-up (github.com/yiphei/yif-AI) compare against, and the two other model files
repeat its blocks so each reads on its own.

    x_0 = dropout(wte[idx] + wpe[0..T-1])
    x_l = x_{l-1} + attn(ln_1(x_{l-1}));  x_l = x_l + mlp(ln_2(x_l))
    logits = ln_f(x_L) @ wte^T
One option comes from the Encoder-Decoder write-up, which found that subtracting the next
token's position before the tied head helps its model and expected the same of a
decoder-only one: sub_pos='yes' gives logits = (ln_f(x_L) - wpe[1..T]) @ wte^T (off by default).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

# --------------------------------------------------------------------------------------
# modules (LayerNorm is torch's: nn.LayerNorm(d, bias=False) keeps the gain and drops the bias)


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
        # softmax(q k^T / sqrt(hs)) v over keys j <= i; dropout only while training
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

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


# --------------------------------------------------------------------------------------
# config


def is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


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
    n_layer: int = 26  # L, number of blocks
    n_head: int = 10  # H, attention heads per block
    n_embd: int = 160  # d, the residual width; head size hs = d / H
    dropout: float = 0.0  # the write-ups use 0.0 (0.2 in the dropout baseline)
    bias: bool = False  # biases in Linear and LayerNorm; the write-ups use none
    # subtract wpe[1..T] before the head: 'no', 'yes', 'yes_ln'; no (the encdec's best: yes)
    sub_pos: str = "no"

    def __post_init__(self):
        sizes = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
        check_fields(self, [(name, is_count, "a positive integer") for name in sizes] + [
            ("n_embd", lambda v: v % self.n_head == 0, f"divisible by n_head ({self.n_head})"),
            ("dropout", lambda v: isinstance(v, (int, float)) and 0.0 <= v < 1.0, "in [0, 1)"),
            ("bias", lambda v: isinstance(v, bool), "True or False"),
            ("sub_pos", *one_of("no", "yes", "yes_ln")),
        ])


# --------------------------------------------------------------------------------------
# model


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        # with sub_pos, position C is the "next position" of the last token
        n_pos = config.block_size + 1 if config.sub_pos != "no" else config.block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(n_pos, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        if config.sub_pos == "yes_ln":
            self.transformer["ln_sub"] = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

        self.apply(self._init_weights)
        # residual out-projections get a smaller init, one per residual add (GPT-2)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_num_params(self):
        """All parameters, tied weights once, without the position table.

        This is nanoGPT's count, and the one the write-ups report."""
        n_params = sum(p.numel() for p in self.parameters())
        return n_params - self.transformer.wpe.weight.numel()

    def forward(self, idx, targets=None):
        """Returns (logits, loss, aux); aux holds auxiliary losses (none here)."""
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)  # (B, T, d)
        if self.config.sub_pos != "no":
            # the head is tied to wte: take out the next position, leave the next token
            x = x - self.transformer.wpe(pos + 1)
            if self.config.sub_pos == "yes_ln":
                x = self.transformer.ln_sub(x)

        if targets is None:
            # inference: only the last position's logits are needed
            return self.lm_head(x[:, [-1], :]), None, {}
        logits = self.lm_head(x)  # (B, T, vocab)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss, {}

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # matrices decay; biases and LayerNorm gains do not
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        fused = True if device_type == "cuda" else None  # one kernel for every parameter on a GPU
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self):
        """Training FLOPs (forward + backward) per token at T = block_size."""
        cfg = self.config
        T = cfg.block_size
        # 6 FLOPs per weight per token (2 forward, 4 backward), and per layer the two
        # T x T attention matmuls, q k^T and p v: 2 * 2 * T * d forward, 3x with backward
        return 6 * self.get_num_params() + cfg.n_layer * 12 * cfg.n_embd * T

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
