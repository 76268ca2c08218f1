"""The tiny CosyVoice 2 model folder rebuilt from the recorded fixture (no reference needed):
every weight from weights.py's seeds, in the files and layout users download."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cosyvoice2"
if str(FIX) not in sys.path:
    sys.path.insert(0, str(FIX))
import tiny  # noqa: E402
import weights  # noqa: E402


def _script():
    spec = importlib.util.spec_from_file_location("cv2_make_reference", FIX / "make_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def meta() -> dict:
    return json.loads((FIX / "reference.json").read_text(encoding="utf-8"))


@functools.cache
def arrays() -> dict[str, np.ndarray]:
    with np.load(FIX / "reference.npz") as z:
        return {k: z[k] for k in z.files}


def state_dict(part: str) -> dict:
    """The tensors of llm.pt / flow.pt / hift.pt, as torch tensors."""
    import torch

    m = meta()
    sd = {k: torch.from_numpy(v) for k, v in weights.make_state_dict(m["weights_seeds"][part], m["shapes"][part]).items()}
    for key, src in (m["tied"].items() if part == "llm" else ()):
        sd[key] = sd[src].clone()
    return sd


def write_model_folder(d: Path, speakers: dict | None = None, encoder_chunk: int = 0) -> Path:
    """The tiny folder (cosyvoice2.yaml, llm.pt, flow.pt, hift.pt, CosyVoice-BlankEN/);
    speakers: name -> spk2info entry, written as spk2info.pt. encoder_chunk: the flow
    encoder's static_chunk_size (CosyVoice2-0.5B has 25; the recorded reference has none)."""
    import torch
    import transformers

    d = Path(d)
    blank = d / "CosyVoice-BlankEN"
    _script().write_tokenizer(blank)
    transformers.Qwen2Config(**meta()["qwen"]).save_pretrained(blank)
    (d / "cosyvoice2.yaml").write_text(tiny.yaml_text(encoder_chunk=encoder_chunk), encoding="utf-8")
    for part in ("llm", "flow", "hift"):
        torch.save(state_dict(part), d / f"{part}.pt")
    if speakers:
        torch.save(speakers, d / "spk2info.pt")
    return d


def prompt_entry() -> dict:
    """A saved speaker as upstream's spk2info.pt holds one (zero-shot fields), from the fixture's prompt."""
    import torch

    a = arrays()
    return {"prompt_text": torch.tensor([[40, 83, 220, 72, 82]], dtype=torch.int32),
            "llm_prompt_speech_token": torch.from_numpy(a["flow/prompt_token"][None].astype(np.int32)),
            "flow_prompt_speech_token": torch.from_numpy(a["flow/prompt_token"][None].astype(np.int32)),
            "prompt_speech_feat": torch.from_numpy(a["flow/prompt_feat"][None]),
            "llm_embedding": torch.from_numpy(a["flow/embedding"][None]),
            "flow_embedding": torch.from_numpy(a["flow/embedding"][None])}


def assert_same_audio(got, ref):
    # batch-level float noise in the mel (~5e-7) grows through HiFT's accumulated phase to a
    # few 1e-3 at a handful of samples; the error's RMS stays at the 1e-5 level
    assert len(got) == len(ref)
    err = np.abs(np.asarray(got, np.float64) - ref)
    assert err.max() < 1e-2 and np.sqrt(np.mean(err**2)) < 1e-4, (err.max(), np.sqrt(np.mean(err**2)))
