"""Engine + async engine with a fake voice (no torch): ordering, isolation, cancellation,
back-pressure, errors, several voices, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from serve_fakes import FakeVoice, RecordingSink

from voxserve.engine import AsyncEngine, Engine, EngineConfig, SchedulerConfig
from voxserve.engine.device_time import PRIOR_S_PER_COST
from voxserve.engine.executors import CpuLanes
from voxserve.engine import Sink as EngineSink
from voxserve.errors import (
    EmptyTextError,
    EngineClosedError,
    OverloadedError,
    UnknownVoiceError,
    UnpronounceableTextError,
)


def two_threads(teams: list | dict | None = None, reniced: list | None = None, **kw) -> CpuLanes:
    """The CPU executor on a 2-thread CPU whose threads take OpenMP team sizes, on an idle
    machine (whatever else runs beside the tests): `teams` records the team sizes set (a dict:
    each thread's last, by thread id), `reniced` the lanes reniced (nothing is, really)."""
    if isinstance(teams, dict):
        set_team = lambda n: teams.__setitem__(threading.get_ident(), n) or True  # noqa: E731
    else:
        set_team = lambda n: (teams.append(n) if teams is not None else None) or True  # noqa: E731
    lower = lambda d: (reniced.append(threading.current_thread().name) if reniced is not None else None)  # noqa: E731
    return CpuLanes(**{"threads": 2, "teams": True, "fitted_team": lambda n: n, "set_team": set_team,
                       "lower_priority": lower, **kw})


def cfg(**kw) -> EngineConfig:
    lookahead = kw.pop("frontend_lookahead", 4)
    return EngineConfig(scheduler=SchedulerConfig(**{"max_wait_ms": 0, **kw}), frontend_lookahead=lookahead)


def texts(n: int) -> list[str]:
    return [". ".join(f"request {i} sentence {k}" for k in range(1 + (i * 5) % 9)) + "." for i in range(n)]


async def _gather(ae: AsyncEngine, voice: str, ts: list[str]):
    async def one(t):
        return np.concatenate([c.samples for c in await ae.submit(voice, t).collect()])
    return await asyncio.gather(*[one(t) for t in ts])


def test_concurrent_requests_get_their_own_audio_in_order():
    v = FakeVoice(delay_s=0.002)
    ts = texts(24)
    with Engine([v], cfg(max_batch_size=5)) as eng:
        outs = asyncio.run(_gather(AsyncEngine(eng), "fake", ts))
    for t, o in zip(ts, outs):
        np.testing.assert_array_equal(o, v.expected(t))
    assert max(v.batches) <= 5 and max(v.batches) > 1  # batched across requests
    assert v.max_concurrent == 1  # one worker calls run_units
    assert eng.sentences_run == sum(len(list(v.units(t))) for t in ts)


def test_stream_first_sentence_head_comes_early_and_joins_exactly():
    v = FakeVoice()
    text = "a first sentence that is long enough to be cut in two. then a second one."

    async def main(eng, streaming):
        return await AsyncEngine(eng).submit("fake", text, streaming=streaming).collect()

    # max_batch_phonemes 100: the first sentence (cost 53) is over half of it, so it runs
    # without its successor and may be cut (a shorter one would take it along, uncut)
    with Engine([v], cfg(max_batch_phonemes=100)) as eng:
        chunks = asyncio.run(main(eng, True))
        plain = asyncio.run(main(eng, False))
        assert eng.sentences_run == 4
    assert [(c.index, c.partial) for c in chunks] == [(0, True), (0, False), (1, False)]
    assert chunks[0].text.startswith("a first") and chunks[1].text == ""
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), v.expected(text))
    assert [(c.index, c.partial) for c in plain] == [(0, False), (1, False)]  # not a stream: no head
    assert v.cuts == 1


