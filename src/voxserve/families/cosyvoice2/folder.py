"""The files of a CosyVoice 2 model folder (loader.py lists them): which are required, the ONNX
models that prompts from recordings need, and reading a state dict with the offending file named."""

from __future__ import annotations

from pathlib import Path

from ...errors import VoiceLoadError
from .frontend import PromptEncoder

REQUIRED = ("cosyvoice2.yaml", "llm.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN/config.json")
PROMPT_MODELS = ("campplus.onnx", "speech_tokenizer_v2.onnx")


def check_folder(path: Path) -> None:
    """Raise VoiceLoadError naming every required file the folder lacks."""
    d = Path(path).expanduser()
    if not d.is_dir():
        raise VoiceLoadError(f"{d}: not a folder (a CosyVoice 2 model is a folder: cosyvoice2.yaml, llm.pt, ...)")
    missing = [f for f in REQUIRED if not (d / f).is_file()]
    if missing:
        raise VoiceLoadError(f"{d}: not a complete CosyVoice 2 model folder: missing {', '.join(missing)}")


def prompt_encoder(path: Path):
    """The folder's PromptEncoder (CAM++ and the speech tokenizer through onnxruntime)."""
    d = Path(path).expanduser()
    missing = [f for f in PROMPT_MODELS if not (d / f).is_file()]
    if missing:
        raise VoiceLoadError(f"{d}: voices from recordings need {', '.join(missing)}, which the folder lacks")
    return PromptEncoder(d / "speech_tokenizer_v2.onnx", d / "campplus.onnx")


def load_state_dict(path: Path) -> dict:
    import torch

    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several kinds for a corrupt or pickled file
        raise VoiceLoadError(f"{path}: cannot read the state dict ({type(e).__name__}: {e})") from None
    if not isinstance(sd, dict) or not all(isinstance(k, str) for k in sd):
        raise VoiceLoadError(f"{path}: not a state dict (a mapping of tensor names to tensors)")
    return sd
