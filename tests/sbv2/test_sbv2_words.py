"""SBV2 word timestamps: from the synthesizer's own durations and word2ph, on the tiny fixture
models (random weights: the words' order, bounds and batch invariance are checked, not that
they sit over speech)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import sbv2_fixtures as fx  # noqa: E402

import voxserve  # noqa: E402
from voxserve.families.sbv2 import Sbv2Options

DET = Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)


@pytest.fixture(scope="module")
def voices(sbv2_folders, sbv2_bert_root):
    return {v: voxserve.load_voice(f"sbv2:{p}", device="cpu", bert_dir=sbv2_bert_root)
            for v, p in sbv2_folders.items()}


def cases(variant):
    return [(c["text"], c["language"]) for c in fx.meta()["models"][variant]["cases"]]


def check(audio):
    prev = 0.0
    for w in audio.words:
        assert any(ch.isalnum() for ch in w.word), w
        assert prev - 1e-9 <= w.start < w.end <= audio.duration + 1e-9, (w, audio.duration)
        prev = w.end


@pytest.mark.parametrize("variant", fx.VARIANTS)
def test_sbv2_words_in_order_inside_the_audio_and_batch_invariant(voices, variant):
    v = voices[variant]
    assert v.word_timestamps
    items = cases(variant)
    solo = []
    for text, lang in items:
        a = v.synthesize(text, Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0, language=lang))
        assert a.words, text
        check(a)
        solo.append(a.words)
    batch = v.synthesize_batch([t for t, _ in items],
                               [Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0, language=lang)
                                for _, lang in items])
    assert [a.words for a in batch] == solo


def test_sbv2_english_words_are_the_texts(voices):
    v = voices["multilingual"]
    a = v.synthesize("Hello world. How are you today?", Sbv2Options(noise_scale=0.0, noise_w=0.0,
                                                                         sdp_ratio=0.0, language="EN",
                                                                         sentence_silence=0.3))
    assert [w.word.lower() for w in a.words] == ["hello", "world", "how", "are", "you", "today"]
    check(a)
    # the second sentence's words start after the first sentence's audio and its silence
    first = v.synthesize("Hello world.", Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0,
                                                          language="EN"))
    assert a.words[2].start >= first.duration + 0.3 - 1e-6
    assert np.isclose(a.words[2].start - (first.duration + 0.3),
                      v.synthesize("How are you today?", Sbv2Options(
                          noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0, language="EN")).words[0].start)
