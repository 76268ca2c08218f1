"""Idle unload of CosyVoice 2 voices (issue 47). The unit is the loaded voice: the shared model
(language model, flow, HiFT) goes once no loaded voice of its folder uses it, speakers cloned
from recordings stay, and the next request through the engine loads the model again and says
the same; never while a request of the voice runs."""

from __future__ import annotations

import pytest
from cv2_fixtures import assert_same_audio, prompt_entry, write_model_folder
from cv2_onnx_fixtures import write_standins
from unload_helpers import never_unloaded_while_running, speak

from voxserve import SynthesisOptions
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine.unload import IdleUnloader
from voxserve.families.cosyvoice2.loader import load_cosyvoice2_voice
from voxserve.families.cosyvoice2.store import read_recording

TEXT = "Hello there, a sentence to say. And a second."


@pytest.fixture
def two_voices(tmp_path):
    """Two voices of one model folder of this test's own (so that no other test's voice holds
    its model)."""
    d = write_model_folder(tmp_path / "cv2", speakers={"spk": prompt_entry()})
    write_standins(d)
    return load_cosyvoice2_voice(d, name="a", device="cpu"), load_cosyvoice2_voice(d, name="b", device="cpu")


def engine(*voices) -> Engine:
    return Engine({v.name: v for v in voices},
                  EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), max_queue_wait_s=3600))


def test_the_model_goes_with_the_last_voice_and_cloned_speakers_stay(two_voices, prompt_wav):
    a, b = two_voices
    model = a.model
    assert b.model is model and a.step_runner() is b.step_runner()
    wave, rate = read_recording(prompt_wav)
    a.add_prompt("alice", wave, rate, "Hello, this is my voice.")
    opts = [SynthesisOptions(speaker="alice", seed=1), SynthesisOptions(speaker="spk", seed=2)]
    with engine(a, b) as eng:
        u = IdleUnloader(eng, after_s=10, clock=lambda: 0.0)
        before = [speak(eng, "a", TEXT, o) for o in opts]
        want_b = speak(eng, "b", "Short one.", opts[1])
        assert u.check(5.0) == []
        a.unload()
        assert not a.loaded and model.loaded  # b still uses it
        assert_same_audio(speak(eng, "b", "Short one.", opts[1]), want_b)
        assert u.check(20.0) == []  # b was used at 20 (a is unloaded already)
        assert u.check(30.0) == ["b"]
        assert not model.loaded and model.lm is None and model.flow is None and model.hift is None
        assert "alice" in a.speakers and model.count_tokens("hello") > 0  # prompts and tokenizer stay
        after = [speak(eng, "a", TEXT, o) for o in opts]
        assert a.loaded and model.loaded and not b.loaded
        for x, y in zip(after, before):
            assert len(x) > 0
            assert_same_audio(x, y)  # float noise only (the family's bound for batched runs)
        assert eng.loads.reloads == 1


def test_a_voice_loaded_while_the_model_is_unloaded_loads_it(two_voices):
    a, b = two_voices
    a.unload()
    b.unload()
    assert not a.model.loaded
    c = load_cosyvoice2_voice(a.model.folder, name="c", device="cpu")
    assert c.model is a.model and c.model.loaded
    assert len(c.synthesize("Hello.", SynthesisOptions(seed=1)).samples) > 0


def test_never_unloaded_while_a_request_of_it_runs(two_voices):
    a, _ = two_voices

    def hold(gate):
        stepper = a.step_runner()
        step = stepper.step
        stepper.step = lambda: gate.wait(30) and step()

    with engine(a) as eng:
        never_unloaded_while_running(eng, a, TEXT, SynthesisOptions(seed=1), hold)
