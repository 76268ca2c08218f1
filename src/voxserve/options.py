"""Per-request synthesis options. None means "the voice's default"."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from .errors import InvalidOptionError

MAX_TEMPERATURE = 5.0


@dataclass(frozen=True)
class SynthesisOptions:
    speaker: int | str | None = None
    """Speaker id or name (multi-speaker voices); None = the voice's default speaker."""
    speed: float | None = None
    """Speaking rate multiplier (> 0): 2.0 is twice as fast. Divides the voice's length scale."""
    noise_scale: float | None = None
    """Generator noise (>= 0); 0 with noise_w = 0 makes synthesis deterministic."""
    noise_w: float | None = None
    """Phoneme-duration noise (>= 0)."""
    sentence_silence: float | None = None
    """Seconds of silence after each sentence (>= 0) in joined output; default 0."""
    seed: int | None = None
    """Seed for the noise: the same seed gives the same audio, alone or in any batch."""
    temperature: float | None = None
    """Sampling temperature of voices that generate tokens (Bark: its semantic and coarse
    stages; 0 = greedy, which also makes the fine stage greedy: deterministic). VITS voices
    have no token sampling and ignore it (their randomness is noise_scale / noise_w)."""

    def validate(self) -> "SynthesisOptions":
        for name in ("speed", "noise_scale", "noise_w", "sentence_silence", "temperature"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidOptionError(name, f"must be a finite number, got {v!r}")
        if self.speed is not None and self.speed <= 0:
            raise InvalidOptionError("speed", f"must be > 0, got {self.speed}")
        if self.speed is not None and self.speed > 100:
            raise InvalidOptionError("speed", f"must be <= 100, got {self.speed}")
        for name in ("noise_scale", "noise_w", "sentence_silence", "temperature"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise InvalidOptionError(name, f"must be >= 0, got {v}")
        if self.sentence_silence is not None and self.sentence_silence > 60:
            raise InvalidOptionError("sentence_silence", "must be at most 60 seconds")
        if self.temperature is not None and self.temperature > MAX_TEMPERATURE:
            raise InvalidOptionError("temperature", f"must be <= {MAX_TEMPERATURE}, got {self.temperature}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidOptionError("seed", f"must be an integer, got {self.seed!r}")
        if self.speaker is not None and (isinstance(self.speaker, bool) or not isinstance(self.speaker, (int, str))):
            raise InvalidOptionError("speaker", f"must be an id or a name, got {self.speaker!r}")
        return self

    def merged(self, other: "SynthesisOptions | None") -> "SynthesisOptions":
        """Fields set in `other` override ours."""
        if other is None:
            return self
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(other) if getattr(other, f.name) is not None})


DETERMINISTIC = SynthesisOptions(noise_scale=0.0, noise_w=0.0, temperature=0.0)
"""Noise off (VITS) and greedy decoding (Bark): the same text always gives the same samples."""
