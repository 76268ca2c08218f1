"""voxserve: a fast neural text-to-speech inference engine and server."""

from __future__ import annotations

import os

# The caching allocator with expandable segments suits VITS's changing batch shapes (less
# fragmentation); only a default, and only read when CUDA first allocates.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from .audio import Audio, AudioChunk
from .errors import (
    AudioTooLongError,
    EmptyTextError,
    InvalidInputError,
    InvalidOptionError,
    UnknownSpeakerError,
    UnknownVoiceError,
    UnpronounceableTextError,
    VoiceLoadError,
    VoxserveError,
)
from .limits import Limits
from .options import DETERMINISTIC, SynthesisOptions
from .runtime.options import RuntimeOptions
from .voice import Voice
from .voices.registry import DEFAULT_VOICE, available_voices, register_voice, resolve_voice

__version__ = "0.1.0"

__all__ = [
    "Audio", "AudioChunk", "SynthesisOptions", "RuntimeOptions", "DETERMINISTIC", "Voice",
    "load_voice", "available_voices", "register_voice", "DEFAULT_VOICE",
    "VoxserveError", "InvalidInputError", "InvalidOptionError", "EmptyTextError",
    "UnpronounceableTextError", "UnknownVoiceError", "UnknownSpeakerError", "VoiceLoadError",
    "AudioTooLongError", "Limits",
]


def load_voice(
    name_or_path: str | os.PathLike | None = None,
    device: str = "auto",
    dtype: str | None = None,
    *,
    runtime: RuntimeOptions | None = None,
    max_phonemes: int | None = None,
    limits: Limits | None = None,
) -> Voice:
    """Load a voice by registry name (default: en_US-joe-medium) or by path
    ("bark:DIR" for a local Bark checkpoint directory).

    device: "auto" (CUDA if available, else CPU), "cpu", "cuda" or "cuda:N".
    dtype: None/"fp32"; "bf16" (the decoder in bf16: CUDA, or a CPU with AVX512-BF16/AMX); "fp16" on CUDA.
    runtime: RuntimeOptions for Piper voices; for Bark voices a BarkRuntimeOptions, or a
    RuntimeOptions of which only `offload` and `threads` apply (the rest is VITS-specific).
    limits: how much audio one request may make (voxserve.limits.Limits; default 2 min per
    sentence, 30 min per request).
    """
    limits = (limits or Limits()).validate()
    src = resolve_voice(name_or_path)
    if src.family == "bark":
        from .voices.bark import BarkRuntimeOptions, load_bark_voice

        if isinstance(runtime, RuntimeOptions):
            runtime = BarkRuntimeOptions(offload=runtime.offload, threads=runtime.threads)
        voice = load_bark_voice(src.path, name=src.name, device=device, dtype=dtype, runtime=runtime)
    elif src.family == "piper":
        from .voices.piper import load_piper_voice

        kwargs = {} if max_phonemes is None else {"max_phonemes": max_phonemes}
        voice = load_piper_voice(src.path, src.config_path, name=src.name, device=device, dtype=dtype,
                                 runtime=runtime, **kwargs)
    else:
        raise VoiceLoadError(f"unknown voice family {src.family!r} for {src.name!r}")
    voice.limits = limits
    return voice
