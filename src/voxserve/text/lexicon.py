"""A user lexicon: words said with the phonemes the user gives.

The file is UTF-8, one entry a line: the word, then a tab or spaces, then its phonemes in the
voice's phoneme set (espeak-ng IPA for Piper voices, as inside `[[ ]]`). Blank lines and lines
starting with "#" are skipped ("#" is not a comment after an entry: some voices have it as a
phoneme). A later entry for the same word replaces an earlier one.

A word matches whole and case-insensitively: "nginx" matches "NGINX" and "Nginx." but not
"nginxes". It is replaced before phonemisation exactly as `[[ phonemes ]]` would be
(`text.blocks`), in the text as the front end speaks it (after normalisation: an entry for
"kilometers" also takes the "km" of "20 km").

A lexicon read from a file follows the file: each use compares the file's modification time
and size with those it read, and reads it again when they changed. A changed file that no
longer parses is logged and the entries read before stay in use.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path

from ..errors import VoxserveError
from .blocks import PhonemeBlock, placeholder

log = logging.getLogger(__name__)

MAX_LEXICON_BYTES = 1 << 20
MAX_ENTRIES = 20_000
MAX_WORD_CHARS = 64
MAX_PHONEME_CHARS = 200

# a word: letters/digits, with inner apostrophes or hyphens ("rock'n'roll", "e-mail")
WORD = re.compile(r"\w+(?:['\u2019-]\w+)*")


class LexiconError(VoxserveError, ValueError):
    """A lexicon that cannot be read; the message names the file and the line."""


def _check_phonemes(phonemes: str) -> str | None:
    if not phonemes:
        return "no phonemes after the word"
    if len(phonemes) > MAX_PHONEME_CHARS:
        return f"phonemes longer than {MAX_PHONEME_CHARS} characters"
    if "[[" in phonemes or "]]" in phonemes:
        return "phonemes must not contain [[ or ]]"
    if any(ord(c) < 32 or c == "\x7f" for c in phonemes):
        return "phonemes contain a control character"
    return None


def _check_word(word: str) -> str | None:
    if len(word) > MAX_WORD_CHARS:
        return f"word longer than {MAX_WORD_CHARS} characters"
    if not WORD.fullmatch(word):
        return f"{word!r} is not one word (letters and digits, inner ' or - only)"
    return None


def parse_lexicon(text: str, source: str = "<lexicon>") -> dict[str, str]:
    """Lines of `word phonemes` -> {lower-cased word: phonemes}; LexiconError names
    `source` and the line."""
    entries: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, phonemes = line.partition("\t") if "\t" in line else line.partition(" ")
        word, phonemes = word.strip(), phonemes.strip()
        problem = _check_word(word) or _check_phonemes(phonemes)
        if problem:
            raise LexiconError(f"{source}, line {n}: {problem}")
        entries[word.lower()] = phonemes
        if len(entries) > MAX_ENTRIES:
            raise LexiconError(f"{source}, line {n}: more than {MAX_ENTRIES} entries")
    return entries


def read_lexicon_file(path: Path) -> dict[str, str]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_LEXICON_BYTES + 1)
    except OSError as e:
        raise LexiconError(f"{path}: cannot read the lexicon: {e.strerror or e}") from None
    if len(data) > MAX_LEXICON_BYTES:
        raise LexiconError(f"{path}: a lexicon is at most {MAX_LEXICON_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise LexiconError(f"{path}, line {line}: not UTF-8") from None
    return parse_lexicon(text, str(path))


class Lexicon:
    """Words -> phonemes; from a mapping, or from a file it follows (`Lexicon.from_file`)."""

    def __init__(self, entries: Mapping[str, str] | None = None):
        checked: dict[str, str] = {}
        for word, phonemes in (entries or {}).items():
            problem = _check_word(word) or _check_phonemes(phonemes.strip())
            if problem:
                raise LexiconError(f"lexicon entry {word!r}: {problem}")
            checked[word.lower()] = phonemes.strip()
        if len(checked) > MAX_ENTRIES:
            raise LexiconError(f"a lexicon has at most {MAX_ENTRIES} entries")
        self._entries = checked
        self.path: Path | None = None
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Lexicon":
        """Read now (LexiconError if it cannot be), and again whenever the file changes."""
        lex = cls()
        lex.path = Path(path)
        lex._stamp = lex._file_stamp()
        lex._entries = read_lexicon_file(lex.path)
        return lex

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"Lexicon({len(self._entries)} entries{f', {self.path}' if self.path else ''})"

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    @property
    def entries(self) -> Mapping[str, str]:
        """The entries now in use (a file's are read again first if it changed)."""
        if self.path is not None:
            stamp = self._file_stamp()
            if stamp != self._stamp:
                with self._lock:
                    if stamp != self._stamp:
                        self._stamp = stamp
                        try:
                            self._entries = read_lexicon_file(self.path)
                            log.info("lexicon %s read again: %d entries", self.path, len(self._entries))
                        except LexiconError as e:
                            log.error("%s; the lexicon's earlier entries stay in use", e)
        return self._entries

    def lookup(self, word: str) -> str | None:
        return self.entries.get(word.lower())

    def mark(self, text: str, blocks: list[PhonemeBlock]) -> str:
        """`text` with each lexicon word replaced by a placeholder of a new block in `blocks`."""
        entries = self.entries
        if not entries:
            return text

        def sub(m: re.Match) -> str:
            phonemes = entries.get(m.group(0).lower())
            if phonemes is None:
                return m.group(0)
            # spaced by the front end, in its sentence (PhonemeBlock.word)
            blocks.append(PhonemeBlock(tuple(phonemes), False, False, m.group(0), word=True))
            return placeholder(len(blocks) - 1)

        return WORD.sub(sub, text)
