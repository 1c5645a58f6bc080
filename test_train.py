"""
Tests of configurator.py, train.py, sample.py, report.py and config/*.py, on a CPU.

Tiny models train on random tokens written here, so nothing depends on prepare_wikipedia.py.
sample.py needs the GPT-2 tokenizer: offline, export TIKTOKEN_CACHE_DIR first.
Run: python -m pytest -q test_train.py
"""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import cli
import configurator
import data
import report
import sample
import settings
import train
from checkpoint import TRAINING_KEYS, load_checkpoint, model_from_checkpoint
from configurator import ConfigError

REPO = os.path.dirname(os.path.abspath(__file__))
VOCAB = 256  # the tokens of the data_dir fixture (conftest.py) are below this
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py
TINY = dict(vocab_size=VOCAB, block_size=16, n_layer=2, n_head=2, n_embd=32, batch_size=4,
            gradient_accumulation_steps=2, eval_iters=2, log_interval=1, compile=False,
            device="cpu", dtype="float32", warmup_iters=2, learning_rate=1e-3)
AUX_KEY = {"baseline": None, "future_attn": "future_attn_loss", "encdec": "embedding_loss"}

# the write-ups' parameter counts (report.WRITEUP): the configs must reproduce them exactly
SEED_PARAMS = {name: published["params"] for name, published in report.WRITEUP.items()}


def flags(**settings):
    return [f"--{key}={value}" for key, value in settings.items()]


def config_for(data_dir, out_dir, **overrides):
    return settings.get_config(flags(**{**TINY, "data_dir": data_dir, "out_dir": str(out_dir), **overrides}))


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """Two finished runs: a baseline with the GPT-2 vocabulary (for sample.py), a future_attn."""
    out = {}
    for model_type, vocab in (("baseline", 50257), ("future_attn", VOCAB)):
        out_dir = tmp_path_factory.mktemp(f"out-{model_type}")
        train.train(config_for(data_dir, out_dir, model_type=model_type, vocab_size=vocab, max_iters=3, eval_interval=2))
        out[model_type] = str(out_dir)
    return out


# --------------------------------------------------------------------------------------
# configurator


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "my_config.py"
    path.write_text("import math\nbatch_size = 7\nlearning_rate = 1e-3\nout_dir = 'from-file'\n"
                    "_scratch = 5\ndef helper():\n    pass\n")
    config = settings.get_config([str(path), "--batch_size=9", "--min_lr=0", "--dtype=float16", "--compile=False"])
    assert config["batch_size"] == 9  # the flag wins over the file
    assert config["learning_rate"] == 1e-3 and config["out_dir"] == "from-file"
    assert config["min_lr"] == 0.0 and isinstance(config["min_lr"], float)  # int accepted for float
    assert config["dtype"] == "float16" and config["compile"] is False
    assert config["max_iters"] == settings.DEFAULTS["max_iters"]


