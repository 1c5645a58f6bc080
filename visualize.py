"""
Draws what a model that train.py trained has learned, from each run's best.pt (or ckpt.pt with
--checkpoint=latest); docs/pictures.md explains the pictures.

    python visualize.py out-future50_mse --start="The history of the city"
    python visualize.py out-encdec_possub out-encdec_plain --layer=3 --head=0 --save_dir=pictures
"""

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import configurator
from configurator import ConfigError, UserError
from sample import check_which, gpt2_tokenizer, model_path, read_prompt
from train import load_checkpoint, model_from_checkpoint, write_atomically

DEFAULTS = dict(
    checkpoint="best",  # 'best' (best.pt) or 'latest' (ckpt.pt)
    start="The history of the city begins in the Middle Ages.",  # or FILE:path
    layer=None,  # one layer to draw, 0-indexed (per stack for encdec); None: --grid of them
    head=None,  # one head to draw, 0-indexed; None: --grid of them
    grid=6,  # at most this many layers and heads, spread evenly
    save_dir="",  # where the PNG files go; "": the first run's folder
    dpi=80,  # at 80, text is 11 pixels high and a picture at most 1,520 x 960
)
SCREEN_INCHES = (19.0, 12.0)  # the largest picture, whole on a laptop's screen
PANEL_INCHES = 2.0  # an attention map's height where there is room


# ----------------------------------------
# the numbers


