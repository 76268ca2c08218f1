"""Text front end: normalise (typography, then the spoken form) -> split -> phonemise -> ids,
each a public function."""

from .frontend import Sentence, TextFrontend
from .ids import PhonemeIdMapper, phonemes_to_ids
from .lexicon import Lexicon, LexiconError
from .normalize import expand_abbreviations, normalize, normalize_unicode
from .phonemize import phonemize, phonemize_sentences
from .split import split_long, split_sentences
from .spoken import normalize_text

__all__ = [
    "Lexicon", "LexiconError", "Sentence", "TextFrontend", "PhonemeIdMapper", "phonemes_to_ids", "normalize",
    "normalize_text", "normalize_unicode", "expand_abbreviations", "phonemize", "phonemize_sentences",
    "split_long", "split_sentences",
]
