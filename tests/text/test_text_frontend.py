"""Each front-end stage as a public seam: split -> normalise -> phonemise -> ids."""

from __future__ import annotations

import logging

import pytest

from voxserve.errors import EmptyTextError, UnpronounceableTextError
from voxserve.text import (
    PhonemeIdMapper,
    TextFrontend,
    normalize,
    normalize_unicode,
    phonemize,
    split_long,
    split_sentences,
)


@pytest.mark.parametrize("text,expected", [
    ("Hello there. How are you?", ["Hello there.", "How are you?"]),
    ("Dr. Smith arrived. He sat.", ["Dr. Smith arrived.", "He sat."]),
    ("It costs 2.5 dollars. Version 3.11.7 is out.", ["It costs 2.5 dollars.", "Version 3.11.7 is out."]),
    ("The U.K. and the E.U. agreed. Then J. R. R. Tolkien spoke.",
     ["The U.K. and the E.U. agreed.", "Then J. R. R. Tolkien spoke."]),
    ("Wait... really?! No way!!! OK, fine.", ["Wait... really?!", "No way!!!", "OK, fine."]),
    ("one; two", ["one;", "two"]),
    ("Meet at 7 p.m. Then leave.", ["Meet at 7 p.m.", "Then leave."]),
    ("see https://example.org/docs. Done", ["see https://example.org/docs.", "Done"]),
    ('"Stop!" he said. "Go."', ['"Stop!" he said.', '"Go."']),
    ("你好。今天好吗？好！", ["你好。", "今天好吗？", "好！"]),
    ("First paragraph\n\nSecond paragraph", ["First paragraph", "Second paragraph"]),
    ("no punctuation at all", ["no punctuation at all"]),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_normalize_typography_and_whitespace():
    assert normalize_unicode("“Well,” she said — quietly — “that’s it…”") == '"Well," she said, quietly, "that\'s it..."'
    assert normalize_unicode("cafe\u0301  and\ttabs\nline") == "café and tabs line"
    assert normalize_unicode("a\n\n\nb") == "a\n\nb"
    assert normalize_unicode("I ❤️ this! 🎉🎉 👍🏽") == "I this!"
    assert normalize_unicode("1990–2000") == "1990-2000"


def test_abbreviations_expanded_for_english_only():
    assert normalize("Dr. Smith met Mr. Jones on Jan. 5th.", "en-us") == "Doctor Smith met Mister Jones on January 5th."
    assert normalize("Dr. Smith", "de") == "Dr. Smith"


def test_split_long_respects_limit_and_prefers_clauses():
    measure = len  # characters as the unit
    s = "alpha beta gamma, delta epsilon zeta, eta theta iota kappa lambda mu nu xi omicron pi"
    pieces = split_long(s, 30, measure)
    assert all(len(p) <= 30 for p in pieces)
    assert pieces[0] == "alpha beta gamma,"
    assert " ".join(pieces).split() == s.split()
    huge = "x" * 95
    assert all(len(p) <= 30 for p in split_long(huge, 30, measure))
    assert "".join(split_long(huge, 30, measure)) == huge


def test_split_long_prefers_conjunctions():
    s = "we walked along the river for hours and then we sat down by the old mill to rest"
    pieces = split_long(s, 50, len)
    assert all(len(p) <= 50 for p in pieces)
    assert pieces[1].startswith("and")


def test_phonemize_and_ids_like_piper():
    ph = phonemize("Hi!", "en-us")
    assert "".join(ph) == "hˈaɪ!"
    mapper = PhonemeIdMapper({"_": [0], "^": [1], "$": [2], "h": [20], "a": [14], "ɪ": [74], "ˈ": [120], "!": [4]})
    assert mapper(ph) == [1, 0, 20, 0, 120, 0, 14, 0, 74, 0, 4, 0, 2]


def test_missing_phoneme_dropped_with_one_warning(caplog):
    mapper = PhonemeIdMapper({"_": [0], "^": [1], "$": [2], "a": [5]})
    with caplog.at_level(logging.WARNING):
        assert mapper(["a", "Q", "a", "Q"]) == [1, 0, 5, 0, 5, 0, 2]
        mapper(["Q"])
    assert sum("Q" in r.message for r in caplog.records) == 1
    assert mapper.missing == {"Q"}


def test_phoneme_map_applied():
    ph = phonemize("a", "en-us", phoneme_map={"ˈ": ["ˌ"]})
    assert "ˈ" not in ph and "ˌ" in ph


def test_frontend_stress_corpus(joe_voice, corpus):
    fe: TextFrontend = joe_voice.frontend
    for d in corpus:
        if d["category"] != "stress":
            continue
        if not d["text"].strip():
            with pytest.raises(EmptyTextError):
                fe.sentences(d["text"])
            continue
        sents = fe.sentences(d["text"])
        assert sents, d["id"]
        assert all(len(s.phonemes) <= fe.max_phonemes for s in sents)
        assert all(s.ids[0] == 1 and s.ids[-1] == 2 for s in sents)


def test_frontend_long_sentence_split(joe_voice, corpus):
    text = next(d["text"] for d in corpus if d["id"] == "stress-12")
    fe = TextFrontend(joe_voice.config.espeak_voice, joe_voice.config.phoneme_id_map, max_phonemes=120)
    sents = fe.sentences(text)
    assert len(sents) >= 3
    assert all(len(s.phonemes) <= 120 for s in sents)
    assert " ".join(s.text for s in sents).split() == text.split()


def test_unpronounceable(joe_voice):
    with pytest.raises(UnpronounceableTextError):
        joe_voice.frontend.sentences("🎉🎉")
    with pytest.raises(UnpronounceableTextError):
        joe_voice.frontend.sentences("🎉 ✨ ...")
    with pytest.raises(EmptyTextError):
        joe_voice.frontend.sentences(" \n\t ")
