"""
Tests of check_causal.py: it passes every shipped config and every option that changes the
forward pass, and it catches leaks planted here, in copies of the models' attention that
only the tests install (monkeypatch): the "degenerate attention" blog post's softmax over
the queries, a causal mask one key too wide, a cross-attention without its mask, a
future-attention band that reads the real keys, computed future keys built from the next
token instead of the query's own, a training path that peeks at the targets, a path behind a
zero-initialized bias. With --model=MODULE:FACTORY it reads models of the test's own (and
finds the length of those that give none in a config field, or backs off from one where the
forward fails), and through the command line it passes HF transformers' GPT-2, Llama,
RoBERTa and BLOOM and x-transformers' decoder and catches BERT, an x-transformers encoder, an
unmasked torch.nn.TransformerEncoder and the blog post's bug (those libraries' tests skip
when they are not installed).
Run: python -m pytest -q tests/test_check_causal.py

    PYTHONPATH=. python tests/test_check_causal.py   # the checks and the probe on the blog's bug
"""

import dataclasses
import glob
import importlib.util
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

import check_causal
import model_baseline
import model_encdec
import model_future_attn
import train
from conftest import MODEL_VARIANTS, REPO, TINY_MODEL

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def checked_args(path, *flags):
    """The model settings check_causal.py checks for `path` and flags (the shrunk model)."""
    settings, original, config, user_keys = check_causal.parse_args([path, *flags])
    return config["model_type"], check_causal.plan(settings, original, config, user_keys)[0]


def silent(*args, **kwargs):
    pass


# --------------------------------------------------------------------------------------
# the shipped models pass


@pytest.mark.parametrize("path", sorted(glob.glob("config/*.py")))
def test_every_config_is_causal(path):
    model_type, model_args = checked_args(path)
    assert check_causal.check(model_type, model_args, log=silent) is None


MODULE_TYPES = {module: name for name, module in train.MODELS.items()}


@pytest.mark.parametrize("name", MODEL_VARIANTS)
def test_every_option_is_causal(name):
    # conftest's list of every option that changes the forward
    module, options = MODEL_VARIANTS[name]
    model_args = dataclasses.asdict(module.GPTConfig(**{**TINY_MODEL, **options}))
    assert check_causal.check(MODULE_TYPES[module], model_args, log=silent) is None


def test_check_runs_both_modes_and_lengths():
    lines = []
    model_type, model_args = checked_args("config/encdec_mse.py")
    check_causal.check(model_type, model_args, log=lines.append)
    assert [line.split() for line in lines] == [
        ["eval", "mode,", "T=24", "ok"], ["eval", "mode,", "T=16", "ok"],
        ["train", "mode,", "T=24", "ok"], ["train", "mode,", "T=16", "ok"]]


def test_future_attention_runs_the_training_target_in_train_mode(monkeypatch):
    # the train-mode check must take the with_target path that training takes
    calls = []
    original = model_future_attn.future_attention
    monkeypatch.setattr(model_future_attn, "future_attention",
                        lambda *a, **kw: calls.append(kw["with_target"]) or original(*a, **kw))
    model_type, model_args = checked_args("config/future50_mse.py")
    check_causal.check(model_type, model_args, log=silent)
    assert True in calls and False in calls


# --------------------------------------------------------------------------------------
# shrinking, and the flags that win over it


def test_shrink_keeps_the_options_and_scales_future_dim():
    model_type, args = checked_args("config/future50_mse.py")
    assert (args["n_embd"], args["n_head"], args["n_layer"]) == (45, 9, 2)
    assert (args["block_size"], args["vocab_size"]) == (24, 64)
    assert args["future_dim"] == round(50 * 23 / 199) == 6
    assert (args["start_layer"], args["end_layer"], args["future_attn_loss_type"]) == (1, 2, "mse")
    _, args = checked_args("config/future100_mse.py")
    assert args["future_dim"] == round(100 * 23 / 199) == 12


def test_shrink_keeps_baseline_layers_around_future_layers():
    # layers 3..20 of 28: baseline layers before and after stay, two future layers between
    _, args = checked_args("config/future50_mse.py", "--start_layer=3", "--end_layer=20")
    assert (args["n_layer"], args["start_layer"], args["end_layer"]) == (4, 2, 3)
    _, args = checked_args("config/future50_mse.py", "--end_layer=1")
    assert (args["n_layer"], args["start_layer"], args["end_layer"]) == (2, 1, 1)
    # with the user's n_layer, the user's layer range is taken as it is
    _, args = checked_args("config/future50_mse.py", "--n_layer=6", "--start_layer=3",
                           "--end_layer=5")
    assert (args["n_layer"], args["start_layer"], args["end_layer"]) == (6, 3, 5)


def test_shrink_keeps_encdec_head_counts_dividing_the_width():
    _, args = checked_args("config/encdec_mse_possub.py")
    assert (args["n_embd"], args["n_head"], args["cross_n_head"]) == (50, 5, 10)
    assert (args["sub_pos"], args["embedding_loss_coeff"]) == ("yes", 8.0)


def test_shrink_scales_computed_future_keys():
    # K_offset has one row per future step: future_dim scales, and its shape with it
    model_type, args = checked_args("config/future50_mse_computed.py")
    assert (args["future_kv"], args["future_dim"], args["block_size"]) == ("computed", 6, 24)
    model = check_causal.build(model_type, args, seed=0)
    assert model.transformer.h[0].attn.K_offset.shape == (9, 6, 5)
    lines = []
    assert check_causal.check(model_type, args, log=lines.append) is None
    assert all("impl=readable" in line for line in lines)  # no fast path for computed keys
    assert [line.split()[:3] for line in lines][:3] == [
        ["eval", "mode,", "T=24,"], ["eval", "mode,", "T=16,"], ["train", "mode,", "T=24,"]]