def test_long_sentence_runs_in_pieces_others_go_between_and_order_holds():
    """A sentence over ~1.25 x max_batch_phonemes comes back cut; its rest is queued again at the
    front of its request, so a short request submitted meanwhile is served between the pieces
    (a batch never holds the device for the whole long sentence) and every audio stays in order."""
    v = FakeVoice()
    long_sentence = "w" * 120  # cost 120 > 1.25 x 40: pieces of 400 samples
    got: dict[str, list] = {"long": [], "short": []}

    class Sink(EngineSink):
        def __init__(self, key):
            self.key = key
            self.done = threading.Event()
        def on_audio(self, i, a, t, partial=False):
            got[self.key].append((i, partial, a))
        def on_done(self, n):
            self.done.set()
        def on_error(self, e):
            raise AssertionError(e)

    eng = Engine([v], cfg(max_batch_phonemes=40)).start(threads=False)
    sinks = {"long": Sink("long"), "short": Sink("short")}
    eng.submit("fake", long_sentence + ". tail.", None, sinks["long"])
    deadline = time.monotonic() + 5
    while eng.queued_sentences() < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert eng.step() is not None  # the first piece of the long sentence
    eng.submit("fake", "hi.", None, sinks["short"])
    while eng.queued_sentences() < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    while eng.step() is not None:
        pass
    assert all(s.done.is_set() for s in sinks.values())
    order = [p for p in v.run_texts]
    assert order.index("hi") < len(order) - 2  # served between the long sentence's pieces
    pieces = [(i, partial) for i, partial, _ in got["long"]]
    assert pieces[0] == (0, True) and pieces[-2:] == [(0, False), (1, False)] and len(pieces) >= 4
    np.testing.assert_array_equal(np.concatenate([a for *_, a in got["long"]]),
                                  v.expected(long_sentence + ". tail."))
    assert eng.sentences_run == 3 and v.cuts >= 2
    eng.shutdown(timeout=1)


def test_cancel_drops_pending_sentences_they_are_never_run():
    v = FakeVoice(delay_s=0.05)  # 50 ms a batch: the cancel lands while batch 2 or 3 runs
    v.gate = threading.Event()
    long_text = ". ".join(f"sentence number {k}" for k in range(200)) + "."

    async def main(eng):
        s = AsyncEngine(eng).submit("fake", long_text)
        first = await s.first()  # waits until the gate opens
        assert first.index == 0
        await s.aclose()  # the client goes away after one chunk
        return s

    with Engine([v], cfg(max_batch_size=2, frontend_lookahead=8)) as eng:
        threading.Timer(0.2, v.gate.set).start()
        asyncio.run(main(eng))
        time.sleep(0.3)
        run_after_cancel = len(v.run_texts)
        time.sleep(0.2)
        assert len(v.run_texts) == run_after_cancel  # nothing more runs
        assert eng.in_flight == 0 and eng.queued_sentences() == 0
    # the first sentence, then at most the two batches of 2 that ran before the cancel landed
    assert run_after_cancel <= 5, run_after_cancel
    assert eng.sentences_dropped >= 1


def test_overload_refuses_new_requests_and_loses_nothing_accepted():
    v = FakeVoice()
    v.gate = threading.Event()
    sink_events = []

    class Sink(EngineSink):
        def __init__(self, k):
            self.k = k
        def on_audio(self, i, a, t, partial=False):
            sink_events.append((self.k, i))
        def on_done(self, n):
            sink_events.append((self.k, "done", n))
        def on_error(self, e):
            sink_events.append((self.k, "error", e))

    with Engine([v], cfg(max_batch_size=1, max_queued_sentences=4, frontend_lookahead=50)) as eng:
        accepted, refused = [], 0
        for k in range(20):
            try:
                eng.submit("fake", "one. two. three.", None, Sink(k))
                accepted.append(k)
            except OverloadedError as e:
                refused += 1
                assert e.retry_after_s >= 1
            time.sleep(0.02)  # let the front end queue the sentences
        assert refused > 0 and accepted
        v.gate.set()
        deadline = time.time() + 10
        while eng.in_flight and time.time() < deadline:
            time.sleep(0.01)
    done = {e[0] for e in sink_events if e[1] == "done"}
    assert done == set(accepted)  # every accepted request completed, with all three sentences
    for k in accepted:
        assert [e[1] for e in sink_events if e[0] == k and e[1] != "done"] == [0, 1, 2]


def test_bad_input_raises_at_submit_and_unpronounceable_arrives_as_error():
    """`Engine.submit` validates on the calling thread; the asyncio side runs no front end on
    the loop (tests/engine/test_frontend_off_loop.py), so its stream raises both."""
    v = FakeVoice()

    async def main(eng):
        ae = AsyncEngine(eng)
        with pytest.raises(EmptyTextError):
            await ae.submit("fake", "   ").first()
        s = ae.submit("fake", "... 123 ...")
        with pytest.raises(UnpronounceableTextError):
            await s.first()

    with Engine([v], cfg()) as eng:
        with pytest.raises(EmptyTextError):
            eng.submit("fake", "   ", None, RecordingSink())
        asyncio.run(main(eng))
        assert eng.in_flight == 0


