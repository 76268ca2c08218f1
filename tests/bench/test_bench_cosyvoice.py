"""The CosyVoice 2 suite of the bench harness (benchmarks/bench_cosyvoice.py), found by `voxserve
bench --suites cosyvoice` in a source checkout: the model folder it builds loads through the
real loader and its sentences end just past their minimum length; a tiny real run on the CPU
fits the JSON checks and renders; without the reference venv its side is reported skipped, with
it (where scripts/cosyvoice-reference has run) the reference serves the same folder. No timing
thresholds."""

from __future__ import annotations

import copy
import sys

import pytest
from harness import BenchSettings, render_markdown, run_bench, validate_result
from harness.suites import SUITES, checkout_suites, find_suite

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # the suite builds its models into the user cache: keep the tests' out of the real one
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def bench():
    find_suite("cosyvoice")
    return sys.modules["bench_cosyvoice"]


@pytest.fixture(scope="module")
def result(bench, tiny_voice_path, tmp_path_factory):
    import os

    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.getbasetemp() / "cache")
    mp = pytest.MonkeyPatch()
    mp.setattr(bench, "reference_unavailable", lambda: "not in this test")
    try:
        settings = BenchSettings(voice=str(tiny_voice_path), device="cpu", runs=1, warmup=0, suites=("cosyvoice",),
                                 quick=True, memory=False)
        return run_bench(settings, progress=False, command="voxserve bench (cosyvoice test)")
    finally:
        mp.undo()


def test_found_in_the_checkout_and_registered(bench):
    assert "cosyvoice" in checkout_suites()
    assert find_suite("cosyvoice") is SUITES["cosyvoice"]


def test_the_built_folder_loads_and_its_sentences_end_past_their_minimum(bench):
    import voxserve
    from voxserve import SynthesisOptions

    folder = bench.model_folder("tiny")
    voice = voxserve.load_voice(f"cosyvoice2:{folder}", device="cpu")
    assert voice.speakers == [bench.SPEAKER]
    for k, text in enumerate(bench.TEXTS[:3]):
        (unit,) = list(voice.units(text, SynthesisOptions(seed=k)))
        lo = unit.payload.min_tokens
        audio = voice.run_units([unit])[0]
        tokens = len(audio) / 24000 * 25  # 25 speech tokens a second
        assert lo <= round(tokens) <= lo + 12, (text, lo, tokens)


def test_tiny_run_fits_the_schema_and_reports_every_row(result):
    validate_result(result)
    sec = result["suites"]["cosyvoice"]
    assert sec["model"] == "tiny" and sec["reference"] == {"status": "skipped", "reason": "not in this test"}
    assert [(r["mode"], r.get("concurrency", r.get("batch"))) for r in sec["rows"]] == [
        ("stream", 1), ("stream", 2), ("offline", 4)]
    for r in sec["rows"]:
        us = r["voxserve"]
        assert us["rtf"]["median"] > 0 and us["audio_s"] > 0 and "reference" not in r
        if r["mode"] == "stream":
            assert 0 < us["first_chunk_s"]["median"] <= us["first_chunk_max_s"]
    md = render_markdown(result)
    assert "CosyVoice 2" in md and "stream x2" in md and "offline batch 4" in md and "not in this test" in md


def test_check_catches_a_broken_section(result):
    bad = copy.deepcopy(result)
    bad["suites"]["cosyvoice"]["rows"][0]["voxserve"]["first_chunk_s"]["median"] = 0
    with pytest.raises(ValueError, match=r"suites.cosyvoice.rows\[0\].voxserve.first_chunk_s"):
        validate_result(bad)


def test_the_reference_serves_the_same_folder(bench):
    if bench.reference_unavailable():
        pytest.skip("the reference venv is absent (scripts/cosyvoice-reference)")
    folder = bench.model_folder("tiny")
    ours = bench.VoxserveSide(folder, "cpu", 1)
    try:
        ref = bench.ReferenceSide(folder, "cpu", 1, ours.token_ids())
        try:
            a, b = ours.stream(2, 0), ref.stream(2, 0)
        finally:
            ref.close()
    finally:
        ours.close()
    # the same texts and prompt: both stop just past the same minimum lengths
    assert abs(a["audio_s"] - b["audio_s"]) <= 0.5 * 2, (a, b)
    assert all(x > 0 for x in a["first_s"] + b["first_s"])
