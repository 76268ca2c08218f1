"""Unicode and typographic normalisation, before sentence splitting and phonemisation.

What it does, in order:
1. NFC composition (so "e" + combining acute and "é" are the same input).
2. Typographic punctuation to the ASCII forms espeak-ng was trained on: curly quotes,
   primes, guillemets -> ASCII quotes; a dash used as punctuation (em/en dash, or a spaced
   hyphen) -> a comma pause; the ellipsis character -> "...".
3. Characters with nothing to say are dropped: emoji and pictographs (with their variation
   selectors, joiners and skin-tone modifiers), control, bidirectional and private-use characters, terminal
   escape sequences whole ("\x1b[31m"), combining marks with no letter under them. espeak-ng
   would otherwise read "🎉" as "party popper". Control characters that separate (vertical
   tab, form feed, the information separators, U+2028) are spaces; U+2029 a paragraph break.
4. Whitespace: runs of spaces/tabs (and single line breaks) become one space; a blank line
   (paragraph break) is kept as "\n\n", which the splitter treats as a sentence boundary.
5. For English voices only, a few abbreviations that espeak-ng would end a sentence on
   ("Dr. Smith" -> "Doctor. Smith") are expanded ("Doctor Smith").
"""

from __future__ import annotations

import re
import unicodedata

from .aligned import Aligned

_TRANSLATE = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
        "\u00ab": '"', "\u00bb": '"', "\u2039": "'", "\u203a": "'",
        "\u2026": "...",
        "\u00a0": " ", "\u2007": " ", "\u202f": " ", "\u2009": " ", "\u200a": " ",
        "\u2002": " ", "\u2003": " ", "\u3000": " ",
        "\u2010": "-", "\u2011": "-", "\u2212": "-",
        "\ufe0f": None, "\ufe0e": None, "\u200d": None, "\u200b": None, "\ufeff": None,
        "\u00ad": None,
        # bidirectional marks, embeddings and isolates: they order text on screen, say nothing
        **{c: None for c in "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"},
    }
)

# em dash, en dash, horizontal bar, and a hyphen standing alone between spaces: a pause
_DASH_PAUSE = re.compile(r"\s*[\u2014\u2015]\s*|\s+[\u2013-]+\s+|\s*\u2013\s+|\s+\u2013\s*")
_EN_DASH_RANGE = re.compile(r"(?<=\w)\u2013(?=\w)")  # 1990–2000 -> 1990-2000

_EMOJI_RANGES = (
    (0x1F000, 0x1FAFF),  # mahjong .. symbols & pictographs extended-A (incl. emoticons)
    (0x2600, 0x27BF),  # misc symbols, dingbats (❤ ✂ ☀)
    (0x2B00, 0x2BFF),  # arrows and stars (⭐)
    (0x1F1E6, 0x1F1FF),  # regional indicators (flags)
    (0xE0000, 0xE007F),  # tags
)


def _is_silent(ch: str) -> bool:
    cp = ord(ch)
    if any(lo <= cp <= hi for lo, hi in _EMOJI_RANGES):
        return True
    cat = unicodedata.category(ch)
    if cat in ("Co", "Cs", "Cn"):
        return True
    return cat == "Cc" and ch not in "\n\t\r"


# Terminal escape sequences (ECMA-48: CSI "\x1b[31m", OSC "\x1b]0;title\x07", two-character
# escapes, and their one-byte C1 forms) draw nothing: dropped whole, not only their ESC, so
# that "\x1b[31m" is not read as "[thirty-one meters".
_ESCAPE = re.compile(r"(?:\x1b\[|\x9b)[0-?]{0,64}+[ -/]{0,16}+[@-~]?"
                     r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]{0,4096}+(?:\x07|\x1b\\|\x9c)?"
                     r"|\x1b[ -/]{0,16}+[0-~]?")
# control characters that separate like a space (vertical tab, form feed, the information
# separators, next line, line separator); the paragraph separator is a blank line
_SEPARATORS = str.maketrans({**{c: " " for c in "\v\f\x1c\x1d\x1e\x1f\x85\u2028"}, "\u2029": "\n\n"})
# combining marks with no letter to sit on (after a digit, a symbol, a space or at the start):
# nothing to say them with
_MARKS = "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
_STRAY_MARKS = re.compile(r"(?<![^\W\d_])(?<![" + _MARKS + r"])[" + _MARKS + r"]+")
_TRANSLATED = re.compile("[" + "".join(re.escape(chr(c)) for c in _TRANSLATE) + "]")
_SEPARATED = re.compile("[" + "".join(re.escape(chr(c)) for c in _SEPARATORS) + "]")

_SPACES = re.compile(r"[ \t\r\f\v]+")
_PARAGRAPH = re.compile(r"\s*\n\s*\n\s*")
_LINEBREAK = re.compile(r"(?<!\n)\n(?!\n)")

