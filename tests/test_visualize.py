"""
Tests of visualize.py: the numbers it draws are the models' own, and the script runs end to end.

Each attention map must reproduce its layer's output (P @ v against the input of c_proj,
every layer and head), the embedding statistics a direct computation, and the embedding
loss's two sides the model's loss. Tiny models with random weights at a scale where every
head attends differently, so a wrong head, mask or transpose shows.
Run: python -m pytest -q test_visualize.py (offline: export TIKTOKEN_CACHE_DIR first)
"""

import importlib.util
import os
import shutil
import struct
import sys

import pytest
import torch
import torch.nn.functional as F

import model_baseline as base
import model_encdec as ed
import model_future_attn as fa
import train
import visualize
from conftest import TINY_MODEL, flip_bits

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py
VOCAB, C = TINY_MODEL["vocab_size"], TINY_MODEL["block_size"]  # C: block_size of the random models
PNG = b"\x89PNG\r\n\x1a\n"
# matplotlib is optional (requirements-test.txt has it): without it, only the drawings go untested
draws = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                           reason="needs matplotlib")


def random_model(module, **overrides):
    """A tiny float64 model with every parameter random: near the init, q . k is so small
    that every head attends almost uniformly and a wrong head would go unnoticed."""
    torch.manual_seed(0)
    model = module.GPT(module.GPTConfig(**{**TINY_MODEL, **overrides})).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def layer_records(model, idx, modules):
    """For each attention module: the arguments of its forward and the input of its c_proj
    (the heads' outputs side by side, (B, T, d)), from one eval-mode forward pass."""
    records = {m: {} for m in modules}
    hooks = []
    for m in modules:
        hooks.append(m.register_forward_pre_hook(lambda m, args: records[m].update(args=args)))
        hooks.append(m.c_proj.register_forward_pre_hook(
            lambda c, args, m=m: records[m].update(y=args[0])))
    model.eval()
    with torch.no_grad():
        model(idx)
    for hook in hooks:
        hook.remove()
    return records


