"""The engine's step voices: sequences join and leave between steps (continuous batching)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from step_fakes import FakeStepVoice
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine import Sink as EngineSink
from voxserve.options import SynthesisOptions
from serve_fakes import FakeVoice


class Sink(EngineSink):
    def __init__(self):
        self.pieces: dict[int, list[np.ndarray]] = {}
        self.texts: dict[int, list[str]] = {}
        self.partial: list[bool] = []
        self.done = threading.Event()
        self.error = None
        self.first_audio_step = None

    def on_audio(self, index, samples, text, partial=False):
        self.pieces.setdefault(index, []).append(samples)
        self.texts.setdefault(index, []).append(text)
        self.partial.append(partial)

    def on_done(self, n):
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.done.set()

    def sentences(self) -> list[np.ndarray]:
        return [np.concatenate(self.pieces[k]) for k in sorted(self.pieces)]


def engine(*voices, **sched) -> Engine:
    return Engine({v.name: v for v in voices},
                  EngineConfig(scheduler=SchedulerConfig(**{"max_wait_ms": 0, **sched}), max_queue_wait_s=3600))


def wait_queued(eng: Engine, n: int, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while eng.queued_sentences() < n:
        assert time.time() < deadline, f"front end queued {eng.queued_sentences()} of {n}"
        time.sleep(0.005)


def wait_request(eng: Engine, rid: int, timeout: float = 10.0) -> None:
    """Until the request's first sentence is queued (its front end has run)."""
    w = next(iter(eng._workers.values()))
    deadline = time.time() + timeout
    while w.scheduler.pending_items(rid) < 1:
        assert time.time() < deadline, "front end did not queue the request"
        time.sleep(0.005)


def drain(eng: Engine, limit: int = 10_000) -> int:
    n = 0
    while eng.step() is not None:
        n += 1
        assert n < limit, "the engine never ran out of work"
    return n


LONG = "This sentence is rather long and takes many steps to finish. And another one like it follows here."


def test_a_seeded_request_is_identical_alone_and_with_others_joining_and_leaving():
    voice = FakeStepVoice(capacity=4)
    alone = engine(voice).start(threads=False)
    solo = Sink()
    alone.submit(voice.name, LONG, SynthesisOptions(seed=7), solo)
    wait_queued(alone, 2)
    drain(alone)
    assert solo.done.is_set() and solo.error is None
    want = voice.expected(LONG, 7)
    for a, b in zip(solo.sentences(), want):
        np.testing.assert_array_equal(a, b)

    voice2 = FakeStepVoice(capacity=8)
    eng = engine(voice2).start(threads=False)
    sink = Sink()
    eng.submit(voice2.name, LONG, SynthesisOptions(seed=7), sink)
    wait_queued(eng, 2)
    eng.step()
    eng.step()
    others = []
    for k in range(5):  # joiners at different steps; one is cancelled mid-way (a leave)
        s = Sink()
        rid = eng.submit(voice2.name, f"Other request {k} is here. It says more.", SynthesisOptions(seed=k), s)
        others.append((rid, s))
        wait_request(eng, rid)
        eng.step()
        if k == 2:
            eng.cancel(rid)
    drain(eng)
    assert sink.done.is_set() and sink.error is None
    for a, b in zip(sink.sentences(), want):
        np.testing.assert_array_equal(a, b)
    assert max(len(h) for h in voice2.runner.history) >= 6  # they really ran side by side
    assert others[2][0] in {key[0] for key in voice2.runner.left}  # the cancelled one left
    for k, (rid, s) in enumerate(others):
        if k != 2:
            assert s.done.is_set() and s.error is None
            exp = voice2.expected(f"Other request {k} is here. It says more.", k)
            assert all(np.array_equal(a, b) for a, b in zip(s.sentences(), exp))


def test_a_late_request_joins_at_the_next_step_and_finishes_before_a_long_generation():
    voice = FakeStepVoice(capacity=9)
    eng = engine(voice).start(threads=False)
    long_text = " ".join(["A long sentence that needs a good many steps to end."] * 2)
    sinks = []
    for k in range(8):
        sinks.append(Sink())
        eng.submit(voice.name, long_text, SynthesisOptions(seed=k), sinks[-1])
    wait_queued(eng, 16)
    for _ in range(3):
        eng.step()
    late = Sink()
    rid = eng.submit(voice.name, "Hi there.", SynthesisOptions(seed=99), late)
    wait_request(eng, rid)
    steps_before = len(voice.runner.history)
    b = eng.step()
    assert [it.request_id for it in b.items] == [rid]  # joined the running sequences at once
    assert len(voice.runner.history[steps_before]) == 9  # 8 generating + the late one
    while not late.done.is_set():
        assert eng.step() is not None
    assert not any(s.done.is_set() for s in sinks)  # its audio came before the 8 ended
    drain(eng)
    assert all(s.done.is_set() and s.error is None for s in sinks)


def test_capacity_bounds_the_active_sequences():
    voice = FakeStepVoice(capacity=3)
    eng = engine(voice).start(threads=False)
    sinks = [Sink() for _ in range(7)]
    for k, s in enumerate(sinks):
        eng.submit(voice.name, f"Sentence number {k} here.", SynthesisOptions(seed=k), s)
    wait_queued(eng, 7)
    drain(eng)
    assert max(len(h) for h in voice.runner.history) == 3
    assert all(s.done.is_set() and s.error is None for s in sinks)


