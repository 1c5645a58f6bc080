"""
The Auto-regressive Encoder-Decoder Transformer, as its write-up describes it
(github.com/yiphei/yif-AI, autoregressive_encoder_decoder_transformer/README.md).

A GPT's L layers become an encoder of L causal blocks and a decoder of L blocks that
also cross-attend to the encoder's output, both re-run on every new token, so the
encoder can specialise in understanding the context and the decoder in predicting.
Two extras help: the next token's position embedding is subtracted before the output
head, and an "embedding loss" pulls the encoder output towards a running mean of the
input embeddings E, giving the embedding tables more and richer updates.

    E            = dropout(wte[idx] + wpe[0..T-1])
    encoder_out  = encoder(E)                          L causal blocks
    x            = bridge(encoder_out)                 Linear(d, d)
    x            = x + self_attn(ln_1(x))              each of L decoder blocks
    x            = x + cross_attn(ln_enc(encoder_out), ln_x(x))   query i sees enc <= i
    x            = x + mlp(ln_2(x))
    decoder_out  = ln_f(x) - wpe[1..T]                 sub_pos: the NEXT positions
    E_avg_i      = (1/(i+1)) sum_{k<=i} LN_a(E)_k      cumulative mean along T
    embedding_loss = MSE(E_avg, LN_b(encoder_out.detach()))   or a cosine form
Here n_layer is the number of layers PER STACK: 13 means 13 encoder + 13 decoder blocks.
n_layer_encoder and n_layer_decoder, one of the write-up's next steps ("experiment with
unequal encoder and decoder layers"), give each stack its own depth instead.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

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
    """An encoder block: exactly the baseline's block."""

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
# the decoder side


