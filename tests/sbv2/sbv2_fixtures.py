"""Rebuild the SBV2 reference fixtures' tiny model folders and BERT features without the reference.

tests/fixtures/sbv2/README.md: every tensor is weights.make_state_dict(seed, shapes). The model
folders are written in the real formats (config.json, a safetensors net_g with weight_g/weight_v
and an int64 `iteration`, style_vectors.npy) so the tests load them through the same loader a
user's checkpoint goes through. BERT features for the cases are computed with transformers'
DeBERTa-v2 from the recorded config and seeds; the token ids come from the recorded tokenizer
vocabularies (the JP tokenizer is one token per character; the EN tokens are recorded), so no
sentencepiece is needed.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sbv2"
VARIANTS = ("jp_extra", "multilingual")
JP_BERT = "deberta-v2-large-japanese-char-wwm"
EN_BERT = "deberta-v3-large"
ZH_BERT = "chinese-roberta-wwm-ext-large"


def weights_module():
    spec = importlib.util.spec_from_file_location("sbv2_fixture_weights", FIX / "weights.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@lru_cache(maxsize=1)
def meta() -> dict:
    return json.loads((FIX / "synth.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def frontend() -> dict:
    return json.loads((FIX / "frontend.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def arrays() -> dict[str, np.ndarray]:
    with np.load(FIX / "synth.npz") as z:
        return {k: z[k] for k in z.files}


def write_model_folder(variant: str, out: Path) -> Path:
    """The user's model folder for `variant`, rebuilt from seeds: config.json, tiny.safetensors,
    style_vectors.npy."""
    from safetensors.torch import save_file

    m = meta()["models"][variant]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(m["config"], indent=2, ensure_ascii=False), encoding="utf-8")
    tensors = weights_module().make_state_dict(m["weights_seed"], m["safetensors_keys"])
    st = {k: torch.from_numpy(v) for k, v in tensors.items()}
    st["iteration"] = torch.tensor([1000], dtype=torch.int64)
    save_file(st, str(out / "tiny.safetensors"))
    np.save(out / "style_vectors.npy", arrays()[f"{variant}/style_vectors"])
    return out


def _frontend_entry(text: str, language: str) -> dict:
    for d in frontend()[language.lower()]:
        if d["text"] == text:
            return d
    raise KeyError((text, language))


def word2ph_blank(text: str, language: str) -> list[int]:
    w2p = [2 * w for w in _frontend_entry(text, language)["word2ph"]]
    w2p[0] += 1
    return w2p


def bert_input_ids(text: str, language: str) -> list[int]:
    d = _frontend_entry(text, language)
    if language == "JP":
        vocab = {t: i for i, t in enumerate(frontend()["jp_bert_vocab"])}
        chars = "".join(d["sep_text"])  # SBV2's BERT input: the readable words joined
        return [vocab["[CLS]"]] + [vocab.get(c, vocab["[UNK]"]) for c in chars] + [vocab["[SEP]"]]
    pieces = {t: i for i, t in enumerate(frontend()["en_spm_pieces"])}
    return [pieces["[CLS]"]] + [pieces[t] for t in d["bert_tokens"]] + [pieces["[SEP]"]]


@lru_cache(maxsize=2)
def bert_model(name: str):
    import transformers

    b = meta()["bert"][name]
    cfg = transformers.DebertaV2Config(**b["config"])
    model = getattr(transformers, b["class"])(cfg).eval()
    tensors = weights_module().make_state_dict(b["seed"], b["parameters"])
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(torch.from_numpy(tensors[k]))
    return model


def build_bert(name: str):
    """A fixture BERT from its recorded config and seed (DeBERTa-v2 for JP/EN, BERT for ZH)."""
    import transformers

    if name != ZH_BERT:
        return bert_model(name)
    b = meta()["bert"][name]
    model = getattr(transformers, b["class"])(transformers.BertConfig(**b["config"])).eval()
    tensors = weights_module().make_state_dict(b["seed"], b["parameters"])
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(torch.from_numpy(tensors[k]))
    return model


def write_bert_root(root: Path, names=(JP_BERT, EN_BERT, ZH_BERT)) -> Path:
    """BERT_ROOT with the fixture BERTs' folders as SBV2 names them: config, weights, tokenizer."""
    for name in names:
        b = meta()["bert"][name]
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        build_bert(name).save_pretrained(d)
        for f, v in b["tokenizer_files"].items():
            if "text" in v:
                (d / f).write_text(v["text"], encoding="utf-8")
            else:
                (d / f).write_bytes(base64.b64decode(v["base64"]))
    return root


