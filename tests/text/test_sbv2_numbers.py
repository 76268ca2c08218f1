"""SBV2's normalisers read numbers past their number words' range digit by digit (issue 49: "1"
followed by 51 zeros, and "9" x 400 in English, were a num2words OverflowError / inflect
NumOutOfRangeError, a 500 on every route), as the Piper voices' English normaliser does."""

import pytest

pytest.importorskip("num2words")
pytest.importorskip("inflect")

from voxserve.families.sbv2.text import english, japanese  # noqa: E402


@pytest.mark.parametrize("text", ["1" + "0" * 51, "9" * 400, "$" + "9" * 30 + ".5", "1" * 20 + "th", "9" * 5000])
def test_english_reads_huge_numbers_digit_by_digit(text):
    out = english.normalize_text(text)
    digits = sum(c.isdigit() for c in text)
    assert not any(c.isdigit() for c in out)
    assert sum(out.split().count(w) for w in english._DIGIT_WORDS) + out.count("oneth") + out.count("nineth") >= digits


def test_english_numbers_in_range_are_read_as_before():
    assert english.normalize_text("It costs $3.50 in 1984, 12th.") == (
        "It costs three dollars, fifty cents in nineteen eighty-four, twelfth.")
    assert english.normalize_text("1" * 15) == english._inflect().number_to_words(int("1" * 15), andword="")
    assert english.normalize_text("1" * 16) == " ".join(["one"] * 16)


@pytest.mark.parametrize("text", ["1" + "0" * 51, "9" * 400 + ".25", "9" * 5000])
def test_japanese_reads_numbers_past_its_words_digit_by_digit(text):
    out = japanese.normalize_text(text)
    assert not any(c.isdigit() for c in out)
    assert out.startswith("一零零" if text.startswith("1") else "九九九")
    assert out.endswith("点二五") if "." in text else True


def test_japanese_numbers_in_range_are_read_as_before():
    assert japanese.normalize_text("1980円") == "千九百八十円"
    assert japanese.normalize_text("3.14") == "三点一四"
    assert japanese.normalize_text("1" * 17).startswith("一京")
