"""
The repository stands on its own: no tracked file points a reader at material that is not in
it (a specification or numbered source files our users never had, a folder beside the clone).
The write-ups, the blog post and the notebook are named as a reader finds them.
Run: python -m pytest -q test_repository.py
"""

import ast
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO

# (what, pattern); the patterns are written so that this file does not match them itself
FORBIDDEN = [
    ("a specification file that is not in the repository", re.compile(r"SPEC\.md", re.IGNORECASE)),
    ("numbered source files instead of the write-ups' names", re.compile(r"\bseeds? ?[-_]?0\d\d\b", re.IGNORECASE)),
    ("source files called seeds", re.compile(r"\bthe seeds[']", re.IGNORECASE)),
    ("a folder beside the clone", re.compile(r"\.\./shared\b")),
]
ALLOWED = {".ci/run"}  # CI may look for its tokenizer cache beside the clone


def tracked_files():
    """The files git tracks (everything under REPO, outside .git, when this is not a checkout)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        return [name for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        return [os.path.relpath(os.path.join(folder, name), REPO) for folder, dirs, names in os.walk(REPO)
                if ".git" not in folder.split(os.sep) for name in names]


def pointers_outside(root, names):
    """(what, "name:line: text") for each line of the named files under root that points at
    material outside the repository."""
    found = []
    for name in names:
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # images, and files deleted but not yet committed
        for line_no, line in enumerate(text.splitlines(), 1):
            found += [(what, f"{name}:{line_no}: {line.strip()[:100]}") for what, pattern in FORBIDDEN
                      if pattern.search(line)]
    return found


def test_a_file_that_points_outside_is_found(tmp_path):
    # pieces joined, so that this file itself holds none of them
    planted = ["see SPEC" + ".md", "as seed " + "000 says", "the seeds" + "' runs", ".." + "/shared/tiktoken_cache"]
    fine = ["--seed=1337", "seeds 1337,1338", "the write-ups' settings", "torch.manual_seed(0)", "shared blocks"]
    (tmp_path / "docs.md").write_text("\n".join(fine + planted + fine) + "\n", encoding="utf-8")
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\xff\xfe")
    found = pointers_outside(tmp_path, ["docs.md", "picture.png", "gone.md"])
    assert [where.split(":")[1] for _, where in found] == ["6", "7", "8", "9"]
    assert [what for what, _ in found] == [what for what, _ in FORBIDDEN]


@pytest.mark.parametrize("what, pattern", FORBIDDEN, ids=[what for what, _ in FORBIDDEN])
def test_no_tracked_file_points_outside_the_repository(what, pattern):
    names = [name for name in tracked_files() if name not in ALLOWED]
    found = [where for kind, where in pointers_outside(REPO, names) if kind == what]
    assert not found, f"{what}:\n" + "\n".join(found)


# --------------------------------------------------------------------------------------
# a minimal tutorial: the sizes a reader meets

# characters: train.py and what it imports, the model files aside (55,500 before TF32 was set
# for a run alone, cuda:N made current in every script, a lock's file removed with its run, and
# a key of another model, a missing data folder and a run folder as a word answered)
TRAINING_PATH_BUDGET = 58_500
# train.py, sample.py, prepare_wikipedia.py and all that they import (100,000 before the above,
# and prepare's text files named in a config file and one untitled text split by its lines)
SCRIPTS_BUDGET = 105_000


def lines_of(name):
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        return f.read().splitlines()


def project_imports(name):
    """The project's files that the file `name` imports directly (top-level files and lib/)."""
    found = set()
    for node in ast.walk(ast.parse("\n".join(lines_of(name)))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        paths = (module.replace(".", "/") + ".py" for module in modules)
        found |= {path for path in paths if os.path.isfile(os.path.join(REPO, path))}
    return found


def reading_path(*scripts):
    """{file: its lines} for the scripts and every project module they import, at any depth, but
    the model files and the kernels beside them: what a reader of the scripts follows."""
    path, todo = {}, list(scripts)
    while todo:
        name = todo.pop()
        if name not in path:
            path[name] = lines_of(name)
            todo.extend(project_imports(name))
    return {name: lines for name, lines in path.items()
            if not os.path.basename(name).startswith("model_") and "kernels" not in name}


def characters(path):
    return sum(len(line) + 1 for lines in path.values() for line in lines)


def test_the_reading_path_is_found_whole():
    assert set(reading_path("train.py")) == {"train.py", "configurator.py"}
    assert set(reading_path("sample.py")) == {"sample.py", "train.py", "configurator.py"}
    assert set(reading_path("prepare_wikipedia.py")) == {"prepare_wikipedia.py", "configurator.py"}
    lines = {"a.py": ["x = 1", ""], "b.py": ["yy"]}
    assert characters(lines) == 6 + 1 + 3


def test_train_py_is_one_file_within_its_budget():
    path = reading_path("train.py")
    assert characters(path) <= TRAINING_PATH_BUDGET, {name: characters({name: lines})
                                                      for name, lines in path.items()}


def test_the_card_scripts_are_within_their_budget():
    path = reading_path("train.py", "sample.py", "prepare_wikipedia.py")
    assert characters(path) <= SCRIPTS_BUDGET, {name: characters({name: lines})
                                                for name, lines in path.items()}


# the instruments beside the tutorial, together at the size of their jobs (characters); how
# complex a function may be, ruff checks (pyproject.toml: C901, PLR0912, PLR0915)
INSTRUMENTS = ("bench.py", "study.py", "check_causal.py", "visualize.py", "report.py")
INSTRUMENTS_BUDGET = 100_000
# the tutorial's length: 360 lines, and since the project's own result its Results section
README_LINES = 380


def test_the_instruments_are_within_their_budget():
    sizes = {name: characters({name: lines_of(name)}) for name in INSTRUMENTS}
    assert sum(sizes.values()) <= INSTRUMENTS_BUDGET, sizes
    # every top-level script is the tutorial, a card script or one of these instruments
    scripts = {name for name in os.listdir(REPO) if name.endswith(".py")}
    tutorial = {"train.py", "configurator.py", "sample.py", "prepare_wikipedia.py", "test_models.py",
                "model_baseline.py", "model_future_attn.py", "model_encdec.py"}
    assert scripts == tutorial | set(INSTRUMENTS), scripts


def test_the_readme_is_short_enough_to_read():
    assert len(lines_of("README.md")) <= README_LINES


def test_the_scripts_import_from_train_py_as_nanogpts_import_model_py():
    for script in ("sample.py", "study.py", "bench.py", "check_causal.py", "report.py",
                   "visualize.py"):
        imported = {name for name in project_imports(script) if not name.startswith("model_")}
        assert imported <= {"train.py", "configurator.py", "prepare_wikipedia.py", "report.py", "sample.py",
                            "lib/future_attn_kernels.py"}, (script, imported)
    assert sorted(os.listdir(os.path.join(REPO, "lib"))) == ["__init__.py", "future_attn_kernels.py"]


def test_no_line_over_100_characters_and_no_function_over_100_lines():
    sources = [name for name in tracked_files() if name.endswith(".py") and os.path.exists(
        os.path.join(REPO, name)) and not name.startswith("tests/")]
    wide, long = [], []
    for name in sources:
        lines = lines_of(name)
        wide += [f"{name}:{number}" for number, line in enumerate(lines, 1) if len(line) > 100]
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.FunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 100:
                    long.append(f"{name}: {node.name}, {length} lines")
    assert not wide, f"lines over 100 characters: {wide}"
    assert not long, long


def test_train_py_tells_its_story_in_order():
    lines = lines_of("train.py")
    # the settings it trains with come first, each with its comment
    start = lines.index("DEFAULTS = dict(")
    assert start < next(i for i, line in enumerate(lines) if line.startswith("def "))
    # then the data, the step, the checkpoints, the log, the guards, and the run last
    sections = [line[2:] for line in lines if line.startswith("# ") and lines[lines.index(line) - 1]
                .startswith("# ---")]
    assert [section.split(":")[0] for section in sections] == [
        "the settings", "the data", "the learning rate, the loss estimate and the gradients of one "
        "optimizer step", "checkpoints", "the log", "the run's guards", "the run"]


def test_the_top_level_shows_the_design():
    entries = {name.split("/")[0] for name in tracked_files() if not name.startswith(".")}
    assert len(entries) <= 22, sorted(entries)
    design = {"model_baseline.py", "model_future_attn.py", "model_encdec.py", "train.py", "prepare_wikipedia.py",
              "configurator.py", "sample.py", "README.md", "test_models.py", "config", "LICENSE"}
    assert design <= entries
    assert "python -m pytest -q" in "\n".join(lines_of("README.md")[:60])  # the test command on the first screen


def test_every_test_skipped_without_cuda_carries_the_cuda_mark(request):
    # `python -m pytest -m cuda` on a GPU machine must run every CUDA-only test: the mark, which
    # conftest.py turns into the skip, is the only way a test says it needs CUDA
    for item in request.session.items:
        for mark in item.iter_markers("skipif"):
            condition = mark.args[0] if mark.args else mark.kwargs.get("condition")
            reason = mark.kwargs.get("reason", "")
            needs_cuda = "cuda" in reason.lower() or "gpu" in reason.lower()
            assert not (needs_cuda and condition), f"{item.nodeid}: mark it @pytest.mark.cuda instead"
    sources = {name: "\n".join(lines_of(name)) for name in tracked_files()
               if name.endswith(".py") and (name.startswith("tests/") or name.startswith("test_"))}
    skip_without_cuda = "skipif(not torch.cuda" + ".is_available()"  # in two parts: not itself a match
    for name, text in sources.items():
        assert skip_without_cuda not in text, f"{name}: use @pytest.mark.cuda"
    # and the mark skips a test where there is no CUDA, and only then
    import conftest

    class Item:
        def __init__(self, *marks):
            self.marks = list(marks)

        def get_closest_marker(self, name):
            return next((mark for mark in self.marks if mark.name == name), None)

        def add_marker(self, mark):
            self.marks.append(mark.mark)

    needs_cuda, plain = Item(pytest.mark.cuda.mark), Item()
    conftest.pytest_collection_modifyitems(request.config, [needs_cuda, plain])
    assert bool(needs_cuda.get_closest_marker("skip")) == (not torch.cuda.is_available())
    assert not plain.get_closest_marker("skip")


def test_the_cuda_tests_collect_on_a_machine_without_the_tokenizers_files(tmp_path):
    # a GPU machine lent for minutes has no network and no tiktoken cache: `pytest -m cuda` must
    # still collect every test marked cuda, and no module may fail at import for want of GPT-2
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    mark = re.compile(r"^(@pytest\.mark\.cuda|cuda = pytest\.mark\.cuda)\b", re.MULTILINE)
    marked = {name for name in tracked_files() if name.startswith("tests/") and mark.search("\n".join(lines_of(name)))}
    assert {line.split("::")[0] for line in collected} == marked
    assert f"{len(collected)}/" in done.stdout and "error" not in done.stdout.lower()
