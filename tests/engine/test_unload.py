"""Idle unload (issue 47, `voxserve serve --unload-after`): the policy with fakes and a fake
clock, the engine's hooks with a fake voice, and the RSS of a real Piper voice in a child."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from unload_helpers import child_json

from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine import Sink as EngineSink
from voxserve.engine.unload import IdleUnloader, VoiceLoads, idle_voices
from voxserve.voice import Unit, Voice


# ------------------------------------------------------------------ the policy
def test_idle_voices_are_those_unused_for_the_time_and_with_nothing_in_flight():
    last = {"a": 0.0, "b": 50.0, "c": 0.0}
    assert idle_voices(last, {}, ["a", "b", "c"], now=99.0, after_s=60) == ["a", "c"]
    assert idle_voices(last, {"a": 1}, ["a", "b", "c"], now=99.0, after_s=60) == ["c"]  # in flight: never
    assert idle_voices(last, {}, ["b"], now=110.0, after_s=60) == ["b"]
    assert idle_voices(last, {}, ["b"], now=109.9, after_s=60) == []
    assert idle_voices(last, {}, [], now=1e9, after_s=60) == []  # unloaded already: nothing to do


class FakeVoice(Voice):
    """A voice whose 'weights' are a flag; its audio: one sample per character."""

    family = "fake"
    sample_rate = 1000
    device = "cpu"
    can_unload = True

    def __init__(self, name="v", load_s=0.0):
        self.name, self.load_s = name, load_s
        self.is_loaded, self.unloads, self.reloads = True, 0, 0

    @property
    def loaded(self) -> bool:
        return self.is_loaded

    def unload(self) -> None:
        self.is_loaded, self.unloads = False, self.unloads + 1

    def reload(self) -> None:
        time.sleep(self.load_s)
        self.is_loaded, self.reloads = True, self.reloads + 1

    def units(self, text, options=None):
        return iter([Unit(0, text, len(text), text)])

    def run_units(self, units, early=(), on_early=None):
        assert self.is_loaded, "ran while unloaded"
        return [np.ones(len(u.payload), np.float32) for u in units]


class FakeEngine:
    def __init__(self, voices):
        self.voices = {v.name: v for v in voices}
        self.activity = {v.name: (0, 0) for v in voices}
        self.loads = VoiceLoads()

    def voice_activity(self):
        return dict(self.activity)


def test_a_voice_is_unloaded_after_the_idle_time_on_a_fake_clock():
    v, w = FakeVoice("v"), FakeVoice("w")
    eng = FakeEngine([v, w])
    clock = [100.0]
    u = IdleUnloader(eng, after_s=60, clock=lambda: clock[0])
    assert u.check(130.0) == []
    eng.activity["w"] = (0, 1)  # a request of w came and went between two checks: w was used
    assert u.check(159.0) == []
    assert u.check(160.0) == ["v"] and not v.loaded and w.loaded
    assert u.check(218.9) == []
    assert u.check(219.0) == ["w"] and not w.loaded
    assert u.check(1000.0) == []  # nothing left loaded
    assert v.unloads == 1 and w.unloads == 1


def test_never_while_a_request_of_the_voice_is_in_flight():
    v = FakeVoice()
    eng = FakeEngine([v])
    u = IdleUnloader(eng, after_s=10, clock=lambda: 0.0)
    eng.activity["v"] = (1, 1)  # queued or running, for a long time
    for t in (5.0, 50.0, 500.0):
        assert u.check(t) == [] and v.loaded
    eng.activity["v"] = (0, 1)
    assert u.check(509.0) == []  # idle counts from the last check that saw it busy
    assert u.check(510.0) == ["v"]


def test_a_request_that_arrives_as_the_unloader_decides_keeps_its_voice():
    v = FakeVoice()
    eng = FakeEngine([v])
    u = IdleUnloader(eng, after_s=10, clock=lambda: 0.0)
    reads = []

    def activity():
        reads.append(1)
        # the first read (the policy's) sees it idle; a request is accepted before the unload
        return {"v": (0, 0)} if len(reads) == 1 else {"v": (1, 1)}

    eng.voice_activity = activity
    assert u.check(20.0) == [] and v.loaded


def test_voices_that_cannot_unload_stay_loaded():
    class Fixed(FakeVoice):
        can_unload = False

    f = Fixed("f")
    u = IdleUnloader(FakeEngine([f]), after_s=1, clock=lambda: 0.0)
    assert u.check(100.0) == [] and f.loaded and f.unloads == 0


def test_unload_after_must_be_positive():
    with pytest.raises(ValueError):
        IdleUnloader(FakeEngine([FakeVoice()]), after_s=0)


# ------------------------------------------------------------------ the engine's hooks
class Sink(EngineSink):
    def __init__(self):
        self.audio, self.done, self.error = [], threading.Event(), None

    def on_audio(self, index, samples, text, partial=False):
        self.audio.append(samples)

    def on_done(self, n):
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.done.set()


def test_the_next_request_of_an_unloaded_voice_waits_for_the_load_and_succeeds():
    v = FakeVoice(load_s=0.3)
    with Engine([v], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))) as eng:
        u = IdleUnloader(eng, after_s=5, clock=lambda: 0.0)
        s = Sink()
        eng.submit("v", "hello", None, s)
        assert s.done.wait(10) and s.error is None
        assert u.check(4.0) == []  # used since the start: idle from now
        assert u.check(8.9) == []
        assert u.check(9.0) == ["v"] and not v.loaded
        t = time.perf_counter()
        s = Sink()
        eng.submit("v", "hello again", None, s)  # accepted at once; runs once loaded
        assert s.done.wait(10) and s.error is None, s.error
        assert time.perf_counter() - t >= 0.3  # it waited for the load
        assert v.loaded and v.reloads == 1 and sum(map(len, s.audio)) == len("hello again")
        assert eng.loads.reloads == 1 and eng.loads.unloads == 1


def test_an_engine_key_that_is_not_the_voices_name_unloads_and_reloads():
    v = FakeVoice(name="its-own-name")
    with Engine({"served-as": v}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))) as eng:
        u = IdleUnloader(eng, after_s=5, clock=lambda: 0.0)
        assert u.check(4.0) == []
        assert u.check(5.0) == ["served-as"] and not v.loaded  # (was KeyError: locks by voice name)
        s = Sink()
        eng.submit("served-as", "hello", None, s)
        assert s.done.wait(10) and s.error is None, s.error
        assert v.loaded and v.reloads == 1


def test_the_engine_reports_each_voice_in_flight_until_its_request_ends():
    v = FakeVoice()
    gate = threading.Event()
    run = v.run_units

    def slow(units, early=(), on_early=None):
        gate.wait(10)
        return run(units)

    v.run_units = slow
    with Engine([v], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))) as eng:
        u = IdleUnloader(eng, after_s=1, clock=lambda: 0.0)
        s = Sink()
        eng.submit("v", "hi", None, s)
        assert eng.voice_activity() == {"v": (1, 1)}
        assert u.check(100.0) == [] and v.loaded  # running: never
        gate.set()
        assert s.done.wait(10)
        assert eng.voice_activity() == {"v": (0, 1)}
        assert u.check(100.5) == []  # used since the last check
        assert u.check(101.5) == ["v"]


# ------------------------------------------------------------------ a real voice's memory
CHILD = """
import voxserve
from voxserve.runtime.allocator import release_free_memory

