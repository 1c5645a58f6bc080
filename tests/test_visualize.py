"""
Tests of visualize.py: the numbers it draws are the models' own, the pictures fit a laptop's
screen, and the script runs end to end.

Each attention map must reproduce its layer's output (P @ v against the input of c_proj,
every layer and head), the embedding statistics a direct computation, and the embedding
loss's two sides the model's loss. Tiny models with random weights at a scale where every
head attends differently, so a wrong head, mask or transpose shows.
Run: python -m pytest -q tests/test_visualize.py (offline: export TIKTOKEN_CACHE_DIR first)
"""

import importlib.util
import os
import re
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
# the pictures' size

# the write-ups' future-attention model: 28 layers of 9 heads, each P_omni beside its P*
WRITEUP_GRID = (28, 9)


def fake_future_maps(n_layers, n_heads, T, future_dim):
    """attention_maps' future and target lists of random rows that sum to 1."""
    torch.manual_seed(0)
    square = torch.rand(n_layers, 1, n_heads, T, T + future_dim).softmax(-1)
    target = torch.rand(n_layers, 1, n_heads, T, T).softmax(-1)
    return list(square), list(target)


def png_size(path):
    """(width, height) in pixels, from the PNG's header."""
    with open(path, "rb") as f:
        header = f.read(24)
    return struct.unpack(">II", header[16:24])


def test_the_writeups_28_layers_of_9_heads_fit_a_laptops_screen():
    # the picture is its figure size times the dpi (test_the_panels_are_as_wide_... checks it)
    screen_w, screen_h = visualize.SCREEN_INCHES
    assert screen_w * 80 <= 1520 and screen_h * 80 <= 960  # pixels at the default dpi
    n_layers, n_heads = WRITEUP_GRID
    for widths in ([3.0, 1.0], [1.0]):  # P_omni beside P*, and a plain map
        width, height = visualize.attention_figsize(n_layers, n_heads, widths)
        assert width <= screen_w + 1e-9 and height <= screen_h + 1e-9
        # each layer's row still a third of an inch high, 27 pixels
        assert (height - 2.0) / n_layers >= 1 / 3
    # a grid that fits is drawn at full size: PANEL_INCHES per panel, and room for the labels
    width, height = visualize.attention_figsize(2, 3, [1.0])
    assert height == 2.0 + 2 * (visualize.PANEL_INCHES + 0.4)
    assert width == 1.5 + 3 * visualize.PANEL_INCHES
    # a grid too large for the screen keeps its proportions
    big = visualize.attention_figsize(6, 9, [3.0, 1.0])
    unshrunk = (1.5 + 9 * 4.0 * visualize.PANEL_INCHES, 2.0 + 6 * (visualize.PANEL_INCHES + 0.4))
    assert big[0] / big[1] == pytest.approx(unshrunk[0] / unshrunk[1])
    assert max(big[0] / screen_w, big[1] / screen_h) == pytest.approx(1.0)


@draws
def test_the_panels_are_as_wide_as_their_keys_with_square_cells(tmp_path, monkeypatch):
    # 2 layers of 2 heads on a 31-token prompt, future_dim 16: P_omni 47 keys wide, beside P*
    T, future_dim = 31, 16
    square, target = fake_future_maps(2, 2, T, future_dim)
    save, drawn = visualize.save, {}

    def measured_save(fig, path, dpi):
        fig.canvas.draw()
        panels = [ax for ax in fig.axes if ax.get_images()]
        drawn["panels"] = [(ax.get_position().width * fig.get_figwidth(),
                            ax.get_position().height * fig.get_figheight(), ax.get_xlim())
                           for ax in panels]
        drawn["norm"] = panels[0].get_images()[0].norm
        save(fig, path, dpi)

    monkeypatch.setattr(visualize, "save", measured_save)
    labels = [f"t{t}" for t in range(T)]
    visualize.draw_attention(str(tmp_path / "a.png"), "future", square, target, [0, 1], [0, 1],
                             labels, dpi=80)
    # the picture is its figure size times the dpi, which attention_figsize gives
    width, height = visualize.attention_figsize(2, 2, [(T + future_dim) / T, 1.0])
    assert width < visualize.SCREEN_INCHES[0] and height < visualize.SCREEN_INCHES[1]
    png_width, png_height = png_size(tmp_path / "a.png")
    assert abs(png_width - 80 * width) <= 1 and abs(png_height - 80 * height) <= 1
    assert len(drawn["panels"]) == 2 * 2 * 2
    for k, (width, height, xlim) in enumerate(drawn["panels"]):
        keys = T + future_dim if k % 2 == 0 else T  # P_omni, then P*
        assert xlim == (-0.5, keys - 0.5)  # P*'s keys are the prompt's: no blank columns
        # cells about square: the panel's width over its keys near its height over its queries
        assert width / keys == pytest.approx(height / T, rel=0.35), (k, width, height)
    # a weight of 1/T, that of a row spread evenly, falls in the middle third of the colours
    assert 1 / 3 < drawn["norm"](1 / T) < 2 / 3 and drawn["norm"](1.0) == 1.0


