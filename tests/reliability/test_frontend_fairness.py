"""One client's front-end work never puts another on 429 (issue 49, item 7): while a text's front
end ran for many seconds (`"[[ ]] " * 680`: 14 s before its 400), unrelated short requests got 429
with Retry-After 60. The slow request's deadline (arrival + bound + its own work) ran out while
nothing of it was on the device, so every new request "would delay it past its deadline". A
request waiting on its own front end is now not late by anyone's fault: its deadline moves."""

from __future__ import annotations

import threading
import time

from serve_fakes import FakeVoice

from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine import Sink as EngineSink
from voxserve.errors import UnpronounceableTextError
from voxserve.voice import Unit


class SlowFrontEndVoice(FakeVoice):
    """The fake voice, timed (each batch sleeps k s per unit of cost), whose texts starting with
    "SLOW" hold their front end until `release` is set and then say nothing (the issue's 400)."""

    def __init__(self, k: float):
        super().__init__()
        self.k = k
        self.release = threading.Event()
        self.slow_started = threading.Event()

    def units(self, text, options=None):
        if not text.startswith("SLOW"):
            return super().units(text, options)

        def gen():
            self.slow_started.set()
            self.release.wait(30)
            raise UnpronounceableTextError(text)
            yield Unit(0, text, len(text), text)  # a generator  # pragma: no cover

        return gen()

    def run_pieces(self, units, early=(), max_cost=None, spare=False):
        out = super().run_pieces(units, early, max_cost, spare)
        time.sleep(self.k * sum(u.cost for u in units))
        return out


class Sink(EngineSink):
    def __init__(self):
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.audio = 0

    def on_audio(self, i, a, t, partial=False):
        self.audio += len(a)

    def on_done(self, n):
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.done.set()


def test_a_slow_front_end_does_not_refuse_other_requests():
    bound = 1.0
    v = SlowFrontEndVoice(k=0.005)  # 200 cost per second
    config = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_queued_sentences=10_000),
                          max_queue_wait_s=bound, frontend_threads=2)
    with Engine([v], config) as eng:
        warm = Sink()
        eng.submit("fake", "abcdefghij klmnopqrst. abcdefghij.", None, warm)  # the device's speed
        assert warm.done.wait(10) and warm.error is None and eng.cost_per_s("fake")
        slow = Sink()
        eng.submit("fake", "SLOW " + "x" * 150, None, slow)  # ~0.75 s of predicted work: admitted
        assert v.slow_started.wait(5)
        try:
            time.sleep(2.5 * bound)  # past the slow request's deadline, all of it front-end time
            for _ in range(3):
                s = Sink()
                eng.submit("fake", "Hello world.", None, s)  # OverloadedError on main
                assert s.done.wait(10) and s.error is None and s.audio > 0
        finally:
            v.release.set()
        assert slow.done.wait(10) and isinstance(slow.error, UnpronounceableTextError)
