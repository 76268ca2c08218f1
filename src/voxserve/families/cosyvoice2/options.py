"""What a CosyVoice 2 voice speaks and how it runs: plain data, importable without torch (the
family registers them at start-up)."""

from __future__ import annotations

from dataclasses import dataclass, field

LANGUAGE_CODES = ("zh", "en", "ja", "ko", "yue")
"""What a CosyVoice 2 model speaks (BCP-47), as upstream's model card states it: Chinese, English,
Japanese, Korean and Cantonese (its other Chinese dialects have no tag of their own). The text
goes to the model as written (English spoken-form normalisation aside): no per-language front end."""


@dataclass(frozen=True)
class CosyRuntimeOptions:
    """How a CosyVoice 2 voice runs (not what it says)."""

    threads: int | None = field(default=None, metadata={"help": "CPU intra-op threads for the model (default: PyTorch's)"})
    """CPU intra-op threads (torch.set_num_threads); None leaves PyTorch's default."""
    max_sequences: int = field(default=16, metadata={"help": 'sentences generated at once (continuous batching), 1..256'})
    """Sentences whose language model runs at once (continuous batching), 1..256."""
    streaming: bool = field(default=True, metadata={"help": 'CosyVoice 2: audio in chunks as tokens come, not once per sentence'})
    """Audio in chunks as tokens come (chunk-masked flow; first audio after about a second of
    speech) rather than once per sentence (full attention)."""

    def validate(self) -> "CosyRuntimeOptions":
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be at least 1")
        if not 1 <= self.max_sequences <= 256:
            raise ValueError(f"max_sequences must be in 1..256, not {self.max_sequences!r}")
        return self