@draws
@pytest.mark.parametrize("n_layers, n_heads, T, future_dim", [
    (6, 6, 30, 50),  # the default --grid over the write-up's model, on a 30-token prompt
    (2, 2, 8, 63),  # P_omni's keys nine times the prompt's: its token labels at the left only
])
def test_no_two_labels_overlap(n_layers, n_heads, T, future_dim, tmp_path, monkeypatch):
    import matplotlib.text
    square, target = fake_future_maps(n_layers, n_heads, T, future_dim)
    texts = []

    def measured_save(fig, path, dpi):  # measures the labels, and writes no PNG (half the time)
        fig.canvas.draw()  # tick labels exist once drawn
        renderer = fig.canvas.get_renderer()
        texts.extend((t.get_text(), t.get_window_extent(renderer))
                     for t in fig.findobj(matplotlib.text.Text)
                     if t.get_visible() and t.get_text().strip())
        visualize.pyplot().close(fig)

    monkeypatch.setattr(visualize, "save", measured_save)
    labels = [f"token{t}" for t in range(T)]
    visualize.draw_attention(str(tmp_path / "a.png"), "run: future attention", square, target,
                             list(range(n_layers)), list(range(n_heads)), labels, dpi=80)
    assert sum(text.startswith("layer ") for text, _ in texts) == n_layers  # a label per row
    overlapping = [(text, other) for i, (text, box) in enumerate(texts)
                   for other, other_box in texts[i + 1:] if box.overlaps(other_box)]
    assert not overlapping


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
    """The file names of the 'wrote PATH' lines, each a whole PNG."""
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
    # the run's folder is a plain word, anywhere on the command line
    assert visualize.main([PROMPT, runs[name], f"--save_dir={tmp_path}"]) == 0
    assert written(capsys.readouterr().out) == files
    assert sorted(os.listdir(tmp_path)) == files  # no temporary files left


@draws
# a short prompt, and one longer than any run's block_size
@pytest.mark.parametrize("tokens", [5, 70])
@pytest.mark.parametrize("name", ["base", "wide", "encdec"])
def test_every_picture_fits_a_screen(runs, name, tokens, tmp_path, monkeypatch, capsys):
    """Every PNG within 1520 x 960 pixels, and its smallest text 10 pixels or more."""
    import matplotlib.text
    save, smallest_text = visualize.save, {}

    def measured_save(fig, path, dpi):
        fig.canvas.draw()  # tick labels exist once drawn
        texts = [t for t in fig.findobj(matplotlib.text.Text)
                 if t.get_visible() and t.get_text().strip()]
        smallest_text[os.path.basename(path)] = min(t.get_fontsize() for t in texts) * dpi / 72
        save(fig, path, dpi)

    monkeypatch.setattr(visualize, "save", measured_save)
    argv = [runs[name], "--start=" + " word" * tokens, f"--save_dir={tmp_path}"]
    assert visualize.main(argv) == 0
    pictures = written(capsys.readouterr().out)
    assert sorted(smallest_text) == pictures
    for picture in pictures:
        width, height = png_size(tmp_path / picture)
        assert width <= 1520 and height <= 960, (picture, width, height)
        assert smallest_text[picture] >= 10, picture


