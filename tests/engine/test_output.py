"""The one output path: audio in order to a request's sink; a sink that raises fails its own
request at once, whatever work made the audio (a one-shot batch, a step runner's step, a voice
behind a shared component's stage); the engine goes on serving the others."""

from __future__ import annotations

import time

import numpy as np
import pytest
from serve_fakes import FakeVoice, RecordingSink
from step_fakes import FakeEncodedVoice, FakeEncoder, FakeStepVoice

from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.voice import Piece, piece_error


class BrokenSink(RecordingSink):
    def on_audio(self, index, samples, text, partial=False):
        raise ValueError("the sink broke")


@pytest.mark.parametrize("make", [lambda: FakeVoice("v"), lambda: FakeStepVoice("v"),
                                  lambda: FakeEncodedVoice("v", FakeEncoder(), 1.0)],
                         ids=["batch", "step", "stage"])
def test_a_sink_that_raises_fails_its_request_at_once(make):
    """Before, a step voice's sink that raised left its request in flight until a timeout
    (the worker logged an internal error and failed nothing)."""
    eng = Engine([make()], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))).start()
    try:
        bad, good = BrokenSink(), RecordingSink()
        t0 = time.monotonic()
        eng.submit("v", "one sentence. and two. and three.", None, bad)
        assert bad.done.wait(5), "the failing request never ended"
        assert time.monotonic() - t0 < 2.0
        assert isinstance(bad.error, ValueError) and str(bad.error) == "the sink broke"
        eng.submit("v", "four. five.", None, good)  # the engine still serves
        assert good.done.wait(5) and good.error is None and len(good.audio) == 2
        deadline = time.monotonic() + 2
        while eng.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.in_flight == 0
    finally:
        eng.shutdown(2)


def test_a_sentence_that_fails_alone_carries_its_error_not_audio():
    ok = Piece(np.ones(3, np.float32), None)
    bad = Piece.failed(ValueError("too long"))
    assert piece_error(ok) is None and isinstance(piece_error(bad), ValueError)
    audio, rest = bad
    assert isinstance(audio, np.ndarray) and len(audio) == 0 and rest is None
    assert piece_error((np.ones(2, np.float32), None)) is None  # a plain pair never failed
