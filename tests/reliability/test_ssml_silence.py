"""SSML silence is streamed, not materialised (issue 49, item 7): `<speak>hi` + `<break
time="10s"/>` x 179 + `bye</speak>` made one 1790 s array (158 MB of float32), copied again with
"bye", per request. A run of breaks now goes out as units of at most SILENCE_UNIT_S, each made
as it is sent, and the audio is the same: the same silence, sentence silence included."""

from __future__ import annotations

import numpy as np
import pytest

import voxserve
from voxserve.families.piper import PiperOptions

SILENCE_UNIT_S = 20.0  # families/piper/voice.py: the most silence one unit holds


@pytest.fixture(scope="module")
def voice(tiny_voice_path):
    return voxserve.load_voice(str(tiny_voice_path), device="cpu")


@pytest.mark.parametrize("sentence_silence", [None, 0.5, 10.0])
def test_a_long_run_of_breaks_streams_in_bounded_chunks_with_the_same_total(voice, sentence_silence):
    det = dict(noise_scale=0.0, noise_w=0.0, seed=0, sentence_silence=sentence_silence)
    breaks = 7  # 70 s: over three silence units
    ssml = "<speak>Hi there." + '<break time="10s"/>' * breaks + "Bye now." + '<break time="10s"/>' * 5 + "</speak>"
    opts = PiperOptions(input_format="ssml", **det)
    rate = voice.sample_rate
    chunks = [c.samples for c in voice.stream(ssml, opts)]
    # no chunk holds more than one silence unit and a sentence
    longest_sentence = max(len(voice.synthesize(t, PiperOptions(**det)).samples) for t in ("Hi there.", "Bye now."))
    assert max(len(c) for c in chunks) <= SILENCE_UNIT_S * rate + longest_sentence
    whole = voice.synthesize(ssml, opts).samples
    hi = voice.synthesize("Hi there.", PiperOptions(**det)).samples
    gap = round((sentence_silence or 0.0) * rate)
    # hi, the sentence gap and 70 s, bye, the gap and 50 s: as before the silence was cut
    assert len(whole) - len(hi) - len(voice.synthesize("Bye now.", PiperOptions(**det)).samples) \
        == 2 * gap + (breaks + 5) * 10 * rate
    silent = whole[len(hi): len(hi) + gap + breaks * 10 * rate]
    assert not np.any(silent)


def test_breaks_alone_are_still_unpronounceable(voice):
    with pytest.raises(voxserve.UnpronounceableTextError):
        list(voice.stream("<speak>" + '<break time="10s"/>' * 5 + "</speak>", PiperOptions(input_format="ssml")))
