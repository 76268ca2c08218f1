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
_TOKEN_BEFORE = re.compile(r"(\S+)$")
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")
CONJUNCTIONS = frozenset(
    "and or but nor so yet because although though while whereas which who whom whose that "
    "where when whenever if unless until since as than then such".split()
)


def _is_boundary(text: str, m: re.Match) -> bool:
    if m.group(3):  # CJK terminators end a sentence wherever they stand
        return True
    punct = m.group(1)
    rest = text[m.end():].lstrip()
    if not rest:
        return True
    nxt = rest[0]
    if ";" in punct or "!" in punct or "?" in punct:
        return not (m.group(2) and nxt.islower())  # '"Stop!" he said' continues
    if punct != ".":  # "..." (ellipsis): continues into a lower-case word
        return not nxt.islower()
    # a single period
    if nxt.islower() or nxt in ",;:":
        return False
    before = _TOKEN_BEFORE.search(text[: m.start()])
    token = before.group(1) if before else ""
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


def _greedy_merge(pieces: list[str], limit: int, measure: Callable[[str], int]) -> list[str]:
    out: list[str] = []
    cur = ""
    for p in pieces:
        cand = f"{cur} {p}" if cur else p
        if cur and measure(cand) > limit:
            out.append(cur)
            cur = p
        else:
            cur = cand
    if cur:
        out.append(cur)
    return out


def _is_conjunction(word: str) -> bool:
    return word.lower().strip(",;:") in CONJUNCTIONS


def _split_words(text: str, limit: int, measure: Callable[[str], int]) -> list[str]:
    words = text.split()
    out: list[str] = []
    cur: list[str] = []
    for w in words:
        if measure(w) > limit:  # a single "word" too long to say in one go
            if cur:
                out.append(" ".join(cur))
                cur = []
            out.extend(_split_chars(w, limit, measure))
            continue
        if cur and measure(" ".join(cur + [w])) > limit:
            # break before the last conjunction if that keeps at least half of the chunk
            cut = max((i for i in range(1, len(cur)) if _is_conjunction(cur[i])), default=0)
            while cut > 1 and _is_conjunction(cur[cut - 1]):  # "and then": break before the first
                cut -= 1
            if cut and measure(" ".join(cur[:cut])) * 2 >= limit:
                out.append(" ".join(cur[:cut]))
                cur = cur[cut:]
                if measure(" ".join(cur + [w])) > limit:
                    out.append(" ".join(cur))
                    cur = []
            else:
                out.append(" ".join(cur))
                cur = []
        cur.append(w)
    if cur:
        out.append(" ".join(cur))
    return out


def _split_chars(word: str, limit: int, measure: Callable[[str], int]) -> list[str]:
    out: list[str] = []
    cur = ""
    for ch in word:
        if cur and measure(cur + ch) > limit:
            out.append(cur)
            cur = ""
        cur += ch
    if cur:
        out.append(cur)
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
