"""The bench harness on a CUDA GPU (skipped without one; scripts/gpu-check runs these)."""

from __future__ import annotations

import pytest
from harness import BenchSettings, render_markdown, run_bench, validate_result
from harness.arms import CUDA_ARMS, runtime_fields

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def cuda_result(tiny_voice_path):
    # every quick CUDA row (precisions, CUDA Graphs, offload) on the tiny voice; compile rows
    # are left to the benchmark itself (minutes of compilation)
    arms = [a for a in CUDA_ARMS if a.quick]
    settings = BenchSettings(
        voice=str(tiny_voice_path),
        device="cuda",
        runs=2,
        warmup=1,
        sizes=(1, 2),
        batches=(1, 2),
        categories=("short",),
        texts_per_category=1,
        memory_largest_only=True,
    )
    return run_bench(settings, progress=False, arms=arms)


def test_cuda_rows_run_or_say_why(cuda_result):
    validate_result(cuda_result)
    fields = runtime_fields()
    for a in cuda_result["arms"]:
        if a["engine"] != "voxserve":
            continue
        if set(a["runtime"]) <= fields:
            assert a["status"] == "ok", (a["name"], a["reason"])  # a feature that exists must run
        else:
            assert a["status"] == "unavailable" and "not available in this build" in a["reason"]
    assert cuda_result["machine"]["gpu"]["name"]


def test_cuda_peak_memory_and_reference(cuda_result):
    rows = {(r["arm"], r["batch"]): r for r in cuda_result["suites"]["configs"]["rows"]}
    fp32 = rows[("vox-cuda-fp32", 2)]
    assert fp32["memory"]["kind"] == "cuda" and fp32["memory"]["peak_mb"] > 0
    fp16 = rows[("vox-cuda-fp16", 2)]
    assert fp16["status"] == "ok" and fp16["memory"]["peak_mb"] > 0
    assert "piper-cpu" in cuda_result["references"]
    assert fp32["vs"]["piper-cpu"]["memory_ratio"] is None  # GPU bytes are not compared with a CPU RSS
    assert fp32["vs"]["piper-cpu"]["latency_speedup"] > 0
    md = render_markdown(cuda_result)
    assert "Peak memory (MB)" in md and "(GPU)" in md
