"""Batched VITS inference: pad -> encode -> (one host read) -> expand -> flow -> decode -> trim.

The runner owns a model on one device and is the only code that touches it. A batch holds
sentences of any lengths (one request's or several requests'); each item brings its own
scales, speaker and noise seed, so an item's audio does not depend on what else is in the
batch. Features stay on the device from ids to waveform; the only device->host transfers are
the predicted frame lengths (one small read per batch) and the final audio.

Decoder layouts (`decode_layout`):
* "packed": the items' latents laid end to end with a gap of zeros, decoded as one sequence,
  then cut apart. No padding work. Every convolution input is masked, so a gap of one
  convolution's reach (`decoder_gap_frames`) separates items exactly.
* "padded": [B, C, F_max] with masks. Work grows with the length spread of the batch.
On CPU, packed is the default (measured: padding a batch of corpus sentences costs 1.3-2x;
see docs/benchmarks.md).
"""

from __future__ import annotations

import math
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models.vits import VitsDims, VitsModel
from .options import RuntimeOptions


@dataclass(frozen=True)
class VitsItem:
    """One sentence to synthesise."""

    ids: Sequence[int]
    length_scale: float = 1.0
    noise_scale: float = 0.667
    noise_w: float = 0.8
    speaker_id: int = 0
    seed: int | None = None


