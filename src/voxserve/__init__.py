"""voxserve: a fast neural text-to-speech inference engine and server."""

from __future__ import annotations

import os
from typing import Any

# The caching allocator with expandable segments suits VITS's changing batch shapes (less
# fragmentation); only a default, and only read when CUDA first allocates.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from .audio import Audio, AudioChunk, Word
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
from .families import Family, family_for_source, load_options, register_family, runtime_fields, runtime_options
from .limits import Limits
from .options import DETERMINISTIC, SynthesisOptions
from .voice import Voice
from .voices.registry import DEFAULT_VOICE, available_voices, register_voice, resolve_voice

__version__ = "0.1.0"

__all__ = [
    "Audio", "AudioChunk", "Word", "SynthesisOptions", "DETERMINISTIC", "Voice",
    "load_voice", "available_voices", "register_voice", "DEFAULT_VOICE",
    "VoxserveError", "InvalidInputError", "InvalidOptionError", "EmptyTextError",
    "UnpronounceableTextError", "UnknownVoiceError", "UnknownSpeakerError", "VoiceLoadError",
    "AudioTooLongError", "Limits", "Family", "register_family",
]


def load_voice(
    name_or_path: str | os.PathLike | None = None,
    device: str = "auto",
    dtype: str | None = None,
    *,
    runtime: Any = None,
    max_phonemes: int | None = None,
    limits: Limits | None = None,
    **family_options: Any,
) -> Voice:
    """Load a voice by registry name (default: en_US-joe-medium) or by path (a Piper .onnx,
    or PREFIX:PATH, e.g. "bark:DIR" for a local Bark checkpoint directory). The voice's family
    (voxserve.families) loads it.

    device: "auto" (CUDA if available, else CPU), "cpu", "cuda" or "cuda:N".
    dtype: None/"fp32"; "bf16" (the decoder in bf16: CUDA, or a CPU with AVX512-BF16/AMX); "fp16" on CUDA.
    runtime: how the voice runs, an instance of its family's options type
    (`voxserve.families.get_family(name).options_type`, e.g. PiperRuntimeOptions); a TypeError
    for another family's.
    max_phonemes: Piper voices' longest sentence in phonemes (other families ignore it).
    limits: how much audio one request may make (voxserve.limits.Limits; default 2 min per
    sentence, 30 min per request).
    family_options: keywords that one family takes: its load options
    (`voxserve.families.load_options()`, e.g. `bert_dir=` for Style-Bert-VITS2 voices) and the
    fields of its runtime options (`voxserve.families.runtime_fields()`, e.g. `threads=2`,
    `max_sequences=32`: over `runtime`'s); given to a voice of another family, they are
    ignored; an unknown keyword is a TypeError.
    """
    limits = (limits or Limits()).validate()
    src = resolve_voice(name_or_path)
    family = family_for_source(src)
    known = load_options()
    tunables = runtime_fields()
    for key in family_options:
        if key not in known and key not in tunables:
            raise TypeError(f"load_voice() got an unexpected keyword argument {key!r} (family options: "
                            f"{', '.join(sorted({*known, *tunables})) or 'none'})")
    runtime = runtime_options(family, runtime, **{k: v for k, v in family_options.items() if k in tunables})
    kwargs = {} if max_phonemes is None else {"max_phonemes": max_phonemes}
    mine = {o.name for o in family.load_options}
    kwargs.update({k: v for k, v in family_options.items() if k in mine and v is not None})
    from .runtime.cpu import in_passing_thread

    # on a thread of its own: the caller keeps no OpenMP team an engine's worker would pay for
    voice = in_passing_thread(family.load, src, device=device, dtype=dtype, runtime=runtime, **kwargs)
    voice.limits = limits
    return voice
