"""Shared fixtures: the default voice (real), a tiny multi-speaker VITS, the corpus."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "corpus" / "en_bench.jsonl"
BENCHMARKS = ROOT / "benchmarks"
"""Developer tools the tests also use (bark_random.py, bench_bark.py): outside the package."""
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))


def pytest_configure(config):
    # one converted-weights cache per test session, never the user's
    if "VOXSERVE_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["VOXSERVE_CACHE_DIR"] = tempfile.mkdtemp(prefix="voxserve-test-cache-")


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def corpus() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def joe_voice():
    import voxserve

    return voxserve.load_voice(device="cpu")


@pytest.fixture(scope="session")
def tiny_voice_path(tmp_path_factory) -> Path:
    from vits_fixtures import write_tiny_voice

    return write_tiny_voice(tmp_path_factory.mktemp("voices"))


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for the test: tiny models' ops are microseconds long, and on a shared
    2-core machine a second thread only adds contention (measured on the tiny Bark: 0.35 s with
    one thread vs 7 s with two for the same batch)."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
