"""Idle unload of SBV2 voices (issue 47): a voice's synthesizer goes on unload and its shared
BERT only with the last loaded voice that uses it; the next request through the engine loads
them again and says the same; never while a request of the voice runs."""

from __future__ import annotations

import numpy as np
import pytest
import sbv2_fixtures as fx
from unload_helpers import never_unloaded_while_running, speak

import voxserve
from voxserve import SynthesisOptions
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine.unload import IdleUnloader
from voxserve.families.sbv2 import Sbv2Options

DET = Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)
SEEDED = SynthesisOptions(seed=7)  # sampled noise, from the request's seed
TEXT = "今日はいい天気ですね。えっ、本当ですか？"


@pytest.fixture
def voices(sbv2_folders, tmp_path):
    """Both fixture models on a BERT folder of this test's own (so that no other test's voice
    holds the shared JP BERT)."""
    root = fx.write_bert_root(tmp_path / "bert")
    return {v: voxserve.load_voice(f"sbv2:{p}", device="cpu", bert_dir=root) for v, p in sbv2_folders.items()}


def engine(voices) -> Engine:
    return Engine({v.name: v for v in voices.values()}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), max_queue_wait_s=3600))


def test_the_bert_goes_with_the_last_voice_and_requests_after_a_reload_say_the_same(voices):
    a, b = voices["jp_extra"], voices["multilingual"]
    bert = a.berts["JP"]
    assert b.berts["JP"] is bert and bert.loaded
    with engine(voices) as eng:
        u = IdleUnloader(eng, after_s=10, clock=lambda: 0.0)
        before = {v.name: [speak(eng, v.name, TEXT, o) for o in (DET, SEEDED)] for v in (a, b)}
        assert u.check(5.0) == []
        assert u.check(15.0) == sorted([a.name, b.name])
        assert not a.loaded and not b.loaded and a.model is None and not bert.loaded
        assert bert.tokenize_words("今日") == bert.tokenizer.tokenize("今日")  # the front end keeps its tokenizer
        after = [speak(eng, a.name, TEXT, o) for o in (DET, SEEDED)]
        assert a.loaded and bert.loaded and not b.loaded  # only the voice asked for
        for x, y in zip(after, before[a.name]):
            # float noise only (the engine's BERT batches, as test_sbv2_voice's engine test)
            np.testing.assert_allclose(x, y, atol=1e-5)
        assert eng.loads.reloads == 1 and eng.loads.unloads == 2


def test_one_voice_unloaded_leaves_the_bert_to_the_other(voices):
    a, b = voices["jp_extra"], voices["multilingual"]
    with engine(voices) as eng:
        want = speak(eng, b.name, TEXT, DET)
        a.unload()
        assert a.model is None and a.berts["JP"].loaded  # b still runs it
        np.testing.assert_allclose(speak(eng, b.name, TEXT, DET), want, atol=1e-5)
        b.unload()
        assert not b.berts["JP"].loaded
        b.reload()
        assert b.berts["JP"].loaded and not a.loaded
        np.testing.assert_allclose(speak(eng, b.name, TEXT, DET), want, atol=1e-5)


def test_never_unloaded_while_a_request_of_it_runs(voices):
    v = voices["jp_extra"]

    def hold(gate):
        run = v.run_pieces
        v.run_pieces = lambda *a, **k: gate.wait(30) and run(*a, **k)

    with engine({"jp_extra": v}) as eng:
        never_unloaded_while_running(eng, v, TEXT, DET, hold)
