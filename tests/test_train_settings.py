"""
Tests of train.py's settings and the config files it reads: each model's own keys, the checks
that refuse a bad setting before training in one line, --help with a config's values, the
shipped configs (the write-ups' parameter counts and settings, the next steps' bases), and the
GPU peaks that MFU is measured against.
Run: python -m pytest -q tests/test_train_settings.py
"""

import glob
import os
import re
import shlex

import pytest
import torch

import check_causal
import report
import train
from configurator import ConfigError
from conftest import NEXT_STEP_COUNTS, NEXT_STEPS, REPO, argv_for, last_error

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

# the write-ups' parameter counts (report.WRITEUP): the configs must reproduce them exactly
SEED_PARAMS = {name: published["params"] for name, published in report.WRITEUP.items()}


# --------------------------------------------------------------------------------------
# settings: each model's keys, the checks


def test_model_keys_are_valid_only_for_their_model(tmp_path):
    # a key of another model names that model
    with pytest.raises(ConfigError, match="^future_dim is a key of model_type future_attn, not of baseline: add "
                                          "--model_type=future_attn$"):
        train.get_config(["--future_dim=50"])  # the baseline has no future_dim
    with pytest.raises(ConfigError, match="^sub_pos is a key of model_type baseline and encdec, not of future_attn"):
        train.get_config(["--model_type=future_attn", "--sub_pos=yes"])
    with pytest.raises(ConfigError, match="^unknown key n_layers; did you mean n_layer"):  # a key of no model
        train.get_config(["--n_layers=3"])
    assert train.get_config(["--model_type=future_attn", "--future_dim=50"])["future_dim"] == 50
    path = tmp_path / "fa.py"
    path.write_text("model_type = 'future_attn'\n")
    assert train.get_config([str(path), "--future_dim=7"])["future_dim"] == 7  # model_type from the file
    with pytest.raises(ConfigError, match="embedding_loss_type is a key of model_type encdec"):
        train.get_config(["--model_type=future_attn", "--embedding_loss_type=mse"])
    with pytest.raises(ConfigError, match="model_type must be one of"):
        train.get_config(["--model_type=lstm"])
    # a value the model rejects comes back as a ConfigError naming the field
    with pytest.raises(ConfigError, match="future_dim"):
        train.model_args_of(train.get_config(["--model_type=future_attn", "--future_dim=500"]))


@pytest.mark.parametrize("setting, message", [
    ("--learning_rate=0", "learning_rate must be > 0"),
    ("--learning_rate=-1e-3", "learning_rate must be > 0"),
    ("--beta1=1.0", "beta1 must be in [0, 1)"),
    ("--beta2=-0.1", "beta2 must be in [0, 1)"),
    ("--seed=-1", "seed must be >= 0"),
    ("--max_iters=-5", "max_iters must be >= 0"),
    ("--warmup_iters=700000", "warmup_iters must be below lr_decay_iters, or set --decay_lr=False"),
    ("--min_lr=0.1", "min_lr must not exceed learning_rate"),
    ("--dtype=half", "dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got 'half'"),
    ("--device=gpu", "device='gpu' is not a device name: the names are cpu, cuda, cuda:N (the GPU numbered N) and mps"),
    ("--device=CPU", "device='CPU' is not a device name"),
    ("--device=cpu:0", "device='cpu:0' is not a device name"),
    pytest.param("--device=cuda", "device='cuda' is not on this machine",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_bad_setting_is_one_line(setting, message, data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, lr_decay_iters=700000) + [setting]) == 2
    err = last_error(capsys)
    assert message in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "log.jsonl")


def documented_train_commands():
    """The arguments of every `python train.py config/NAME.py ...` command in the README, docs/,
    config/ and train.py's docstring, a shell variable or placeholder left out."""
    names = ["README.md", "train.py", *glob.glob("docs/*.md", root_dir=REPO), *glob.glob("config/*.py", root_dir=REPO)]
    commands = []
    for name in names:
        with open(os.path.join(REPO, name), encoding="utf-8") as f:
            text = re.sub(r"\\\n[#\s]*", " ", f.read())  # a command wrapped with a backslash
        for match in re.finditer(r"python train\.py (config/\w+\.py[^`#\n|]*)", text):
            argv = [word for word in shlex.split(match[1]) if "$" not in word and "<" not in word]
            if os.path.exists(os.path.join(REPO, argv[0])):  # not config/X.py, a placeholder
                commands.append(argv)
    return commands


def test_every_documented_train_command_is_accepted(monkeypatch):
    # a flag of another script (prepare's --detokenize) or a key of another model in a
    # documented command is refused, as a user typing it would be
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(train, "check_device", lambda device: None)  # the GPU commands too
    commands = documented_train_commands()
    assert ["config/tiny_cpu.py", "--data_dir=data/mytext"] in commands and len(commands) > 30
    for argv in commands:
        train.get_config(argv)
    with pytest.raises(ConfigError, match="unknown key detokenize"):
        train.get_config(["config/tiny_cpu.py", "--data_dir=data/mytext", "--detokenize"])


def test_warmup_as_long_as_decay_fails_before_training_not_after(data_dir, tmp_path, capsys):
    # it used to divide by zero once training reached lr_decay_iters
    argv = argv_for(data_dir, tmp_path, warmup_iters=3, lr_decay_iters=3, max_iters=5)
    assert train.main(argv) == 2
    assert "warmup_iters must be below lr_decay_iters" in last_error(capsys)
    assert train.main(argv + ["--decay_lr=False"]) == 0


def test_train_help_shows_the_values_a_config_gives(capsys):
    assert train.main([os.path.join(REPO, "config/future50_mse.py"), "--max_iters=7", "-h"]) == 0
    out = capsys.readouterr().out
    # the other models' keys are one flag away, and the two-node lines stay two lines
    assert out.rstrip().endswith("The other models' keys: --model_type=baseline --help and --model_type=encdec --help")
    first_node = next(line for line in out.splitlines() if "--nnodes=2" in line)
    assert first_node.endswith("\\") and "--master_port" not in first_node
    assert "--future_dim=50" in out and "--max_iters=7" in out and "--model_type='future_attn'" in out


# --------------------------------------------------------------------------------------
# the config files


def test_every_config_has_a_file():
    names = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "config", "*.py"))}
    assert names == set(SEED_PARAMS) | set(NEXT_STEPS) | set(CPU_STUDY) | {"tiny_cpu"}


