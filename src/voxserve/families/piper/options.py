"""How a Piper voice runs (not what it says).

`PiperRuntimeOptions` holds what a user sets (the family's `options_type`: `load_voice(runtime=)`,
the flags of `voxserve say` / `serve`). `Transforms` holds the speed features' switches: each
is a transform applied after the model is built and checked numerically against the plain
path (tests) and compared with it in benchmarks/; their defaults are settled
(docs/benchmarks.md, "Figures behind the code's defaults"), so they are no user setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # cuda_graphs imports torch: options stay importable without it (CLI start-up)
    from .cuda_graphs import GraphGrid


@dataclass(frozen=True)
class PiperRuntimeOptions:
    """How a Piper voice runs: what a user may set."""

    threads: int | None = field(default=None, metadata={"help": "CPU intra-op threads for the model (default: PyTorch's)"})
    """CPU intra-op threads (torch.set_num_threads); None leaves PyTorch's default."""
    offload: bool = field(default=False, metadata={"help": 'keep weights in host memory, on the GPU only while a stage runs'})
    """Keep each stage's weights in pinned host memory, on the device only while it runs."""
    cuda_graphs: bool | None = field(default=None, metadata={"help": 'Piper: replay the stages as CUDA graphs (default: on for CUDA)'})
    """Replay the stages as CUDA graphs per shape bucket; None = on for CUDA, off on CPU.
    On CPU, True runs the same bucketing logic without graphs (for testing)."""
    compile: bool = field(default=False, metadata={"help": 'Piper: torch.compile each stage'})
    """torch.compile each stage (without its own CUDA graphs: ours are used instead)."""
    memory_fraction: float | None = field(default=None, metadata={"help": "Piper, CUDA: cap this process's share of device memory (0..1)"})
    """CUDA: cap this process's share of device memory (torch.cuda.set_per_process_memory_fraction)."""
    max_decode_frames: int = field(default=4096, metadata={"help": 'Piper: latent frames decoded per call (bounds activation memory)'})
    """Latent frames decoded per call; bounds activation memory (4096 ~ 47 s at 22 kHz). A
    single sentence longer than this is decoded in windows of it (exact: each window gets the
    decoder's receptive field of real context)."""

    def validate(self) -> "PiperRuntimeOptions":
        if self.max_decode_frames < 64:
            raise ValueError("max_decode_frames must be at least 64")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be at least 1")
        if self.offload and self.cuda_graphs:
            raise ValueError("cuda_graphs and offload cannot be combined: graphs bind the weights' device addresses")
        if self.memory_fraction is not None and not 0 < self.memory_fraction <= 1:
            raise ValueError("memory_fraction must be in (0, 1]")
        return self


@dataclass(frozen=True)
class Transforms:
    """The speed features' switches and tuning (developers': tests and benchmarks/ switch them;
    `voxserve.families.piper.loader.load_piper_voice(transforms=)`). Not in voxserve's API."""

    decode_layout: str = "auto"
    """Decoder batching: 'packed' (end to end, no padding work), 'padded', or 'auto'."""
    cpu_decode_frames: int | None = 512
    """CPU: a lower cap on max_decode_frames (None = none). On a CPU the decoder's activations
    at 4096 frames dominate peak memory and shorter calls are no slower (docs/benchmarks.md,
    'Memory of voxserve say')."""
    cpu_decode_tiles: bool = True
    """CPU: run the decoder's later stages over tiles of 128 latent frames with their receptive
    field of context (families/piper/transforms.py, tile_decoder): their activations, most of
    the decoder's memory, stay within a tile."""
    cpu_channels_last: bool = True
    """CPU: run the flow's and decoder's 1-D convolutions as channels-last 2-D convolutions."""
    cpu_gemm_convs: bool = True
    """CPU: run the text encoder's, duration predictor's and flow's convolutions (short inputs,
    at most a few hundred tokens or frames) as im2col + one GEMM each (runtime/layout.py)."""
    fold_average: bool = True
    """Fold the decoder's resblock average into the next convolution (one pass less per stage)."""
    attention: str = "banded"
    """Text-encoder relative attention: 'banded' (2w+1 diagonals) or 'skew' (VITS reference)."""
    shape_buckets: bool | None = None
    """Round sequence lengths up to geometric buckets (masked padding) so that oneDNN's
    per-shape kernels are reused; None = on for CPU (see families/piper/buckets.py)."""
    graph_grid: GraphGrid | None = None
    """Bucket shapes to capture as CUDA graphs (default GraphGrid())."""
    first_audio_frames: int = 32
    """Streams' first audio: a sentence marked `early` (a streaming request's first) of at least
    `first_audio_split_frames` latent frames (any length on a spare device: `run_pieces`) is
    synthesised as a head of max(this, 1/16 of the sentence) frames, delivered at once, then the
    rest; the two join exactly (each part is computed with the flow's and decoder's receptive
    field of real context). 0 = off."""
    first_audio_split_frames: int = 1024
    """Shortest sentence (latent frames; 1024 ~ 12 s at 22 kHz) cut for first audio: a cut
    costs extra work (the flow's and decoder's context on both sides), which a saturated
    server pays in throughput, so only long first sentences are cut (docs/benchmarks.md,
    "Figures behind the code's defaults")."""

    def validate(self) -> "Transforms":
        if self.decode_layout not in ("auto", "packed", "padded"):
            raise ValueError(f"decode_layout must be auto, packed or padded, not {self.decode_layout!r}")
        if self.attention not in ("banded", "skew"):
            raise ValueError(f"attention must be banded or skew, not {self.attention!r}")
        if self.cpu_decode_frames is not None and self.cpu_decode_frames < 64:
            raise ValueError("cpu_decode_frames must be at least 64")
        if self.first_audio_frames < 0 or self.first_audio_split_frames < 0:
            raise ValueError("first_audio_frames and first_audio_split_frames must be >= 0")
        return self
