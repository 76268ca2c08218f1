"""Admission by time: the engine's estimate of a new request's wait (work ahead at the device's
measured speed) and the refusal beyond `EngineConfig.max_queue_wait_s`, with fake voices whose
batches take a known time per unit of cost (no torch)."""

from __future__ import annotations

import threading
import time

import pytest
from serve_fakes import FakeVoice

from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine import Sink as EngineSink
from voxserve.errors import OverloadedError


class TimedVoice(FakeVoice):
    """A device of known speed: each batch sleeps `k` seconds per unit of cost (1 / k cost per s;
    a sleep holds no core, so lanes overlap fully)."""

    def __init__(self, k: float, **kw):
        super().__init__(**kw)
        self.k = k
        self.sleeping = 0
        self.max_sleeping = 0  # batches in their timed part at once (lanes that overlapped)

    def run_pieces(self, units, early=(), max_cost=None, spare=False):
        out = super().run_pieces(units, early, max_cost, spare)
        with self.lock:
            self.sleeping += 1
            self.max_sleeping = max(self.max_sleeping, self.sleeping)
        time.sleep(self.k * sum(u.cost for u in units))
        with self.lock:
            self.sleeping -= 1
        return out


class Sink(EngineSink):
    def __init__(self):
        self.done = threading.Event()
        self.first_audio: float | None = None
        self.finished: float | None = None
        self.error: BaseException | None = None

    def on_audio(self, i, a, t, partial=False):
        if self.first_audio is None:
            self.first_audio = time.monotonic()

    def on_done(self, n):
        self.finished = time.monotonic()
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.done.set()


def cfg(bound: float = 20.0, **kw) -> EngineConfig:
    return EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_queued_sentences=10_000), max_queue_wait_s=bound, **kw)


def run_one(eng: Engine, text: str) -> Sink:
    s = Sink()
    eng.submit("fake", text, None, s)
    assert s.done.wait(10) and s.error is None
    return s


SENTENCE = "abcdefghij klmnopqrst"  # cost 21 for the fake voice (its length)


def test_speed_is_measured_from_batches_and_nothing_refused_before():
    v = TimedVoice(k=0.002)  # 500 cost per second
    with Engine([v], cfg(bound=0.1)) as eng:
        assert eng.queue_wait_s("fake") is None and eng.cost_per_s("fake") is None
        # no batch measured yet: no figure, so only the sentence bound applies
        v.gate = threading.Event()
        sinks = [Sink() for _ in range(12)]
        for s in sinks:
            eng.submit("fake", ". ".join([SENTENCE] * 3) + ".", None, s)
        v.gate.set()
        assert all(s.done.wait(10) for s in sinks) and not any(s.error for s in sinks)
        rate = eng.cost_per_s("fake")
        assert 0.7 * 500 <= rate <= 1.05 * 500, rate
        w = eng._workers["cpu"]
        assert w.scheduler.time is w.admission.time is w.time  # one accounting model per device
        assert eng.queue_wait_s("fake") == pytest.approx(0.0, abs=1e-9)  # drained: nothing ahead


def test_speed_of_overlapping_lanes_counts_busy_time_once():
    """Two lanes each sleeping k per cost: the device does 2 / k per second, and the estimate
    (busy time between completions, not each batch's own seconds) sees that."""
    from voxserve.engine.executors import CpuLanes

    lanes = CpuLanes(threads=2, teams=True, spill=False, fitted_team=lambda n: n, set_team=lambda n: True,
                     lower_priority=lambda d: None)
    v = TimedVoice(k=0.002, concurrent_runs=True)
    eng = Engine([v], cfg(), cpu=lanes).start(threads=False)  # queue first
    try:
        assert eng.lanes == {"cpu": 2}
        sinks = [Sink() for _ in range(16)]
        for s in sinks:
            eng.submit("fake", ". ".join([SENTENCE] * 3) + ".", None, s)
        deadline = time.time() + 5
        while eng.queued_sentences() < 48 and time.time() < deadline:
            time.sleep(0.005)
        eng.start()  # both lanes find work queued
        assert all(s.done.wait(10) for s in sinks)
        assert v.max_sleeping == 2
        rate = eng.cost_per_s("fake")
        assert 0.7 * 1000 <= rate <= 1.25 * 1000, rate  # (one lane's batch seconds would read 500)
    finally:
        eng.shutdown(5)


