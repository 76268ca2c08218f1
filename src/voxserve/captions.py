"""Subtitles (SRT, WebVTT) from word timestamps.

Cues follow common subtitle practice: one line of at most `max_chars` characters (42, the
usual broadcast line length), a cue ending at a sentence's end or at a pause between words
(a gap of `pause_s` or more), and never longer than `max_cue_s` seconds, so a reader sees
each cue while it is spoken.
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


def cues(words: Iterable[Word], sentence_ends: Sequence[float] = (), max_chars: int = 42,
         max_cue_s: float = 7.0, pause_s: float = 0.5) -> list[Cue]:
    """Words (in order, whole-audio seconds) grouped into cues. `sentence_ends`: the times
    where sentences end (a cue never spans two); a word ending in sentence punctuation ends
    one as well."""
    ends = sorted(sentence_ends)
    out: list[Cue] = []
    cur: list[Word] = []

    def flush() -> None:
        if cur:
            out.append(Cue(cur[0].start, cur[-1].end, " ".join(w.word for w in cur)))
            cur.clear()

    for w in words:
        if cur:
            text_len = sum(len(x.word) + 1 for x in cur) + len(w.word)
            boundary = any(cur[-1].end <= e <= w.start for e in ends)
            if (text_len > max_chars or w.end - cur[0].start > max_cue_s or w.start - cur[-1].end >= pause_s
                    or boundary or cur[-1].word.endswith(_SENTENCE_END)):
                flush()
        cur.append(w)
    flush()
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


def write_captions(path: str | Path, words: Iterable[Word], sentence_ends: Sequence[float] = ()) -> int:
    """Write the words' captions to `path` (format from its extension); -> the number of cues."""
    fmt = caption_format(path)
    cue_list = cues(words, sentence_ends)
    Path(path).write_text(format_captions(cue_list, fmt), encoding="utf-8")
    return len(cue_list)
