"""
Tests of check_causal.py: it passes every shipped config and every option that changes the
forward pass, and it catches leaks planted here, in copies of the models' attention that
only the tests install (monkeypatch): the "degenerate attention" blog post's softmax over the queries, a causal mask
one key too wide, a cross-attention without its mask, a future-attention band that reads
the real keys, computed future keys built from the next token instead of the query's own,
a training path that peeks at the targets, a path behind a zero-initialized bias.
Run: python -m pytest -q test_check_causal.py

    python test_check_causal.py     # the checker and the probe on the blog post's bug
"""

import dataclasses
import glob
import math
import sys

import pytest
import torch
from torch.nn import functional as F

import check_causal
import model_baseline
import model_encdec
import model_future_attn
from lib import settings
from conftest import MODEL_VARIANTS, TINY_MODEL

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


MODULE_TYPES = {module: name for name, module in settings.MODELS.items()}


@pytest.mark.parametrize("name", MODEL_VARIANTS)
def test_every_option_is_causal(name):
    module, options = MODEL_VARIANTS[name]  # conftest's list of every option that changes the forward
    model_args = dataclasses.asdict(module.GPTConfig(**{**TINY_MODEL, **options}))
    assert check_causal.check(MODULE_TYPES[module], model_args, log=silent) is None


def test_check_runs_both_modes_and_lengths():
    lines = []
    model_type, model_args = checked_args("config/encdec_mse.py")
    check_causal.check(model_type, model_args, log=lines.append)
    assert [line.split()[:3] for line in lines] == [
        ["eval", "mode,", "T=24"], ["eval", "mode,", "T=16"], ["train", "mode,", "T=24"], ["train", "mode,", "T=16"]]
    assert all(" ok: earlier logits changed by at most 0 " in line for line in lines)


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
    assert (args["n_embd"], args["n_head"], args["n_layer"], args["block_size"], args["vocab_size"]) == (45, 9, 2, 24, 64)
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
    _, args = checked_args("config/future50_mse.py", "--n_layer=6", "--start_layer=3", "--end_layer=5")
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
    assert [line.split()[:3] for line in lines][:3] == [["eval", "mode,", "T=24,"], ["eval", "mode,", "T=16,"],
                                                        ["train", "mode,", "T=24,"]]


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
    _, args = checked_args("config/future50_mse.py", "--block_size=40", "--n_layer=3", "--dropout=0.1")
    assert (args["block_size"], args["n_layer"], args["end_layer"], args["dropout"]) == (40, 3, 3, 0.1)
    assert args["future_dim"] == round(50 * 39 / 199) == 10  # scaled from 200 to the user's 40
    _, args = checked_args("config/future50_mse.py", "--future_dim=100")  # of 199: scaled like the config's
    assert args["future_dim"] == round(100 * 23 / 199) == 12
    _, args = checked_args("config/future50_mse.py", "--future_dim=100", "--block_size=120")
    assert args["future_dim"] == 100
    _, args = checked_args("config/baseline.py", "--full_size=True")
    assert (args["n_embd"], args["n_layer"], args["vocab_size"], args["dropout"]) == (160, 26, 50257, 0.0)


def test_the_summary_names_what_was_shrunk(capsys):
    assert check_causal.main(["config/dropout02_baseline.py"]) == 0
    out = capsys.readouterr().out
    assert ("shrunk to run in seconds (--full_size=True checks the config's own sizes): vocab_size 50257 → 64, "
            "block_size 200 → 24, n_layer 26 → 2, n_embd 160 → 50, dropout 0.2 → 0.0") in out
    assert out.rstrip().endswith("in eval and train mode")


def test_bad_settings_exit_2(capsys):
    assert check_causal.main(["config/baseline.py", "--probe_length=1"]) == 2
    assert check_causal.main(["config/baseline.py", "--nonsense=3"]) == 2
    assert check_causal.main(["--probe"]) == 2
    err = capsys.readouterr().err
    assert "probe_length must be at least 2" in err and "unknown key nonsense (--help lists the keys)" in err
    assert "give one config file" in err
    # one line each, no key list: a missing config file, a misspelt key of the checker or of train.py
    for argv, line in ((["config/nope.py"], "error: config file config/nope.py not found"),
                       (["config/baseline.py", "--probe_lenght", "8"], "error: unknown key probe_lenght; did you mean probe_length?"),
                       (["config/baseline.py", "--n_layr=2"], "error: unknown key n_layr; did you mean n_layer?")):
        assert check_causal.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(line) and err.count("\n") == 1


