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

import pytest

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


def test_the_patterns_catch_what_they_must():
    # pieces joined, so that this file itself holds none of them
    lines = ["see SPEC" + ".md", "as seed " + "000 says", "the seeds" + "' runs", ".." + "/shared/tiktoken_cache",
             "seed-" + "003 bug"]
    assert all(any(pattern.search(line) for _, pattern in FORBIDDEN) for line in lines)
    fine = ["--seed=1337", "seeds 1337,1338", "the write-ups' settings", "torch.manual_seed(0)", "shared blocks"]
    assert not any(pattern.search(line) for line in fine for _, pattern in FORBIDDEN)


@pytest.mark.parametrize("what, pattern", FORBIDDEN, ids=[what for what, _ in FORBIDDEN])
def test_no_tracked_file_points_outside_the_repository(what, pattern):
    found = []
    for name in tracked_files():
        if name in ALLOWED:
            continue
        try:
            with open(os.path.join(REPO, name), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # images, and files deleted but not yet committed
        for line_no, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                found.append(f"{name}:{line_no}: {line.strip()[:100]}")
    assert not found, f"{what}:\n" + "\n".join(found)


# --------------------------------------------------------------------------------------
# a minimal tutorial: the sizes a reader meets

TRAINING_PATH_BUDGET = 70_000  # characters: train.py and what it imports, the model files aside


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


def training_path():
    """{file: its lines} for train.py and every project module it imports, at any depth, but the
    model files and the kernels beside them: what a reader of train.py follows."""
    path, todo = {}, ["train.py"]
    while todo:
        name = todo.pop()
        if name not in path:
            path[name] = lines_of(name)
            todo.extend(project_imports(name))
    return {name: lines for name, lines in path.items()
            if not os.path.basename(name).startswith("model_") and "kernels" not in name}


def test_the_training_path_is_found_whole():
    path = training_path()
    assert {"train.py", "configurator.py", "lib/settings.py", "lib/checkpoint.py", "lib/guards.py",
            "lib/log.py", "lib/cli.py", "lib/data.py"} <= set(path)
    assert not any(name.startswith("model_") for name in path)  # the models are read on their own
    assert "lib/prepare_io.py" not in path  # prepare_wikipedia.py's, not train.py's


def test_the_training_path_is_within_its_budget():
    path = training_path()
    characters = {name: sum(len(line) + 1 for line in lines) for name, lines in path.items()}
    assert sum(characters.values()) <= TRAINING_PATH_BUDGET, characters
    wide = [f"{name}:{number}" for name, lines in path.items()
            for number, line in enumerate(lines, 1) if len(line) > 100]
    assert not wide, f"lines over 100 characters: {wide}"


def test_no_function_or_class_on_the_training_path_is_over_120_lines():
    long = []
    for name, lines in training_path().items():
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 120:
                    long.append(f"{name}: {node.name}, {length} lines")
    assert not long, long


def test_train_py_reads_like_nanogpts():
    lines = lines_of("train.py")
    assert len(lines) <= 350
    assert sum(line.startswith(("def ", "class ")) for line in lines) <= 12  # top-level definitions
    assert sum(bool(re.match(r"\s*(raise|assert)\b", line)) for line in lines) <= 4
    start = next(i for i, line in enumerate(lines) if line.strip() == "while True:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines))
               if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent)
    loop = [line for line in lines[start:end] if line.strip()]
    assert len(loop) <= 45, f"the loop is {len(loop)} lines"
    # the settings it trains with come first, each with its comment
    assert lines.index("DEFAULTS = dict(") < next(i for i, line in enumerate(lines)
                                                  if line.startswith("def "))
    # the guards are lib/guards.py's: train.py handles no signal, lock, free space or hashing
    code = "\n".join(lines).split('"""', 2)[2]  # after the docstring
    assert not re.search(r"^import (signal|fcntl|hashlib|shutil)$|signal\.signal|disk_usage|flock|"
                         r"sha256_of|digest", code, re.M)
    assert len(lines_of("configurator.py")) <= 160


def test_prepare_is_short_and_hands_its_jobs_to_libraries():
    lines = lines_of("prepare_wikipedia.py")
    assert len(lines) <= 450, f"prepare_wikipedia.py is {len(lines)} lines"
    code = "\n".join(lines)
    # retries are urllib3's, tokenizer threads tiktoken's, signals cli.py's: no pool of processes, no loop of its own
    assert not re.search(r"ProcessPoolExecutor|multiprocessing|signal\.signal|time\.sleep|RETRY_WAIT|hashlib", code)


def test_the_top_level_shows_the_design():
    entries = {name.split("/")[0] for name in tracked_files() if not name.startswith(".")}
    assert len(entries) <= 22, sorted(entries)
    design = {"model_baseline.py", "model_future_attn.py", "model_encdec.py", "train.py", "prepare_wikipedia.py",
              "configurator.py", "sample.py", "README.md", "test_models.py", "config", "LICENSE"}
    assert design <= entries
    assert "python -m pytest -q" in "\n".join(lines_of("README.md")[:60])  # the test command on the first screen
