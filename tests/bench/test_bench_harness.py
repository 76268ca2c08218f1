"""The bench harness itself: a tiny real run on the tiny voice, the JSON shape, the ratios, the
report and the plots. No timing thresholds: the figures' values are not tested, only that they
are measured, consistent with their runs, and compared with the reference correctly."""

from __future__ import annotations

import copy
import json
import math

import pytest
from harness import (
    ArmSpec,
    BenchSettings,
    SchemaError,
    main,
    render_markdown,
    run_bench,
    validate_result,
    write_plots,
)
from harness.arms import CPU_ARMS, CUDA_ARMS, availability, runtime_fields

# one tiny real run shared by this module's tests (a conftest.py here would shadow other
# directories' `from conftest import ...`)
VOX = next(a for a in CPU_ARMS if a.name == "vox-cpu")
NOCL = ArmSpec("vox-cpu-nocl", "voxserve, cpu_channels_last off", runtime={"cpu_channels_last": False})
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


@pytest.fixture(scope="module")
def tiny_result(tiny_voice_path):
    """One real run: voxserve (two CPU configurations), Piper, and a configuration whose
    RuntimeOptions field does not exist; peak memory through child processes."""
    return run_bench(
        tiny_settings(tiny_voice_path),
        progress=False,
        command="voxserve bench (test)",
        arms=[VOX, NOCL, MISSING, PIPER],
    )


def test_tiny_run_fits_the_schema_and_survives_json(tiny_result):
    validate_result(tiny_result)
    again = json.loads(json.dumps(tiny_result))
    assert validate_result(again) == tiny_result


def test_every_configuration_is_reported_none_dropped(tiny_result):
    status = {a["name"]: a for a in tiny_result["arms"]}
    assert set(status) == {"vox-cpu", "vox-cpu-nocl", "vox-cpu-future", "piper-cpu"}
    assert (
        status["vox-cpu"]["status"]
        == status["piper-cpu"]["status"]
        == status["vox-cpu-nocl"]["status"]
        == "ok"
    )
    fut = status["vox-cpu-future"]
    assert fut["status"] == "unavailable"
    assert "not available in this build" in fut["reason"] and "no_such_field_yet" in fut["reason"]
    rows = [r for r in tiny_result["suites"]["configs"]["rows"] if r["arm"] == "vox-cpu-future"]
    assert [r["batch"] for r in rows] == [1, 2] and all(
        "not available in this build" in r["reason"] for r in rows
    )
    assert tiny_result["references"] == ["piper-cpu"]


def test_figures_are_medians_of_the_timed_runs(tiny_result):
    for row in tiny_result["suites"]["configs"]["rows"]:
        if row["status"] != "ok":
            continue
        lat = row["latency_s"]
        assert lat["n"] == 2 and len(lat["runs"]) == 2
        assert math.isclose(lat["median"], sum(lat["runs"]) / 2)
        assert row["audio_s"] > 0 and row["rtf"] > 0
        assert math.isclose(row["throughput"], 1 / row["rtf"])
    b = tiny_result["suites"]["batching"]["rows"]
    assert [r["sentences"] for r in b] == [1, 2]
    for r in b:
        assert math.isclose(
            r["speedup"], r["sequential"]["latency_s"]["median"] / r["batched"]["latency_s"]["median"]
        )


def test_ratios_are_against_the_reference_of_the_same_run(tiny_result):
    rows = {(r["arm"], r["batch"]): r for r in tiny_result["suites"]["configs"]["rows"]}
    for b in (1, 2):
        ref = rows[("piper-cpu", b)]
        for arm in ("vox-cpu", "vox-cpu-nocl", "piper-cpu"):
            r = rows[(arm, b)]
            vs = r["vs"]["piper-cpu"]
            assert math.isclose(vs["latency_speedup"], ref["latency_s"]["median"] / r["latency_s"]["median"])
            assert math.isclose(vs["throughput_ratio"], r["throughput"] / ref["throughput"])
        assert math.isclose(ref["vs"]["piper-cpu"]["latency_speedup"], 1.0)
    for r in tiny_result["suites"]["stream"]["rows"]:
        if r["arm"] == "piper-cpu":
            assert math.isclose(r["vs"]["piper-cpu"]["first_audio_speedup"], 1.0)
            assert math.isclose(r["vs"]["piper-cpu"]["total_speedup"], 1.0)
    two = tiny_result["suites"]["batching"]["rows"][1]
    ref = two["vs"]["piper-cpu"]
    assert math.isclose(
        ref["batched_speedup"],
        ref["sequential"]["latency_s"]["median"] / two["batched"]["latency_s"]["median"],
    )


def test_peak_memory_from_child_processes(tiny_result):
    rows = {(r["arm"], r["batch"]): r for r in tiny_result["suites"]["configs"]["rows"]}
    for arm in ("vox-cpu", "piper-cpu", "vox-cpu-nocl"):
        m = rows[(arm, 2)]["memory"]  # the largest workload is probed
        assert m["kind"] == "rss" and m["peak_mb"] > 20 and 0 <= m["run_mb"] <= m["peak_mb"]
        assert m["loaded_mb"] <= m["peak_mb"]
    assert rows[("vox-cpu", 1)]["memory"] is None  # memory_largest_only
    r = rows[("vox-cpu", 2)]
    assert math.isclose(
        r["vs"]["piper-cpu"]["memory_ratio"],
        r["memory"]["peak_mb"] / rows[("piper-cpu", 2)]["memory"]["peak_mb"],
    )
    mem = tiny_result["suites"]["batching"]["rows"][1]["memory"]
    assert mem["batched"]["peak_mb"] > 0 and mem["sequential"]["peak_mb"] > 0


