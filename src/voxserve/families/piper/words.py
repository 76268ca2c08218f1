"""Word timestamps of a Piper sentence from the model's own durations.

A sentence's ids are Piper's interleaving, BOS PAD (phoneme PAD)*  EOS, and espeak-ng's
phonemes separate its words with " ". A word is a run of speech phonemes (IPA letters, stress
and length marks) between separators; punctuation phonemes, separators and BOS/EOS belong to
no word. Each phoneme owns its ids and the PAD after them. espeak's words are matched to the
sentence text's words (whitespace tokens with a letter or digit, outer punctuation stripped):
one to one when they are as many, else by a monotonic alignment on their lengths, since
espeak joins some words ("of the" is one) and splits others ("5pm"). A phoneme word spoken for
several text words is shared between them by their lengths, at id boundaries.

Normalisation rewrites the text before it is split and phonemised ("$5" -> "five dollars").
`SourceWords` maps the spoken words back to the request's own tokens: the normalisers run on a
`text.aligned.Aligned` text, whose characters each know the span of the request they say, so
each spoken word knows its token(s) ("five", "dollars" -> "$5"; "December" -> "Dec.",
"first" -> "1,"). A token is reported once, with the span from its first spoken word's start
to its last one's end; words that say several tokens ("et al." -> "and others") report them
as one word ("et al"); spoken words that say no token ("&" -> "and") are left out.
"""

from __future__ import annotations

import bisect
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...audio import Word
from ...text.aligned import Aligned
from ...text.ids import BOS, PAD
from ...text.normalize import visible

_TOKEN = re.compile(r"\S+")
# punctuation at either end of a token is not part of the word ("(quietly)," -> "quietly")
_STRIP = re.compile(r"^[^\w]+|[^\w]+$")
_LEAD = re.compile(r"[^\w]*")


@dataclass(frozen=True)
class WordSpan:
    """A word of the text and the ids [lo, hi) of the sentence that say it."""

    word: str
    lo: int
    hi: int
    n: int = 1
    """Text words it stands for (several only when espeak gave too few phonemes to share)."""


def _is_speech(ph: str) -> bool:
    return bool(ph) and unicodedata.category(ph[0])[0] in "LM"


def text_words(text: str) -> list[str]:
    out = []
    for tok in _TOKEN.findall(text):
        w = _STRIP.sub("", tok)
        if any(ch.isalnum() for ch in w):
            out.append(w)
    return out