def config_and_model(name):
    config = train.get_config([os.path.join(REPO, "config", f"{name}.py")])
    module = train.MODELS[config["model_type"]]
    with torch.device("meta"):  # shapes only, no memory or init time
        return config, module.GPT(module.GPTConfig(**train.model_args_of(config)))


def shrunk_configs():
    """(config names, model_type, model args) of every config, shrunk as check_causal.py shrinks
    them (a few layers, block_size 16, a small vocabulary), configs of equal shrunk models once."""
    models = {}
    for path in sorted(glob.glob(os.path.join(REPO, "config", "*.py"))):
        config = train.get_config([path])
        sizes = check_causal.shrunk_sizes(config, config, set(), block_size=16, vocab_size=64)
        model_args = check_causal.model_args_for(config, sizes)
        key = (config["model_type"], tuple(sorted(model_args.items())))
        models.setdefault(key, []).append(os.path.basename(path)[:-3])
    return [("+".join(names), model_type, dict(args)) for (model_type, args), names in models.items()]


SHRUNK_CONFIGS = shrunk_configs()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("model_type, model_args", [c[1:] for c in SHRUNK_CONFIGS], ids=[c[0] for c in SHRUNK_CONFIGS])
def test_every_config_compiles_to_one_graph(model_type, model_args):
    # what train.py compiles on a GPU, traced on a CPU: fullgraph=True fails at any graph break,
    # in training (forward with the auxiliary losses, backward) and in evaluation
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = train.build_model(model_type, model_args)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    idx = torch.randint(model_args["vocab_size"], (2, model_args["block_size"]))
    compiled(idx, idx)[1].backward()
    model.eval()
    with torch.no_grad():
        compiled(idx, idx)


@pytest.mark.parametrize("name", NEXT_STEPS)
def test_next_step_config_is_its_base_with_the_step(name):
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
        base_config = train.get_config([os.path.join(REPO, "config", f"{base}.py")])
        assert config == dict(base_config, **step, out_dir=f"out-{name}")


