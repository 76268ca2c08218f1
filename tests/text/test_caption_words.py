"""Word timestamps and captions name the text's own tokens (README, "Word timestamps"), through
every rule of the English normaliser; and text with nothing to say (control characters, escape
sequences, stray combining marks) says nothing."""

from __future__ import annotations

import re

import pytest

import voxserve
from voxserve.captions import cues
from voxserve.families.piper.words import SourceWords, WordSpan, source_token
from voxserve.text.aligned import Aligned
from voxserve.text.normalize import normalize_unicode
from voxserve.text.spoken import _RULES, normalize_text, normalize_text_aligned

DET = voxserve.DETERMINISTIC
EXAMPLES = [(k, ex) for k, rule in enumerate(_RULES) for ex in rule.examples]


def tokens(text: str) -> list[str]:
    """The README's words of a text: its whitespace tokens with a letter or digit, outer
    punctuation stripped."""
    return [w for w in (source_token(t) for t in text.split()) if any(ch.isalnum() for ch in w)]


# tokens that one reading says as a whole ("et al." -> "and others"): one caption word
ONE_READING = ("et al",)


def caption_words(text: str) -> list[str]:
    """What the captions of `text` must name: its tokens, each its own word but for ONE_READING."""
    out = tokens(text)
    for k in range(len(out) - 1, 0, -1):
        if f"{out[k - 1]} {out[k]}" in ONE_READING:
            out[k - 1:k + 1] = [f"{out[k - 1]} {out[k]}"]
    return out


def test_every_rule_has_an_example_that_it_rewrites():
    assert all(rule.examples for rule in _RULES)
    for k, ex in EXAMPLES:
        rule = _RULES[k]
        m = rule.pattern.search(ex)
        assert m is not None, (k, ex)
        said = rule.handler(m)
        said = said if isinstance(said, str) else "".join(p for p, _ in said)
        assert said != m.group(0), (k, ex)


@pytest.mark.parametrize("k,text", EXAMPLES, ids=[f"{k}:{t[:24]}" for k, t in EXAMPLES])
def test_source_words_of_every_rule_example_are_the_texts_tokens(k, text):
    # each spoken word a span of its own: the words reported are the text's tokens, each once,
    # in order, each a word of its own (on main 11 of the 55 examples failed: "$5 million" gave
    # "$5", "million", "dollars"; "Dec. 1, 2026" one word "Dec 1 2026"; "60 mph" one word)
    spoken = normalize_text_aligned(Aligned.of(text), "en-us")
    sw = SourceWords(text, spoken)
    spans = [WordSpan(w, 2 * j, 2 * j + 2) for j, w in enumerate(sw.said)]
    got = sw.respan(" ".join(sw.said), spans)
    assert [s.word for s in got] == caption_words(text), spoken.text
    assert all(a.hi <= b.lo for a, b in zip(got, got[1:]))


def test_source_words_of_the_normaliser_corpus_are_the_texts_tokens():
    # the 235 inputs of tests/text/test_normalize_text.py (on main 18 differed: "$3 billion",
    # "December 1, 2026", ...)
    from test_normalize_text import CORPUS

    from voxserve.text.frontend import TextFrontend

    fe = TextFrontend("en-us", {"_": [0], "^": [1], "$": [2], " ": [3]})
    bad = []
    for _, _, text, _ in CORPUS:
        sw = SourceWords(text, fe.normalize_aligned(text))
        got = [s.word for s in sw.respan(" ".join(sw.said), [WordSpan(w, j, j + 1) for j, w in enumerate(sw.said)])]
        if got != caption_words(text):
            bad.append((text, got))
    assert not bad and len(CORPUS) >= 200, bad


def test_caption_words_of_every_rule_example_are_the_texts_tokens(joe_voice):
    """The property through the real voice (espeak's joins and splits, the sentence splitter):
    for every example of every rule, the words are the text's tokens (joined, they equal the
    tokens joined), and the cues show the text itself."""
    bad = []
    # in one batch (words of a batch equal solo words: tests/test_words.py)
    for (k, text), a in zip(EXAMPLES, joe_voice.synthesize_batch([t for _, t in EXAMPLES], DET)):
        words = [w.word for w in a.words]
        if " ".join(words) != " ".join(tokens(text)) or words != caption_words(text):
            bad.append((k, text, words))
        shown = " ".join(c.text for c in cues(a.words, text=text))
        if shown != " ".join(text.split()):
            bad.append((k, text, shown))
    assert not bad, bad
    assert len(EXAMPLES) >= len(_RULES)


def _by_word(audio) -> dict[str, voxserve.Word]:
    return {w.word: w for w in audio.words}


def test_issue_examples_caption_the_texts_own_tokens(joe_voice):
    a = joe_voice.synthesize("$1.2 million, up 15%", DET)
    assert [w.word for w in a.words] == ["$1.2", "million", "up", "15%"]
    assert [c.text for c in cues(a.words, text="$1.2 million, up 15%")] == ["$1.2 million, up 15%"]

    a = joe_voice.synthesize("$5 million", DET)
    assert [w.word for w in a.words] == ["$5", "million"]
    # "$5" over "five", "million" over "million dollars": the spans of the same spoken words
    ref = joe_voice.synthesize("five million dollars", DET).words
    w = _by_word(a)
    assert (w["$5"].start, w["$5"].end) == pytest.approx((ref[0].start, ref[0].end), abs=0.02)
    assert (w["million"].start, w["million"].end) == pytest.approx((ref[1].start, ref[2].end), abs=0.02)

    a = joe_voice.synthesize("Dec. 1, 2026", DET)
    assert [w.word for w in a.words] == ["Dec", "1", "2026"]
    assert [c.text for c in cues(a.words, text="Dec. 1, 2026")] == ["Dec. 1, 2026"]
    assert all(x.end <= y.start + 1e-9 for x, y in zip(a.words, a.words[1:]))