def causal_weights(q, k, n_head):
    """softmax(q k^T / sqrt(hs)) over keys j <= i: q, k (B, T, d) -> (B, nh, T, T)."""
    B, T, d = q.size()
    q, k = (t.view(B, T, n_head, d // n_head).transpose(1, 2) for t in (q, k))  # (B, nh, T, hs)
    A = (q @ k.transpose(-2, -1)) / (d // n_head) ** 0.5  # (B, nh, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # True = may attend
    return F.softmax(A.masked_fill(~causal, float("-inf")), dim=-1)


def future_square(P_omni, T):
    """P_omni (B, H, T, T+F) as the write-up draws it, (B, H, T, 1+F): column j is key position j,
    so future column m moves to m+1."""
    P_unmasked, P_future = P_omni.split([T, P_omni.size(-1) - T], dim=-1)
    square = F.pad(P_future, (1, 0))  # (B, H, T, 1+F)
    square[..., :T] += P_unmasked
    return square


def forward_seen(model, idx, modules):
    """{module: (its forward's arguments, its output)}, from one forward pass in eval mode."""
    seen = {}

    def keep(module, args, out):
        seen[module] = (args, out)

    hooks = [m.register_forward_hook(keep) for m in modules]
    was_training = model.training
    try:
        model.eval()
        model(idx)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return seen


@torch.no_grad()
def attention_maps(model, idx):
    """{kind: [per layer, (B, H, T, K)]}, the attention weights for the tokens idx (B, T); future
    attention: future_square of P_omni, and under 'target' its P* (B, H, T, T)."""
    tr = model.transformer
    if "h" in tr:
        kind = "future" if hasattr(model.config, "future_dim") else "self"
        modules = {kind: [block.attn for block in tr.h]}
    else:
        modules = dict(encoder=[b.attn for b in tr.encoder], decoder=[b.attn for b in tr.decoder],
                       cross=[b.cross_attn for b in tr.decoder])
    seen = forward_seen(model, idx, [m for stack in modules.values() for m in stack])
    maps = {kind: [] for kind in modules}
    for kind, layer_modules in modules.items():
        for m in layer_modules:
            args, _ = seen[m]
            if hasattr(m, "attention_weights"):  # future attention's own P_omni and P*
                P_omni, P_star = m.attention_weights(args[0])
                maps[kind].append(future_square(P_omni, idx.size(1)))
                maps.setdefault("target", []).append(P_star)
                continue
            if hasattr(m, "c_q"):  # cross-attention: keys from the encoder
                encoder_x, decoder_x = args
                q, k = m.c_q(decoder_x), m.c_kv(encoder_x)[..., :m.n_embd]  # (B, T, d) each
            else:
                q, k, _ = m.c_attn(args[0]).split(m.n_embd, dim=2)  # (B, T, d) each
            maps[kind].append(causal_weights(q, k, m.n_head))
            if kind == "future":
                maps.setdefault("target", []).append(None)  # a causal layer has no target
    return maps


@torch.no_grad()
def embedding_stats(model):
    """The cosine similarity of every two position embeddings, and the norms of wpe and wte."""
    wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
    unit = F.normalize(wpe, dim=-1)  # (P, d)
    return dict(pos_cosine=unit @ unit.T,  # (P, d) @ (d, P) -> (P, P)
                pos_norms=torch.linalg.norm(wpe, dim=-1),
                token_norms=torch.linalg.norm(wte, dim=-1))


@torch.no_grad()
def embedding_loss_sides(model, idx):
    """The embedding loss's two sides E_avg, encoder_out (B, T, d) for the tokens idx (B, T), and
    their mse and cosine (B, T); None for a model without it."""
    cfg, tr = model.config, model.transformer
    if getattr(cfg, "embedding_loss_type", "none") == "none":
        return None
    seen = forward_seen(model, idx, [tr.encoder[0], tr.encoder[-1]])
    first_block_args, _ = seen[tr.encoder[0]]
    E = first_block_args[0]  # the encoder's input
    _, encoder_out = seen[tr.encoder[-1]]
    if cfg.ln_encoder_out:
        encoder_out = tr.ln_b(encoder_out)  # LN_b
    if cfg.embedding_ln == "init":
        E = tr.ln_a(E)  # LN_a before the running mean
    # E_avg_i is the mean of E_0..E_i, in float64 like the model
    counts = torch.arange(1, E.size(1) + 1, device=E.device, dtype=torch.float64)  # (T,)
    E_avg = (E.double().cumsum(dim=1) / counts[:, None]).to(E.dtype)  # (B, T, d)
    if cfg.embedding_ln == "avg":
        E_avg = tr.ln_a(E_avg)  # LN_a after it
    return dict(E_avg=E_avg, encoder_out=encoder_out, mse=((E_avg - encoder_out) ** 2).mean(dim=-1),
                cosine=F.cosine_similarity(E_avg, encoder_out, dim=-1))


# ----------------------------------------
# the drawings


def pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("visualize.py draws with matplotlib: pip install matplotlib") from None
    return plt


def save(fig, path, dpi):
    try:
        write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
    finally:
        pyplot().close(fig)


def attention_figsize(n_layers, n_heads, panel_widths):
    """(width, height) in inches, shrunk if need be to fit the screen."""
    width = 1.5 + n_heads * sum(panel_widths) * PANEL_INCHES
    height = 2.0 + n_layers * (PANEL_INCHES + 0.4)
    scale = min(1.0, SCREEN_INCHES[0] / width, SCREEN_INCHES[1] / height)
    return scale * width, scale * height


def draw_attention(path, title, maps, targets, layers, heads, labels, dpi):
    """A row per layer and a column per head: its map or, given targets, P_omni beside P*. The
    weights are on a log scale, so that small ones show."""
    T = len(labels)
    keys = max(maps[layer].size(-1) for layer in layers)  # P_omni's run past the prompt
    widths = [min(keys / T, 3.0), 1.0] if targets else [1.0]
    size = attention_figsize(len(layers), len(heads), widths)
    fig, axes = pyplot().subplots(len(layers), len(heads) * len(widths), squeeze=False,
                                  figsize=size, layout="constrained",
                                  gridspec_kw=dict(width_ratios=widths * len(heads)))

    def token(position, _):  # a tick's label; none past the prompt, on P_omni's keys
        return labels[int(position)] if 0 <= position < T else ""

    for row, layer in enumerate(layers):
        panels = [maps[layer], targets[layer]] if targets else [maps[layer]]
        for column, head in enumerate(heads):
            for k, P in enumerate(panels):
                ax = axes[row, column * len(panels) + k]
                if P is None:  # a causal layer's P*
                    ax.axis("off")
                    continue
                # a log scale, where a row spread over T keys (1/T each) shows
                P = P[0, head].clamp(min=1e-3).numpy()
                image = ax.imshow(P, cmap="Blues", norm="log", vmin=1e-3, vmax=1.0, aspect="auto",
                                  interpolation="nearest")
                ax.plot([-0.5, T - 0.5], [-0.5, T - 0.5], color="C1", lw=0.8)  # the diagonal
                # as many ticks as have room for their labels, as matplotlib counts it
                ax.locator_params(integer=True)
                ax.xaxis.set_major_formatter(token)
                ax.yaxis.set_major_formatter(token)
                ax.tick_params(axis="x", labelrotation=90)
                if row == 0:  # the heads name the columns
                    ax.set_title(f"head {head}" if k == 0 else "P*")
                # across, so that the label of a low row overlaps no other
                ax.set_ylabel(f"layer {layer}", rotation=0, ha="right", va="center")
                ax.set_xlabel("key j")
                ax.label_outer()
    fig.colorbar(image, ax=axes, location="bottom", shrink=0.5, aspect=40,
                 label="attention weight (log scale)")
    fig.supylabel("query i")
    fig.suptitle(f"{title}: each head's P_omni, then its target P*" if targets else title)
    save(fig, path, dpi)


def draw_embeddings(path, stats, dpi):
    """Runs side by side, on shared scales."""
    width = min(1.0 + 4.6 * len(stats), SCREEN_INCHES[0])
    fig, axes = pyplot().subplots(2, len(stats), squeeze=False, figsize=(width, 8.5),
                                  layout="constrained", sharex="row", sharey="row")
    for (name, s), (ax_cosine, ax_norms) in zip(stats.items(), axes.T):
        image = ax_cosine.imshow(s["pos_cosine"].numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
        ax_cosine.set(title=name, xlabel="position q", ylabel="position p")
        ax_norms.plot(s["pos_norms"].numpy(), label="||wpe[p]||")
        ax_norms.axhline(s["token_norms"].median().item(), color="C1", ls="--",
                         label="median ||wte[v]||")
        ax_norms.set(xlabel="position p", ylabel="norm")
        ax_norms.legend()
    fig.colorbar(image, ax=axes[0], shrink=0.8, label="cos(wpe[p], wpe[q])")
    save(fig, path, dpi)


# ----------------------------------------
# the script


def pick(config, key, counts, name):
    """{kind of attention: the layers or heads to draw}, counts[kind] being how many it has:
    [--key] for each kind that has it, or at most --grid of the kind's own, spread evenly."""
    most = max(counts.values())
    if config[key] is not None and config[key] not in range(most):
        raise ConfigError(f"{key} must be in 0..{most - 1} ({name} has {most} {key}s), "
                          f"got {config[key]!r}")
    picked = {}
    for kind, count in counts.items():
        if config[key] is None:
            # at most count points over count - 1: at least 1 apart, so distinct
            spread = np.linspace(0, count - 1, min(count, config["grid"])).round()
            picked[kind] = spread.astype(int).tolist()
        elif config[key] < count:
            picked[kind] = [config[key]]
    return picked


def draw_run(name, model, ids, labels, config, save_dir):
    if max(ids) >= model.config.vocab_size:
        raise ConfigError(f"the prompt has tokens beyond {name}'s vocab_size")
    C = model.config.block_size
    if len(ids) > C:
        print(f"note: {name} reads the first {C} of the prompt's {len(ids)} tokens")
    idx = torch.tensor(ids[:C])[None, :]  # (1, T)
    labels = labels[:C]
    maps = attention_maps(model, idx)
    targets = maps.pop("target", None)
    layers = pick(config, "layer", {kind: len(m) for kind, m in maps.items()}, name)
    heads = pick(config, "head", {kind: m[0].size(1) for kind, m in maps.items()}, name)
    for kind, layer_maps in maps.items():
        if kind not in layers or kind not in heads:
            continue  # a --layer or --head that only other kinds have
        path = os.path.join(save_dir, f"attention_{kind}_{name}.png")
        draw_attention(path, f"{name}: {kind} attention", layer_maps, targets, layers[kind],
                       heads[kind], labels, config["dpi"])
        print(f"wrote {path}: layers {layers[kind]}, heads {heads[kind]}")
    sides = embedding_loss_sides(model, idx)
    if sides is None:
        return
    width = min(max(6, 0.25 * len(labels)), SCREEN_INCHES[0])  # a quarter inch per token
    fig, axes = pyplot().subplots(2, 1, sharex=True, figsize=(width, 5.5), layout="constrained")
    for ax, key in zip(axes, ("mse", "cosine")):
        ax.plot(sides[key][0].numpy(), marker=".")
        ax.set_ylabel(f"{key} of E_avg and encoder_out")
    axes[0].set_title(f"{name}: the embedding loss's two sides per position")
    if len(labels) <= 64:
        axes[1].set_xticks(range(len(labels)), labels, rotation=90)
    path = os.path.join(save_dir, f"embedding_loss_{name}.png")
    save(fig, path, config["dpi"])
    print(f"wrote {path}")


@configurator.script
def main(argv):
    out_dirs, rest = configurator.take_runs(argv)
    config = configurator.settings(rest, DEFAULTS)
    if configurator.wants_help(argv):
        print(configurator.usage(__doc__, config))
        return 0
    if not out_dirs:
        raise ConfigError("no run to draw: give its folder, as in python visualize.py out-baseline")
    if config["grid"] < 1 or config["dpi"] < 1:
        raise ConfigError("grid and dpi must be at least 1")
    check_which(config["checkpoint"])
    encoder = gpt2_tokenizer()
    ids = encoder.encode(read_prompt(config["start"]), allowed_special={"<|endoftext|>"})
    if not ids:
        raise ConfigError("the prompt is empty: give --start some text")
    labels = [repr(encoder.decode([t]))[1:-1] for t in ids]  # "\n" stays visible
    save_dir = config["save_dir"] or out_dirs[0]
    os.makedirs(save_dir, exist_ok=True)
    stats = {}
    for out_dir in out_dirs:
        name = os.path.basename(os.path.normpath(out_dir))
        if name in stats:  # two runs named alike
            name = f"{name}_{len(stats) + 1}"
        model = model_from_checkpoint(load_checkpoint(model_path(out_dir, config["checkpoint"])))
        draw_run(name, model.eval(), ids, labels, config, save_dir)
        stats[name] = embedding_stats(model)
    path = os.path.join(save_dir, f"embeddings_{'_vs_'.join(stats)}.png")
    draw_embeddings(path, stats, config["dpi"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
