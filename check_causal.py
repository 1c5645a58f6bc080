"""
Checks that a model cannot see the future: the logits at position i must depend on the tokens
0..i only, in training and in evaluation. How the checks work and what a pass proves:
docs/causality.md.

    python check_causal.py config/baseline.py --sub_pos=yes_ln  # any key of train.py
    python check_causal.py config/future50_mse.py --probe       # and the reversal probe
    python check_causal.py --model=my_models.py:tiny_gpt2       # any PyTorch language model

Exit status: 0 causal, 1 not causal, 2 a bad setting or a model the checks cannot read.
"""

import contextlib
import dataclasses
import importlib
import math
import os
import sys
import time

import torch
from torch.nn import functional as F

import configurator
import train
from configurator import ConfigError, UserError

CHECK_DEFAULTS = dict(
    full_size=False,  # check at the config's own sizes, not a shrunk model (slow)
    batch=2,  # sequences per forward pass in the exact checks
    positions=0,  # positions changed per check, spread over T; 0 = all (16 with full_size)
    probe=False,  # also train the reversal probe
    probe_length=16,  # digits per probe sequence: the probe's block_size
    probe_vocab=10,  # digits 0..probe_vocab-1
    probe_seconds=60.0,  # how long the probe trains
    probe_steps=0,  # train this many steps instead, when > 0
    probe_batch=128,  # sequences per probe step
    probe_lr=4e-3,  # AdamW without weight decay
)
MODEL_DEFAULTS = dict(
    model="",  # MODULE:FACTORY, e.g. my_models.py:tiny_gpt2; a comma list checks each
    vocab_size=0,  # token ids 0..vocab_size-1; 0 = the size of the logits
    block_size=0,  # T; 0 = the model's config (n_positions, ...), else 64; shortened to run
    embedding="",  # ATTR.PATH of the module that embeds the tokens
    keep_weights=False,  # check the model's own weights, not random ones
    seed=1337,  # the random weights, tokens and dropout masks
    **CHECK_DEFAULTS,
)
del MODEL_DEFAULTS["full_size"]  # a factory's model is checked at its own sizes
MODEL_DEFAULTS["positions"] = 16  # as with full_size
LEAST = dict(batch=1, positions=0, probe_length=2, probe_vocab=2, probe_batch=1, vocab_size=0,
             block_size=0)

CHECK_WIDTH = 48  # n_embd of the shrunk model: the nearest multiple of the head counts
CHECK_BLOCK_SIZE = 24
CHECK_VOCAB = 64
CHECK_LAYERS = 2  # per stack; future attention keeps its baseline layers before and after
ONE_THREAD_BELOW = 1_000_000  # parameters
TOLERANCE = 1e-9  # float64: a causal model changes nothing; rounding would be ~1e-15
LENGTH_NAMES = ("n_positions", "max_position_embeddings", "block_size", "max_seq_len")
DEFAULT_LENGTH = 64  # T of a model that gives none (ALiBi, rotary positions, a convolution)
PROBE_EVAL = 1024  # fresh sequences the probe's accuracy is measured on
PROBE_Z = 6.0  # standard errors above chance
NAME_IT = "name the module that embeds the tokens with --embedding=ATTR.PATH"
CAUSAL = ("causal: changing a token moved no earlier logit, and no logit had a gradient from "
          "a later token's embedding")


# --------------------------------------------------------------------------------------
# settings


def config_files(argv):
    return [arg for arg in argv if arg.endswith(".py") and not arg.startswith("--")]


def check_least(options):
    for key, least in LEAST.items():
        if key in options and options[key] < least:
            raise ConfigError(f"{key} must be at least {least}, got {options[key]}")


def parse_args(argv):
    """(the checker's options, the config file's train config, the same with the flags, the keys
    the flags set) from `CONFIG [--key=value ...]`."""
    if len(config_files(argv)) != 1:
        raise ConfigError("give one config file, e.g. "
                          "`python check_causal.py config/future50_mse.py`")
    _, overrides = configurator.parse(argv)
    options = configurator.own_settings(overrides, CHECK_DEFAULTS)
    check_least(options)
    # the config file alone (in the flags' model_type), to say what the checks changed
    model_type = [f"--model_type={overrides['model_type']}"] if "model_type" in overrides else []
    original = train.get_config(config_files(argv) + model_type)
    # plan() checks the model it builds, in which --block_size=40 shrinks future_dim=50
    config = configurator.merge(original, {}, overrides, script_keys=CHECK_DEFAULTS)
    return options, original, config, set(overrides)


