"""Per-request synthesis options. None means "the voice's default".

Every option has one rule, in its field's metadata, checked once by `validate()`; the CLI
flags and their help derive from the same metadata, and the HTTP server passes values through
to `validate()`, so the library, the CLI and HTTP apply the same bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from .errors import InvalidOptionError

MAX_SEED = (1 << 63) - 1
MAX_SPEAKER_ID = (1 << 31) - 1
MAX_SPEAKER_NAME = 200


def _number(lo: float, hi: float, help: str, unit: str = "") -> dict:
    return {"range": (lo, hi), "unit": unit, "help": help}


@dataclass(frozen=True)
class SynthesisOptions:
    speaker: int | str | None = field(default=None, metadata={
        "help": "speaker id or name (multi-speaker voices)"})
    """Speaker id or name (multi-speaker voices); None = the voice's default speaker."""
    speed: float | None = field(default=None, metadata=_number(
        0.25, 4.0, "speaking rate multiplier, e.g. 1.25"))
    """Speaking rate multiplier: 2.0 is twice as fast. Divides the voice's length scale."""
    noise_scale: float | None = field(default=None, metadata=_number(
        0.0, 2.0, "generator noise (0 = deterministic with --noise-w 0)"))
    """Generator noise; 0 with noise_w = 0 makes synthesis deterministic."""
    noise_w: float | None = field(default=None, metadata=_number(
        0.0, 1.5, "phoneme-duration noise"))
    """Phoneme-duration noise. It enters the durations through an exponential, so its range is
    narrow: voices are trained at 0.8; at 2 a sentence can come out several times its length."""
    sentence_silence: float | None = field(default=None, metadata=_number(
        0.0, 10.0, "silence after each sentence", "s"))
    """Seconds of silence after each sentence in joined output; default 0."""
    seed: int | None = field(default=None, metadata={
        "range": (0, MAX_SEED), "help": "noise seed for reproducible output"})
    """Seed for the noise: the same seed gives the same audio, alone or in any batch."""
    temperature: float | None = field(default=None, metadata=_number(
        0.0, 5.0, "sampling temperature of token-generating voices (Bark); 0 = greedy"))
    """Sampling temperature of voices that generate tokens (Bark: its semantic and coarse
    stages; 0 = greedy, which also makes the fine stage greedy: deterministic). VITS voices
    have no token sampling and ignore it (their randomness is noise_scale / noise_w)."""

    def validate(self) -> "SynthesisOptions":
        """Check every set field against its rule; InvalidOptionError names the first bad one."""
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                check_option(f.name, v)
        return self

    def merged(self, other: "SynthesisOptions | None") -> "SynthesisOptions":
        """Fields set in `other` override ours."""
        if other is None:
            return self
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(other) if getattr(other, f.name) is not None})


def option_range(name: str) -> tuple[float, float] | None:
    """(lo, hi), both inclusive, of a numeric option; None for speaker."""
    return _FIELDS[name].metadata.get("range")


def option_help(name: str) -> str:
    """A flag's help text, with its range."""
    meta = _FIELDS[name].metadata
    rng = meta.get("range")
    if rng is None or name == "seed":
        return meta["help"]
    unit = f" {meta['unit']}" if meta.get("unit") else ""
    return f"{meta['help']} ({rng[0]:g}-{rng[1]:g}{unit})"


def check_option(name: str, value: object) -> None:
    """The one rule of option `name`; raises InvalidOptionError."""
    if name == "speaker":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise InvalidOptionError(name, f"must be an id or a name, got {value!r}")
        if isinstance(value, int) and not 0 <= value <= MAX_SPEAKER_ID:
            raise InvalidOptionError(name, f"an id must be between 0 and {MAX_SPEAKER_ID}, got {value}")
        if isinstance(value, str) and not 0 < len(value) <= MAX_SPEAKER_NAME:
            raise InvalidOptionError(name, f"a name must have 1 to {MAX_SPEAKER_NAME} characters")
        return
    lo, hi = _FIELDS[name].metadata["range"]
    if name == "seed":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidOptionError(name, f"must be an integer, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidOptionError(name, f"must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        unit = _FIELDS[name].metadata.get("unit", "")
        raise InvalidOptionError(name, f"must be between {lo:g} and {hi:g}{' ' + unit if unit else ''}, got {value!r}")


_FIELDS = {f.name: f for f in fields(SynthesisOptions)}

DETERMINISTIC = SynthesisOptions(noise_scale=0.0, noise_w=0.0, temperature=0.0)
"""Noise off (VITS) and greedy decoding (Bark): the same text always gives the same samples."""
