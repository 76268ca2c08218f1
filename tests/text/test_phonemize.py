"""Our espeak-ng clause reader against piper-tts's extension: the same phonemes, and no
memory kept per call (the extension's get_phonemes keeps every clause it returns)."""

import gc
import json
import sys
from pathlib import Path

import pytest

from voxserve.text.phonemize import _espeak, merge_vowel_clusters, phonemize, phonemize_sentences

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "en_bench.jsonl"
EDGES = [
    "", "   ", "No terminator", "Wait; what: really, yes!", "Ellipsis... and more?!",
    "Mr. Smith paid $3.50 on 1/2/2023.", "Line one\nLine two\n\nA paragraph", "1234567",
    "C'est la vie, a naïve café. «Quoted», he said.", "(parens) [brackets] {braces} - dash",
]
CLUSTERS = {("a", "ɪ"), ("o", "ʊ"), ("e", "ɪ"), ("a", "ʊ")}


def corpus() -> list[str]:
    return [json.loads(line)["text"] for line in CORPUS.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def bridge():
    from piper import espeakbridge
    from piper.phonemize_espeak import EspeakPhonemizer

    _espeak()  # initialises espeak-ng
    return espeakbridge, EspeakPhonemizer()


def test_clauses_are_the_extensions(bridge):
    espeakbridge, _ = bridge
    texts = EDGES + corpus()
    assert len(texts) > 30
    for voice in ("en-us", "fr", "de"):
        for text in texts if voice == "en-us" else EDGES:
            espeakbridge.set_voice(voice)
            assert _espeak().clauses(voice, text) == espeakbridge.get_phonemes(text), (voice, text)


@pytest.mark.parametrize("clusters", [None, CLUSTERS])
def test_sentences_are_pipers(bridge, clusters):
    _, piper = bridge
    for text in EDGES + corpus()[:20]:
        assert phonemize_sentences(text, "en-us", clusters) == piper.phonemize("en-us", text, vowel_clusters=clusters), text


def test_a_nul_does_not_end_the_text():
    assert phonemize_sentences("hello\0world") == phonemize_sentences("hello world")


def test_vowel_clusters_merge_longest_first():
    assert merge_vowel_clusters(list("xaɪoʊy"), CLUSTERS) == ["x", "aɪ", "oʊ", "y"]
    assert merge_vowel_clusters(list("aɪə"), CLUSTERS | {("a", "ɪ", "ə")}) == ["aɪə"]
    assert merge_vowel_clusters([], CLUSTERS) == []


def test_phonemizing_keeps_no_memory():
    text = "The quick brown fox, it jumps; over: the lazy dog. Another one! And?"
    for _ in range(50):
        phonemize(text)
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(2000):  # 6 clauses a call: the extension's get_phonemes would keep 24000 objects
        phonemize(text)
    gc.collect()
    assert sys.getallocatedblocks() - before < 500
