"""Phonemisation with espeak-ng, exactly as Piper voices were trained.

The espeak-ng library and its data come from `piper-tts` (the library inside its
`espeakbridge` extension), and the phonemes are the ones the voice saw in training: clause
punctuation kept, "(lang)" switch flags removed, codepoints decomposed (NFD), the voice's
vowel clusters merged. Clauses are read through espeak-ng's C API with ctypes rather than
through `espeakbridge.get_phonemes`, which keeps a reference to every clause it returns (two
Python objects a clause, never freed: a server's memory would grow with every sentence).
espeak-ng is a process-global C library and not thread safe: every call goes through one lock.
"""

from __future__ import annotations

import ctypes
import re
import threading
import unicodedata
from collections.abc import Mapping, Sequence

_LOCK = threading.Lock()
_ESPEAK = None

# espeak_TextToPhonemesWithTerminator's clause terminator: its punctuation (the low 20 bits)
# -> the phoneme Piper writes for it, and the flag of a clause that ends a sentence
_SENTENCE = 0x00080000
_CLAUSE = 0x00040000
_PUNCTUATION = {
    40 | 0x0000 | _SENTENCE: ".", 40 | 0x2000 | _SENTENCE: "?", 45 | 0x3000 | _SENTENCE: "!",
    20 | 0x1000 | _CLAUSE: ",", 30 | 0x0000 | _CLAUSE: ":", 30 | 0x1000 | _CLAUSE: ";",
}
_CHARS_AUTO, _IPA = 0, 0x02
_LANG_FLAG = re.compile(r"\([^)]+\)")  # "(fr)" ... "(en)" around words of another language


class _Espeak:
    """espeak-ng in piper-tts's extension: initialised and voiced by the extension, clauses
    read through the library's C API."""

    def __init__(self):
        from piper import espeakbridge
        from piper.phonemize_espeak import ESPEAK_DATA_DIR

        espeakbridge.initialize(str(ESPEAK_DATA_DIR))
        self._bridge = espeakbridge
        clause = ctypes.CDLL(espeakbridge.__file__).espeak_TextToPhonemesWithTerminator
        clause.restype = ctypes.c_char_p  # espeak-ng's own buffer, copied by ctypes
        clause.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        self._clause = clause

    def clauses(self, voice: str, text: str) -> list[tuple[str, str, bool]]:
        """(phonemes, punctuation, ends a sentence) per clause of text, as espeak-ng splits it."""
        self._bridge.set_voice(voice)  # every call, as Piper does: another caller may have changed it
        # a C string: a NUL would end the text there, so it reads as the space it sounds like
        buf = ctypes.create_string_buffer(text.replace("\0", " ").encode("utf-8"))
        pos = ctypes.c_void_p(ctypes.addressof(buf))  # espeak-ng moves it on; NULL after the last clause
        term = ctypes.c_int(0)
        out = []
        while pos.value:
            ph = self._clause(ctypes.byref(pos), _CHARS_AUTO, _IPA, ctypes.byref(term))
            out.append(((ph or b"").decode("utf-8"), _PUNCTUATION.get(term.value & 0x000FFFFF, ""),
                        bool(term.value & _SENTENCE)))
        return out


def _espeak() -> _Espeak:
    global _ESPEAK
    if _ESPEAK is None:
        _ESPEAK = _Espeak()
    return _ESPEAK


def merge_vowel_clusters(phones: Sequence[str], clusters: set[tuple[str, ...]]) -> list[str]:
    """Adjacent phonemes that form one of the voice's vowel clusters -> one phoneme (longest first)."""
    longest = max(map(len, clusters))
    out: list[str] = []
    i = 0
    while i < len(phones):
        for n in range(min(longest, len(phones) - i), 1, -1):
            if tuple(phones[i : i + n]) in clusters:
                out.append("".join(phones[i : i + n]))
                i += n
                break
        else:
            out.append(phones[i])
            i += 1
    return out


def phonemize_sentences(text: str, voice: str = "en-us",
                        vowel_clusters: set[tuple[str, ...]] | None = None) -> list[list[str]]:
    """Text -> phonemes grouped by the sentences espeak-ng sees (Piper's unit of synthesis)."""
    with _LOCK:
        clauses = _espeak().clauses(voice, text)
    sentences: list[list[str]] = []
    current: list[str] = []
    for phonemes, punctuation, ends in clauses:
        phonemes = _LANG_FLAG.sub("", phonemes) + punctuation
        if punctuation in (",", ":", ";"):
            phonemes += " "  # a pause inside the sentence
        current.extend(unicodedata.normalize("NFD", phonemes))
        if ends:
            sentences.append(current)
            current = []
    if current:  # text without a final terminator
        sentences.append(current)
    if vowel_clusters:
        sentences = [merge_vowel_clusters(s, vowel_clusters) for s in sentences]
    return sentences


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