def test_unknown_key_lists_the_valid_keys(capsys):
    with pytest.raises(ConfigError, match="unknown key 'batch_sise'") as e:
        settings.get_config(["--batch_sise=3"])
    assert "valid keys:" in str(e.value) and "batch_size" in str(e.value)
    assert train.main(["--batch_sise=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'batch_sise'" in err and "Traceback" not in err


def test_wrong_types_are_all_reported():
    with pytest.raises(ConfigError) as e:
        settings.get_config(["--batch_size=3.5", "--compile=1", "--learning_rate=fast"])
    message = str(e.value)
    assert "batch_size=3.5" in message and "compile=1" in message and "learning_rate='fast'" in message
    with pytest.raises(ConfigError, match="flags are written --key=value"):
        configurator.parse(["--batch_size"])
    with pytest.raises(ConfigError, match="not found"):
        configurator.parse(["config/no_such_config.py"])


def test_model_keys_are_valid_only_for_their_model(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'future_dim'"):
        settings.get_config(["--future_dim=50"])  # the baseline has no future_dim
    assert settings.get_config(["--model_type=future_attn", "--future_dim=50"])["future_dim"] == 50
    path = tmp_path / "fa.py"
    path.write_text("model_type = 'future_attn'\n")
    assert settings.get_config([str(path), "--future_dim=7"])["future_dim"] == 7  # model_type from the file
    with pytest.raises(ConfigError, match="unknown key 'embedding_loss_type'"):
        settings.get_config(["--model_type=future_attn", "--embedding_loss_type=mse"])
    with pytest.raises(ConfigError, match="model_type must be one of"):
        settings.get_config(["--model_type=lstm"])
    # a value the model rejects comes back as a ConfigError naming the field
    with pytest.raises(ConfigError, match="future_dim"):
        settings.model_args_of(settings.get_config(["--model_type=future_attn", "--future_dim=500"]))


# the configs of the write-ups' next steps (README, "Next steps of the write-ups"): each is its
# base config with the settings that test the step (None: the GPT-2-sized ones, compared together)
NEXT_STEPS = {
    "future50_mse_computed": ("future50_mse", dict(future_kv="computed")),
    "baseline_possub": ("baseline", dict(sub_pos="yes")),
    "encdec_mse_possub_enc17_dec10": ("encdec_mse_possub", dict(n_layer_encoder=17, n_layer_decoder=10)),
    "encdec_mse_possub_enc9_dec16": ("encdec_mse_possub", dict(n_layer_encoder=9, n_layer_decoder=16)),
    "dropout02_encdec_mse_possub": ("encdec_mse_possub", dict(dropout=0.2)),
    "gpt2_baseline": (None, {}),
    "gpt2_future50_mse": (None, {}),
    "gpt2_encdec_mse_possub": (None, {}),
}


def test_every_config_has_a_file():
    names = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "config", "*.py"))}
    assert names == set(SEED_PARAMS) | set(NEXT_STEPS) | {"tiny_cpu"}


def config_and_model(name):
    config = settings.get_config([os.path.join(REPO, "config", f"{name}.py")])
    module = settings.MODELS[config["model_type"]]
    with torch.device("meta"):  # shapes only, no memory or init time
        return config, module.GPT(module.GPTConfig(**settings.model_args_of(config)))


@pytest.mark.parametrize("name", NEXT_STEPS)
def test_next_step_config_is_its_base_with_the_step(name):
    from test_models import NEXT_STEP_COUNTS  # counted by hand there
    config, model = config_and_model(name)
    expected = {n: count for n, _, _, count in NEXT_STEP_COUNTS}[name]
    assert model.get_num_params() == expected
    # the header states the count and the FLOPs per token of this very model
    with open(os.path.join(REPO, "config", f"{name}.py")) as f:
        header = f.read().split("\n\n")[0]
    assert f"{expected:,} parameters" in header
    assert f"{model.flops_per_token():,} training FLOPs per token" in header
    assert f"python train.py config/{name}.py" in header and "python study.py config/" in header
    assert config["out_dir"] == f"out-{name}"
    base, step = NEXT_STEPS[name]
    if base is not None:
        # everything else, training included, as in the base run
        base_config = settings.get_config([os.path.join(REPO, "config", f"{base}.py")])
        assert config == dict(base_config, **step, out_dir=f"out-{name}")


def test_gpt2_configs_compare_models_of_equal_size_on_equal_training():
    runs = {name: config_and_model(name) for name in NEXT_STEPS if name.startswith("gpt2_")}
    counts = [model.get_num_params() for _, model in runs.values()]
    assert max(counts) / min(counts) < 1.02
    model_keys = {field for module in settings.MODELS.values() for field in module.GPTConfig.__dataclass_fields__}
    training = [{k: v for k, v in config.items() if k not in model_keys | {"out_dir", "model_type"}}
                for config, _ in runs.values()]
    assert all(t == training[0] for t in training)
    assert all(c["block_size"] == 1024 and c["vocab_size"] == 50257 for c, _ in runs.values())
    config = next(iter(runs.values()))[0]
    tokens_per_step = config["batch_size"] * config["gradient_accumulation_steps"] * config["block_size"]
    assert tokens_per_step == 163_840 and config["gradient_accumulation_steps"] % 8 == 0  # 1, 2, 4 or 8 GPUs
    for config, _ in runs.values():  # head sizes multiples of 8
        assert config["n_embd"] // config["n_head"] % 8 == 0
        if config["model_type"] == "encdec":
            assert config["n_embd"] // config["cross_n_head"] % 8 == 0


