"""Phonemisation with espeak-ng, exactly as Piper voices were trained.

The espeak-ng library and its data come from `piper-tts` (the library inside its
`espeakbridge` extension), and the phonemes are the ones the voice saw in training: clause
punctuation kept, "(lang)" switch flags removed, codepoints decomposed (NFD), the voice's
vowel clusters merged. Clauses are read through espeak-ng's C API with ctypes rather than
through `espeakbridge.get_phonemes`, which keeps a reference to every clause it returns (two
Python objects a clause, never freed: a server's memory would grow with every sentence).
espeak-ng is a process-global C library and not thread safe: every call goes through one lock.

espeak-ng 1.52 (the build inside piper-tts 1.8.0) writes past fixed buffers on some texts no
sentence contains (found with an AddressSanitizer build, see docs/reliability.md, "Front end"):
a long dotted abbreviation ("a.a.a...", 80 bytes), a long word of suffixes ("'s's's...", 200
phoneme bytes), a clause of many short words ("a,a,a..." past its 300 word slots). Such text
reaches it in pieces that stay within those buffers (`espeak_pieces`); other text in one piece.
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
        """(phonemes, punctuation, ends a sentence) per clause of text, as espeak-ng splits it
        (text that would overflow its buffers: of each of `espeak_pieces(text)` in turn)."""
        self._bridge.set_voice(voice)  # every call, as Piper does: another caller may have changed it
        out = []
        # a C string: a NUL would end the text there, so it reads as the space it sounds like
        for piece in espeak_pieces(text.replace("\0", " ")):
            buf = ctypes.create_string_buffer(piece.encode("utf-8"))
            pos = ctypes.c_void_p(ctypes.addressof(buf))  # espeak-ng moves it on; NULL after the last clause
            term = ctypes.c_int(0)
            while pos.value:
                ph = self._clause(ctypes.byref(pos), _CHARS_AUTO, _IPA, ctypes.byref(term))
                out.append(((ph or b"").decode("utf-8"), _PUNCTUATION.get(term.value & 0x000FFFFF, ""),
                            bool(term.value & _SENTENCE)))
        return out


# Bounds well inside espeak-ng 1.52's buffers (translate.h, translateword.c): what passes one is
# handed to it in a new piece. Sentences stay far below them, and so stay one piece.
MAX_DOTTED_LETTERS = 8
"""Letters of one dotted abbreviation ("u.s.a."): copied into 80 bytes (CheckDottedAbbrev), and
joined into a 160-byte word (LookupDictList); a letter takes up to 4 bytes."""
MAX_WORD_CHARS = 48
"""Characters of one word: each suffix it strips ("'s", "-ness") appends phonemes to a 200-byte
buffer unchecked (TranslateWord3)."""
MAX_CLAUSE_WORDS = 200
"""Words of one clause, as espeak-ng counts them (`_word_count`): it has 300 slots and looks
up to ~20 words past the current one (multi-word entries, dotted abbreviations) unchecked."""

_TOKEN = re.compile(r"(\s+)|([\w'\u2019\u0300-\u036f]+)|(.)", re.S)
_CLAUSE_END = frozenset(",;!?")  # followed by a space, espeak-ng always ends a clause there


def _word_count(run: str) -> int:
    """How many words espeak-ng may make of a run of letters and digits (an upper bound): it
    starts a new one where digits and letters meet, where the case changes (CamelCase), where
    Latin meets another script, and at every ideograph or kana."""
    if len(run) == 1 or run.isalpha() and run.isascii() and (run.islower() or run[1:].islower()):
        return 1  # the common word: one
    n, prev = 1, None
    for ch in run:
        cls = (ch.isdigit(), ch.isupper(), ch < "\u0250")
        if ch >= "\u3040":
            n += 1
        elif prev is not None and cls != prev:
            n += 1
        prev = cls
    return n


def espeak_pieces(text: str) -> list[str]:
    """`text` cut where it would pass one of espeak-ng's bounds (`MAX_*`), in order, nothing
    dropped: one piece for any text a sentence is made of. Linear in len(text)."""
    pieces: list[str] = []
    start = 0
    words = 0  # in the clause so far (an upper bound of espeak-ng's count)
    dotted = 0  # single letters of the dotted run so far ("a." "b ." ...)
    after = None  # the last token, for dotted runs: "letter", "dot" or None

    def cut(at: int) -> None:
        nonlocal start, words, dotted
        if at > start:
            pieces.append(text[start:at])
            start, words, dotted = at, 0, 0

    for m in _TOKEN.finditer(text):
        space, run, other = m.groups()
        if space is not None:
            continue
        if run is not None and len(run) > MAX_WORD_CHARS:  # a long word: pieces of its own
            cut(m.start())
            for i in range(MAX_WORD_CHARS, len(run), MAX_WORD_CHARS):
                cut(m.start() + i)
            words, dotted, after = _word_count(text[start:m.end()]), 0, None
        elif run is not None:
            n = _word_count(run)
            if len(run) == 1 and run.isalpha():
                if after == "dot" and dotted + 1 > MAX_DOTTED_LETTERS:
                    cut(m.start())
                dotted = dotted + 1 if after == "dot" else 1
                after = "letter"
            else:
                dotted, after = 0, None
            if words + n > MAX_CLAUSE_WORDS:
                cut(m.start())
                dotted = 1 if after == "letter" else 0  # this letter starts the new piece's run
            words += n
        else:
            # "a.b" and "a . b" go on; in "a. b" espeak-ng drops the dot, and the run ends
            spaced = text[m.end():m.end() + 1].isspace() and m.start() > 0 and not text[m.start() - 1].isspace()
            after = "dot" if other == "." and after == "letter" and not spaced else None
            if other in _CLAUSE_END and text[m.end():m.end() + 1].isspace():
                words = 0
            else:
                if words + 1 > MAX_CLAUSE_WORDS:
                    cut(m.start())
                words += 1
    cut(len(text))
    return pieces or [text]


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
    if not text.strip():  # nothing to say, and the front end asks often (the gaps between blocks)
        return []
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