def test_stream_measures_first_audio_before_the_end(tiny_result):
    rows = [r for r in tiny_result["suites"]["stream"]["rows"] if r["status"] == "ok"]
    assert {r["category"] for r in rows} == {"short", "medium"}
    assert {r["arm"] for r in rows} == {"vox-cpu", "piper-cpu"}
    for r in rows:
        assert 0 < r["first_audio_s"]["median"] <= r["total_s"]["max"]
        for first, total in zip(r["first_audio_s"]["runs"], r["total_s"]["runs"]):
            assert first <= total


def test_machine_section(tiny_result):
    m = tiny_result["machine"]
    assert m["cpu"] and m["cpu_count"] >= 1 and m["torch"] and m["onnxruntime"] and m["piper_tts"]
    assert tiny_result["voice"]["sample_rate"] == 16000
    vox = next(a for a in tiny_result["arms"] if a["name"] == "vox-cpu")
    assert vox["info"]["dtype"] == "float32"


def test_report_renders_every_table(tiny_result):
    md = render_markdown(tiny_result, plots=[("Latency vs batch size", "plots/latency_vs_batch.png")])
    for heading in (
        "### 1. Sequential vs batched synthesis",
        "### 2. Configurations side by side",
        "### 3. Time to first audio",
        "**Batch 1**",
        "**Batch 2**",
        "Peak RSS (MB)",
    ):
        assert heading in md
    for arm in tiny_result["arms"]:
        assert arm["label"] in md
    assert "not available in this build: RuntimeOptions has no field 'no_such_field_yet'" in md
    assert "voxserve bench (test)" in md and "![Latency vs batch size](plots/latency_vs_batch.png)" in md
    # every table row has the header's number of cells
    for block in md.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.startswith("| ")]
        if lines:
            widths = {ln.replace("\\|", "").count("|") for ln in lines}
            assert len(widths) == 1, block


def test_plots_are_written(tiny_result, tmp_path):
    paths = write_plots(tiny_result, tmp_path)
    assert sorted(p.name for p in paths) == [
        "first_audio_by_length.png",
        "latency_vs_batch.png",
        "throughput_vs_batch.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_schema_check_catches_broken_results(tiny_result):
    bad = copy.deepcopy(tiny_result)
    bad["suites"]["configs"]["rows"][0]["latency_s"]["median"] = -1.0
    with pytest.raises(SchemaError, match="min/median/max"):
        validate_result(bad)
    bad = copy.deepcopy(tiny_result)
    bad["references"] = ["vox-cpu-future"]
    with pytest.raises(SchemaError, match="not a measured arm"):
        validate_result(bad)
    bad = copy.deepcopy(tiny_result)
    next(a for a in bad["arms"] if a["name"] == "vox-cpu-future")["reason"] = None
    with pytest.raises(SchemaError, match="without a reason"):
        validate_result(bad)
    bad = copy.deepcopy(tiny_result)
    del bad["machine"]
    with pytest.raises(SchemaError, match="missing 'machine'"):
        validate_result(bad)


# ---------------------------------------------------------------------------- the table
def test_configuration_table_is_well_formed():
    for table in (CPU_ARMS, CUDA_ARMS):
        names = [a.name for a in table]
        assert len(names) == len(set(names))
        assert sum(a.primary for a in table) == 1 and any(a.reference for a in table)
    # every CPU row's fields exist in this build: a typo would silently read "not available"
    fields = runtime_fields()
    for a in CPU_ARMS:
        assert set(a.runtime) <= fields, a.name
        assert availability(a) is None, a.name


def test_cuda_rows_say_why_they_cannot_run_here():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    for a in CUDA_ARMS:
        if a.device == "cuda":
            why = availability(a)
            assert why and (
                "no CUDA device" in why
                or "not available in this build" in why
                or "CUDAExecutionProvider" in why
            ), (a.name, why)


def test_from_json_writes_report_json_plots_and_a_docs_section(tiny_result, tmp_path, capsys):
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(tiny_result))
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    docs.write_text(
        "# Benchmarks\n\nHand-written intro.\n\n<!-- voxserve-bench:cpu:begin -->\nold\n"
        "<!-- voxserve-bench:cpu:end -->\n\nHand-written outro.\n"
    )
    out = tmp_path / "out"
    rc = main(
        [
            "bench",
            "--from-json",
            str(saved),
            "--markdown",
            str(docs),
            "--plot",
            str(tmp_path / "docs" / "img"),
            "--json",
            str(tmp_path / "copy.json"),
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "### 2. Configurations side by side" in stdout
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written intro.") and text.rstrip().endswith(
        "Hand-written outro."
    )
    assert "old" not in text and "### 1. Sequential vs batched synthesis" in text
    assert "](img/latency_vs_batch.png)" in text  # links relative to the Markdown file
    assert json.loads((tmp_path / "copy.json").read_text()) == tiny_result
    assert {p.name for p in out.iterdir()} >= {"bench.json", "report.md"}
    assert (tmp_path / "docs" / "img" / "throughput_vs_batch.png").exists()
