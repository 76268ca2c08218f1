"""The CPU-features A/B (benchmarks/bench_cpu_features.py): not in the product's table, found by
`python benchmarks/bench.py --suites cpu_features`, run next to vox-cpu and piper-cpu."""

from __future__ import annotations

from harness import BenchSettings, render_markdown, run_bench, validate_result
from harness.arms import CPU_ARMS
from harness.core import plan
from harness.suites import find_suite

FEATURE_ROWS = {"vox-cpu-nocl", "vox-cpu-padded", "vox-cpu-nogemm", "vox-cpu-nofold", "vox-cpu-skew",
                "vox-cpu-plain"}


def settings(voice, **kw) -> BenchSettings:
    base = dict(voice=str(voice), device="cpu", runs=1, warmup=0, batches=(1, 2), suites=("cpu_features",),
                memory=False)
    return BenchSettings(**{**base, **kw})


def test_the_product_table_holds_what_users_run():
    assert not FEATURE_ROWS & {a.name for a in CPU_ARMS}
    assert find_suite("cpu_features") is not None


def test_plan_runs_every_feature_row_beside_the_defaults_and_piper(tiny_voice_path):
    pl = plan(settings(tiny_voice_path), device="cpu")
    tasks = {a["name"]: a["tasks"] for a in pl["arms"]}
    assert tasks == {name: 2 for name in FEATURE_ROWS | {"vox-cpu", "piper-cpu"}}
    assert not FEATURE_ROWS & {a["name"] for a in plan(settings(tiny_voice_path), device="cuda")["arms"]}


def test_a_tiny_run_renders_and_validates(tiny_voice_path):
    result = run_bench(settings(tiny_voice_path, configs=("vox-cpu-nocl",), batches=(1,)), progress=False,
                       command="voxserve bench (cpu_features test)")
    validate_result(result)
    rows = {r["arm"]: r for r in result["suites"]["cpu_features"]["rows"]}
    assert set(rows) == {"vox-cpu-nocl", "piper-cpu"} and all(r["status"] == "ok" for r in rows.values())
    assert rows["vox-cpu-nocl"]["vs"]["piper-cpu"]["latency_speedup"] > 0
    md = render_markdown(result)
    assert "### voxserve's CPU speed features, each switched off" in md and "cpu_channels_last off" in md
