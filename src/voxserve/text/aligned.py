"""A text rewritten in passes that remembers, for each of its characters, what it says.

Word timestamps name the request's own tokens ("$5", not "five dollars"): every pass of the
normalisers runs on an `Aligned` text, whose characters each carry the span [lo, hi) of the
source text they were made from. A character kept keeps its own; a rewrite's characters take
the span of what they replace, or, where the handler says which part of its match each piece
of its output comes from (`Pieces`), the span of that part: "Dec. 1, 2026" -> "December" from
"Dec.", " first" from "1", ", twenty twenty-six" from "2026".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# What a piece of a rewrite says: a group of the match (number or name), an absolute span of
# the text rewritten, or None (the whole match).
Source = int | str | tuple[int, int] | None
Pieces = list[tuple[str, Source]]
Said = str | Pieces


@dataclass(frozen=True)
class Aligned:
    text: str
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    """Per character of `text`: the source span [lo, hi) it says."""

    @classmethod
    def of(cls, text: str) -> Aligned:
        return cls(text, tuple(range(len(text))), tuple(range(1, len(text) + 1)))

    def span(self, a: int, b: int) -> tuple[int, int]:
        """The source span of text[a:b] (an empty range: an empty span where it stands)."""
        if a < b:
            return min(self.lo[a:b]), max(self.hi[a:b])
        p = self.lo[a] if a < len(self.text) else (self.hi[-1] if self.text else 0)
        return p, p

    def sub(self, pattern: re.Pattern, handler: Callable[[re.Match], Said] | str) -> Aligned:
        """`pattern.sub(handler, text)` (the same matches, the same output; a str handler is
        literal text, no group references), the spans carried along."""
        text = self.text
        parts: list[str] = []
        lo: list[int] = []
        hi: list[int] = []
        pos = 0
        for m in pattern.finditer(text):
            said = handler if isinstance(handler, str) else handler(m)
            pieces: Pieces = [(said, None)] if isinstance(said, str) else said
            if "".join(p for p, _ in pieces) == m.group(0):
                continue  # unchanged: its characters keep their spans
            a, b = m.span()
            parts.append(text[pos:a])
            lo += self.lo[pos:a]
            hi += self.hi[pos:a]
            for piece, src in pieces:
                ga, gb = (a, b) if src is None else src if isinstance(src, tuple) else m.span(src)
                if ga < 0:  # a group that did not take part: the whole match
                    ga, gb = a, b
                parts.append(piece)
                if piece == text[ga:gb]:  # said as written ("Chapter" of "Chapter IV")
                    lo += self.lo[ga:gb]
                    hi += self.hi[ga:gb]
                else:
                    s, e = self.span(ga, gb)
                    lo += [s] * len(piece)
                    hi += [e] * len(piece)
            pos = b
        if not parts:
            return self
        parts.append(text[pos:])
        lo += self.lo[pos:]
        hi += self.hi[pos:]
        return Aligned("".join(parts), tuple(lo), tuple(hi))

    def keep(self, pred: Callable[[str], bool]) -> Aligned:
        """Only the characters for which `pred` is true."""
        idx = [i for i, ch in enumerate(self.text) if pred(ch)]
        if len(idx) == len(self.text):
            return self
        return Aligned("".join(self.text[i] for i in idx), tuple(self.lo[i] for i in idx),
                       tuple(self.hi[i] for i in idx))

    def strip(self, chars: str | None = None) -> Aligned:
        t = self.text
        a = len(t) - len(t.lstrip(chars))
        b = len(t.rstrip(chars))
        if a == 0 and b == len(t):
            return self
        b = max(a, b)
        return Aligned(t[a:b], self.lo[a:b], self.hi[a:b])

    @staticmethod
    def join(sep: str, parts: Sequence[Aligned], sources: Sequence[str]) -> Aligned:
        """The parts joined by `sep`, their spans moved into `sep.join(sources)` (each part is
        said from its source); `sep` says itself."""
        text: list[str] = []
        lo: list[int] = []
        hi: list[int] = []
        base = 0
        for k, (p, s) in enumerate(zip(parts, sources)):
            if k:
                text.append(sep)
                lo += range(base - len(sep), base)
                hi += range(base - len(sep) + 1, base + 1)
            text.append(p.text)
            lo += [x + base for x in p.lo]
            hi += [x + base for x in p.hi]
            base += len(s) + len(sep)
        return Aligned("".join(text), tuple(lo), tuple(hi))
