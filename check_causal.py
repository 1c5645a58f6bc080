"""
Checks that a model cannot see the future: the logits at position i must depend on the
tokens 0..i only, in training and in evaluation, at any length. Any config,
any model type, any options: the model is built as train.py builds it.

    python check_causal.py config/future50_mse.py                   # seconds, on a CPU
    python check_causal.py config/encdec_possub.py --sub_pos=yes_ln # any --key=value of train.py
    python check_causal.py config/baseline.py --full_size=True      # at the config's own sizes
    python check_causal.py config/future50_mse.py --probe=True      # and the reversal probe

The exact checks run in float64 on a CPU with random weights, every parameter drawn afresh
at a scale where activations stay near 1 (so no zero-initialized bias or tiny weight can
hide a path): for each position p, change the token at p and require the logits at every
position before p to stay exactly as they were; and for each position i, require the
gradient of the logits at i with respect to the token embeddings after i to be zero.
Both in eval mode and in train mode with targets (the training code path: future
attention's target, the encoder-decoder's embedding loss), at T = block_size and at a
shorter T. To run in seconds the model is shrunk (narrower, 2 layers, a short context,
a small vocabulary; every option kept; the user's flags win); --full_size=True checks it
as configured, at 16 positions spread over T (--positions=0 for every one).

--probe=True also trains a small model of the same type and options on the reversal task
of the omniverse notebook ("How To Fine-Tune Decoder-Only Models For Sequence
Classification With Cross-Attention?"): given n random digits, position t must predict
digit n-1-t. A causal model learns the positions whose digit it has already seen (the
second half) and stays at chance, 1 in 10, on the first half: about 55% in all. A model
that sees the future reaches near 100%. The probe takes a minute. Exit status: 0 causal, 1 a
leak (or a probe that learned nothing), 2 a bad setting.

Any PyTorch language model, not only ours: --model=MODULE:FACTORY, where MODULE is a .py
file or a dotted import path (from the current directory) and FACTORY a function of no
arguments that returns an nn.Module mapping token ids (B, T) to logits (B, T, vocab): a
tensor, a tuple or list that starts with one, or an object with .logits (HF's ModelOutput).

    python check_causal.py --model=my_models.py:tiny_gpt2              # HF, x-transformers, yours
    python check_causal.py --model=my_models.py:gpt2,my_models.py:bert # several, in one process
    python check_causal.py --model=mypackage.models:build --block_size=64 --probe

The model is checked as the factory builds it, at its own sizes (16 positions spread over T;
--positions=0 for every one), with the same two exact checks in eval and train mode and the
same probe (on a fresh model from the factory, at its own init). The length T comes from
--block_size, else from the model's config (n_positions, max_position_embeddings, block_size or
max_seq_len, in its config or on itself), else from the model itself (a square mask buffer, a
position table: an nn.Embedding that is not the token one), else it is 64; where the forward
fails at T, shorter lengths are tried and the longest that works is checked. The first line of
each model's report says which. The vocabulary comes from --vocab_size, config.vocab_size, else
the logits' size. The token embeddings, for the gradient check, are the model's
get_input_embeddings() (HF's way), else its one nn.Embedding with a row per token, else the
module --embedding=ATTR.PATH names. In train mode every forward starts from the same random
state, so dropout draws the same masks and the checks stay exact. Exit status 2 also means a
model the tool cannot read (one that fails at every length, say); the message says what it
expected.
"""

import contextlib
import dataclasses
import importlib
import importlib.util
import math
import os
import sys
import time
import traceback

import torch
from torch.nn import functional as F

import configurator
import train
from configurator import ConfigError, UserError

CHECK_DEFAULTS = dict(
    full_size=False,  # check at the config's own sizes instead of the shrunk ones (slow)
    batch=2,  # sequences per forward pass in the exact checks
    # positions changed and differentiated per check, spread over T; 0 = all (16 with full_size)
    positions=0,
    probe=False,  # also train the reversal probe
    probe_length=16,  # n, digits per probe sequence: the probe's block_size (the notebook's: 16)
    probe_vocab=10,  # digits 0..probe_vocab-1 (the notebook's: 10)
    probe_seconds=60.0,  # how long the probe trains
    probe_steps=0,  # train this many steps instead, when > 0
    probe_batch=128,  # sequences per probe step (the notebook's: 128)
    probe_lr=4e-3,  # probe learning rate, AdamW without weight decay (the notebook's: Adam, 4e-3)
)
# with --model=MODULE:FACTORY: the model comes from the factory, at its own sizes
MODEL_DEFAULTS = dict(
    # MODULE:FACTORY, e.g. my_models.py:tiny_gpt2 or mypackage.models:build; a comma list checks
    # each
    model="",
    # token ids drawn from 0..vocab_size-1; 0 = the model's config.vocab_size, else its logits' size
    vocab_size=0,
    # T of the checks (and a shorter T); 0 = found: the model's config (n_positions, ...), else its
    # mask buffer or position table, else 64; a T where the forward fails backs off to a shorter one
    block_size=0,
    # ATTR.PATH of the module whose output is the token embeddings, when the tool cannot tell
    embedding="",
    keep_weights=False,  # check the model's own weights, not weights drawn afresh
    seed=1337,  # the random weights, tokens and dropout masks
    # the checker's keys but full_size: a model of a factory is always checked at its own size
    **{key: value for key, value in CHECK_DEFAULTS.items() if key != "full_size"},
)
# as --full_size: a forward and a backward per position at the model's own size
MODEL_DEFAULTS["positions"] = 16
# the fields in which models say their length T
LENGTH_NAMES = ("n_positions", "max_position_embeddings", "block_size", "max_seq_len")
DEFAULT_LENGTH = 64  # T of a model that gives none (ALiBi, rotary, a convolution, a mixer)
LENGTH_STEPS = 4  # lengths tried one by one below one the forward fails at, before halving

