"""
Tests of configurator.py: a config file, then --key=value or --key value flags over it, an
unknown key answered with the closest one, a wrong type with the expected type and the value
now in force (read through train.get_config, as the scripts do).
Run: python -m pytest -q test_configurator.py
"""

import fcntl
import os

import pytest

import configurator
import train
from configurator import ConfigError


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "my_config.py"
    path.write_text("import math\nbatch_size = 7\nlearning_rate = 1e-3\nout_dir = 'from-file'\n"
                    "_scratch = 5\ndef helper():\n    pass\n")
    config = train.get_config([str(path), "--batch_size=9", "--min_lr=0", "--dtype=float16", "--compile=False"])
    assert config["batch_size"] == 9  # the flag wins over the file
    assert config["learning_rate"] == 1e-3 and config["out_dir"] == "from-file"
    assert config["min_lr"] == 0.0 and isinstance(config["min_lr"], float)  # int accepted for float
    assert config["dtype"] == "float16" and config["compile"] is False
    assert config["max_iters"] == train.DEFAULTS["max_iters"]


def test_unknown_key_names_the_closest_key(capsys):
    with pytest.raises(ConfigError) as e:
        train.get_config(["config/tiny_cpu.py", "--max_iter=10"])
    assert str(e.value) == "unknown key max_iter; did you mean max_iters?"
    with pytest.raises(ConfigError) as e:  # nothing close: a pointer to --help, not the 37 keys
        train.get_config(["--zzzz=1"])
    assert str(e.value) == "unknown key zzzz (--help lists the keys)"
    assert train.main(["--batch_sise=3"]) == 2
    assert last_line(capsys) == "error: unknown key batch_sise; did you mean batch_size?"


def test_wrong_type_names_the_type_and_the_value_now(capsys):
    # the value now is the config file's (tiny_cpu.py: max_iters = 300), not the default
    assert train.main(["config/tiny_cpu.py", "--max_iters=ten"]) == 2
    assert last_line(capsys) == "error: --max_iters=ten: expected an integer (now 300)"
    with pytest.raises(ConfigError) as e:
        train.get_config(["--batch_size=3.5", "--compile=1", "--learning_rate=fast"])
    now = train.DEFAULTS
    assert str(e.value) == (f"--batch_size=3.5: expected an integer (now {now['batch_size']}); --compile=1: expected "
                            f"True or False (now {now['compile']}); --learning_rate=fast: expected a number (now "
                            f"{now['learning_rate']})")
    with pytest.raises(ConfigError, match="not found"):
        configurator.parse(["config/no_such_config.py"])


