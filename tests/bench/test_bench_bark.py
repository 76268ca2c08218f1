"""The Bark suite of the bench harness (benchmarks/bench_bark.py): registration, a tiny real run on
the CPU (random-weight tiny Bark, a few semantic tokens), the JSON section and its ratios to the
base row, the Markdown table, the CPU memory probe, and scripts/bark-bench's translation. No
timing thresholds: only that figures are measured, consistent with their runs, and compared
with the base row of the same run."""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import math
from pathlib import Path

import pytest
from bench_bark import (
    BASE,
    CONFIGS,
    BarkArm,
    BarkBenchSettings,
    BarkSuite,
    bark_arms,
    build_parser,
    main,
    model_settings,
)
from harness import BenchSettings, render_markdown, run_bench, settings_from, validate_result
from harness.arms import ENGINES
from harness.core import plan
from harness.suites import SUITES

TOKENS = 4  # semantic tokens a sentence: 6 coarse frames, 0.08 s of audio
CUDA_ONLY = {c.name for c in CONFIGS if c.cuda_only}


def bark_settings(voice, **kw) -> BenchSettings:
    base = {
        "voice": str(voice),
        "device": "cpu",
        "runs": 2,
        "warmup": 1,
        "batches": (1, 2),
        "suites": ("bark",),
        "bark_size": "tiny",
        "bark_tokens": TOKENS,
        "memory": False,
    }
    base.update(kw)
    return BarkBenchSettings(**base)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):  # as in tests/bark: the tiny model's ops are microseconds long
    yield


@pytest.fixture(scope="module")
def bark_result(tiny_voice_path):
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # before the harness records its default thread count
    try:
        return run_bench(bark_settings(tiny_voice_path), progress=False, command="voxserve bench (bark test)")
    finally:
        torch.set_num_threads(prev)


# ---------------------------------------------------------------------------- registration
def test_suite_and_engine_are_registered():
    assert SUITES["bark"] is BarkSuite and ENGINES["bark"] is BarkArm
    assert [c.name for c in CONFIGS] == [
        "bark-base",
        "bark-sdpa",
        "bark-fp16",
        "bark-sdpa-fp16",
        "bark-offload-fp16",
    ]
    cpu = bark_arms(BenchSettings(), "cpu")
    cuda = bark_arms(BenchSettings(), "cuda")
    assert [a.name for a in cpu] == ["bark-base", "bark-sdpa"]  # fp16 and offload need CUDA
    assert [a.name for a in cuda] == [c.name for c in CONFIGS]
    assert all(a.engine == "bark" and a.suite == "bark" for a in cpu + cuda)
    by = {a.name: a for a in cuda}
    assert by["bark-base"].dtype is None and by["bark-base"].runtime["attention"] == "eager"
    assert by["bark-sdpa-fp16"].dtype == "fp16" and by["bark-sdpa-fp16"].runtime["attention"] == "sdpa"
    assert by["bark-offload-fp16"].runtime["offload"] is True
    # defaults: bark-small at 256 tokens on CUDA (the seed's table); a tiny one on the CPU
    assert model_settings(BenchSettings(), "cuda") == ("small", 256)
    assert model_settings(BenchSettings(), "cpu") == ("tiny", 16)
    assert model_settings(BarkBenchSettings(bark_size="small", bark_tokens=32), "cpu") == ("small", 32)
    assert bark_arms(BarkBenchSettings(bark_runs=2), "cpu")[0].runs == 2


def test_cpu_rows_only_on_cpu_and_every_cuda_row_says_why(tiny_voice_path):
    import torch

    pl = plan(bark_settings(tiny_voice_path), device="cpu")
    assert [a["name"] for a in pl["arms"]] == ["bark-base", "bark-sdpa"]
    assert all(a["status"] == "would run" and a["tasks"] == 2 for a in pl["arms"])
    if not torch.cuda.is_available():
        pl = plan(bark_settings(tiny_voice_path), device="cuda")
        assert [a["name"] for a in pl["arms"]] == [c.name for c in CONFIGS]
        assert all("no CUDA device" in a["reason"] for a in pl["arms"])


def test_bark_arms_run_only_the_bark_suite(tiny_voice_path):
    pl = plan(bark_settings(tiny_voice_path, suites=("configs", "bark"), configs=("vox-cpu",)), device="cpu")
    tasks = {a["name"]: a["tasks"] for a in pl["arms"]}
    # vox-cpu: configs/1 and configs/2; the Bark arms: bark/1 and bark/2 (not the configs suite's)
    assert tasks == {"vox-cpu": 2, "piper-cpu": 2, "bark-base": 2, "bark-sdpa": 2}
    assert {a["name"]: a["suite"] for a in pl["arms"]}["bark-sdpa"] == "bark"


def test_configs_picks_bark_rows_too(tiny_voice_path):
    pl = plan(bark_settings(tiny_voice_path, configs=("bark-sdpa",)), device="cpu")
    assert [a["name"] for a in pl["arms"]] == ["bark-sdpa"]
    pl = plan(bark_settings(tiny_voice_path, suites=("configs", "bark"), configs=("vox-cpu",)), device="cpu")
    assert {"bark-base", "bark-sdpa"} <= {a["name"] for a in pl["arms"]}  # not named: all of them
    with pytest.raises(ValueError, match="unknown configuration.*bark-base"):
        plan(bark_settings(tiny_voice_path, configs=("bark-nope",)), device="cpu")