def by_head(y, n_head):
    B, T, d = y.shape
    return y.view(B, T, n_head, d // n_head).transpose(1, 2)  # (B, T, d) -> (B, nh, T, hs)


def plain_attentions(model):
    """[(kind, layer, module, its values v of the captured args)] of the causal attentions."""
    tr = model.transformer

    def self_v(m, args):
        return m.c_attn(args[0]).split(m.n_embd, dim=2)[2]

    def cross_v(m, args):  # the values of encoder_out
        return m.c_kv(args[0]).split(m.n_embd, dim=2)[1]

    if isinstance(model, ed.GPT):
        return ([("encoder", layer, b.attn, self_v) for layer, b in enumerate(tr.encoder)]
                + [("decoder", layer, b.attn, self_v) for layer, b in enumerate(tr.decoder)]
                + [("cross", layer, b.cross_attn, cross_v) for layer, b in enumerate(tr.decoder)])
    return [("self", layer, b.attn, self_v) for layer, b in enumerate(tr.h)]


# --------------------------------------------------------------------------------------
# the numbers


@pytest.mark.parametrize("module, overrides", [
    (base, {}), (base, dict(bias=True)),
    (ed, dict(cross_n_head=8)), (ed, dict(order="alt", n_head=2, cross_n_head=2)),
], ids=["baseline", "baseline_bias", "encdec", "encdec_alt"])
def test_plain_attention_maps_reproduce_each_layer_and_head(module, overrides):
    model = random_model(module, **overrides)
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    maps = visualize.attention_maps(model, idx)
    attentions = plain_attentions(model)
    records = layer_records(model, idx, [m for _, _, m, _ in attentions])
    assert sorted(maps) == sorted({kind for kind, _, _, _ in attentions})
    above = torch.ones(9, 9, dtype=torch.bool).triu(diagonal=1)
    for kind, layer, m, values in attentions:
        P, record = maps[kind][layer], records[m]
        assert P.shape == (2, m.n_head, 9, 9), (kind, layer)
        torch.testing.assert_close(P.sum(-1), torch.ones(2, m.n_head, 9, dtype=P.dtype))
        assert (P[..., above] == 0).all(), (kind, layer)  # causal: nothing above the diagonal
        v = by_head(values(m, record["args"]), m.n_head)  # (B, nh, T, hs)
        y = by_head(record["y"], m.n_head)  # what the layer computed, per head
        torch.testing.assert_close(P @ v, y, rtol=1e-9, atol=1e-9)  # every layer and head
        # the check can fail: another head's map, or the transposed map, gives other outputs
        assert not torch.allclose(P.roll(1, dims=1) @ v, y, atol=1e-3), (kind, layer)
        assert not torch.allclose(P.transpose(-2, -1).tril() @ v, y, atol=1e-3), (kind, layer)


@pytest.mark.parametrize("overrides, T", [
    (dict(future_dim=3), 8),  # the band runs past the prompt: key positions 8..10
    (dict(future_dim=C - 1), C),  # the full future
    # a future layer between causal ones, with biases
    (dict(n_layer=3, start_layer=2, end_layer=2, future_dim=5, bias=True), 7),
], ids=["fd3", "fd_full", "layer2_bias"])
def test_future_attention_maps_reproduce_the_layer(overrides, T):
    model = random_model(fa, **overrides)
    fd = model.config.future_dim
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(2))
    maps = visualize.attention_maps(model, idx)
    blocks = model.transformer.h
    records = layer_records(model, idx, [block.attn for block in blocks])
    assert sorted(maps) == ["future", "target"] and len(maps["future"]) == len(blocks)
    for layer, block in enumerate(blocks):
        square, P_star, record = maps["future"][layer], maps["target"][layer], records[block.attn]
        H = block.attn.n_head
        y = by_head(record["y"], H)  # the layer's out, before c_proj: (B, H, T, hs)
        if not block.future:  # a plain causal layer
            assert P_star is None and square.shape == (2, H, T, T)
            v = by_head(block.attn.c_attn(record["args"][0]).split(32, dim=2)[2], H)
            torch.testing.assert_close(square @ v, y, rtol=1e-9, atol=1e-9)
            continue
        K = min(T + fd, C)  # key positions 0..K-1: the prompt's, then the future keys' beyond it
        assert square.shape == (2, H, T, K)
        i, j = torch.arange(T).view(T, 1), torch.arange(K).view(1, K)
        causal, band = j <= i, (j > i) & (j <= i + fd)
        # the causal part and the band sum to 1, and nothing lies outside them
        torch.testing.assert_close(square.sum(-1), torch.ones(2, H, T, dtype=square.dtype))
        assert (square[..., ~(causal | band)] == 0).all()
        # split as the model does: P_unmasked over the real keys, and P_future, whose column m
        # is key position m+1
        q, k, v = block.attn.heads(record["args"][0])  # (B, H, T, hs) each
        P_unmasked = square[..., :T] * causal[:, :T]  # (B, H, T, T)
        P_future = (square * band)[..., 1:]  # (B, H, T, K-1)
        out = P_unmasked @ v + P_future @ block.attn.V_future[:, :K - 1]  # (B, H, T, hs)
        if block.attn.V_future_bias is not None:
            out = out + block.attn.V_future_bias
        torch.testing.assert_close(out, y, rtol=1e-9, atol=1e-9)
        # the heads differ, so a wrong head would show
        assert not torch.allclose(out.roll(1, dims=1), y, atol=1e-3)
        # the target: P* over the real keys j <= i + future_dim, whose part j > i gives the
        # model's out*_future
        assert P_star.shape == (2, H, T, T)
        torch.testing.assert_close(P_star.sum(-1), torch.ones(2, H, T, dtype=P_star.dtype))
        assert (P_star[..., ~(j[:, :T] <= i + fd)] == 0).all()
        _, _, out_future_star = fa.future_attention(
            q, k, v, block.attn.K_future, block.attn.V_future,
            block.attn.K_future_bias, block.attn.V_future_bias, future_dim=fd, with_target=True)
        torch.testing.assert_close(P_star.triu(diagonal=1) @ v, out_future_star,
                                   rtol=1e-9, atol=1e-9)