@pytest.mark.parametrize("name, expected", SEED_PARAMS.items())
def test_seed_config_builds_the_seed_parameter_count(name, expected):
    config = settings.get_config([os.path.join(REPO, "config", f"{name}.py")])
    module = settings.MODELS[config["model_type"]]
    with torch.device("meta"):  # shapes only, no memory or init time
        model = module.GPT(module.GPTConfig(**settings.model_args_of(config)))
    assert model.get_num_params() == expected
    assert config["out_dir"] == f"out-{name}"
    seed_settings = dict(vocab_size=50257, block_size=200, bias=False, batch_size=50, gradient_accumulation_steps=16,
                         learning_rate=9e-4, min_lr=9e-5, warmup_iters=300, lr_decay_iters=700000, max_iters=9000,
                         weight_decay=0.1, beta1=0.9, beta2=0.95, eval_interval=500, eval_iters=200, grad_clip=0.0)
    assert {k: config[k] for k in seed_settings} == seed_settings
    assert config["dropout"] == (0.2 if name == "dropout02_baseline" else 0.0)


# --------------------------------------------------------------------------------------
# pieces of train.py


def test_lr_schedule():
    config = dict(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110, decay_lr=True)
    assert train.get_lr(0, config) == pytest.approx(1 / 11)
    assert train.get_lr(9, config) == pytest.approx(10 / 11)
    assert train.get_lr(10, config) == pytest.approx(1.0)
    assert train.get_lr(60, config) == pytest.approx(0.55)  # half way down the cosine
    assert train.get_lr(110, config) == pytest.approx(0.1) and train.get_lr(500, config) == 0.1
    assert train.get_lr(60, dict(config, decay_lr=False)) == 1.0


def test_batches_are_shifted_windows(data_dir):
    generator = torch.Generator().manual_seed(0)
    x, y = data.get_batch(data_dir, "train", generator, batch_size=3, block_size=16, device="cpu")
    tokens = np.fromfile(os.path.join(data_dir, "train.bin"), dtype=np.uint16).astype(np.int64)
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    windows = np.lib.stride_tricks.sliding_window_view(tokens, 16)  # (N - 15, 16)
    starts = np.flatnonzero((windows == x[0].numpy()).all(axis=1))  # where x[0] comes from
    assert any(np.array_equal(tokens[i + 1:i + 17], y[0].numpy()) for i in starts)


# --------------------------------------------------------------------------------------
# training runs


@pytest.mark.parametrize("model_type", ["baseline", "future_attn", "encdec"])
def test_each_model_trains_logs_and_saves(model_type, data_dir, tmp_path):
    result = train.train(config_for(data_dir, tmp_path, model_type=model_type, max_iters=4, eval_interval=2))
    assert result["iter_num"] == 4
    records = read_log(tmp_path)
    start = records[0]
    assert start["type"] == "start" and start["model_type"] == model_type and start["world_size"] == 1
    assert start["num_params"] == result["model"].get_num_params()
    assert start["tokens_per_iter"] == 2 * 4 * 16 and start["config"]["batch_size"] == 4
    trains = [r for r in records if r["type"] == "train"]
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["iter"] for r in trains] == [1, 2, 3, 4] and [r["iter"] for r in evals] == [0, 2, 4]
    for r in trains:
        assert np.isfinite(r["loss"]) and r["ms_per_iter"] > 0 and r["tokens_per_s"] > 0 and r["mfu"] is None
        expected_aux = [AUX_KEY[model_type]] if AUX_KEY[model_type] else []
        if model_type == "future_attn":  # and the loss of each future-attention layer (2 here)
            expected_aux.append("future_attn_loss_per_layer")
            per_layer = r["aux"]["future_attn_loss_per_layer"]
            assert len(per_layer) == 2 and np.mean(per_layer) == pytest.approx(r["aux"]["future_attn_loss"])
        assert list(r["aux"]) == expected_aux and all(np.isfinite(v).all() for v in r["aux"].values())
    assert all(np.isfinite(r["val_loss"]) and np.isfinite(r["train_loss"]) for r in evals)
    checkpoint = load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))
    assert checkpoint["iter_num"] == 4 and checkpoint["model_type"] == model_type
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in checkpoint["model"])
    restored = model_from_checkpoint(checkpoint)
    for name, p in result["model"].state_dict().items():
        assert torch.equal(p, restored.state_dict()[name])


