"""The text front end of a voice: split -> normalise -> phonemise -> ids.

Each stage is a public function in its own module (`split`, `normalize`, `phonemize`, `ids`);
`TextFrontend` binds them to one voice's language, maps and limits.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from ..errors import EmptyTextError, UnpronounceableTextError
from .aligned import Aligned
from .blocks import PLACEHOLDER, PhonemeBlock, has_placeholder, mark_blocks, placeholder_index, show
from .ids import PhonemeIdMapper
from .lexicon import Lexicon
from .normalize import expand_abbreviations_aligned, normalize_unicode_aligned
from .phonemize import phonemize
from .split import split_long, split_sentences
from .ssml import Break, Span, parse_ssml
from .ssml import input_format as resolve_input_format
from .spoken import normalize_text_aligned

DEFAULT_MAX_PHONEMES = 400
MIN_MAX_PHONEMES = 16


@dataclass(frozen=True)
class Sentence:
    """One unit of synthesis: a sentence (or a piece of an over-long one)."""

    text: str
    phonemes: tuple[str, ...]
    ids: tuple[int, ...]
    rate: float = 1.0
    """Speaking-rate multiplier of its text (SSML `<prosody rate>`): divides the length scale."""


def _has_speech(phonemes: Sequence[str]) -> bool:
    # IPA symbols are letters (L*) or modifier letters; punctuation and spaces are not speech
    return any(p and unicodedata.category(p[0])[0] == "L" for p in phonemes)


class TextFrontend:
    def __init__(
        self,
        espeak_voice: str,
        phoneme_id_map: Mapping[str, Sequence[int]],
        phoneme_map: Mapping[str, Sequence[str]] | None = None,
        vowel_clusters: frozenset[tuple[str, ...]] | None = None,
        max_phonemes: int = DEFAULT_MAX_PHONEMES,
        lexicon: Lexicon | None = None,
    ):
        if max_phonemes < MIN_MAX_PHONEMES:
            raise ValueError(f"max_phonemes must be at least {MIN_MAX_PHONEMES}")
        self.espeak_voice = espeak_voice
        self.phoneme_map = phoneme_map or {}
        self.vowel_clusters = set(vowel_clusters) if vowel_clusters else None
        self.max_phonemes = max_phonemes
        self.to_ids = PhonemeIdMapper(phoneme_id_map)
        self.lexicon = lexicon
        """Words said with the user's phonemes (`text.lexicon`), after normalisation."""

    def normalize(self, text: str, spoken: bool = True) -> str:
        """Typography (`normalize_unicode`), then, with `spoken`, the spoken form
        (`normalize_text`: numbers, dates, units, ... as words; English voices only), then the
        title abbreviations left. The spoken pass runs before splitting, so that "Dr. Smith"
        and "3.5" reach the splitter as "Doctor Smith" and "three point five"."""
        return self.normalize_aligned(text, spoken).text

    def normalize_aligned(self, text: str, spoken: bool = True) -> Aligned:
        """`normalize`, each character carrying the span of `text` it says (word timestamps)."""
        out = normalize_unicode_aligned(Aligned.of(text))
        if spoken:
            out = normalize_text_aligned(out, self.espeak_voice)
        return expand_abbreviations_aligned(out, self.espeak_voice)

    def phonemize(self, text: str) -> list[str]:
        return phonemize(text, self.espeak_voice, self.phoneme_map, self.vowel_clusters)

    def iter_sentences(self, text: str, spoken: bool = True) -> Iterator[Sentence]:
        """Lazily, in order. Sentences with nothing to say ("...", emoji) are skipped.
        `spoken=False` reads the text as written (no `normalize_text`). Inline `[[ phonemes ]]`
        are said as given, joined to the text around them as piper-tts joins them
        (`text.blocks`); so are the words of the lexicon."""
        blocks: list[PhonemeBlock] = []
        norm = self.normalize(mark_blocks(text, blocks), spoken)
        if self.lexicon is not None:
            norm = self.lexicon.mark(norm, blocks)
        yield from self._sentences(norm, blocks)

    def document(self, text: str, input_format: str | None = None) -> list[Span | Break]:
        """The input as spans of text and breaks: SSML parsed now (InvalidInputError naming the
        position if it is malformed), plain text one span. `input_format`: "text", "ssml" or
        None (SSML if the input starts with `<speak`)."""
        if resolve_input_format(text, input_format) == "ssml":
            return parse_ssml(text)
        return [Span(text)]

    def iter_document(self, doc: list[Span | Break], spoken: bool = True) -> Iterator[Sentence | Break]:
        """`document()`'s spans as sentences (each span's own: a span ends a sentence), its
        breaks as they are, lazily, in order."""
        for item in doc:
            if isinstance(item, Break):
                yield item
                continue
            for s in self.iter_sentences(item.text, spoken):
                yield s if item.rate == 1.0 else replace(s, rate=item.rate)

    def _sentences(self, norm: str, blocks: list[PhonemeBlock]) -> Iterator[Sentence]:
        """Normalised text (with the placeholders of `blocks`) -> its sentences."""
        cache: dict[str, list[str]] = {}

        def phon(t: str) -> list[str]:
            if t not in cache:
                cache[t] = self._phonemes(t, blocks)
            return cache[t]

        for sent in (join_at_blocks(norm, blocks) if blocks else split_sentences(norm)):
            cache.clear()
            pieces = split_long(sent, self.max_phonemes, lambda t: len(phon(t)))
            for piece in pieces:
                ph = phon(piece)
                if _has_speech(ph):
                    shown = show(piece, blocks) if blocks else piece
                    yield Sentence(shown, tuple(ph), tuple(self.to_ids(ph)))

    def _phonemes(self, text: str, blocks: list[PhonemeBlock]) -> list[str]:
        """The text between placeholders through espeak-ng piece by piece (as piper-tts
        phonemises the text between its blocks), the blocks' phonemes in their places."""
        if not blocks or not has_placeholder(text):
            return self.phonemize(text)
        out: list[str] = []
        pos = 0
        for m in PLACEHOLDER.finditer(text):
            out.extend(self.phonemize(text[pos:m.start()]))
            block = blocks[placeholder_index(m)]
            if block.word:  # spaced as a word of this sentence (its edges have none)
                out.extend([" "] * (m.start() > 0 and text[m.start() - 1] == " "))
                out.extend(block.phonemes)
                out.extend([" "] * text.startswith(" ", m.end()))
            else:
                out.extend(block.as_phonemes())
            pos = m.end()
            if block.word and (p := _PUNCT_AFTER.match(text, pos)):
                # espeak-ng drops punctuation that starts a text: a word keeps it, as espeak
                # writes it (clause punctuation with a space after it)
                out.append(p.group(1)[-1])
                if p.group(1)[-1] in ",:;" or p.group(2):
                    out.append(" ")
                pos = p.end()
        out.extend(self.phonemize(text[pos:]))
        return out

    def sentences(self, text: str, spoken: bool = True) -> list[Sentence]:
        """All sentences; raises EmptyTextError / UnpronounceableTextError."""
        check_text(text)
        out = list(self.iter_sentences(text, spoken))
        if not out:
            raise UnpronounceableTextError(text)
        return out


