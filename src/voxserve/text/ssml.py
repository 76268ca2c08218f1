"""SSML input: a `<speak>` document -> spans of text and breaks for the front end.

Elements (their SSML 1.1 meaning, as far as a Piper voice can follow it):

* `<speak>`: the root (required).
* `<p>`, `<s>`: sentence boundaries around their content.
* `<break time="500ms|2s" strength="none|x-weak|weak|medium|strong|x-strong">`: silence
  (`time` wins; neither: medium). At most `MAX_BREAK_SECONDS` each.
* `<sub alias="...">`: the alias is said instead of the content.
* `<say-as interpret-as="characters|spell-out|cardinal|number|ordinal|date|telephone">`: the
  content read as letters, a number, an ordinal, a date (`format` "mdy", "dmy" or "ymd"; ISO
  dates are read as such) or a phone number, with `text.spoken`'s words.
* `<phoneme ph="..." alphabet="...">`: the phonemes instead of the content, in the voice's
  phoneme set (espeak-ng IPA for Piper voices; the alphabet attribute is accepted, not
  converted), as an inline `[[ ph ]]`.
* `<prosody rate="x-slow|slow|medium|fast|x-fast|default|N%">`: the speaking rate of its
  content (a multiplier of the voice's; nested ones multiply); its content is a span of its own.
* Any other element (`<emphasis>`, `<voice>`, `<mark>`, ...): its text is kept, the tag ignored.

The parser is expat with everything that expands refused: a document type declaration (so no
entity can be declared: no "billion laughs", no external entity), entity references other than
XML's five, processing of external parameter entities. Size and nesting depth are bounded.
Every refusal is an InvalidInputError naming the line and column.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from xml.parsers import expat

from ..errors import InvalidInputError, InvalidOptionError
from .spoken import MONTHS, cardinal, digits, ordinal, year

MAX_SSML_CHARS = 1_000_000
MAX_DEPTH = 32
MAX_BREAK_SECONDS = 10.0
MAX_PHONEME_CHARS = 400
RATE_RANGE = (0.25, 4.0)
"""Bounds of the product of the nested `<prosody rate>`s around a text (the `speed` option's)."""

BREAK_STRENGTH = {"none": 0.0, "x-weak": 0.1, "weak": 0.25, "medium": 0.5, "strong": 0.75, "x-strong": 1.0}
RATE_WORDS = {"x-slow": 0.6, "slow": 0.8, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.5}
_TIME = re.compile(r"\s*(\d{1,6}(?:\.\d{1,6})?)\s*(ms|s)\s*")
_PERCENT = re.compile(r"\s*\+?(\d{1,4}(?:\.\d{1,4})?)\s*%\s*")


@dataclass(frozen=True)
class Span:
    """Text said as sentences of its own (with inline `[[ ]]` for `<phoneme>`), at `rate`."""

    text: str
    rate: float = 1.0


@dataclass(frozen=True)
class Break:
    seconds: float


INPUT_FORMATS = ("text", "ssml")
_SPEAK_START = re.compile(r"\s*(?:<\?xml[^>]{0,200}\?>\s*)?<speak[\s>/]")


def looks_like_ssml(text: str) -> bool:
    """The auto rule of `input_format`: the input starts with a `<speak>` element (after blank
    space and an XML declaration)."""
    return _SPEAK_START.match(text) is not None


def input_format(text: str, value: str | None) -> str:
    """The `input_format` option's value for `text`: "text" or "ssml" (None: auto)."""
    if value is None:
        return "ssml" if looks_like_ssml(text) else "text"
    if value not in INPUT_FORMATS:
        raise InvalidOptionError("input_format", f"must be one of {', '.join(INPUT_FORMATS)}, got {value!r}")
    return value


class _Refused(Exception):
    pass


def parse_ssml(text: str) -> list[Span | Break]:
    """A `<speak>` document -> its spans and breaks, in order (empty spans left out)."""
    if len(text) > MAX_SSML_CHARS:
        raise InvalidInputError(f"SSML input has {len(text)} characters; at most {MAX_SSML_CHARS}")
    return _Parser().run(text)


class _Parser:
    def __init__(self):
        p = expat.ParserCreate()
        p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        p.StartDoctypeDeclHandler = self._doctype
        p.EntityDeclHandler = self._entity
        p.ExternalEntityRefHandler = self._external
        p.StartElementHandler = self._start
        p.EndElementHandler = self._end
        p.CharacterDataHandler = self._chars
        self.p = p
        self.items: list[Span | Break] = []
        self.buf: list[str] = []
        self.stack: list[_Open] = []
        self.rate = 1.0

    def run(self, text: str) -> list[Span | Break]:
        try:
            self.p.Parse(text, True)
        except _Refused as e:
            raise InvalidInputError(f"SSML refused at line {self.p.CurrentLineNumber}, column "
                                    f"{self.p.CurrentColumnNumber + 1}: {e}") from None
        except expat.ExpatError as e:
            raise InvalidInputError(f"malformed SSML at line {e.lineno}, column {e.offset + 1}: "
                                    f"{expat.ErrorString(e.code)}") from None
        self._flush()
        return self.items

    # ------------------------------------------------------------------ refusals
    def _doctype(self, *_):
        raise _Refused("a document type declaration (DOCTYPE) is not allowed")

    def _entity(self, *_):
        raise _Refused("entity declarations are not allowed")

    def _external(self, *_):
        raise _Refused("external entities are not allowed")

    # ------------------------------------------------------------------ content
    def _flush(self):
        t = "".join(self.buf).strip()
        self.buf.clear()
        if t:
            self.items.append(Span(t, self.rate))

    def _said(self) -> bool:
        return all(e.said for e in self.stack)

    def _chars(self, data: str):
        if self._said():
            self.buf.append(data)

    def _start(self, name: str, attrs: dict):
        tag = name.rpartition(":")[2]
        if len(self.stack) >= MAX_DEPTH:
            raise _Refused(f"elements nested deeper than {MAX_DEPTH}")
        if not self.stack and tag != "speak":
            raise _Refused(f"the root element must be <speak>, not <{name}>")
        said = self._said()
        entry = _Open(tag, self.rate, True)
        if tag in ("p", "s"):
            self._flush()
        elif tag == "break":
            self._flush()
            if said:
                self.items.append(Break(_break_seconds(attrs)))
            entry.said = False
        elif tag == "sub":
            if "alias" not in attrs:
                raise _Refused("<sub> needs an alias attribute")
            if said:
                self.buf.append(attrs["alias"])
            entry.said = False
        elif tag == "phoneme":
            if "ph" not in attrs:
                raise _Refused("<phoneme> needs a ph attribute")
            ph = attrs["ph"].strip()
            if len(ph) > MAX_PHONEME_CHARS or "]]" in ph or "[[" in ph or any(c in ph for c in "\r\n"):
                raise _Refused(f"<phoneme ph> must be one line of at most {MAX_PHONEME_CHARS} characters, without [[ or ]]")
            if said and ph:
                self.buf.append(f"[[ {ph} ]]")
            entry.said = False
        elif tag == "say-as":
            entry.say_as = (len(self.buf), attrs)
        elif tag == "prosody" and "rate" in attrs:
            rate = self.rate * _rate(attrs["rate"])
            if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
                raise _Refused(f"prosody rates come to {rate:g}, outside {RATE_RANGE[0]:g}..{RATE_RANGE[1]:g}")
            if rate != self.rate:
                self._flush()  # a rate is per span: the text before it is a span of its own
                self.rate = rate
        self.stack.append(entry)

    def _end(self, name: str):
        entry = self.stack.pop()
        if entry.tag in ("p", "s"):
            self._flush()
        elif entry.say_as is not None:
            start, attrs = entry.say_as
            content = "".join(self.buf[start:])
            del self.buf[start:]
            self.buf.append(say_as(content, attrs.get("interpret-as", ""), attrs.get("format")))
        if entry.rate != self.rate:  # the end of a <prosody rate>
            self._flush()
            self.rate = entry.rate


@dataclass
class _Open:
    """An element being parsed."""

    tag: str
    rate: float
    """The rate outside it (restored at its end)."""
    said: bool
    """Its content is said (not for a <sub>'s or <phoneme>'s, which are replaced)."""
    say_as: tuple[int, dict] | None = None


def _break_seconds(attrs: dict) -> float:
    if "time" in attrs:
        m = _TIME.fullmatch(attrs["time"])
        if not m:
            raise _Refused(f"<break time> must be like 500ms or 2s, got {attrs['time']!r}")
        s = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
        if s > MAX_BREAK_SECONDS:
            raise _Refused(f"<break time> is at most {MAX_BREAK_SECONDS:g}s, got {attrs['time']!r}")
        return s
    strength = attrs.get("strength", "medium")
    if strength not in BREAK_STRENGTH:
        raise _Refused(f"<break strength> is one of {', '.join(BREAK_STRENGTH)}, got {strength!r}")
    return BREAK_STRENGTH[strength]


def _rate(value: str) -> float:
    if value.strip() in RATE_WORDS:
        return RATE_WORDS[value.strip()]
    m = _PERCENT.fullmatch(value)
    if not m:
        raise _Refused(f"<prosody rate> is x-slow..x-fast or a percentage, got {value!r}")
    return float(m.group(1)) / 100.0


# ---------------------------------------------------------------------- say-as

_INT = re.compile(r"\s*([+-]?)(\d{1,3}(?:,\d{3}){0,4}|\d{1,15})\s*")
_ORD = re.compile(r"\s*(\d{1,15})\s*(?:st|nd|rd|th)?\s*", re.I)
_ISO = re.compile(r"\s*(\d{4})-(\d{1,2})-(\d{1,2})\s*")
_DATE = re.compile(r"\s*(\d{1,4})[/.-](\d{1,2})(?:[/.-](\d{1,4}))?\s*")


def say_as(text: str, interpret_as: str, fmt: str | None = None) -> str:
    """The words for `<say-as>`'s content; content it cannot read that way is kept as written
    (the normaliser then reads it as it would anyway)."""
    kind = interpret_as.strip().lower()
    if kind in ("characters", "spell-out"):
        return spell(text)
    if kind in ("cardinal", "number"):
        m = _INT.fullmatch(text)
        if m:
            n = int(m.group(2).replace(",", ""))
            return cardinal(-n if m.group(1) == "-" else n)
    elif kind == "ordinal":
        m = _ORD.fullmatch(text)
        if m:
            return ordinal(int(m.group(1)))
    elif kind == "date":
        words = _date(text, (fmt or "").strip().lower())
        if words:
            return words
    elif kind == "telephone":
        return telephone(text)
    return text


def spell(text: str) -> str:
    """Letter by letter, digits as words: "IBM" -> "I-B-M" (joined by hyphens, espeak-ng names
    each letter; alone, "A" would be the article)."""
    out = []
    for ch in text:
        if ch.isdigit() and ch.isascii():
            out.append(digits(ch))
        elif ch.isalpha():
            out.append(ch.upper())
    return "-".join(out)


def telephone(text: str) -> str:
    """Digit by digit, a pause between groups: "+1 555-0100" -> "plus one, five five five, ..."."""
    groups = re.findall(r"\d+", text)
    words = ", ".join(digits(g) for g in groups)
    return ("plus " + words) if text.strip().startswith("+") and words else (words or text)


def _date(text: str, fmt: str) -> str | None:
    m = _ISO.fullmatch(text)
    if m:
        y, mo, d = m.groups()
    else:
        m = _DATE.fullmatch(text)
        if not m:
            return None
        a, b, c = m.groups()
        order = fmt if fmt in ("mdy", "dmy", "ymd", "md", "dm") else "mdy"
        parts = dict(zip(order, (a, b, c)))
        y, mo, d = parts.get("y"), parts.get("m"), parts.get("d")
        if mo is None or d is None:
            return None
    month, day = int(mo), int(d)
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    out = f"{MONTHS[month - 1]} {ordinal(day)}"
    return out + (f", {year(int(y))}" if y else "")