CHECK_WIDTH = 48  # n_embd of the shrunk model: the nearest multiple of the head counts
CHECK_BLOCK_SIZE = 24
CHECK_VOCAB = 64
CHECK_LAYERS = 2  # per stack; future attention keeps its baseline layers before and after
TOLERANCE = 1e-9  # float64: a causal model changes nothing; rounding would be ~1e-15
ONE_THREAD_BELOW = 1_000_000  # parameters of a --model below which one thread runs the checks best
PROBE_EVAL = 1024  # fresh sequences the probe's accuracy is measured on
PROBE_Z = 6.0  # standard errors above chance that count as "above chance"


# --------------------------------------------------------------------------------------
# settings


def parse_args(argv):
    """(checker settings, the config file's train config, the same with the flags applied,
    the keys the flags set) from `CONFIG [--key=value ...]`."""
    argv = configurator.normalize(argv)
    paths = [a for a in argv if not a.startswith("--")]
    if len(paths) != 1:
        raise ConfigError("give one config file, e.g. "
                          "`python check_causal.py config/future50_mse.py`")
    flags = [a for a in argv if a.startswith("--")]
    _, overrides = configurator.parse(flags)
    own = {k: v for k, v in overrides.items() if k in CHECK_DEFAULTS}
    check = configurator.merge(CHECK_DEFAULTS, {}, own)
    check_least(check)
    # the config file alone (with the flags' model_type): what "original → checked" reports
    original = train.get_config(paths + [f for f in flags if f.startswith("--model_type=")])
    # The flags go over it without train.get_config's check of the model: plan() checks the
    # model that is built, in which a --block_size=40 shrinks the file's future_dim=50 with it.
    config = configurator.merge(original, {}, overrides, script_keys=CHECK_DEFAULTS)
    return check, original, config, set(overrides)


def check_least(options):
    for key, least in (("batch", 1), ("probe_length", 2), ("probe_vocab", 2), ("probe_batch", 1)):
        if options[key] < least:
            raise ConfigError(f"{key} must be at least {least}, got {options[key]}")


def shrunk_sizes(original, config, fixed, block_size, vocab_size):
    """The settings of a small model with the same options: block_size and vocab_size as
    given, n_embd the multiple of the head counts nearest CHECK_WIDTH, CHECK_LAYERS layers,
    no dropout. future_dim scales with the context (block_size - 1 stays so), and future
    attention keeps one baseline layer before and after its layers where the config has
    some; unequal encoder and decoder stacks stay unequal (the deeper one gets the layers,
    the other fewer, at least 1). `original` is the config file's config, `config` the same
    with the user's flags; keys in `fixed` (the flags') keep the user's value, except
    future_dim and the layer counts and range, which scale like the config's unless
    block_size and n_layer are fixed too: a --future_dim=100 or --end_layer=20 says where in
    the config's 200 positions or 28 layers, so it shrinks with them.
    """
    sizes = {}
    if "block_size" not in fixed:
        fixed = fixed - {"future_dim"}
    if "n_layer" not in fixed:
        fixed = fixed - {"start_layer", "end_layer", "n_layer_encoder", "n_layer_decoder"}

    def pick(key, value):
        sizes[key] = config[key] if key in fixed else value
        return sizes[key]

    model_type = config["model_type"]
    heads = [config["n_head"]]
    if model_type == "encdec":
        heads.append(config["cross_n_head"] or 2 * config["n_head"])
    unit = math.lcm(*heads)
    pick("n_embd", min(config["n_embd"], unit * max(1, round(CHECK_WIDTH / unit))))
    pick("vocab_size", vocab_size)
    pick("dropout", 0.0)
    C0, L0 = original["block_size"], original["n_layer"]
    C = pick("block_size", block_size)
    if model_type == "future_attn":
        if config["future_dim"] is not None:
            # C0 >= 2: GPTConfig checks it
            scaled = round(config["future_dim"] * (C - 1) / (C0 - 1))
            pick("future_dim", min(max(scaled, 1), C - 1))
        start0, end0 = config["start_layer"], config["end_layer"] or L0
        before, after = int(start0 > 1), int(end0 < L0)
        n_future = min(CHECK_LAYERS, end0 - start0 + 1)
        L = pick("n_layer", min(L0, before + n_future + after))
        pick("start_layer", 1 + before)
        pick("end_layer", L - after)
    else:
        L = pick("n_layer", min(L0, CHECK_LAYERS))
        if model_type == "encdec":
            depths = {key: config[key] or config["n_layer"]
                      for key in ("n_layer_encoder", "n_layer_decoder")}
            deepest = max(depths.values())
            for key, depth in depths.items():
                if config[key] is None and (depth == deepest or "n_layer" in fixed):
                    continue  # None is n_layer: the shrunk one (or the user's)
                # the deeper stack (both, when equal) gets L layers, a shallower one fewer, at
                # least 1
                pick(key, L if depth == deepest else max(1, min(L - 1, round(depth * L / deepest))))
    return sizes


def model_args_for(config, sizes):
    """The GPTConfig fields of config with sizes applied, resolved and validated."""
    return train.model_args_of(dict(config, **sizes))


def describe_changes(original, model_args):
    """'key original → checked, ...' for the model settings that differ from the config file's."""
    before = train.model_args_of(original)
    return ", ".join(f"{k} {before[k]} → {v}" for k, v in model_args.items() if before[k] != v)


# --------------------------------------------------------------------------------------
# the exact checks