# ---------------------------------------------------------------------------- a tiny run
def test_configs_table_has_no_bark_rows(tiny_voice_path):
    settings = bark_settings(tiny_voice_path, suites=("configs", "bark"), configs=("vox-cpu",),
                             batches=(1,), runs=1, warmup=0)
    result = run_bench(settings, progress=False, command="voxserve bench (bark test)")
    assert {r["arm"] for r in result["suites"]["configs"]["rows"]} == {"vox-cpu", "piper-cpu"}
    assert {r["arm"] for r in result["suites"]["bark"]["rows"]} == {"bark-base", "bark-sdpa"}


def test_tiny_run_fits_the_schema(bark_result):
    validate_result(bark_result)
    assert list(bark_result["suites"]) == ["bark"]
    assert [(a["name"], a["status"]) for a in bark_result["arms"]] == [
        ("bark-base", "ok"),
        ("bark-sdpa", "ok"),
    ]
    info = bark_result["arms"][0]["info"]
    assert info["size"] == "tiny" and info["semantic_tokens"] == TOKENS and info["dtype"] == "float32"


def test_rows_and_ratios_against_the_base_row(bark_result):
    sec = bark_result["suites"]["bark"]
    assert sec["base"] == BASE and sec["batches"] == [1, 2]
    model = sec["model"]
    assert (model["size"], model["semantic_tokens"], model["coarse_frames"]) == ("tiny", TOKENS, 6)
    rows = {(r["arm"], r["batch"]): r for r in sec["rows"]}
    assert set(rows) == {("bark-base", 1), ("bark-base", 2), ("bark-sdpa", 1), ("bark-sdpa", 2)}
    assert not any(arm in CUDA_ONLY for arm, _ in rows)
    for (arm, b), r in rows.items():
        assert r["status"] == "ok" and r["latency_s"]["n"] == 2
        # random weights never stop early: every sentence is exactly the token budget's audio
        assert math.isclose(r["audio_s"], b * model["audio_s_per_sentence"])
        assert math.isclose(r["throughput"], 1 / r["rtf"])
        assert math.isclose(r["sentences_per_s"], b / r["latency_s"]["median"])
        base = rows[(BASE, b)]
        vs = r["vs_base"]
        assert math.isclose(vs["latency_speedup"], base["latency_s"]["median"] / r["latency_s"]["median"])
        assert math.isclose(vs["throughput_ratio"], r["throughput"] / base["throughput"])
        assert vs["memory_ratio"] is None and r["memory"] is None  # --no-memory
        one = rows[(arm, 1)]
        assert math.isclose(r["throughput_vs_batch1"], r["throughput"] / one["throughput"])
    for b in (1, 2):
        assert math.isclose(rows[(BASE, b)]["vs_base"]["latency_speedup"], 1.0)
    assert sec["workloads"]["2"] == [0, 1] and len(sec["workloads"]["1"]) == 1


def test_markdown_table(bark_result):
    md = render_markdown(bark_result)
    assert "### Bark: attention, precision, offload, batching" in md
    assert "| Configuration | Batch | Latency (s), median (fastest) | × base speed |" in md
    assert "Bark base (fp32, eager attention) | 1 |" in md and "Bark SDPA (fp32) | 2 |" in md
    assert "1.00×" in md and "tiny Bark" in md
    assert "Bark FP16" not in md and "offload + FP16" not in md  # CUDA-only rows: not on the CPU
    for block in md.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.startswith("| ")]
        if lines:
            assert len({ln.count("|") for ln in lines}) == 1, block


def test_schema_check_covers_the_bark_section(bark_result):
    from harness import SchemaError

    bad = copy.deepcopy(bark_result)
    bad["suites"]["bark"]["rows"][0]["latency_s"]["median"] = -1.0
    with pytest.raises(SchemaError, match=r"suites.bark.rows\[0\].latency_s"):
        validate_result(bad)
    bad = copy.deepcopy(bark_result)
    bad["suites"]["bark"]["rows"][1]["arm"] = "bark-nope"
    with pytest.raises(SchemaError, match="not among arms"):
        validate_result(bad)