def shrunk_sizes(original, config, fixed, block_size, vocab_size):
    """The settings of a small model with every option of config kept: block_size and
    vocab_size as given, n_embd near CHECK_WIDTH, CHECK_LAYERS layers, no dropout. The keys in
    `fixed` keep config's value, but future_dim and the layer counts and range scale with the
    original's block_size and n_layer unless those are fixed too."""
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
        if config["future_dim"] is not None:  # block_size - 1 stays block_size - 1
            scaled = round(config["future_dim"] * (C - 1) / (C0 - 1))
            pick("future_dim", min(max(scaled, 1), C - 1))
        # one baseline layer before and after the future layers, where the config has some
        start0, end0 = config["start_layer"], config["end_layer"] or L0
        before, after = int(start0 > 1), int(end0 < L0)
        n_future = min(CHECK_LAYERS, end0 - start0 + 1)
        L = pick("n_layer", min(L0, before + n_future + after))
        pick("start_layer", 1 + before)
        pick("end_layer", L - after)
        return sizes
    L = pick("n_layer", min(L0, CHECK_LAYERS))
    if model_type == "encdec":  # unequal stacks stay unequal: the deeper one gets L layers
        depths = {key: config[key] or config["n_layer"]
                  for key in ("n_layer_encoder", "n_layer_decoder")}
        deepest = max(depths.values())
        for key, depth in depths.items():
            if config[key] is None and "n_layer" in fixed:
                continue  # None means n_layer: the user's
            pick(key, L if depth == deepest else max(1, min(L - 1, round(depth * L / deepest))))
    return sizes


def model_args_for(config, sizes):
    """The GPTConfig fields of config with sizes applied, resolved and validated."""
    return train.model_args_of(dict(config, **sizes))


def describe_changes(original, model_args):
    """'key original → checked, ...' for the model settings that differ from the config file's."""
    before = train.model_args_of(original)
    return ", ".join(f"{k} {before[k]} → {v}" for k, v in model_args.items() if before[k] != v)


def plan(options, original, config, user_keys):
    """(the model settings of the exact checks, those of the probe's model or None)."""
    if options["full_size"]:
        sizes = {} if "dropout" in user_keys else dict(dropout=0.0)
        if "positions" not in user_keys:
            options["positions"] = 16  # a forward and a backward each: minutes in all
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


# --------------------------------------------------------------------------------------
# the exact checks


@dataclasses.dataclass
class Leak:
    """The logits at `position` change by `amount` with the token at `later` > position, or
    have a gradient of `amount` from its embedding."""
    how: str  # 'perturbation' or 'gradient'
    position: int
    later: int
    amount: float
    setting: str

    def __str__(self):
        return (f"LEAK: the logits at position {self.position} depend on the token at position "
                f"{self.later} ({self.setting}; the {self.how} check: {self.amount:.3g})")


class CheckError(UserError):
    """A model the checks cannot read."""

    status = 2


def randomize(model, generator):
    """Every parameter drawn afresh, N(0, 1/fan_in): no zero-initialized bias hides a path."""
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
    """The logits (B, T, vocab); reseeded, so that dropout draws the same masks every time."""
    torch.manual_seed(0)
    logits = model(idx, targets)[0]
    if not torch.isfinite(logits).all():  # NaN compares as no change: it would pass any check
        raise CheckError("the logits are not all finite: try --keep_weights")
    return logits


def spread(count, first, last):
    """`count` positions evenly spread over first..last, both ends included; all when count is 0."""
    if count <= 0 or count >= last - first + 1:
        return list(range(first, last + 1))
    return sorted({round(first + k * (last - first) / (count - 1)) for k in range(count)})