@dataclasses.dataclass
class Leak:
    """The logits at `position` depend on the token at `later` > position, by `amount`."""
    how: str  # 'perturbation' or 'gradient'
    position: int
    later: int
    amount: float
    setting: str

    def __str__(self):
        if self.how == "perturbation":
            return (f"LEAK: logits at position {self.position} change by {self.amount:.3g} "
                    f"when the token at position {self.later} changes ({self.setting})")
        return (f"LEAK: the gradient of the logits at position {self.position} with respect to "
                f"the token embedding at position {self.later} is {self.amount:.3g}, not 0 "
                f"({self.setting})")


class CheckError(UserError):
    """The check could not see what it must see (a model it does not know how to read)."""

    status = 2


def randomize(model, generator):
    """Every parameter drawn afresh: N(0, 1/fan_in) matrices, N(0, 1) vectors (biases, gains).

    Activations then stay near 1 and scores are not all equal, so every path from a token
    carries a visible signal; a leak is then many orders above float64 rounding.
    """
    with torch.no_grad():
        for p in model.parameters():
            fan_in = p.shape[-1] if p.dim() >= 2 else 1
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) / math.sqrt(fan_in))


def build(model_type, model_args, seed):
    torch.manual_seed(seed)
    model = train.build_model(model_type, model_args).double()
    randomize(model, torch.Generator().manual_seed(seed))
    return model


def logits_of(model, idx, targets):
    """The logits at every position (B, T, vocab) of a forward with targets, in the model's mode.

    Reseeds first, so that a model with dropout draws the same masks in every call."""
    torch.manual_seed(0)
    logits, _, _ = model(idx, targets)
    if not torch.isfinite(logits).all():  # NaN compares as no change: it would pass any check
        raise CheckError("the logits are not all finite, so no change in them can be measured "
                         "(with --model, --keep_weights=True keeps the model's own weights)")
    return logits


def spread(count, first, last):
    """`count` positions evenly spread over first..last, both ends included; all when count is 0."""
    if count <= 0 or count >= last - first + 1:
        return list(range(first, last + 1))
    return sorted({round(first + k * (last - first) / (count - 1)) for k in range(count)})


def perturbation_check(model, idx, targets, vocab_size, setting, positions=0):
    """Changes the token at each position p in turn (idx[p] and targets[p-1]: the same token)
    and compares the logits at positions < p with the unchanged ones; p = T changes only the
    last target. `positions` > 0 takes that many p, spread over 1..T.

    Returns (the first leak or None, the largest change of an earlier logit, the smallest
    change at the perturbed position itself: > 0 shows the check can see a change).
    """
    T = idx.size(1)
    with torch.no_grad():
        reference = logits_of(model, idx, targets)
        scale = max(1.0, reference.abs().max().item())
        worst_earlier, least_own = 0.0, math.inf
        for p in spread(positions, 1, T):
            changed_idx, changed_targets = idx.clone(), targets.clone()
            if p < T:
                changed_idx[:, p] = (idx[:, p] + 1) % vocab_size
            changed_targets[:, p - 1] = (targets[:, p - 1] + 1) % vocab_size
            logits = logits_of(model, changed_idx, changed_targets)
            # (B, T, vocab) -> (T,): the largest change at each position
            change = (logits - reference).abs().amax(dim=(0, 2))
            worst_earlier = max(worst_earlier, change[:p].max().item())
            if p < T:
                least_own = min(least_own, change[p].item())
            leaking = (change[:p] > TOLERANCE * scale).nonzero()
            if len(leaking):
                i = leaking[0].item()
                leak = Leak("perturbation", i, p, change[i].item(), setting)
                return leak, worst_earlier, least_own
    if least_own == 0.0:
        raise CheckError(f"changing a token left the logits at its own position unchanged "
                         f"({setting}): the check cannot see this model's inputs")
    return None, worst_earlier, least_own


def gradient_check(model, idx, targets, setting, positions=0, embedding=None):
    """For each position i, the gradient of the logits at i (in a random direction, so that
    nothing cancels) with respect to the token embeddings wte(idx): zero after i.
    `positions` > 0 takes that many i, spread over 0..T-1. `embedding` is the module whose
    output is the token embeddings (B, T, ...); ours is model.transformer.wte.

    Returns (the first leak or None, the largest gradient found after a position)."""
    captured = []

    def as_leaf(module, inputs, output):
        # the token embeddings become a leaf we can differentiate by
        if not isinstance(output, torch.Tensor) or output.shape[:2] != idx.shape:
            raise CheckError(f"the token embedding {type(module).__name__} returned "
                             f"{described(output)}, not embeddings (B, T, ...) of the ids "
                             f"{tuple(idx.shape)}; name the module that embeds the tokens with "
                             f"--embedding=ATTR.PATH")
        captured.append(output.detach().requires_grad_())
        return captured[-1]

    if embedding is None:
        if not hasattr(model, "transformer") or "wte" not in model.transformer:
            raise CheckError("the gradient check needs the token embedding at "
                             "model.transformer.wte")
        embedding = model.transformer.wte
    hook = embedding.register_forward_hook(as_leaf)
    try:
        logits = logits_of(model, idx, targets)
    finally:
        hook.remove()
    if not captured:
        raise CheckError(f"the token embedding was not called in the forward ({setting}); name "
                         f"the module that embeds the tokens with --embedding=ATTR.PATH")
    T = idx.size(1)
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    checked = spread(positions, 0, T - 1)
    for i in checked:
        direction = torch.randn(logits[:, i].shape, generator=g, dtype=logits.dtype)
        # every call of the embedding counts (a model may embed twice); one it does not use has
        # no gradient
        grads = torch.autograd.grad((logits[:, i] * direction).sum(), captured,
                                    retain_graph=i < checked[-1], allow_unused=True)
        # each call's (B, T, ...) -> (T,): the largest gradient at each position, summed
        per_position = sum((grad.abs().reshape(*idx.shape, -1).amax(dim=(0, 2))
                            for grad in grads if grad is not None),
                           torch.zeros(T, dtype=logits.dtype))
        own = per_position[:i + 1].max().item()
        if own == 0.0:
            raise CheckError(f"the logits at position {i} have no gradient from any token "
                             f"embedding ({setting}): the check cannot see this model's inputs")
        after = per_position[i + 1:]
        if len(after):
            worst = max(worst, after.max().item())
            leaking = (after > TOLERANCE * max(1.0, own)).nonzero()
            if len(leaking):
                j = i + 1 + leaking[0].item()
                return Leak("gradient", i, j, per_position[j].item(), setting), worst
    return None, worst


