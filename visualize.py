"""
Draws what a model that train.py trained has learned (any of the three; its checkpoint names
its type): best.pt, the lowest val loss, unless --checkpoint=latest (ckpt.pt).

    python visualize.py --out_dir=out-tiny_cpu --start="The history of the city"
    python visualize.py --out_dir=out-future50_mse --start=FILE:prompt.txt --layer=3 --head=0
    python visualize.py --out_dir=out-encdec_possub --out_dir=out-encdec_plain --save_dir=pictures
    python visualize.py --help                                # every key with its default

For each run (repeat --out_dir to compare runs) it writes PNG files to save_dir:
  attention_<kind>_<run>.png  the attention weights of the prompt, layers x heads: 'self'
      (baseline), 'future' (future attention: P_omni with its band of future keys, beside
      its target P*), 'encoder', 'decoder' and 'cross' (encoder-decoder)
  embeddings_<run>[_vs_<run2>...].png  cosine similarity of the position embeddings, and
      the norms of token and position embeddings, runs side by side on the same scales
  embedding_loss_<run>.png  per position, how close E_avg and the normalized encoder_out
      are (encoder-decoder runs with an embedding loss)
Needs matplotlib (pip install matplotlib). Tokens are GPT-2 BPE (tiktoken); offline, point
TIKTOKEN_CACHE_DIR at a cached copy.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import configurator
from configurator import ConfigError, UserError
from sample import check_which, gpt2_tokenizer, model_path, read_prompt, read_settings
from train import load_checkpoint, model_from_checkpoint, write_atomically

DEFAULTS = dict(
    out_dir="out",  # the training run to draw; repeat --out_dir=... to compare runs
    checkpoint="best",  # 'best' (best.pt, the lowest val loss) or 'latest' (ckpt.pt)
    start=("The history of the city begins in the Middle Ages, "
           "when a small village grew up around the church."),
    # one layer to draw, 0-indexed (per stack for encdec); None = a grid spread over all
    layer=None,
    head=None,  # one head to draw, 0-indexed; None = a grid spread over all
    grid=6,  # without --layer/--head, at most this many layers (rows) and heads (columns)
    save_dir="",  # where the PNG files go; "" = the first out_dir
    dpi=80,  # resolution of the PNG files
)


# --------------------------------------------------------------------------------------
# the numbers: attention weights, embedding statistics, the embedding loss's two sides


def split_heads(t, n_head):
    B, T, d = t.size()
    return t.view(B, T, n_head, d // n_head).transpose(1, 2)  # (B, T, d) -> (B, nh, T, hs)


def causal_weights(q, k):
    """softmax(q k^T / sqrt(hs)) over keys j <= i: what F.scaled_dot_product_attention(...,
    is_causal=True) computes and does not return. q, k (B, nh, T, hs) -> (B, nh, T, T)."""
    T, hs = q.size(-2), q.size(-1)
    A = (q @ k.transpose(-2, -1)) / hs ** 0.5  # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # True = may attend
    return F.softmax(A.masked_fill(~causal, float("-inf")), dim=-1)


def future_square(P_omni, T):
    """P_omni (B, H, T, T+F) as the write-up draws it, (B, H, T, 1+F) with column j the key
    position j: the causal weights at j <= i, and future column m at key position m+1 (the
    band i < j <= i + future_dim). The two parts never share a cell, so rows still sum to 1."""
    # the causal part (B, H, T, T) and the future part (B, H, T, F)
    P_unmasked, P_future = P_omni.split([T, P_omni.size(-1) - T], dim=-1)
    square = F.pad(P_future, (1, 0))  # (B, H, T, 1+F): column m moves to key position m+1
    square[..., :T] += P_unmasked
    return square


def forward_with_hooks(model, idx, hooks):
    """ONE forward pass of idx in eval mode (no dropout) for the hooks to see the model's own
    tensors; then the hooks are removed and the model's mode restored."""
    was_training = model.training
    try:
        model.eval()
        model(idx)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()


def attention_modules(model):
    """{kind: the attention module of each layer}, in the order of the model's layers."""
    tr = model.transformer
    if "encoder" in tr:
        return dict(encoder=[block.attn for block in tr.encoder],
                    decoder=[block.attn for block in tr.decoder],
                    cross=[block.cross_attn for block in tr.decoder])
    kind = "future" if hasattr(model.config, "future_dim") else "self"
    return {kind: [block.attn for block in tr.h]}