def test_shrink_keeps_unequal_stacks_unequal():
    _, args = checked_args("config/encdec_mse_possub_enc17_dec10.py")
    assert (args["n_layer_encoder"], args["n_layer_decoder"]) == (2, 1)
    _, args = checked_args("config/encdec_mse_possub_enc9_dec16.py")
    assert (args["n_layer_encoder"], args["n_layer_decoder"]) == (1, 2)
    _, args = checked_args("config/encdec_mse_possub.py")  # equal stacks: n_layer for both
    assert (args["n_layer"], args["n_layer_encoder"], args["n_layer_decoder"]) == (2, 2, 2)
    # a flag says the depth in the config's scale, so it shrinks too, unless n_layer is the user's
    _, args = checked_args("config/encdec_mse_possub.py", "--n_layer_decoder=4")
    assert (args["n_layer_encoder"], args["n_layer_decoder"]) == (2, 1)
    _, args = checked_args("config/encdec_mse_possub.py", "--n_layer=3", "--n_layer_decoder=4")
    assert (args["n_layer_encoder"], args["n_layer_decoder"]) == (3, 4)


def test_user_flags_win_over_the_shrink():
    _, args = checked_args("config/future50_mse.py", "--block_size=40", "--n_layer=3",
                           "--dropout=0.1")
    sizes = (args["block_size"], args["n_layer"], args["end_layer"], args["dropout"])
    assert sizes == (40, 3, 3, 0.1)
    assert args["future_dim"] == round(50 * 39 / 199) == 10  # scaled from 200 to the user's 40
    # of 199: scaled like the config's
    _, args = checked_args("config/future50_mse.py", "--future_dim=100")
    assert args["future_dim"] == round(100 * 23 / 199) == 12
    _, args = checked_args("config/future50_mse.py", "--future_dim=100", "--block_size=120")
    assert args["future_dim"] == 100
    _, args = checked_args("config/baseline.py", "--full_size=True")
    sizes = (args["n_embd"], args["n_layer"], args["vocab_size"], args["dropout"])
    assert sizes == (160, 26, 50257, 0.0)


