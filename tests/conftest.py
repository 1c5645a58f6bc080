"""
What several test files share: the random-token data, tiny models and tiny training settings,
the helpers that run train.py and read what it wrote, and the hand counts of the write-ups'
models. A helper one file alone uses stays in that file; no test file imports another.
"""

import json
import os
import struct
import queue
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest
import torch

import model_baseline as base
import model_encdec as ed
import model_future_attn as fa
import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, above tests/
DATA_VOCAB = 256  # the data_dir fixture's tokens are below this


def pytest_collection_modifyitems(config, items):
    """A test marked `cuda` needs a CUDA GPU: skipped without one. `python -m pytest -m cuda`
    selects them all, on a GPU machine."""
    if not torch.cuda.is_available():
        for item in items:
            if item.get_closest_marker("cuda"):
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (python -m pytest -m cuda)"))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread: a second one only waits at every op, the more
    so on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A data folder as prepare_wikipedia.py writes it, of random tokens below DATA_VOCAB:
    5,000 in train.bin, 1,000 in val.bin."""
    path = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    for split, n_tokens in (("train", 5000), ("val", 1000)):
        rng.integers(0, DATA_VOCAB, n_tokens).astype(np.uint16).tofile(path / f"{split}.bin")
    return str(path)


# --------------------------------------------------------------------------------------
# tiny models: their fields, and every option that changes the forward pass

TINY_MODEL = dict(vocab_size=61, block_size=12, n_layer=2, n_head=4, n_embd=32, dropout=0.0)

def tiny(module, sizes=TINY_MODEL, **overrides):
    """A model of module (model_baseline, model_future_attn, model_encdec) with the tiny sizes
    and overrides, its weights drawn from seed 0."""
    torch.manual_seed(0)
    return module.GPT(module.GPTConfig(**{**sizes, **overrides}))


# every model and every option that changes the forward pass (or the training loss)
MODEL_VARIANTS = {
    "baseline": (base, {}),
    "baseline_bias": (base, dict(bias=True)),
    # sub_pos 'yes_ln' is 'yes', then a LayerNorm
    "baseline_sub_yes_ln_bias": (base, dict(sub_pos="yes_ln", bias=True)),
    "fa_full": (fa, {}),
    "fa_fd1": (fa, dict(future_dim=1)),
    "fa_fd3_cosine": (fa, dict(future_dim=3, future_attn_loss_type="cosine")),
    "fa_layer2_only": (fa, dict(n_layer=3, start_layer=2, end_layer=2, future_dim=4)),
    "fa_bias": (fa, dict(bias=True, future_dim=5)),
    "fa_not_detached": (fa, dict(future_dim=3, detach_future_ground_truth=False)),
    "fa_computed": (fa, dict(future_kv="computed")),
    "fa_computed_fd3_bias": (fa, dict(future_kv="computed", future_dim=3, bias=True)),
    "ed_default": (ed, {}),
    "ed_sub_no": (ed, dict(sub_pos="no")),
    "ed_sub_yes_ln": (ed, dict(sub_pos="yes_ln")),
    "ed_alt": (ed, dict(order="alt")),
    "ed_add_pos": (ed, dict(add_pos_to_decoder=True, sub_pos="no")),
    "ed_ln_bridge_bias": (ed, dict(ln_before_bridge=True, bias=True, cross_n_head=2)),
    "ed_loss_none": (ed, dict(embedding_loss_type="none", ln_encoder_out=False)),
    "ed_cosine_detach_emb": (ed, dict(embedding_loss_type="cosine", detach="embedding")),
    "ed_logcos_avg": (ed, dict(embedding_loss_type="log_cosine", embedding_ln="avg",
                               detach="none")),
    "ed_mse_no_ln": (ed, dict(embedding_ln="none", ln_encoder_out=False)),
    "ed_enc3_dec1": (ed, dict(n_layer_encoder=3, n_layer_decoder=1)),
}


# --------------------------------------------------------------------------------------
# the write-ups' models, counted by hand: test_models.py builds them, test_train_settings.py their configs

SEED_SHAPE = dict(vocab_size=50257, block_size=200, bias=False, dropout=0.0)
ENCDEC_SHAPE = dict(SEED_SHAPE, n_embd=150, n_head=5, n_layer=13, cross_n_head=10)
ENCDEC_NO_LOSS = dict(embedding_loss_type="none", ln_encoder_out=False, embedding_ln="init")
SEED_COUNTS = [
    ("baseline", base, dict(SEED_SHAPE, n_embd=160, n_head=10, n_layer=26), 16_036_800),
    ("smaller_baseline", base, dict(SEED_SHAPE, n_embd=156, n_head=12, n_layer=26), 15_441_192),
    ("dropout02_baseline", base, dict(SEED_SHAPE, n_embd=160, n_head=10, n_layer=26, dropout=0.2),
     16_036_800),
    ("future50_cosine", fa, dict(SEED_SHAPE, n_embd=144, n_head=9, n_layer=28, future_dim=50,
                                 future_attn_loss_type="cosine"), 15_817_248),
    ("future50_mse", fa, dict(SEED_SHAPE, n_embd=144, n_head=9, n_layer=28, future_dim=50),
     15_817_248),
    ("future100_mse", fa, dict(SEED_SHAPE, n_embd=144, n_head=9, n_layer=28, future_dim=100),
     15_817_248),
    ("encdec_cosine", ed, dict(ENCDEC_SHAPE, embedding_loss_type="cosine", sub_pos="no"),
     15_763_500),
    ("encdec_mse", ed, dict(ENCDEC_SHAPE, embedding_loss_type="mse", sub_pos="no"), 15_763_500),
    ("encdec_plain", ed, dict(ENCDEC_SHAPE, **ENCDEC_NO_LOSS, sub_pos="no"), 15_763_200),
    ("encdec_possub", ed, dict(ENCDEC_SHAPE, **ENCDEC_NO_LOSS, sub_pos="yes"), 15_763_200),
    ("encdec_mse_possub", ed, dict(ENCDEC_SHAPE, embedding_loss_type="mse",
                                   embedding_loss_coeff=8.0, sub_pos="yes"), 15_763_500),
]


# the configurations of the write-ups' next steps (config/*.py), counted by hand from the
# seed counts above: K_offset and V_offset replace K_future and V_future (2·H·fd·hs = 2·d·fd
# per layer instead of 2·d·(C-1)); an encoder block is 12d² + 2d, a decoder block 16d² + 4d
GPT2_SHAPE = dict(vocab_size=50257, block_size=1024, bias=False, dropout=0.0)


def encoder_block(d):
    return 12 * d * d + 2 * d  # qkv 3d², out d², MLP 8d², two LayerNorm gains


def decoder_block(d):
    return 16 * d * d + 4 * d  # and the cross-attention: q d², kv 2d², out d²; four LayerNorm gains


NEXT_STEP_COUNTS = [
    ("future50_mse_computed", fa, dict(SEED_SHAPE, n_embd=144, n_head=9, n_layer=28, future_dim=50,
                                       future_kv="computed"),
     15_817_248 - 28 * 2 * 144 * (199 - 50)),
    ("baseline_possub", base, dict(SEED_SHAPE, n_embd=160, n_head=10, n_layer=26, sub_pos="yes"),
     16_036_800),
    ("baseline_possub_ln", base, dict(SEED_SHAPE, n_embd=160, n_head=10, n_layer=26,
                                      sub_pos="yes_ln"),
     16_036_800 + 160),
    ("encdec_mse_possub_enc17_dec10", ed, dict(ENCDEC_SHAPE, embedding_loss_coeff=8.0,
                                               n_layer_encoder=17, n_layer_decoder=10),
     15_763_500 + 4 * encoder_block(150) - 3 * decoder_block(150)),
    ("encdec_mse_possub_enc9_dec16", ed, dict(ENCDEC_SHAPE, embedding_loss_coeff=8.0,
                                              n_layer_encoder=9, n_layer_decoder=16),
     15_763_500 - 4 * encoder_block(150) + 3 * decoder_block(150)),
    ("dropout02_encdec_mse_possub", ed, dict(ENCDEC_SHAPE, embedding_loss_coeff=8.0, dropout=0.2),
     15_763_500),
    ("gpt2_baseline", base, dict(GPT2_SHAPE, n_embd=768, n_head=12, n_layer=12),
     50257 * 768 + 12 * encoder_block(768) + 768),
    ("gpt2_future50_mse", fa, dict(GPT2_SHAPE, n_embd=704, n_head=11, n_layer=12, future_dim=50),
     50257 * 704 + 12 * (encoder_block(704) + 2 * 704 * 1023) + 704),
    ("gpt2_encdec_mse_possub", ed, dict(GPT2_SHAPE, n_embd=720, n_head=9, n_layer=6,
                                        cross_n_head=18, embedding_loss_coeff=8.0),
     50257 * 720 + 6 * encoder_block(720) + 6 * decoder_block(720) + 720 * 720 + 720 + 2 * 2 * 720),
]


# the configs of the write-ups' next steps (README, "Next steps of the write-ups"): each is its
# base config with the settings that test the step (None: the GPT-2-sized ones, compared together)
NEXT_STEPS = {
    "future50_mse_computed": ("future50_mse", dict(future_kv="computed")),
    "baseline_possub": ("baseline", dict(sub_pos="yes")),
    "encdec_mse_possub_enc17_dec10": ("encdec_mse_possub",
                                      dict(n_layer_encoder=17, n_layer_decoder=10)),
    "encdec_mse_possub_enc9_dec16": ("encdec_mse_possub",
                                     dict(n_layer_encoder=9, n_layer_decoder=16)),
    "dropout02_encdec_mse_possub": ("encdec_mse_possub", dict(dropout=0.2)),
    "gpt2_baseline": (None, {}),
    "gpt2_future50_mse": (None, {}),
    "gpt2_encdec_mse_possub": (None, {}),
}


# --------------------------------------------------------------------------------------
# training: tiny settings, flags, and what a run wrote

# a few milliseconds per step on a CPU
TINY = dict(vocab_size=DATA_VOCAB, block_size=16, n_layer=2, n_head=2, n_embd=32, batch_size=4,
            gradient_accumulation_steps=2, eval_iters=2, log_interval=1, compile=False,
            device="cpu", dtype="float32", warmup_iters=2, learning_rate=1e-3)


def flags(**settings):
    return [f"--{key}={value}" for key, value in settings.items()]


def argv_for(data_dir, out_dir, **overrides):
    return flags(**{**TINY, "data_dir": data_dir, "out_dir": str(out_dir), **overrides})


def config_for(data_dir, out_dir, **overrides):
    return train.get_config(argv_for(data_dir, out_dir, **overrides))


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def flip_bits(path, bits=3):
    """Flip `bits` bits in the middle of the largest tensor's bytes of a checkpoint train.py wrote,
    as a failing disk or a bad copy does: the zip container stays whole, the CRC32 no longer
    fits."""
    with zipfile.ZipFile(path) as archive:
        tensors = [info for info in archive.infolist() if "/data/" in info.filename]
        member = max(tensors, key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        # offset 26 of the zip local header holds the lengths of the name and the extra field;
        # the name, the extra field and then the tensor's bytes follow from offset 30
        f.seek(member.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        start = member.header_offset + 30 + name_len + extra_len + member.file_size // 2
        f.seek(start)
        damaged = bytes(byte ^ (1 << bit) for byte, bit in zip(f.read(bits), range(bits)))
        f.seek(start)
        f.write(damaged)
    return member.filename


def last_error(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def trained_runs(data_dir, tmp_path_factory):
    """Two finished runs: a baseline with the GPT-2 vocabulary (for sample.py), a future_attn."""
    out = {}
    for model_type, vocab in (("baseline", 50257), ("future_attn", DATA_VOCAB)):
        out_dir = tmp_path_factory.mktemp(f"out-{model_type}")
        train.train(config_for(data_dir, out_dir, model_type=model_type, vocab_size=vocab,
                               max_iters=3, eval_interval=2))
        out[model_type] = str(out_dir)
    return out


# --------------------------------------------------------------------------------------
# train.py and study.py as processes, to be signalled

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def start(argv, launcher=(sys.executable, "train.py"), env=ENV):
    return subprocess.Popen([*launcher, *argv], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(condition, process, timeout=90):
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, f"ended before the signal: {process.communicate()}"
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def line_reader(stream):
    """The lines of a process's pipe, in a queue a thread fills, so a test can wait for one with a
    timeout (None marks the end)."""
    lines = queue.Queue()

    def read():
        for line in stream:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    return lines


def next_line_with(lines, text, timeout):
    """The next line of a line_reader that holds text, within timeout seconds."""
    deadline = time.time() + timeout
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.time(), 0))
        except queue.Empty:
            raise AssertionError(f"no line with {text!r} within {timeout} s") from None
        assert line is not None, f"the output ended without a line with {text!r}"
        if text in line:
            return line


def trained_to(out_dir, iteration):
    """A condition: the log holds a train record at `iteration` or later."""
    def condition():
        try:
            with open(os.path.join(out_dir, "log.jsonl")) as f:
                return any(json.loads(line).get("iter", -1) >= iteration for line in f
                           if line.endswith("\n") and '"type": "train"' in line)
        except FileNotFoundError:
            return False
    return condition