def bert_hidden_m3(text: str, language: str) -> np.ndarray:
    """hidden_states[-3] of the tiny BERT for the sentence: [tokens, 1024]."""
    model = bert_model(JP_BERT if language == "JP" else EN_BERT)
    ids = torch.tensor([bert_input_ids(text, language)])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    return out.hidden_states[-3][0].numpy()


def phone_level_bert(text: str, language: str) -> np.ndarray:
    """What enters the synthesizer: each token's vector repeated word2ph_blank times -> [1024, T]."""
    return np.repeat(bert_hidden_m3(text, language), word2ph_blank(text, language), axis=0).T


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    variant: str
    index: int
    meta: dict
    phone_ids: np.ndarray  # [T] int64
    tone_ids: np.ndarray
    language_ids: np.ndarray
    bert: np.ndarray  # [1024, T], the case's language's features
    style_vec: np.ndarray  # [256]
    wave: np.ndarray  # the reference's output
    durations: np.ndarray

    @property
    def language(self) -> str:
        return self.meta["language"]


def case_bert(variant: str, i: int, c: dict) -> np.ndarray:
    """Case 0's features come from the fixture; the others from the rebuilt tiny BERT."""
    a = arrays()
    k = f"{variant}/{i}"
    if f"{k}/bert_phone_level" in a:
        return a[f"{k}/bert_phone_level"]
    if f"{k}/bert_hidden_m3" in a:
        return np.repeat(a[f"{k}/bert_hidden_m3"], a[f"{k}/word2ph_blank"], axis=0).T
    pytest.importorskip("transformers")
    return phone_level_bert(c["text"], c["language"])


def with_bert(case: Case) -> Case:
    if case.bert is None:
        case.bert = case_bert(case.variant, case.index, case.meta)
    return case


def batch_inputs(cases: list[Case], style_vecs: list[np.ndarray] | None = None) -> dict:
    """Padded [B, T] inputs (0 = pad, as SBV2's blank) and per-language BERT [B, 1024, T]."""
    b = len(cases)
    t = max(len(c.phone_ids) for c in cases)
    x = torch.zeros(b, t, dtype=torch.long)
    tone = torch.zeros_like(x)
    lang = torch.zeros_like(x)
    bert: dict[str, torch.Tensor] = {}
    for i, c in enumerate(cases):
        n = len(c.phone_ids)
        x[i, :n] = torch.from_numpy(c.phone_ids)
        tone[i, :n] = torch.from_numpy(c.tone_ids)
        lang[i, :n] = torch.from_numpy(c.language_ids)
        feats = bert.setdefault(c.language, torch.zeros(b, 1024, t))
        feats[i, :, :n] = torch.from_numpy(with_bert(c).bert)
    svs = style_vecs if style_vecs is not None else [c.style_vec for c in cases]
    return dict(
        x=x, x_lengths=torch.tensor([len(c.phone_ids) for c in cases]), tone=tone, language=lang, bert=bert,
        style_vec=torch.from_numpy(np.stack(svs)), sid=torch.tensor([c.meta["sid"] for c in cases]),
        length_scale=[c.meta["length_scale"] for c in cases],
    )


def sdp_cases(cases: list[Case]) -> list[Case]:
    """The variant's stochastic-duration-predictor cases (synth.json `sdp_cases`, noise 0,
    sdp_ratio > 0): the inputs of case `source` (its BERT features too), with the reference's
    durations and wave for that sdp_ratio (`VARIANT/sdp/J/...`)."""
    if not cases:
        return []
    variant = cases[0].variant
    a = arrays()
    out = []
    for j, c in enumerate(meta()["models"][variant].get("sdp_cases", [])):
        src = cases[c["source"]]
        out.append(replace(src, meta={**src.meta, **c}, wave=a[f"{variant}/sdp/{j}/wave"],
                           durations=a[f"{variant}/sdp/{j}/durations"]))
    return out