def test_computed_future_keys_draw_in_the_same_layout():
    # future_kv='computed': query i's future key at offset o is k_i + K_offset[o-1], its value
    # v_i + V_offset[o-1]; the map puts offset o at key position i+o, as for the learned keys
    model = random_model(fa, future_kv="computed", future_dim=3, bias=True)
    T, fd = 8, 3
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(4))
    maps = visualize.attention_maps(model, idx)
    records = layer_records(model, idx, [block.attn for block in model.transformer.h])
    for layer, block in enumerate(model.transformer.h):
        square, attn = maps["future"][layer], block.attn
        K = min(T + fd, C)
        i, j = torch.arange(T).view(T, 1), torch.arange(K).view(1, K)
        causal, band = j <= i, (j > i) & (j <= i + fd)
        torch.testing.assert_close(square.sum(-1),
                                   torch.ones(2, attn.n_head, T, dtype=square.dtype))
        assert (square[..., ~(causal | band)] == 0).all()
        q, k, v = attn.heads(records[attn]["args"][0])  # (B, H, T, hs)
        # out_unmasked, and the bias of out_future
        out = (square[..., :T] * causal[:, :T]) @ v + attn.V_offset_bias
        for o in range(1, fd + 1):  # out_future, offset by offset: P[i, i+o] (v_i + V_offset[o-1])
            # P[i, i+o] for every query i: (B, H, T, 1)
            p_o = torch.stack([square[:, :, t, t + o] for t in range(T)], dim=-1).unsqueeze(-1)
            out = out + p_o * (v + attn.V_offset[:, o - 1].unsqueeze(1))
        torch.testing.assert_close(out, by_head(records[attn]["y"], attn.n_head),
                                   rtol=1e-9, atol=1e-9)


def test_maps_are_computed_in_eval_mode_and_leave_the_mode_alone():
    model = random_model(base, dropout=0.5)
    idx = torch.randint(0, VOCAB, (1, C), generator=torch.Generator().manual_seed(3))
    model.train()
    first, second = visualize.attention_maps(model, idx), visualize.attention_maps(model, idx)
    assert model.training  # restored
    for P, Q in zip(first["self"], second["self"]):
        assert torch.equal(P, Q)  # no dropout
        assert not P.requires_grad  # under no_grad


@pytest.mark.parametrize("module, overrides, n_pos", [
    (base, {}, C), (fa, dict(future_dim=3), C), (ed, {}, C + 1), (ed, dict(sub_pos="no"), C),
], ids=["baseline", "future_attn", "encdec_possub", "encdec_plain"])
def test_embedding_stats_are_the_direct_computation(module, overrides, n_pos):
    model = random_model(module, **overrides)
    stats = visualize.embedding_stats(model)
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    assert wpe.size(0) == n_pos  # row C only where the encoder-decoder uses the next position
    direct = torch.stack([torch.stack([F.cosine_similarity(wpe[p], wpe[q], dim=0)
                                       for q in range(n_pos)])
                          for p in range(n_pos)])
    torch.testing.assert_close(stats["pos_cosine"], direct)
    torch.testing.assert_close(stats["pos_norms"], torch.linalg.norm(wpe, dim=1))
    torch.testing.assert_close(stats["token_norms"], torch.linalg.norm(wte, dim=1))
    assert stats["token_norms"].shape == (VOCAB,)