def settings_of(model_type, block_size, future_kv="learned"):
    """(mode, T, future-attention implementation) for every check: both modes, T = C and T < C,
    and for future attention both CPU implementations (the readable one and the blocked one;
    computed future keys, future_kv='computed', have the readable one only)."""
    lengths = [block_size] + ([max(2, 2 * block_size // 3)] if block_size > 2 else [])
    impls = [None]
    if model_type == "future_attn":
        impls = ["readable", "fast"] if future_kv == "learned" else ["readable"]
    return [(mode, T, impl) for impl in impls for mode in ("eval", "train") for T in lengths]


def check(model_type, model_args, batch=2, positions=0, seed=0, log=print):
    """Runs every exact check; returns the first leak or None. Prints one line per setting."""
    model = build(model_type, model_args, seed)
    runs = settings_of(model_type, model_args["block_size"], model_args.get("future_kv", "learned"))
    return check_settings(model, runs, model_args["vocab_size"], batch=batch, positions=positions,
                          seed=seed, log=log)


def check_settings(model, runs, vocab_size, embedding=None, batch=2, positions=0, seed=0,
                   log=print):
    """The exact checks of model, one (mode, T, impl) of settings_of after another; returns
    the first leak or None."""
    g = torch.Generator().manual_seed(seed)
    for mode, T, impl in runs:
        if impl:
            model.set_impl(impl)
        setting = f"{mode} mode, T={T}" + (f", impl={impl}" if impl else "")
        model.train(mode == "train")
        tokens = torch.randint(vocab_size, (batch, T + 1), generator=g)
        idx, targets = tokens[:, :-1], tokens[:, 1:]  # targets: the next tokens, as in training
        t0 = time.perf_counter()
        try:
            leak, earlier, own = perturbation_check(model, idx, targets, vocab_size, setting,
                                                    positions)
        except ValueError as e:
            if mode == "eval":
                raise
            # training refuses some settings (future attention trains at T = block_size only)
            log(f"  {setting:36s} skipped: the model refuses it ({str(e).splitlines()[0]})")
            continue
        if leak is None:
            leak, grad_after = gradient_check(model, idx, targets, setting, positions, embedding)
        if leak:
            log(f"  {setting:36s} leaks ({leak.how} check)")
            return leak
        log(f"  {setting:36s} ok: earlier logits changed by at most {earlier:.1g} (the changed "
            f"position's by {own:.2g} or more); gradient after i at most {grad_after:.1g} "
            f"[{time.perf_counter() - t0:.1f} s]")
    return None


# --------------------------------------------------------------------------------------
# the reversal probe


def reversal_batch(batch, n, vocab_size, generator):
    """(idx, targets): n random digits, and the same digits reversed: position t predicts n-1-t."""
    idx = torch.randint(vocab_size, (batch, n), generator=generator)
    return idx, idx.flip(1)


def unseen_positions(n):
    """(n,) bool: True where position t's target, digit n-1-t, is still to come (the first half)."""
    t = torch.arange(n)
    return n - 1 - t > t


def probe_accuracy(model, idx, targets, training):
    """(accuracy on the positions whose target is still to come, on those that have seen it)."""
    unseen = unseen_positions(idx.size(1))
    model.train(training)
    with torch.no_grad():
        logits, _, _ = model(idx, targets)
    correct = (logits.argmax(-1) == targets).double()  # (B, n)
    model.train()
    return correct[:, unseen].mean().item(), correct[:, ~unseen].mean().item()


def above_chance(accuracy, samples, chance):
    """Is accuracy more than PROBE_Z standard errors above chance? The first-half targets
    are uniform and independent of everything a causal model sees, so its hits are Bernoulli."""
    return accuracy > chance + PROBE_Z * math.sqrt(chance * (1 - chance) / samples)


def probe(model_type, model_args, options, seed=0, log=print):
    """Trains on the reversal task; returns a dict of accuracies and the verdict."""
    torch.manual_seed(seed)
    # its own init, float32: a real training run
    model = train.build_model(model_type, model_args)
    optimizer = model.configure_optimizers(0.0, options["probe_lr"], (0.9, 0.98), "cpu")
    return train_probe(model, optimizer, options, seed=seed, log=log)


def train_probe(model, optimizer, options, seed=0, log=print):
    """Trains model, whose forward(idx, targets) returns (logits, loss, aux), on the reversal
    task; returns a dict of accuracies and the verdict."""
    n, V = options["probe_length"], options["probe_vocab"]
    g = torch.Generator().manual_seed(seed)
    eval_generator = torch.Generator().manual_seed(seed + 1)
    eval_idx, eval_targets = reversal_batch(PROBE_EVAL, n, V, eval_generator)
    model.train()
    t0, step, last_log = time.time(), 0, time.time()
    while True:
        steps_done = options["probe_steps"] > 0 and step >= options["probe_steps"]
        time_up = options["probe_steps"] <= 0 and time.time() - t0 >= options["probe_seconds"]
        if steps_done or time_up:
            break
        idx, targets = reversal_batch(options["probe_batch"], n, V, g)
        _, loss, _ = model(idx, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if time.time() - last_log >= 10:
            last_log = time.time()
            log(f"  probe step {step} ({last_log - t0:.0f} s): loss {loss.item():.3f}")
    result = dict(steps=step, seconds=time.time() - t0)
    unseen_samples = len(eval_idx) * unseen_positions(n).sum().item()
    seen_samples = len(eval_idx) * n - unseen_samples
    chance = 1.0 / V
    samples = unseen_samples + seen_samples
    result["causal_best"] = (unseen_samples * chance + seen_samples) / samples
    for mode in ("eval", "train"):
        first, second = probe_accuracy(model, eval_idx, eval_targets, training=mode == "train")
        overall = (first * unseen_samples + second * seen_samples) / samples
        result[mode] = dict(first=first, second=second, overall=overall)
    leaky = [m for m in ("eval", "train")
             if above_chance(result[m]["first"], unseen_samples, chance)]
    learned = above_chance(result["eval"]["second"], seen_samples, chance)
    result["verdict"] = "leak" if leaky else "causal" if learned else "inconclusive"
    result["leaky_modes"] = leaky
    return result


def report_probe(result, V, log=print):
    chance = 1.0 / V
    log(f"  after {result['steps']} steps ({result['seconds']:.0f} s), accuracy on {PROBE_EVAL} "
        f"fresh sequences:")
    log(f"    {'':10s} {'first half':>11s} {'second half':>12s} {'overall':>8s}")
    for mode in ("eval", "train"):
        r = result[mode]
        log(f"    {mode + ' mode':10s} {r['first']:11.1%} {r['second']:12.1%} {r['overall']:8.1%}")
    causal_best = "~" + format(result["causal_best"], ".0%")
    log(f"    {'causal':10s} {chance:11.1%} {'up to 100%':>12s} {causal_best:>8s}"
        f"   (the best a causal model can do)")
    log(f"    {'leaky':10s} {'up to 100%':>11s} {'up to 100%':>12s} {'~100%':>8s}")
    if result["verdict"] == "leak":
        mode = result["leaky_modes"][0]
        log(f"LEAK: the model predicts the first half at {result[mode]['first']:.1%} "
            f"({mode} mode), far above chance ({chance:.0%}): it sees the future")
    elif result["verdict"] == "causal":
        log(f"causal: accuracy on the first half is at chance ({result['eval']['first']:.1%}), "
            f"as it must be")
    else:
        log(f"inconclusive: the model has not learned even the second half "
            f"({result['eval']['second']:.1%}); train longer (--probe_seconds, --probe_steps) or "
            f"raise --probe_lr")


# --------------------------------------------------------------------------------------
# any PyTorch model: --model=MODULE:FACTORY


class FactoryModel(torch.nn.Module):
    """A factory's model behind our models' interface, forward(idx, targets) -> (logits, loss, aux),
    so that the checks and the probe take either. The model sees the token ids only; the loss
    (cross-entropy to the targets) is the probe's."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets=None):
        logits = read_logits(self.model(idx), idx)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss, {}


def read_logits(output, idx):
    """The logits (B, T, vocab) in a model's output: output.logits (HF's ModelOutput), the first
    element of a tuple or list, or the output itself."""
    if hasattr(output, "logits"):
        logits = output.logits
    elif isinstance(output, (tuple, list)) and output:
        logits = output[0]
    else:
        logits = output
    if isinstance(logits, torch.Tensor) and logits.dim() == 3 and logits.shape[:2] == idx.shape:
        return logits
    B, T = idx.shape
    raise CheckError(f"expected logits ({B}, {T}, vocab) at every position for token ids "
                     f"({B}, {T}): a tensor, a tuple or list that starts with one, or an object "
                     f"with .logits; the model returned {described(output)}")


def described(output):
    """What a model returned, in words: 'a tuple whose first element is a tensor of shape
    (2, 1, 65)'."""
    if isinstance(output, torch.Tensor):
        return f"a tensor of shape {tuple(output.shape)}"
    if hasattr(output, "logits"):
        return f"a {type(output).__name__} whose .logits is {described(output.logits)}"
    if isinstance(output, (tuple, list)) and not output:
        return "an empty one"
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} whose first element is {described(output[0])}"
    return f"a {type(output).__name__}"


@contextlib.contextmanager
def blamed_on_the_model(doing):
    """An error in the user's code (importing it, the factory, a forward) becomes one line that
    says what failed and where, with exit status 2."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        raise CheckError(f"{doing} failed: {in_one_line(e)}") from e


def in_one_line(error):
    """'RuntimeError: what it says (file, line N)': the first line of an error, and where."""
    # a SyntaxError's str() repeats where it is; its msg does not
    text = (error.msg if isinstance(error, SyntaxError) else str(error)).strip()
    message = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}{': ' + message if message else ''} ({where(error)})"


def where(error):
    """'file, line N' of the innermost frame of error outside Python's and the libraries' code
    (in the user's file, usually), else of the innermost frame."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}, line {error.lineno}"
    site_packages = os.path.dirname(os.path.dirname(torch.__file__))
    libraries = ("<", os.path.dirname(os.__file__), site_packages, __file__)
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not frame.filename.startswith(libraries)]
    frame = (own or frames)[-1]
    return f"{frame.filename}, line {frame.lineno}"


def import_module_or_file(name):
    """The module `name`: a .py file (its folder on sys.path, as `python FILE` puts it) or a
    dotted import path, found from the current directory first, as `python -m` finds it."""
    if not (name.endswith(".py") or os.sep in name):
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                raise ConfigError(f"no module {name} from {os.getcwd()} or sys.path: MODULE is a "
                                  f"dotted import path (mypackage.models) or a .py file "
                                  f"(path/to/my_models.py)") from None
            raise
    if not os.path.isfile(name):
        raise ConfigError(f"no file {name}: MODULE is a .py file (path/to/my_models.py) or a "
                          f"dotted import path")
    path = os.path.abspath(name)
    stem = os.path.splitext(os.path.basename(path))[0]
    loaded = sys.modules.get(stem)
    if getattr(loaded, "__file__", None) == path:  # a second factory of the same file
        return loaded
    if os.path.dirname(path) not in sys.path:
        sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(stem, path)
    module = importlib.util.module_from_spec(spec)
    if loaded is None:
        sys.modules[stem] = module  # what dataclasses and pickle look classes up in
    spec.loader.exec_module(module)
    return module


def load_factory(spec):
    """The function that `spec`, MODULE:FACTORY, names."""
    module_name, _, factory_name = spec.rpartition(":")
    with blamed_on_the_model(f"importing {module_name}"):
        module = import_module_or_file(module_name)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        own = [name for name, value in vars(module).items() if not name.startswith("_")
               and callable(value) and getattr(value, "__module__", None) == module.__name__]
        raise ConfigError(f"{module_name} has no function {factory_name}"
                          + (f"; it defines {', '.join(own)}" if own else ""))
    return factory


def build_from(spec, factory, seed):
    """The nn.Module factory() returns, its own init drawn from seed."""
    torch.manual_seed(seed)
    with blamed_on_the_model(f"{spec.rpartition(':')[2]}()"):
        model = factory()
    if not isinstance(model, torch.nn.Module):
        raise CheckError(f"{spec}: expected the factory to return a torch.nn.Module that maps "
                         f"token ids (B, T) to logits (B, T, vocab), got {described(model)}")
    return model


def size_of(model, names, given, flag):
    """(a size, where it was found): the flag's value when given, else the first of names in
    model.config (an object or a dict) or on the model itself; (None, None) when none says it."""
    if given:
        return given, f"--{flag}"
    config = getattr(model, "config", None)
    for owner, prefix in ((config, "config."), (model, "")):
        for name in names:
            value = owner.get(name) if isinstance(owner, dict) else getattr(owner, name, None)
            if type(value) is int and value > 0:
                return value, prefix + name
    return None, None


def token_embedding(model, vocab_size, path):
    """(the module whose output is the token embeddings, how it was found): --embedding's path,
    else get_input_embeddings() (HF's way), else the one nn.Embedding with vocab_size rows."""
    names = {module: name for name, module in model.named_modules()}
    embeddings = [name for module, name in names.items() if isinstance(module, torch.nn.Embedding)]
    listed = "it has no nn.Embedding"
    if embeddings:
        listed = f"its nn.Embedding modules: {', '.join(embeddings)}"
    if path:
        try:
            return model.get_submodule(path), f"--embedding={path}"
        except AttributeError:
            raise ConfigError(f"--embedding={path}: the model has no module {path}; "
                              f"{listed}") from None
    module = input_embeddings(model)
    if module is not None:
        return module, f"{names[module]}, its get_input_embeddings()"
    rows = [name for name in embeddings if model.get_submodule(name).num_embeddings == vocab_size]
    if len(rows) == 1:
        return model.get_submodule(rows[0]), f"{rows[0]}, the one nn.Embedding of {vocab_size} rows"
    raise CheckError(f"cannot tell which module embeds the tokens: no get_input_embeddings() and "
                     f"{len(rows) or 'no'} nn.Embedding of {vocab_size} rows ({listed}); name the "
                     f"module whose output is the token embeddings with --embedding=ATTR.PATH")


def input_embeddings(model):
    """The module model.get_input_embeddings() (HF's way) returns, when it is one of the model's;
    else None."""
    get_input_embeddings = getattr(model, "get_input_embeddings", None)
    if callable(get_input_embeddings):
        with contextlib.suppress(NotImplementedError):
            module = get_input_embeddings()
            if any(module is own for own in model.modules()):
                return module
    return None


def mask_buffers(model):
    """[(name, T)] of the buffers that hold one square mask (T, T), every leading size 1: bool,
    or of two values (1 and 0, 0 and -inf), as nanoGPT's causal `bias` is."""
    found = []
    for name, buffer in model.named_buffers():
        T = buffer.size(-1) if buffer.dim() >= 2 else 0
        one_square = T >= 2 and buffer.size(-2) == T and buffer.numel() == T * T
        if one_square and (buffer.dtype == torch.bool or buffer.unique().numel() <= 2):
            found.append((name, T))
    return found


def position_tables(model, vocab_size):
    """[(name, rows)] of the nn.Embedding modules that are not the token embedding: neither
    get_input_embeddings() nor of vocab_size rows (any, when vocab_size is None)."""
    tokens = input_embeddings(model)
    return [(name, module.num_embeddings) for name, module in model.named_modules()
            if isinstance(module, torch.nn.Embedding) and module is not tokens
            and module.num_embeddings != vocab_size]


def length_in_the_model(model, vocab_size):
    """(T, where it was found) from the model's own modules: the largest of its square mask
    buffers and position tables (a table of token types, say, is smaller); (None, None) when
    it has neither."""
    masks = [(T, f"mask buffer {name} ({T}×{T})") for name, T in mask_buffers(model)]
    tables = [(T, f"position table {name} (an nn.Embedding of {T} rows)")
              for name, T in position_tables(model, vocab_size)]
    if not masks + tables:
        return None, None
    T = max(size for size, _ in masks + tables)
    # the first of each kind that says T, so that a mask and a table that agree are both named
    named = [next((what for size, what in kind if size == T), None) for kind in (masks, tables)]
    return T, "its " + " and ".join(what for what in named if what)


def vocabulary_of_a_forward(checked, model):
    """The logits' last size: which nn.Embedding holds the tokens, when nothing else says, is
    the one with a row per logit. The forward runs at T=2, else at the size of each table and
    mask, shortest first (a model may run at one length only); None if it fails at all."""
    sizes = [T for _, T in mask_buffers(model) + position_tables(model, None)]
    for T in sorted({2, *sizes}):
        if forward_error(checked, T) is None:
            return logits_of(checked, torch.zeros(1, T, dtype=torch.long), None).size(-1)
    return None


def forward_error(model, T):
    """The error of a forward of token ids (1, T) through model (a FactoryModel in eval mode),
    or None when it works. An error of ours (logits the checks cannot read) is raised."""
    try:
        logits_of(model, torch.zeros(1, T, dtype=torch.long), None)
    except UserError:
        raise
    except Exception as e:
        return e
    return None


def lengths_to_try(T):
    """T, then T-1 .. T-LENGTH_STEPS (an offset: RoBERTa-style position ids start at
    padding_idx + 1, so max_position_embeddings is 2 more than the longest input), then T
    halved and halved again, down to 2."""
    tries = [length for length in range(T, T - LENGTH_STEPS - 1, -1) if length >= 2]
    half = T // 2
    while half >= 2:
        if half < tries[-1]:
            tries.append(half)
        half //= 2
    return tries


def longest_working_length(spec, model, T):
    """(the first of lengths_to_try(T) at which the forward works, the error at T or None).
    A model that fails at every one is refused, with the first error."""
    tries = lengths_to_try(T)
    first_error = None
    for length in tries:
        error = forward_error(model, length)
        if error is None:
            return length, first_error
        first_error = first_error or error
    raise CheckError(f"{spec}: the forward of token ids (1, T) fails at every length tried, T={T} "
                     f"down to {tries[-1]}; at T={T}: {in_one_line(first_error)}")


def read_model(spec, options, log=print):
    """(factory, the model ready for the checks, vocab_size, the lengths to check at, token
    embedding module) for spec, MODULE:FACTORY; logs how each was found, the length first."""
    factory = load_factory(spec)
    model = build_from(spec, factory, options["seed"])
    checked = FactoryModel(model).double()
    if not options["keep_weights"]:
        randomize(checked, torch.Generator().manual_seed(options["seed"]))
    checked.eval()
    vocab_size, vocab_from = size_of(model, ("vocab_size",), options["vocab_size"], "vocab_size")
    # the length: the flag, the config fields, the model's own tables, else a default
    block_size, length_from = size_of(model, LENGTH_NAMES, options["block_size"], "block_size")
    if block_size is None:
        vocabulary = vocab_size
        if vocabulary is None and input_embeddings(model) is None:
            vocabulary = vocabulary_of_a_forward(checked, model)
        block_size, length_from = length_in_the_model(model, vocabulary)
    if block_size is None:
        block_size = DEFAULT_LENGTH
        length_from = ("the default: the model gives no length (no config field, mask buffer or "
                       "position table)")
    if block_size < 2:
        raise ConfigError(f"block_size must be at least 2 for a position to have a future, "
                          f"got {block_size}")
    T, error = longest_working_length(spec, checked, block_size)
    if T == block_size:
        found = f"T={T} from {length_from}"
    else:
        found = (f"T={T}, the longest length tried that works: T={block_size}, from {length_from}, "
                 f"fails ({in_one_line(error)})")
    parameters = sum(p.numel() for p in model.parameters())
    log(f"{spec}: {type(model).__name__}, {parameters:,} parameters; {found}")
    logits = logits_of(checked, torch.zeros(1, T, dtype=torch.long), None)
    if vocab_size is None:
        vocab_size, vocab_from = logits.size(-1), "the logits' last dimension"
    embedding, embedding_from = token_embedding(model, vocab_size, options["embedding"])
    log(f"  vocab_size {vocab_size} from {vocab_from}; token embeddings from {embedding_from}")
    lengths = [T]
    shorter = max(2, 2 * T // 3)
    if shorter < T:
        error = forward_error(checked, shorter)
        if error is None:
            lengths.append(shorter)
        else:
            log(f"  T={shorter} skipped: the forward fails there ({in_one_line(error)})")
    return factory, checked, vocab_size, lengths, embedding


def probe_factory(spec, factory, options, log=print):
    """The reversal probe on a fresh model from factory, at its own init, float32."""
    model = FactoryModel(build_from(spec, factory, options["seed"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=options["probe_lr"], betas=(0.9, 0.98),
                                  weight_decay=0.0)
    with blamed_on_the_model(f"{spec}: the probe"):
        return train_probe(model, optimizer, options, seed=options["seed"], log=log)


def parse_model_args(argv):
    """The settings of `--model=MODULE:FACTORY[,...] [--key=value ...]`."""
    argv = configurator.normalize(argv)
    files = [a for a in argv if not a.startswith("--")]
    if files:
        raise ConfigError(f"--model checks the model its factory builds: give no config file "
                          f"({files[0]}) with it")
    _, overrides = configurator.parse(argv)
    if "full_size" in overrides:
        raise ConfigError("--model checks the model at its own sizes already: drop --full_size "
                          "(--positions sets how many positions are changed)")
    options = configurator.merge(MODEL_DEFAULTS, {}, overrides)
    check_least(options)
    for key in ("vocab_size", "block_size", "positions"):
        if options[key] < 0:
            raise ConfigError(f"{key} must be 0 or more, got {options[key]}")
    for spec in options["model"].split(","):
        module_name, _, factory_name = spec.rpartition(":")
        if not module_name or not factory_name:
            raise ConfigError(f"--model={spec}: write MODULE:FACTORY, e.g. "
                              f"--model=my_models.py:tiny_gpt2 or --model=mypackage.models:build")
    return options


def check_models(argv):
    """The exact checks (and the probe) of each model of --model; exit status 0, 1 or 2."""
    options = parse_model_args(argv)
    specs = options["model"].split(",")
    weights = "random weights (every parameter)"
    if options["keep_weights"]:
        weights = "the model's own weights"
    print(what_the_checks_do(weights, options["batch"], options["positions"], options["seed"]))
    failed, threads = [], torch.get_num_threads()
    for spec in specs:
        factory, model, vocab_size, lengths, embedding = read_model(spec, options)
        n, V = options["probe_length"], options["probe_vocab"]
        if options["probe"] and (n > lengths[0] or V > vocab_size):
            raise ConfigError(f"the probe's {n} digits 0..{V - 1} need block_size >= {n} and "
                              f"vocab_size >= {V}; the model has {lengths[0]} and {vocab_size}: "
                              f"lower --probe_length or --probe_vocab")
        # tensors this small keep one core busy; more threads only wait
        small = sum(p.numel() for p in model.parameters()) < ONE_THREAD_BELOW
        torch.set_num_threads(1 if small else threads)
        runs = [(mode, T, None) for mode in ("eval", "train") for T in lengths]
        t0 = time.perf_counter()
        with blamed_on_the_model(f"{spec}: a forward or backward of the checks"):
            leak = check_settings(model, runs, vocab_size, embedding, batch=options["batch"],
                                  positions=options["positions"], seed=options["seed"])
        if leak:
            print(leak)
            failed.append(spec)
            continue
        print(f"{CAUSAL} [the checks: {time.perf_counter() - t0:.1f} s]")
        if options["probe"]:
            print(f"probe: reversal of {n} digits 0..{V - 1}, the factory's model at its own init")
            result = probe_factory(spec, factory, options)
            report_probe(result, V)
            if result["verdict"] != "causal":
                failed.append(spec)
    if len(specs) > 1:
        print(f"{len(specs) - len(failed)} of {len(specs)} models causal"
              + (f"; not causal: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


CAUSAL = "causal: no logit depends on a later token in the checks above"


def what_the_checks_do(weights, batch, positions, seed):
    """The one line that says what every exact check does; CAUSAL, the verdict, refers to it."""
    which = f"{positions} positions spread over T" if positions else "every position"
    return (f"each check, in float64 on the CPU with {weights}, batch {batch}, seed {seed}: at "
            f"{which}, change the token (no earlier logit may move) and take the gradient of the "
            f"logits (no later token embedding may have one)")


# --------------------------------------------------------------------------------------


def plan(options, original, config, user_keys):
    """(the model settings of the exact checks, those of the probe model or None)."""
    if options["full_size"]:
        sizes = {} if "dropout" in user_keys else dict(dropout=0.0)
        if "positions" not in user_keys:
            # a forward and a backward per position: minutes at the write-ups' sizes
            options["positions"] = 16
    else:
        sizes = shrunk_sizes(original, config, fixed=user_keys,
                             block_size=min(original["block_size"], CHECK_BLOCK_SIZE),
                             vocab_size=min(original["vocab_size"], CHECK_VOCAB))
    model_args = model_args_for(config, sizes)
    if not options["probe"]:
        return model_args, None
    # the probe's length and digits are its own; the user's other settings apply
    sizes = shrunk_sizes(original, config, fixed=user_keys - {"block_size", "vocab_size"},
                         block_size=options["probe_length"], vocab_size=options["probe_vocab"])
    return model_args, model_args_for(config, sizes)


@configurator.script
def main(argv):
    """Exit status: 0 causal, 1 a leak (or a probe that learned nothing), 2 a bad setting (or, with
    --model, a model the tool cannot read)."""
    if configurator.wants_help(argv):
        model_keys = "\n".join(f"  --{key}={value!r}" for key, value in MODEL_DEFAULTS.items())
        print(configurator.usage(__doc__, CHECK_DEFAULTS)
              + "\nand every key of train.py (python train.py --help)"
              + "\n\nwith --model=MODULE:FACTORY instead of a config file, these keys:\n"
              + model_keys)
        return 0
    if any(arg.startswith("--model=") for arg in configurator.normalize(argv)):
        return check_models(argv)
    options, original, config, user_keys = parse_args(argv)
    model_args, probe_args = plan(options, original, config, user_keys)
    changes = describe_changes(original, model_args)
    probe_changes = probe_args and describe_changes(original, probe_args)
    if not options["full_size"]:
        torch.set_num_threads(1)  # tensors this small keep one core busy; more threads only wait
    model_type = config["model_type"]
    path = next(a for a in configurator.normalize(argv) if not a.startswith("--"))
    print(f"{path}: {model_type}")
    if options["full_size"]:
        print(f"checked at the config's own sizes{': ' + changes if changes else ''}")
    else:
        print(f"shrunk to run in seconds (--full_size=True checks the config's own sizes): "
              f"{changes or 'nothing'}")
    print(what_the_checks_do("random weights (every parameter)", options["batch"],
                             options["positions"], config["seed"]))
    leak = check(model_type, model_args, batch=options["batch"], positions=options["positions"],
                 seed=config["seed"])
    if leak:
        print(leak)
        return 1
    print(CAUSAL)
    if probe_args:
        print(f"probe: reversal of {options['probe_length']} digits "
              f"0..{options['probe_vocab'] - 1}; {probe_changes}")
        result = probe(model_type, probe_args, options, seed=config["seed"])
        report_probe(result, options["probe_vocab"])
        if result["verdict"] != "causal":
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