def test_symbol_words_and_dropped_tokens_name_no_spoken_word():
    # "&" is said ("and") but is no word of the text: no caption word; an escape sequence is
    # not said and its token shows without it
    text = "Tom & Jerry \x1b[1mran\x1b[0m \x1b]0;my title\x07"
    sw = SourceWords(text, normalize_text_aligned(Aligned.of(normalize_unicode(text)), "en-us"))
    spoken = sw.said
    assert spoken == ["Tom", "and", "Jerry", "ran"]
    # (the frontend's own chain, aligned from the raw text)
    from voxserve.text.frontend import TextFrontend
    fe = TextFrontend("en-us", {"_": [0], "^": [1], "$": [2], " ": [3]})
    sw = SourceWords(text, fe.normalize_aligned(text))
    got = sw.respan(" ".join(sw.said), [WordSpan(w, j, j + 1) for j, w in enumerate(sw.said)])
    assert [s.word for s in got] == ["Tom", "Jerry", "ran"]


def test_a_token_said_across_two_sentences_is_named_once():
    text = "It was 4:30 p.m. Then rain."
    spoken = normalize_text_aligned(Aligned.of(text), "en-us")
    sw = SourceWords(text, spoken)
    names = []
    pos = 0
    for sent in re.split(r"(?<=\.) (?=[A-Z])", spoken.text):
        n = len(sent.split())
        names += [s.word for s in sw.respan(sent, [WordSpan(w, j, j + 1) for j, w in enumerate(sw.said[pos:pos + n])])]
        pos += n
    assert names == tokens(text)


# ---------------------------------------------------------------------------------------------
# money past the trillions, control characters, combining marks


@pytest.mark.parametrize("text,expected", [
    ("$" + "9" * 40, " ".join(["nine"] * 40) + " dollars"),
    ("-£" + "1" * 20, "minus " + " ".join(["one"] * 20) + " pounds"),
    ("$" + "9" * 20 + ".50", " ".join(["nine"] * 20) + " point five zero dollars"),
    ("$" + "1" * 15, "one hundred eleven trillion one hundred eleven billion one hundred eleven million one "
                     "hundred eleven thousand one hundred eleven dollars"),
])
def test_huge_money_reads_its_digits_then_the_currency(text, expected):
    out = normalize_text(text, "en-us")
    assert out == expected
    assert not re.search(r"[$£€¥]", out)


@pytest.mark.parametrize("text,expected", [
    ("\x1b[31mred\x1b[0m alert", "red alert"),  # SGR colour
    ("\x1b[31m", ""),
    ("\x1b[2J\x1b[1;1Hhome", "home"),  # clear screen, cursor position
    ("\x1b]0;my title\x07shown", "shown"),  # OSC window title, BEL-terminated
    ("\x1b]8;;http://x.y\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink, ST-terminated
    ("\x9b31mC1 form", "C1 form"),  # the one-byte CSI
    ("bell\x07 and\x00 nul\x7f", "bell and nul"),
    ("lone escape \x1b", "lone escape"),
    ("one\vtwo\fthree\x1cfour\x1ffive\x85six\u2028seven", "one two three four five six seven"),
    ("para one\u2029para two", "para one\n\npara two"),
    ("\u2066$5\u2069 \u200eup\u202e", "$5 up"),  # bidirectional controls
])
def test_control_characters_and_escape_sequences_say_nothing(text, expected):
    assert normalize_unicode(text) == expected
    # and so nothing of them reaches the spoken form
    spoken = normalize_text(normalize_unicode(text), "en-us")
    assert "meter" not in spoken and "thirty" not in spoken and "[" not in spoken


@pytest.mark.parametrize("text,expected", [
    ("e\u0301te\u0301", "\u00e9t\u00e9"),  # composed
    ("\u0301start", "start"),  # a mark with no letter under it
    ("x 5\u0303 y", "x 5 y"),  # on a digit
    ("a \u0301\u0302\u0303b", "a b"),  # a run of them after a space
    ("e\u0301\u0302\u0303", "\u00e9\u0302\u0303"),  # stacked on a letter: kept
    ("Z\u0336\u0335a\u0337", "Z\u0336\u0335a\u0337"),  # strike-through marks on letters: kept
])
def test_combining_marks(text, expected):
    assert normalize_unicode(text) == expected


def test_aligned_text_says_where_each_character_came_from():
    a = normalize_text_aligned(Aligned.of("Dec. 1, 2026"), "en-us")
    assert a.text == "December first, twenty twenty-six"
    spans = {w: a.span(m.start(), m.end()) for m in re.finditer(r"[\w-]+", a.text) for w in [m.group()]}
    assert spans["December"] == (0, 3) and spans["first"] == (5, 6) and spans["twenty-six"] == (8, 12)
    # the unicode pass keeps the request's offsets too: "é" (two code points) -> its two
    from voxserve.text.normalize import normalize_unicode_aligned
    u = normalize_unicode_aligned(Aligned.of("\x1b[1mcafe\u0301 ok"))
    assert u.text == "caf\u00e9 ok" and u.span(3, 4) == (7, 9) and u.span(5, 7) == (10, 12)


def test_cues_show_a_said_symbol_with_the_word_after_it():
    ws = [voxserve.Word(w, k * 0.3, k * 0.3 + 0.25) for k, w in enumerate(["Tom", "Jerry", "ran"])]
    assert [c.text for c in cues(ws, text="Tom & Jerry ran.")] == ["Tom & Jerry ran."]
    assert [c.text for c in cues(ws, text='Tom -- "Jerry" ran.')] == ['Tom "Jerry" ran.']
