"""The library (`Voice.synthesize`, `stream`, `synthesize_batch`) runs on the engine: the same
scheduler batches a text's sentences as in the server, a stream the consumer leaves stops its
work, and threads may share a voice."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from serve_fakes import FakeVoice, RecordingSink
from voxserve.engine import Engine, EngineConfig
from voxserve.engine.scheduler import Scheduler
from voxserve.options import SynthesisOptions

# six sentences of 100 characters (cost 100 each): with the scheduler's default bound of 256
# per batch, every batch holds two, whoever drives the engine
TEXT = " ".join(f"Sentence {k} " + "x" * (100 - len(f"Sentence {k} ") - 1) + "." for k in range(6))


def _payloads(voice: FakeVoice) -> list[list[str]]:
    return [list(p) for _, _, p in voice.spans]


def test_library_and_server_batch_a_text_alike(monkeypatch):
    """The library's batches are the engine scheduler's, and the same as a server's for one text."""
    planned = []
    schedule = Scheduler.schedule

    def spy(self, *a, **kw):
        batch = schedule(self, *a, **kw)
        if batch is not None:
            planned.append([it.payload.payload for it in batch.items])
        return batch

    monkeypatch.setattr(Scheduler, "schedule", spy)
    lib = FakeVoice("lib")
    audio = lib.synthesize(TEXT)
    assert _payloads(lib) == planned  # every batch the voice ran, the scheduler made
    assert [len(b) for b in planned] == [2, 2, 2]
    np.testing.assert_array_equal(audio.samples, lib.expected(TEXT))

    planned.clear()
    srv = FakeVoice("srv")
    sink = RecordingSink()
    with Engine([srv], EngineConfig(executor="serial")) as engine:
        engine.submit("srv", TEXT, None, sink)
        assert sink.done.wait(10) and sink.error is None
    assert _payloads(srv) == _payloads(lib) == planned

    # a stream too: the scheduler's rules for a stream (its first sentence first) in both
    planned.clear()
    lib.spans.clear()
    chunks = list(lib.stream(TEXT))
    assert [c.index for c in chunks if not c.partial] == list(range(6)) and chunks[-1].is_last
    assert _payloads(lib) == planned


def test_stream_left_early_leaves_nothing_running():
    voice = FakeVoice(delay_s=0.005)
    produced = []
    units = voice.units

    def counting(text, options=None):
        for u in units(text, options):
            produced.append(u.index)
            yield u

    voice.units = counting
    text = ". ".join(f"Sentence number {k}" for k in range(200)) + "."
    stream = voice.stream(text)
    first = [next(stream), next(stream)]
    assert [c.index for c in first] == [0, 1]
    stream.close()  # what a consumer's `break` does
    engine = voice.library_engine()
    assert engine.in_flight == 0 and engine.queued_sentences() == 0
    ran = len(voice.run_texts)
    time.sleep(0.2)
    assert len(voice.run_texts) == ran  # no batch ran after the consumer left
    assert len(produced) < 60  # the front end stopped a window ahead, not at the end of the text
    assert engine.in_flight == 0


def test_a_long_streams_first_chunk_comes_after_one_batch():
    """A chunk is handed out as soon as its batch ends, not when the next one does (whether it
    is the last is known from the sentences the front end has produced)."""
    voice = FakeVoice()
    # sentences of 150 characters: over half a batch's bound, so the first runs alone (cut
    # after a head: FakeVoice as VITS), and the text is longer than the front end's window
    text = " ".join(f"Sentence {k} ".ljust(149, "x") + "." for k in range(40))
    stream = voice.stream(text)
    head = next(stream)
    assert head.index == 0 and head.partial and len(voice.spans) == 1
    rest = next(stream)
    assert rest.index == 0 and not rest.partial and not rest.is_last
    assert len(voice.spans) == 2  # the next sentence's batch has not run yet
    later = list(stream)
    assert [c.index for c in later] == list(range(1, 40)) and later[-1].is_last
    assert not any(c.is_last for c in later[:-1])


