"""The library and the command line as a user expects them (issue 49): `Voice.stream` holds the
sentence silence that `synthesize` puts in; `voxserve say` writes opus for any voice and aac;
every kind of bad input exits 2 with one line; the default output is never overwritten."""

from __future__ import annotations

import numpy as np
import pytest

import voxserve
from voxserve import SynthesisOptions


@pytest.fixture(scope="module")
def tiny(tiny_voice_path):
    return voxserve.load_voice(str(tiny_voice_path), device="cpu")


@pytest.mark.parametrize("silence", [0.0, 0.35])
def test_stream_holds_the_sentence_silence_of_synthesize(tiny, silence):
    text = "Hello there. How are you today? Fine, thanks. And you?"
    opts = SynthesisOptions(seed=1, noise_scale=0, noise_w=0, sentence_silence=silence)
    whole = tiny.synthesize(text, opts)
    chunks = list(tiny.stream(text, opts))
    assert len(chunks) == 4
    assert sum(len(c.samples) for c in chunks) == len(whole.samples)  # the same duration
    joined = np.concatenate([c.samples for c in chunks])
    np.testing.assert_allclose(joined, whole.samples, atol=1e-4)
    gap = int(round(silence * tiny.sample_rate))
    for c in chunks[:-1]:  # each sentence's silence at the end of its chunk; none after the last
        assert not np.any(c.samples[len(c.samples) - gap:])