@torch.no_grad()
def attention_maps(model, idx):
    """The attention weights of every layer and head for the tokens idx (B, T), in eval mode.

    Returns {kind: [per layer, (B, H, T, K)]} (kinds of attention_modules), each row summing
    to 1. Plain and cross attention: K = T, zero above the diagonal. Future attention:
    future_square of P_omni, K = min(T + future_dim, C), and under 'target' its P* (B, H, T, T),
    the softmax over the real keys j <= i + future_dim (None for a layer without future attention).
    """
    modules = attention_modules(model)
    inputs = {}  # module -> the arguments of its forward
    hooks = [m.register_forward_pre_hook(lambda m, args: inputs.__setitem__(m, args))
             for layer_modules in modules.values() for m in layer_modules]
    forward_with_hooks(model, idx, hooks)
    maps = {kind: [] for kind in modules}
    if "future" in maps:
        maps["target"] = []
    for kind, layer_modules in modules.items():
        for m in layer_modules:
            if hasattr(m, "attention_weights"):  # future attention: the layer's own P_omni, P*
                P_omni, P_star = m.attention_weights(inputs[m][0])
                maps[kind].append(future_square(P_omni, idx.size(1)))
                maps["target"].append(P_star)
                continue
            # cross-attention: queries from the decoder, keys from the encoder
            if hasattr(m, "c_q"):
                encoder_x, decoder_x = inputs[m]
                q = m.c_q(decoder_x)  # (B, T, d)
                k = m.c_kv(encoder_x)[..., :m.n_embd]  # (B, T, 2d) -> the keys (B, T, d)
            else:
                q, k, _ = m.c_attn(inputs[m][0]).split(m.n_embd, dim=2)  # (B, T, d) each
            maps[kind].append(causal_weights(split_heads(q, m.n_head), split_heads(k, m.n_head)))
            if kind == "future":
                maps["target"].append(None)  # a causal layer has no target
    return maps


@torch.no_grad()
def embedding_stats(model):
    """{'pos_cosine': (P, P) cosine similarity of the position embeddings wpe[0..P-1],
    'pos_norms': (P,), 'token_norms': (vocab_size,) row norms of wpe and wte}. P = C, or C+1
    where the encoder-decoder keeps row C for the next position of the last token."""
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    unit = F.normalize(wpe, dim=-1)  # (P, d), rows of norm 1
    return dict(pos_cosine=unit @ unit.T,  # (P, d) @ (d, P) -> (P, P)
                pos_norms=torch.linalg.norm(wpe, dim=-1),
                token_norms=torch.linalg.norm(wte, dim=-1))


@torch.no_grad()
def embedding_loss_sides(model, idx):
    """The two sides of the encoder-decoder's embedding loss for the tokens idx (B, T), in eval
    mode, computed with the model's own LayerNorms as GPT.embedding_loss computes them:
    {'E_avg': (B, T, d), 'encoder_out': LN_b(encoder_out) (B, T, d), 'mse': (B, T), 'cosine':
    (B, T)}, the last two per position. None for a model without an embedding loss."""
    cfg, tr = model.config, model.transformer
    if getattr(cfg, "embedding_loss_type", "none") == "none":
        return None
    captured = {}  # E enters the first encoder block, encoder_out leaves the last
    hooks = [
        tr.encoder[0].register_forward_pre_hook(lambda m, args: captured.update(E=args[0])),
        tr.encoder[-1].register_forward_hook(lambda m, args, out: captured.update(encoder_out=out)),
    ]
    forward_with_hooks(model, idx, hooks)
    E, encoder_out = captured["E"], captured["encoder_out"]  # (B, T, d) each
    if cfg.ln_encoder_out:
        encoder_out = tr.ln_b(encoder_out)  # LN_b
    if cfg.embedding_ln == "init":
        E = tr.ln_a(E)  # LN_a before the running mean
    # E_avg_i = mean of E_0..E_i, in float64 like the model
    T = E.size(1)
    counts = torch.arange(1, T + 1, device=E.device, dtype=torch.float64).view(-1, 1)  # (T, 1)
    E_avg = (E.double().cumsum(dim=1) / counts).to(E.dtype)  # (B, T, d)
    if cfg.embedding_ln == "avg":
        E_avg = tr.ln_a(E_avg)  # LN_a after it
    return dict(E_avg=E_avg, encoder_out=encoder_out, mse=((E_avg - encoder_out) ** 2).mean(dim=-1),
                cosine=F.cosine_similarity(E_avg, encoder_out, dim=-1))


# --------------------------------------------------------------------------------------
# the drawings