# Titles and months that espeak-ng reads as a sentence end when followed by a capital.
_EN_ABBREVIATIONS = {
    "Dr": "Doctor", "Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Prof": "Professor",
    "Sgt": "Sergeant", "Capt": "Captain", "Gen": "General", "Rev": "Reverend", "Hon": "Honorable",
    "Jr": "Junior", "Sr": "Senior", "vs": "versus",
    "Jan": "January", "Feb": "February", "Mar": "March", "Apr": "April", "Jun": "June",
    "Jul": "July", "Aug": "August", "Sep": "September", "Sept": "September", "Oct": "October",
    "Nov": "November", "Dec": "December",
}
_EN_ABBREV_RE = re.compile(r"\b(" + "|".join(sorted(_EN_ABBREVIATIONS, key=len, reverse=True)) + r")\.(?=\s+\w|,)")


def _nfc(text: Aligned) -> Aligned:
    """NFC, each composed character said by the characters it was made of."""
    t = text.text
    if unicodedata.is_normalized("NFC", t):
        return text
    # a base and the marks after it compose among themselves; Hangul jamo and the rare
    # composition across such runs fall back to one span for the whole text
    out = text.sub(_CLUSTER, lambda m: unicodedata.normalize("NFC", m.group(0)))
    if out.text != unicodedata.normalize("NFC", t):
        return Aligned(unicodedata.normalize("NFC", t), *_whole(len(unicodedata.normalize("NFC", t)), text))
    return out


_CLUSTER = re.compile(r".[" + _MARKS + r"\u0591-\u05c7\u064b-\u065f\u0900-\u0dff\u3099\u309a]+", re.S)


def _whole(n: int, text: Aligned) -> tuple[tuple[int, ...], tuple[int, ...]]:
    s, e = text.span(0, len(text.text))
    return (s,) * n, (e,) * n


def normalize_unicode_aligned(text: Aligned) -> Aligned:
    """`normalize_unicode`, each character carrying the span of the input it says."""
    text = text.sub(_ESCAPE, "")
    text = text.sub(_SEPARATED, lambda m: _SEPARATORS[ord(m.group(0))])
    text = _nfc(text)
    text = text.sub(_STRAY_MARKS, "")
    text = text.sub(_EN_DASH_RANGE, "-")
    text = text.sub(_DASH_PAUSE, ", ")
    text = text.sub(_TRANSLATED, lambda m: _TRANSLATE[ord(m.group(0))] or "")
    text = text.keep(lambda ch: not _is_silent(ch))
    text = text.sub(_SPACES, " ")
    text = text.sub(_PARAGRAPH, "\n\n")
    text = text.sub(_LINEBREAK, " ")
    text = text.sub(_SPACES, " ")
    # a pause inserted next to other punctuation or at an edge is noise
    text = text.sub(_PAUSE_BEFORE_PUNCT, "")
    text = text.sub(_PAUSE_AT_START, lambda m: m.group(1))
    text = text.sub(_PAUSE_AT_END, lambda m: m.group(1))
    text = text.sub(_PAUSE_AFTER_OPEN, lambda m: m.group(1))
    return text.strip(" ")


_PAUSE_BEFORE_PUNCT = re.compile(r",\s*(?=[,.!?;:])")
_PAUSE_AT_START = re.compile(r"(^|\n)\s*,\s*")
_PAUSE_AT_END = re.compile(r"\s*,\s*($|\n)")
_PAUSE_AFTER_OPEN = re.compile(r"([\"'(])\s*,\s*")


def visible(text: str) -> list[int]:
    """The indices of `text`'s characters that are not in what step 3 drops unseen (escape
    sequences, control characters, emoji): the text a reader sees."""
    hidden = bytearray(len(text))
    for m in _ESCAPE.finditer(text):
        hidden[m.start():m.end()] = b"\x01" * (m.end() - m.start())
    return [i for i, ch in enumerate(text) if not hidden[i] and (not _is_silent(ch) or ch.isspace())]


def normalize_unicode(text: str) -> str:
    """Steps 1-4 above: language independent."""
    return normalize_unicode_aligned(Aligned.of(text)).text


def expand_abbreviations(text: str, language: str) -> str:
    """Step 5 above; only English has a table."""
    return expand_abbreviations_aligned(Aligned.of(text), language).text


def expand_abbreviations_aligned(text: Aligned, language: str) -> Aligned:
    if not language.lower().startswith("en"):
        return text
    return text.sub(_EN_ABBREV_RE, lambda m: _EN_ABBREVIATIONS[m.group(1)])


def normalize(text: str, language: str = "en") -> str:
    """Full normalisation for a voice whose espeak-ng language is `language`."""
    return expand_abbreviations(normalize_unicode(text), language)
