"""The CosyVoice 2 family: an LLM-based TTS. A Qwen2 language model makes speech tokens (25 a
second) from the text and a speaker's prompt, a flow-matching decoder turns them into mel
frames, and the HiFT vocoder into 24 kHz audio.

Voices: a model folder as users download it (`cosyvoice2:DIR`: cosyvoice2.yaml, llm.pt,
flow.pt, hift.pt, CosyVoice-BlankEN/, campplus.onnx, speech_tokenizer_v2.onnx, optional
spk2info.pt), whose speakers are spk2info's; and saved zero-shot voices (`NAME.cosyvoice2/`
folders made by `voxserve voices add` or `store.save_voice`), found in the voice folders.

Modules: config (cosyvoice2.yaml as data), llm / flow / hift (the models), sampling (upstream's
repetition-aware sampling), tokenizer, frontend (prompt features through the ONNX models),
pipeline (CosyModel: the three models on one device), schedule (a request's chunk schedule),
runner (CosyStepRunner: continuous batching + chunked token2wav), voice, store (saved voices),
loader (folder.py: the folder's files), options (languages, CosyRuntimeOptions), synthesis
(CosyOptions: what a request says). See docs/cosyvoice2.md.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import VoiceLoadError
from .. import Family, VoiceSource, register_family
from .options import LANGUAGE_CODES, CosyRuntimeOptions
from .synthesis import CosyOptions

NAME = "cosyvoice2"
def _source(path: Path, name: str | None = None) -> VoiceSource:
    return VoiceSource(name or path.name.removesuffix(".cosyvoice2"), NAME, path)


def _is_model_folder(path: Path) -> bool:
    return (path.expanduser() / "cosyvoice2.yaml").is_file()


def _hint(path: Path) -> str | None:
    if _is_model_folder(path):
        return f"{path} is a CosyVoice 2 model folder: use --voice cosyvoice2:{path}"
    return None


def _check(src: VoiceSource) -> None:
    from .folder import check_folder
    from .store import is_saved_voice

    if is_saved_voice(src.path):
        return
    check_folder(src.path)


def _scan(folder: Path):
    from .store import scan

    return scan(folder)


def _describe(src: VoiceSource) -> dict:
    from .store import is_saved_voice, read_voice_info

    info: dict = {"sample_rate": 24000, "languages": list(LANGUAGE_CODES)}
    if is_saved_voice(src.path):
        try:
            meta = read_voice_info(src.path)
        except VoiceLoadError as e:
            return {"error": str(e)}
        info["model"] = meta["model"]
    return info


def _load(src: VoiceSource, *, device="auto", dtype=None, runtime=None, **_):
    """`runtime`: a CosyRuntimeOptions or None."""
    from .loader import load_cosyvoice2_voice

    runtime = (runtime or CosyRuntimeOptions()).validate()
    return load_cosyvoice2_voice(src.path, name=src.name, device=device, dtype=dtype, runtime=runtime)


def _add_voice(model: VoiceSource, name: str, prompt_wav: Path, prompt_text: str, folder: Path) -> Path:
    from .store import add_voice

    return add_voice(model.path, name, prompt_wav, prompt_text, folder)


FAMILY = register_family(Family(
    name=NAME,
    load=_load,
    options_type=CosyRuntimeOptions,
    synthesis_options=CosyOptions,
    source=_source,
    prefix="cosyvoice2",
    check=_check,
    describe=_describe,
    scan=_scan,
    hint=_hint,
    frontend="normalise (English: numbers and the like read out), split into sentences of at most "
             "80 Qwen tokens, Qwen2 BPE tokens; the speaker's prompt as speech tokens, mel and embedding",
    runner_kind="step",
    add_voice=_add_voice,
))

__all__ = ["FAMILY", "CosyOptions", "CosyRuntimeOptions"]
