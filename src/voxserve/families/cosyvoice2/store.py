"""Saved CosyVoice 2 voices: a zero-shot speaker computed once from a recording, kept as a
folder `NAME.cosyvoice2/` in a voice folder (the user data dir's `voices/`, or one of
$VOXSERVE_VOICES_PATH), which the family's scan finds:

    voice.json   {"format": "voxserve-cosyvoice2-voice", "version": 1, "name", "model": the
                  model folder (absolute), "prompt_text"}
    prompt.npz   the prompt's speech tokens, mel frames and speaker embedding (frontend.save_prompt:
                  plain arrays, no pickle)

Loading one loads (or reuses) its model folder's model and makes a voice of that name whose
default speaker is the prompt.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...errors import VoiceLoadError
from .. import VoiceSource
from .folder import check_folder, prompt_encoder
from .frontend import load_prompt, save_prompt
from ...voices.registry import check_name

FORMAT = "voxserve-cosyvoice2-voice"
SUFFIX = ".cosyvoice2"
MAX_INFO_BYTES = 64 * 1024
MAX_PROMPT_TEXT = 2000


def is_saved_voice(path: Path) -> bool:
    return (path / "voice.json").is_file() and (path / "prompt.npz").is_file()


def read_voice_info(path: Path) -> dict:
    f = path / "voice.json"
    try:
        if f.stat().st_size > MAX_INFO_BYTES:
            raise VoiceLoadError(f"{f}: larger than {MAX_INFO_BYTES} bytes")
        meta = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise VoiceLoadError(f"{f}: unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != 1:
        raise VoiceLoadError(f"{f}: not a voxserve CosyVoice 2 voice (format {FORMAT!r}, version 1)")
    for key in ("name", "model", "prompt_text"):
        if not isinstance(meta.get(key), str):
            raise VoiceLoadError(f"{f}: `{key}` is missing or not a string")
    return meta


def scan(folder: Path):
    for d in sorted(folder.glob(f"*{SUFFIX}")):
        if d.is_dir() and is_saved_voice(d):
            yield VoiceSource(d.name[: -len(SUFFIX)], "cosyvoice2", d)


def save_voice(folder: Path, name: str, model_dir: Path, features) -> Path:
    """Write `folder/NAME.cosyvoice2/` for prompt `features` (frontend.PromptFeatures) of the
    model at `model_dir`; an existing voice of that name is replaced."""
    check_name(name)
    if len(features.prompt_text) > MAX_PROMPT_TEXT:
        raise ValueError(f"the prompt text is over {MAX_PROMPT_TEXT} characters")
    out = Path(folder) / f"{name}{SUFFIX}"
    out.mkdir(parents=True, exist_ok=True)
    save_prompt(out / "prompt.npz", features)
    info = {"format": FORMAT, "version": 1, "name": name, "model": str(Path(model_dir).expanduser().resolve()),
            "prompt_text": features.prompt_text}
    tmp = out / "voice.json.tmp"
    tmp.write_text(json.dumps(info, ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(out / "voice.json")
    return out


def read_recording(path: Path):
    """(mono float32 samples, sample rate) of an audio file (WAV, FLAC, OGG: what soundfile reads)."""
    import soundfile

    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError, soundfile.LibsndfileError) as e:
        raise ValueError(f"cannot read the recording {path}: {e}") from None
    return np.ascontiguousarray(data.mean(axis=1), dtype=np.float32), int(rate)


def load_saved(path: Path):
    """(model folder, PromptFeatures) of a saved voice."""
    meta = read_voice_info(path)
    try:
        features = load_prompt(path / "prompt.npz")
    except (OSError, ValueError) as e:
        raise VoiceLoadError(str(e)) from None
    return Path(meta["model"]), replace(features, prompt_text=meta["prompt_text"])


def add_voice(model_dir: Path, name: str, prompt_wav: Path, prompt_text: str, folder: Path) -> Path:
    """`voxserve voices add`: the prompt's features from the recording (through the model
    folder's ONNX models), saved as a voice in `folder`."""
    check_name(name)
    model_dir = Path(model_dir).expanduser()
    check_folder(model_dir)
    wave, rate = read_recording(prompt_wav)
    features = replace(prompt_encoder(model_dir).encode(wave, rate), prompt_text=prompt_text)
    return save_voice(folder, name, model_dir, features)