def test_refused_beyond_the_bound_accepted_ones_wait_within_it_retry_after_drains():
    k, bound = 0.005, 1.0  # 200 cost per second: the bound holds ~200 cost (~5 requests)
    v = TimedVoice(k=k)
    text = f"{SENTENCE}. {SENTENCE}."  # 42 cost: 0.21 s of synthesis alone
    own = 42 * k
    with Engine([v], cfg(bound=bound)) as eng:
        run_one(eng, text)  # the first figures: speed, and cost per character
        accepted: list[tuple[float, Sink]] = []
        refusals: list[tuple[float, float, OverloadedError]] = []
        for _ in range(40):
            wait, drain = eng.queue_wait_s("fake", text), eng.queue_wait_s("fake")
            s = Sink()
            try:
                eng.submit("fake", text, None, s)
                accepted.append((time.monotonic(), s))
                assert wait <= bound
            except OverloadedError as e:
                refusals.append((wait, drain, e))
            time.sleep(0.002)
        assert 4 <= len(accepted) <= 10 and refusals, (len(accepted), len(refusals))
        for wait, drain, e in refusals:
            # (the queue only drains between the estimate and the submit)
            assert 1.0 <= e.retry_after_s <= max(1.0, drain) + 0.05, (e.retry_after_s, drain)
        # after waiting as told, the queue has drained enough: accepted
        time.sleep(refusals[-1][2].retry_after_s)
        late = Sink()
        eng.submit("fake", text, None, late)
        accepted.append((time.monotonic(), late))
        assert all(s.done.wait(10) and s.error is None for _, s in accepted)  # nothing accepted is lost
    waits = [s.finished - t - own for t, s in accepted]
    assert max(waits) <= bound + 0.3, waits  # the bound plus scheduling slack


def test_short_requests_go_ahead_of_a_long_one_until_its_deadline_would_pass():
    """A request longer than the bound is accepted (its own work is not a wait); shorter ones
    that the scheduler serves first are accepted while the long one's slack lasts, then refused
    so that it still finishes within the bound plus its own time."""
    k, bound = 0.001, 0.5
    v = TimedVoice(k=k)
    long_text = ". ".join([SENTENCE] * 40) + "."  # 840 cost: 0.84 s alone
    medium = ". ".join([SENTENCE] * 10) + "."  # 210 cost
    with Engine([v], cfg(bound=bound)) as eng:
        run_one(eng, long_text)  # speed and cost per character
        v.gate = threading.Event()
        mediums = [Sink(), Sink()]
        for s in mediums:
            eng.submit("fake", medium, None, s)
        t_long, long_one = time.monotonic(), Sink()
        eng.submit("fake", long_text, None, long_one)  # waits for the mediums: ~0.42 s of its 0.5
        assert eng.queue_wait_s("fake") > bound  # all the work ahead
        assert eng.queue_wait_s("fake", "next.") < bound  # a short one goes before the long one
        with pytest.raises(OverloadedError, match="busy"):
            eng.submit("fake", long_text, None, Sink())  # a second long one would wait > 0.5 s
        shorts, refused = [], None
        for _ in range(20):
            s = Sink()
            try:
                eng.submit("fake", f"{SENTENCE}.", None, s)
                shorts.append(s)
            except OverloadedError as e:
                refused = e
                break
        assert refused is not None and "deadlines" in str(refused), refused
        assert 1 <= len(shorts) <= 8, len(shorts)  # the long one's slack: ~0.08 s of 21-cost requests
        assert 1.0 <= refused.retry_after_s <= 3.0  # when the long one is done at the latest
        v.gate.set()
        assert all(s.done.wait(10) and s.error is None for s in [long_one, *mediums, *shorts])
    assert long_one.finished - t_long <= bound + 840 * k + 0.3


def test_retry_after_is_capped_for_a_huge_backlog():
    v = TimedVoice(k=0.05)  # 20 cost per second
    with Engine([v], cfg(bound=0.1)) as eng:
        run_one(eng, "abc.")
        v.gate = threading.Event()
        rid = eng.submit("fake", ". ".join([SENTENCE] * 100) + ".", None, Sink())  # ~100 s of work
        with pytest.raises(OverloadedError) as e:
            eng.submit("fake", "next.", None, Sink())
        assert e.value.retry_after_s == 60.0
        eng.cancel(rid)
        assert eng.queue_wait_s("fake") < 5  # cancelled: at most its batch in flight is left
        v.gate.set()


@pytest.mark.parametrize("bound", [0.0, 0.05, 3601.0, float("nan")])
def test_max_queue_wait_is_bounded(bound):
    with pytest.raises(ValueError, match="max_queue_wait_s"):
        EngineConfig(max_queue_wait_s=bound).validate()