def perturbation_check(model, idx, targets, vocab_size, setting, positions=0):
    """Changes the token at each position p (idx[p] and targets[p-1], the same token): the
    logits before p must not move. Returns the first leak, or None."""
    T = idx.size(1)
    with torch.no_grad():
        reference = logits_of(model, idx, targets)
        scale = max(1.0, reference.abs().max().item())
        least_own = math.inf
        for p in spread(positions, 1, T):
            changed_idx, changed_targets = idx.clone(), targets.clone()
            if p < T:
                changed_idx[:, p] = (idx[:, p] + 1) % vocab_size
            changed_targets[:, p - 1] = (targets[:, p - 1] + 1) % vocab_size
            logits = logits_of(model, changed_idx, changed_targets)
            change = (logits - reference).abs().amax(dim=(0, 2))  # (T,)
            if p < T:
                least_own = min(least_own, change[p].item())
            leaking = (change[:p] > TOLERANCE * scale).nonzero()
            if len(leaking):
                i = leaking[0].item()
                return Leak("perturbation", i, p, change[i].item(), setting)
    if least_own == 0.0:  # a check that cannot see a change would pass any model
        raise CheckError(f"changing a token left its own logits as they were ({setting})")
    return None


def gradient_check(model, idx, targets, embedding, setting, positions=0):
    """The gradient of the logits at each position i (in a random direction, so that nothing
    cancels) by the output of `embedding`, (B, T, ...), must be 0 after i. Returns the first
    leak, or None."""
    captured = []

    def as_leaf(module, inputs, output):
        captured.append(output.detach().requires_grad_())
        return captured[-1]

    hook = embedding.register_forward_hook(as_leaf)
    try:
        logits = logits_of(model, idx, targets)
    finally:
        hook.remove()
    if not captured:
        raise CheckError(f"the token embedding was not called ({setting}); {NAME_IT}")
    T = idx.size(1)
    g = torch.Generator().manual_seed(1)
    checked = spread(positions, 0, T - 1)
    for i in checked:
        direction = torch.randn(logits[:, i].shape, generator=g, dtype=logits.dtype)
        # every call of the embedding counts: a model may embed twice
        grads = torch.autograd.grad((logits[:, i] * direction).sum(), captured,
                                    retain_graph=i < checked[-1], allow_unused=True)
        # each call's (B, T, ...) -> (T,), summed
        per_position = sum((grad.abs().reshape(*idx.shape, -1).amax(dim=(0, 2))
                            for grad in grads if grad is not None), torch.zeros(T))
        own = per_position[:i + 1].max().item()
        if own == 0.0:
            raise CheckError(f"the logits at position {i} have no gradient from the token "
                             f"embeddings ({setting}); {NAME_IT}")
        leaking = (per_position[i + 1:] > TOLERANCE * max(1.0, own)).nonzero()
        if len(leaking):
            j = i + 1 + leaking[0].item()
            return Leak("gradient", i, j, per_position[j].item(), setting)
    return None