def last_line(capsys):
    """What a script printed to stderr, which must be one line and no traceback."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize("argv, expected", [
    (["--batch_size", "9", "--dtype", "float16"], dict(batch_size=9, dtype="float16")),
    (["--batch_size=9", "--compile", "False"], dict(batch_size=9, compile=False)),
    (["--model_type", "encdec", "--n_layer_encoder", "3"], dict(model_type="encdec", n_layer_encoder=3)),
    (["--out_dir", "-x", "--wandb_run_name", "2024"], dict(out_dir="-x", wandb_run_name="2024")),
])
def test_key_space_value_is_key_equals_value(argv, expected):
    config = train.get_config(["config/tiny_cpu.py", *argv])  # the config file stays first
    assert config["max_iters"] == 300 and {key: config[key] for key in expected} == expected
    spelled = configurator.normalize(["config/tiny_cpu.py", *argv])
    assert len(spelled) == 1 + len(expected) and all("=" in flag for flag in spelled[1:])
    assert train.get_config(spelled) == config


def test_a_negative_number_is_a_value():
    with pytest.raises(ConfigError, match="seed must be >= 0, got -1$"):
        train.get_config(["--seed", "-1"])
    assert configurator.parse(["--min_lr", "-1e-9"])[1] == {"min_lr": "-1e-9"}


@pytest.mark.parametrize("argv", [["--batch_size"], ["--batch_size", "--compile=False"], ["config/tiny_cpu.py", "--seed"]])
def test_a_flag_without_value_is_one_clear_error(argv, capsys):
    flag = next(arg for arg in argv if "=" not in arg and arg.startswith("--"))
    with pytest.raises(ConfigError) as e:
        train.get_config(argv)
    assert str(e.value) == f"{flag} has no value: write {flag}=VALUE or {flag} VALUE"
    assert train.main(argv) == 2 and last_line(capsys).startswith(f"error: {flag} has no value")


def test_a_flag_before_a_flag_or_a_config_file_stands_alone():
    assert configurator.normalize(["--compare", "a.py"]) == ["--compare", "a.py"]
    assert configurator.normalize(["--compare", "False", "a.py"]) == ["--compare=False", "a.py"]
    assert configurator.normalize(["--profile", "3", "--compare"]) == ["--profile=3", "--compare"]
    assert configurator.normalize(["--seeds", "1,2", "-h"]) == ["--seeds=1,2", "-h"]


@pytest.mark.parametrize("argv, expected", [
    (["--compile"], dict(compile=True)),  # a boolean flag alone means True, as --probe does in check_causal.py
    (["--compile", "--max_iters=5"], dict(compile=True, max_iters=5)),
    (["config/tiny_cpu.py", "--overwrite", "--compile", "False"], dict(overwrite=True, compile=False)),
])
def test_a_boolean_flag_alone_means_true(argv, expected):
    config = train.get_config(argv)
    assert {key: config[key] for key in expected} == expected


def test_a_flag_of_another_script_is_an_unknown_key(capsys):
    assert train.main(["config/tiny_cpu.py", "--detokenize"]) == 2
    assert last_line(capsys) == "error: unknown key detokenize (--help lists the keys)"


@pytest.mark.parametrize("text, line, what", [
    ("n_layer = 2\nmax_iters = = 3\n", 2, "SyntaxError: invalid syntax"),
    ("n_layer = 2\n\nmax_iters = undefined_name\n", 3, "NameError: name 'undefined_name' is not defined"),
])
def test_an_error_in_a_config_file_names_its_file_and_line(text, line, what, tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text(text)
    assert train.main([str(path)]) == 2
    assert last_line(capsys) == f"error: {path}, line {line}: {what} — fix the config file"


@pytest.mark.parametrize("text, kind", [("max_iters = 10,\n", "tuple"), ("max_iters = [10]\n", "list"),
                                        ("max_iters = {'a': 1}\n", "dict")])
def test_a_value_of_another_kind_in_a_config_file_is_refused(text, kind, tmp_path, capsys):
    path = tmp_path / "my_config.py"
    path.write_text(text)
    assert train.main(["config/tiny_cpu.py", str(path), "--max_iters=3"]) == 2
    line = last_line(capsys)
    assert line.startswith(f"error: {path}: max_iters = ") and f"is a {kind}" in line


def test_a_wrong_type_in_a_config_file_names_that_file(tmp_path):
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("max_iters = 5\nbatch_size = 12\n")
    second.write_text("batch_size = '4'\n")
    # no "(now 50)": the default is not the value in force, which the first file set
    with pytest.raises(ConfigError) as e:
        train.get_config([str(first), str(second)])
    assert str(e.value) == f"batch_size = '4' in {second}: expected an integer"
    with pytest.raises(ConfigError) as e:  # a flag's: the value in force, the file's
        train.get_config([str(first), "--batch_size=four"])
    assert str(e.value) == "--batch_size=four: expected an integer (now 12)"


def test_one_dash_is_not_a_flag(capsys):
    assert train.main(["config/tiny_cpu.py", "-max_iters=10"]) == 2
    assert last_line(capsys) == ("error: -max_iters=10 is not a flag: flags start with two dashes, as in "
                                 "--max_iters=10")


@pytest.mark.parametrize("argv, runs, rest", [
    (["out-a", "--plot", "--grid", "3", "out-b"], ["out-a", "out-b"], ["--plot", "--grid=3"]),
    (["--out", "x.png", "out-a", "c.py"], ["out-a"], ["--out=x.png", "c.py"]),  # a flag's value, a config file
    (["--out=x.png", "out-a"], ["out-a"], ["--out=x.png"]),
    # train.py's form, --out_dir=RUN, as often as there are runs, and beside plain words, in order
    (["--out_dir=out-a", "--grid=3", "--out_dir", "out-b", "out-c"], ["out-a", "out-b", "out-c"], ["--grid=3"]),
])
def test_run_folders_are_words_or_out_dir_flags(argv, runs, rest):
    assert configurator.take_runs(argv) == (runs, rest)
    config = configurator.settings([arg for arg in rest if not arg.endswith(".py")], dict(plot=False, out="", grid=6))
    assert config["out"] in ("", "x.png") and config["grid"] in (3, 6)


def test_a_scripts_own_keys_are_taken_from_flags_that_are_also_train_pys():
    overrides = configurator.parse(["--iters", "7", "--batch_size=3", "--memory"])[1]
    assert configurator.own_settings(overrides, dict(iters=20, memory=False)) == dict(iters=7, memory=True)
    with pytest.raises(ConfigError, match="--iters=seven: expected an integer"):
        configurator.own_settings({"iters": "seven"}, dict(iters=20))


def test_a_folders_lock_file_goes_with_its_holder_and_a_lock_on_a_removed_file_is_taken_again(tmp_path, monkeypatch):
    path = tmp_path / "x.lock"
    with configurator.lock_folder(str(tmp_path), "x.lock", "me") as lock:
        assert path.read_text().startswith("me (process ")
    assert lock.closed and not path.exists()  # a clean end leaves nothing behind
    # A holder that ends between our open and our flock removes the file we opened: a lock on
    # that file would guard nothing, as the next process makes and locks a new one.
    flock, locked = fcntl.flock, []

    def flock_after_the_holder_ended(f, operation):
        if not locked:
            os.remove(f.name)
        locked.append(os.fstat(f.fileno()).st_ino)
        return flock(f, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_holder_ended)
    with configurator.lock_folder(str(tmp_path), "x.lock", "me") as lock:
        assert len(locked) == 2 and locked[-1] == os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
    assert not path.exists()