def test_the_summary_names_what_was_shrunk(capsys):
    assert check_causal.main(["config/dropout02_baseline.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "config/dropout02_baseline.py: baseline, shrunk to run in seconds: "
        "vocab_size 50257 → 64, "
        "block_size 200 → 24, n_layer 26 → 2, n_embd 160 → 50, dropout 0.2 → 0.0\n")
    assert out.rstrip().endswith(check_causal.CAUSAL)
    # the user's own flags are theirs, not something the check shrank
    assert check_causal.main(["config/tiny_cpu.py", "--n_layer=5", "--n_embd=64"]) == 0
    assert capsys.readouterr().out.startswith(
        "config/tiny_cpu.py: baseline, with the flags' n_layer 4 → 5, n_embd 128 → 64, shrunk to run in seconds: "
        "vocab_size 50257 → 64, block_size 64 → 24\n")  # the flags' sizes are kept
    # --full_size: the config as it is, dropout aside, at 16 positions spread over T
    options, original, config, user_keys = check_causal.parse_args(
        ["config/dropout02_baseline.py", "--full_size"])
    model_args, _ = check_causal.plan(options, original, config, user_keys)
    assert check_causal.describe_changes(original, model_args) == "dropout 0.2 → 0.0"
    assert options["positions"] == 16


def test_bad_settings_exit_2(capsys):
    assert check_causal.main(["config/baseline.py", "--probe_length=1"]) == 2
    assert check_causal.main(["config/baseline.py", "--nonsense=3"]) == 2
    assert check_causal.main(["--probe"]) == 2
    err = capsys.readouterr().err
    assert "probe_length must be at least 2" in err
    assert "unknown key nonsense (--help lists the keys)" in err
    assert "give one config file" in err
    # one line each, no key list: a missing config file, a misspelt key of the checker or of
    # train.py
    for argv, line in (
            (["config/nope.py"], "error: config file config/nope.py not found"),
            (["config/baseline.py", "--probe_lenght", "8"],
             "error: unknown key probe_lenght; did you mean probe_length?"),
            (["config/baseline.py", "--n_layr=2"],
             "error: unknown key n_layr; did you mean n_layer?")):
        assert check_causal.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(line) and err.count("\n") == 1


def test_flags_as_key_space_value():
    spaced = check_causal.parse_args(["config/future50_mse.py", "--probe", "--batch", "3",
                                      "--n_layer", "4", "--full_size", "False"])
    joined = check_causal.parse_args(["config/future50_mse.py", "--probe=True", "--batch=3",
                                      "--n_layer=4", "--full_size=False"])
    assert spaced == joined and spaced[0]["probe"] is True and spaced[2]["n_layer"] == 4


def test_help_lists_both_modes_keys_with_the_values_given(capsys):
    assert check_causal.main(["--model=my.py:gpt", "--probe", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(check_causal.__doc__.strip())
    config_keys, model_keys = out.split("With --model=MODULE:FACTORY instead of a config file:")
    assert "  --full_size=False\n" in config_keys and "  --probe=True\n" in config_keys
    assert "  --model='my.py:gpt'\n" in model_keys and "  --positions=16\n" in model_keys


# --------------------------------------------------------------------------------------
# planted leaks: copies of the attention, installed by the tests only


def attention(self, x, allowed, softmax_dim=-1):
    """CausalSelfAttention's forward with its mask `allowed(i, j)` and softmax dimension spelled
    out."""
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    # (B, T, C) -> (B, nh, T, hs)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
    A = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # (B, nh, T, T)
    P = F.softmax(A.masked_fill(~allowed(i, j), float("-inf")), dim=softmax_dim)
    y = (P @ v).transpose(1, 2).reshape(B, T, C)
    return self.resid_dropout(self.c_proj(y))


def softmax_over_queries(self, x):
    """The "degenerate attention" blog post's bug: the mask is right, the softmax runs down the
    columns: P[i, j] then depends on the scores of the queries after i."""
    return attention(self, x, lambda i, j: j <= i, softmax_dim=-2)


def mask_one_key_too_wide(self, x):
    return attention(self, x, lambda i, j: j <= i + 1)


def cross_attention_unmasked(self, encoder_x, decoder_x):
    B, T, C = decoder_x.size()
    k, v = self.c_kv(encoder_x).split(self.n_embd, dim=2)
    # (B, T, C) -> (B, nh, T, hs)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
               for t in (self.c_q(decoder_x), k, v))
    # no is_causal: query i reads encoder positions after i
    y = F.scaled_dot_product_attention(q, k, v)
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


def future_band_reads_real_keys(self, x, with_target=False):
    """FutureAttention's forward whose band scores the real keys k_j, j = m+1, instead of
    K_future[:, m]."""
    B, T, C = x.size()
    q, k, v = self.heads(x)  # (B, nh, T, hs)
    K_future, V_future, future_dim = self.K_future, self.V_future, self.future_dim
    i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
    causal, band = j <= i, (j > i) & (j <= i + future_dim)
    A = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, T, T)
    P = F.softmax(A.masked_fill(~(causal | band), float("-inf")), dim=-1)
    # key j reads V_future[j - 1]
    out_future = P.masked_fill(~band, 0.0)[..., 1:] @ V_future[:, :T - 1]
    out = P.masked_fill(~causal, 0.0) @ v + out_future
    target = model_future_attn.future_attention(q, k, v, K_future, V_future, future_dim=future_dim,
                                                with_target=with_target)[2]
    # (B, nh, T, hs) -> (B, T, C)
    y = self.resid_dropout(self.c_proj(out.transpose(1, 2).reshape(B, T, C)))
    if not with_target:
        return y, None
    return y, model_future_attn.future_attn_loss(out_future, target.detach(), self.loss_type)


def computed_keys_of_the_next_token(q, k, K_offset, K_offset_bias=None, *, block_size,
                                    with_target=False):
    """computed_future_attention_weights whose future keys start from the next token's k_{i+1},
    not k_i."""
    B, H, T, hs = q.shape
    future_dim = K_offset.size(1)
    n_future = min(T - 1 + future_dim, block_size - 1)
    k_next = torch.cat([k[:, :, 1:], k[:, :, -1:]], dim=2)  # (B, H, T, hs): row i holds k_{i+1}
    A_band = (q * k_next).sum(-1, keepdim=True) + q @ K_offset.transpose(-2, -1)  # (B, H, T, fd)
    offsets = model_future_attn.future_offsets(T, n_future, future_dim, q.device)
    offsets = offsets.expand(B, H, T, n_future)
    return model_future_attn.joint_softmax(q, k, A_band.gather(-1, offsets), future_dim=future_dim,
                                           with_target=with_target)


PLANTED = {  # name: (module, attribute, replacement, config)
    "softmax_over_queries": (model_baseline.CausalSelfAttention, "forward",
                             softmax_over_queries, "config/baseline.py"),
    "mask_one_key_too_wide": (model_baseline.CausalSelfAttention, "forward",
                              mask_one_key_too_wide, "config/baseline.py"),
    "cross_attention_unmasked": (model_encdec.CausalCrossAttention, "forward",
                                 cross_attention_unmasked, "config/encdec_mse_possub.py"),
    "future_band_reads_real_keys": (model_future_attn.FutureAttention, "forward",
                                    future_band_reads_real_keys, "config/future50_mse.py"),
    "computed_keys_of_the_next_token": (model_future_attn, "computed_future_attention_weights",
                                        computed_keys_of_the_next_token,
                                        "config/future50_mse_computed.py"),
}


def plant(monkeypatch, name):
    """Installs the leak `name`; returns the config whose model then has it."""
    owner, attribute, replacement, path = PLANTED[name]
    monkeypatch.setattr(owner, attribute, replacement)
    return path


def test_the_planted_attention_is_right_when_its_bug_is_undone(monkeypatch):
    # so the leaks below come from the bug alone: the copy with the right mask and softmax
    # matches the model's own attention
    monkeypatch.setattr(model_baseline.CausalSelfAttention, "forward",
                        lambda self, x: attention(self, x, lambda i, j: j <= i))
    _, args = checked_args("config/baseline.py")
    model = check_causal.build("baseline", args, seed=0)
    idx = torch.randint(64, (2, 24), generator=torch.Generator().manual_seed(0))
    patched, _, _ = model(idx, idx)
    monkeypatch.undo()
    torch.testing.assert_close(patched, model(idx, idx)[0])


@pytest.mark.parametrize("name", PLANTED)
def test_check_catches_planted_leaks(name, monkeypatch):
    model_type, args = checked_args(plant(monkeypatch, name))
    leak = check_causal.check(model_type, args, log=silent)
    assert leak is not None and leak.position < leak.later
    assert leak.amount > 1e-3  # far above the 1e-9 tolerance


@pytest.mark.parametrize("name", PLANTED)
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_each_check_catches_planted_leaks_on_its_own(name, training, monkeypatch):
    model_type, args = checked_args(plant(monkeypatch, name))
    model = check_causal.build(model_type, args, seed=0).train(training)
    tokens = torch.randint(64, (2, 25), generator=torch.Generator().manual_seed(0))
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    leak = check_causal.perturbation_check(model, idx, targets, 64, "here")
    assert leak.how == "perturbation" and leak.position < leak.later
    leak = check_causal.gradient_check(model, idx, targets, model.transformer.wte, "here")
    assert leak.how == "gradient" and leak.position < leak.later


def test_one_key_too_wide_is_reported_where_it_starts(monkeypatch):
    model_type, args = checked_args(plant(monkeypatch, "mask_one_key_too_wide"))
    leak = check_causal.check(model_type, args, log=silent)
    assert (leak.position, leak.later, leak.setting) == (0, 1, "eval mode, T=24")
    assert str(leak).startswith("LEAK: the logits at position 0 depend on the token at position "
                                "1 (eval mode, T=24; the perturbation check: ")


def test_a_few_positions_spread_over_the_sequence_still_catch_a_leak(monkeypatch):
    assert check_causal.spread(4, 1, 24) == [1, 9, 16, 24]
    assert check_causal.spread(0, 0, 3) == check_causal.spread(9, 0, 3) == [0, 1, 2, 3]
    model_type, args = checked_args(plant(monkeypatch, "future_band_reads_real_keys"))
    leak = check_causal.check(model_type, args, positions=4, log=silent)
    assert leak.later in (1, 9, 16, 24) and leak.position < leak.later


def test_a_leak_through_the_targets_is_caught(monkeypatch):
    # a training path that peeks at the targets (the next tokens): only the perturbation
    # check sees it, since targets[p-1] is the token at p
    original = model_baseline.GPT.forward

    def peek(self, idx, targets=None):
        logits, loss, aux = original(self, idx, targets)
        if self.training and targets is not None:
            logits = logits + self.lm_head.weight[targets].sum(-1, keepdim=True)
        return logits, loss, aux

    monkeypatch.setattr(model_baseline.GPT, "forward", peek)
    model_type, args = checked_args("config/baseline.py")
    leak = check_causal.check(model_type, args, log=silent)
    assert (leak.how, leak.position, leak.later) == ("perturbation", 0, 1)
    assert leak.setting == "train mode, T=24"


def test_random_weights_open_paths_that_the_init_closes(monkeypatch):
    # a leak scaled by a bias that the model initializes to 0: invisible at the model's own
    # init, caught once every parameter is drawn afresh
    original = model_baseline.CausalSelfAttention.forward

    def next_token_through_a_zero_bias(self, x):
        return original(self, x) + self.c_proj.bias * x.roll(-1, dims=1)

    monkeypatch.setattr(model_baseline.CausalSelfAttention, "forward",
                        next_token_through_a_zero_bias)
    model_type, args = checked_args("config/baseline.py", "--bias=True")
    assert check_causal.check(model_type, args, log=silent).later == 1
    monkeypatch.setattr(check_causal, "randomize", lambda model, generator: None)
    assert check_causal.check(model_type, args, log=silent) is None


def test_main_exits_1_on_a_leak(monkeypatch, capsys):
    assert check_causal.main([plant(monkeypatch, "cross_attention_unmasked")]) == 1
    last_line = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last_line.startswith("LEAK: the logits at position ")


# --------------------------------------------------------------------------------------
# the reversal probe


PROBE = dict(check_causal.CHECK_DEFAULTS, probe_length=8, probe_steps=150, probe_batch=64)


def probe_of(path):
    argv = [path, "--probe", "--probe_length=8"]
    settings, original, config, user_keys = check_causal.parse_args(argv)
    _, probe_args = check_causal.plan(settings, original, config, user_keys)
    torch.manual_seed(0)
    return check_causal.train_probe(train.build_model(config["model_type"], probe_args), PROBE)


def test_probe_tells_a_causal_model_from_a_leaky_one(monkeypatch, capsys):
    causal = probe_of("config/baseline.py")
    assert causal["verdict"] == "causal"
    first, second = causal["eval"]
    assert second > 0.9 and abs(first - 0.1) < 0.03
    # the leaky model through main(), its exact checks made to pass: the probe decides alone
    monkeypatch.setattr(check_causal, "check", lambda *args, **kwargs: None)
    flags = ["--probe", "--probe_length=8", "--probe_steps=150", "--probe_batch=64", "--seed=0"]
    assert check_causal.main([plant(monkeypatch, "softmax_over_queries"), *flags]) == 1
    out = capsys.readouterr().out
    assert "probe: reversal of 8 digits 0..9\n  after 150 steps, accuracy on the first" in out
    leaky_first = float(re.search(r"eval mode ([\d.]+)%", out).group(1)) / 100
    assert leaky_first > first + 0.2
    assert out.rstrip().endswith(check_causal.PROBE_VERDICTS["leak"])
    # a probe that learns nothing proves nothing
    monkeypatch.undo()
    monkeypatch.setattr(check_causal, "check", lambda *args, **kwargs: None)
    assert check_causal.main(["config/baseline.py", "--probe", "--probe_steps=1"]) == 1
    assert capsys.readouterr().out.rstrip().endswith(check_causal.PROBE_VERDICTS["inconclusive"])


def test_probe_halves_follow_what_each_position_has_seen():
    # a model that copies its input position-wise is right wherever the target is the
    # token itself (the middle of an odd length) and knows nothing else
    idx = torch.arange(5).repeat(4, 1)  # (4, 5)

    class Echo(torch.nn.Module):
        def forward(self, idx, targets):
            return F.one_hot(idx, 10).double(), None, {}

    first, second = check_causal.probe_accuracy(Echo(), idx, idx.flip(1), training=False)
    assert (first, second) == (0.0, 1 / 3)  # positions 0, 1 unseen; 2 (itself), 3, 4 seen


# --------------------------------------------------------------------------------------
# any PyTorch model: --model=MODULE:FACTORY, on models of the test's own (in this process) and
# of libraries no one here wrote (through the command line, as a user runs it)


OWN_MODELS = """
import types

import torch
from torch import nn


class Tiny(nn.Module):
    # position i's logits come from a running mean of the token embeddings 0..i, after dropout
    block_size = 8

    def __init__(self, output="tensor", peek=False, gate=False):
        super().__init__()
        self.output, self.peek = output, peek
        self.embed, self.dropout = nn.Embedding(64, 16), nn.Dropout(0.5)
        self.head = nn.Linear(16, 64)
        self.gate = nn.Parameter(torch.zeros(16)) if gate else None

    def forward(self, idx):
        x = self.dropout(self.embed(idx))
        x = x.cumsum(1) / torch.arange(1, idx.size(1) + 1).view(-1, 1)  # (B, T, 16)
        if self.gate is not None:  # 0 at init: position i reads i+1 once the weights are redrawn
            x = x + self.gate * x.roll(-1, dims=1)
        logits = self.head(x)
        if self.peek:  # position 3 sees whether token 5 is odd: +1 to it changes them by 0.25
            at_3 = (torch.arange(idx.size(1)) == 3).view(-1, 1)  # (T, 1)
            logits = logits + 0.25 * at_3 * (idx[:, 5:6] % 2).unsqueeze(-1)
        if self.output == "tuple":
            return logits, None
        if self.output == "hf":
            return types.SimpleNamespace(logits=logits, loss=None)
        return logits[:, -1:] if self.output == "last" else logits


def causal():
    return Tiny()


def gated():
    return Tiny(gate=True)


def peek_tensor():
    return Tiny(peek=True)


def peek_tuple():
    return Tiny(peek=True, output="tuple")


def peek_hf():
    return Tiny(peek=True, output="hf")


def last_only():
    return Tiny(output="last")


def two_embeddings():
    model = Tiny()
    model.spare = nn.Embedding(64, 16)
    return model


def broken():
    raise RuntimeError("no weights here")


def not_a_model():
    return "a model"
"""

# models that give no length in a config field: the checks run at the default length, or at the
# longest length below it (or below the config's) at which the forward works
LENGTH_MODELS = """
import torch
from torch import nn
from torch.nn import functional as F


class MaskedAttention(nn.Module):
    # one head of attention as nanoGPT writes it: a causal mask buffer and a position table of
    # 16 rows, and no config or length attribute
    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(64, 32), nn.Embedding(16, 32)
        self.qkv, self.head = nn.Linear(32, 3 * 32), nn.Linear(32, 64)
        self.register_buffer("mask", torch.ones(16, 16).tril().view(1, 16, 16))

    def forward(self, idx):
        T = idx.size(1)
        x = self.tokens(idx) + self.positions(torch.arange(T))
        q, k, v = self.qkv(x).split(32, dim=-1)  # (B, T, 32) each
        scores = (q @ k.transpose(1, 2)) / 32 ** 0.5  # (B, T queries, T keys)
        scores = scores.masked_fill(self.mask[:, :T, :T] == 0, float("-inf"))
        return self.head(x + scores.softmax(dim=-1) @ v)


class BlockMixer(nn.Module):
    # runs at any length: a running mean of the token embeddings, and (leak=True) the mean of
    # the block of 8 positions each position is in, which holds the later tokens of its block
    def __init__(self, leak):
        super().__init__()
        self.leak, self.tokens, self.head = leak, nn.Embedding(64, 32), nn.Linear(32, 64)

    def forward(self, idx):
        x = self.tokens(idx)  # (B, T, 32)
        B, T, C = x.shape
        mixed = x.cumsum(1) / torch.arange(1, T + 1).view(-1, 1)
        if self.leak:
            padded = F.pad(x, (0, 0, 0, -T % 8))  # (B, T rounded up to a multiple of 8, 32)
            blocks = padded.view(B, -1, 8, C).mean(2)  # (B, number of blocks, 32)
            mixed = mixed + blocks.repeat_interleave(8, dim=1)[:, :T]
        return self.head(mixed)


class Offset(nn.Module):
    # RoBERTa's way: position ids start at padding_idx + 1 = 2, so the table of
    # max_position_embeddings = 18 rows serves inputs of up to 16 tokens
    max_position_embeddings = 18

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(64, 32), nn.Embedding(18, 32)
        self.head = nn.Linear(32, 64)

    def forward(self, idx):
        T = idx.size(1)
        x = self.tokens(idx) + self.positions(torch.arange(2, T + 2))
        return self.head(x.cumsum(1))


class NoLength(nn.Module):
    # fails at every length
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(64, 32)

    def forward(self, idx):
        raise RuntimeError(f"no forward at {idx.size(1)} tokens")


def masked_attention():
    return MaskedAttention()


def block_mixer():
    return BlockMixer(leak=True)


def running_mean():
    return BlockMixer(leak=False)


def offset():
    return Offset()


def no_length():
    return NoLength()
"""


@pytest.fixture
def own_models(tmp_path, monkeypatch):
    """own_models.py (OWN_MODELS) and length_models.py in the current directory, fresh; what the
    checks add to sys.path and sys.modules is undone after."""
    (tmp_path / "own_models.py").write_text(OWN_MODELS)
    (tmp_path / "length_models.py").write_text(LENGTH_MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield "own_models.py"
    for name in ("own_models", "length_models", "mypackage", "mypackage.models"):
        sys.modules.pop(name, None)


def test_a_leak_is_named_where_it_starts_whatever_the_output(own_models, capsys):
    # position 3 sees token 5, by exactly 0.25, whether the logits come as a tensor, a tuple or
    # .logits
    models = ",".join(f"own_models.py:peek_{form}" for form in ("tensor", "tuple", "hf"))
    assert check_causal.main([f"--model={models}"]) == 1
    out = capsys.readouterr().out
    leaks = [line for line in out.splitlines() if line.startswith("LEAK")]
    leak = ("LEAK: the logits at position 3 depend on the token at position 5 (eval mode, T=8; "
            "the perturbation check: 0.25)")
    assert leaks == [leak] * 3
    assert out.rstrip().endswith(f"0 of 3 models causal; not causal: {models.replace(',', ', ')}")


def test_weights_are_redrawn_unless_kept(own_models, capsys):
    # a path through a parameter that starts at 0: random weights open it; the model's own keep
    # it shut. Train mode draws dropout masks: the checks stay exact, since every forward draws
    # the same ones
    assert check_causal.main(["--model=own_models.py:gated"]) == 1
    assert "LEAK: the logits at position 0 depend on the token at position 1 " in (
        capsys.readouterr().out)
    models = "own_models.py:gated,own_models.py:causal"
    assert check_causal.main([f"--model={models}", "--keep_weights"]) == 0
    out = capsys.readouterr().out
    assert "  train mode, T=8 " in out and out.rstrip().endswith("2 of 2 models causal")


def test_the_vocabulary_the_length_and_the_embedding_are_found(own_models, capsys):
    assert check_causal.main(["--model=own_models.py:causal"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("own_models.py:causal: Tiny; T=8, from block_size\n"
                          "  vocab_size 64 from the logits' size; token embeddings from embed, "
                          "the one nn.Embedding of 64 rows\n")
    # 16 positions spread over T (all 8 here), in both modes, at T and at 2T/3
    assert [line.split() for line in out.splitlines()[2:-1]] == [
        ["eval", "mode,", "T=8", "ok"], ["eval", "mode,", "T=5", "ok"],
        ["train", "mode,", "T=8", "ok"], ["train", "mode,", "T=5", "ok"]]
    assert out.endswith(check_causal.CAUSAL + "\n")
    assert check_causal.main(["--model=own_models.py:two_embeddings", "--embedding=embed",
                              "--vocab_size=50", "--block_size=6"]) == 0
    out = capsys.readouterr().out
    assert "; T=6, from --block_size\n" in out
    assert "vocab_size 50 from --vocab_size; token embeddings from --embedding=embed" in out

    class HasConfig(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config, self.max_seq_len, self.words = config, 99, torch.nn.Embedding(7, 2)

        def get_input_embeddings(self):
            return self.words

    config = type("Config", (), dict(vocab_size=7, n_positions=16, max_position_embeddings=20))()
    hf_like = HasConfig(config)
    assert check_causal.length_of(hf_like, 0) == (16, "from config.n_positions")
    with_a_dict = HasConfig(dict(block_size=12))
    assert check_causal.length_of(with_a_dict, 0) == (12, "from config.block_size")
    assert check_causal.length_of(HasConfig(None), 0) == (99, "from max_seq_len")
    assert check_causal.length_of(torch.nn.Linear(2, 2), 0)[0] == check_causal.DEFAULT_LENGTH
    assert check_causal.token_embedding(hf_like, 64, "") == (
        hf_like.words, "words, its get_input_embeddings()")


def test_a_dotted_module_is_imported_from_the_current_directory(own_models, capsys):
    os.makedirs("mypackage")
    os.rename(own_models, "mypackage/models.py")
    assert check_causal.main(["--model=mypackage.models:causal"]) == 0
    assert "mypackage.models:causal: Tiny; " in capsys.readouterr().out


def test_a_model_of_any_length_is_checked_at_the_default(own_models, capsys):
    # a mixer that runs at any length: checked at 64 and 42, where its block average leaks
    models = "length_models.py:block_mixer,length_models.py:running_mean"
    assert check_causal.main([f"--model={models}"]) == 1
    out = capsys.readouterr().out
    assert out.count("; T=64, from the default (the model gives none)\n") == 2
    assert re.search(r"^LEAK: the logits at position 0 depend on the token at position 1 "
                     r"\(eval mode, T=64; ", out, re.M)
    assert "  eval mode, T=42 " in out
    assert out.rstrip().endswith("1 of 2 models causal; not causal: length_models.py:block_mixer")


def test_the_longest_length_that_runs_is_found(own_models, capsys):
    # a mask buffer and a position table of 16 rows, and no length in a config: from 64 down
    assert check_causal.main(["--model=length_models.py:masked_attention"]) == 0
    out = capsys.readouterr().out
    assert ("length_models.py:masked_attention: MaskedAttention; T=16, the longest that runs, "
            "below 64 from the default (the model gives none)\n") in out
    assert "  eval mode, T=10 " in out and "  train mode, T=16 " in out
    # position ids from 2: max_position_embeddings is 18, the longest input 16
    assert check_causal.main(["--model=length_models.py:offset"]) == 0
    assert ("; T=16, the longest that runs, below 18 from max_position_embeddings\n"
            in capsys.readouterr().out)

    class RunsUpTo(torch.nn.Module):
        def __init__(self, longest):
            super().__init__()
            self.longest, self.tried = longest, []

        def forward(self, idx, targets=None):
            self.tried.append(idx.size(1))
            if idx.size(1) > self.longest:
                raise IndexError("too long")
            return torch.zeros(*idx.shape, 3), None, {}

    # the binary search agrees with trying every length from the top, in a few forwards
    for block_size in (2, 3, 17, 64):
        for longest in range(2, block_size + 1):
            model = RunsUpTo(longest)
            assert check_causal.longest_working_length(model, block_size) == longest
            assert len(model.tried) <= 2 + math.ceil(math.log2(block_size))


@pytest.mark.parametrize("flags, error", [
    (["--model=own_models.py"],
     "error: --model=own_models.py: write MODULE:FACTORY, e.g. --model=my_models.py:"),
    (["--model=nowhere.py:tiny"],
     "error: nowhere.py:tiny: ModuleNotFoundError: No module named 'nowhere'"),
    (["--model=nowhere.models:tiny"],
     "error: nowhere.models:tiny: ModuleNotFoundError: No module named 'nowhere'"),
    (["--model=own_models.py:tiny"],
     "error: own_models.py:tiny: AttributeError: module 'own_models' has no attribute 'tiny'"),
    (["--model=own_models.py:broken"],
     "error: own_models.py:broken: RuntimeError: no weights here"),
    (["--model=own_models.py:not_a_model"],
     "error: not_a_model() returned a str, not an nn.Module"),
    (["--model=own_models.py:last_only"],
     "error: expected logits (1, 8, vocab) as a tensor, the first of a tuple or list, or "
     ".logits; got torch.Size([1, 1, 64])"),
    (["--model=own_models.py:two_embeddings"],
     "error: no get_input_embeddings() and 2 nn.Embedding of 64 rows: name the module that "
     "embeds the tokens with --embedding=ATTR.PATH"),
    (["--model=own_models.py:causal", "--embedding=head.weight"],
     "error: --embedding=head.weight: the model has no module head.weight"),
    (["--model=own_models.py:two_embeddings", "--embedding=spare"],
     "error: the token embedding was not called (eval mode, T=8); name the module that embeds "
     "the tokens with --embedding=ATTR.PATH"),
    (["--model=own_models.py:causal", "--block_size=1"], "error: block_size must be at least 2"),
    (["--model=own_models.py:causal", "--batch=0"], "error: batch must be at least 1, got 0"),
    (["--model=length_models.py:no_length"],  # the lengths the binary search tried, no more
     "error: the forward fails at each length tried, T = 64, 32, 16, 8, 4, 2; at T=64: RuntimeError: no "
     "forward at 64 tokens. A model that runs at one length alone: give it as --block_size"),
    (["--model=own_models.py:causal", "--probe"],
     "error: the probe's 16 digits 0..9 need T >= 16 and vocab_size >= 10"),
    (["--model=own_models.py:causal", f"{REPO}/config/baseline.py"],
     f"error: --model checks the model its factory builds: give no config file "
     f"({REPO}/config/baseline.py) with it"),
    (["--model=own_models.py:causal", "--full_size"], "error: unknown key full_size"),
])
def test_what_the_checks_cannot_read_exits_2_with_one_line(own_models, flags, error, capsys):
    assert check_causal.main(flags) == 2
    err = capsys.readouterr().err
    assert err.startswith(error) and err.count("\n") == 1, err


def check_from_the_command_line(folder, *flags):
    """(exit status, output) of `python check_causal.py FLAGS`, run in folder as a user runs it."""
    done = subprocess.run([sys.executable, os.path.join(REPO, "check_causal.py"), *flags],
                          cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, done.stdout


def verdicts(out):
    """{MODULE:FACTORY: its verdict line, 'causal: ...' or 'LEAK: ...'} from check_causal's
    output."""
    found, model = {}, None
    for line in out.splitlines():
        header = re.match(r"(\S+:\w+): ", line)
        if header:
            model = header.group(1)
        elif line.startswith(("causal:", "LEAK:")):
            found.setdefault(model, line.split(":")[0])
    return found


def skip_unless_installed(library):
    # find_spec, not importorskip: importing transformers here would cost seconds the subprocess
    # pays again
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed (pip install -r requirements-test.txt)")


HF_MODELS = """
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel
from transformers import BloomConfig, BloomForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers import RobertaConfig, RobertaForCausalLM

TINY = dict(vocab_size=64, max_position_embeddings=32, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4)


def gpt2(attn_implementation="sdpa"):  # HF's default attention; "eager" is its plain PyTorch one
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        attn_implementation=attn_implementation)
    return GPT2LMHeadModel(config)


def gpt2_eager():
    return gpt2("eager")


def llama(attn_implementation="sdpa"):
    config = LlamaConfig(**TINY, num_key_value_heads=2, attn_implementation=attn_implementation)
    return LlamaForCausalLM(config)


def llama_eager():
    return llama("eager")


def bert():
    return BertForMaskedLM(BertConfig(**TINY))


def roberta():  # position ids start at pad_token_id + 1 = 2: inputs of up to 32 tokens
    config = RobertaConfig(**dict(TINY, max_position_embeddings=34), pad_token_id=1,
                           is_decoder=True)
    return RobertaForCausalLM(config)


def bloom():  # ALiBi: no length in its config
    return BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4))
"""


def test_hf_transformers_causal_lms_pass_and_bert_leaks(tmp_path):
    # RoBERTa's length in its config is 2 more than it runs at; BLOOM's config has none
    skip_unless_installed("transformers")
    (tmp_path / "hf_models.py").write_text(HF_MODELS)
    names = ("gpt2", "gpt2_eager", "llama", "llama_eager", "bert", "roberta", "bloom")
    models = ",".join(f"hf_models.py:{n}" for n in names)
    status, out = check_from_the_command_line(tmp_path, f"--model={models}")
    assert verdicts(out) == {"hf_models.py:gpt2": "causal", "hf_models.py:gpt2_eager": "causal",
                             "hf_models.py:llama": "causal", "hf_models.py:llama_eager": "causal",
                             "hf_models.py:bert": "LEAK", "hf_models.py:roberta": "causal",
                             "hf_models.py:bloom": "causal"}, out
    assert ("hf_models.py:roberta: RobertaForCausalLM; T=32, the longest that runs, below 34 "
            "from config.max_position_embeddings\n") in out
    assert ("hf_models.py:bloom: BloomForCausalLM; T=64, from the default (the model gives "
            "none)\n") in out
    assert status == 1
    assert "hf_models.py:gpt2: GPT2LMHeadModel; T=32, from config.n_positions\n" in out
    assert ("vocab_size 64 from the logits' size; token embeddings from transformer.wte, its "
            "get_input_embeddings()") in out
    assert ("hf_models.py:llama: LlamaForCausalLM; T=32, from "
            "config.max_position_embeddings\n") in out
    assert "token embeddings from model.embed_tokens, its get_input_embeddings()" in out
    assert re.search(r"LEAK: the logits at position 0 depend on the token at position 1 "
                     r"\(eval mode, T=32; ", out)


XT_MODELS = """
from x_transformers import Decoder, Encoder, TransformerWrapper


def decoder():
    layers = Decoder(dim=32, depth=2, heads=4)
    return TransformerWrapper(num_tokens=64, max_seq_len=32, attn_layers=layers)


def encoder():
    layers = Encoder(dim=32, depth=2, heads=4)
    return TransformerWrapper(num_tokens=64, max_seq_len=32, attn_layers=layers)
"""


def test_x_transformers_decoder_passes_and_encoder_leaks(tmp_path):
    skip_unless_installed("x_transformers")
    (tmp_path / "xt_models.py").write_text(XT_MODELS)
    # MODULE as a dotted path
    status, out = check_from_the_command_line(tmp_path,
                                              "--model=xt_models:decoder,xt_models:encoder")
    assert verdicts(out) == {"xt_models:decoder": "causal", "xt_models:encoder": "LEAK"}, out
    assert status == 1
    assert "xt_models:decoder: TransformerWrapper; T=32, from max_seq_len\n" in out
    assert ("vocab_size 64 from the logits' size; token embeddings from token_emb.emb, "
            "the one nn.Embedding of 64 rows") in out


TORCH_MODELS = """
import torch
from torch import nn


class Encoder(nn.Module):
    # torch's own TransformerEncoder, with the causal mask or without it
    def __init__(self, causal):
        super().__init__()
        self.causal = causal
        self.tokens, self.positions = nn.Embedding(64, 32), nn.Embedding(32, 32)
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.lm_head = nn.Linear(32, 64)

    def forward(self, idx):
        T = idx.size(1)
        x = self.tokens(idx) + self.positions(torch.arange(T))
        mask = None
        if self.causal:
            mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype)
        return self.lm_head(self.encoder(x, mask=mask, is_causal=self.causal))


class SoftmaxOverQueries(nn.Module):
    # the "degenerate attention" blog post's bug: the mask is right, the softmax runs down the
    # queries
    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(64, 32), nn.Embedding(32, 32)
        self.qkv, self.lm_head = nn.Linear(32, 3 * 32), nn.Linear(32, 64)

    def forward(self, idx):
        T = idx.size(1)
        x = self.tokens(idx) + self.positions(torch.arange(T))
        q, k, v = self.qkv(x).split(32, dim=-1)  # (B, T, 32) each
        scores = (q @ k.transpose(1, 2)) / 32 ** 0.5  # (B, T queries, T keys)
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        P = scores.masked_fill(~allowed, float("-inf")).softmax(dim=1)  # dim 1: over the queries
        return self.lm_head(x + P @ v)


def masked():
    return Encoder(causal=True)


def unmasked():
    return Encoder(causal=False)


def softmax_over_queries():
    return SoftmaxOverQueries()
"""


def test_torch_encoder_passes_with_the_causal_mask_and_leaks_without(tmp_path):
    (tmp_path / "torch_models.py").write_text(TORCH_MODELS)
    models = "torch_models.py:masked,torch_models.py:unmasked,torch_models.py:softmax_over_queries"
    # flags as `--key value` and a bare --probe, as a user may type them; the probe runs for the
    # causal one
    status, out = check_from_the_command_line(tmp_path, "--model", models, "--block_size", "32",
                                              "--probe", "--probe_length=8", "--probe_steps=100",
                                              "--probe_batch=32")
    assert verdicts(out) == {"torch_models.py:masked": "causal", "torch_models.py:unmasked": "LEAK",
                             "torch_models.py:softmax_over_queries": "LEAK"}, out
    assert status == 1
    assert "torch_models.py:masked: Encoder; T=32, from --block_size\n" in out
    assert "token embeddings from tokens, the one nn.Embedding of 64 rows" in out
    assert check_causal.PROBE_VERDICTS["causal"] in out


def demo():
    """The checks and the probe on the blog post's bug, as docs/causality.md shows them; flags
    go to the probe (e.g. --probe_steps=400)."""
    monkeypatch = pytest.MonkeyPatch()
    path = plant(monkeypatch, "softmax_over_queries")
    print(f"$ python check_causal.py {path}   # softmax over the queries, planted")
    print(f"exit status {check_causal.main([path])}")
    options, original, config, user_keys = check_causal.parse_args([path, "--probe", *sys.argv[1:]])
    _, probe_args = check_causal.plan(options, original, config, user_keys)
    print(f"\nthe probe on the same model: {check_causal.describe_changes(original, probe_args)}")
    torch.manual_seed(config["seed"])
    model = train.build_model(config["model_type"], probe_args)
    result = check_causal.train_probe(model, options, seed=config["seed"])
    check_causal.report_probe(result, options["probe_vocab"])
    monkeypatch.undo()


if __name__ == "__main__":
    demo()
