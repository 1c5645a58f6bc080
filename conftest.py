"""Fixtures that several test files use."""

import numpy as np
import pytest
import torch

DATA_VOCAB = 256  # the data_dir fixture's tokens are below this


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