def test_several_voices_one_voice_per_batch():
    a, b = FakeVoice("a", delay_s=0.001), FakeVoice("b", sample_rate=8000, delay_s=0.001)
    ts = texts(10)

    async def main(eng):
        ae = AsyncEngine(eng)
        return await asyncio.gather(_gather(ae, "a", ts), _gather(ae, "b", ts))

    with Engine([a, b], cfg(max_batch_size=4)) as eng:
        oa, ob = asyncio.run(main(eng))
    for t, x, y in zip(ts, oa, ob):
        np.testing.assert_array_equal(x, a.expected(t))
        np.testing.assert_array_equal(y, b.expected(t))
    assert a.run_texts and b.run_texts


def test_shutdown_finishes_in_flight_then_refuses():
    v = FakeVoice(delay_s=0.01)
    eng = Engine([v], cfg(max_batch_size=2)).start()
    got = []

    class Sink(EngineSink):
        def on_audio(self, i, a, t, partial=False):
            got.append(i)
        def on_done(self, n):
            got.append("done")
        def on_error(self, e):
            got.append(e)

    eng.submit("fake", "a. b. c. d. e.", None, Sink())
    assert eng.shutdown(timeout=10)
    assert got == [0, 1, 2, 3, 4, "done"]
    with pytest.raises(EngineClosedError):
        eng.submit("fake", "again.", None, Sink())


def test_step_by_hand_without_threads():
    v = FakeVoice()
    eng = Engine([v], cfg(max_batch_size=3)).start(threads=False)
    out = []

    class Sink(EngineSink):
        def on_audio(self, i, a, t, partial=False):
            out.append(i)
        def on_done(self, n):
            out.append("done")
        def on_error(self, e):
            raise e

    eng.submit("fake", "a. b. c. d.", None, Sink())
    deadline = time.time() + 5
    while eng.queued_sentences() < 4 and time.time() < deadline:
        time.sleep(0.01)  # the front end runs on its pool
    b = eng.step()
    assert len(b) == 3
    assert eng.step() is not None
    deadline = time.time() + 5
    while "done" not in out and time.time() < deadline:
        time.sleep(0.01)  # the front end finds the end of the text on its pool
    assert out == [0, 1, 2, 3, "done"]
    eng.shutdown(1)


def test_cpu_lanes_run_batches_at_once_never_two_of_one_request():
    """Two lanes (as on a 2-core CPU), and two urgent ones: batches overlap in time, but without
    spill never two batches of one request (its audio stays in order), and every request gets
    exactly its own audio."""
    teams = []
    lanes = two_threads(teams, spill=False, batch=2)
    v = FakeVoice(delay_s=0.01, concurrent_runs=True)
    ts = texts(16)
    config = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_batch_size=4, max_batch_phonemes=10_000),
                          frontend_lookahead=4)
    with Engine([v], config, cpu=lanes) as eng:
        assert eng.lanes == {"cpu": 2}
        outs = asyncio.run(_gather(AsyncEngine(eng), "fake", ts))
    for t, o in zip(ts, outs):
        np.testing.assert_array_equal(o, v.expected(t))
    assert 2 <= v.max_concurrent <= 4
    assert max(v.batches) == 2  # CpuLanes.batch bounds a lane's batch
    assert set(teams) <= {1, 2} and 1 in teams  # lanes split the two threads while both run

    def request_of(payload) -> str:  # "request 3 sentence 1" -> "request 3"
        return " ".join(payload.split()[:2])

    for k, (a0, a1, p) in enumerate(v.spans):
        for b0, b1, q in v.spans[k + 1 :]:
            if a0 < b1 and b0 < a1:  # overlapping batches
                assert not {request_of(x) for x in p} & {request_of(x) for x in q}


