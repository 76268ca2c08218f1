"""What a Bark voice takes per request (`BarkOptions`, the family's `synthesis_options`): the
common options (a preset name or index as `speaker`; `speed` only 1) and the sampling
temperature. Plain dataclasses, importable without torch or transformers."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import SynthesisOptions, number


@dataclass(frozen=True)
class BarkOptions(SynthesisOptions):
    temperature: float | None = number(0.0, 5.0, "sampling temperature; 0 = greedy")
    """The semantic and coarse stages' (0 also makes the fine stage greedy: deterministic).
    None = the voice's (BarkVoiceConfig: 0.7, 0.7, 0.5)."""

    @classmethod
    def deterministic(cls) -> "BarkOptions":
        return cls(temperature=0.0)