def pyplot():
    """matplotlib.pyplot, drawing to files only; matplotlib is needed for drawing alone."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("visualize.py draws with matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    return plt


def save(fig, path, dpi):
    """Write atomically (train.write_atomically): a temporary name in the same folder, then
    renamed."""
    try:
        # bbox_inches="tight": the picture holds all its text, whatever room the layout left
        write_atomically(
            path, lambda f: fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight"))
    finally:
        fig.clf()
        pyplot().close(fig)


# text in points (1/72 inch), sizes in inches: at the default dpi, 80, a point is 1.1 px, so the
# smallest text (TICK_PT) is 10 px high and a SCREEN_INCHES wide picture 1,520 px wide, shown
# whole at 100% on a laptop's screen
TICK_PT, LABEL_PT = 9, 10
# the widest a picture grows: its panels shrink, then a layer's heads take more rows
SCREEN_INCHES = 19.0
MARGIN_INCHES = 1.2  # the query labels left of the first column of panels
P_OMNI_INCHES = 4.5  # the widest a P_omni panel grows
SMALLEST = 0.55  # the scale down to which a layer's panels shrink to keep its heads in one row
# the colour scale's lowest weight; a spread-out row of T keys holds weights near 1/T
WEIGHT_FLOOR = 1e-3


def panel_inches(T):
    """The height of an attention panel of T queries: room for its token labels (at most 12,
    see draw_map), and a few rows of panels on a screen."""
    return min(max(0.3 * T, 1.5), 2.2)


def head_rows(n_heads, panel_widths, gaps):
    """(the row of each head, the scale of the panels) for a layer's heads, each a group of
    panels panel_widths inches wide with gaps inches between them: one row, its panels shrunk
    to fit SCREEN_INCHES (down to SMALLEST); else the fewest rows that fit, filled alike
    (4 heads: 2 + 2, never 3 + 1)."""
    room = SCREEN_INCHES - MARGIN_INCHES
    # the heads a row holds at the smallest scale
    fit = max(1, int(room // (SMALLEST * sum(panel_widths) + gaps)))
    rows = -(-n_heads // fit)
    per_row = -(-n_heads // rows)
    scale = min(1.0, (room / per_row - gaps) / sum(panel_widths))
    return [h * rows // n_heads for h in range(n_heads)], scale


def draw_map(ax, P, title, labels, future_dim=None, cell_inches=(0.3, 0.3), left=True, bottom=True):
    """One attention map P (T, K), queries down and keys across, on a log scale from WEIGHT_FLOOR
    to 1 so that small weights show: the causal part j <= i in blue and, with future_dim, the
    band i < j <= i + future_dim in orange. A cell is cell_inches (high, wide). Token labels on
    the queries (left) and keys (bottom) of a short prompt's outer panels."""
    from matplotlib.colors import LogNorm
    norm = LogNorm(vmin=WEIGHT_FLOOR, vmax=1.0)
    P = np.maximum(P, WEIGHT_FLOOR)  # a weight below the scale (0 included) takes its lowest colour
    T = len(labels)
    i, j = np.arange(T)[:, None], np.arange(P.shape[1])[None, :]
    image = dict(norm=norm, interpolation="nearest", aspect=cell_inches[0] / cell_inches[1])
    images = [ax.imshow(np.ma.masked_where(j > i, P), cmap="Blues", **image)]
    if future_dim:
        band = (j > i) & (j <= i + future_dim)
        images.append(ax.imshow(np.ma.masked_where(~band, P), cmap="Oranges", **image))
        if P.shape[1] > T:  # key positions past the prompt on the right
            ax.axvline(T - 0.5, color="gray", lw=0.6, ls="--")
    ax.set_anchor("W")  # a causal layer's map under P_omni's: the same keys at the same place
    ax.set_title(title, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT, labelleft=left, labelbottom=bottom)
    if left:
        ax.set_ylabel("query i", fontsize=LABEL_PT)
    if bottom:
        ax.set_xlabel("key j", fontsize=LABEL_PT)
    # a short prompt's tokens label the axes (at most 12, none closer than a line of text);
    # a long prompt keeps the positions
    if T <= 64:
        for set_ticks, inches, rotation in ((ax.set_yticks, cell_inches[0], 0),  # queries
                                            (ax.set_xticks, cell_inches[1], 90)):  # keys
            step = max(-(-T // 12), math.ceil(1.4 * TICK_PT / 72 / inches))
            set_ticks(range(0, T, step), labels[::step], rotation=rotation)
    return images


def draw_attention(path, title, maps, targets, layers, heads, labels, future_dim, dpi):
    """One group of panels per (layer, head): its map, or with future attention (future_dim
    set) P_omni drawn as future_square and beside it its target P*, on the same colours. Each
    panel is as wide as its keys: P_omni's run past the prompt into the future band, P*'s and
    the causal maps' stop at the prompt. The heads of a layer share a row as wide as a laptop's
    screen, or rows filled alike (head_rows); each layer starts a new row."""
    plt = pyplot()
    T = len(labels)
    groups = []  # per layer, per head: [(title, (T, K) map or None, future_dim of its band)]
    for layer in layers:
        groups.append([])
        for head in heads:
            name = f"layer {layer} head {head}"
            if future_dim is None:
                group = [(name, maps[layer][0, head], None)]
            elif targets[layer] is None:  # a causal layer of the future-attention model
                group = [(f"{name} (causal)", maps[layer][0, head], None), ("", None, None)]
            else:
                group = [(f"{name}: P_omni", maps[layer][0, head], future_dim),
                         ("P* (its target)", targets[layer][0, head], future_dim)]
            groups[-1].append(group)
    # the keys of each panel of a group: the most over the layers (P_omni's, where there is one)
    keys = [max(group[k][1].shape[-1] for row in groups for group in row if group[k][1] is not None)
            for k in range(len(groups[0][0]))]
    gaps = 0.35 * len(keys)  # between the panels, for their frames and titles
    inch_y = panel_inches(T) / T  # per query, and per key where the keys fit: square cells
    widths = [inch_y * n for n in keys]
    # P_omni's future keys past a short prompt: narrower cells, so that groups share a row
    if len(keys) == 2:
        widths[0] = min(widths[0], P_OMNI_INCHES)
    row_of, scale = head_rows(len(heads), widths, gaps)
    inch_y, widths = scale * inch_y, [scale * width for width in widths]
    group_inches = sum(widths) + gaps
    # the place of each head in its row
    column_of = [h - row_of.index(row_of[h]) for h in range(len(heads))]
    rows_per_layer, per_row = row_of[-1] + 1, max(column_of) + 1
    n_rows = len(layers) * rows_per_layer
    longest = max(len(label) for label in labels) if T <= 64 else 4
    fig_width = MARGIN_INCHES + per_row * group_inches
    # the rows of panels, and below them room for the titles, the labels and the colour bars
    fig_height = n_rows * (inch_y * T + 0.5) + 0.1 * longest + 1.0 + 0.8 * (1 + bool(future_dim))
    fig, axes = plt.subplots(n_rows, per_row * len(keys), squeeze=False, layout="constrained",
                             gridspec_kw=dict(width_ratios=widths * per_row),
                             figsize=(fig_width, fig_height))
    for ax in axes.flat:
        ax.axis("off")  # until a panel is drawn in it
    images = {}  # one image of each colour, for the colour bars
    for layer_index, row_groups in enumerate(groups):
        for h, group in enumerate(row_groups):
            row, column = layer_index * rows_per_layer + row_of[h], column_of[h]
            # the key labels go under the last panel of each column: the last layer's, where
            # no head of that layer sits below it
            head_below = (row_of[h] + 1, column) in zip(row_of, column_of)
            last_of_column = layer_index == len(groups) - 1 and not head_below
            for k, (name, P, band) in enumerate(group):
                if P is None:
                    continue
                ax = axes[row, column * len(keys) + k]
                ax.axis("on")
                drawn = draw_map(ax, P.float().numpy(), name, labels, band,
                                 cell_inches=(inch_y, widths[k] / keys[k]),
                                 left=column == 0 and k == 0, bottom=last_of_column)
                images.update(zip(("causal", "future"), drawn))
    bar = dict(ax=axes, location="bottom", shrink=min(0.8, 6 / fig.get_figwidth()), aspect=40,
               pad=0.02, panchor=False)
    causal_bar = fig.colorbar(images["causal"], **bar)
    causal_bar.set_label("attention weight (log scale), keys j <= i", fontsize=LABEL_PT)
    if "future" in images:
        future_bar = fig.colorbar(images["future"], **bar)
        future_bar.set_label("future keys, i < j <= i + future_dim", fontsize=LABEL_PT)
    fig.suptitle(title, fontsize=LABEL_PT + 2)
    save(fig, path, dpi)


def draw_embeddings(path, stats, block_sizes, dpi):
    """Runs side by side: the cosine-similarity matrix of wpe, then the distributions of
    ||wte[v]|| and ||wpe[p]||, then ||wpe[p]|| over the positions, sharing scales and axes."""
    plt = pyplot()
    names = list(stats)
    fig, axes = plt.subplots(3, len(names), squeeze=False, figsize=(4.6 * len(names), 12),
                             layout="constrained", sharex="row", sharey="row",
                             gridspec_kw=dict(height_ratios=[1.3, 1, 1]))
    every_norm = torch.cat([torch.cat([s["token_norms"], s["pos_norms"]]) for s in stats.values()])
    bins = np.linspace(0.0, every_norm.max().item() * 1.02, 60)  # the same bins for every run
    for col, name in enumerate(names):
        s, C = stats[name], block_sizes[name]
        ax = axes[0, col]
        im = ax.imshow(s["pos_cosine"].float().numpy(), cmap="RdBu_r", vmin=-1, vmax=1,
                       interpolation="nearest")
        title = f"{name}\ncos(wpe[p], wpe[q])"
        if s["pos_cosine"].size(0) > C:  # row C, the next position of the last token
            ax.axhline(C - 0.5, color="k", lw=0.5), ax.axvline(C - 0.5, color="k", lw=0.5)
            title += f", p = {C}: the next position"
        ax.set(title=title, xlabel="position q", ylabel="position p")
        ax = axes[1, col]
        for norms, label in ((s["token_norms"], f"||wte[v]||, {len(s['token_norms']):,} tokens"),
                             (s["pos_norms"], f"||wpe[p]||, {len(s['pos_norms'])} positions")):
            ax.hist(norms.float().numpy(), bins=bins, density=True, alpha=0.6, label=label)
        ax.set(xlabel="norm", ylabel="density"), ax.legend(fontsize=TICK_PT)
        ax = axes[2, col]
        ax.plot(s["pos_norms"].float().numpy(), label="||wpe[p]||")
        ax.axhline(s["token_norms"].median().item(), color="C1", ls="--", label="median ||wte[v]||")
        ax.set(xlabel="position p", ylabel="norm"), ax.legend(fontsize=TICK_PT)
    fig.colorbar(im, ax=axes[0, :].tolist(), shrink=0.8, label="cosine similarity")
    save(fig, path, dpi)


def draw_embedding_loss(path, title, sides, labels, dpi):
    """Per position: the MSE between the two sides of the embedding loss, and their cosine
    similarity."""
    plt = pyplot()
    # a quarter inch per token label, within a screen; a long prompt's positions need less
    fig_width = min(max(6, 0.25 * len(labels)), 16)
    fig, (ax_mse, ax_cos) = plt.subplots(2, 1, sharex=True, figsize=(fig_width, 5.5),
                                         layout="constrained")
    mse, cosine = sides["mse"][0].float().numpy(), sides["cosine"][0].float().numpy()
    ax_mse.plot(mse, marker=".")
    ax_mse.set(ylabel="MSE", title=f"{title}\nmean MSE over the prompt {mse.mean():.3g}")
    ax_cos.plot(cosine, marker=".", color="C1")
    ax_cos.set(ylabel="cosine similarity", xlabel="position i")
    if len(labels) <= 64:
        ax_cos.set_xticks(range(len(labels)), labels, fontsize=TICK_PT, rotation=90)
    save(fig, path, dpi)


# --------------------------------------------------------------------------------------
# the script


def spread(n, count):
    """At most count indices spread evenly over 0..n-1, first and last included."""
    return sorted(set(np.linspace(0, n - 1, min(n, count)).round().astype(int).tolist()))


def selection(config, model, name):
    """(layers, {kind: heads}) to draw; ConfigError naming the valid range for a bad pick."""
    modules = attention_modules(model)
    n_layer = len(next(iter(modules.values())))
    n_heads = {kind: layer_modules[0].n_head for kind, layer_modules in modules.items()}
    layer, head = config["layer"], config["head"]
    for key, value, count in (("layer", layer, n_layer), ("head", head, max(n_heads.values()))):
        is_index = isinstance(value, int) and not isinstance(value, bool)  # True is an int too
        if value is not None and not (is_index and 0 <= value < count):
            raise ConfigError(f"{key} must be in 0..{count - 1} ({name} has {count} {key}s), "
                              f"got {value!r}")
    layers = [layer] if layer is not None else spread(n_layer, config["grid"])
    heads = {kind: ([head] if head < n else []) if head is not None else spread(n, config["grid"])
             for kind, n in n_heads.items()}
    return layers, heads


def token_ids(config):
    enc = gpt2_tokenizer()
    ids = enc.encode(read_prompt(config["start"]), allowed_special={"<|endoftext|>"})
    if not ids:
        raise ConfigError("the prompt is empty: give --start some text")
    labels = [repr(enc.decode([t]))[1:-1] for t in ids]  # "\n" stays visible
    return ids, labels


def visualize(config, out_dirs):
    """Writes the PNG files for the runs in out_dirs, printing a line on each."""
    for key in ("grid", "dpi"):
        if config[key] < 1:
            raise ConfigError(f"{key} must be at least 1, got {config[key]}")
    check_which(config["checkpoint"])
    pyplot()  # before the slow part: without matplotlib, nothing to do
    ids, labels = token_ids(config)
    save_dir = config["save_dir"] or out_dirs[0]
    runs = {}  # run name -> (model, layers, heads)
    for out_dir in out_dirs:
        name = os.path.basename(os.path.normpath(out_dir)) or "run"
        name = name if name not in runs else f"{name}_{len(runs) + 1}"  # two runs named alike
        model = model_from_checkpoint(load_checkpoint(model_path(out_dir, config["checkpoint"])))
        if max(ids) >= model.config.vocab_size:
            raise ConfigError(f"the prompt has GPT-2 tokens beyond {name}'s vocab_size "
                              f"({model.config.vocab_size})")
        runs[name] = (model.eval(), *selection(config, model, name))
    try:
        os.makedirs(save_dir, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create save_dir {save_dir} ({e.strerror}): "
                        "choose another --save_dir") from None

    for name, (model, layers, heads) in runs.items():
        C = model.config.block_size
        if len(ids) > C:
            print(f"note: the prompt has {len(ids)} tokens, more than {name}'s block_size: "
                  f"drawing its first {C}")
        idx = torch.tensor(ids[:C], dtype=torch.long)[None, :]  # (1, T)
        T = idx.size(1)
        maps = attention_maps(model, idx)
        future_dim = getattr(model.config, "future_dim", None)
        for kind in heads:
            path = os.path.join(save_dir, f"attention_{kind}_{name}.png")
            if not heads[kind]:
                print(f"note: {kind} attention of {name} has no head {config['head']}: no {path}")
                continue
            draw_attention(path, f"{name}: {kind} attention on a {T}-token prompt",
                           maps[kind], maps.get("target"), layers, heads[kind], labels[:T],
                           future_dim if kind == "future" else None, config["dpi"])
            print(f"wrote {path}: {kind} attention weights of layers {layers} "
                  f"(of {len(maps[kind])}) x heads {heads[kind]} (of {maps[kind][0].size(1)}); "
                  "--layer=N --head=N pick others")
        sides = embedding_loss_sides(model, idx)
        if sides is None:
            print(f"note: {name} has no embedding loss: no embedding_loss_{name}.png")
        else:
            path = os.path.join(save_dir, f"embedding_loss_{name}.png")
            encoder_side = "LN_b(encoder_out)" if model.config.ln_encoder_out else "encoder_out"
            sides_named = f"E_avg and {encoder_side}"
            title = (f"{name}: {sides_named} per position (embedding loss "
                     f"{model.config.embedding_loss_type})")
            draw_embedding_loss(path, title, sides, labels[:T], config["dpi"])
            print(f"wrote {path}: per position, MSE and cosine similarity of {sides_named} "
                  f"of {name}")

    path = os.path.join(save_dir, f"embeddings_{'_vs_'.join(runs)}.png")
    stats = {name: embedding_stats(model) for name, (model, _, _) in runs.items()}
    block_sizes = {name: model.config.block_size for name, (model, _, _) in runs.items()}
    draw_embeddings(path, stats, block_sizes, config["dpi"])
    print(f"wrote {path}: position-embedding cosine similarity and token/position norms of "
          f"{', '.join(runs)}")


@configurator.script
def main(argv):
    """Command-line entry: returns the exit status (2 for a bad setting, 1 for other errors)."""
    if configurator.wants_help(argv):
        print(configurator.usage(__doc__, DEFAULTS))
        return 0
    config = read_settings(DEFAULTS, argv)
    # configurator keeps the last of repeated flags; every --out_dir is a run to draw
    out_dirs = [arg.partition("=")[2] for arg in configurator.normalize(argv)
                if arg.startswith("--out_dir=")]
    out_dirs = out_dirs or [config["out_dir"]]
    visualize(config, out_dirs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