def test_flags_as_key_space_value():
    spaced = check_causal.parse_args(["config/future50_mse.py", "--probe", "--batch", "3", "--n_layer", "4",
                                      "--full_size", "False"])
    joined = check_causal.parse_args(["config/future50_mse.py", "--probe=True", "--batch=3", "--n_layer=4",
                                      "--full_size=False"])
    assert spaced == joined and spaced[0]["probe"] is True and spaced[2]["n_layer"] == 4


# --------------------------------------------------------------------------------------
# planted leaks: copies of the attention, installed by the tests only


def attention(self, x, allowed, softmax_dim=-1):
    """CausalSelfAttention's forward with its mask `allowed(i, j)` and softmax dimension spelled out."""
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
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
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (self.c_q(decoder_x), k, v))
    y = F.scaled_dot_product_attention(q, k, v)  # no is_causal: query i reads encoder positions after i
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


def future_band_reads_real_keys(self, x, with_target=False):
    """FutureAttention's forward whose band scores the real keys k_j, j = m+1, instead of K_future[:, m]."""
    B, T, C = x.size()
    q, k, v = self.heads(x)  # (B, nh, T, hs)
    K_future, V_future, future_dim = self.K_future, self.V_future, self.future_dim
    i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
    causal, band = j <= i, (j > i) & (j <= i + future_dim)
    A = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, T, T)
    P = F.softmax(A.masked_fill(~(causal | band), float("-inf")), dim=-1)
    out_future = P.masked_fill(~band, 0.0)[..., 1:] @ V_future[:, :T - 1]  # key j reads V_future[j - 1]
    out = P.masked_fill(~causal, 0.0) @ v + out_future
    target = model_future_attn.future_attention(q, k, v, K_future, V_future, future_dim=future_dim,
                                                with_target=with_target)[2]
    y = self.resid_dropout(self.c_proj(out.transpose(1, 2).reshape(B, T, C)))  # (B, nh, T, hs) -> (B, T, C)
    return y, model_future_attn.future_attn_loss(out_future, target.detach(), self.loss_type) if with_target else None


def computed_keys_of_the_next_token(q, k, K_offset, K_offset_bias=None, *, block_size, with_target=False):
    """computed_future_attention_weights whose future keys start from the next token's k_{i+1}, not k_i."""
    B, H, T, hs = q.shape
    future_dim = K_offset.size(1)
    n_future = min(T - 1 + future_dim, block_size - 1)
    k_next = torch.cat([k[:, :, 1:], k[:, :, -1:]], dim=2)  # (B, H, T, hs): row i holds k_{i+1}
    A_band = (q * k_next).sum(-1, keepdim=True) + q @ K_offset.transpose(-2, -1)  # (B, H, T, fd)
    offsets = model_future_attn.future_offsets(T, n_future, future_dim, q.device).expand(B, H, T, n_future)
    return model_future_attn.joint_softmax(q, k, A_band.gather(-1, offsets), future_dim=future_dim,
                                           with_target=with_target)


