"""Phonemes given in the text: Piper's inline `[[ phonemes ]]`, and the words a lexicon replaces.

piper-tts (1.8.0) splits the text at `[[ ... ]]` (one line, shortest match) and takes what is
inside, stripped, codepoint by codepoint as phonemes: not decomposed, no vowel clusters merged.
A space phoneme goes before the block if the text before it ends with a space, and after it if
the text after it starts with one. The block belongs to the sentence before it, and the first
sentence espeak-ng finds in the text after it continues that sentence.

Here a block becomes a placeholder word (`placeholder(i)`: letters no language uses as words,
the block's index written in them) so that normalisation and the sentence splitter see one
word and keep it; the front end turns each placeholder back into the block's phonemes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PHONEME_BLOCK = re.compile(r"(\[\[.*?\]\])")  # piper-tts's own pattern

# Runic letters (category Lo: a "word" to every regex and to the splitter, no case, no digits)
_MARK = "\u16dd"
_DIGITS = "".join(chr(0x16A0 + k) for k in range(16))
PLACEHOLDER = re.compile(_MARK + "([" + _DIGITS + "]+)" + _MARK)


@dataclass(frozen=True)
class PhonemeBlock:
    """Phonemes to say as given, in place of a span of text."""

    phonemes: tuple[str, ...]
    space_before: bool
    space_after: bool
    text: str
    """What the block stands for in a sentence's text (the `[[ ... ]]` itself, or the word)."""
    word: bool = False
    """A lexicon's word: it joins sentences and the punctuation after it as any word does,
    not as piper-tts joins a `[[ ]]` (whose following "." or "," espeak-ng drops)."""

    def as_phonemes(self) -> list[str]:
        return [" "] * self.space_before + list(self.phonemes) + [" "] * self.space_after


def placeholder(index: int) -> str:
    digits = ""
    while True:
        index, d = divmod(index, 16)
        digits = _DIGITS[d] + digits
        if not index:
            return _MARK + digits + _MARK


def placeholder_index(match: re.Match) -> int:
    return int("".join(f"{_DIGITS.index(c):x}" for c in match.group(1)), 16)


def split_blocks(text: str) -> list[str]:
    """`PHONEME_BLOCK.split(text)`, in linear time: the regex retries its lazy scan from every
    "[[" of a line without "]]" (quadratic in a long line of "[["); with no "]]" before the
    line's end, no later "[[" of that line can match either."""
    parts: list[str] = []
    pos = start = 0
    while (i := text.find("[[", pos)) >= 0:
        j = text.find("]]", i + 2)
        nl = text.find("\n", i + 2)
        if j < 0:
            break
        if 0 <= nl < j:  # not on this line: go on from the next
            pos = nl + 1
            continue
        parts += [text[start:i], text[i:j + 2]]
        pos = start = j + 2
    parts.append(text[start:])
    return parts


def mark_blocks(text: str, blocks: list[PhonemeBlock]) -> str:
    """`text` with each `[[ ... ]]` replaced by a placeholder; the blocks are appended to
    `blocks` (a placeholder's index is its block's position there)."""
    parts = split_blocks(text)
    if len(parts) == 1:
        return text
    out: list[str] = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(part)
            continue
        blocks.append(PhonemeBlock(
            tuple(part[2:-2].strip()),
            parts[i - 1].endswith(" "),
            i + 1 < len(parts) and parts[i + 1].startswith(" "),
            part,
        ))
        out.append(placeholder(len(blocks) - 1))
    return "".join(out)


def has_placeholder(text: str) -> bool:
    return _MARK in text


def show(text: str, blocks: list[PhonemeBlock]) -> str:
    """A sentence's text with its placeholders back as what they stand for."""
    return PLACEHOLDER.sub(lambda m: blocks[placeholder_index(m)].text, text)
