"""
Tests of report.py: the table over runs, its plot, resumed launches, log lines cut off
mid-write, runs that stopped early, and the write-ups' published numbers beside a run of a
write-up config. Runs trained here on a CPU (conftest.py's trained_runs) or logs written here.
Run: python -m pytest -q tests/test_report.py
"""

import json
import os
import re
import subprocess
import sys

import pytest

import configurator
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
    missing = str(tmp_path / "missing")
    assert report.main([trained_runs["baseline"], missing, f"--plot={tmp_path / 'loss.png'}"]) == 1
    captured = capsys.readouterr()
    assert f"error: no folder {missing}\n" in captured.err and "baseline" in captured.out
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the others plotted


def test_tokens_are_counted_launch_by_launch(data_dir, tmp_path, capsys):
    # 2 steps of 2 × 4 sequences × 16 tokens, then 2 steps of 2 × 8 × 16 after a resume
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    assert train.main(argv_for(data_dir, tmp_path, max_iters=4, eval_interval=2, batch_size=8,
                               init_from="resume")) == 0
    capsys.readouterr()
    assert report.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[3:5] == ["4", f"{2 * 128 + 2 * 256:,}"]


def test_an_eval_only_evaluation_is_a_note_not_the_runs_numbers(data_dir, tmp_path, capsys):
    assert train.main(argv_for(data_dir, tmp_path, max_iters=2, eval_interval=2)) == 0
    assert train.main(argv_for(data_dir, tmp_path, init_from="resume", eval_only=True,
                               eval_iters=3)) == 0
    run_eval, eval_only = [r for r in read_log(tmp_path) if r["type"] in ("eval", "eval_only")][-2:]
    assert eval_only["type"] == "eval_only" and eval_only["val_loss"] != run_eval["val_loss"]
    capsys.readouterr()
    assert report.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[6] == f"{run_eval['val_loss']:.3f}"  # the run's own last evaluation
    assert lines[2:] == [f"note: {tmp_path.name}: evaluated with --eval_only (not the run's "
                         f"numbers) at iter 2 on {data_dir}: train loss "
                         f"{eval_only['train_loss']:.3f}, val loss {eval_only['val_loss']:.3f}"]


# --------------------------------------------------------------------------------------
# logs written here


def write_log(out_dir, records, tail=""):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "log.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + tail)


def fake_run(config_argv, iters=300, val_loss=3.7, data=None):
    """Records of a run of config_argv's model, as train.py logs them, that trained to iters and
    evaluated there; data: the identity of its data, by default a folder of other data."""
    config = train.get_config(config_argv)
    data = data or {"data_dir": "data/mine", "train_sha256": "1" * 64, "val_sha256": "2" * 64}
    start = dict(type="start", model_type=config["model_type"], num_params=123, world_size=1,
                 tokens_per_iter=160_000, iter_num=0, init_from="scratch", config=config,
                 model_args=train.model_args_of(config), time=0.0, data=data)
    aux = {"future_attn_loss": 0.09} if config["model_type"] == "future_attn" else {}
    return [start, dict(type="train", iter=iters, loss=3.5, aux=aux, time=10.0),
            dict(type="eval", iter=iters, train_loss=3.6, val_loss=val_loss,
                 best_val_loss=val_loss, saved=True, time=12.0)]


TINY = os.path.join(REPO, "config/tiny_cpu.py")


def table(out):
    """{run: its row's words} of report.py's table."""
    return {line.split()[0]: line.split() for line in out.splitlines()[1:]
            if not line.startswith("note:")}


def test_report_skips_cut_off_lines(tmp_path, capsys):
    records = fake_run([TINY, "--max_iters=310"], iters=300)
    write_log(tmp_path / "end", records, tail='{"type": "train", "it')  # killed mid-write
    resumed = [dict(records[0], iter_num=300, init_from="resume", time=20.0),
               dict(records[2], iter=310, val_loss=3.5, time=30.0)]
    write_log(tmp_path / "middle", records, tail='{"type": "tr\n'
              + "".join(json.dumps(r) + "\n" for r in resumed))  # a launch appended after it
    assert report.main([str(tmp_path / "end"), str(tmp_path / "middle")]) == 0
    captured = capsys.readouterr()
    for run in ("end", "middle"):
        assert f"warning: {tmp_path}/{run}/log.jsonl, line 4: cut off mid-write; skipped" in (
            captured.err)
    rows = table(captured.out)
    assert rows["end"][3:5] == ["300", "of"] and rows["end"][8] == "3.700"
    assert rows["middle"][3:8] == ["310", "49,600,000", "3.600", "3.500", "3.500"]