@draws
@pytest.mark.parametrize("names", [["out-encdec"], ["out-encdec_mse_possub", "out-encdec_plain"]])
def test_the_embeddings_titles_overlap_nothing(names, tmp_path, monkeypatch):
    # each title stays clear of the colour bar, its label and the other titles
    stats = {name: visualize.embedding_stats(random_model(ed)) for name in names}
    save, boxes = visualize.save, {}

    def measured_save(fig, path, dpi):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes["titles"] = [ax.title.get_window_extent(renderer) for ax in fig.axes[:-1]
                           if ax.get_title()]
        boxes["colour bar"] = fig.axes[-1].get_tightbbox(renderer)  # added last
        save(fig, path, dpi)

    monkeypatch.setattr(visualize, "save", measured_save)
    visualize.draw_embeddings(str(tmp_path / "e.png"), stats, dpi=80)
    titles = boxes["titles"]
    assert len(titles) == len(names)
    for i, title in enumerate(titles):
        assert not title.overlaps(boxes["colour bar"])
        assert not any(title.overlaps(other) for other in titles[i + 1:])


@draws
def test_two_runs_side_by_side_and_a_run_without_embedding_loss(runs, tmp_path, capsys):
    # the second run's folder has the first's name: its pictures take the name out-encdec_2
    shutil.copytree(runs["plain"], tmp_path / "out-encdec")
    # 21 tokens, more than the block_size of 16
    long_prompt = "--start=" + "one two three four five six seven eight nine ten " * 2
    argv = [runs["encdec"], str(tmp_path / "out-encdec"), long_prompt, "--layer", "0", "--head=0"]
    assert visualize.main(argv) == 0
    out = capsys.readouterr().out
    files = written(out)
    assert "embeddings_out-encdec_vs_out-encdec_2.png" in files
    assert "embedding_loss_out-encdec.png" in files
    assert "embedding_loss_out-encdec_2.png" not in files  # it has no embedding loss
    assert "note: out-encdec reads the first 16 of the prompt's 21 tokens" in out
    assert out.count("note:") == 2  # the crop, said once per run
    # the pictures go to the first run's folder by default
    assert "attention_cross_out-encdec_2.png" in os.listdir(runs["encdec"])


@draws
def test_one_layer_and_head(runs, tmp_path, capsys):
    # encdec: 2 self-attention heads, 4 cross-attention heads; head 3 exists in cross only
    argv = [runs["encdec"], PROMPT, "--layer=1", "--head", "3", f"--save_dir={tmp_path}"]
    assert visualize.main(argv) == 0
    out = capsys.readouterr().out
    assert written(out) == ["attention_cross_out-encdec.png", "embedding_loss_out-encdec.png",
                            "embeddings_out-encdec.png"]
    assert "attention_cross_out-encdec.png: layers [1], heads [3]" in out


@pytest.mark.parametrize("grid, count, picked", [
    (6, 2, [0, 1]), (1, 2, [0]), (6, 28, [0, 5, 11, 16, 22, 27]), (3, 9, [0, 4, 8]),
    (9, 9, list(range(9))),
])
def test_the_grid_spreads_the_layers_and_heads(grid, count, picked):
    config = dict(visualize.DEFAULTS, grid=grid)
    assert visualize.pick(config, "layer", {"self": count}, "run") == {"self": picked}
    # the reference: the first and the last, and between them as evenly as whole indices go
    if len(picked) > 1:
        gaps = [b - a for a, b in zip(picked, picked[1:])]
        assert picked[0] == 0 and picked[-1] == count - 1 and max(gaps) - min(gaps) <= 1
    assert visualize.pick(dict(config, head=count - 1), "head", {"self": count}, "run") == {
        "self": [count - 1]}


@pytest.mark.parametrize("flags, drawn", [
    # each kind of attention spreads --grid over its own heads and layers: the self-attentions'
    # 4 heads all, not those of 0..7 below 4 ([0, 1, 3])
    ({}, {"encoder": ([0, 1, 2], [0, 1, 2, 3]), "decoder": ([0], [0, 1, 2, 3]),
          "cross": ([0], [0, 1, 3, 4, 6, 7])}),
    ({"grid": 3}, {"encoder": ([0, 1, 2], [0, 2, 3]), "decoder": ([0], [0, 2, 3]),
                   "cross": ([0], [0, 4, 7])}),
    # a layer or a head that only some kinds have is drawn for those
    ({"head": 5}, {"cross": ([0], [5])}),
    ({"layer": 2, "head": 1}, {"encoder": ([2], [1])}),
])
def test_each_kind_of_attention_picks_from_its_own_heads(flags, drawn, monkeypatch):
    # an encoder-decoder of 3 encoder and 1 decoder layers, 4 self-attention heads and 8 cross
    model = random_model(ed, n_head=4, cross_n_head=8, n_layer_encoder=3, n_layer_decoder=1,
                         embedding_loss_type="none", ln_encoder_out=False)
    calls = {}

    def draw_attention(path, title, maps, targets, layers, heads, labels, dpi):
        calls[title.split()[1]] = (layers, heads)  # "run: encoder attention"

    monkeypatch.setattr(visualize, "draw_attention", draw_attention)
    config = dict(visualize.DEFAULTS, **flags)
    visualize.draw_run("run", model, list(range(6)), [str(t) for t in range(6)], config, "")
    assert calls == drawn


