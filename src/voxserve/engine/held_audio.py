"""Audio held in memory by whole answers, across the server: a budget in bytes.

A whole (not streamed) answer keeps every sample of its request until the last sentence is made,
then joins and encodes them. Its audio is not device work (SSML breaks and sentence silence cost
none), so admission by time does not see it: `<speak>hi` + 179 ten-second breaks made a 1790 s
answer in 5 s and 12 of them at once took the server from 0.6 to 2.9 GB (issue 49). This ledger
charges each whole answer the audio it will make, silence included, when it is admitted, and what
it really holds if that grows past the prediction; a request that would pass the budget waits
outside (429 with Retry-After), one that alone is over it is refused (413). Streamed answers hold
one piece at a time and are not charged.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from ..errors import AudioTooLongError, OverloadedError

# What one sample of a whole answer costs at its peak: the float32 sentences, their joined float32
# copy, and the encoded file (16-bit PCM for WAV; a compressed format holds less).
HELD_BYTES_PER_SAMPLE = 10


class HeldAudio:
    """The bytes charged to each whole answer in flight, against `budget_bytes`. Thread safe:
    the event loop admits, the engine's threads report what arrives."""

    def __init__(self, budget_bytes: int):
        if budget_bytes <= 0:
            raise ValueError(f"the held-audio budget must be over 0 bytes, not {budget_bytes!r}")
        self.budget_bytes = int(budget_bytes)
        self._charged: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Whole answers charged now."""
        with self._lock:
            return len(self._charged)

    @property
    def charged(self) -> int:
        with self._lock:
            return sum(self._charged.values())

    def admit(self, key: Hashable, seconds: float, sample_rate: int, retry_after_s: float = 1.0) -> None:
        """Charge a whole answer of `seconds` predicted audio at `sample_rate`, or refuse it:
        AudioTooLongError (413) if it alone passes the budget, OverloadedError (429) if it would
        with what is held now (one answer alone is always admitted under the budget, so a long
        one is never refused for ever)."""
        cost = int(seconds * sample_rate) * HELD_BYTES_PER_SAMPLE
        budget_s = self.budget_bytes / (HELD_BYTES_PER_SAMPLE * sample_rate)
        if cost > self.budget_bytes:
            raise AudioTooLongError("a whole (not streamed) answer", seconds, round(budget_s, 1), "max_held_audio_mb")
        with self._lock:
            held = sum(self._charged.values())
            if self._charged and held + cost > self.budget_bytes:
                raise OverloadedError(
                    f"the server holds {held / 2**20:.0f} MB of whole answers' audio; this one would pass its "
                    f"budget of {self.budget_bytes / 2**20:.0f} MB; retry later, or ask for a streamed answer",
                    retry_after_s=retry_after_s)
            self._charged[key] = cost

    def holds(self, key: Hashable, samples: int) -> None:
        """The answer now holds `samples` samples: its charge grows if that passes its prediction
        (it never shrinks before `release`: the audio stays until the answer is sent)."""
        with self._lock:
            if key in self._charged:
                self._charged[key] = max(self._charged[key], samples * HELD_BYTES_PER_SAMPLE)

    def release(self, key: Hashable) -> None:
        """The answer was sent, failed or was dropped: its audio is no longer held."""
        with self._lock:
            self._charged.pop(key, None)