PLANTED = {  # name: (module, attribute, replacement, config)
    "softmax_over_queries": (model_baseline.CausalSelfAttention, "forward", softmax_over_queries, "config/baseline.py"),
    "mask_one_key_too_wide": (model_baseline.CausalSelfAttention, "forward", mask_one_key_too_wide, "config/baseline.py"),
    "cross_attention_unmasked": (model_encdec.CausalCrossAttention, "forward", cross_attention_unmasked,
                                 "config/encdec_mse_possub.py"),
    "future_band_reads_real_keys": (model_future_attn.FutureAttention, "forward", future_band_reads_real_keys,
                                    "config/future50_mse.py"),
    "computed_keys_of_the_next_token": (model_future_attn, "computed_future_attention_weights",
                                        computed_keys_of_the_next_token, "config/future50_mse_computed.py"),
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
    leak, _, _ = check_causal.perturbation_check(model, idx, targets, 64, "here")
    assert leak.how == "perturbation" and leak.position < leak.later
    leak, _ = check_causal.gradient_check(model, idx, targets, "here")
    assert leak.how == "gradient" and leak.position < leak.later


def test_one_key_too_wide_is_reported_where_it_starts(monkeypatch):
    model_type, args = checked_args(plant(monkeypatch, "mask_one_key_too_wide"))
    leak = check_causal.check(model_type, args, log=silent)
    assert (leak.position, leak.later, leak.setting) == (0, 1, "eval mode, T=24")
    assert str(leak).startswith("LEAK: logits at position 0 change by ")
    assert str(leak).endswith(" when the token at position 1 changes (eval mode, T=24)")


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
    assert (leak.how, leak.position, leak.later, leak.setting) == ("perturbation", 0, 1, "train mode, T=24")


def test_random_weights_open_paths_that_the_init_closes(monkeypatch):
    # a leak scaled by a bias that the model initializes to 0: invisible at the model's own
    # init, caught once every parameter is drawn afresh
    original = model_baseline.CausalSelfAttention.forward

    def next_token_through_a_zero_bias(self, x):
        return original(self, x) + self.c_proj.bias * x.roll(-1, dims=1)

    monkeypatch.setattr(model_baseline.CausalSelfAttention, "forward", next_token_through_a_zero_bias)
    model_type, args = checked_args("config/baseline.py", "--bias=True")
    assert check_causal.check(model_type, args, log=silent).later == 1
    monkeypatch.setattr(check_causal, "randomize", lambda model, generator: None)
    assert check_causal.check(model_type, args, log=silent) is None


def test_main_exits_1_on_a_leak(monkeypatch, capsys):
    assert check_causal.main([plant(monkeypatch, "cross_attention_unmasked")]) == 1
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("LEAK: logits at position ")


# --------------------------------------------------------------------------------------
# the reversal probe


PROBE = dict(check_causal.CHECK_DEFAULTS, probe_length=8, probe_steps=150, probe_batch=64)


def probe_of(path):
    settings, original, config, user_keys = check_causal.parse_args([path, "--probe", "--probe_length=8"])
    _, probe_args = check_causal.plan(settings, original, config, user_keys)
    return check_causal.probe(config["model_type"], probe_args, PROBE, log=silent)


def test_probe_tells_a_causal_model_from_a_leaky_one(monkeypatch):
    causal = probe_of("config/baseline.py")
    leaky = probe_of(plant(monkeypatch, "softmax_over_queries"))
    assert causal["verdict"] == "causal" and leaky["verdict"] == "leak"
    assert causal["eval"]["second"] > 0.9 and abs(causal["eval"]["first"] - 0.1) < 0.03
    assert leaky["eval"]["first"] > causal["eval"]["first"] + 0.2


def test_probe_halves_follow_what_each_position_has_seen():
    # a model that copies its input position-wise is right wherever the target is the
    # token itself (the middle of an odd length) and knows nothing else
    idx = torch.arange(5).repeat(4, 1)  # (4, 5)

    class Echo(torch.nn.Module):
        def forward(self, idx, targets):
            return F.one_hot(idx, 10).double(), None, {}

    first, second = check_causal.probe_accuracy(Echo(), idx, idx.flip(1), training=False)
    assert (first, second) == (0.0, 1 / 3)  # positions 0, 1 unseen; 2 (itself), 3, 4 seen


def demo():
    """The checker and the probe on the blog post's bug, as the README shows them; flags go to
    the probe (e.g. --probe_seconds=30)."""
    monkeypatch = pytest.MonkeyPatch()
    path = plant(monkeypatch, "softmax_over_queries")
    print(f"$ python check_causal.py {path}   # softmax over the queries, planted")
    print(f"exit status {check_causal.main([path])}")
    settings, original, config, user_keys = check_causal.parse_args([path, "--probe", *sys.argv[1:]])
    _, probe_args = check_causal.plan(settings, original, config, user_keys)
    print(f"\nthe probe on the same model: {check_causal.describe_changes(original, probe_args)}")
    result = check_causal.probe(config["model_type"], probe_args, settings, seed=config["seed"])
    check_causal.report_probe(result, settings["probe_vocab"])
    monkeypatch.undo()


if __name__ == "__main__":
    demo()
