"""Sentence splitting, and splitting of over-long sentences.

`split_sentences` cuts at sentence punctuation (. ! ? ; ... and CJK 。！？) and at blank
lines, but not inside abbreviations ("Dr.", "e.g.", "U.K. and"), initials ("J. R. R."),
decimals and versions ("2.5", "3.11.7"), URLs or e-mail addresses (a period must be followed
by whitespace to end a sentence).

`split_long` cuts one sentence whose phoneme length exceeds a limit: first at clause
punctuation (, : and the pauses dashes became), then at word boundaries, preferring to break
before a conjunction, and as a last resort inside a word, so no piece exceeds the limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# Lower-cased tokens (without their final period) after which "." does not end a sentence.
ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx dept est fig gen gov hon
    inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec no nos vol vols pp ch sec
    a.m p.m u.s u.k e.u u.n capt sgt col lt cmdr rev ave blvd rd""".split()
)
# Abbreviations that often end a sentence: a capital after them starts a new one.
_SENTENCE_FINAL_ABBREVIATIONS = frozenset("etc a.m p.m inc ltd co corp al u.s u.k e.u u.n".split())

_CJK_END = "。！？"
_CLOSERS = "\"')]}»”’"
# a run of terminators, then optional closing quotes/brackets
_BOUNDARY = re.compile(r"([.!?;]+|\.\.\.)([" + re.escape(_CLOSERS) + r"]*)(?=\s|$)|([" + _CJK_END + r"]+[" + re.escape(_CLOSERS) + r"]*)")
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")
CONJUNCTIONS = frozenset(
    "and or but nor so yet because although though while whereas which who whom whose that "
    "where when whenever if unless until since as than then such".split()
)


_NEXT = re.compile(r"\s*(\S?)")


def _token_before(text: str, end: int) -> str:
    """The non-space run that ends at `end` (scanned back from it: a regex searched over
    text[:end] at every candidate period made splitting quadratic in a long text)."""
    start = end
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    return text[start:end]


def _is_boundary(text: str, m: re.Match) -> bool:
    if m.group(3):  # CJK terminators end a sentence wherever they stand
        return True
    punct = m.group(1)
    nxt = _NEXT.match(text, m.end()).group(1)  # the next non-space character (not a copy of the rest)
    if not nxt:
        return True
    if ";" in punct or "!" in punct or "?" in punct:
        return not (m.group(2) and nxt.islower())  # '"Stop!" he said' continues
    if punct != ".":  # "..." (ellipsis): continues into a lower-case word
        return not nxt.islower()
    # a single period
    if nxt.islower() or nxt in ",;:":
        return False
    token = _token_before(text, m.start())
    bare = token.lstrip("\"'([{").lower()
    if bare in ABBREVIATIONS:
        return bare in _SENTENCE_FINAL_ABBREVIATIONS and nxt.isupper()
    if _INITIALS.match(token.lstrip("\"'([{")):
        # "J. Smith": one letter is an initial; "U.S.A. Then": dotted initials end a sentence
        return len(token.lstrip("\"'([{")) > 1 and nxt.isupper()
    return True


