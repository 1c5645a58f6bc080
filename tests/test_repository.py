"""
The repository stands on its own: no tracked file points a reader at material that is not in
it (a specification or numbered source files our users never had, a folder beside the clone).
The write-ups, the blog post and the notebook are named as a reader finds them.
Run: python -m pytest -q test_repository.py
"""

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