@pytest.mark.parametrize("overrides, T", [
    (dict(), C),  # mse, LN_a before the mean, LN_b
    (dict(embedding_loss_type="cosine", bias=True), C - 4),
    (dict(embedding_loss_type="log_cosine", embedding_ln="avg", detach="none"), C),
    (dict(embedding_ln="none", ln_encoder_out=False), C - 1),
], ids=["mse", "cosine", "log_cosine_avg", "mse_no_ln"])
def test_embedding_loss_sides_give_the_models_loss(overrides, T):
    model = random_model(ed, **overrides)
    gen = torch.Generator().manual_seed(4)
    idx = torch.randint(0, VOCAB, (2, T), generator=gen)
    targets = torch.randint(0, VOCAB, (2, T), generator=gen)
    sides = visualize.embedding_loss_sides(model, idx)
    assert sides["E_avg"].shape == sides["encoder_out"].shape == (2, T, 32)
    assert sides["mse"].shape == sides["cosine"].shape == (2, T)
    # the model's own embedding loss, on the same tokens (dropout 0: the same forward)
    model.train()
    _, _, aux = model(idx, targets)
    loss_type = model.config.embedding_loss_type
    from_sides = ed.disaffinity(sides["E_avg"], sides["encoder_out"], loss_type)
    torch.testing.assert_close(from_sides, aux["embedding_loss"])
    from_positions = {"mse": sides["mse"].mean(), "cosine": (1 - (1 + sides["cosine"]) / 2).mean(),
                      "log_cosine": -torch.log((1 + sides["cosine"]) / 2).mean()}[loss_type]
    torch.testing.assert_close(from_positions, aux["embedding_loss"])


def test_no_embedding_loss_no_sides():
    idx = torch.zeros(1, 4, dtype=torch.long)
    assert visualize.embedding_loss_sides(random_model(ed, embedding_loss_type="none"), idx) is None
    assert visualize.embedding_loss_sides(random_model(base), idx) is None


# --------------------------------------------------------------------------------------
# the script, on checkpoints that train.py writes

RUNS = {  # name -> model settings; the GPT-2 vocabulary, so the prompt's tokens fit
    "base": dict(model_type="baseline"),
    "future": dict(model_type="future_attn", future_dim=4),
    # future_dim 63: P_omni far wider than a short prompt
    "wide": dict(model_type="future_attn", block_size=64),
    "encdec": dict(model_type="encdec"),  # MSE embedding loss and position subtraction
    "plain": dict(model_type="encdec", sub_pos="no", embedding_loss_type="none"),
}
RUN = dict(vocab_size=50257, block_size=16, n_layer=2, n_head=2, n_embd=32, batch_size=2,
           gradient_accumulation_steps=1, eval_iters=1, eval_interval=2, log_interval=1,
           max_iters=2, compile=False, device="cpu", dtype="float32", warmup_iters=1,
           learning_rate=1e-3)
PROMPT = "--start=The cat sat on the mat."


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    out = {}
    for name, run_settings in RUNS.items():
        out_dir = tmp_path_factory.mktemp(f"out-{name}", numbered=False)
        run_settings = {**RUN, **run_settings, "data_dir": data_dir, "out_dir": out_dir}
        argv = [f"--{key}={value}" for key, value in run_settings.items()]
        train.train(train.get_config(argv))
        out[name] = str(out_dir)
    return out


def written(out):
    """The paths of the 'wrote PATH: what' lines, each a whole PNG."""
    paths = [line.split(": ")[0][len("wrote "):] for line in out.splitlines()
             if line.startswith("wrote ")]
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == PNG, path
    return sorted(os.path.basename(path) for path in paths)


@draws
@pytest.mark.parametrize("name, files", [
    ("base", ["attention_self_out-base.png", "embeddings_out-base.png"]),
    ("future", ["attention_future_out-future.png", "embeddings_out-future.png"]),
    ("encdec", ["attention_cross_out-encdec.png", "attention_decoder_out-encdec.png",
                "attention_encoder_out-encdec.png", "embedding_loss_out-encdec.png",
                "embeddings_out-encdec.png"]),
])
def test_every_model_type_end_to_end(runs, name, files, tmp_path, capsys):
    assert visualize.main([f"--out_dir={runs[name]}", PROMPT, f"--save_dir={tmp_path}"]) == 0
    assert written(capsys.readouterr().out) == files
    assert sorted(os.listdir(tmp_path)) == files  # no temporary files left


def png_size(path):
    """(width, height) in pixels, from the PNG's header."""
    with open(path, "rb") as f:
        header = f.read(24)
    return struct.unpack(">II", header[16:24])


