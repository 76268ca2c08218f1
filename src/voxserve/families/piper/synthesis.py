"""What a Piper voice takes per request (`PiperOptions`, the family's `synthesis_options`):
the common options and VITS's noise, the text front end's normalisation and input format.
Plain dataclasses, importable without torch (the CLI builds its flags from them)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import NOISE_SCALE, NOISE_W, NORMALIZE, SynthesisOptions, name_field, option


@dataclass(frozen=True)
class PiperOptions(SynthesisOptions):
    noise_scale: float | None = option(NOISE_SCALE)
    """None = the voice's config (`inference.noise_scale`, usually 0.667)."""
    noise_w: float | None = option(NOISE_W)
    """None = the voice's config (usually 0.8)."""
    normalize: bool | None = option(NORMALIZE)
    """None = true: the voice speaks `voxserve.text.normalize_text`'s form of the text (English
    voices; others read the text as they always do)."""
    input_format: str | None = name_field(8, "what the input is: text, or ssml; default: ssml if it starts with <speak")
    """None = auto: SSML (`voxserve.text.ssml`) when the input starts with a `<speak>` element,
    else plain text."""

    @classmethod
    def deterministic(cls) -> "PiperOptions":
        return cls(noise_scale=0.0, noise_w=0.0)
