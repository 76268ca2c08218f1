"""CUDA Graphs for the two VITS stages, captured per shape bucket.

A graph replays a fixed sequence of kernels on fixed buffers: no per-kernel launch cost, no
Python in the loop (at batch 1 a GPU VITS is launch-bound). Shapes vary per request, so each
stage is captured for a small grid of bucket shapes, all in one shared memory pool:

    encode: (batch, tokens) in GraphGrid.batch x GraphGrid.tokens
    synth:  packed frames in GraphGrid.frames (batch is always 1 after packing)

A call pads its inputs into the smallest bucket that fits (masks make the padding inert:
padded tokens are masked in every layer, padded frames are zero and masked at every
convolution), replays, and slices its outputs back. Outside the grid it falls back to eager.
Outputs are cloned before returning: a later replay of the same graph overwrites them.

`emulate=True` runs the identical bucketing, padding and slicing with plain calls instead of
graphs, so that logic is tested on CPU (CI has no GPU).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .stages import EagerStages, EncodeInputs, EncodeOutputs, SynthInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphGrid:
    batch: tuple[int, ...] = (1, 2, 4, 8, 16)
    tokens: tuple[int, ...] = (64, 128, 256, 512, 1024)
    frames: tuple[int, ...] = (256, 512, 1024, 2048, 4096)

    def encode_buckets(self) -> list[tuple[int, int]]:
        return [(b, t) for b in self.batch for t in self.tokens]


def pick_bucket(n: int, sizes: Sequence[int]) -> int | None:
    """Smallest size >= n, or None when n is past the grid."""
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


class _Graph:
    """One function captured on static inputs (or, emulated, called on them)."""

    def __init__(self, fn: Callable, inputs: tuple, pool, emulate: bool):
        self.fn, self.inputs, self.emulate = fn, inputs, emulate
        if emulate:
            self.outputs = None
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up: lazy inits and allocator state before capture
                fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn(*inputs)

    def replay(self):
        if self.emulate:
            self.outputs = self.fn(*self.inputs)
        else:
            self.graph.replay()
        return self.outputs


class GraphedStages:
    def __init__(self, eager: EagerStages, device: torch.device, grid: GraphGrid | None = None,
                 emulate: bool = False):
        if not emulate and device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device (emulate=True runs the logic on CPU)")
        self.eager = eager
        self.model = eager.model
        self.dims = eager.model.dims
        self.device = device
        self.grid = grid or GraphGrid()
        self.emulate = emulate
        self.pool = None if emulate else torch.cuda.graph_pool_handle()
        self._enc: dict[tuple[int, int], _Graph] = {}
        self._syn: dict[int, _Graph] = {}
        self.stats = {"replays": 0, "captures": 0, "fallbacks": 0}

    # ------------------------------------------------------------------ capture
    def _float(self, *shape) -> torch.Tensor:
        return torch.zeros(*shape, device=self.device, dtype=torch.float32)

    def _encode_graph(self, b: int, t: int) -> _Graph:
        g = self._enc.get((b, t))
        if g is None:
            inputs = (
                torch.zeros(b, t, dtype=torch.long, device=self.device),
                torch.ones(b, dtype=torch.long, device=self.device),
                torch.ones(b, device=self.device),
                self._float(b, 2, t),
                torch.zeros(b, dtype=torch.long, device=self.device) if self.dims.n_speakers > 1 else None,
            )
            g = self._enc[(b, t)] = _Graph(self.eager._encode, inputs, self.pool, self.emulate)
            self.stats["captures"] += 1
        return g

    def _synth_graph(self, p: int) -> _Graph:
        g = self._syn.get(p)
        if g is None:
            c = self.dims.inter_channels
            mask = self._float(1, 1, p)
            gg = self._float(1, self.dims.gin_channels, p) if self.dims.n_speakers > 1 else None
            inputs = (self._float(1, c, p), self._float(1, c, p), self._float(1, c, p), mask, gg, mask)
            g = self._syn[p] = _Graph(self.eager._synth, inputs, self.pool, self.emulate)
            self.stats["captures"] += 1
        return g

    def warmup(self) -> int:
        """Capture the whole grid now (rather than on first use). Returns graphs captured."""
        before = self.stats["captures"]
        with torch.inference_mode():
            for b, t in self.grid.encode_buckets():
                self._encode_graph(b, t)
            for p in self.grid.frames:
                self._synth_graph(p)
        return self.stats["captures"] - before

    # ------------------------------------------------------------------ run
    def encode(self, x: EncodeInputs) -> EncodeOutputs:
        B, T = x.ids.shape
        b, t = pick_bucket(B, self.grid.batch), pick_bucket(T, self.grid.tokens)
        if b is None or t is None:
            self.stats["fallbacks"] += 1
            return self.eager.encode(x)
        graph = self._encode_graph(b, t)
        ids, lengths, scale, noise, sid = graph.inputs
        ids.zero_()
        ids[:B, :T].copy_(x.ids)
        lengths.fill_(1)  # padding rows: one token, results ignored
        lengths[:B].copy_(x.lengths)
        scale.fill_(1.0)
        scale[:B].copy_(x.length_scale)
        noise.zero_()
        noise[:B, :, :T].copy_(x.dur_noise)
        if sid is not None:
            sid.zero_()
            sid[:B].copy_(x.sid)
        m_p, logs_p, durations, frames, g = graph.replay()
        self.stats["replays"] += 1
        return EncodeOutputs(
            m_p[:B, :, :T].clone(), logs_p[:B, :, :T].clone(), durations[:B, :T].clone(),
            frames[:B].clone(), None if g is None else g[:B].clone(),
        )

    def synth(self, x: SynthInputs, single_item: bool = False) -> torch.Tensor:
        P = x.m.shape[2]
        p = pick_bucket(P, self.grid.frames)
        if p is None:
            self.stats["fallbacks"] += 1
            return self.eager.synth(x, single_item)
        graph = self._synth_graph(p)
        m, logs, z, mask, g, _ = graph.inputs
        for dst, src in ((m, x.m), (logs, x.logs), (z, x.z_noise), (mask, x.mask), (g, x.g)):
            if dst is not None:
                dst.zero_()  # the tail past P must be silent and masked
                dst[:, :, :P].copy_(src)
        audio = graph.replay()
        self.stats["replays"] += 1
        return audio[: P * self.dims.hop_length].clone()
