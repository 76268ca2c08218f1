"""How a voice runs (not what it says): speed features, switchable, each a transform
applied after the model is built and checked numerically against the plain path."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeOptions:
    decode_layout: str = "auto"
    """Decoder batching: 'packed' (end to end, no padding work), 'padded', or 'auto'."""
    max_decode_frames: int = 4096
    """Latent frames decoded per call; bounds activation memory (4096 ~ 47 s at 22 kHz)."""
    cpu_channels_last: bool = True
    """CPU: run the flow's and decoder's 1-D convolutions as channels-last 2-D convolutions."""
    attention: str = "banded"
    """Text-encoder relative attention: 'banded' (2w+1 diagonals) or 'skew' (VITS reference)."""
    threads: int | None = None
    """CPU intra-op threads (torch.set_num_threads); None leaves PyTorch's default."""

    def validate(self) -> "RuntimeOptions":
        if self.decode_layout not in ("auto", "packed", "padded"):
            raise ValueError(f"decode_layout must be auto, packed or padded, not {self.decode_layout!r}")
        if self.attention not in ("banded", "skew"):
            raise ValueError(f"attention must be banded or skew, not {self.attention!r}")
        if self.max_decode_frames < 64:
            raise ValueError("max_decode_frames must be at least 64")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be at least 1")
        return self
