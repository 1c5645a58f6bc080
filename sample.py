"""
Samples text from a model that train.py trained (the checkpoint names its type).

    python sample.py --out_dir=out-tiny_cpu --start="The history of" --num_samples=5
    python sample.py --out_dir=out-encdec_mse_possub --start=FILE:prompt.txt --temperature=0.7
    python sample.py --out_dir=out-tiny_cpu --checkpoint=latest  # ckpt.pt, the latest state
    python sample.py out-tiny_cpu                                # the run folder as a word

The model is out_dir/best.pt, the evaluation with the lowest val loss, unless --checkpoint=latest
asks for ckpt.pt. Notes go to stderr and the samples alone to stdout (`> samples.txt` keeps them).
"""

import math
import os
import sys

import tiktoken
import torch

import configurator
import train
from configurator import ConfigError, UserError
from train import autocast_for, load_checkpoint, model_from_checkpoint

DEFAULTS = dict(
    out_dir="out",  # the training run to sample from
    checkpoint="best",  # 'best' (best.pt, the lowest val loss) or 'latest' (ckpt.pt)
    start="\n",  # the prompt, or FILE:path to read the prompt from a file
    num_samples=3,  # samples to draw
    max_new_tokens=200,  # tokens generated per sample
    temperature=0.8,  # > 0; below 1 sharper, above 1 more random
    top_k=200,  # sample among the top_k most likely tokens; 0 = among all, 1 = greedy
    seed=1337,
    device="cuda" if torch.cuda.is_available() else "cpu",
    dtype="auto",  # 'float32', 'bfloat16', 'float16'; auto = bf16 (else fp16) on CUDA, fp32 on CPU
    compile=False,  # torch.compile the forward pass (pays off for long samples on a GPU)
)


def read_prompt(start):
    if not start.startswith("FILE:"):
        return start
    path = start[len("FILE:"):]
    if not os.path.isfile(path):
        raise ConfigError(f"prompt file {path} not found")
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"prompt file {path} is not UTF-8 text (byte {data[e.start]:#04x} at "
                          f"offset {e.start}): save it as UTF-8") from None


def gpt2_tokenizer():
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise UserError(f"cannot load the GPT-2 tokenizer ({type(e).__name__}); offline, set "
                        "TIKTOKEN_CACHE_DIR to a folder of tiktoken's cached files") from None


def check_which(which):
    if which not in ("best", "latest"):
        raise ConfigError(f"checkpoint must be 'best' or 'latest', got {which!r}")


def model_path(out_dir, which):
    """out_dir/best.pt or ckpt.pt; a run without best.pt gives its ckpt.pt."""
    best, latest = os.path.join(out_dir, "best.pt"), os.path.join(out_dir, "ckpt.pt")
    if which == "latest":
        return latest
    if not os.path.isfile(best) and os.path.isfile(latest):
        print(f"note: {out_dir} has no best.pt; using its latest state, {latest}", file=sys.stderr)
        return latest
    return best


def read_settings(defaults, argv):
    """The settings of sample.py or visualize.py, where the checkpoint decides the model."""
    files, overrides = configurator.parse(argv)
    if "model_type" in {**files, **overrides}:
        raise ConfigError("model_type is not a setting here: the checkpoint decides the model")
    return configurator.merge(defaults, files, overrides)


def check_settings(config):
    if config["temperature"] <= 0:
        raise ConfigError(f"temperature must be > 0, got {config['temperature']} "
                          "(for greedy decoding use --top_k=1)")
    if config["top_k"] < 0:
        raise ConfigError(f"top_k must be >= 0 (0 = no limit), got {config['top_k']}")
    for key in ("num_samples", "max_new_tokens"):
        if config[key] < 1:
            raise ConfigError(f"{key} must be at least 1, got {config[key]}")
    check_which(config["checkpoint"])
    # dtype and seed follow train.py's rules
    for keys, ok, rule in train.RULES:
        for key in keys:
            if key in config and not ok(config[key]):
                raise ConfigError(f"{key} must be {rule}, got {config[key]!r}")
    train.check_device(config["device"])


def provenance(path, checkpoint):
    """One line; ckpt.pt may be past the best evaluation, so its val loss is the best so far."""
    best = checkpoint["best_val_loss"]
    if not math.isfinite(best):
        val = "no val loss yet"
    elif os.path.basename(path) == "best.pt":
        val = f"val loss {best:.4f}"
    else:
        val = f"best val loss so far {best:.4f}"
    model_type, iter_num = checkpoint["model_type"], checkpoint["iter_num"]
    return f"sampling from {path}: {model_type} at iteration {iter_num:,}, {val}"


def compiled_forward(model, backend="inductor"):
    """Dynamic shapes: generate() calls the model at every length up to block_size."""
    return torch.compile(model.forward, dynamic=True, backend=backend)


def sample(config):
    """num_samples texts, each the prompt followed by max_new_tokens sampled tokens."""
    prompt = read_prompt(config["start"])
    path = model_path(config["out_dir"], config["checkpoint"])
    checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint)
    print(provenance(path, checkpoint), file=sys.stderr)
    del checkpoint
    device = config["device"]
    train.use_device(device)  # before autocast_for reads its bf16 support
    _, autocast = autocast_for(config["dtype"], torch.device(device).type)
    model.eval().to(device)
    if config["compile"]:
        model.forward = compiled_forward(model)

    enc = gpt2_tokenizer()
    ids = enc.encode(prompt, allowed_special={"<|endoftext|>"})
    if not ids:
        raise ConfigError("the prompt is empty: give --start some text")
    if max(ids) >= model.config.vocab_size:
        raise ConfigError("the prompt has GPT-2 tokens beyond this model's vocab_size "
                          f"({model.config.vocab_size})")
    if len(ids) > model.config.block_size:  # generate() feeds the model the last block_size tokens
        print(f"note: the prompt has {len(ids):,} tokens; the model sees only the last "
              f"{model.config.block_size}, its block_size", file=sys.stderr)
    x = torch.tensor(ids, dtype=torch.long, device=device)[None, :]  # (1, T)

    torch.manual_seed(config["seed"])
    texts = []
    with torch.no_grad(), autocast:
        for _ in range(config["num_samples"]):
            y = model.generate(x, config["max_new_tokens"], temperature=config["temperature"],
                               top_k=config["top_k"] or None)
            texts.append(enc.decode(y[0].tolist()))
    return texts


@configurator.script
def main(argv):
    """Command-line entry: returns the exit status (2 for a bad setting, 1 for other errors)."""
    runs, rest = configurator.take_runs(argv)  # out-x or --out_dir=out-x
    if len(runs) > 1:
        raise ConfigError(f"one run to sample from, not {len(runs)}: {' '.join(runs)}")
    config = read_settings(DEFAULTS, rest + [f"--out_dir={run}" for run in runs])
    if configurator.wants_help(argv):  # with the values the rest of argv gives
        print(configurator.usage(__doc__, config))
        return 0
    check_settings(config)
    for text in sample(config):
        print(text)
        print("---------------")
    return 0


if __name__ == "__main__":
    sys.exit(main())
