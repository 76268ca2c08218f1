"""How a Bark voice runs and its defaults: plain dataclasses, importable without torch or
transformers (the family registers them at start-up; the CLI builds its flags from them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


@dataclass(frozen=True)
class BarkRuntimeOptions:
    """How a Bark voice runs (not what it says)."""

    attention: str = field(default="sdpa", metadata={"help": 'Bark: sdpa, eager or flash_attention_2'})
    """'sdpa' (fused scaled-dot-product attention), 'eager' (transformers' reference path), or
    'flash_attention_2' (needs the flash-attn package, CUDA and fp16/bf16)."""
    offload: bool = field(default=False, metadata={"help": 'keep weights in host memory, on the GPU only while a stage runs'})
    """CPU offload: keep the stages in pinned host memory and
    move each to the GPU only while it runs (lower peak memory, one weight copy per stage and
    batch). No effect on CPU (logged)."""
    threads: int | None = field(default=None, metadata={"help": "CPU intra-op threads for the model (default: PyTorch's)"})
    """CPU intra-op threads (torch.set_num_threads); None leaves PyTorch's default."""
    max_sequences: int = field(default=16, metadata={"help": 'sentences generated at once (continuous batching), 1..256'})
    """Sentences the engine generates at once (continuous batching): a request that arrives
    while fewer run starts at the next step; more wait for a free slot. Raise it on a GPU."""

    def validate(self) -> "BarkRuntimeOptions":
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, not {self.attention!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be at least 1")
        if not 1 <= self.max_sequences <= 256:
            raise ValueError(f"max_sequences must be in 1..256, not {self.max_sequences!r}")
        return self


@dataclass(frozen=True)
class BarkVoiceConfig:
    """A Bark voice's defaults (what it says when a request leaves a field None)."""

    default_speaker: str | None = None
    """Preset used when a request names none; None = no history prompt (a random voice)."""
    semantic_temperature: float = 0.7
    coarse_temperature: float = 0.7
    fine_temperature: float = 0.5
    """Bark's own defaults (text_temp, waveform_temp, fine temp 0.5); 0 = greedy."""
    min_eos_p: float | None = 0.2
    """End a sentence once EOS has this probability (Bark's default); None = only at argmax."""
    max_sentence_seconds: float = 10.0
    """Longer sentences are split (estimated at 14 characters a second) so that no generation
    runs into Bark's ~13-15 s window (768 semantic tokens at 49.9 Hz)."""

    def validate(self) -> "BarkVoiceConfig":
        for name in ("semantic_temperature", "coarse_temperature", "fine_temperature"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {v!r}")
        if self.min_eos_p is not None and not 0 < self.min_eos_p <= 1:
            raise ValueError(f"min_eos_p must be in (0, 1], not {self.min_eos_p!r}")
        if not 1.0 <= self.max_sentence_seconds <= 14.0:
            raise ValueError("max_sentence_seconds must be between 1 and 14 (Bark's window is ~13 s)")
        return self