@draws
# a short prompt, and one longer than any run's block_size
@pytest.mark.parametrize("tokens", [5, 70])
@pytest.mark.parametrize("name", ["base", "wide", "encdec"])
def test_every_picture_fits_a_screen(runs, name, tokens, tmp_path, monkeypatch, capsys):
    """Every PNG at most ~2000 px wide and high, its smallest text 10 px or more, and P* as
    wide as the prompt it shows."""
    import matplotlib.text
    save, smallest_text = visualize.save, {}

    def measured_save(fig, path, dpi):
        fig.canvas.draw()  # tick labels exist once drawn
        texts = [t for t in fig.findobj(matplotlib.text.Text)
                 if t.get_visible() and t.get_text().strip()]
        points = min(t.get_fontsize() for t in texts)
        smallest_text[os.path.basename(path)] = points * dpi / 72  # points -> px
        for ax in fig.axes:
            # P*'s keys are the prompt's: no blank columns after them
            if ax.get_title().startswith("P*"):
                assert ax.get_xlim() == (-0.5, T - 0.5)
        save(fig, path, dpi)

    monkeypatch.setattr(visualize, "save", measured_save)
    T = min(tokens, 64 if name == "wide" else RUN["block_size"])
    argv = [f"--out_dir={runs[name]}", "--start=" + " word" * tokens, f"--save_dir={tmp_path}"]
    assert visualize.main(argv) == 0
    pictures = written(capsys.readouterr().out)
    assert sorted(smallest_text) == pictures
    for picture in pictures:
        width, height = png_size(tmp_path / picture)
        # shown whole at 100% on a laptop's screen
        assert width <= 1600 and height <= 2000, (picture, width, height)
        assert smallest_text[picture] >= 10, picture


@pytest.mark.parametrize("n_heads", range(1, 9))
@pytest.mark.parametrize("panel_widths", [[2.2], [4.5, 2.2], [3.3, 2.2], [0.8, 0.8], [30.0]],
                         ids=["causal", "P_omni_wide", "P_omni", "tiny", "wider_than_a_screen"])