def test_a_launch_from_an_earlier_checkpoint_replaces_what_came_after_it(tmp_path, capsys):
    # launches at 0, at 200 (to 300), and again at 200 (to 250): the second's 200..300 is gone
    first = fake_run([TINY, "--max_iters=250"], iters=200)
    second = [dict(first[0], iter_num=200, tokens_per_iter=1000, time=20.0),
              dict(first[1], iter=300, time=30.0),
              dict(first[2], iter=300, val_loss=3.1, time=31.0)]
    third = [dict(first[0], iter_num=200, tokens_per_iter=10, time=40.0),
             dict(first[1], iter=250, time=50.0), dict(first[2], iter=250, val_loss=3.3, time=52.0)]
    write_log(tmp_path / "run", first + second + third)
    records, wall_s = report.read_log(str(tmp_path / "run"))
    # the second launch's start stays, with no iteration of its own left
    assert [(r["type"], r.get("iter", r.get("iter_num"))) for r in records] == [
        ("start", 0), ("train", 200), ("eval", 200), ("start", 200), ("start", 200),
        ("train", 250), ("eval", 250)]
    assert wall_s == 12.0 + 11.0 + 12.0  # each launch, from its start to its last record
    assert report.main([str(tmp_path / "run")]) == 0
    row = table(capsys.readouterr().out)["run"]
    # the best val loss too is the records' that were kept: the lost launch's 3.1 is gone
    assert row[3:8] == ["250", f"{200 * 160_000 + 50 * 10:,}", "3.600", "3.300", "3.300"]


def test_a_run_short_of_max_iters_says_so(tmp_path, capsys):
    # stopped at iteration 6 of 300, its last evaluation at 0
    records = fake_run([TINY, "--max_iters=300"], iters=0)
    records += [dict(records[1], iter=i, time=13.0 + i) for i in range(1, 7)]
    write_log(tmp_path / "short", records)
    write_log(tmp_path / "new", records[:1])  # no evaluation yet
    write_log(tmp_path / "done", fake_run([TINY, "--max_iters=300"], iters=300))
    assert report.main([str(tmp_path / name) for name in ("short", "new", "done")]) == 0
    out = capsys.readouterr().out
    rows = table(out)
    assert rows["short"][3:6] == ["6", "of", "300"] and rows["done"][3] == "300"
    assert rows["new"][3:6] == ["0", "of", "300"] and rows["new"][7:10] == ["-", "-", "-"]
    assert out.splitlines()[-2:] == [
        "note: short stopped at iteration 6 of 300: its losses are from iteration 0",
        "note: new stopped at iteration 0 of 300: its losses are none"]


