"""Fixtures for the Bark tests: one tiny random-weight checkpoint per session, loaded on CPU."""

from __future__ import annotations

import pytest

TEXTS = [
    "hello world.", "i like pizza but also reading.", "the cat is on the mat.", "one two three four five six.",
    "a dog.", "this is a long sentence and i like it", "seven eight", "short",
]


@pytest.fixture(autouse=True)
def _one_thread():
    # the tiny model's ops are microseconds long: on a shared 2-core machine, intra-op threads
    # only add contention (measured 0.35 s with one thread vs 7 s with two for the same batch)
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="session")
def tiny_bark_dir(tmp_path_factory):
    from bark_fixtures import write_tiny_bark

    return write_tiny_bark(tmp_path_factory.mktemp("bark") / "tiny-bark")


@pytest.fixture(scope="session")
def bark_voice(tiny_bark_dir):
    import voxserve

    return voxserve.load_voice(f"bark:{tiny_bark_dir}", device="cpu")