def test_two_threads_share_one_voice():
    voice = FakeVoice(delay_s=0.002)
    texts = [". ".join(f"Thread {t} sentence {k}" for k in range(12)) + "." for t in range(2)]
    alone = [voice.synthesize(t).samples for t in texts]
    voice.max_concurrent = 0
    errors, got = [], {}

    def work(t: int) -> None:
        try:
            for r in range(5):
                if r % 2:
                    got[(t, r)] = np.concatenate([c.samples for c in voice.stream(texts[t])])
                else:
                    got[(t, r)] = voice.synthesize(texts[t]).samples
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors and len(got) == 10
    for (t, _), samples in got.items():
        np.testing.assert_array_equal(samples, alone[t])
    assert voice.max_concurrent == 1  # one step at a time on the model, whichever thread ran it
    assert voice.library_engine().in_flight == 0


def test_batch_failure_cancels_the_other_texts():
    from voxserve.errors import UnpronounceableTextError

    voice = FakeVoice()
    with pytest.raises(UnpronounceableTextError):
        voice.synthesize_batch(["One. Two. Three.", "123 456."])
    assert voice.library_engine().in_flight == 0


def test_close_stops_the_library_engine():
    from voxserve.errors import EngineClosedError

    voice = FakeVoice(delay_s=0.01)
    engine = voice.library_engine()
    stream = voice.stream(". ".join(f"Sentence {k}" for k in range(50)) + ".")
    next(stream)
    voice.close()
    with pytest.raises(EngineClosedError):
        list(stream)
    assert engine.in_flight == 0
    assert voice.synthesize("Again.").duration > 0  # a new engine for the next call
    assert voice.library_engine() is not engine


def test_options_sentence_silence_in_stream_and_whole():
    voice = FakeVoice()
    opts = SynthesisOptions(sentence_silence=0.1)
    whole = voice.synthesize("One. Two. Three.", opts).samples
    streamed = np.concatenate([c.samples for c in voice.stream("One. Two. Three.", opts)])
    np.testing.assert_array_equal(whole, streamed)


def test_a_dropped_voice_takes_its_engine_with_it():
    """No thread of the library's engine holds the voice: dropping it frees both (and the
    engine's front-end threads end)."""
    import gc
    import weakref

    def frontend_threads() -> int:
        return sum(1 for t in threading.enumerate() if t.name.startswith("voxserve-frontend"))

    def settled() -> int:  # (voices of earlier tests may be collected now)
        gc.collect()
        n, deadline = frontend_threads(), time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if frontend_threads() == n:
                return n
            n = frontend_threads()
        return n

    before = settled()
    voice = FakeVoice()
    voice.synthesize("One. Two. Three.")
    engine = weakref.ref(voice.library_engine())
    assert frontend_threads() > before
    gone = weakref.ref(voice)
    del voice
    gc.collect()
    assert gone() is None and engine() is None
    assert settled() == before


def test_a_step_voices_stream_left_early_leaves_its_runner():
    """A step voice (continuous batching) streams through the engine's step runner; a consumer
    that leaves takes its sequences out of the runner (their caches freed), not at some later call."""
    from engine.step_fakes import FakeStepVoice

    voice = FakeStepVoice(capacity=4, stream=True)
    text = ". ".join(f"A rather long sentence number {k} for a step voice" for k in range(12)) + "."
    whole = voice.synthesize(text, SynthesisOptions(seed=3)).samples
    streamed = list(voice.stream(text, SynthesisOptions(seed=3)))
    np.testing.assert_array_equal(np.concatenate([c.samples for c in streamed]), whole)
    assert voice.runner.active == 0

    stream = voice.stream(text, SynthesisOptions(seed=3))
    next(stream)
    assert voice.runner.active > 0
    stream.close()
    assert voice.runner.active == 0 and voice.library_engine().in_flight == 0