def test_head_rows_fill_rows_alike_within_a_screen(n_heads, panel_widths):
    gaps = 0.35 * len(panel_widths)
    room = visualize.SCREEN_INCHES - visualize.MARGIN_INCHES
    row_of, scale = visualize.head_rows(n_heads, panel_widths, gaps)
    counts = [row_of.count(row) for row in range(row_of[-1] + 1)]
    assert row_of == sorted(row_of) and min(counts) >= 1
    assert max(counts) - min(counts) <= 1  # rows filled alike: 2 + 2, never 3 + 1
    # the fewest rows whose groups fit at the smallest scale, found by trying every count of rows
    smallest_group = visualize.SMALLEST * sum(panel_widths) + gaps  # inches
    fewest = next(rows for rows in range(1, n_heads + 1)
                  if -(-n_heads // rows) * smallest_group <= room or rows == n_heads)
    assert len(counts) == fewest
    # within the screen
    assert max(counts) * (scale * sum(panel_widths) + gaps) <= room + 1e-9 and scale <= 1
    if n_heads * (sum(panel_widths) + gaps) <= room:
        assert scale == 1  # what fits is not shrunk


@draws
def test_future_attention_of_4_heads_takes_a_row_per_layer(tmp_path, monkeypatch):
    # the quick start's future-attention model (4 heads, here 2 of its 4 layers) on a 31-token
    # prompt: one row of heads per layer, under 1600 px wide, on a colour scale where a row's
    # spread weights show
    model = random_model(fa, block_size=64, future_dim=16)
    T = 31
    idx = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(5))
    maps = visualize.attention_maps(model.float(), idx)
    save, drawn = visualize.save, {}

    def measured_save(fig, path, dpi):
        panels = [ax for ax in fig.axes if ax.get_title().endswith("P_omni")]
        drawn["rows"] = sorted({round(ax.get_position().y0, 3) for ax in panels})
        drawn["per_row"] = {y: sum(round(ax.get_position().y0, 3) == y for ax in panels)
                            for y in drawn["rows"]}
        drawn["norms"] = [image.norm for ax in panels for image in ax.get_images()]
        save(fig, path, dpi)

    monkeypatch.setattr(visualize, "save", measured_save)
    labels = [f"t{t}" for t in range(T)]
    path = tmp_path / "future.png"
    visualize.draw_attention(str(path), "future attention", maps["future"], maps["target"],
                             [0, 1], [0, 1, 2, 3], labels, future_dim=16, dpi=80)
    width, height = png_size(path)
    assert width <= 1600 and height <= 800, (width, height)
    assert len(drawn["rows"]) == 2 and set(drawn["per_row"].values()) == {4}
    # a weight of 1/T, that of a row spread evenly, falls in the middle third of the colours
    for norm in drawn["norms"]:
        assert 1 / 3 < norm(1 / T) < 2 / 3 and norm(1.0) == 1.0


@draws
def test_two_runs_side_by_side_and_a_run_without_embedding_loss(runs, capsys):
    # 20 tokens, more than the block_size of 16
    long_prompt = "--start=" + "one two three four five six seven eight nine ten " * 2
    argv = [f"--out_dir={runs['encdec']}", "--out_dir", runs["plain"], long_prompt,
            "--layer", "0", "--head=0"]
    assert visualize.main(argv) == 0
    out = capsys.readouterr().out
    assert "embeddings_out-encdec_vs_out-plain.png" in written(out)
    assert "note: out-plain has no embedding loss" in out
    assert out.count("more than") == 2  # the crop, said once per run
    # the pictures go to the first out_dir by default
    assert "attention_cross_out-plain.png" in os.listdir(runs["encdec"])


@draws
def test_one_layer_and_head(runs, tmp_path, capsys):
    # encdec: 2 self-attention heads, 4 cross-attention heads; head 3 exists in cross only
    argv = [f"--out_dir={runs['encdec']}", PROMPT, "--layer=1", "--head=3",
            f"--save_dir={tmp_path}"]
    assert visualize.main(argv) == 0
    out = capsys.readouterr().out
    assert "note: encoder attention of out-encdec has no head 3" in out
    assert "attention_cross_out-encdec.png" in written(out)
    assert "cross attention weights of layers [1] (of 2) x heads [3] (of 4)" in out


@draws  # the checks that need the checkpoint come after the one for matplotlib
@pytest.mark.parametrize("flag, message", [
    ("--layer=2", "layer must be in 0..1 (out-base has 2 layers), got 2"),
    ("--head=-1", "head must be in 0..1 (out-base has 2 heads), got -1"),
    ("--layer=first", "layer must be in 0..1 (out-base has 2 layers), got 'first'"),
    ("--grid=0", "grid must be at least 1"),
    ("--start=", "the prompt is empty"),
    ("--checkpoint=final", "checkpoint must be 'best' or 'latest', got 'final'"),
])
def test_bad_settings_are_one_line(runs, flag, message, capsys):
    assert visualize.main([f"--out_dir={runs['base']}", PROMPT, flag]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {err[7:]}" and message in err and err.count("\n") == 1


@draws  # without matplotlib, visualize.py says so before it looks for a checkpoint
def test_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    assert visualize.main([f"--out_dir={tmp_path}"]) == 1
    assert capsys.readouterr().err == f"error: no checkpoint at {tmp_path}/best.pt: train one first\n"


def test_without_matplotlib_nothing_is_drawn(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    assert visualize.main([f"--out_dir={runs['base']}", PROMPT, f"--save_dir={tmp_path}"]) == 1
    assert capsys.readouterr().err == ("error: visualize.py draws with matplotlib: "
                                       "pip install matplotlib\n")
    assert os.listdir(tmp_path) == []


@draws
def test_a_checkpoint_with_flipped_bits_is_refused(runs, tmp_path, capsys):
    shutil.copytree(runs["base"], tmp_path / "run")
    flip_bits(tmp_path / "run" / "best.pt")
    assert visualize.main([f"--out_dir={tmp_path / 'run'}", PROMPT, f"--save_dir={tmp_path}"]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 'run'}/best.pt is damaged, or not a "
                                       "checkpoint of this train.py: use a good copy, or train again\n")
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".png")]


def test_help_lists_the_keys(capsys):
    assert visualize.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--layer=None" in out and "--grid=6" in out