def split_sentences(text: str) -> list[str]:
    """Normalised text -> sentences, each stripped, none empty, punctuation kept."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        start = 0
        for m in _BOUNDARY.finditer(para):
            if _is_boundary(para, m):
                piece = para[start : m.end()].strip()
                if piece:
                    out.append(piece)
                start = m.end()
        tail = para[start:].strip()
        if tail:
            out.append(tail)
    return out


_CLAUSE = re.compile(r"(?<=[,:])\s+|(?<=\))\s+|\s+(?=\()")


def _longest(n: int, start: int, fits: Callable[[int, int], bool]) -> int:
    """The end of the longest span [start, end) of n items that `fits`, taking the first item
    whatever it measures: the greedy cut, found by doubling then halving the span, so that a
    piece costs O(log) measures rather than one per item (a measure is linear in its span, so
    one per item was quadratic: 14 s of espeak-ng for "[[ ]] " x 680). Measures grow with the
    span (more words, more phonemes), so this is the first span that does not fit, less one."""
    lo, step = start + 1, 1
    while lo < n and fits(start, min(lo + step, n)):
        lo, step = min(lo + step, n), step * 2
    hi = min(lo + step, n + 1)  # does not fit (or is past the end)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(start, mid):
            lo = mid
        else:
            hi = mid
    return lo


def _greedy_merge(pieces: list[str], limit: int, measure: Callable[[str], int]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(pieces):
        end = _longest(len(pieces), i, lambda a, b: measure(" ".join(pieces[a:b])) <= limit)
        out.append(" ".join(pieces[i:end]))
        i = end
    return out


def _is_conjunction(word: str) -> bool:
    return word.lower().strip(",;:") in CONJUNCTIONS


def _split_words(text: str, limit: int, measure: Callable[[str], int]) -> list[str]:
    """Greedy runs of words within `limit`; a run that meets its limit breaks before its last
    conjunction if that keeps at least half of it; a word over the limit alone, in pieces."""
    words = text.split()
    out: list[str] = []

    def fits(a: int, b: int) -> bool:
        return measure(" ".join(words[a:b])) <= limit

    stop = [len(words)] * (len(words) + 1)  # stop[i]: the first word at or after i over the limit
    for j in range(len(words) - 1, -1, -1):
        stop[j] = j if measure(words[j]) > limit else stop[j + 1]
    i = 0
    while i < len(words):
        if stop[i] == i:  # a single "word" too long to say in one go
            out.extend(_split_chars(words[i], limit, measure))
            i += 1
            continue
        t = stop[i]
        end = _longest(t, i, fits)
        if end == t:
            out.append(" ".join(words[i:end]))
            i = end
            continue
        # words[end] does not fit: break before the last conjunction ("and then": the first)
        cur = words[i:end]
        cut = max((k for k in range(1, len(cur)) if _is_conjunction(cur[k])), default=0)
        while cut > 1 and _is_conjunction(cur[cut - 1]):
            cut -= 1
        if cut and measure(" ".join(cur[:cut])) * 2 >= limit:
            out.append(" ".join(cur[:cut]))
            if fits(i + cut, end + 1):
                i += cut  # the rest grows on from the conjunction
                continue
            out.append(" ".join(words[i + cut:end]))
        else:
            out.append(" ".join(cur))
        i = end
    return out


def _split_chars(word: str, limit: int, measure: Callable[[str], int]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(word):
        end = _longest(len(word), i, lambda a, b: measure(word[a:b]) <= limit)
        out.append(word[i:end])
        i = end
    return out


def split_long(sentence: str, limit: int, measure: Callable[[str], int]) -> list[str]:
    """Cut `sentence` so that measure(piece) <= limit for every piece (limit >= 1).

    `measure` gives a piece's length in the unit of the limit (phonemes, for the front end).
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if measure(sentence) <= limit:
        return [sentence]
    clauses = [c for c in _CLAUSE.split(sentence) if c.strip()]
    out: list[str] = []
    for piece in _greedy_merge(clauses, limit, measure):
        if measure(piece) <= limit:
            out.append(piece)
        else:
            out.extend(_split_words(piece, limit, measure))
    return out


# ----------------------------------------------------------------------------- text that streams in
SPLIT_ON_LOOP_CHARS = 512
"""A streamed request's held text longer than this is re-split on a worker thread (`heavy`)."""

# What can end a sentence or paragraph for `split_sentences`: terminators, CJK terminators, the
# closing quotes after them, and newlines (blank lines). Text without them ends nothing.
_MAY_END = re.compile(r"[.!?;\n" + _CJK_END + re.escape(_CLOSERS) + "]")


class SentenceBuffer:
    """Text as it streams in -> the sentences known to be complete. A sentence is complete once
    text follows it that `split_sentences` does not join to it, so the last piece is held back
    (more text could still continue it) until `finish`.

    Incremental: the held piece is re-split only when the new text could end a sentence (it
    holds one of `_MAY_END`, or the held piece ends in one and the new text is the first that
    follows it); any other chunk costs its own length, whatever the held text's (a stream of
    tiny or empty chunks after 4 KB without a sentence end re-split 4 KB per event)."""

    def __init__(self):
        self.text = ""
        self._open_end = False  # the held text ends in a terminator (or newline) not yet decided

    def feed(self, text: str) -> list[str]:
        return self.split() if self.add(text) else []

    def add(self, text: str) -> bool:
        """Hold `text`; True if a sentence may have ended (then `split`). O(len(text))."""
        self.text += text
        if not text.strip():  # whitespace ends nothing: a sentence ends only once text follows
            self._open_end = self._open_end or "\n" in text
            return False
        may_end = self._open_end or _MAY_END.search(text) is not None
        body = text.rstrip()
        self._open_end = _MAY_END.search(text, len(body) - 1) is not None  # its last mark, and after
        return may_end

    @property
    def heavy(self) -> bool:
        """Whether the next re-split is worth a worker thread (not the shared event loop)."""
        return len(self.text) > SPLIT_ON_LOOP_CHARS

    def split(self) -> list[str]:
        """The sentences completed in the held text (which keeps the last piece)."""
        parts = split_sentences(self.text)
        if len(parts) < 2:
            return []
        # the last piece is the buffer's tail (less trailing whitespace): keep it from its start
        self.text = self.text[self.text.rfind(parts[-1]):]
        return parts[:-1]

    def finish(self) -> list[str]:
        parts, self.text, self._open_end = split_sentences(self.text), "", False
        return parts
