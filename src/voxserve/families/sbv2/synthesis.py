"""What a Style-Bert-VITS2 voice takes per request (`Sbv2Options`, the family's
`synthesis_options`): the common options, VITS's noise and SBV2's style, duration predictor
mix and language. Plain dataclasses, importable without torch."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import (
    MAX_SPEAKER_NAME,
    NOISE_SCALE,
    NOISE_W,
    SynthesisOptions,
    id_or_name,
    name_field,
    number,
    option,
)

MAX_STYLE_ID = 1023


@dataclass(frozen=True)
class Sbv2Options(SynthesisOptions):
    noise_scale: float | None = option(NOISE_SCALE)
    """None = SBV2's default, 0.6."""
    noise_w: float | None = option(NOISE_W)
    """None = SBV2's default, 0.8."""
    style: int | str | None = id_or_name(MAX_STYLE_ID, MAX_SPEAKER_NAME, "style id or name")
    """None = the voice's default style ("Neutral" where the voice has it)."""
    style_weight: float | None = number(0.0, 20.0, "strength of the style; 1 = as trained")
    """The style vector is mean + (vector[style] - mean) * style_weight; SBV2's own range."""
    sdp_ratio: float | None = number(0.0, 1.0, "share of the stochastic duration predictor")
    """Durations mix the stochastic (sdp_ratio) and the deterministic predictor (1 - sdp_ratio)."""
    language: str | None = name_field(8, "language of the text, for voices that speak several (JP, EN)")
    """None = the voice's own language; a voice refuses one it cannot speak (400)."""

    @classmethod
    def deterministic(cls) -> "Sbv2Options":
        return cls(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)