class CausalCrossAttention(nn.Module):
    """Decoder queries attend to encoder_out; query i sees encoder positions <= i only."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.cross_n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_kv = nn.Linear(config.n_embd, 2 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, encoder_x, decoder_x):
        B, T, d = decoder_x.size()
        k, v = self.c_kv(encoder_x).split(self.n_embd, dim=2)
        q = self.c_q(decoder_x)
        k = k.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        # the encoder ran on the same tokens, so its position j holds tokens 0..j:
        # the causal mask keeps query i off everything after i
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, d)  # re-assemble the heads
        return self.resid_dropout(self.c_proj(y))


class DecoderBlock(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.order = config.order
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_enc = nn.LayerNorm(config.n_embd, bias=config.bias)  # on encoder_out
        self.ln_x = nn.LayerNorm(config.n_embd, bias=config.bias)  # on the decoder stream
        self.cross_attn = CausalCrossAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, encoder_out):
        if self.order == "original":  # self-attention, then cross-attention
            x = x + self.attn(self.ln_1(x))
            x = x + self.cross_attn(self.ln_enc(encoder_out), self.ln_x(x))
        else:  # 'alt': cross-attention first
            x = x + self.cross_attn(self.ln_enc(encoder_out), self.ln_x(x))
            x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def disaffinity(E_avg, encoder_out, loss_type):
    """The embedding loss between (B, T, d) tensors: 0 when they agree."""
    if loss_type == "mse":
        return F.mse_loss(E_avg, encoder_out)
    cos = F.cosine_similarity(E_avg, encoder_out, dim=-1)  # (B, T)
    if loss_type == "cosine":
        return (1.0 - (1.0 + cos) / 2.0).mean()
    return (-torch.log((1.0 + cos) / 2.0)).mean()  # 'log_cosine'


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
    # The defaults are the write-up's best run, "with MSE embedding loss and pos sub"
    # (config/encdec_mse_possub.py), so --model_type=encdec alone trains a model it measured.
    vocab_size: int = 50257  # GPT-2 BPE; padding to 50304 is faster but not the write-ups'
    block_size: int = 200  # C, the context length (the write-ups' context_size)
    # L, blocks PER STACK: L encoder + L decoder blocks, unless set apart below
    n_layer: int = 13
    n_layer_encoder: int = None  # encoder blocks; None -> n_layer (the write-up: equal stacks)
    n_layer_decoder: int = None  # decoder blocks; None -> n_layer (the write-up: equal stacks)
    n_head: int = 5  # H, self-attention heads, encoder and decoder
    n_embd: int = 150  # d, the residual width
    dropout: float = 0.0  # the write-ups use 0.0
    bias: bool = False  # biases in Linear and the blocks' LayerNorms; the write-ups use none
    cross_n_head: int = None  # heads of the cross-attention; None -> 2 * n_head
    order: str = "original"  # decoder block: 'original' self then cross, 'alt' swaps
    ln_before_bridge: bool = False  # LayerNorm before the encoder->decoder Linear
    add_pos_to_decoder: bool = False  # add wpe[1..T] to the decoder input
    sub_pos: str = "yes"  # subtract wpe[1..T] before the head: 'no', 'yes', 'yes_ln'
    embedding_loss_type: str = "mse"  # 'none', 'mse', 'cosine', 'log_cosine'
    # scale of the embedding loss; the write-up's runs without sub_pos used 1
    embedding_loss_coeff: float = 8.0
    # what the embedding loss does not train: 'encoder_out', 'embedding', 'none'
    detach: str = "encoder_out"
    # LN_b on encoder_out for the loss; like LN_a below it is built whenever asked for,
    # even with no embedding loss, as in the write-up's runs (their parameter counts show it)
    ln_encoder_out: bool = True
    embedding_ln: str = "init"  # LN_a on E before the running mean ('init'), after ('avg'), 'none'

    def __post_init__(self):
        sizes = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
        check_fields(self, [(name, is_count, "a positive integer") for name in sizes] + [
            ("n_embd", lambda v: v % self.n_head == 0, f"divisible by n_head ({self.n_head})")])
        for name, default in (("n_layer_encoder", self.n_layer), ("n_layer_decoder", self.n_layer),
                              ("cross_n_head", 2 * self.n_head)):
            # None: n_layer per stack, 2 * n_head for the cross-attention
            if getattr(self, name) is None:
                setattr(self, name, default)
        flags = ("bias", "ln_before_bridge", "add_pos_to_decoder", "ln_encoder_out")
        check_fields(self, [
            ("n_layer_encoder", is_count, "a positive integer or None (n_layer)"),
            ("n_layer_decoder", is_count, "a positive integer or None (n_layer)"),
            ("cross_n_head", lambda v: is_count(v) and self.n_embd % v == 0,
             f"a positive integer dividing n_embd ({self.n_embd})"),
            ("dropout", lambda v: isinstance(v, (int, float)) and 0.0 <= v < 1.0, "in [0, 1)"),
            *[(name, lambda v: isinstance(v, bool), "True or False") for name in flags],
            ("order", *one_of("original", "alt")),
            ("sub_pos", *one_of("no", "yes", "yes_ln")),
            ("embedding_loss_type", *one_of("none", "mse", "cosine", "log_cosine")),
            ("detach", *one_of("encoder_out", "embedding", "none")),
            ("embedding_ln", *one_of("init", "avg", "none")),
            ("embedding_loss_coeff", is_non_negative, "a number >= 0"),
        ])


# --------------------------------------------------------------------------------------
# model


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        # position C is the "next position" of the last token, used by add/sub_pos
        uses_next_pos = config.sub_pos != "no" or config.add_pos_to_decoder
        n_pos = config.block_size + 1 if uses_next_pos else config.block_size
        d = config.n_embd
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, d),
            wpe=nn.Embedding(n_pos, d),
            drop=nn.Dropout(config.dropout),
            encoder=nn.ModuleList([Block(config) for _ in range(config.n_layer_encoder)]),
            bridge=nn.Linear(d, d, bias=config.bias),
            decoder=nn.ModuleList([DecoderBlock(config) for _ in range(config.n_layer_decoder)]),
            ln_f=nn.LayerNorm(d, bias=config.bias),
        ))
        if config.ln_before_bridge:
            self.transformer["ln_bridge"] = nn.LayerNorm(d, bias=config.bias)
        if config.sub_pos == "yes_ln":
            self.transformer["ln_sub"] = nn.LayerNorm(d, bias=config.bias)
        if config.embedding_ln != "none":
            self.transformer["ln_a"] = nn.LayerNorm(d, bias=True)  # LN_a, on E
        if config.ln_encoder_out:
            self.transformer["ln_b"] = nn.LayerNorm(d, bias=True)  # LN_b, on encoder_out
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

        self.apply(self._init_weights)
        # every out-projection (self, cross, MLP) gets the smaller residual init, scaled by
        # the depth of its own stack (the same for both when they are equal, as in the write-up)
        for stack, depth in ((self.transformer.encoder, config.n_layer_encoder),
                             (self.transformer.decoder, config.n_layer_decoder)):
            for name, p in stack.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * depth))

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
        """Returns (logits, loss, aux); in training aux = {'cross_entropy': the loss before the
        embedding loss, 'embedding_loss': unscaled}, for the log."""
        cfg = self.config
        tr = self.transformer
        B, T = idx.size()
        if T > cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        next_pos = pos + 1  # the positions of the tokens each position predicts

        E = tr.drop(tr.wte(idx) + tr.wpe(pos))  # (B, T, d)
        encoder_out = E
        for block in tr.encoder:
            encoder_out = block(encoder_out)  # (B, T, d)

        x = tr.ln_bridge(encoder_out) if cfg.ln_before_bridge else encoder_out
        x = tr.bridge(x)
        if cfg.add_pos_to_decoder:
            x = x + tr.wpe(next_pos)
        for block in tr.decoder:
            x = block(x, encoder_out)
        decoder_out = tr.ln_f(x)  # (B, T, d)
        if cfg.sub_pos != "no":
            # the head is tied to wte: take out the next position, leave the next token
            decoder_out = decoder_out - tr.wpe(next_pos)
            if cfg.sub_pos == "yes_ln":
                decoder_out = tr.ln_sub(decoder_out)

        if targets is None:
            return self.lm_head(decoder_out[:, [-1], :]), None, {}
        logits = self.lm_head(decoder_out)  # (B, T, vocab)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        aux = {}
        if self.training and cfg.embedding_loss_type != "none":
            aux["cross_entropy"] = loss.detach()  # taken here, where the logits already are
            aux["embedding_loss"] = self.embedding_loss(E, encoder_out)
            loss = loss + cfg.embedding_loss_coeff * aux["embedding_loss"]
        return logits, loss, aux

    def embedding_loss(self, E, encoder_out):
        """Disaffinity between the running mean of E and encoder_out, both (B, T, d)."""
        cfg = self.config
        if cfg.detach == "embedding":
            E = E.detach()
        elif cfg.detach == "encoder_out":
            encoder_out = encoder_out.detach()  # train only the embeddings (and LNs)
        if cfg.ln_encoder_out:
            encoder_out = self.transformer.ln_b(encoder_out)
        if cfg.embedding_ln == "init":
            E = self.transformer.ln_a(E)
        # E_avg_i = mean of E_0..E_i, as one matmul with the (T, T) averaging matrix whose
        # row i holds 1/(i+1) on columns 0..i (torch 2.11's compiler fails on cumsum here).
        # float64: exact sums whatever autocast and TF32 do to float32 matmuls; the write-up's
        # embedding loss falls to ~1e-9, far below bf16's resolution. Apple's MPS has no float64:
        # float32 there.
        exact = torch.float32 if E.device.type == "mps" else torch.float64
        T = E.size(1)
        rows = torch.arange(1, T + 1, device=E.device, dtype=exact).view(T, 1)
        averaging = torch.ones(T, T, device=E.device, dtype=exact).tril() / rows  # (T, T)
        E_avg = (averaging @ E.to(exact)).to(E.dtype)  # (T, T) @ (B, T, d) -> (B, T, d)
        if cfg.embedding_ln == "avg":
            E_avg = self.transformer.ln_a(E_avg)
        return disaffinity(E_avg, encoder_out, cfg.embedding_loss_type)

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
        # 6 per weight per token (both stacks, the bridge and the cross-attention
        # projections are all weights), plus q k^T and p v of each attention: one per
        # encoder block, two per decoder block (self and cross)
        n_attentions = cfg.n_layer_encoder + 2 * cfg.n_layer_decoder
        return 6 * self.get_num_params() + n_attentions * 12 * cfg.n_embd * cfg.block_size

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
