"""The Bark family: a local `transformers` Bark checkpoint directory (`bark:DIR`), run as a step
runner (step.py: BarkStepRunner, sentences joining and leaving between decode steps over
runtime/step.py), or with CPU offload by BarkRunner (runner.py: semantic -> coarse -> fine ->
EnCodec, one generate call per batch).

Modules: options (BarkRuntimeOptions, BarkVoiceConfig), synthesis (BarkOptions: what a request
says), voice (BarkVoice, load_bark_voice, its
text front end and checkpoint checks), model (attention), runner, step. transformers (the `bark` extra) is
imported only when a voice loads.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import VoiceLoadError
from .. import Family, VoiceSource, register_family
from .options import BarkRuntimeOptions, BarkVoiceConfig
from .synthesis import BarkOptions

NAME = "bark"


def _source(path: Path, name: str | None = None) -> VoiceSource:
    return VoiceSource(name or str(path), NAME, path)


def _hint(path: Path) -> str | None:
    """A checkpoint directory given without its prefix."""
    cfg = path.expanduser() / "config.json"
    try:
        bark = cfg.is_file() and json.loads(cfg.read_text(encoding="utf-8")).get("model_type") == "bark"
    except (OSError, ValueError, AttributeError):
        bark = False
    if bark:
        return f"{path} is a directory: for a Bark checkpoint use --voice bark:{path}"
    return None


def _describe(src: VoiceSource) -> dict:
    from .voice import language_codes, preset_names  # the voice's code only when asked (CLI start-up)

    try:
        cfg = json.loads((src.path / "config.json").read_text(encoding="utf-8"))
        presets = preset_names(src.path)
        return {"languages": language_codes(presets),
                "sample_rate": (cfg.get("codec_config") or {}).get("sampling_rate"), "speakers": presets}
    except (OSError, ValueError, AttributeError, TypeError, VoiceLoadError):
        return {"error": "unreadable config"}


def _load(src: VoiceSource, *, device="auto", dtype=None, runtime=None, **_):
    """`runtime`: a BarkRuntimeOptions or None. Other load_voice options (max_phonemes) do not
    apply to Bark."""
    from .voice import load_bark_voice  # the voice's code only when one loads (CLI start-up)

    return load_bark_voice(src.path, name=src.name, device=device, dtype=dtype, runtime=runtime)


FAMILY = register_family(Family(
    name=NAME,
    load=_load,
    options_type=BarkRuntimeOptions,
    synthesis_options=BarkOptions,
    source=_source,
    prefix="bark",
    hint=_hint,
    describe=_describe,
    frontend="normalise (keeping ♪), split into sentences of at most ~10 s, Bark's BERT tokenizer",
    runner_kind="step",
))

__all__ = ["FAMILY", "BarkOptions", "BarkRuntimeOptions", "BarkVoiceConfig"]
