"""SBV2 text front ends (issue 20) against the reference's own outputs (frontend.json).

The word2ph of SBV2's JP and EN g2p depends on the BERT tokenizer, so the tokenizers here are
the fixture's own (synth.json `bert.NAME.tokenizer_files`: ku-nlp's BertJapaneseTokenizer
config with a character vocabulary, and the hand-built deberta-v3 spm.model), written to a tmp
folder and loaded with transformers as a user's BERT_ROOT would be.
"""

from __future__ import annotations

import base64
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import sbv2_fixtures as fx

pytest.importorskip("transformers")
pytest.importorskip("pyopenjtalk")

from voxserve.families.sbv2 import text as T  # noqa: E402
from voxserve.families.sbv2.text import english, japanese, symbols  # noqa: E402

JP = fx.frontend()["jp"]
EN = fx.frontend()["en"]
# more reference outputs, same tokenizers: tests/fixtures/sbv2/make_frontend_extra.py
EXTRA = json.loads((fx.FIX / "frontend_extra.json").read_text(encoding="utf-8"))


def _write_tokenizer(name: str, root) -> str:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    for fn, content in fx.meta()["bert"][name]["tokenizer_files"].items():
        if "text" in content:
            (d / fn).write_text(content["text"], encoding="utf-8")
        else:
            (d / fn).write_bytes(base64.b64decode(content["base64"]))
    return str(d)


@pytest.fixture(scope="module")
def jp_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_write_tokenizer(fx.JP_BERT, tmp_path_factory.mktemp("bert")))
    assert type(tok).__name__ == "BertJapaneseTokenizer"
    return tok


@pytest.fixture(scope="module")
def en_tokenizer(tmp_path_factory):
    pytest.importorskip("sentencepiece")
    from transformers import DebertaV2Tokenizer  # as SBV2 loads the EN tokenizer

    return DebertaV2Tokenizer.from_pretrained(_write_tokenizer(fx.EN_BERT, tmp_path_factory.mktemp("bert")))


def test_fixture_sizes():
    assert len(JP) >= 30 and len(EN) >= 15
    assert fx.frontend()["pyopenjtalk_dict"] == [japanese.DICTIONARY]


def test_symbol_table_is_the_reference():
    ref = fx.frontend()["symbols"]
    assert len(symbols.SYMBOLS) == 112
    for key, value in ref.items():
        assert getattr(symbols, key) == value, key


@pytest.mark.parametrize("i", range(len(JP)), ids=[d["text"][:12] for d in JP])
def test_jp_equals_reference(i, jp_tokenizer):
    d = JP[i]
    norm, phones, tones, word2ph = T.clean_text(d["text"], "JP", jp_tokenizer)
    assert norm == d["norm_text"]
    assert phones == d["phones"]
    assert tones == d["tones"]
    assert word2ph == d["word2ph"]
    assert japanese.text_to_sep_kata(norm) == (d["sep_text"], d["sep_kata"])
    # the multilingual model's JP phones (use_jp_extra False): ん as "n"
    assert T.g2p(norm, "JP", jp_tokenizer, use_jp_extra=False)[0] == d["phones_not_jp_extra"]
    ids = T.to_model_inputs(phones, tones, word2ph, "JP", add_blank=False)
    assert (ids.phone_ids, ids.tone_ids, ids.language_ids) == (d["phone_ids"], d["tone_ids"], d["language_ids"])


@pytest.mark.parametrize("i", range(len(EN)), ids=[d["text"][:16] for d in EN])
def test_en_equals_reference(i, en_tokenizer):
    d = EN[i]
    assert en_tokenizer.tokenize(english.normalize_text(d["text"])) == d["bert_tokens"]
    norm, phones, tones, word2ph = T.clean_text(d["text"], "EN", en_tokenizer)
    assert norm == d["norm_text"]
    assert phones == d["phones"]
    assert tones == d["tones"]
    assert word2ph == d["word2ph"]
    ids = T.to_model_inputs(phones, tones, word2ph, "EN", add_blank=False)
    assert (ids.phone_ids, ids.tone_ids, ids.language_ids) == (d["phone_ids"], d["tone_ids"], d["language_ids"])


@pytest.mark.parametrize("language", ["JP", "EN"])
def test_more_sentences_equal_reference(language, jp_tokenizer, en_tokenizer):
    """131 JP / 81 EN sentences of other kinds (empty and punctuation-only text, half-width
    kana, Greek, unreadable characters, dates, phone numbers, currencies, loanword kana;
    money, ordinals, years, contractions)."""
    tok = jp_tokenizer if language == "JP" else en_tokenizer
    entries = EXTRA[language.lower()]
    assert len(entries) >= 60 and not [d for d in entries if "error" in d]
    bad = []
    for d in entries:
        norm, phones, tones, word2ph = T.clean_text(d["text"], language, tok)
        # stored compactly: phones and word2ph space-separated, tones one digit per phone
        if (norm, " ".join(phones), "".join(map(str, tones)), " ".join(map(str, word2ph))) != \
                (d["norm_text"], d["phones"], d["tones"], d["word2ph"]):
            bad.append(d["text"])
    assert not bad, bad


def test_en_fixture_covers_the_neural_fallback():
    """Some fixture pieces are outside the CMU dictionary: they went through g2p_en's model."""
    words = {p.lstrip("▁").upper() for d in EN for p in d["bert_tokens"]} - set(symbols.PUNCTUATIONS)
    oov = sorted(w for w in words if w not in english.cmu_dict())
    assert len(oov) >= 3, oov


