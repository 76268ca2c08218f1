"""The benchmark's parts without a model: corpus, docs sections, failure isolation, ratios."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from harness import ArmSpec, BenchSettings, register_engine, run_bench, validate_result
from harness.arms import ENGINES, Arm
from harness.corpus import load_corpus, stream_selection
from harness.measure import Sample, stat
from harness.report import render_markdown, write_markdown_section
from harness.suites import mem_ratio, timing


# ---------------------------------------------------------------------------- corpus
def test_repository_corpus_and_stream_selection():
    corpus = load_corpus()
    assert {"short", "medium", "long"} <= {d["category"] for d in corpus}
    one = stream_selection(corpus, ("short", "medium", "long"), 1)
    assert [corpus[i]["category"] for i in one] == ["short", "medium", "long"]
    longs = sorted(len(d["text"]) for d in corpus if d["category"] == "long")
    assert len(corpus[one[2]]["text"]) == longs[len(longs) // 2]  # the median-length text
    two = stream_selection(corpus, ("long",), 2)
    assert len(two) == 2 and len(corpus[two[0]]["text"]) < len(corpus[two[1]]["text"])
    assert len(stream_selection(corpus, ("long",), 99)) == len(longs)


def test_user_corpus_jsonl_and_plain_text(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "Hi there."}\n\n{"id": "x", "category": "long", "text": "Long one."}\n')
    c = load_corpus(f)
    assert c == [
        {"id": "line-1", "category": "short", "text": "Hi there."},
        {"id": "x", "category": "long", "text": "Long one."},
    ]
    t = tmp_path / "c.txt"
    t.write_text("Short line.\n" + "word " * 40 + "\n   \n")
    c = load_corpus(t)
    assert [d["category"] for d in c] == ["short", "medium"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"txt": "no"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_corpus(bad)
    with pytest.raises(FileNotFoundError):
        load_corpus(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------- docs section
def test_markdown_section_is_replaced_in_place_or_appended(tmp_path):
    f = tmp_path / "b.md"
    write_markdown_section(f, "first", "cpu")
    write_markdown_section(f, "gpu report", "cuda")
    write_markdown_section(f, "second", "cpu")
    text = f.read_text()
    assert "first" not in text and text.index("second") < text.index("gpu report")
    assert text.count("voxserve-bench:cpu:begin") == 1 and text.count("voxserve-bench:cuda:end") == 1
    with pytest.raises(ValueError):
        write_markdown_section(f, "x", "bad name")


# ---------------------------------------------------------------------------- figures
def test_stat_and_timing():
    s = stat([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    t = timing([Sample(1.0, 10.0), Sample(3.0, 10.0), Sample(2.0, 10.0)])
    assert t["latency_s"]["median"] == 2.0 and t["audio_s"] == 10.0
    assert math.isclose(t["rtf"], 0.2) and math.isclose(t["throughput"], 5.0)


def test_memory_ratio_needs_the_same_kind():
    rss = {"kind": "rss", "peak_mb": 100.0}
    assert mem_ratio({"kind": "rss", "peak_mb": 50.0}, rss) == 0.5
    assert mem_ratio({"kind": "cuda", "peak_mb": 50.0}, rss) is None  # GPU bytes vs a CPU RSS: no ratio
    assert mem_ratio(None, rss) is None


# ---------------------------------------------------------------------------- failure isolation
class FakeArm(Arm):
    """A model-free engine: 0.1 s of audio per phoneme id, instantly; `fail` breaks a stage."""

    def open(self):
        if self.spec.runtime.get("fail") == "open":
            raise RuntimeError("cannot load")
        self.sample_rate = 1000
        self.calls = 0

    def prepare(self, sentences, texts):
        return [len(s.ids) for s in sentences]

    def run_batch(self, prepared):
        self.calls += 1
        if self.spec.runtime.get("fail") == "run" and self.calls > 1:  # the warm-up passes, then it breaks
            raise RuntimeError("device lost")
        if self.spec.runtime.get("fail") == "hang":
            time.sleep(60)  # a compiler or driver that never comes back
        return [np.zeros(100 * n, np.float32) for n in prepared]

    def run_sequential(self, prepared):
        return [self.run_batch([n])[0] for n in prepared]

    def stream(self, text):
        for word in text.split():
            yield np.zeros(100 * len(word), np.float32)


@pytest.fixture
def fake_engine():
    register_engine("fake", FakeArm)
    yield
    ENGINES.pop("fake")


def test_a_failing_configuration_loses_nothing_else(fake_engine, tiny_voice_path):
    arms = [
        ArmSpec("fake-ok", "fake, fine", engine="fake", primary=True, stream=True),
        ArmSpec("fake-ref", "fake reference", engine="fake", reference=True, stream=True),
        ArmSpec("fake-noload", "fake, fails to load", engine="fake", runtime={"fail": "open"}),
        ArmSpec("fake-breaks", "fake, breaks after warm-up", engine="fake", runtime={"fail": "run"}),
        ArmSpec("nope", "unknown engine", engine="no-such-engine"),
    ]
    settings = BenchSettings(
        voice=str(tiny_voice_path),
        device="cpu",
        runs=5,
        sizes=(1, 2),
        batches=(1, 2),
        categories=("short",),
        texts_per_category=1,
        memory=False,
    )
    result = validate_result(run_bench(settings, progress=False, arms=arms))
    st = {a["name"]: (a["status"], a["reason"]) for a in result["arms"]}
    assert st["fake-ok"] == ("ok", None) and st["fake-ref"] == ("ok", None)
    assert st["fake-noload"] == ("failed", "RuntimeError: cannot load")
    assert st["fake-breaks"] == ("failed", "RuntimeError: device lost")
    assert st["nope"][0] == "unavailable" and "unknown engine" in st["nope"][1]
    rows = {(r["arm"], r["batch"]): r for r in result["suites"]["configs"]["rows"]}
    ok = rows[("fake-ok", 2)]
    assert ok["latency_s"]["n"] == 5 and ok["audio_s"] > 0
    assert (
        rows[("fake-breaks", 2)]["reason"] == "RuntimeError: device lost"
        and "latency_s" not in rows[("fake-breaks", 2)]
    )
    md = render_markdown(result)
    assert (
        "**failed** — RuntimeError: device lost" in md
        and "fake, fails to load — *RuntimeError: cannot load*" in md
    )


def test_time_budget_interrupts_a_hanging_configuration(fake_engine, tiny_voice_path, monkeypatch):
    from harness import core

    # one arm after another, as on CUDA (the fake arms need no GPU)
    monkeypatch.setattr(core, "resolve_device", lambda device: "cuda")
    arms = [
        ArmSpec("fake-ref", "fake reference", engine="fake", reference=True),
        ArmSpec("fake-ok", "fake, fine", engine="fake", primary=True),
        ArmSpec("fake-hang", "fake, hangs", engine="fake", runtime={"fail": "hang"}),
        ArmSpec("fake-late", "fake, never reached", engine="fake"),
    ]
    settings = BenchSettings(
        voice=str(tiny_voice_path),
        runs=5,
        sizes=(1,),
        batches=(1,),
        suites=("configs",),
        memory=False,
        max_minutes=0.05,
    )
    t0 = time.perf_counter()
    result = validate_result(run_bench(settings, progress=False, arms=arms))
    assert time.perf_counter() - t0 < 30  # not the 60 s the hanging arm asked for
    st = {a["name"]: (a["status"], a["reason"]) for a in result["arms"]}
    assert st["fake-ref"][0] == st["fake-ok"][0] == "ok"
    assert st["fake-hang"][0] == "skipped" and "time budget" in st["fake-hang"][1]
    assert st["fake-late"][0] == "skipped"
    assert any("ran out" in n for n in result["notes"])
    assert "**skipped**" in render_markdown(result)


def test_a_new_suite_plugs_in_with_its_own_engine_tables_and_plots(fake_engine, tiny_voice_path, tmp_path):
    """The extension point another model family (Bark) uses: engine + suite + renderer + plot."""
    from harness import write_plots
    from harness.measure import Task
    from harness.suites import SUITES, Suite, register_suite, timing

    @register_suite
    class ExtraSuite(Suite):
        name, title = "extra", "An extra family"

        def pool_size(self, settings):
            return 2

        def extra_arms(self, ctx):
            return [ArmSpec("extra-fake", "extra family, fake", engine="fake")]

        def tasks(self, ctx, spec):
            return [Task(self.name, "extra/2", "batch", (0, 1))] if spec.name == "extra-fake" else []

        def build(self, ctx, res, refs):
            return {
                "title": self.title,
                "rows": [{"arm": "extra-fake", **timing(res.get("extra-fake", "extra/2"))}],
            }

        def markdown(self, result, section):
            return f"### {section['title']}\n\nlatency {section['rows'][0]['latency_s']['median']:.3f} s"

        def plot(self, result, section, out, plt):
            fig, ax = plt.subplots()
            ax.plot([1, 2], [1, 2])
            fig.savefig(out / "extra.png")
            plt.close(fig)
            return [out / "extra.png"]

    try:
        settings = BenchSettings(
            voice=str(tiny_voice_path),
            device="cpu",
            runs=5,
            sizes=(1,),
            batches=(1,),
            suites=("configs", "extra"),
            memory=False,
        )
        arms = [ArmSpec("fake-ref", "fake reference", engine="fake", reference=True)]
        result = validate_result(run_bench(settings, progress=False, arms=arms))
        assert [a["name"] for a in result["arms"]] == ["fake-ref", "extra-fake"]
        assert result["suites"]["extra"]["rows"][0]["latency_s"]["n"] == 5
        assert "### An extra family" in render_markdown(result)
        assert "extra.png" in {p.name for p in write_plots(result, tmp_path)}
    finally:
        SUITES.pop("extra")


def test_every_run_draws_new_noise(tiny_voice_path):
    """Fixed inputs would let the warm-up create every timed shape's kernels: a server never
    sees that. Each run gets its own seed; the same benchmark gets the same seeds."""
    from harness.arms import CPU_ARMS, build_pool, make_arm
    from harness.core import run_seed
    from harness.corpus import load_corpus, pool_texts

    seeds = {run_seed(1234, r, arm, ("batch", (0, 1), None)) for r in range(6) for arm in ("a", "b")}
    assert len(seeds) == 12 and run_seed(1234, 0, "a", ()) == run_seed(1234, 0, "a", ())
    arm = make_arm(next(a for a in CPU_ARMS if a.name == "vox-cpu"), str(tiny_voice_path))
    arm.open()
    corpus = load_corpus()
    texts = [d["text"] for d in corpus]
    pool = build_pool(arm.voice, texts, pool_texts(corpus), 2, arm.options)
    prepared = arm.prepare(pool, texts)
    one, two = arm.reseed(prepared, 1), arm.reseed(prepared, 2)
    assert [u.payload.ids for u in one] == [u.payload.ids for u in prepared]  # same sentences
    assert len({u.payload.seed for u in one + two}) == 4  # new noise per run and sentence
    assert arm.options.seed == 2  # streams use the run's seed too
