"""The two device stages of VITS inference, split at the one host read.

    encode: ids [B, T] -> prior stats [B, C, T], durations [B, T], frame counts [B]
    (host reads the frame counts, lays items out end to end)
    synth:  packed prior [1, C, P] -> flow -> decoder -> audio [P * hop]
            (or its two halves, `flow` and `decode`, for sentences cut into pieces)

`EagerStages` runs them as plain PyTorch, optionally through `torch.compile`;
`families/piper/cuda_graphs.py` wraps the same functions in bucketed CUDA graphs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ...models.vits import Mask, VitsModel

log = logging.getLogger(__name__)


@dataclass
class EncodeInputs:
    ids: torch.Tensor  # [B, T] int64
    lengths: torch.Tensor  # [B] int64
    length_scale: torch.Tensor  # [B] float32
    dur_noise: torch.Tensor  # [B, 2, T] float32, standard normal x noise_w
    sid: torch.Tensor | None  # [B] int64 (multi-speaker voices)


@dataclass
class EncodeOutputs:
    m_p: torch.Tensor  # [B, C, T]
    logs_p: torch.Tensor  # [B, C, T]
    durations: torch.Tensor  # [B, T] frames (float)
    frame_lengths: torch.Tensor  # [B] int64
    g: torch.Tensor | None  # [B, gin, 1]


@dataclass
class SynthInputs:
    m: torch.Tensor  # [1, C, P] frame-level prior mean, zero in gaps
    logs: torch.Tensor  # [1, C, P]
    z_noise: torch.Tensor  # [1, C, P] standard normal x noise_scale, zero in gaps
    mask: torch.Tensor  # [1, 1, P] dense 0/1, for the flow (and decoder when no decode_mask)
    g: torch.Tensor | None  # [1, gin, P] per-frame speaker embedding
    decode_mask: Mask = None  # a cheaper decoder mask (GapMask); None: see EagerStages.synth


class EagerStages:
    def __init__(self, model: VitsModel, compile: bool = False, compile_mode: str | None = None):
        self.model = model
        self._encode = self._encode_impl
        self._synth = self._synth_impl
        self._flow = self._flow_impl
        self._decode = self._decode_impl
        if compile:
            # dynamic shapes: eager callers pass any (B, T, P); graphed callers pass bucket shapes
            on_cuda = next(model.parameters()).is_cuda
            # CUDA: autotuned kernels, no cudagraphs of its own (families/piper/cuda_graphs.py captures);
            # CPU: default mode (autotuning on a small CPU costs minutes for no gain)
            mode = compile_mode or ("max-autotune-no-cudagraphs" if on_cuda else "default")
            self._encode = torch.compile(self._encode_impl, mode=mode, dynamic=None)
            self._synth = torch.compile(self._synth_impl, mode=mode, dynamic=None)
            # (compiled lazily, on the first cut sentence: see VitsRunner._run_packed)
            self._flow = torch.compile(self._flow_impl, mode=mode, dynamic=None)
            self._decode = torch.compile(self._decode_impl, mode=mode, dynamic=None)
            log.info("stages compiled with torch.compile(mode=%s)", mode)

    def _encode_impl(self, ids, lengths, length_scale, dur_noise, sid):
        m = self.model
        g = m.speaker_embedding(sid)
        m_p, logs_p, _, durations = m.encode(ids, lengths, g, dur_noise, length_scale)
        return m_p, logs_p, durations, m.frame_lengths(durations), g

    def _synth_impl(self, m_, logs, z_noise, mask, g, decode_mask):
        m = self.model
        z = m.flow_reverse(m_, logs, mask, z_noise, g)
        return m.decode(z, decode_mask, g)[0, 0]

    def _flow_impl(self, m_, logs, z_noise, mask, g):
        return self.model.flow_reverse(m_, logs, mask, z_noise, g)

    def _decode_impl(self, z, decode_mask, g):
        return self.model.decode(z, decode_mask, g)[0, 0]

    def encode(self, x: EncodeInputs) -> EncodeOutputs:
        return EncodeOutputs(*self._encode(x.ids, x.lengths, x.length_scale, x.dur_noise, x.sid))

    def synth(self, x: SynthInputs, single_item: bool = False) -> torch.Tensor:
        """-> audio [P * hop] on the device. The decoder's mask: x.decode_mask if given, none
        for a run holding a single item (nothing to separate), else the dense mask."""
        decode_mask = x.decode_mask if x.decode_mask is not None else (None if single_item else x.mask)
        return self._synth(x.m, x.logs, x.z_noise, x.mask, x.g, decode_mask)

    def flow(self, x: SynthInputs) -> torch.Tensor:
        """The synth stage's first half alone: -> latents z [1, C, P], zero where masked."""
        return self._flow(x.m, x.logs, x.z_noise, x.mask, x.g)

    def decode(self, z: torch.Tensor, g: torch.Tensor | None, decode_mask: Mask) -> torch.Tensor:
        """Its second half: z [1, C, P] (zero where decode_mask masks) -> audio [P * hop]."""
        return self._decode(z, decode_mask, g)