def test_resume_reproduces_an_unbroken_run(data_dir, tmp_path):
    # dropout makes the losses depend on the torch RNG; 4 is no eval step, so the stopped
    # run's final evaluation must not move the training batches either
    settings = dict(model_type="future_attn", dropout=0.1, eval_interval=3)
    straight = train.train(config_for(data_dir, tmp_path / "a", max_iters=8, **settings))
    train.train(config_for(data_dir, tmp_path / "b", max_iters=4, **settings))
    resumed = train.train(config_for(data_dir, tmp_path / "b", max_iters=8, init_from="resume", **settings))
    assert resumed["iter_num"] == 8

    def after_4(records):
        return [(r["type"], r["iter"], r.get("loss"), r.get("aux"), r.get("val_loss"))
                for r in records if r["type"] != "start" and r["iter"] > 4]

    a, b = after_4(read_log(tmp_path / "a")), after_4(read_log(tmp_path / "b"))
    assert len(a) == 6 and a == b  # train 5..8 and evals at 6 and 8: the same numbers
    for name, p in straight["model"].state_dict().items():
        assert torch.equal(p, resumed["model"].state_dict()[name])


def test_resume_checks_the_model(runs, data_dir, capsys):
    out_dir = runs["baseline"]
    base = dict(max_iters=5, eval_interval=2, init_from="resume", vocab_size=50257)
    assert train.main(flags(**{**TINY, **base, "data_dir": data_dir, "out_dir": out_dir, "model_type": "encdec"})) == 1
    assert "checkpoint holds model_type 'baseline'" in capsys.readouterr().err
    assert train.main(flags(**{**TINY, **base, "data_dir": data_dir, "out_dir": out_dir, "n_layer": 3})) == 1
    err = capsys.readouterr().err
    assert "differ from the checkpoint's: n_layer (checkpoint 2, config 3)" in err and "Traceback" not in err


def test_foreign_or_missing_checkpoint_is_refused(data_dir, tmp_path, capsys):
    config = flags(**{**TINY, "data_dir": data_dir, "out_dir": str(tmp_path), "init_from": "resume"})
    assert train.main(config) == 1
    assert f"no checkpoint at {tmp_path}/ckpt.pt" in capsys.readouterr().err
    torch.save({"model": {}, "iter_num": 3}, tmp_path / "ckpt.pt")  # e.g. another trainer's file
    assert train.main(config) == 1
    assert "not a checkpoint written by train.py: it lacks format" in capsys.readouterr().err
    (tmp_path / "ckpt.pt").write_text("hello")
    assert train.main(config) == 1
    assert "not a checkpoint written by train.py" in capsys.readouterr().err


def test_missing_or_short_data_is_one_clear_message(tmp_path, capsys):
    argv = flags(**{**TINY, "data_dir": str(tmp_path), "out_dir": str(tmp_path / "out")})
    assert train.main(argv) == 1
    err = capsys.readouterr().err
    assert f"no data at {tmp_path}/train.bin — run `python prepare_wikipedia.py --out_dir {tmp_path}` first" in err
    assert "Traceback" not in err
    for split in ("train", "val"):
        np.arange(10, dtype=np.uint16).tofile(tmp_path / f"{split}.bin")
    assert train.main(argv) == 1
    assert "holds 10 tokens, fewer than block_size + 1 = 17" in capsys.readouterr().err