@pytest.mark.parametrize("flags, message", [
    ({"head": 8}, "head must be in 0..7 (run has 8 heads), got 8"),  # the cross-attention's 8
    ({"layer": 3}, "layer must be in 0..2 (run has 3 layers), got 3"),  # the encoder's 3
])
def test_a_layer_or_head_that_no_kind_has_is_refused(flags, message):
    model = random_model(ed, n_head=4, cross_n_head=8, n_layer_encoder=3, n_layer_decoder=1)
    config = dict(visualize.DEFAULTS, **flags)
    with pytest.raises(visualize.ConfigError, match=re.escape(message)):
        visualize.draw_run("run", model, [0, 1], ["0", "1"], config, "")


@draws  # the checks that need the checkpoint come after the one for matplotlib
@pytest.mark.parametrize("flag, message", [
    ("--layer=2", "layer must be in 0..1 (out-base has 2 layers), got 2"),
    ("--head=-1", "head must be in 0..1 (out-base has 2 heads), got -1"),
    ("--layer=first", "layer must be in 0..1 (out-base has 2 layers), got 'first'"),
    ("--grid=0", "grid and dpi must be at least 1"),
    ("--start=", "the prompt is empty"),
    ("--checkpoint=final", "checkpoint must be 'best' or 'latest', got 'final'"),
])
def test_bad_settings_are_one_line(runs, flag, message, tmp_path, capsys):
    assert visualize.main([runs["base"], PROMPT, flag, f"--save_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {err[7:]}" and message in err and err.count("\n") == 1
    assert os.listdir(tmp_path) == []


@draws
def test_run_folders_as_out_dir_flags(runs, tmp_path, capsys):
    # --out_dir=RUN, as train.py writes it, and --out_dir RUN, each as often as there are runs
    argv = [f"--out_dir={runs['base']}", PROMPT, "--out_dir", runs["future"], "--layer=0",
            "--head=0", f"--save_dir={tmp_path}"]
    assert visualize.main(argv) == 0
    assert written(capsys.readouterr().out) == [
        "attention_future_out-future.png", "attention_self_out-base.png",
        "embeddings_out-base_vs_out-future.png"]
    assert visualize.main([f"--out_dir={runs['base']}", PROMPT, f"--save_dir={tmp_path}"]) == 0


def test_no_run_folder_is_one_line(capsys):
    assert visualize.main([PROMPT]) == 2
    assert capsys.readouterr().err.startswith("error: no run to draw: give its folder")


@draws
def test_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    assert visualize.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"error: no checkpoint at {tmp_path}/best.pt: train one first\n"


def test_without_matplotlib_nothing_is_drawn(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    assert visualize.main([runs["base"], PROMPT, f"--save_dir={tmp_path}"]) == 1
    assert capsys.readouterr().err == ("error: visualize.py draws with matplotlib: "
                                       "pip install matplotlib\n")
    assert os.listdir(tmp_path) == []


@draws
def test_a_checkpoint_with_flipped_bits_is_refused(runs, tmp_path, capsys):
    shutil.copytree(runs["base"], tmp_path / "run")
    flip_bits(tmp_path / "run" / "best.pt")
    assert visualize.main([str(tmp_path / "run"), PROMPT, f"--save_dir={tmp_path}"]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 'run'}/best.pt is damaged, or not a "
                                       "checkpoint of this train.py: use a good copy, or train "
                                       "again\n")
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".png")]


def test_help_lists_the_keys(capsys):
    assert visualize.main(["--help", "--grid=3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(visualize.__doc__.strip()[:40])
    assert "--layer=None" in out and "--grid=3" in out  # the values the command line gives