def test_streamed_steps_arrive_as_pieces_in_order_with_the_text_once():
    voice = FakeStepVoice(stream=True)
    eng = engine(voice).start(threads=False)
    sink = Sink()
    eng.submit(voice.name, LONG, SynthesisOptions(seed=3), sink)
    wait_queued(eng, 2)
    drain(eng)
    assert sink.done.is_set()
    want = voice.expected(LONG, 3)
    for k, w in enumerate(want):
        np.testing.assert_array_equal(np.concatenate(sink.pieces[k]), w)
        assert sink.texts[k][0] and all(t == "" for t in sink.texts[k][1:])
    assert sink.partial.count(False) == len(want)  # one final piece per sentence


def test_a_failing_sequence_fails_its_request_only():
    voice = FakeStepVoice()
    voice.runner.fail_key_text = "Bad one"
    eng = engine(voice).start(threads=False)
    bad, good = Sink(), Sink()
    eng.submit(voice.name, "Bad one. Never said.", SynthesisOptions(seed=1), bad)
    eng.submit(voice.name, "Good one. Said too.", SynthesisOptions(seed=2), good)
    wait_queued(eng, 3)
    drain(eng)
    assert isinstance(bad.error, ValueError)
    assert good.done.is_set() and good.error is None and len(good.sentences()) == 2


def test_a_step_that_raises_fails_the_active_sequences_and_the_worker_goes_on():
    voice = FakeStepVoice()
    eng = engine(voice).start(threads=False)
    first = Sink()
    eng.submit(voice.name, "First request.", SynthesisOptions(seed=1), first)
    wait_queued(eng, 1)
    voice.runner.fail_next = RuntimeError("out of memory (simulated)")
    drain(eng)
    assert isinstance(first.error, RuntimeError) and voice.runner.active == 0
    again = Sink()
    eng.submit(voice.name, "Second request.", SynthesisOptions(seed=1), again)
    wait_queued(eng, 1)
    drain(eng)
    assert again.done.is_set() and again.error is None


def test_worker_thread_runs_step_and_one_shot_voices_side_by_side():
    ar, vits = FakeStepVoice(), FakeVoice("vits", delay_s=0.002)
    eng = engine(ar, vits)
    assert eng.lanes == {"cpu": 1}  # a step runner is driven by one thread
    with eng:
        sinks = []
        for k in range(6):
            s1, s2 = Sink(), Sink()
            eng.submit(ar.name, LONG, SynthesisOptions(seed=k), s1)
            eng.submit(vits.name, "One. Two. Three.", None, s2)
            sinks += [(s1, k), (s2, None)]
        for s, _ in sinks:
            assert s.done.wait(20) and s.error is None
    for s, k in sinks:
        if k is not None:
            assert all(np.array_equal(a, b) for a, b in zip(s.sentences(), ar.expected(LONG, k)))
    # the one-shot voice's batches ran while sequences were active (no voice waits for the other)
    assert len(ar.runner.history) > 10 and len(vits.batches) >= 3


def test_library_path_runs_the_step_runner_to_the_end():
    voice = FakeStepVoice(capacity=2)
    audio = voice.synthesize(LONG, SynthesisOptions(seed=5))
    np.testing.assert_array_equal(audio.samples, np.concatenate(voice.expected(LONG, 5)))


@pytest.mark.parametrize("capacity", [1, 4])
def test_cancel_of_every_request_leaves_nothing_running(capacity):
    voice = FakeStepVoice(capacity=capacity)
    eng = engine(voice).start(threads=False)
    rids = [eng.submit(voice.name, LONG, SynthesisOptions(seed=k), Sink()) for k in range(3)]
    wait_queued(eng, 6)
    eng.step()
    for rid in rids:
        eng.cancel(rid)
    drain(eng)
    assert voice.runner.active == 0 and eng.in_flight == 0


def test_voices_sharing_one_step_runner_get_their_own_audio_and_pay_their_share():
    """Saved voices of one model (CosyVoice 2) share the model's runner: one step serves both,
    each request gets its own sequences' audio, and each voice pays for its share."""
    a = FakeStepVoice("alice", capacity=8)
    b = FakeStepVoice("bob")
    b.runner = a.runner
    eng = engine(a, b).start(threads=False)
    sa, sb = Sink(), Sink()
    eng.submit(a.name, LONG, SynthesisOptions(seed=1), sa)
    eng.submit(b.name, "Hello there. Bye now.", SynthesisOptions(seed=2), sb)
    wait_queued(eng, 3)
    drain(eng)
    assert sa.error is None and sb.error is None
    for sink, voice, text, seed in ((sa, a, LONG, 1), (sb, b, "Hello there. Bye now.", 2)):
        want = voice.expected(text, seed)
        assert len(sink.sentences()) == len(want)
        for got, w in zip(sink.sentences(), want):
            np.testing.assert_array_equal(got, w)
    # both requests' sequences ran in the same steps (one runner, stepped once per turn)
    assert any(len(h) >= 2 for h in a.runner.history)
    w = next(iter(eng._workers.values()))
    assert w.scheduler.voice_time("alice") > 0 and w.scheduler.voice_time("bob") > 0
