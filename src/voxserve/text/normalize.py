"""Unicode and typographic normalisation, before sentence splitting and phonemisation.

What it does, in order:
1. NFC composition (so "e" + combining acute and "é" are the same input).
2. Typographic punctuation to the ASCII forms espeak-ng was trained on: curly quotes,
   primes, guillemets -> ASCII quotes; a dash used as punctuation (em/en dash, or a spaced
   hyphen) -> a comma pause; the ellipsis character -> "...".
3. Characters with nothing to say are dropped: emoji and pictographs (with their variation
   selectors, joiners and skin-tone modifiers), control and private-use characters. espeak-ng
   would otherwise read "🎉" as "party popper".
4. Whitespace: runs of spaces/tabs (and single line breaks) become one space; a blank line
   (paragraph break) is kept as "\n\n", which the splitter treats as a sentence boundary.
5. For English voices only, a few abbreviations that espeak-ng would end a sentence on
   ("Dr. Smith" -> "Doctor. Smith") are expanded ("Doctor Smith").
"""

from __future__ import annotations

import re
import unicodedata

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


_SPACES = re.compile(r"[ \t\r\f\v]+")
_PARAGRAPH = re.compile(r"\s*\n\s*\n\s*")
_LINEBREAK = re.compile(r" ?\n ?")

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


def normalize_unicode(text: str) -> str:
    """Steps 1-4 above: language independent."""
    text = unicodedata.normalize("NFC", text)
    text = _EN_DASH_RANGE.sub("-", text)
    text = _DASH_PAUSE.sub(", ", text)
    text = text.translate(_TRANSLATE)
    text = "".join(ch for ch in text if not _is_silent(ch))
    text = _SPACES.sub(" ", text)
    text = _PARAGRAPH.sub("\n\n", text)
    text = re.sub(r"(?<!\n)\n(?!\n)", " ", text)
    text = _SPACES.sub(" ", text)
    # a pause inserted next to other punctuation or at an edge is noise
    text = re.sub(r",\s*(?=[,.!?;:])", "", text)
    text = re.sub(r"(^|\n)\s*,\s*", r"\1", text)
    text = re.sub(r"\s*,\s*($|\n)", r"\1", text)
    text = re.sub(r"([\"'(])\s*,\s*", r"\1", text)
    return text.strip(" ")


def expand_abbreviations(text: str, language: str) -> str:
    """Step 5 above; only English has a table."""
    if not language.lower().startswith("en"):
        return text
    return _EN_ABBREV_RE.sub(lambda m: _EN_ABBREVIATIONS[m.group(1)], text)


def normalize(text: str, language: str = "en") -> str:
    """Full normalisation for a voice whose espeak-ng language is `language`."""
    return expand_abbreviations(normalize_unicode(text), language)