_PUNCT_AFTER = re.compile(r"([.,:;!?]+)( ?)")


def join_at_blocks(norm: str, blocks: list[PhonemeBlock]) -> list[str]:
    """Sentences of normalised text with placeholders, grouped as piper-tts groups them: a
    sentence that starts with a block continues the one before it (across paragraphs too), and
    one with nothing to say after its last block (the "." of "[[ a ]]. Next.", which espeak-ng
    drops) is continued by the next sentence of its paragraph. A lexicon word's block is a word:
    it joins nothing."""
    def inline(m: re.Match | None) -> bool:
        return m is not None and not blocks[placeholder_index(m)].word

    out: list[str] = []
    for para in _PARAGRAPH.split(norm):
        open_ = False  # the last sentence waits for the text after its block
        for sent in split_sentences(para):
            if out and (open_ or inline(PLACEHOLDER.match(sent))):
                out[-1] = f"{out[-1]} {sent}"
            else:
                out.append(sent)
            last = None
            for last in PLACEHOLDER.finditer(out[-1]):
                pass
            open_ = inline(last) and not any(ch.isalnum() for ch in out[-1][last.end():])
    return out


_PARAGRAPH = re.compile(r"\n\s*\n")


def check_text(text: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    if not text.strip():
        raise EmptyTextError()