@pytest.mark.parametrize("model_type, poisoned", [("baseline", "loss"), ("future_attn", "future_attn_loss")])
def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(model_type, poisoned, data_dir, tmp_path,
                                                             monkeypatch, capsys):
    module = settings.MODELS[model_type]
    forward, calls = module.GPT.forward, []

    def poisoned_forward(self, idx, targets=None):
        logits, loss, aux = forward(self, idx, targets)
        if self.training:
            calls.append(1)
            if len(calls) > 6:  # micro-steps 7 and on: iteration 4 with 2 micro-steps each
                if poisoned == "loss":
                    loss = loss * float("nan")
                else:
                    aux = dict(aux, future_attn_loss=aux["future_attn_loss"] * float("inf"))
        return logits, loss, aux

    monkeypatch.setattr(module.GPT, "forward", poisoned_forward)
    argv = flags(**{**TINY, "data_dir": data_dir, "out_dir": str(tmp_path), "model_type": model_type,
                    "max_iters": 6, "eval_interval": 2})
    assert train.main(argv) == 1
    err = capsys.readouterr().err
    assert f"iteration 4: non-finite {poisoned} (" in err and "Traceback" not in err
    checkpoint = load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))
    assert checkpoint["iter_num"] == 2  # saved at the eval of step 2, never after
    assert all(torch.isfinite(p).all() for p in checkpoint["model"].values())
    assert max(r.get("iter", 0) for r in read_log(tmp_path)) == 3


def test_accumulation_must_divide_the_world_size(data_dir, tmp_path):
    config = config_for(data_dir, tmp_path, gradient_accumulation_steps=3)
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps \(3\).*world size \(2\)"):
        train.check_before_writing(config, world_size=2)


WORKER = """
import os, sys, torch
import settings, train
config = settings.get_config(sys.argv[1:])
result = train.train(config)
torch.save(result["model"].state_dict(), os.path.join(config["out_dir"], f"rank{os.environ['RANK']}.pt"))
# all done: skip the interpreter's teardown, where gloo's threads abort a process now and
# then ("terminate called without an active exception", a torch issue, not this code's)
sys.stdout.flush()
os._exit(0)
"""


def test_two_process_ddp_on_gloo(data_dir, tmp_path):
    # encdec without embedding loss owns an unused LayerNorm: DDP must be told (find_unused_parameters)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    settings = {**TINY, "data_dir": data_dir, "model_type": "encdec", "embedding_loss_type": "none",
                "ln_encoder_out": False, "dropout": 0.1, "gradient_accumulation_steps": 4,
                "max_iters": 3, "eval_interval": 3, "out_dir": str(tmp_path)}
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(worker), *flags(**settings)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = read_log(tmp_path)[0]
    assert start["world_size"] == 2 and start["tokens_per_iter"] == 4 * 4 * 16
    assert "tokens per iteration: 4 micro-steps × 4 sequences × 16 tokens = 256" in proc.stdout
    assert [r["iter"] for r in read_log(tmp_path) if r["type"] == "train"] == [1, 2, 3]
    checkpoint = load_checkpoint(os.path.join(tmp_path, "ckpt.pt"))
    assert checkpoint["iter_num"] == 3 and len(checkpoint["rng"]) == 2
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for name, p in rank0.items():  # DDP kept the replicas identical
        assert torch.equal(p, rank1[name]), name
        assert torch.equal(p, checkpoint["model"][name]), name


# --------------------------------------------------------------------------------------
# sample.py, report.py


