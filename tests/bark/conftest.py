"""Fixtures for the Bark tests: one tiny random-weight checkpoint per session, loaded on CPU."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def tiny_bark_dir(tmp_path_factory):
    from bark_fixtures import write_tiny_bark

    return write_tiny_bark(tmp_path_factory.mktemp("bark") / "tiny-bark")


@pytest.fixture(scope="session")
def bark_voice(tiny_bark_dir):
    import voxserve

    return voxserve.load_voice(f"bark:{tiny_bark_dir}", device="cpu")
