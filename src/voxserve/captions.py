"""Subtitles (SRT, WebVTT) from word timestamps.

Cues follow common subtitle practice: one line of at most `max_chars` characters (42, the
usual broadcast line length), balanced when a sentence takes several; a cue ends at a
sentence's end or at a pause between words (a gap of `pause_s` or more), and is never longer
than `max_cue_s` seconds, so a reader sees each cue while it is spoken.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .audio import Word

CAPTION_FORMATS = ("srt", "vtt")
_SENTENCE_END = (".", "!", "?", ";", "…", "。", "！", "？")


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    text: str


def caption_format(path: str | Path) -> str:
    """'srt' or 'vtt' from a file name's extension."""
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in CAPTION_FORMATS:
        raise ValueError(f"cannot tell the caption format of {Path(path).name}: use a .srt or .vtt file")
    return ext


def cues(words: Iterable[Word], sentence_ends: Sequence[float] = (), text: str | None = None,
         max_chars: int = 42, max_cue_s: float = 7.0, pause_s: float = 0.5) -> list[Cue]:
    """Words (in order, whole-audio seconds) grouped into cues. A cue never spans a sentence
    end (`sentence_ends`: where sentences end, or a word ending in sentence punctuation) or a
    pause; a run longer than one line is cut into as few lines as fit, of balanced lengths (no
    one-word orphan at its end). `text`: the text the words were said from, so that cues show
    its punctuation ("Hello, world!"); without it, the words alone."""
    ends = sorted(sentence_ends)
    runs: list[list[Word]] = []
    for w in words:
        cur = runs[-1] if runs else None
        if cur and not (any(cur[-1].end <= e <= w.start for e in ends) or w.start - cur[-1].end >= pause_s
                        or cur[-1].word.endswith(_SENTENCE_END)):
            cur.append(w)
        else:
            runs.append([w])
    shown = _with_punctuation([w for r in runs for w in r], text)
    out: list[Cue] = []
    k = 0
    for run in runs:
        labels = shown[k:k + len(run)]
        k += len(run)
        for lo, hi in _lines(run, labels, max_chars, max_cue_s):
            out.append(Cue(run[lo].start, run[hi - 1].end, " ".join(labels[lo:hi])))
    return out


def _lines(run: Sequence[Word], labels: Sequence[str], max_chars: int, max_cue_s: float) -> list[tuple[int, int]]:
    """[lo, hi) word ranges of a run: the fewest lines under both bounds, filled towards an
    even share of the run's characters."""
    total = sum(len(x) for x in labels) + len(labels) - 1
    n_lines = max(1, -(-total // max_chars))
    target = total / n_lines
    out, lo, width = [], 0, -1
    for i, label in enumerate(labels):
        grown = width + 1 + len(label)
        over = grown > max_chars or run[i].end - run[lo].start > max_cue_s
        if i > lo and (over or (width >= target and len(out) < n_lines - 1)):
            out.append((lo, i))
            lo, grown = i, len(label)
        width = grown
    out.append((lo, len(labels)))
    return out


def _with_punctuation(words: Sequence[Word], text: str | None) -> list[str]:
    """Each word as the text writes it, with the punctuation around it ("world!", "(mostly)"):
    the whitespace-delimited stretch holding it, found in order; the word itself if absent."""
    if not text:
        return [w.word for w in words]
    out, pos = [], 0
    for w in words:
        at = text.find(w.word, pos)
        gap = "" if at < 0 else text[pos:at].strip(" \t\r\n\"'()[]{}«»“”‘’-—–,;:.!?…")
        if at < 0 or any(ch.isalnum() for ch in gap):
            out.append(w.word)  # not next in the text (rewritten or skipped): as reported
            continue
        start = at
        while start > pos and not text[start - 1].isspace():
            start -= 1
        end = at + len(w.word)
        while end < len(text) and not text[end].isspace():
            end += 1
        # a symbol said but no word ("&" of "Tom & Jerry") shows with the word after it
        lead = " ".join(t for t in text[pos:start].split() if t.strip("\"'()[]{}«»“”‘’-—–,;:.!?…")) if gap else ""
        out.append((lead + " " if lead else "") + text[start:end])
        pos = end
    return out


def _stamp(t: float, sep: str) -> str:
    ms = max(0, int(round(t * 1000)))
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def format_captions(cue_list: Sequence[Cue], fmt: str) -> str:
    """The text of an SRT or WebVTT file holding the cues."""
    if fmt not in CAPTION_FORMATS:
        raise ValueError(f"unknown caption format {fmt!r}; use one of: {', '.join(CAPTION_FORMATS)}")
    sep = "," if fmt == "srt" else "."
    blocks = []
    for k, c in enumerate(cue_list, start=1):
        head = f"{k}\n" if fmt == "srt" else ""
        blocks.append(f"{head}{_stamp(c.start, sep)} --> {_stamp(c.end, sep)}\n{c.text}\n")
    body = "\n".join(blocks)
    return body if fmt == "srt" else "WEBVTT\n\n" + body


def write_captions(path: str | Path, words: Iterable[Word], sentence_ends: Sequence[float] = (),
                   text: str | None = None) -> int:
    """Write the words' captions to `path` (format from its extension); -> the number of cues."""
    fmt = caption_format(path)
    cue_list = cues(words, sentence_ends, text)
    Path(path).write_text(format_captions(cue_list, fmt), encoding="utf-8")
    return len(cue_list)