def test_spill_runs_a_lone_requests_sentences_two_at_a_time_and_delivers_in_order(monkeypatch):
    """Spill: a lone request's sentences after its first run two at a time, one thread each
    (its stream's first sentence alone on both threads, for first audio); a later sentence
    that finishes first waits, and the chunks (cut pieces included) come in order."""
    teams = {}
    v = FakeVoice(concurrent_runs=True)
    run = v.run_pieces
    ran = []  # (payload, team, start, end) per batch

    def slow_run(units, **kw):
        p, t0 = units[0].payload, time.monotonic()
        time.sleep(0.15 if p == "second sentence" else 0.02)  # the third overtakes the second
        out = run(units, **kw)
        ran.append((p, teams.get(threading.get_ident()), t0, time.monotonic()))
        return out

    monkeypatch.setattr(v, "run_pieces", slow_run)
    text = ("a first sentence long enough for a head cut of its own. second sentence. third. "
            "a fourth sentence that costs more than the batch limit allows. fifth. sixth.")
    config = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_batch_phonemes=40))

    async def go():
        return await AsyncEngine(eng).submit("fake", text).collect()

    with Engine([v], config, cpu=two_threads(teams)) as eng:
        chunks = asyncio.run(go())
    idx = [c.index for c in chunks]
    assert idx == sorted(idx) and sorted(set(idx)) == list(range(6))
    assert [c.index for c in chunks if c.partial] == [0, 3]  # the head cut and the cost cut
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), v.expected(text))
    span = {p if isinstance(p, str) else p[:2]: (team, t0, t1) for p, team, t0, t1 in ran}
    first = "a first sentence long enough for a head cut of its own"
    assert span[first][0] == 2  # first audio alone, on both threads
    assert span["second sentence"][0] == span["third"][0] == 1  # then two at a time, one thread each
    assert span["third"][1] < span["second sentence"][2] and span["third"][2] < span["second sentence"][2]


def test_a_lone_batch_takes_every_thread_and_voices_that_cannot_share_get_one_lane(monkeypatch):
    teams, reniced = [], []
    v = FakeVoice(delay_s=0.005, concurrent_runs=True)
    ran_on = set()
    run = v.run_pieces
    monkeypatch.setattr(v, "run_pieces", lambda *a, **k: ran_on.add(threading.current_thread().name) or run(*a, **k))
    no_spill = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), frontend_lookahead=4)
    with Engine([v], no_spill, cpu=two_threads(teams, reniced, spill=False)) as eng:  # one request at a time
        for t in texts(3):
            asyncio.run(_gather(AsyncEngine(eng), "fake", [t]))
    assert teams and set(teams) == {2} and v.max_concurrent == 1
    with Engine([v], cfg(), cpu=two_threads(teams, reniced)) as eng:  # with spill (the default) too, for one-sentence requests
        for t in ("one sentence.", "another one."):
            asyncio.run(_gather(AsyncEngine(eng), "fake", [t]))
    assert set(teams) == {2} and v.max_concurrent == 1
    # on urgent lane 0, at the process's priority (a reniced team would crawl beside urgent work)
    assert ran_on == {"voxserve-worker-cpu-urgent-0"} and len(reniced) == 4 and not ran_on & set(reniced)
    assert Engine([FakeVoice()], cfg(), cpu=two_threads()).lanes == {"cpu": 1}  # concurrent_runs False (Bark, CUDA graphs)
    serial = Engine([FakeVoice(concurrent_runs=True)], EngineConfig(executor="serial"), cpu=two_threads())
    assert serial.lanes == {"cpu": 1} and serial.urgent_lanes == {"cpu": False}
    assert Engine([FakeVoice(concurrent_runs=True)], cfg(), cpu=two_threads(threads=1)).lanes == {"cpu": 1}
    no_teams = CpuLanes(threads=2, teams=False, fitted_team=lambda n: n)  # lanes would oversubscribe the cores
    assert Engine([FakeVoice(concurrent_runs=True)], cfg(), cpu=no_teams).lanes == {"cpu": 1}
    for bad in ("threads", "lanes"):
        with pytest.raises(ValueError, match="executor"):
            EngineConfig(executor=bad).validate()



def test_a_lone_batch_runs_on_every_thread(monkeypatch):
    """A batch with nothing else running or waiting takes every thread, short or long."""
    teams = {}
    v = FakeVoice(concurrent_runs=True)
    run, ran = v.run_pieces, []
    monkeypatch.setattr(v, "run_pieces", lambda units, **k: ran.append((units[0].cost, teams.get(threading.get_ident())))
                        or run(units, **k))
    long = "a single sentence of one hundred and twenty characters, " * 2 + "and more."
    config = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))
    with Engine([v], config, cpu=two_threads(teams)) as eng:
        for text in ("a short one.", long):
            asyncio.run(_gather(AsyncEngine(eng), "fake", [text]))
    # (a streamed sentence's rest may follow)
    assert ran[:2] == [(len("a short one"), 2), (len(long) - 1, 2)]


