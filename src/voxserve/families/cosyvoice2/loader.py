"""Loading a CosyVoice 2 model folder as users download it (CosyVoice2-0.5B):

    cosyvoice2.yaml           the three models' arguments (config.py reads it as data)
    llm.pt flow.pt hift.pt    their state dicts (torch.save; read with weights_only=True)
    CosyVoice-BlankEN/        the Qwen2 backbone's config.json and the text tokenizer's files
    campplus.onnx             speaker embedding model (for prompts from recordings)
    speech_tokenizer_v2.onnx  speech tokenizer (for prompts from recordings)
    spk2info.pt               optional: saved speakers

One CosyModel per (folder, device, dtype) in a process: every voice of a folder (the folder's
own, saved voices) shares it and its step runner.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from ...runtime.device import resolve_device
from .folder import check_folder
from .options import CosyRuntimeOptions
from .pipeline import load_model
from .runner import CosyStepRunner
from .store import is_saved_voice, load_saved
from .voice import CosyVoice2Voice

SPEAKERS = "spk2info.pt"

_models: dict[tuple, tuple] = {}  # (folder, device, dtype) -> (CosyModel, CosyStepRunner)
_models_lock = threading.Lock()


def shared_model(path: Path, device: str, dtype: str | None, runtime):
    """(CosyModel, CosyStepRunner) of a folder on a device, loaded once per process."""
    d = Path(os.path.abspath(Path(path).expanduser()))
    key = (str(d), device, dtype, runtime.streaming)
    with _models_lock:
        if key not in _models:
            check_folder(d)
            model = load_model(d, device=device, dtype=dtype)
            _models[key] = (model, CosyStepRunner(model, capacity=runtime.max_sequences, streaming=runtime.streaming))
        return _models[key]


def load_cosyvoice2_voice(path: str | os.PathLike, name: str | None = None, device: str = "auto",
                          dtype: str | None = None, runtime=None):
    """A model folder's voice (speakers: spk2info.pt's) or a saved voice (store.py)."""
    runtime = (runtime or CosyRuntimeOptions()).validate()
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    p = Path(path).expanduser()
    device = str(resolve_device(device))  # and on CUDA, fp32 without TF32 (docs/precision.md)
    if is_saved_voice(p):
        model_dir, features = load_saved(p)
        model, runner = shared_model(model_dir, device, dtype, runtime)
        vname = name or p.name.removesuffix(".cosyvoice2")
        prompts = {vname: model.prompt_from_features(vname, features)}
        return CosyVoice2Voice(vname, model, prompts, vname, runner)
    model, runner = shared_model(p, device, dtype, runtime)
    prompts = model.saved_speakers()
    vname = name if name and Path(name).expanduser() != p else Path(os.path.abspath(p)).name
    return CosyVoice2Voice(vname, model, prompts, next(iter(sorted(prompts)), None), runner)