def test_sample_from_a_checkpoint(runs, tmp_path, capsys):
    argv = ["--out_dir=" + runs["baseline"], "--device=cpu", "--num_samples=2", "--max_new_tokens=5"]
    assert sample.main(argv + ["--start=Hello world"]) == 0
    out = capsys.readouterr().out
    assert out.count("Hello world") == 2 and out.count("---------------") == 2
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Once upon a time<|endoftext|>")
    texts = sample.sample(configurator.merge(sample.DEFAULTS, *configurator.parse(argv + [f"--start=FILE:{prompt}"])))
    assert len(texts) == 2 and all(t.startswith("Once upon a time<|endoftext|>") for t in texts)


def test_sample_refuses_missing_or_foreign_checkpoint(tmp_path, capsys):
    assert sample.main([f"--out_dir={tmp_path}", "--device=cpu"]) == 1
    assert f"no checkpoint at {tmp_path}/best.pt" in capsys.readouterr().err
    torch.save({"model_args": {}}, tmp_path / "ckpt.pt")
    assert sample.main([f"--out_dir={tmp_path}", "--device=cpu"]) == 1
    err = capsys.readouterr().err
    assert "not a checkpoint written by train.py" in err and "Traceback" not in err


def test_report_table_over_two_runs(runs, tmp_path, capsys):
    assert report.main([runs["baseline"], runs["future_attn"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run", "model_type", "params"] and len(lines) == 3
    for line, model_type in zip(lines[1:], ("baseline", "future_attn")):
        params = f"{read_log(runs[model_type])[0]['num_params']:,}"
        assert line.split()[1:5] == [model_type, params, "3", f"{3 * 128:,}"]
    assert "future_attn_loss" in lines[2]
    assert report.main([runs["baseline"], str(tmp_path / "missing"), "--plot", str(tmp_path / "loss.png")]) == 1
    captured = capsys.readouterr()
    assert "missing: no log.jsonl" in captured.err and "baseline" in captured.out  # the table still prints
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "loss.png").exists()
    except ImportError:
        assert "--plot needs matplotlib" in captured.err


def test_report_plot_draws_each_future_attention_layer(runs, tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    figures, subplots = [], plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *args, **kwargs: figures.append(subplots(*args, **kwargs)) or figures[-1])
    assert report.main([runs["baseline"], runs["future_attn"], "--plot", str(tmp_path / "loss.png")]) == 0
    (fig, axes), = figures
    assert axes.shape == (1, 3)  # train loss, val loss, and one panel for the one future-attention run
    trains = [r for r in read_log(runs["future_attn"]) if r["type"] == "train"]
    lines = axes[0, 2].get_lines()
    assert len(lines) == 2  # its two layers
    for layer, line in enumerate(lines):
        assert list(line.get_xdata()) == [r["iter"] for r in trains]
        assert list(line.get_ydata()) == [r["aux"]["future_attn_loss_per_layer"][layer] for r in trains]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_saved_before_a_model_field_existed_resumes(data_dir, tmp_path):
    # a checkpoint and log written before future_kv existed: it takes its default, 'learned'
    train.train(config_for(data_dir, tmp_path, model_type="future_attn", max_iters=2, eval_interval=2))
    saved = load_checkpoint(str(tmp_path / "ckpt.pt"), TRAINING_KEYS)
    del saved["model_args"]["future_kv"]
    torch.save(saved, tmp_path / "ckpt.pt")
    result = train.train(config_for(data_dir, tmp_path, model_type="future_attn", max_iters=4, eval_interval=2,
                                    init_from="resume"))
    assert result["iter_num"] == 4
    start = read_log(tmp_path)[0]
    del start["model_args"]["future_kv"]
    assert settings.saved_model_args("future_attn", start["model_args"]) == \
        json.loads(json.dumps(settings.model_args_of(start["config"])))
    # the setting it lacks must still be the default: another value is a change of model
    with pytest.raises(cli.UserError, match=r"future_kv \(checkpoint 'learned', config 'computed'\)"):
        train.train(config_for(data_dir, tmp_path, model_type="future_attn", future_kv="computed", max_iters=6,
                               init_from="resume"))