def test_gpt2_configs_compare_models_of_equal_size_on_equal_training():
    runs = {name: config_and_model(name) for name in NEXT_STEPS if name.startswith("gpt2_")}
    counts = [model.get_num_params() for _, model in runs.values()]
    assert max(counts) / min(counts) < 1.02
    model_keys = {field for module in train.MODELS.values() for field in module.GPTConfig.__dataclass_fields__}
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
    config = train.get_config([os.path.join(REPO, "config", f"{name}.py")])
    module = train.MODELS[config["model_type"]]
    with torch.device("meta"):  # shapes only, no memory or init time
        model = module.GPT(module.GPTConfig(**train.model_args_of(config)))
    assert model.get_num_params() == expected
    assert config["out_dir"] == f"out-{name}"
    seed_settings = dict(vocab_size=50257, block_size=200, bias=False, batch_size=50, gradient_accumulation_steps=16,
                         learning_rate=9e-4, min_lr=9e-5, warmup_iters=300, lr_decay_iters=700000, max_iters=9000,
                         weight_decay=0.1, beta1=0.9, beta2=0.95, eval_interval=500, eval_iters=200, grad_clip=0.0)
    assert {k: config[k] for k in seed_settings} == seed_settings
    assert config["dropout"] == (0.2 if name == "dropout02_baseline" else 0.0)


# the three models in miniature for a CPU (docs/results.md), and their parameter counts
CPU_STUDY = {"cpu_baseline": 7_220_480, "cpu_future16_mse": 7_284_992, "cpu_encdec_mse_possub": 7_239_456}


def test_the_cpu_configs_are_the_writeups_best_runs_in_miniature_on_equal_terms():
    runs = {name: config_and_model(name) for name in CPU_STUDY}
    base_config, base_model = runs["cpu_baseline"]
    for name, (config, model) in runs.items():
        assert model.get_num_params() == CPU_STUDY[name]
        assert abs(model.get_num_params() / base_model.get_num_params() - 1) < 0.01  # within 1%
        with open(os.path.join(REPO, "config", f"{name}.py")) as f:
            header = f.read().split("\n\n")[0]  # its count and FLOPs, as the next steps' headers
        assert f"{CPU_STUDY[name]:,} parameters" in header
        assert f"{model.flops_per_token():,} training FLOPs per token" in header
        assert config["out_dir"] == f"out-{name}" and config["vocab_size"] == 50257  # GPT-2's tokens
        # the same data and training, token for token; only the model differs
        training = [key for key in train.DEFAULTS if key not in ("model_type", "out_dir")]
        assert {key: config[key] for key in training} == {key: base_config[key] for key in training}
        assert config["block_size"] == base_config["block_size"] == 64
    future = runs["cpu_future16_mse"][0]  # the write-ups' best: a quarter of the context, MSE
    assert (future["future_dim"], future["future_attn_loss_type"]) == (16, "mse")
    encdec = runs["cpu_encdec_mse_possub"][0]  # MSE embedding loss and position subtraction
    assert (encdec["embedding_loss_type"], encdec["sub_pos"], encdec["embedding_loss_coeff"]) == ("mse", "yes", 8.0)


# --------------------------------------------------------------------------------------
# the machine


@pytest.mark.parametrize("name, flops", [
    ("NVIDIA H100 80GB HBM3", 989.4e12),  # SXM
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989.4e12),
    ("NVIDIA H200 NVL", 835e12),
    ("NVIDIA GH200 480GB", 989.4e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100-PCIE-40GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA H100 PCIE", 756e12),  # NVIDIA's capitals vary (A100-PCIE, A100 80GB PCIe)
])
def test_peak_flops_by_device_name(name, flops, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert train.peak_flops("cuda") == flops


def test_an_unknown_gpu_or_a_cpu_gets_no_mfu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 4090")
    assert train.peak_flops("cuda") is None and train.peak_flops("cpu") is None


def test_a_model_setting_a_flag_makes_impossible_is_one_line(tmp_path, capsys):
    # a config that sets end_layer, then a flag that shrinks the model below it
    config = tmp_path / "deep.py"
    config.write_text("model_type = 'future_attn'\nn_layer = 6\nend_layer = 6\n")
    assert train.main([str(config), "--n_layer=2", "--device=cpu"]) == 2
    err = last_error(capsys)
    assert err.startswith("error: end_layer") and err.count("\n") == 1


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "config", "*.py"))), ids=os.path.basename)
def test_every_config_builds_with_fewer_layers(path):
    # a config says only what differs from the defaults: --n_layer shrinks any of them
    for n_layer in (1, 2):
        args = train.model_args_of(train.get_config([path, f"--n_layer={n_layer}"]))
        if "end_layer" in args:
            assert args["end_layer"] == n_layer