def phoneme_words(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> list[list[tuple[int, int]]]:
    """espeak's words as lists of (first id, end id) of their speech phonemes (with the PAD
    after each), in the id layout of `text.ids.PhonemeIdMapper` (dropped phonemes skipped)."""
    pos = len(id_map[BOS]) + len(id_map[PAD])
    pad = len(id_map[PAD])
    words: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    for ph in phonemes:
        n = len(id_map.get(ph, ()))
        if not n:  # no id: the mapper drops it
            if ph == " " and cur:
                words.append(cur)
                cur = []
            continue
        if ph == " ":
            if cur:
                words.append(cur)
                cur = []
        elif _is_speech(ph):
            cur.append((pos, pos + n + pad))
        pos += n + pad
    if cur:
        words.append(cur)
    return words


def _size(word: str) -> float:
    """Rough phonemes of a text word: a letter ~ one, a digit ~ three (it becomes a word)."""
    return sum(3.0 if ch.isdigit() else 1.0 for ch in word if ch.isalnum()) or 1.0


def _align(ph_sizes: Sequence[int], txt_sizes: Sequence[float]) -> list[tuple[int, int, int, int]]:
    """Monotonic alignment of phoneme words to text words: groups (i0, i1, j0, j1) of
    ph[i0:i1] saying txt[j0:j1], each 1-1, 1-n or n-1 (n <= 3), covering both sequences."""
    n, m = len(ph_sizes), len(txt_sizes)
    scale = sum(ph_sizes) / max(sum(txt_sizes), 1e-9)
    moves = [(1, 1), (1, 2), (2, 1), (1, 3), (3, 1)]
    inf = math.inf
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            c0 = cost[i][j]
            if c0 == inf:
                continue
            for a, b in moves:
                if i + a > n or j + b > m:
                    continue
                p = sum(ph_sizes[i:i + a])
                t = sum(txt_sizes[j:j + b]) * scale
                c = c0 + abs(math.log((p + 1) / (t + 1))) + (0.0 if a == b == 1 else 0.7 * (a + b - 2))
                if c < cost[i + a][j + b]:
                    cost[i + a][j + b] = c
                    back[i + a][j + b] = (a, b)
    if cost[n][m] == inf:  # counts too far apart for the moves: one group for everything
        return [(0, n, 0, m)]
    groups = []
    i, j = n, m
    while i or j:
        a, b = back[i][j]  # type: ignore[misc]
        groups.append((i - a, i, j - b, j))
        i, j = i - a, j - b
    return groups[::-1]


def word_spans(text: str, phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> tuple[WordSpan, ...]:
    """The words of one sentence (its text and espeak phonemes) with their id spans."""
    words = text_words(text)
    ph = phoneme_words(phonemes, id_map)
    if not words or not ph:
        return ()
    if len(words) == len(ph):
        groups = [(k, k + 1, k, k + 1) for k in range(len(ph))]
    else:
        groups = _align([len(p) for p in ph], [_size(w) for w in words])
    out: list[WordSpan] = []
    for i0, i1, j0, j1 in groups:
        phones = [span for p in ph[i0:i1] for span in p]  # (first id, end id) of each phoneme
        n_words = j1 - j0
        if n_words == 1:
            out.append(WordSpan(words[j0], phones[0][0], phones[-1][1]))
        elif len(phones) < n_words:  # too few phonemes to share: the words as one span
            out.append(WordSpan(" ".join(words[j0:j1]), phones[0][0], phones[-1][1], n_words))
        else:  # one phoneme word for several text words: its phonemes shared by their sizes
            sizes = [_size(w) for w in words[j0:j1]]
            total, acc, start = sum(sizes), 0.0, 0
            for k, w in enumerate(words[j0:j1]):
                acc += sizes[k]
                left = n_words - 1 - k  # words after this one, each needing a phoneme
                end = len(phones) if not left else max(start + 1, min(len(phones) - left,
                                                                      round(acc / total * len(phones))))
                out.append(WordSpan(w, phones[start][0], phones[end - 1][1]))
                start = end
    return tuple(out)


def word_times(spans: Sequence[WordSpan], durations: np.ndarray, frame_s: float) -> tuple[Word, ...]:
    """Spans timed by the ids' durations (frames) -> Words in seconds from the sentence start."""
    if not spans:
        return ()
    ends = np.concatenate([[0], np.cumsum(np.asarray(durations, dtype=np.int64))])
    n = len(durations)
    return tuple(Word(s.word, float(ends[min(s.lo, n)]) * frame_s, float(ends[min(s.hi, n)]) * frame_s)
                 for s in spans if ends[min(s.hi, n)] > ends[min(s.lo, n)])


# a token's outer punctuation (quotes, brackets, clause and sentence marks) is not the word;
# "$5", "10%" and "U.S." keep theirs
_OUTER = "\"'()[]{}<>«»“”‘’„,;:!?…"


_ABBREVIATION = re.compile(r"^(?:\w\.){2,}$")  # "U.S.A.", "p.m." keep their periods


def source_token(tok: str) -> str:
    w = tok.strip(_OUTER)
    return w if _ABBREVIATION.match(w) else w.rstrip(".")


class SourceWords:
    """The request's tokens against the words spoken (see the module doc), consumed sentence
    by sentence in order by `respan`."""

    def __init__(self, original: str, spoken: Aligned):
        """original: the request's text; spoken: its normalised form, each character carrying
        the span of `original` it says (`text.aligned`)."""
        # the tokens of the text as a reader sees it (an escape sequence is no part of one)
        seen = visible(original)
        shown = "".join(original[i] for i in seen)
        toks = [(seen[m.start()], seen[m.end() - 1] + 1, source_token(m.group())) for m in _TOKEN.finditer(shown)]
        toks = [t for t in toks if any(ch.isalnum() for ch in t[2])]
        starts = [t[0] for t in toks]
        ends = [t[1] for t in toks]
        self.said: list[str] = []
        # clusters of spoken words and source tokens that say each other, in order: a token
        # said by several words, or words saying several tokens ("et al." -> "and others"),
        # make one; so do tokens whose words cross (never in the rules' own output)
        stack: list[list[int]] = []  # [first token, last token, first spoken word, end spoken word]
        word_tokens: list[tuple[int, int] | None] = []
        for m in _TOKEN.finditer(spoken.text):
            lead = _LEAD.match(m.group()).end()
            w = _STRIP.sub("", m.group())
            if not any(ch.isalnum() for ch in w):
                continue
            j = len(self.said)
            self.said.append(w)
            lo, hi = spoken.span(m.start() + lead, m.start() + lead + len(w))
            t0, t1 = bisect.bisect_right(ends, lo), bisect.bisect_left(starts, hi) - 1
            if t0 > t1:  # says no word of the text ("&" -> "and"): no caption word
                word_tokens.append(None)
                continue
            word_tokens.append((t0, t1))
            cur = [t0, t1, j, j + 1]
            while stack and cur[0] <= stack[-1][1]:
                top = stack.pop()
                cur = [min(top[0], cur[0]), max(top[1], cur[1]), top[2], cur[3]]
            stack.append(cur)
        # cluster[j]: (name, index) of spoken word j's cluster
        self.cluster: list[tuple[str, int] | None] = [None] * len(self.said)
        for k, (t0, t1, j0, j1) in enumerate(stack):
            name = " ".join(toks[t][2] for t in range(t0, t1 + 1))
            for j in range(j0, j1):
                if word_tokens[j] is not None:
                    self.cluster[j] = (name, k)
        self.pos = 0
        self.named: set[int] = set()  # clusters already reported

    def respan(self, sentence: str, spans: Sequence[WordSpan]) -> tuple[WordSpan, ...]:
        """One sentence's spans (one per spoken word, in order) as the source's words: each
        token once, over its spoken words; spoken words that say no token are left out."""
        words = text_words(sentence)
        n = len(words)
        if [w.lower() for w in self.said[self.pos:self.pos + n]] != [w.lower() for w in words] \
                or sum(s.n for s in spans) != n:
            return tuple(spans)  # not where expected (a word cut in two): as spoken
        base, self.pos = self.pos, self.pos + n
        out: list[WordSpan] = []
        names: list[list[tuple[str, int]]] = []  # the clusters of each word of `out`
        k = base
        for sp in spans:
            mine = []
            for c in self.cluster[k:k + sp.n]:
                if c is not None and c[1] not in self.named and c not in mine:
                    mine.append(c)
            k += sp.n
            if not mine:
                continue
            if names and any(c in names[-1] for c in mine):  # the same token, its next spoken word
                names[-1] += [c for c in mine if c not in names[-1]]
                out[-1] = WordSpan(" ".join(c[0] for c in names[-1]), out[-1].lo, sp.hi)
            else:
                names.append(mine)
                out.append(WordSpan(" ".join(c[0] for c in mine), sp.lo, sp.hi))
        # a token said across two sentences is named in the first ("each word once")
        self.named.update(c[1] for group in names for c in group)
        return tuple(out)
