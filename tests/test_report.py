"""
Tests of report.py: the table over runs, its plot, log lines cut off mid-write, and the
write-ups' published numbers beside a run of a write-up config. Runs trained here on a CPU
(conftest.py's trained_runs) or logs written here.
Run: python -m pytest -q test_report.py
"""

import json
import os
import subprocess
import sys

import pytest

import prepare_wikipedia
import report
import train
from conftest import NEXT_STEPS, REPO, argv_for, read_log

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# --------------------------------------------------------------------------------------
# the table and the plot of trained runs


def test_report_table_over_two_runs(trained_runs, tmp_path, capsys):
    assert report.main([trained_runs["baseline"], trained_runs["future_attn"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run", "model_type", "params"] and len(lines) == 3
    for line, model_type in zip(lines[1:], ("baseline", "future_attn")):
        params = f"{read_log(trained_runs[model_type])[0]['num_params']:,}"
        assert line.split()[1:5] == [model_type, params, "3", f"{3 * 128:,}"]
    assert "future_attn_loss" in lines[2]
    assert report.main([trained_runs["baseline"], str(tmp_path / "missing"), "--plot", str(tmp_path / "loss.png")]) == 1
    captured = capsys.readouterr()
    assert "missing: no log.jsonl" in captured.err and "baseline" in captured.out  # the table still prints
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "loss.png").exists()
    except ImportError:
        assert "--plot needs matplotlib" in captured.err


def test_tokens_are_counted_launch_by_launch(data_dir, tmp_path, capsys):
    # 2 steps of 2 × 4 sequences × 16 tokens, then 2 steps of 2 × 8 × 16 after a resume
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    assert train.main(argv_for(data_dir, tmp_path, max_iters=4, eval_interval=2, batch_size=8, init_from="resume")) == 0
    capsys.readouterr()
    assert report.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[3:5] == ["4", f"{2 * 128 + 2 * 256:,}"]


def test_an_eval_only_evaluation_is_a_note_not_the_runs_numbers(data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    assert train.main(argv_for(data_dir, tmp_path, init_from="resume", eval_only=True, eval_iters=3)) == 0
    run_eval, eval_only = [r for r in read_log(tmp_path) if r["type"] in ("eval", "eval_only")][-2:]
    assert eval_only["type"] == "eval_only" and eval_only["val_loss"] != run_eval["val_loss"]
    capsys.readouterr()
    assert report.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[6] == f"{run_eval['val_loss']:.3f}"  # the run's own last evaluation
    assert lines[2:] == [f"note: {tmp_path.name}: evaluated with --eval_only (not the run's numbers) at iter 2 "
                         f"on {data_dir}: "
                         f"train loss {eval_only['train_loss']:.3f}, val loss {eval_only['val_loss']:.3f}"]


def test_report_plot_draws_each_future_attention_layer(trained_runs, tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    figures, subplots = [], plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *args, **kwargs: figures.append(subplots(*args, **kwargs)) or figures[-1])
    assert report.main([trained_runs["baseline"], trained_runs["future_attn"], "--plot", str(tmp_path / "loss.png")]) == 0
    (fig, axes), = figures
    assert axes.shape == (1, 3)  # train loss, val loss, and one panel for the one future-attention run
    trains = [r for r in read_log(trained_runs["future_attn"]) if r["type"] == "train"]
    lines = axes[0, 2].get_lines()
    assert len(lines) == 2  # its two layers
    for layer, line in enumerate(lines):
        assert list(line.get_xdata()) == [r["iter"] for r in trains]
        assert list(line.get_ydata()) == [r["aux"]["future_attn_loss_per_layer"][layer] for r in trains]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------
# logs written here: cut-off lines, the write-ups' numbers beside a run's


def write_log(out_dir, records, tail=""):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "log.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + tail)


def fake_run(config_argv, iters=300, val_loss=3.7, data=None):
    """Records of a run of the model that config_argv gives, as train.py logs them; data: the
    identity of its data (train.check_data's), by default a folder of other data."""
    config = train.get_config(config_argv)
    data = data or {"data_dir": "data/mine", "train_sha256": "1" * 64, "val_sha256": "2" * 64}
    start = dict(type="start", model_type=config["model_type"], num_params=123, world_size=1,
                 tokens_per_iter=160_000, iter_num=0, init_from="scratch", config=config,
                 model_args=train.model_args_of(config), time=0.0, data=data)
    aux = {"future_attn_loss": 0.09} if config["model_type"] == "future_attn" else {}
    return [start, dict(type="train", iter=iters, loss=3.5, aux=aux, time=10.0),
            dict(type="eval", iter=iters, train_loss=3.6, val_loss=val_loss, best_val_loss=val_loss, saved=True, time=12.0)]


def test_report_skips_cut_off_lines(tmp_path, capsys):
    records = fake_run([os.path.join(REPO, "config/tiny_cpu.py")])
    write_log(tmp_path / "end", records, tail='{"type": "train", "it')  # killed mid-write
    broken_middle = records + [dict(records[0], iter_num=300, init_from="resume", time=20.0),
                               dict(records[2], iter=310, val_loss=3.5, time=30.0)]
    write_log(tmp_path / "middle", [])
    with open(tmp_path / "middle" / "log.jsonl", "w") as f:  # a resumed launch appended after a cut-off line
        f.write("".join(json.dumps(r) + "\n" for r in records) + '{"type": "tr\n'
                + "".join(json.dumps(r) + "\n" for r in broken_middle[3:]))
    assert report.main([str(tmp_path / "end"), str(tmp_path / "middle")]) == 0
    captured = capsys.readouterr()
    assert f"warning: {tmp_path}/end/log.jsonl, line 4: not a JSON record" in captured.err
    assert f"warning: {tmp_path}/middle/log.jsonl, line 4: not a JSON record" in captured.err
    rows = {line.split()[0]: line.split() for line in captured.out.splitlines()[1:]}
    assert rows["end"][6] == "3.700" and rows["middle"][3:7] == ["310", "49,600,000", "3.600", "3.500"]


def test_report_shows_the_writeup_beside_a_writeup_config_run(tmp_path, capsys):
    write_log(tmp_path / "mine", fake_run([os.path.join(REPO, "config/future50_mse.py"), "--max_iters=300",
                                           "--data_dir=elsewhere", "--seed=5"]))
    write_log(tmp_path / "full", fake_run([os.path.join(REPO, "config/encdec_plain.py")], iters=9000))
    write_log(tmp_path / "other", fake_run([os.path.join(REPO, "config/future50_mse.py"), "--future_dim=49"]))
    assert report.main([str(tmp_path / name) for name in ("mine", "full", "other")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [["mine", "future_attn"], ["write-up:", "future50_mse"],
                                                         ["full", "encdec"], ["write-up:", "encdec_plain"],
                                                         ["other", "future_attn"],
                                                         ["note:", "mine"]]
    other_data = ["not", "the", "write-up's", "data:", "data/mine"]
    assert lines[2].split()[2:] == ["15,817,248", "9000", "1,440,000,000", "3.017", "3.419",
                                    "future_attn_loss", "0.07681", *other_data]
    assert lines[4].split()[2:] == ["15,763,200", "9000", "1,440,000,000", "3.043", "3.413", "-",
                                    *other_data]
    # the write-up's numbers sit under the run's own columns
    assert lines[2].index("3.017") == lines[1].index("3.600") and lines[2].index("3.419") == lines[1].index("3.700")
    assert lines[6] == "note: mine trains the model of config/future50_mse.py, but unlike the write-up: max_iters 300 (write-up 9000)"


def test_help_does_not_import_torch():
    # --help should answer at once: torch and the models load only for a run to compare
    code = "import sys, report\ntry:\n    report.main(['--help'])\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "False", result.stderr
    assert result.stdout.startswith("usage:")


def test_writeup_numbers_are_the_writeup_configs():
    # the configs of the write-ups' next steps have no published numbers
    configs = {os.path.basename(p)[:-3] for p in os.listdir(os.path.join(REPO, "config"))}
    assert set(report.WRITEUP) == configs - {"tiny_cpu"} - set(NEXT_STEPS)
    for name, published in report.WRITEUP.items():
        with open(os.path.join(REPO, "config", f"{name}.py")) as f:
            header = f.read().split("\n\n")[0]  # each config's comment names its published numbers
        assert f"{published['val']}" in header and f"{published['params']:,}" in header, name


def test_the_write_up_line_says_whether_the_data_was_theirs(tmp_path, capsys):
    # the train and val sha256 a run recorded, against those of the write-ups' own token files
    theirs = {split: prepare_wikipedia.WRITEUP_FILES[f"wikipedia_{split}.bin"].sha256
              for split in ("train", "val")}
    wikitext = tmp_path / "wikitext103"  # a folder whose meta.json names its dataset
    wikitext.mkdir()
    (wikitext / "meta.json").write_text(json.dumps(
        {"dataset": "wikitext103", "train": {"sha256": "3" * 64}, "val": {"sha256": "4" * 64}}))
    identities = {
        "theirs": {"data_dir": "data/wikipedia", "train_sha256": theirs["train"],
                   "val_sha256": theirs["val"]},
        "their_train_only": {"data_dir": "data/x", "train_sha256": theirs["train"],
                             "val_sha256": "0" * 64},
        "wikitext": {"data_dir": str(wikitext), "train_sha256": "3" * 64, "val_sha256": "4" * 64},
        "changed": {"data_dir": str(wikitext), "train_sha256": "3" * 64, "val_sha256": "5" * 64},
    }
    config = os.path.join(REPO, "config/baseline.py")
    for name, identity in identities.items():
        write_log(tmp_path / name, fake_run([config], data=identity))
    unrecorded = fake_run([config])
    del unrecorded[0]["data"]  # a log of before runs recorded their data
    write_log(tmp_path / "unrecorded", unrecorded)
    names = [*identities, "unrecorded"]
    assert report.main([str(tmp_path / name) for name in names]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = ["same data as the write-up", "not the write-up's data: data/x",
                f"not the write-up's data: wikitext103 in {wikitext}",
                f"not the write-up's data: {wikitext}",  # its meta.json describes other files now
                "data not recorded"]
    for line, verdict in zip(lines[2::2], expected, strict=True):  # each run's write-up line
        assert line.rstrip().endswith(verdict), line
    assert lines[1].rstrip().endswith("data/wikipedia")  # the run's own line names its data_dir
