"""SBV2's symbol table, tone offsets and language ids, and the add_blank step.

Everything a voice needs to turn a front end's (phones, tones, word2ph) into the model's
integer inputs. The table is SBV2's (112 symbols): `_` (pad, id 0), the sorted union of the
Chinese, Japanese and English phone sets, then the punctuation `! ? … , . ' -` and `SP`, `UNK`.
"""

from __future__ import annotations

from collections.abc import Sequence

PAD = "_"
PUNCTUATIONS = ["!", "?", "…", ",", ".", "'", "-"]
PUNCTUATION_SYMBOLS = PUNCTUATIONS + ["SP", "UNK"]

# pinyin initials/finals as SBV2's Chinese g2p writes them (opencpop-strict), plus AA EE OO
ZH_SYMBOLS = (
    "E En a ai an ang ao b c ch d e ei en eng er f g h i i0 ia ian iang iao ie in ing iong ir iu "
    "j k l m n o ong ou p q r s sh t u ua uai uan uang ui un uo v van ve vn w x y z zh AA EE OO"
).split()
# OpenJTalk phones; "N" is ん, "q" is っ
JP_SYMBOLS = (
    "N a a: b by ch d dy e e: f g gy h hy i i: j k ky m my n ny o o: p py q r ry s sh t ts ty "
    "u u: w y z zy"
).split()
# ARPAbet without stress digits, lower case; "V" stands for g2p output "v"
EN_SYMBOLS = (
    "aa ae ah ao aw ay b ch d dh eh er ey f g hh ih iy jh k l m n ng ow oy p r s sh t th uh uw "
    "V w y z zh"
).split()

NUM_ZH_TONES = 6
NUM_JP_TONES = 2
NUM_EN_TONES = 4
NUM_TONES = NUM_ZH_TONES + NUM_JP_TONES + NUM_EN_TONES

SYMBOLS = [PAD] + sorted(set(ZH_SYMBOLS + JP_SYMBOLS + EN_SYMBOLS)) + PUNCTUATION_SYMBOLS
SYMBOL_TO_ID = {s: i for i, s in enumerate(SYMBOLS)}
SIL_PHONEMES_IDS = [SYMBOL_TO_ID[s] for s in PUNCTUATION_SYMBOLS]

LANGUAGES = ("ZH", "JP", "EN")
LANGUAGE_ID_MAP = {"ZH": 0, "JP": 1, "EN": 2}
LANGUAGE_TONE_START_MAP = {"ZH": 0, "JP": NUM_ZH_TONES, "EN": NUM_ZH_TONES + NUM_JP_TONES}


class UnsupportedLanguageError(ValueError):
    """A language SBV2's front ends do not have (they have JP, EN and ZH)."""


def check_language(language: str) -> str:
    """The canonical language code ("JP", "EN", "ZH"); "ja"/"en"/"zh" and lower case accepted."""
    aliases = {"JA": "JP", "JPN": "JP", "ENG": "EN", "ZHO": "ZH", "CN": "ZH"}
    code = str(language).strip().upper()
    code = aliases.get(code, code)
    if code not in LANGUAGE_ID_MAP:
        raise UnsupportedLanguageError(
            f"SBV2 has no front end for language {language!r}: use one of {', '.join(LANGUAGES)}")
    return code


def cleaned_text_to_sequence(phones: Sequence[str], tones: Sequence[int],
                             language: str) -> tuple[list[int], list[int], list[int]]:
    """Phone ids, tone ids (the language's tone offset added) and language ids, one per phone."""
    language = check_language(language)
    try:
        ids = [SYMBOL_TO_ID[p] for p in phones]
    except KeyError as e:
        raise ValueError(f"phone {e.args[0]!r} is not in SBV2's symbol table") from None
    start = LANGUAGE_TONE_START_MAP[language]
    lang = LANGUAGE_ID_MAP[language]
    return ids, [t + start for t in tones], [lang] * len(ids)


def intersperse(seq: Sequence[int], item: int = 0) -> list[int]:
    """`item` between every element and at both ends (SBV2's commons.intersperse): 2n + 1 long."""
    out = [item] * (2 * len(seq) + 1)
    out[1::2] = list(seq)
    return out


def blank_word2ph(word2ph: Sequence[int]) -> list[int]:
    """word2ph after add_blank: every entry doubled, the first + 1 (sum = 2 * phones + 1)."""
    out = [2 * int(w) for w in word2ph]
    if out:
        out[0] += 1
    return out


def add_blank(phone_ids: Sequence[int], tone_ids: Sequence[int], language_ids: Sequence[int],
              word2ph: Sequence[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """SBV2's add_blank for all four: 0 interspersed in phone, tone AND language ids; word2ph
    doubled with its first entry + 1, so it still sums to the phone count."""
    if not (len(phone_ids) == len(tone_ids) == len(language_ids)):
        raise ValueError(f"phone, tone and language ids differ in length: "
                         f"{len(phone_ids)}, {len(tone_ids)}, {len(language_ids)}")
    if sum(word2ph) != len(phone_ids):
        raise ValueError(f"word2ph sums to {sum(word2ph)}, not the {len(phone_ids)} phones")
    return (intersperse(phone_ids), intersperse(tone_ids), intersperse(language_ids),
            blank_word2ph(word2ph))
