"""The benchmark tests share one tiny real run (a few seconds, most of it child processes)."""

from __future__ import annotations

import pytest

from voxserve.bench import ArmSpec, BenchSettings, run_bench
from voxserve.bench.arms import CPU_ARMS

VOX = next(a for a in CPU_ARMS if a.name == "vox-cpu")
NOCL = next(a for a in CPU_ARMS if a.name == "vox-cpu-nocl")
PIPER = next(a for a in CPU_ARMS if a.name == "piper-cpu")
MISSING = ArmSpec(
    "vox-cpu-future", "voxserve with a field this build lacks", runtime={"no_such_field_yet": True}
)


def tiny_settings(voice, **kw) -> BenchSettings:
    base = dict(
        voice=str(voice),
        device="cpu",
        runs=2,
        warmup=1,
        sizes=(1, 2),
        batches=(1, 2),
        categories=("short", "medium"),
        texts_per_category=1,
        memory_largest_only=True,
        jobs=2,
    )
    base.update(kw)
    return BenchSettings(**base)


@pytest.fixture(scope="session")
def tiny_result(tiny_voice_path):
    """One real run: voxserve (two CPU configurations), Piper, and a configuration whose
    RuntimeOptions field does not exist; peak memory through child processes."""
    return run_bench(
        tiny_settings(tiny_voice_path),
        progress=False,
        command="voxserve bench (test)",
        arms=[VOX, NOCL, MISSING, PIPER],
    )
