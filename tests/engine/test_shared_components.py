"""A shared component (a text encoder used by several voices): one instance per device, run as
a stage of its own, batched across requests and voices, its outputs routed to their sentences."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from step_fakes import FakeEncodedVoice, FakeEncoder
from serve_fakes import RecordingSink
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.options import SynthesisOptions


Sink = RecordingSink


def engine(*voices) -> Engine:
    return Engine({v.name: v for v in voices},
                  EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), max_queue_wait_s=3600))


def staged(eng: Engine) -> int:
    return sum(len(w.stage_queue) for w in eng._workers.values())


def wait_staged(eng: Engine, n: int, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while staged(eng) < n:
        assert time.time() < deadline, f"{staged(eng)} of {n} sentences reached the stage"
        time.sleep(0.005)


def drain(eng: Engine) -> None:
    for _ in range(1000):
        if eng.step() is None:
            return
    raise AssertionError("the engine never ran out of work")


TEXTS = {"a": "Alpha one. Alpha two is longer.", "b": "Bravo one. Bravo two. Bravo three."}


def test_two_voices_share_one_instance_and_its_batches_mix_them():
    enc = FakeEncoder()
    va, vb = FakeEncodedVoice("a", enc, 200.0), FakeEncodedVoice("b", enc, 500.0)
    eng = engine(va, vb).start(threads=False)
    assert list(eng._workers["cpu"].components.values()) == [enc]  # one instance on the device
    sinks = {}
    for name in ("a", "b"):
        sinks[name] = Sink()
        eng.submit(name, TEXTS[name], None, sinks[name])
    wait_staged(eng, 5)
    drain(eng)
    assert len(enc.batches) == 1 and sorted(enc.batches[0]) == sorted(
        ["Alpha one", "Alpha two is longer", "Bravo one", "Bravo two", "Bravo three"])  # both voices, one batch
    for name, voice in (("a", va), ("b", vb)):
        s = sinks[name]
        assert s.done.is_set() and s.error is None
        parts = [p.strip() for p in TEXTS[name].split(".") if p.strip()]
        for k, text in enumerate(parts):  # each sentence got its own output, in its own voice
            np.testing.assert_array_equal(s.audio[k], voice.audio_for(text, FakeEncoder.encode(text)))
    # the outputs went to the voices as the component made them: no copy on the way
    assert {id(x) for x in va.seen + vb.seen} == {id(x) for x in enc.outputs}


def test_a_second_instance_with_the_same_key_is_not_used():
    first, second = FakeEncoder("bert"), FakeEncoder("bert")
    va, vb = FakeEncodedVoice("a", first, 200.0), FakeEncodedVoice("b", second, 500.0)
    eng = engine(va, vb).start(threads=False)
    for name in ("a", "b"):
        eng.submit(name, TEXTS[name], None, Sink())
    wait_staged(eng, 5)
    drain(eng)
    assert len(first.batches) == 1 and not second.batches


def test_stage_batches_are_bounded_and_keep_each_requests_order():
    enc = FakeEncoder()
    enc.max_batch = 2
    va = FakeEncodedVoice("a", enc, 300.0)
    eng = engine(va).start(threads=False)
    s = Sink()
    text = "One. Two. Three. Four. Five."
    eng.submit("a", text, None, s)
    wait_staged(eng, 5)
    drain(eng)
    assert [len(b) for b in enc.batches] == [2, 2, 1]
    assert [t for b in enc.batches for t in b] == ["One", "Two", "Three", "Four", "Five"]
    assert s.done.is_set() and sorted(s.audio) == [0, 1, 2, 3, 4]


def test_a_component_failure_fails_the_requests_in_its_batch_only():
    enc = FakeEncoder()
    va, vb = FakeEncodedVoice("a", enc, 200.0), FakeEncodedVoice("b", enc, 500.0)
    eng = engine(va, vb).start(threads=False)
    bad = Sink()
    eng.submit("a", "Fails here.", None, bad)
    wait_staged(eng, 1)
    enc.fail_next = RuntimeError("out of memory (simulated)")
    drain(eng)
    assert isinstance(bad.error, RuntimeError)
    good = Sink()
    eng.submit("b", "Works now.", None, good)
    wait_staged(eng, 1)
    drain(eng)
    assert good.done.is_set() and good.error is None


def test_a_cancelled_request_never_reaches_the_stage():
    enc = FakeEncoder()
    va = FakeEncodedVoice("a", enc, 200.0)
    eng = engine(va).start(threads=False)
    rid = eng.submit("a", "Never encoded. Nor this.", None, Sink())
    wait_staged(eng, 2)
    eng.cancel(rid)
    drain(eng)
    assert not enc.batches and eng.in_flight == 0


def test_worker_thread_runs_the_stage():
    enc = FakeEncoder()
    va, vb = FakeEncodedVoice("a", enc, 200.0), FakeEncodedVoice("b", enc, 500.0)
    with engine(va, vb) as eng:
        sinks = [Sink() for _ in range(6)]
        for k, s in enumerate(sinks):
            eng.submit("ab"[k % 2], TEXTS["ab"[k % 2]], None, s)
        for s in sinks:
            assert s.done.wait(10) and s.error is None
    assert sum(len(b) for b in enc.batches) == 15


def test_library_path_runs_the_component_first():
    enc = FakeEncoder()
    va = FakeEncodedVoice("a", enc, 200.0)
    audio = va.synthesize("Alpha one. Alpha two.", SynthesisOptions())
    want = np.concatenate([va.audio_for(t, FakeEncoder.encode(t)) for t in ("Alpha one", "Alpha two")])
    np.testing.assert_array_equal(audio.samples, want)
    assert len(enc.batches) == 1


def test_a_unit_naming_an_unknown_component_fails_its_request():
    enc = FakeEncoder()
    va = FakeEncodedVoice("a", enc, 200.0)
    va.components = lambda: {}
    eng = engine(va).start(threads=False)
    s = Sink()
    eng.submit("a", "Hello.", None, s)
    assert s.done.wait(5)
    assert isinstance(s.error, RuntimeError) and "shared component" in str(s.error)