def test_unmeasured_rows_keep_their_reason(bark_result):
    """A row that did not run (here: made unavailable after the fact) renders with its reason and
    leaves the others' ratios alone; without a base row there are no ratios."""
    from harness.arms import Sentence
    from harness.measure import Sample
    from harness.suites import Context, Results

    settings = bark_settings("unused")
    pool = [Sentence(0, i, f"sentence {i}.", (1,) * (i + 1)) for i in range(2)]
    ctx = Context(settings, [], pool, [], bark_arms(settings, "cpu"), "cpu")
    res = Results()
    res.status = {"bark-base": ("unavailable", "no transformers"), "bark-sdpa": ("ok", None)}
    for b in (1, 2):
        res.samples[("bark-sdpa", f"bark/{b}")] = [Sample(1.0 * b, 0.08 * b), Sample(2.0 * b, 0.08 * b)]
        res.memory[("bark-sdpa", f"bark/{b}")] = {"kind": "rss", "peak_mb": 500.0 + b}
    sec = BarkSuite().build(ctx, res, [])
    rows = {(r["arm"], r["batch"]): r for r in sec["rows"]}
    assert rows[("bark-base", 1)]["reason"] == "no transformers" and "latency_s" not in rows[("bark-base", 1)]
    sdpa = rows[("bark-sdpa", 2)]
    assert sdpa["latency_s"]["median"] == 3.0 and sdpa["vs_base"] is None
    assert math.isclose(sdpa["throughput_vs_batch1"], 1.0)
    md = BarkSuite().markdown(bark_result, sec)
    assert "Bark base (fp32, eager attention) — *no transformers*" in md and "Peak RSS (MB)" in md


@pytest.mark.slow
def test_cpu_peak_memory_from_a_child_process(tiny_voice_path):
    """The harness's CPU memory probe builds a Bark row in a fresh process (the engine is
    registered there too) and reports that process's peak RSS."""
    from harness.arms import Sentence
    from harness.measure import Task, probe_request, run_probe

    spec = bark_arms(bark_settings(tiny_voice_path), "cpu")[1]
    pool = [Sentence(0, 0, "Hello there.", (1, 2, 3))]
    task = Task("bark", "bark/1", "batch", (0,), memory=True, engine="bark")
    r = run_probe(probe_request(spec, None, 1234, task, pool, ["Hello there."]), timeout_s=300)
    assert 0 < r["loaded_rss"] <= r["peak_rss"]


# ---------------------------------------------------------------------------- command line
def test_cli_options_and_listing(capsys):
    ns = build_parser().parse_args(
        ["bench", "--suites", "bark", "--bark-size", "small", "--bark-tokens", "32"]
    )
    s = settings_from(ns, BarkBenchSettings)
    assert (s.suites, s.bark_size, s.bark_tokens, s.bark_runs) == (("bark",), "small", 32, None)
    assert settings_from(build_parser().parse_args(["bench"]), BarkBenchSettings) == BarkBenchSettings()
    with pytest.raises(ValueError, match="bark_tokens"):
        settings_from(build_parser().parse_args(["bench", "--bark-tokens", "0"]), BarkBenchSettings)
    assert main(["bench", "--list-configs", "--suites", "bark"]) == 0
    out = capsys.readouterr().out
    assert "suite bark, CPU:" in out and "suite bark, CUDA:" in out and "bark-offload-fp16" in out
    assert main(["bench", "--list-configs"]) == 0
    assert "--suites ...,bark" in capsys.readouterr().out


def test_dry_run_shows_the_bark_rows(tiny_voice_path, capsys):
    args = ["bench", "--dry-run", "--voice", str(tiny_voice_path), "--device", "cpu", "--suites", "bark"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "bark-base" in out and "bark-sdpa" in out and "[suite bark]" in out and "bark-fp16" not in out


def _bark_bench_script():
    path = Path(__file__).resolve().parents[2] / "scripts" / "bark-bench"
    loader = importlib.machinery.SourceFileLoader("bark_bench_script", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_bark_bench_script_is_voxserve_bench_suites_bark():
    script = _bark_bench_script()
    args, threads = script.bench_args(
        ["--device", "cpu", "--size", "tiny", "--tokens", "8", "--configs", "base,sdpa"]
        + ["--threads", "1", "--max-minutes", "2"]
    )
    assert threads == 1
    assert args[:3] == ["bench", "--suites", "bark"]
    joined = " ".join(args)
    for part in (
        "--device cpu",
        "--bark-size tiny",
        "--bark-tokens 8",
        "--configs bark-base,bark-sdpa",
        "--runs 3",
        "--batches 1,8",
        "--no-memory",
        "--max-minutes 2",
    ):
        assert part in joined, part
    settings_from(build_parser().parse_args(args), BarkBenchSettings)  # the harness takes every option it passes
    args, _ = script.bench_args(["--device", "cuda"])
    assert "--no-memory" not in args and "--bark-tokens" not in args  # CUDA: 256 tokens, GPU peaks


# ---------------------------------------------------------------------------- CUDA (gpu-check)
@pytest.mark.cuda
def test_every_row_runs_on_cuda(tiny_voice_path):
    result = run_bench(bark_settings(tiny_voice_path, device="cuda", runs=1), progress=False)
    validate_result(result)
    rows = {(r["arm"], r["batch"]): r for r in result["suites"]["bark"]["rows"]}
    assert {arm for arm, _ in rows} == {c.name for c in CONFIGS}
    for (arm, b), r in rows.items():
        assert r["status"] == "ok", (arm, r.get("reason"))
        assert r["memory"]["kind"] == "cuda" and r["memory"]["peak_mb"] > 0
        assert r["vs_base"]["memory_ratio"] > 0
    assert "Peak GPU memory (MB)" in render_markdown(result)
