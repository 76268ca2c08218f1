"""Katakana mora -> (consonant, vowel), the table SBV2's Japanese g2p reads readings with.

It is OpenJTalk's mora table made one-to-one by SBV2: ン is the vowel "N", ッ the vowel "q"
(OpenJTalk's "cl"), デェ is absent (pyopenjtalk reads it "d e e"), and small kana and archaic
kana have readings of their own. Built here row by row rather than listed.
"""

from __future__ import annotations

VOWELS = {"a", "i", "u", "e", "o", "N"}


def _build() -> dict[str, tuple[str | None, str]]:
    t: dict[str, tuple[str | None, str]] = {}

    def row(kana: str, consonants: str | list, vowels: str = "aiueo") -> None:
        cons = consonants.split() if isinstance(consonants, str) else consonants
        if len(cons) == 1:
            cons = cons * len(kana)
        for k, c, v in zip(kana, cons, vowels):
            t[k] = (None if c == "-" else c, v)

    row("アイウエオ", "-")
    row("カキクケコ", "k")
    row("ガギグゲゴ", "g")
    row("サシスセソ", "s sh s s s")
    row("ザジズゼゾ", "z j z z z")
    row("タチツテト", "t ch ts t t")
    row("ダデド", "d", "aeo")
    row("ナニヌネノ", "n")
    row("ハヒフヘホ", "h h f h h")
    row("バビブベボ", "b")
    row("パピプペポ", "p")
    row("マミムメモ", "m")
    row("ヤユヨ", "y", "auo")
    row("ラリルレロ", "r")
    row("ワ", "w", "a")
    row("ヲヱヰ", "-", "oei")
    row("ヂヅヶヮ", "j z k w", "iuea")
    row("ァィゥェォ", "-")
    row("ャュョ", "y", "auo")
    t["ン"] = (None, "N")
    t["ッ"] = (None, "q")
    # contracted sounds: a kana of the i column (or テ, デ, ヴ) + small ャ ュ ョ (ェ)
    for kana, c, small in (("キ", "ky", "ャュョェ"), ("ギ", "gy", "ャュョェ"), ("ニ", "ny", "ャュョェ"),
                           ("ヒ", "hy", "ャュョェ"), ("ビ", "by", "ャュョェ"), ("ピ", "py", "ャュョェ"),
                           ("ミ", "my", "ャュョェ"), ("リ", "ry", "ャュョェ"), ("シ", "sh", "ャュョェ"),
                           ("ジ", "j", "ャュョェ"), ("チ", "ch", "ャュョェ"), ("テ", "ty", "ャュョ"),
                           ("デ", "dy", "ャュョ"), ("ヴ", "by", "ャュョ")):
        for s in small:
            t[kana + s] = (c, {"ャ": "a", "ュ": "u", "ョ": "o", "ェ": "e"}[s])
    # loanword sounds: a kana + small ァ ィ ゥ ェ ォ
    for kana, c, small in (("ヴ", "v", "ァィェォ"), ("フ", "f", "ァィェォ"), ("ツ", "ts", "ァィェォ"),
                           ("ウ", "w", "ィェォ"), ("テ", "t", "ィ"), ("デ", "d", "ィ"), ("ト", "t", "ゥ"),
                           ("ド", "d", "ゥ"), ("イ", "y", "ェ"), ("ス", "s", "ィ"), ("ズ", "z", "ィ")):
        for s in small:
            t[kana + s] = (c, {"ァ": "a", "ィ": "i", "ゥ": "u", "ェ": "e", "ォ": "o"}[s])
    t["ヴ"] = ("v", "u")
    t["グヮ"] = ("gw", "a")
    t["クヮ"] = ("kw", "a")
    return t


MORA_KATA_TO_MORA_PHONEMES: dict[str, tuple[str | None, str]] = _build()