def test_add_blank_equals_the_recorded_model_inputs():
    """synth.npz holds the reference's get_text ids (blanks interspersed) and word2ph_blank."""
    a = fx.arrays()
    for variant in fx.VARIANTS:
        for i, case in enumerate(fx.meta()["models"][variant]["cases"]):
            entries = JP if case["language"] == "JP" else EN
            d = next(e for e in entries if e["text"] == case["text"])
            phones = d["phones"] if (variant == "jp_extra" or case["language"] != "JP") else d["phones_not_jp_extra"]
            got = T.to_model_inputs(phones, d["tones"], d["word2ph"], case["language"], add_blank=True)
            k = f"{variant}/{i}"
            assert got.phone_ids == a[f"{k}/phone_ids"].tolist()
            assert got.tone_ids == a[f"{k}/tone_ids"].tolist()
            assert got.language_ids == a[f"{k}/language_ids"].tolist()
            assert sum(got.word2ph) == len(got.phone_ids)
            if f"{k}/word2ph_blank" in a:
                assert got.word2ph == a[f"{k}/word2ph_blank"].tolist()


def test_add_blank_rules():
    ids, tones, langs, w2p = symbols.add_blank([5, 6, 7], [1, 2, 3], [1, 1, 1], [1, 1, 1])
    assert ids == [0, 5, 0, 6, 0, 7, 0] and tones == [0, 1, 0, 2, 0, 3, 0] and langs == [0, 1, 0, 1, 0, 1, 0]
    assert w2p == [3, 2, 2]
    with pytest.raises(ValueError, match="word2ph sums to 2"):
        symbols.add_blank([5, 6, 7], [1, 2, 3], [1, 1, 1], [1, 1])
    with pytest.raises(ValueError, match="not in SBV2's symbol table"):
        symbols.cleaned_text_to_sequence(["xx"], [0], "JP")


def test_threads_give_the_same_results(jp_tokenizer, en_tokenizer):
    """8 threads at once through pyopenjtalk (serialised by one lock) and the EN g2p."""
    serial = [T.clean_text(d["text"], "JP", jp_tokenizer) for d in JP] + \
             [T.clean_text(d["text"], "EN", en_tokenizer) for d in EN]
    jobs = [(d["text"], "JP", jp_tokenizer) for d in JP] + [(d["text"], "EN", en_tokenizer) for d in EN]
    # cold start: the threads also race to build the EN dictionary and model, and to check
    # pyopenjtalk's dictionary
    for f in (english.cmu_dict, english._cmu_first, english.neural_g2p, english._inflect):
        f.cache_clear()
    japanese._pyopenjtalk = None
    start = threading.Barrier(8)

    def run(k: int):
        start.wait()
        # each thread walks the sentences from its own offset, three times
        order = [(k * 7 + j) % len(jobs) for j in range(3 * len(jobs))]
        return [(j, T.clean_text(*jobs[j])) for j in order]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(8)))
    for per_thread in results:
        for j, got in per_thread:
            assert got == serial[j], jobs[j][0]


def test_one_lock_serialises_pyopenjtalk(monkeypatch):
    """Every pyopenjtalk call runs with japanese._LOCK held."""
    import pyopenjtalk

    seen = []
    for name in ("run_frontend", "make_label"):
        real = getattr(pyopenjtalk, name)

        def wrapped(*a, _real=real, **k):
            seen.append(japanese._LOCK.locked())
            return _real(*a, **k)

        monkeypatch.setattr(pyopenjtalk, name, wrapped)

    class OneCharTokenizer:
        def tokenize(self, s):
            return list(s)

    japanese.g2p(japanese.normalize_text("今日はいい天気ですね。"), OneCharTokenizer())
    japanese.text_to_sep_kata("こんにちは")
    assert len(seen) >= 4 and all(seen)


@pytest.mark.parametrize("language", ["FR", "de", "", "KO"])
def test_unsupported_language(language):
    with pytest.raises(T.UnsupportedLanguageError, match="no front end for language"):
        T.clean_text("bonjour", language, tokenizer=None)
    with pytest.raises(ValueError):  # it is a ValueError too
        T.to_model_inputs(["_"], [0], [1], language)


def test_chinese_is_not_built_and_says_so():
    with pytest.raises(T.UnsupportedLanguageError, match="Chinese front end is not built"):
        T.clean_text("你好", "ZH", tokenizer=None)


def test_language_aliases():
    assert T.check_language("ja") == "JP" and T.check_language("en") == "EN"


def test_tokenizer_is_required():
    with pytest.raises(TypeError, match="BERT tokenizer"):
        T.g2p("こんにちは.", "JP", None)


def test_numbers_and_symbols_jp():
    n = japanese.normalize_text
    assert n("1,980円") == "千九百八十円"
    assert n("3.14") == "三点一四"
    assert n("80%") == "八十"
    assert n("$5") == "五ドル"
    assert n("わーい～！") == "わーいー!"
    assert n("「はい」…") == "'はい'..."
    assert n("A—B") == "A-B"


def test_numbers_en():
    n = english.normalize_text
    assert n("In 2024, it was 2.5.") == "In twenty twenty-four, it was two point five."
    assert n("$3.50") == "three dollars, fifty cents"
    assert n("the 1st of 2000") == "the first of two thousand"
