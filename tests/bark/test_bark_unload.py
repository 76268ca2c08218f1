"""Idle unload of Bark voices (issue 47): the BarkModel goes on unload, the engine's step runner
(the same instance: the worker keeps it) runs the reloaded model, seeded requests say the same
after a reload, a voice is never unloaded while a request of it runs, and RSS drops."""

from __future__ import annotations

import numpy as np
import pytest
from bark_fixtures import TEXTS
from unload_helpers import child_json, never_unloaded_while_running, speak

import voxserve
from voxserve import SynthesisOptions
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine.unload import IdleUnloader
from voxserve.families.bark import BarkOptions

SEEDED = SynthesisOptions(speaker="v2/en_speaker_1", seed=11)
TEXT = " ".join(TEXTS[:2])


@pytest.fixture
def voice(tiny_bark_dir):
    return voxserve.load_voice(f"bark:{tiny_bark_dir}", device="cpu")  # its own model, not the module's


def engine(voice) -> Engine:
    return Engine({voice.name: voice}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), max_queue_wait_s=3600))


def test_a_seeded_request_after_a_reload_says_the_same(voice):
    with engine(voice) as eng:
        stepper = voice.step_runner()
        u = IdleUnloader(eng, after_s=10, clock=lambda: 0.0)
        before = [speak(eng, voice.name, TEXT, o) for o in (SEEDED, BarkOptions(temperature=0))]
        assert u.check(5.0) == []  # used since the start: idle from now
        assert u.check(15.0) == [voice.name]
        assert not voice.loaded and voice.runner is None and stepper.runner is None
        assert voice.count_tokens("hello world") > 0  # the front end keeps its tokenizer
        after = [speak(eng, voice.name, TEXT, o) for o in (SEEDED, BarkOptions(temperature=0))]
        assert voice.loaded and voice.step_runner() is stepper and stepper.runner is voice.runner
        for x, y in zip(after, before):
            assert len(x) > 0
            np.testing.assert_array_equal(x, y)


def test_never_unloaded_while_a_request_of_it_runs(voice):
    def hold(gate):
        stepper = voice.step_runner()
        step = stepper.step
        stepper.step = lambda: gate.wait(30) and step()

    with engine(voice) as eng:
        never_unloaded_while_running(eng, voice, TEXT, SEEDED, hold)


def test_a_voice_built_in_memory_cannot_unload(voice):
    from voxserve.families.bark.voice import bark_voice_from_model

    v = bark_voice_from_model(voice.runner.model, voice.runner.processor, "mem", device="cpu")
    assert not v.can_unload and voice.can_unload


CHILD = """
import json, sys
import voxserve
from voxserve import SynthesisOptions
from voxserve.runtime.allocator import release_free_memory
from bark_fixtures import write_tiny_bark

d = write_tiny_bark(sys.argv[1], hidden=512)  # about 80 MB of fp32 weights
v = voxserve.load_voice(f"bark:{d}", device="cpu")
o = SynthesisOptions(speaker="v2/en_speaker_1", seed=3)
first = v.synthesize("hello world.", o).samples
release_free_memory()
loaded = rss_mb()
v.unload()
unloaded = rss_mb()
v.reload()
again = v.synthesize("hello world.", o).samples
print(json.dumps({"loaded": loaded, "unloaded": unloaded, "reloaded": rss_mb(),
                  "same": bool((again == first).all()) and len(first) > 0}))
"""


def test_unloading_a_bark_voice_gives_its_memory_back(tmp_path):
    import os

    script = CHILD.replace("sys.argv[1]", repr(str(tmp_path / "bark")))
    r = child_json(f"import sys; sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})\n" + script)
    assert r["loaded"] - r["unloaded"] >= 50, r  # most of the weights' ~80 MB comes back
    assert r["same"], r
