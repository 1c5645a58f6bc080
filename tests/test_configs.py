"""
Tests of the config files: each says only what differs from the defaults (train.py's DEFAULTS
and the chosen model's GPTConfig), and saying less changed no run. config_settings.json records
what every config gave before the files were cut down: every setting (the machine's device and
compile left out) and the parameter count the write-ups report (get_num_params: without the
position table, the count the config headers quote); new_data, a setting train.py no longer has,
is left out of it. Each config must still give exactly that,
no block of code lines may be copied from one config into another, and --model_type=encdec alone
must train the write-up's best encoder-decoder run.
Run: python -m pytest -q tests/test_configs.py
"""

import glob
import io
import json
import os
import tokenize

import pytest
import torch

import train
from conftest import REPO

CONFIG_DIR = os.path.join(REPO, "config")
CONFIG_PATHS = sorted(glob.glob(os.path.join(CONFIG_DIR, "*.py")))
MACHINE_KEYS = ("device", "compile")  # their values depend on the machine the run is on

with open(os.path.join(REPO, "tests", "config_settings.json")) as f:
    RECORD = json.load(f)  # {config name: {"settings": {...}, "num_params": n}}


def name_of(path):
    return os.path.basename(path)[:-3]


# --------------------------------------------------------------------------------------
# every config gives the settings and the model it always gave


def test_every_config_is_recorded():
    assert {name_of(path) for path in CONFIG_PATHS} == set(RECORD)


def typed(settings):
    """Each value with its type's name, so that 1 and 1.0, or 0 and False, count as different."""
    return {key: (type(value).__name__, value) for key, value in settings.items()}


@pytest.mark.parametrize("path", CONFIG_PATHS, ids=name_of)
def test_config_gives_its_recorded_settings(path):
    config = train.get_config([path])
    settings = {key: value for key, value in config.items() if key not in MACHINE_KEYS}
    assert typed(settings) == typed(RECORD[name_of(path)]["settings"])


@pytest.mark.parametrize("path", CONFIG_PATHS, ids=name_of)
def test_config_builds_its_recorded_parameter_count(path):
    config = train.get_config([path])
    with torch.device("meta"):  # the shapes only: no memory, no initialization time
        model = train.build_model(config["model_type"], train.model_args_of(config))
    assert model.get_num_params() == RECORD[name_of(path)]["num_params"]


# --------------------------------------------------------------------------------------
# no block of code lines is repeated inside config/

RUN = 6  # this many consecutive code lines may appear once in config/, not twice


def code_lines(text):
    """(line number, code) of each line of a file that holds code. Comments and blank lines are
    left out, and the code's tokens are joined by one space, so that neither a comment at the end
    of a line nor other spacing makes a copied line look new."""
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.ENDMARKER)
    tokens_of_line = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skipped:
            tokens_of_line.setdefault(token.start[0], []).append(token.string)
    return [(number, " ".join(tokens)) for number, tokens in sorted(tokens_of_line.items())]


def repeated_runs(files, length=RUN):
    """Every run of `length` consecutive code lines that appears more than once in files
    ({name: text}), within one file or across files: {run: ["name:first line number", ...]}."""
    places = {}
    for name, text in sorted(files.items()):
        lines = code_lines(text)
        for start in range(len(lines) - length + 1):
            run = tuple(code for _, code in lines[start:start + length])
            places.setdefault(run, []).append(f"{name}:{lines[start][0]}")
    return {run: where for run, where in places.items() if len(where) > 1}


def test_the_checker_finds_a_planted_repeat():
    block = [f"key_{i} = {i}" for i in range(RUN)]
    # the same block in a second file, broken up by a comment and a blank line, a comment at the
    # end of one line and other spacing: still the same code
    planted = ["# a header", "", *block[:3], "# a comment", "", f"{block[3]}  # a note",
               block[4].replace(" = ", "="), block[5]]
    files = {"a": "\n".join(["x = 0", *block]) + "\n", "b": "\n".join(planted) + "\n"}
    assert repeated_runs(files) == {tuple(block): ["a:2", "b:3"]}
    # a repeat inside one file counts too
    assert repeated_runs({"a": "\n".join([*block, "y = 1", *block]) + "\n"}) == {
        tuple(block): ["a:1", "a:8"]}
    # one line fewer, or one value changed, is no repeat: lines of the same shape may recur
    assert repeated_runs({"a": "\n".join(block) + "\n", "b": "\n".join(block[1:]) + "\n"}) == {}
    changed = [line.replace("key_3 = 3", "key_3 = 4") for line in block]
    assert repeated_runs({"a": "\n".join(block) + "\n", "b": "\n".join(changed) + "\n"}) == {}


def test_no_block_of_code_lines_repeats_inside_config():
    files = {}
    for path in CONFIG_PATHS:
        with open(path) as f:
            files[os.path.basename(path)] = f.read()
    repeats = repeated_runs(files)
    assert not repeats, "\n".join(f"{', '.join(where)}: {'; '.join(run)}"
                                  for run, where in repeats.items())


# --------------------------------------------------------------------------------------
# the encoder-decoder's defaults are one run of the write-up, its best


def test_encdec_defaults_are_the_best_run():
    alone = train.model_args_of(train.get_config(["--model_type=encdec"]))
    best = train.model_args_of(train.get_config([os.path.join(CONFIG_DIR, "encdec_mse_possub.py")]))
    assert alone == best
    # the two settings that tell the write-up's runs apart: position subtraction, and the
    # embedding loss's weight, 8 with it
    assert (alone["sub_pos"], alone["embedding_loss_type"], alone["embedding_loss_coeff"]) == (
        "yes", "mse", 8.0)