def decoder_gap_frames(dims: VitsDims) -> int:
    """Zero frames between packed items: the widest one-sided reach of any decoder conv,
    in latent frames, rounded up, plus one. With masked inputs, this isolates items exactly."""
    reach = 3.0  # conv_pre, kernel 7
    scale = 1
    for u, k in zip(dims.upsample_rates, dims.upsample_kernel_sizes):
        reach = max(reach, math.ceil(k / u) / scale)  # transposed conv, at its input rate
        scale *= u
        for rk, rd in zip(dims.resblock_kernel_sizes, dims.resblock_dilation_sizes):
            reach = max(reach, (rk - 1) // 2 * max(rd) / scale)
    reach = max(reach, 3 / scale)  # conv_post, kernel 7
    return int(math.ceil(reach)) + 1


def decoder_receptive_field_frames(dims: VitsDims) -> float:
    """One-sided receptive field of the whole decoder in latent frames (for reference)."""
    total = 3.0
    scale = 1
    for u, k in zip(dims.upsample_rates, dims.upsample_kernel_sizes):
        total += math.ceil(k / u) / scale
        scale *= u
        per_block = []
        for rk, rd in zip(dims.resblock_kernel_sizes, dims.resblock_dilation_sizes):
            d = list(rd) + ([1] * len(rd) if dims.resblock == "1" else [])
            per_block.append(sum((rk - 1) // 2 * x for x in d))
        total += max(per_block) / scale
    return total + 3 / scale


class VitsRunner:
    def __init__(self, model: VitsModel, device: torch.device, dtype: torch.dtype = torch.float32,
                 options: RuntimeOptions | None = None):
        self.model = model
        self.dims = model.dims
        self.device = device
        self.dtype = dtype
        self.config = (options or RuntimeOptions()).validate()
        self.layout = "packed" if self.config.decode_layout == "auto" else self.config.decode_layout
        self.gap = decoder_gap_frames(self.dims)
        self._lock = threading.Lock()  # one batch at a time on this model
        self.last_stats: dict[str, float] = {}

    # ------------------------------------------------------------------ noise
    def _generator(self, seed: int | None) -> torch.Generator:
        g = torch.Generator(device="cpu")
        g.manual_seed(secrets.randbits(63) if seed is None else seed & ((1 << 63) - 1))
        return g

    def _noise(self, items: Sequence[VitsItem], gens, lengths: Sequence[int], channels: int,
               scale_of) -> torch.Tensor:
        """[B, channels, max(lengths)] of per-item standard normal x scale (zeros when 0).

        Drawn on the CPU from each item's own generator, so a seeded item gets the same noise
        alone or in any batch, on any device; then moved in one copy.
        """
        n = max(lengths)
        if all(scale_of(it) == 0 for it in items):
            return torch.zeros(len(items), channels, n, device=self.device, dtype=self.dtype)
        out = torch.zeros(len(items), channels, n)
        for i, (it, g, length) in enumerate(zip(items, gens, lengths)):
            s = scale_of(it)
            if s:
                out[i, :, :length] = torch.randn(channels, length, generator=g) * s
        return self._to_device(out).to(self.dtype)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    # ------------------------------------------------------------------ run
    @torch.inference_mode()
    def run(self, items: Sequence[VitsItem]) -> list[np.ndarray]:
        """Synthesise a batch. Returns float32 audio per item, trimmed to its own length."""
        if not items:
            return []
        with self._lock:
            return self._run(items)

    def _run(self, items: Sequence[VitsItem]) -> list[np.ndarray]:
        m = self.model
        B = len(items)
        t_lens = [len(it.ids) for it in items]
        if min(t_lens) == 0:
            raise ValueError("an item has no phoneme ids")
        ids = np.zeros((B, max(t_lens)), dtype=np.int64)
        for i, it in enumerate(items):
            ids[i, : t_lens[i]] = it.ids
        for it in items:
            if not 0 <= max(it.ids) < self.dims.n_vocab or min(it.ids) < 0:
                raise ValueError(f"phoneme id out of range 0..{self.dims.n_vocab - 1}")
        ids_t = self._to_device(torch.from_numpy(ids))
        lengths = self._to_device(torch.tensor(t_lens))
        length_scale = self._to_device(torch.tensor([it.length_scale for it in items], dtype=torch.float32)).to(self.dtype)
        sid = None
        if self.dims.n_speakers > 1:
            for it in items:
                if not 0 <= it.speaker_id < self.dims.n_speakers:
                    raise ValueError(f"speaker id {it.speaker_id} out of range 0..{self.dims.n_speakers - 1}")
            sid = self._to_device(torch.tensor([it.speaker_id for it in items]))
        gens = [self._generator(it.seed) for it in items]

        g = m.speaker_embedding(sid)
        dur_noise = self._noise(items, gens, t_lens, 2, lambda it: it.noise_w)
        m_p, logs_p, x_mask, durations = m.encode(ids_t, lengths, g, dur_noise, length_scale)
        y_lengths_t = m.frame_lengths(durations)
        y_lengths = y_lengths_t.tolist()  # the one device->host read of the batch
        n_frames = max(y_lengths)
        mm, logs, y_mask = m.expand(m_p, logs_p, durations, y_lengths_t, n_frames)
        z_noise = self._noise(items, gens, y_lengths, self.dims.inter_channels, lambda it: it.noise_scale)
        z = m.flow_reverse(mm, logs, y_mask, z_noise, g)

        hop = self.dims.hop_length
        out: list[np.ndarray | None] = [None] * B
        for group in self._decode_groups(y_lengths):
            if self.layout == "packed" and len(group) > 1:
                audios = self._decode_packed(z, g, y_lengths, group)
            else:
                audios = self._decode_padded(z, y_mask, g, y_lengths, group)
            for i, a in zip(group, audios):
                out[i] = a
        self.last_stats = {"batch": B, "frames": float(sum(y_lengths)), "samples": float(sum(y_lengths) * hop)}
        return out  # type: ignore[return-value]

    def _decode_groups(self, y_lengths: Sequence[int]) -> list[list[int]]:
        """Consecutive groups whose total frames stay under max_decode_frames."""
        cap = self.config.max_decode_frames
        groups: list[list[int]] = []
        cur: list[int] = []
        total = 0
        for i, n in enumerate(y_lengths):
            cost = n + (self.gap if cur else 0)
            if cur and total + cost > cap:
                groups.append(cur)
                cur, total, cost = [], 0, n
            cur.append(i)
            total += cost
        if cur:
            groups.append(cur)
        return groups

    def _to_host(self, audio: torch.Tensor) -> np.ndarray:
        """[..., S] device tensor -> float32 numpy, one copy."""
        return audio.float().cpu().numpy()

    def _decode_padded(self, z, y_mask, g, y_lengths, group):
        hop = self.dims.hop_length
        idx = torch.tensor(group, device=self.device)
        n = max(y_lengths[i] for i in group)
        zz = z.index_select(0, idx)[:, :, :n]
        mask = y_mask.index_select(0, idx)[:, :, :n]
        gg = None if g is None else g.index_select(0, idx)
        full = bool(all(y_lengths[i] == n for i in group))
        audio = self.model.decode(zz, None if full else mask, gg)  # [b, 1, n*hop]
        host = self._to_host(audio[:, 0])
        return [host[j, : y_lengths[i] * hop] for j, i in enumerate(group)]

    def _decode_packed(self, z, g, y_lengths, group):
        hop = self.dims.hop_length
        B, C, F = z.shape
        starts, pos = [], 0
        src = []  # flat index into z viewed as [C, B*F]; B*F is the zero column
        for k, i in enumerate(group):
            if k:
                src.append(np.full(self.gap, B * F))
                pos += self.gap
            starts.append(pos)
            src.append(i * F + np.arange(y_lengths[i]))
            pos += y_lengths[i]
        src_idx = np.concatenate(src)
        P = len(src_idx)
        mask_np = (src_idx != B * F).astype(np.float32)
        idx_t = self._to_device(torch.from_numpy(src_idx))
        flat = torch.cat([z.permute(1, 0, 2).reshape(C, B * F), z.new_zeros(C, 1)], dim=1)
        zp = flat.index_select(1, idx_t).unsqueeze(0)  # [1, C, P]
        mask = self._to_device(torch.from_numpy(mask_np)).to(self.dtype).view(1, 1, P)
        gp = None
        if g is not None:
            item_of = np.full(P, B, dtype=np.int64)
            for k, i in enumerate(group):
                item_of[starts[k] : starts[k] + y_lengths[i]] = i
            gcols = torch.cat([g[:, :, 0].t(), g.new_zeros(g.shape[1], 1)], dim=1)  # [gin, B+1]
            gp = gcols.index_select(1, self._to_device(torch.from_numpy(item_of))).unsqueeze(0)
        audio = self.model.decode(zp, mask, gp)  # [1, 1, P*hop]
        host = self._to_host(audio[0, 0])
        return [host[s * hop : (s + y_lengths[i]) * hop] for s, i in zip(starts, group)]
