"""The SBV2 suite of the bench harness (benchmarks/bench_sbv2.py), found by `python benchmarks/bench.py
--suites sbv2`: a tiny real run on the CPU (the fixtures' tiny models), its
JSON section and checks, the Markdown tables, a CPU memory probe in a child process, and that the
engine row really runs one BERT stage across the 4 requests. No timing thresholds."""

from __future__ import annotations

import copy

import pytest
from harness import BenchSettings, render_markdown, run_bench, validate_result
from harness.arms import ENGINES
from harness.core import plan
from harness.suites import SUITES, checkout_suites, find_suite

pytest.importorskip("pyopenjtalk")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # the suite builds its models into the user cache: keep the tests' out of the real one
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))


def sbv2_settings(voice, **kw) -> BenchSettings:
    base = dict(voice=str(voice), device="cpu", runs=1, warmup=0, sizes=(2, 4), suites=("sbv2",), quick=True,
                memory=False)
    return BenchSettings(**{**base, **kw})


@pytest.fixture(scope="module")
def result(tiny_voice_path, tmp_path_factory):
    import os

    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.getbasetemp() / "cache")
    return run_bench(sbv2_settings(tiny_voice_path), progress=False, command="voxserve bench (sbv2 test)")


def test_found_in_the_checkout_and_registered():
    assert "sbv2" in checkout_suites() and "bark" in checkout_suites()
    cls = find_suite("sbv2")
    assert cls is SUITES["sbv2"] and ENGINES["sbv2"].__name__ == "Sbv2Arm"
    assert find_suite("no_such_suite") is None
    with pytest.raises(ValueError, match="unknown suite.*'sbv2'"):
        BenchSettings(suites=("no_such_suite",)).validate()


def test_plan_has_three_arms_with_their_rows(tiny_voice_path):
    pl = plan(sbv2_settings(tiny_voice_path, sizes=(1, 2, 4, 8, 16)), device="cpu")
    tasks = {a["name"]: a["tasks"] for a in pl["arms"]}
    # BERT: 2/4/8/16 (1 is no batch) x sequential + batched; text: 2/4/8; engine: one pair
    assert tasks == {"sbv2-bert": 8, "sbv2-text": 6, "sbv2-engine": 2}


def test_tiny_run_fits_the_schema_and_reports_every_row(result):
    validate_result(result)
    sec = result["suites"]["sbv2"]
    assert sec["model"] == "tiny" and set(sec["tables"]) == {"bert", "text", "engine"}
    assert [r["sentences"] for r in sec["tables"]["bert"]] == [2, 4]
    assert [r["sentences"] for r in sec["tables"]["text"]] == [2, 4]
    assert [r["sentences"] for r in sec["tables"]["engine"]] == [16]
    for rows in sec["tables"].values():
        for r in rows:
            assert r["status"] == "ok", r
            seq, bat = r["sequential"]["latency_s"]["median"], r["batched"]["latency_s"]["median"]
            assert r["speedup"] == pytest.approx(seq / bat)
    # the text rows make the same audio either way (noise 0): audio seconds agree within the
    # sentence silences synthesize puts between sentences
    for r in sec["tables"]["text"] + sec["tables"]["engine"]:
        assert r["batched"]["audio_s"] > 0 and r["sequential"]["audio_s"] > 0
    md = render_markdown(result)
    assert "Style-Bert-VITS2" in md and "**BERT**" in md and "4 requests together" in md


def test_check_catches_a_broken_section(result):
    bad = copy.deepcopy(result)
    bad["suites"]["sbv2"]["tables"]["bert"][0]["speedup"] = -1
    with pytest.raises(ValueError, match=r"suites.sbv2.tables.bert\[0\].speedup"):
        validate_result(bad)


def test_engine_row_runs_one_bert_stage_across_requests(tiny_voice_path):
    from harness.arms import make_arm

    arm = make_arm(next(s for s in SUITES["sbv2"]().extra_arms(_ctx(tiny_voice_path)) if s.name == "sbv2-engine"),
                   None)
    arm.open()
    try:
        calls = []
        run = arm.bert.run
        arm.bert.run = lambda xs: calls.append(len(xs)) or run(xs)
        requests = arm.prepare([None] * 16, [])
        assert len(requests) == 4
        together = arm.run_batch(requests)
        assert max(calls) > 4  # sentences of several requests in one forward
        calls.clear()
        alone = arm.run_sequential(requests)
        assert max(calls) <= 4  # each request batched alone
        for a, b in zip(together, alone):
            assert a.shape == b.shape and abs(a - b).max() < 1e-4
    finally:
        arm.close()


def test_cpu_memory_probe_loads_only_its_row_in_a_child(tiny_voice_path):
    from harness.arms import Sentence
    from harness.measure import Task, probe_request, run_probe

    spec = next(s for s in SUITES["sbv2"]().extra_arms(_ctx(tiny_voice_path)) if s.name == "sbv2-bert")
    pool = [Sentence(0, k, "", ()) for k in range(2)]
    task = Task("sbv2", "sbv2/bert/2/batched", "batch", (0, 1), memory=True)
    mem = run_probe(probe_request(spec, None, 0, task, pool, [""]), timeout_s=300)
    assert mem["peak_rss"] >= mem["loaded_rss"] > mem["start_rss"] > 0


def _ctx(voice):
    from harness.suites import Context

    return Context(sbv2_settings(voice), [], [], [], [], "cpu")
