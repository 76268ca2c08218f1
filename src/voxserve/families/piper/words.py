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
`SourceWords` maps the spoken words back to the request's own tokens: the two token streams are
walked together, equal tokens paired, and a run that differs ("$5" | "five dollars") paired as a
group re-anchored on the next two equal tokens within a bounded window; the user's token is then
reported with the span from its first spoken word's start to its last one's end. Where no
anchor is found, the spoken words are reported.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...audio import Word
from ...text.ids import BOS, PAD

_TOKEN = re.compile(r"\S+")
# punctuation at either end of a token is not part of the word ("(quietly)," -> "quietly")
_STRIP = re.compile(r"^[^\w]+|[^\w]+$")


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


def _key(w: str) -> str:
    return _STRIP.sub("", w).lower()


class SourceWords:
    """The request's tokens against the words spoken (see the module doc), consumed sentence
    by sentence in order by `respan`."""

    MAX_SOURCE_RUN = 8  # source tokens one rewrite may take ("1,234 km/h" ...)
    MAX_SPOKEN_RUN = 48  # the words it may become (a long number)

    def __init__(self, original: str, spoken: str, say: Callable[[str], str] | None = None):
        """say: the normaliser, token by token, to share a rewritten run between its tokens
        ("10:30. Dr." -> "ten thirty" | "Doctor"); without it a run stays one group."""
        raw = [x for x in _TOKEN.findall(original) if any(ch.isalnum() for ch in source_token(x))]
        src = [source_token(x) for x in raw]
        said = text_words(spoken)
        # group[j] = (source word, first spoken index, end spoken index) for spoken word j
        self.group: list[tuple[str, int, int] | None] = [None] * len(said)
        ks, kd = [_key(t) for t in src], [w.lower() for w in said]
        i = j = 0
        while i < len(src) and j < len(said):
            if ks[i] == kd[j]:
                self.group[j] = (src[i], j, j + 1)
                i, j = i + 1, j + 1
                continue
            anchor = self._anchor(ks, kd, i, j)
            if anchor is None:
                break  # no way back into step: the rest is reported as spoken
            di, dj = anchor
            if di and dj:
                counts = [len(text_words(say(t))) for t in raw[i:i + di]] if say is not None and di > 1 else []
                if sum(counts) != dj:  # one group for the whole run
                    counts, names = [dj], [" ".join(src[i:i + di])]
                else:
                    names = src[i:i + di]
                k = j
                for name, c in zip(names, counts):
                    g = (name, k, k + c)
                    for x in range(k, k + c):
                        self.group[x] = g
                    k += c
            i, j = i + di, j + dj
        self.said = said
        self.pos = 0

    def _anchor(self, ks, kd, i, j) -> tuple[int, int] | None:
        """The smallest skips (di, dj), di + dj first, after which the streams agree again: a
        token equal on both sides, or both ends."""
        for total in range(1, self.MAX_SOURCE_RUN + self.MAX_SPOKEN_RUN + 1):
            for di in range(max(0, total - self.MAX_SPOKEN_RUN), min(self.MAX_SOURCE_RUN, total) + 1):
                a, b = i + di, j + total - di
                if a == len(ks) and b == len(kd):
                    return di, total - di
                if a < len(ks) and b < len(kd) and ks[a] == kd[b]:
                    return di, total - di
        return None

    def respan(self, sentence: str, spans: Sequence[WordSpan]) -> tuple[WordSpan, ...]:
        """One sentence's spans (one per spoken word, in order) as the source's words."""
        words = text_words(sentence)
        n = len(words)
        if [w.lower() for w in self.said[self.pos:self.pos + n]] != [w.lower() for w in words] \
                or sum(s.n for s in spans) != n:
            return tuple(spans)  # not where expected (a word cut in two): as spoken
        base, self.pos = self.pos, self.pos + n
        out: list[WordSpan] = []
        k, last = base, None
        for sp in spans:
            g = self.group[k]
            if g is not None and (g[1] < base or g[2] > base + n):
                g = None  # a source word said across two sentences: each part as spoken
            if g is None or sp.n != 1:
                out.append(sp)
            elif g is last:  # the same source word, its next spoken word
                out[-1] = WordSpan(g[0], out[-1].lo, sp.hi)
            else:
                out.append(WordSpan(g[0], sp.lo, sp.hi))
            last = g
            k += sp.n
        return tuple(out)
