"""How much audio one request may make: the work bound every voice applies.

Option ranges (options.py) bound each sentence's rate; these bound what a request can ask for
in total, so that no input makes a voice allocate without limit. A sentence over its limit is
refused once its length is known, before the stages that allocate per frame run; a request is
refused as soon as its predicted audio, or the audio it has made so far, passes its limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import AudioTooLongError

MAX_SENTENCE_AUDIO_SECONDS = 3600.0
MAX_AUDIO_SECONDS = 86400.0


@dataclass(frozen=True)
class Limits:
    max_sentence_audio_seconds: float = 120.0
    """One sentence longer than this (2 min: over 300 words at a normal rate) is refused."""
    max_audio_seconds: float | None = 1800.0
    """A request whose audio would pass this (30 min) is refused; None: no limit (for a
    stream written to a file, whose memory stays bounded by one batch)."""

    def validate(self) -> "Limits":
        _check("max_sentence_audio_seconds", self.max_sentence_audio_seconds, MAX_SENTENCE_AUDIO_SECONDS)
        if self.max_audio_seconds is not None:
            _check("max_audio_seconds", self.max_audio_seconds, MAX_AUDIO_SECONDS)
        return self

    def max_sentence_samples(self, sample_rate: int) -> int:
        return int(math.floor(self.max_sentence_audio_seconds * sample_rate))

    def check_request(self, seconds: float, predicted: bool = False) -> None:
        """Raises AudioTooLongError if a request's audio (made, or predicted) passes its limit."""
        if self.max_audio_seconds is not None and seconds > self.max_audio_seconds:
            what = "the request (predicted)" if predicted else "the request"
            raise AudioTooLongError(what, seconds, self.max_audio_seconds, "max_audio_seconds")

    def sentence_error(self, seconds: float) -> AudioTooLongError:
        return AudioTooLongError("a sentence", seconds, self.max_sentence_audio_seconds, "max_sentence_audio_seconds")


def _check(name: str, value: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= hi:
        raise ValueError(f"{name} must be a number of seconds in (0, {hi:g}], got {value!r}")


DEFAULT_LIMITS = Limits()
