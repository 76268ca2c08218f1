"""A CosyVoice 2 sentence is held to the voice's max_sentence_audio_seconds (issue 49): its
language model is stopped one token past the limit and the sentence refused then, not run on
to the LM's own length bound (20 speech tokens a text token, which a random or rambling LM
reaches) and through token2wav."""

from __future__ import annotations

import pytest

import voxserve
from voxserve import Limits, SynthesisOptions
from voxserve.errors import AudioTooLongError
from voxserve.families.cosyvoice2.runner import CosyStepRunner

TEXT = "Hello there, this is a longer sentence to say."
LIMIT_S = 0.5


@pytest.fixture(scope="module")
def limited_voice(cv2_dir):
    return voxserve.load_voice(f"cosyvoice2:{cv2_dir}", device="cpu", limits=Limits(max_sentence_audio_seconds=LIMIT_S))


def test_a_sentence_over_its_audio_limit_is_refused_as_soon_as_the_lm_passes_it(limited_voice):
    (u,) = list(limited_voice.units(TEXT, SynthesisOptions(seed=1)))
    cap = limited_voice.model.audio_tokens(LIMIT_S)
    # the LM cannot stop (EOS) before its minimum, so this sentence passes the limit whatever it samples
    assert 0 < cap < u.payload.min_tokens < u.payload.max_tokens
    runner = CosyStepRunner(limited_voice.model)
    runner.join("a", u)
    results, steps = [], 0
    while runner.active:
        results += runner.step()
        steps += 1
        assert steps <= cap + 2, "the sentence ran past its limit"
    (last,) = [r for r in results if r.error is not None]
    assert isinstance(last.error, AudioTooLongError) and last.error.option == "max_sentence_audio_seconds"
    assert last.error.seconds > LIMIT_S
    made = sum(len(r.audio) for r in results if r.audio is not None)
    assert made <= cap * limited_voice.model.config.samples_per_token  # audio before the refusal: within the limit
    assert len(runner.decoder) == 0


def test_the_library_refuses_the_sentence_too(limited_voice):
    with pytest.raises(AudioTooLongError, match="max_sentence_audio_seconds"):
        limited_voice.synthesize(TEXT, SynthesisOptions(seed=1))
    with pytest.raises(AudioTooLongError):
        list(limited_voice.stream(TEXT, SynthesisOptions(seed=1)))


def test_a_sentence_under_its_limit_is_unchanged(cv2_voice, limited_voice):
    # the default limit (120 s) is over the LM's bound for this sentence: nothing changes
    a = cv2_voice.synthesize("Hi.", SynthesisOptions(seed=2)).samples
    assert len(a) / cv2_voice.sample_rate < 120
    b = voxserve.load_voice(f"cosyvoice2:{cv2_voice.model.folder}", device="cpu",
                            limits=Limits(max_sentence_audio_seconds=len(a) / cv2_voice.sample_rate + 0.1))
    assert (b.synthesize("Hi.", SynthesisOptions(seed=2)).samples == a).all()