class GatedLongVoice(FakeVoice):
    """Sentences of at least `long` characters wait for `release` (they hold the lanes)."""

    def __init__(self, long: int, **kw):
        super().__init__(**kw)
        self.long = long
        self.release = threading.Event()
        self.held = 0  # batches waiting for release
        self.held_when_short_ran: list[int] = []

    def run_pieces(self, units, early=(), max_cost=None, spare=False):
        if any(u.cost >= self.long for u in units):
            with self.lock:
                self.held += 1
            self.release.wait(10)
            with self.lock:
                self.held -= 1
        else:
            self.held_when_short_ran.append(self.held)
        return super().run_pieces(units, early, max_cost, spare)


def test_urgent_lanes_run_a_short_request_while_long_work_holds_the_lanes():
    """Long sentences hold the lanes; a short request is served at once on an urgent lane
    (the other lanes' threads reniced below it)."""
    reniced = []
    lanes = two_threads(urgent_max_s=60 * PRIOR_S_PER_COST, nice=7, lower_priority=lambda d: reniced.append(d) or True)
    v = GatedLongVoice(long=100, concurrent_runs=True)
    long_text = "x" * 150 + ". " + "y" * 150 + "."  # two sentences: 300 to its end, not urgent
    config = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))
    done = threading.Event()

    class Sink(EngineSink):
        def on_audio(self, i, a, t, partial=False):
            pass
        def on_done(self, n):
            done.set()
        def on_error(self, e):
            raise e

    class Quiet(Sink):
        def on_done(self, n):
            pass

    eng = Engine([v], config, cpu=lanes).start(threads=False)  # accept first: the lanes find work queued
    assert eng.urgent_lanes == {"cpu": True} and eng.lanes == {"cpu": 2}
    for _ in range(3):  # two hold the (other) lanes, one waits
        eng.submit("fake", long_text, None, Quiet())
    deadline = time.time() + 5
    while eng.queued_sentences() < 6 and time.time() < deadline:
        time.sleep(0.005)
    eng.start()
    while v.held < 2 and time.time() < deadline:
        time.sleep(0.005)
    assert eng._executors["cpu"]._team[:2] == [1, 1]
    cpu = time.process_time()
    time.sleep(0.5)  # a long request waits, due, that the idle urgent lanes may not take
    assert time.process_time() - cpu < 0.2  # they sleep: no lane spins on work it cannot take
    eng.submit("fake", "a short one.", None, Sink(), streaming=True)
    served = done.wait(5)
    v.release.set()
    assert eng.drain(10)
    eng.shutdown(1)
    assert served
    assert reniced == [7, 7]
    assert v.held_when_short_ran[0] == 2  # it ran while long work held both lanes


def test_warm_voice_warms_every_team_size_the_lanes_use():
    """oneDNN builds kernels per shape and thread count: the warm-up runs once per team size
    (every thread for a lone batch, one for a lane's share), then gives its team back."""
    teams, released = [], []
    lanes = two_threads(teams, release_threads=lambda: released.append(1) or True)
    v = FakeVoice(concurrent_runs=True)
    warmed_at = []
    v.warmup = lambda: warmed_at.append(teams[-1] if teams else None)
    Engine([v], cfg(), cpu=lanes).warm_voice("fake")
    assert warmed_at == [2, 1] and teams[-1] == 2 and released
    warmed_at.clear()
    teams.clear()
    Engine([v], EngineConfig(executor="serial"), cpu=lanes).warm_voice("fake")  # one lane: its team as it is
    assert warmed_at == [None]
    with pytest.raises(UnknownVoiceError):
        Engine([v], cfg(), cpu=lanes).warm_voice("nope")


def test_a_lone_batch_that_waits_for_companions_still_starts():
    """With lanes, batches of 2 and a max wait: a lone request's batch is urgent lane 0's, which
    must wake at its deadline even though no urgent work is queued."""
    v = FakeVoice(concurrent_runs=True)
    text = ". ".join("z" * 200 for _ in range(3)) + "."  # not urgent: 600 to its end
    config = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=50, max_batch_phonemes=10_000))
    with Engine([v], config, cpu=two_threads(batch=2)) as eng:
        out = asyncio.run(asyncio.wait_for(_gather(AsyncEngine(eng), "fake", [text]), 5))  # (hung before)
    np.testing.assert_array_equal(out[0], v.expected(text))


