"""Voices land on the worker of their own device, and requests on two devices' workers, each
with its own lock, complete under concurrency (the engine's index of requests is never iterated
across workers)."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
import torch
from serve_fakes import FakeVoice, RecordingSink

from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.errors import OverloadedError
from voxserve.options import SynthesisOptions


def test_a_cosyvoice2_voice_runs_on_its_models_device():
    """CosyVoice2Voice said no device, so a CUDA voice went to the worker named "cpu"."""
    from voxserve.families.cosyvoice2.voice import CosyVoice2Voice

    model = types.SimpleNamespace(device=torch.device("cuda", 1), sample_rate=24000, acquire=lambda voice: None)
    v = CosyVoice2Voice("cv", model, {}, None)
    assert v.device == torch.device("cuda", 1)
    eng = Engine({"cv": v, "fake": FakeVoice("fake")})
    assert eng.lanes.keys() == {"cuda:1", "cpu"}
    assert eng.device_of("cv") == "cuda:1" and eng.device_of("fake") == "cpu"


def _fake_on(device: str, name: str) -> FakeVoice:
    v = FakeVoice(name, delay_s=0.0005)
    v.device = device
    return v


def test_requests_on_two_devices_complete_under_concurrency():
    voices = {"a": _fake_on("fake:0", "a"), "b": _fake_on("fake:1", "b")}
    cfg = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_queued_sentences=100_000))
    eng = Engine(voices, cfg).start()
    assert set(eng.lanes) == {"fake:0", "fake:1"}
    errors: list[BaseException] = []
    done: list[tuple[str, str, RecordingSink]] = []
    lock = threading.Lock()

    def client(voice: str, seed: int) -> None:
        try:
            for i in range(60):
                text = ". ".join(f"{voice} {seed} {i} s{k}" for k in range(1 + (seed + i) % 3)) + "."
                sink = RecordingSink()
                while True:
                    try:
                        eng.submit(voice, text, None, sink)
                        break
                    except OverloadedError:
                        threading.Event().wait(0.002)
                with lock:
                    done.append((voice, text, sink))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(v, s)) for v in voices for s in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(done) == 2 * 4 * 60
        for voice, text, sink in done:
            assert sink.done.wait(30), f"{voice}: {text!r} never finished"
            assert sink.error is None, sink.error
            np.testing.assert_array_equal(sink.joined(), voices[voice].expected(text))
        assert eng.in_flight == 0
    finally:
        eng.shutdown(5)


def test_a_worker_reads_only_its_own_requests():
    """A worker's estimates iterate its own requests under its own lock; another device's
    request never appears there (before, they scanned the engine-wide dict)."""
    voices = {"a": _fake_on("fake:0", "a"), "b": _fake_on("fake:1", "b")}
    eng = Engine(voices, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))).start(threads=False)
    rb = eng.submit("b", "one. two. three.", None, RecordingSink())
    wa, wb = eng._worker_of["a"], eng._worker_of["b"]
    assert rb in wb.requests and rb not in wa.requests
    assert wa.work_ahead().get("b", 0.0) == 0.0
    eng.shutdown(1)


def test_the_engine_takes_voices_only():
    """The engine reads what `Voice` declares and probes nothing: anything else is refused
    when the engine is built, not when a request first reaches it."""

    class Lookalike:  # has what the engine once probed for, but is not a Voice
        name, device, sample_rate, family = "x", "cpu", 16000, "fake"

    with pytest.raises(TypeError, match="not a voxserve.voice.Voice"):
        Engine({"x": Lookalike()})


def test_a_step_voice_and_a_batch_voice_on_two_devices_complete_under_concurrency():
    """Step voices (continuous batching) and one-shot voices, each on its own device's worker,
    serve concurrent clients; every answer equals the voice's own audio for its text."""
    from step_fakes import FakeStepVoice

    ar = FakeStepVoice("ar", capacity=3)
    ar.device = "fake:1"
    voices = {"ar": ar, "vits": _fake_on("fake:0", "vits")}
    eng = Engine(voices, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_queued_sentences=100_000))).start()
    assert eng.device_of("ar") == "fake:1" and eng.device_of("vits") == "fake:0"
    assert eng._worker_of["ar"].steppers and not eng._worker_of["vits"].steppers
    errors: list[BaseException] = []
    done: list[tuple[str, str, int, RecordingSink]] = []
    lock = threading.Lock()

    def client(voice: str, seed: int) -> None:
        try:
            for i in range(8):
                text = ". ".join(f"{voice} {seed} {i} s{k}" for k in range(1 + (seed + i) % 3)) + "."
                sink = RecordingSink()
                eng.submit(voice, text, SynthesisOptions(seed=seed), sink)
                with lock:
                    done.append((voice, text, seed, sink))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(v, s)) for v in voices for s in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        for voice, text, seed, sink in done:
            assert sink.done.wait(30), f"{voice}: {text!r} never finished"
            assert sink.error is None, sink.error
            want = (np.concatenate(ar.expected(text, seed)) if voice == "ar" else voices[voice].expected(text))
            np.testing.assert_array_equal(sink.joined(), want)
        assert eng.in_flight == 0
    finally:
        eng.shutdown(5)