def settings_of(model_type, block_size, future_kv="learned"):
    """(mode, T, impl) of every check: both modes, T = C and T < C, and each CPU version of
    future attention."""
    lengths = [block_size] + ([max(2, 2 * block_size // 3)] if block_size > 2 else [])
    impls = [None]
    if model_type == "future_attn":
        impls = ["readable", "fast"] if future_kv == "learned" else ["readable"]
    return [(mode, T, impl) for impl in impls for mode in ("eval", "train") for T in lengths]


def check(model_type, model_args, batch=2, positions=0, seed=0, log=print):
    """Runs every exact check on one of our models; returns the first leak or None."""
    model = build(model_type, model_args, seed)
    runs = settings_of(model_type, model_args["block_size"], model_args.get("future_kv"))
    return check_settings(model, runs, model_args["vocab_size"], model.transformer.wte,
                          batch=batch, positions=positions, seed=seed, log=log)


def check_settings(model, runs, vocab_size, embedding, batch=2, positions=0, seed=0, log=print):
    """Both exact checks in each (mode, T, impl) of runs; returns the first leak or None."""
    if sum(p.numel() for p in model.parameters()) < ONE_THREAD_BELOW:
        torch.set_num_threads(1)  # a small model's many small forwards wait on a second thread
    g = torch.Generator().manual_seed(seed)
    for mode, T, impl in runs:
        if impl:
            model.set_impl(impl)
        setting = f"{mode} mode, T={T}" + (f", impl={impl}" if impl else "")
        model.train(mode == "train")
        tokens = torch.randint(vocab_size, (batch, T + 1), generator=g)
        idx, targets = tokens[:, :-1], tokens[:, 1:]  # the next tokens, as in training
        try:
            leak = perturbation_check(model, idx, targets, vocab_size, setting, positions)
        except ValueError as e:
            if mode == "eval":
                raise
            # training refuses some settings (future attention trains at T = block_size only)
            log(f"  {setting:36s} skipped: the model refuses it ({str(e).splitlines()[0]})")
            continue
        leak = leak or gradient_check(model, idx, targets, embedding, setting, positions)
        log(f"  {setting:36s} " + (f"leaks ({leak.how} check)" if leak else "ok"))
        if leak:
            return leak
    return None


# --------------------------------------------------------------------------------------
# the reversal probe: position t of n random digits predicts digit n-1-t


def reversal_batch(batch, n, vocab_size, generator):
    """(idx, targets): n random digits, and the same digits reversed."""
    idx = torch.randint(vocab_size, (batch, n), generator=generator)
    return idx, idx.flip(1)


def unseen_positions(n):
    """(n,) bool: True where position t's target, digit n-1-t, is still to come."""
    t = torch.arange(n)
    return n - 1 - t > t


def probe_accuracy(model, idx, targets, training):
    """(accuracy on the positions whose target is still to come, on those that have seen it)."""
    unseen = unseen_positions(idx.size(1))
    model.train(training)
    with torch.no_grad():
        logits = model(idx, targets)[0]
    correct = (logits.argmax(-1) == targets).double()  # (B, n)
    return correct[:, unseen].mean().item(), correct[:, ~unseen].mean().item()


def above_chance(accuracy, samples, chance):
    """Is accuracy PROBE_Z standard errors above chance? A causal model's hits on targets still
    to come are Bernoulli(chance)."""
    return accuracy > chance + PROBE_Z * math.sqrt(chance * (1 - chance) / samples)


def probe_done(step, started, options):
    """--probe_steps when it is set, else --probe_seconds."""
    if options["probe_steps"] > 0:
        return step >= options["probe_steps"]
    return time.time() - started >= options["probe_seconds"]


def train_probe(model, options, seed=0):
    """Trains model on the reversal task; returns the accuracies on each half in each mode and
    the verdict."""
    n, V = options["probe_length"], options["probe_vocab"]
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=options["probe_lr"], betas=(0.9, 0.98),
                                  weight_decay=0.0)
    model.train()
    started, step = time.time(), 0
    while not probe_done(step, started, options):
        model(*reversal_batch(options["probe_batch"], n, V, g))[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
    result = dict(steps=step)
    idx, targets = reversal_batch(PROBE_EVAL, n, V, torch.Generator().manual_seed(seed + 1))
    for mode in ("eval", "train"):
        result[mode] = probe_accuracy(model, idx, targets, training=mode == "train")
    unseen = PROBE_EVAL * unseen_positions(n).sum().item()
    leaks = any(above_chance(result[mode][0], unseen, 1 / V) for mode in ("eval", "train"))
    learned = above_chance(result["eval"][1], PROBE_EVAL * n - unseen, 1 / V)
    result["verdict"] = "leak" if leaks else "causal" if learned else "inconclusive"
    return result


PROBE_VERDICTS = dict(
    leak="LEAK: the model predicts the first half far above chance: it sees the future",
    causal="causal: the accuracy on the first half is at chance, as it must be",
    inconclusive="inconclusive: the model has not learned the second half; train it longer")


def report_probe(result, V, log=print):
    """The accuracies, and the verdict: a causal model is at chance on the first half."""
    log(f"  after {result['steps']} steps, accuracy on the first half (the second) of "
        f"{PROBE_EVAL} fresh sequences: eval mode {result['eval'][0]:.1%} "
        f"({result['eval'][1]:.1%}), train mode {result['train'][0]:.1%} "
        f"({result['train'][1]:.1%}); chance {1 / V:.1%}")
    log(PROBE_VERDICTS[result["verdict"]])


# --------------------------------------------------------------------------------------
# any PyTorch language model: --model=MODULE:FACTORY


class FactoryModel(torch.nn.Module):
    """A factory's model behind our models' forward(idx, targets) -> (logits, loss, aux)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets=None):
        output = self.model(idx)
        logits = getattr(output, "logits", output)  # HF's ModelOutput holds them in .logits
        if isinstance(logits, (tuple, list)) and logits:
            logits = logits[0]
        if not (isinstance(logits, torch.Tensor) and logits.shape[:2] == idx.shape
                and logits.dim() == 3):
            got = getattr(logits, "shape", type(logits).__name__)
            raise CheckError(f"expected logits ({len(idx)}, {idx.size(1)}, vocab) as a tensor, "
                             f"the first of a tuple or list, or .logits; got {got}")
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss, {}


def in_one_line(error):
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0]}"


def load_factory(spec):
    """The function spec, MODULE:FACTORY, names: MODULE a .py file or a dotted import path."""
    module_name, _, factory_name = spec.rpartition(":")
    folder = os.getcwd()
    if module_name.endswith(".py"):
        folder, file_name = os.path.split(os.path.abspath(module_name))
        module_name = file_name.removesuffix(".py")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return getattr(importlib.import_module(module_name), factory_name)


def build_from(factory, seed):
    """The nn.Module that factory() returns, its own init drawn from seed."""
    torch.manual_seed(seed)
    model = factory()
    if not isinstance(model, torch.nn.Module):
        raise CheckError(f"{factory.__name__}() returned a {type(model).__name__}, not an "
                         f"nn.Module")
    return model


def length_of(model, given):
    """(T, where it was found): --block_size, LENGTH_NAMES in model.config or on the model
    itself, or DEFAULT_LENGTH."""
    if given:
        return given, "from --block_size"
    config = getattr(model, "config", None)
    for owner, prefix in ((config, "config."), (model, "")):
        for name in LENGTH_NAMES:
            value = owner.get(name) if isinstance(owner, dict) else getattr(owner, name, None)
            if type(value) is int and value > 0:
                return value, f"from {prefix}{name}"
    return DEFAULT_LENGTH, "from the default (the model gives none)"


def forward_error(model, T):
    """The error of a forward of token ids (1, T), or None when it works."""
    try:
        logits_of(model, torch.zeros(1, T, dtype=torch.long), None)
    except UserError:  # ours: logits the checks cannot read
        raise
    except Exception as e:
        return e
    return None


def longest_working_length(model, block_size):
    """The longest T up to block_size at which the forward works, by a binary search: a model
    may run at fewer positions than it says (RoBERTa's) or than the default."""
    error = forward_error(model, block_size)
    if error is None:
        return block_size
    works, fails, tried = 1, block_size, [block_size]
    while fails - works > 1:
        middle = (works + fails) // 2
        tried.append(middle)
        if forward_error(model, middle) is None:
            works = middle
        else:
            fails = middle
    if works < 2:
        lengths = ", ".join(map(str, tried))
        raise CheckError(f"the forward fails at each length tried, T = {lengths}; at "
                         f"T={block_size}: {in_one_line(error)}. A model that runs at one length "
                         "alone: give it as --block_size")
    return works


def token_embedding(model, vocab_size, path):
    """(the token embedding, how it was found): --embedding, get_input_embeddings() (HF's
    way), or the one nn.Embedding of vocab_size rows."""
    names = {module: name for name, module in model.named_modules()}
    if path:
        try:
            return model.get_submodule(path), f"--embedding={path}"
        except AttributeError:
            raise ConfigError(f"--embedding={path}: the model has no module {path}") from None
    with contextlib.suppress(AttributeError, NotImplementedError):
        module = model.get_input_embeddings()
        if module in names:
            return module, f"{names[module]}, its get_input_embeddings()"
    rows = [name for module, name in names.items()
            if isinstance(module, torch.nn.Embedding) and module.num_embeddings == vocab_size]
    if len(rows) == 1:
        return model.get_submodule(rows[0]), f"{rows[0]}, the one nn.Embedding of {vocab_size} rows"
    raise CheckError(f"no get_input_embeddings() and {len(rows) or 'no'} nn.Embedding of "
                     f"{vocab_size} rows: {NAME_IT}")


def check_factory_model(spec, options):
    """Checks the model spec builds, at its own sizes; True when it is causal."""
    factory = load_factory(spec)
    model = build_from(factory, options["seed"])
    checked = FactoryModel(model).double().eval()
    if not options["keep_weights"]:
        randomize(checked, torch.Generator().manual_seed(options["seed"]))
    block_size, length_from = length_of(model, options["block_size"])
    T = longest_working_length(checked, block_size)
    if T < block_size:
        length_from = f"the longest that runs, below {block_size} {length_from}"
    print(f"{spec}: {type(model).__name__}; T={T}, {length_from}")
    vocab_size, vocab_from = options["vocab_size"], "--vocab_size"
    if not vocab_size:
        vocab_size = logits_of(checked, torch.zeros(1, T, dtype=torch.long), None).size(-1)
        vocab_from = "the logits' size"
    embedding, embedding_from = token_embedding(model, vocab_size, options["embedding"])
    print(f"  vocab_size {vocab_size} from {vocab_from}; token embeddings from {embedding_from}")
    n, V = options["probe_length"], options["probe_vocab"]
    if options["probe"] and (n > T or V > vocab_size):
        raise ConfigError(f"the probe's {n} digits 0..{V - 1} need T >= {n} and vocab_size >= "
                          f"{V}: lower --probe_length or --probe_vocab")
    shorter = max(2, 2 * T // 3)  # and a shorter T, where the model runs at one
    lengths = [T, shorter] if shorter < T and forward_error(checked, shorter) is None else [T]
    runs = [(mode, length, None) for mode in ("eval", "train") for length in lengths]
    leak = check_settings(checked, runs, vocab_size, embedding, batch=options["batch"],
                          positions=options["positions"], seed=options["seed"])
    return judge(leak, options, lambda: FactoryModel(build_from(factory, options["seed"])),
                 options["seed"])


def read_model_options(argv):
    """The options of `--model=MODULE:FACTORY[,...] [--key=value ...]`."""
    if config_files(argv):
        raise ConfigError(f"--model checks the model its factory builds: give no config file "
                          f"({config_files(argv)[0]}) with it")
    options = configurator.merge(MODEL_DEFAULTS, {}, configurator.parse(argv)[1])
    check_least(options)
    if options["block_size"] == 1:
        raise ConfigError("block_size must be at least 2, for a position to have a future")
    for spec in options["model"].split(","):
        module_name, _, factory_name = spec.rpartition(":")
        if not module_name or not factory_name:
            raise ConfigError(f"--model={spec}: write MODULE:FACTORY, e.g. "
                              f"--model=my_models.py:tiny_gpt2 or --model=mypackage.models:build")
    return options


def check_models(argv):
    """Checks each model of --model; an error in the user's code is one line, status 2."""
    options = read_model_options(argv)
    specs = options["model"].split(",")
    failed = []
    for spec in specs:
        try:
            if not check_factory_model(spec, options):
                failed.append(spec)
        except UserError:
            raise
        except Exception as e:
            raise CheckError(f"{spec}: {in_one_line(e)}") from e
    if len(specs) > 1:
        print(f"{len(specs) - len(failed)} of {len(specs)} models causal"
              + (f"; not causal: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


# --------------------------------------------------------------------------------------


def judge(leak, options, probe_model, seed):
    """Says the exact checks' verdict, then the probe's on probe_model(); True if causal."""
    print(leak or CAUSAL)
    if leak or not options["probe"]:
        return leak is None
    print(f"probe: reversal of {options['probe_length']} digits 0..{options['probe_vocab'] - 1}")
    torch.manual_seed(seed)
    result = train_probe(probe_model(), options, seed=seed)
    report_probe(result, options["probe_vocab"])
    return result["verdict"] == "causal"


def usage(argv):
    """The docstring and both modes' keys, with the values the rest of argv gives."""
    overrides = configurator.parse(argv)[1]
    keys = [configurator.own_settings(overrides, defaults)
            for defaults in (CHECK_DEFAULTS, MODEL_DEFAULTS)]
    return (configurator.usage(__doc__, keys[0]) + "\nand every key of train.py\n\n"
            + configurator.usage("With --model=MODULE:FACTORY instead of a config file:", keys[1]))


@configurator.script
def main(argv):
    if configurator.wants_help(argv):
        print(usage(argv))
        return 0
    if "model" in configurator.parse(argv)[1]:
        return check_models(argv)
    options, original, config, user_keys = parse_args(argv)
    model_args, probe_args = plan(options, original, config, user_keys)
    # the user's own flags, apart from what the check changes to run in seconds
    flags = describe_changes(original, train.model_args_of(config))
    flags = f", with the flags' {flags}" if flags else ""
    size = "the config's own sizes" if options["full_size"] else "shrunk to run in seconds"
    changes = describe_changes(config, model_args) or "as it is"
    print(f"{config_files(argv)[0]}: {config['model_type']}{flags}, {size}: {changes}")
    leak = check(config["model_type"], model_args, batch=options["batch"],
                 positions=options["positions"], seed=config["seed"])
    causal = judge(leak, options, lambda: train.build_model(config["model_type"], probe_args),
                   config["seed"])
    return 0 if causal else 1


if __name__ == "__main__":
    sys.exit(main())