base = rss_mb()
v = voxserve.load_voice(device="cpu")  # en_US-joe-medium
first = v.synthesize("Hello there, this is a test.").samples
release_free_memory()
loaded = rss_mb()
v.unload()
unloaded = rss_mb()
v.reload()
again = v.synthesize("Hello there, this is a test.").samples
print(json.dumps({"base": base, "loaded": loaded, "unloaded": unloaded, "reloaded": rss_mb(),
                  "same_len": abs(len(again) - len(first)) < 0.2 * len(first), "was": v.loaded}))
"""


def test_unloading_a_piper_voice_gives_its_memory_back():
    """en_US-joe-medium (63 MB of weights as fp32) in a child: RSS drops on unload, and the
    voice speaks again after reload."""
    r = child_json("import json\n" + CHILD)
    # the weights are 60 MB; malloc_trim gives back 29-60 MB of their freed pages here (the rest
    # stays in the heap until the next allocations reuse it): never nothing
    assert r["loaded"] - r["unloaded"] >= 20, r
    assert r["same_len"] and r["was"], r


def test_the_serve_flag_and_its_environment_variable():
    from voxserve.cli import build_parser
    from voxserve.serve.settings import settings_from

    def parse(*args, env=None):
        return settings_from(build_parser().parse_args(["serve", *args]), environ=env or {})

    assert parse().load.unload_after is None  # off by default
    assert parse("--unload-after", "600").load.unload_after == 600.0
    assert parse(env={"VOXSERVE_UNLOAD_AFTER": "30"}).load.unload_after == 30.0
