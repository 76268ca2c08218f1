"""Phonemisation with espeak-ng, exactly as Piper voices were trained.

The espeak-ng library and its data come from `piper-tts` (its `espeakbridge` extension and
the phonemiser around it), so the phonemes are the ones the voice saw in training: clause
punctuation kept, "(lang)" switch flags removed, codepoints decomposed (NFD), the voice's
vowel clusters merged. espeak-ng is a process-global C library and not thread safe: every call
goes through one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

_LOCK = threading.Lock()
_ESPEAK = None


def _espeak():
    global _ESPEAK
    if _ESPEAK is None:
        from piper.phonemize_espeak import ESPEAK_DATA_DIR, EspeakPhonemizer

        _ESPEAK = EspeakPhonemizer(ESPEAK_DATA_DIR)
    return _ESPEAK


def phonemize_sentences(text: str, voice: str = "en-us",
                        vowel_clusters: set[tuple[str, ...]] | None = None) -> list[list[str]]:
    """Text -> phonemes grouped by the sentences espeak-ng sees (Piper's unit of synthesis)."""
    with _LOCK:
        return _espeak().phonemize(voice, text, vowel_clusters=vowel_clusters)


def phonemize(text: str, voice: str = "en-us",
              phoneme_map: Mapping[str, Sequence[str]] | None = None,
              vowel_clusters: set[tuple[str, ...]] | None = None) -> list[str]:
    """One of our sentences -> its phonemes (one utterance).

    If espeak-ng ends a sentence inside it, the parts are joined with a space: our splitter
    decides utterance boundaries. `phoneme_map` (older Piper voices) replaces a phoneme by a
    sequence of phonemes.
    """
    parts = phonemize_sentences(text, voice, vowel_clusters)
    out: list[str] = []
    for i, part in enumerate(parts):
        if i and part:
            out.append(" ")
        out.extend(part)
    if phoneme_map:
        mapped: list[str] = []
        for p in out:
            mapped.extend(phoneme_map.get(p, (p,)))
        out = mapped
    return out