def test_report_shows_the_writeup_beside_a_run_in_a_writeup_configs_folder(tmp_path, capsys):
    config = os.path.join(REPO, "config/future50_mse.py")
    # the config's own out-future50_mse; study.py's encdec_plain-seed5; a folder of no write-up
    write_log(tmp_path / "mine", fake_run([config, "--max_iters=300", "--data_dir=elsewhere",
                                           "--seed=5"]))
    write_log(tmp_path / "full", fake_run([os.path.join(REPO, "config/encdec_plain.py"),
                                           "--out_dir=study/encdec_plain-seed5"], iters=9000))
    write_log(tmp_path / "other", fake_run([config, "--future_dim=49", "--out_dir=out-mine"]))
    write_log(tmp_path / "changed", fake_run([config, "--future_dim=49"], iters=9000))
    assert report.main([str(tmp_path / name) for name in ("mine", "full", "other",
                                                           "changed")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [
        ["mine", "future_attn"], ["write-up:", "future50_mse"], ["full", "encdec"],
        ["write-up:", "encdec_plain"], ["other", "future_attn"], ["changed", "future_attn"],
        ["write-up:", "future50_mse"], ["note:", "mine"], ["note:", "other"], ["note:", "changed"]]
    other_data = ["not", "the", "write-up's", "data:", "data/mine"]
    # the write-ups published their last val loss, not their best: "-" under best val loss
    assert lines[2].split()[2:] == ["15,817,248", "9000", "1,440,000,000", "3.017", "3.419", "-",
                                    "0.07681", *other_data]
    assert lines[4].split()[2:] == ["15,763,200", "9000", "1,440,000,000", "3.043", "3.413", "-",
                                    "-", *other_data]
    # the write-up's numbers sit under the run's own columns
    assert lines[2].index("3.017") == lines[1].index("3.600")
    assert lines[2].index("3.419") == lines[1].index("3.700")
    assert lines[8] == ("note: mine trains config/future50_mse.py, but unlike the write-up: "
                        "max_iters 300 (write-up 9000)")
    assert lines[10] == ("note: changed trains config/future50_mse.py, but unlike the write-up: "
                         "future_dim 49 (write-up 50)")


def test_the_write_up_line_says_whether_the_data_was_theirs(tmp_path, capsys):
    # the train and val sha256 a run recorded, against those of the write-ups' own token files
    theirs = {split: prepare_wikipedia.WRITEUP_FILES[f"wikipedia_{split}.bin"].sha256
              for split in ("train", "val")}
    identities = {
        "theirs": {"data_dir": "data/wikipedia", "train_sha256": theirs["train"],
                   "val_sha256": theirs["val"]},
        "their_train_only": {"data_dir": "data/x", "train_sha256": theirs["train"],
                             "val_sha256": "0" * 64},
        "other": {"data_dir": "data/y", "train_sha256": "3" * 64, "val_sha256": "4" * 64},
    }
    config = os.path.join(REPO, "config/baseline.py")
    for name, identity in identities.items():
        write_log(tmp_path / name, fake_run([config], iters=9000, data=identity))
    assert report.main([str(tmp_path / name) for name in identities]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = ["same data as the write-up", "not the write-up's data: data/x",
                "not the write-up's data: data/y"]
    for line, verdict in zip(lines[2::2], expected, strict=True):  # each run's write-up line
        assert line.rstrip().endswith(verdict), line
    assert lines[1].rstrip().endswith("data/wikipedia")  # the run's own line names its data_dir


def test_the_writeup_numbers_are_the_writeup_configs():
    # the configs of the write-ups' next steps, and those at a CPU's scale, have no published
    # numbers
    configs = {os.path.basename(p)[:-3] for p in os.listdir(os.path.join(REPO, "config"))}
    cpu_scale = {name for name in configs if name.startswith("cpu_")} | {"tiny_cpu"}
    assert set(report.WRITEUP) == configs - cpu_scale - set(NEXT_STEPS)
    for name, published in report.WRITEUP.items():
        path = os.path.join(REPO, "config", f"{name}.py")
        with open(path) as f:
            header = f.read().split("\n\n")[0]  # each config's comment names its numbers
        assert f"{published['val']}" in header and f"{published['params']:,}" in header, name
        # report.py knows a write-up run by its folder: the one its config names
        assert configurator.read_config_file(path)["out_dir"] == f"out-{name}"
        config = train.get_config([path])
        assert config["max_iters"] == report.WRITEUP_ITERS
        tokens_per_iter = (config["gradient_accumulation_steps"] * config["batch_size"]
                           * config["block_size"])
        assert report.WRITEUP_ITERS * tokens_per_iter == report.WRITEUP_TOKENS


# --------------------------------------------------------------------------------------
# the plot and the command line


def test_the_plot_has_a_legend_and_a_colour_for_each_run(tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    figures, subplots = [], plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *args, **kwargs: figures.append(
        subplots(*args, **kwargs)) or figures[-1])
    names = [f"run{i:02d}" for i in range(12)]  # more runs than matplotlib's 10 cycle colours
    for i, name in enumerate(names):
        records = fake_run([TINY, "--max_iters=300"], iters=300, val_loss=3.0 + i / 10)
        write_log(tmp_path / name, records)
    path = tmp_path / "curves.svg"
    assert report.main([*(str(tmp_path / name) for name in names), f"--plot={path}"]) == 0
    assert path.read_text().lstrip().startswith("<?xml")  # the format its name gives
    (fig, axes), = figures
    for ax in axes:
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == names
        assert [text.get_text() for text in ax.get_legend().get_texts()] == names
        colours = {tuple(line.get_color()) for line in lines}
        assert len(colours) == len(names)
    val_lines = axes[1].get_lines()
    assert [list(line.get_ydata()) for line in val_lines] == [[3.0 + i / 10] for i in range(12)]


def test_two_runs_get_tab10s_first_two_colours(tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    from matplotlib.colors import to_rgb
    figures, subplots = [], plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *args, **kwargs: figures.append(
        subplots(*args, **kwargs)) or figures[-1])
    for name in ("a", "b"):
        write_log(tmp_path / name, fake_run([TINY, "--max_iters=300"]))
    argv = [str(tmp_path / "a"), str(tmp_path / "b"), f"--plot={tmp_path / 'curves.png'}"]
    assert report.main(argv) == 0
    (fig, axes), = figures
    tab10 = plt.colormaps["tab10"].colors
    for ax in axes:
        first, second = (to_rgb(line.get_color()) for line in ax.get_lines())
        assert (first, second) == (tab10[0], tab10[1])
        # blue against orange, not the two dark ends of one colour map
        assert sum((x - y) ** 2 for x, y in zip(first, second)) ** 0.5 > 0.5


def test_plot_alone_draws_losses_png_in_the_first_runs_folder(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    for name in ("a", "b"):
        write_log(tmp_path / name, fake_run([TINY, "--max_iters=300"]))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # where a user often stands: the repository's root
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    # --plot alone, at the end or before a flag; then before a run folder, which stays a run
    for argv in ([a, b, "--plot"], [a, "--plot", "--plot=", b], ["--plot", a, b]):
        assert report.main(argv) == 0, argv
        out = capsys.readouterr().out
        assert {"a", "b"} <= set(table(out))
        assert out.splitlines()[-1] == f"saved {a}/losses.png"
        assert (tmp_path / "a" / "losses.png").read_bytes()[:4] == b"\x89PNG"
        os.remove(tmp_path / "a" / "losses.png")
    assert os.listdir(tmp_path / "cwd") == []
    # an image's file name after --plot is the picture's
    assert report.main([a, "--plot", str(tmp_path / "curves.svg")]) == 0
    assert (tmp_path / "curves.svg").exists() and not (tmp_path / "a" / "losses.png").exists()


def test_run_folders_as_out_dir_flags(tmp_path, capsys):
    # --out_dir=RUN, as train.py writes it, and --out_dir RUN, each as often as there are runs
    for name in ("a", "b"):
        write_log(tmp_path / name, fake_run([TINY, "--max_iters=300"]))
    assert report.main([f"--out_dir={tmp_path / 'a'}", "--out_dir", str(tmp_path / "b")]) == 0
    assert list(table(capsys.readouterr().out)) == ["a", "b"]


def test_the_best_val_loss_beside_the_last(tmp_path, capsys):
    # a run that overfits: its val loss falls to 3.2, then rises; the last evaluation not finite
    records = fake_run([TINY, "--max_iters=300"], iters=100, val_loss=3.7)
    for i, val_loss in ((200, 3.2), (300, 3.5)):
        records.append(dict(records[-1], iter=i, val_loss=val_loss))
    write_log(tmp_path / "overfit", records)
    write_log(tmp_path / "diverged", records + [dict(records[-1], iter=300, val_loss=None)])
    assert report.main([str(tmp_path / "overfit"), str(tmp_path / "diverged")]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert re.split(r"\s{2,}", header)[5:9] == ["train loss", "val loss", "best val loss",
                                                "aux loss"]
    rows = table(out)
    assert rows["overfit"][5:8] == ["3.600", "3.500", "3.200"]
    assert rows["diverged"][5:8] == ["3.600", "non-finite", "3.200"]
    # each number under its column's name
    line = out.splitlines()[1]
    assert line.index("3.200") == header.index("best val loss")


def test_files_are_skipped_and_only_folders_are_runs(tmp_path, capsys):
    # python report.py study/*: the study's own files among its run folders
    write_log(tmp_path / "study" / "baseline-seed1", fake_run([TINY, "--max_iters=300"]))
    for name in ("study.md", "study.png", "study.json"):
        (tmp_path / "study" / name).write_text("")
    words = sorted(str(path) for path in (tmp_path / "study").iterdir())
    assert report.main(words) == 0
    captured = capsys.readouterr()
    assert list(table(captured.out)) == ["baseline-seed1"] and captured.err == ""
    # a folder that is not there and a folder that holds no run: each said in its own words
    (tmp_path / "empty").mkdir()
    argv = [str(tmp_path / "nowhere"), str(tmp_path / "empty"), *words]
    assert report.main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: no folder {tmp_path / 'nowhere'}",
        f"error: {tmp_path / 'empty'} holds no log.jsonl: not a run of train.py"]
    assert report.main([str(tmp_path / "study" / "study.md")]) == 2  # no folder left
    assert "no run folder given" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    ([], "no run folder given"),
    (["out-x", "--plots=a.png"], "unknown key plots; did you mean plot?"),
])
def test_bad_command_lines_are_one_line(argv, message, capsys):
    assert report.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_help_does_not_import_torch():
    # --help should answer at once: torch and the models load only for a run to compare
    code = ("import sys, report\nreport.main(['--help', '--plot=x.png'])\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.splitlines()[-1] == "False", result.stderr
    assert result.stdout.startswith(report.__doc__.strip()[:40]) and "--plot='x.png'" in (
        result.stdout)


def test_plot_without_matplotlib_is_one_line_after_the_table(tmp_path, monkeypatch, capsys):
    write_log(tmp_path / "run", fake_run([TINY, "--max_iters=300"]))
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # import now fails
    assert report.main([str(tmp_path / "run"), f"--plot={tmp_path / 'x.png'}"]) == 1
    captured = capsys.readouterr()
    assert "run" in table(captured.out)  # the table is complete
    assert captured.err == "error: --plot needs matplotlib: pip install matplotlib\n"
    assert not (tmp_path / "x.png").exists()