def test_on_a_busy_machine_the_reniced_lanes_sit_out_and_the_urgent_lanes_take_all_work(monkeypatch):
    """Other processes hold a core (`fitted_team` below the threads): the reniced lanes would get
    a small share of a core against them, so only the lanes at the process's priority run
    batches, of any class, two at a time; once the load is gone the other lanes work again."""
    busy = {"on": True}
    lanes = two_threads(fitted_team=lambda n: 1 if busy["on"] else n, recheck_s=0.05, urgent_max_s=0.0, spill=False)
    v = FakeVoice(delay_s=0.01, concurrent_runs=True)
    ran_on = []
    run = v.run_pieces
    monkeypatch.setattr(v, "run_pieces", lambda *a, **k: ran_on.append(threading.current_thread().name) or run(*a, **k))
    long_texts = [". ".join(f"a long sentence {k} of request {i} that is not urgent" for k in range(4)) + "."
                  for i in range(4)]
    config = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))
    with Engine([v], config, cpu=lanes) as eng:
        got = asyncio.run(_gather(AsyncEngine(eng), "fake", long_texts))
        for a, t in zip(got, long_texts):
            np.testing.assert_array_equal(a, v.expected(t))
        assert ran_on and all("urgent" in n for n in ran_on)
        assert v.max_concurrent == 2  # both urgent lanes
        busy["on"] = False
        ran_on.clear()
        asyncio.run(_gather(AsyncEngine(eng), "fake", long_texts))
    assert any("urgent" not in n for n in ran_on)


def test_a_started_engine_releases_free_memory_each_period_it_serves_and_not_while_idle(monkeypatch):
    from voxserve.engine import engine as engine_mod
    from voxserve.runtime.allocator import MemoryRelease

    calls = []
    monkeypatch.setattr(engine_mod, "MemoryRelease", lambda period_s: MemoryRelease(0.3, release=lambda: calls.append(1)))
    v = FakeVoice(delay_s=0.05)
    with Engine([v], cfg()) as eng:
        ae = AsyncEngine(eng)
        time.sleep(0.5)
        assert calls == []  # started, never used: nothing released
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:  # 1.2 s of back-to-back requests: 4 periods
            asyncio.run(_gather(ae, "fake", texts(2)))
        assert 3 <= len(calls) <= 5, calls
        t0 = time.monotonic()
        n = len(calls)
        while len(calls) == n and time.monotonic() - t0 < 5:
            time.sleep(0.02)
        assert len(calls) <= n + 1
        time.sleep(0.8)
        m = len(calls)
        time.sleep(0.8)
        assert len(calls) == m  # idle: nothing more
        asyncio.run(_gather(ae, "fake", texts(1)))  # used again: one more release
        t0 = time.monotonic()
        while len(calls) == m and time.monotonic() - t0 < 5:
            time.sleep(0.02)
        assert len(calls) == m + 1
    assert not eng._memory_release._thread.is_alive()  # shutdown stops it


def test_a_lanes_policy_is_picks_built_once():
    """The CPU lanes ask the scheduler with frozen picks made at start (no flags per call): a
    lane takes its class; urgent lane 0 also a lone batch of any class; with a core free, its
    class's second sentence (spill). A reniced lane leaves a lone batch to urgent lane 0."""
    from voxserve.engine.scheduler import Pick

    v = FakeVoice(concurrent_runs=True)
    eng = Engine([v], cfg(), cpu=two_threads(urgent_max_s=0.5)).start(threads=False)
    try:
        ex = eng._executors["cpu"]
        short, long, anything = Pick.short(0.5, 1), Pick.long(0.5, 1), Pick(items=1)
        assert [ex._picks(2, True), ex._picks(0, False)] == [(short, replace(short, second=True)),
                                                            (long, replace(long, second=True))]
        eng.submit("fake", "one lone request. with two sentences.", None, RecordingSink())
        deadline = time.time() + 5
        while eng.queued_sentences() < 2 and time.time() < deadline:
            time.sleep(0.005)
        assert ex._picks(2, True) == (short, anything, replace(short, second=True))  # urgent lane 0
        assert ex._picks(3, True) == ()  # urgent lane 1: lane 0 of its class first
        assert ex._picks(0, False) == ()  # a lone batch is urgent lane 0's
        assert ex._picks(2, None) == (anything, replace(anything, second=True))  # contended: any work
        assert ex._picks(2, True)[0] is ex._picks(2, True)[0]  # the same object each time: built once
    finally:
        eng.shutdown(1)
