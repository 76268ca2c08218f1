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
On CPU, packed is the default: padding work grows with the batch's length spread (see
docs/benchmarks.md, "Configurations side by side", row "decode_layout padded").

Pieces (`run_pieces`, packed layout): a long item can be cut after a head (a stream's first
audio) or into bounded pieces (the serving engine's max_batch_phonemes). The flow runs over
each piece with `synth_context_frames` of real context on both sides (the flow's couplings and
the decoder's receptive field), the decoder over only its own receptive field
(`decode_context`), so the pieces join exactly at the cost of that overlap per cut; the rest
is a `VitsContinuation` holding the frame-level prior and noise on the device, run in a later
batch like any item.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import secrets
import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from ...models.vits import GapMask, VitsDims, VitsModel
from ...runtime.cpu import contended_groups, cpu_team, run_groups
from ...runtime.offload import ResidentWeights, WeightOffloader
from ...runtime.sync import host_read, upload
from .buckets import decode_bucket, geometric_bucket
from .cuda_graphs import GraphedStages
from .options import PiperRuntimeOptions, Transforms
from .stages import EagerStages, EncodeInputs, EncodeOutputs, SynthInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VitsItem:
    """One sentence to synthesise."""

    ids: Sequence[int]
    length_scale: float = 1.0
    noise_scale: float = 0.667
    noise_w: float = 0.8
    speaker_id: int = 0
    seed: int | None = None
    max_frames: int | None = None
    """A sentence predicted longer than this is not synthesised: its result is a FramesOverLimit."""


class FramesOverLimit(Exception):
    """A batch item's predicted length passed its max_frames; the flow and decoder skipped it."""

    def __init__(self, frames: int, max_frames: int):
        self.frames, self.max_frames = frames, max_frames
        super().__init__(f"{frames} frames; the limit is {max_frames}")


def over_limit(item, frames: int) -> bool:
    return isinstance(item, VitsItem) and item.max_frames is not None and frames > item.max_frames


@dataclass(frozen=True)
class VitsContinuation:
    """The rest of a sentence cut by `VitsRunner.run_pieces`: its frame-level prior and noise
    on the device (the text encoder does not run again), from `left` frames of context before
    the first frame still to deliver."""

    m: torch.Tensor  # [C, L]
    logs: torch.Tensor  # [C, L]
    noise: torch.Tensor | None  # [C, L] standard normal x noise_scale, None when 0
    g: torch.Tensor | None  # [gin] speaker embedding
    left: int
    """Frames of context at the start (computed, not delivered)."""
    ids_per_frame: float
    """The sentence's phoneme ids per frame: converts frames to batching cost."""

    @property
    def frames(self) -> int:
        return self.m.shape[-1] - self.left

    @property
    def cost(self) -> int:
        return max(1, math.ceil(self.frames * self.ids_per_frame))


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


def synth_context_frames(dims: VitsDims) -> int:
    """Latent frames of real context that make a slice of a sentence's synth (flow + decoder)
    exact in its interior: the flow's couplings run one after another, each reaching
    sum((k - 1) / 2 * dilation) frames, then the decoder's receptive field; rounded up, plus one."""
    per_coupling = sum((dims.flow_kernel_size - 1) // 2 * dims.flow_dilation_rate ** i
                       for i in range(dims.flow_n_layers))
    return int(math.ceil(dims.flow_n_flows * per_coupling + decoder_receptive_field_frames(dims))) + 1


class VitsPiece(tuple):
    """(audio, rest) of one item of `VitsRunner.run_pieces`, and `durations`: the frames the
    duration predictor gave each phoneme id of the item, from the forward that made the audio
    (int32 [len(ids)]; summed, times hop length, they are the sentence's samples), on an item's
    first piece; None on a continuation's pieces and on an item over its frame limit."""

    durations: np.ndarray | None

    def __new__(cls, audio, rest, durations: np.ndarray | None = None):
        self = super().__new__(cls, (audio, rest))
        self.durations = durations
        return self


EarlyAudio = Callable[[int, np.ndarray], None]
"""on_early(k, samples): the head of item k's audio, before the rest of it is made."""


class PendingAudio:
    """Audio of a submitted batch, on its way to host memory (see VitsRunner.submit)."""

    def __init__(self, host: np.ndarray | torch.Tensor, spans: list[tuple[int, int]], event=None):
        self._host, self._spans, self._event = host, spans, event

    def result(self) -> list[np.ndarray]:
        if self._event is not None:
            self._event.synchronize()  # the copy-out is done; nothing else is waited for
        host = self._host.numpy() if isinstance(self._host, torch.Tensor) else self._host
        return [host[a:b] for a, b in self._spans]


class VitsRunner(ResidentWeights):
    """Owns one VITS model on one device. `run(items)` synthesises one batch."""

    def __init__(self, model: VitsModel, device: torch.device, dtype: torch.dtype = torch.float32,
                 options: PiperRuntimeOptions | None = None, transforms: Transforms | None = None):
        self.model = model
        self.dims = model.dims
        self.device = device
        self.dtype = dtype
        self.config = (options or PiperRuntimeOptions()).validate()
        self.transforms = (transforms or Transforms()).validate()
        self.layout = "packed" if self.transforms.decode_layout == "auto" else self.transforms.decode_layout
        self.gap = decoder_gap_frames(self.dims)
        self._lock = threading.Lock()  # one batch at a time, unless `concurrent_runs`
        self.last_stats: dict[str, float] = {}
        self.oom_splits = 0
        self.offloader = None
        if self.config.offload:
            self.offloader = WeightOffloader(model, {"encode": ("enc_p", "dp", "emb_g"), "synth": ("flow", "dec")}, device)
        self.stages = self._build_stages()
        # CPU eager: round shapes up to buckets (see families/piper/buckets.py); graphs have their own
        buckets = self.transforms.shape_buckets
        self.buckets = (device.type == "cpu") if buckets is None else buckets
        self.buckets = self.buckets and isinstance(self.stages, EagerStages)
        self._copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _build_stages(self):
        eager = EagerStages(self.model, compile=self.config.compile)
        use_graphs = self.config.cuda_graphs
        if use_graphs is None:
            use_graphs = self.device.type == "cuda" and not self.config.offload
        if not use_graphs:
            return eager
        if self.config.offload:
            raise ValueError("cuda_graphs and offload cannot be combined: graphs bind the weights' device addresses")
        emulate = self.device.type != "cuda"
        return GraphedStages(eager, self.device, self.transforms.graph_grid, emulate=emulate)

    @property
    def concurrent_runs(self) -> bool:
        """Whether several threads may run batches on this model at once (the serving engine's
        CPU lanes): CPU eager stages keep no state between calls. CUDA graphs own static
        buffers, offload moves weights between batches, and torch.compile may compile on a
        call: those run one batch at a time."""
        return (self.device.type == "cpu" and isinstance(self.stages, EagerStages)
                and self.offloader is None and not self.config.compile)

    def _after_move(self) -> None:
        # captured graphs bind the old addresses: drop them; they are re-captured lazily, per
        # bucket, on first use
        if isinstance(self.stages, GraphedStages):
            self.stages = self._build_stages()

    def warmup(self, max_frames: int = 0, max_tokens: int = 0) -> None:
        """Prepare for traffic. CUDA graphs: capture the whole grid. CPU: one real sentence
        through every stage, and with max_frames / max_tokens the synth stage at every frame
        bucket up to max_frames (largest first) and the encoder at every token bucket up to
        max_tokens. A bucket's first use builds its oneDNN kernels, once per bucket and thread
        count; traffic pays that bucket by bucket, which costs less than sweeping every bucket
        at start-up (time to /ready and RSS; docs/benchmarks.md, "A lean server"), so by
        default the sweep is not run."""
        if isinstance(self.stages, GraphedStages) and not self.stages.emulate:
            self.stages.warmup()
        elif self.buckets and (max_frames or max_tokens):
            with torch.inference_mode():
                for n in sorted({geometric_bucket(k) for k in range(1, max_frames + 1)}, reverse=True):
                    self.stages.synth(self._zeros_synth(n), single_item=False)
                for t in sorted({geometric_bucket(k) for k in range(1, max_tokens + 1)}):
                    self.stages.encode(self._zeros_encode(t))
        self.run([VitsItem((1, 0, 2), noise_scale=0.0, noise_w=0.0, seed=0)])

    def _zeros_synth(self, n: int) -> SynthInputs:
        c = self.dims.inter_channels
        z = torch.zeros(1, c, n, device=self.device)
        g = torch.zeros(1, self.dims.gin_channels, n, device=self.device) if self.dims.n_speakers > 1 else None
        gaps = GapMask(torch.zeros(0, dtype=torch.long, device=self.device), n, tail_from=n)
        return SynthInputs(z, z, z, torch.ones(1, 1, n, device=self.device), g, gaps)

    def _zeros_encode(self, t: int) -> EncodeInputs:
        sid = torch.zeros(1, dtype=torch.long, device=self.device) if self.dims.n_speakers > 1 else None
        return EncodeInputs(torch.zeros(1, t, dtype=torch.long, device=self.device),
                            torch.full((1,), t, device=self.device), torch.ones(1, device=self.device),
                            torch.zeros(1, 2, t, device=self.device), sid)

    # ------------------------------------------------------------------ noise
    def _generator(self, seed: int | None) -> torch.Generator:
        """An item's noise stream, drawn on the model's device so that no noise crosses from
        the host; a seed gives the same stream on every run and in any batch (CUDA's generator
        is not the CPU's, so the numbers differ between devices)."""
        g = torch.Generator(device=self.device)
        g.manual_seed(secrets.randbits(63) if seed is None else seed & ((1 << 63) - 1))
        return g

    def _noise(self, items: Sequence[VitsItem], gens, lengths: Sequence[int], channels: int,
               scale_of) -> torch.Tensor:
        """[B, channels, max(lengths)] of per-item standard normal x scale (zeros when 0).

        Drawn on the device from each item's own generator, so a seeded item gets the same
        noise alone or in any batch, and nothing crosses from the host.
        """
        out = torch.zeros(len(items), channels, max(lengths), device=self.device)
        for i, (it, g, length) in enumerate(zip(items, gens, lengths)):
            s = scale_of(it)
            if s:
                out[i, :, :length] = torch.randn(channels, length, generator=g, device=self.device) * s
        return out

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return upload(t, t.dtype, self.device)

    # ------------------------------------------------------------------ run
    def run(self, items: Sequence[VitsItem], early: Sequence[int] = (),
            on_early: EarlyAudio | None = None) -> list[np.ndarray]:
        """Synthesise a batch. Returns float32 audio per item, trimmed to its own length.

        early / on_early: items (positions) whose client waits for its first audio. A long one
        is synthesised as a head, passed to on_early(k, samples) before the rest is made; for
        such an item the result holds only the rest (head + rest = the sentence's audio; see
        `run_pieces`).

        On a CUDA out-of-memory error the batch is split in halves and each half retried:
        a batch too big for the device costs time, never the requests."""
        if not early or on_early is None:
            return [a for a, _ in self.run_pieces(items)]
        pieces = self.run_pieces(items, early)
        cut = [k for k, (_, rest) in enumerate(pieces) if rest is not None]
        for k in cut:
            on_early(k, pieces[k][0])
        out = [a for a, _ in pieces]
        for k, a in zip(cut, self.run([pieces[k][1] for k in cut])):
            out[k] = a
        return out

    def run_pieces(self, items: Sequence[VitsItem | VitsContinuation], early: Sequence[int] = (),
                   max_cost: int | None = None, spare: bool = False) -> list[VitsPiece]:
        """Synthesise a batch, cutting long items: (audio, rest) per item, where rest is None
        or a VitsContinuation to run later (in any later batch) for the rest of its audio; each
        a VitsPiece, whose `durations` time the item's phoneme ids.

        * an `early` item (a stream's first sentence) of at least first_audio_split_frames is
          cut after its head (`head_frames`), so its first audio comes in a fraction of the time;
          with `spare` (the device has nothing else to do) a short one too, where the head
          leaves a rest longer than the cut's context;
        * with max_cost, an item is cut after the frames that max_cost phoneme ids make, so no
          item holds the device longer than a full batch does (the serving engine passes its
          max_batch_phonemes: a short request then waits for at most one such piece).
        The flow runs over each piece with `context` frames of real context on both sides, the
        decoder over `decode_context` of them, so the pieces of an item join exactly."""
        if not items:
            return []
        groups = (contended_groups([it.cost if isinstance(it, VitsContinuation) else len(it.ids) for it in items])
                  if self.device.type == "cpu" and self.concurrent_runs else None)
        if groups:  # a busy machine: each group alone on one thread (runtime/cpu.py)
            parts = run_groups([functools.partial(self.run_pieces, [items[i] for i in g],
                                                  [g.index(k) for k in early if k in g], max_cost, spare)
                                for g in groups])
            merged: list = [None] * len(items)
            for g, part in zip(groups, parts):
                for i, piece in zip(g, part):
                    merged[i] = piece
            return merged
        try:  # (_submit checks the items)
            pending, rests, over, durs = self._submit(items, early, max_cost, spare)
            out: list = [VitsPiece(a, r, d) for a, r, d in zip(pending.result(), rests, durs)]
            for k, frames in over.items():
                out[k] = VitsPiece(FramesOverLimit(frames, items[k].max_frames), None)
            return out
        except torch.OutOfMemoryError:
            if len(items) == 1:
                raise
            self.oom_splits += 1
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            half = len(items) // 2
            log.warning("out of memory on a batch of %d; retrying as %d + %d", len(items), half, len(items) - half)
            return (self.run_pieces(items[:half], [k for k in early if k < half], max_cost, spare)
                    + self.run_pieces(items[half:], [k - half for k in early if k >= half], max_cost, spare))

    def submit(self, items: Sequence[VitsItem]) -> PendingAudio:
        """Run the device work of a batch and start the copy of its audio to host memory.

        On CUDA the copy runs on a side stream: the next batch's compute can start while this
        one's audio is still coming back; `PendingAudio.result()` waits for the copy alone."""
        pending, _, over, _ = self._submit(items, (), None)
        if over:
            k, frames = next(iter(over.items()))
            raise FramesOverLimit(frames, items[k].max_frames)
        return pending

    @torch.inference_mode()
    def _submit(self, items, early, max_cost, spare: bool = False) -> tuple[PendingAudio, list[VitsContinuation | None],
                                                       dict[int, int], list[np.ndarray | None]]:
        """-> the audio in flight, each item's rest, {position: predicted frames} of the items
        over their max_frames (their audio is a placeholder), and each item's durations (see
        VitsPiece)."""
        self._check(items)
        over: dict[int, int] = {}
        team = cpu_team() if self.device.type == "cpu" else contextlib.nullcontext()
        with contextlib.nullcontext() if self.concurrent_runs else self._lock, team:
            if self.layout == "padded":
                if any(isinstance(it, VitsContinuation) for it in items):
                    raise ValueError("the padded layout does not run continuations (use packed)")
                audios, lengths, durs = self._run_padded(items, over)
                rests: list[VitsContinuation | None] = [None] * len(items)
            else:
                audios, lengths, rests, durs = self._run_packed(items, early, max_cost, over, spare)
            for k in over:
                durs[k] = None
            return self._copy_out(audios, lengths), rests, over, durs

    def head_frames(self, frames: int, spare: bool = False) -> int:
        """Frames of a sentence's head for first audio (0: not cut): at least
        first_audio_frames and 1/16 of the sentence, so that the rest (at a real-time factor
        under ~1/16) is ready before the head has played. Only sentences of at least
        first_audio_split_frames are cut, unless `spare`: the cut's extra context is then
        work no one else waits for."""
        c = self.transforms
        if not c.first_audio_frames or frames < (1 if spare else max(c.first_audio_split_frames, 1)):
            return 0
        head = max(c.first_audio_frames, -(-frames // 16))
        # what the cut must leave after the head: a busy device's cut pays the flow's context on
        # both sides; a spare one's only needs to save the decoder (most of the time) work
        margin = self.decode_context if spare else self.context
        return head if head + 2 * margin < frames else 0

    def piece_frames(self, frames: int, ids_per_frame: float, max_cost: int | None) -> int:
        """Frames of the first piece of an item when max_cost bounds a piece (0: not cut).
        A piece is at least 4 contexts long (the overlap costs at most ~half a piece), and an
        item is cut only if what is left is at least a quarter piece."""
        if not max_cost:
            return 0
        piece = max(int(max_cost / max(ids_per_frame, 1e-6)), 4 * self.context)
        return piece if frames - piece >= max(piece // 4, self.context) else 0

    @functools.cached_property
    def context(self) -> int:  # computed once: it is asked per item of every batch
        return synth_context_frames(self.dims)

    @functools.cached_property
    def decode_context(self) -> int:
        """Frames of z around a piece that its decoder needs (its receptive field, rounded up,
        plus one): of the `context` frames computed by the flow, only these are decoded."""
        return int(math.ceil(decoder_receptive_field_frames(self.dims))) + 1

    def _copy_out(self, audios: list[torch.Tensor], lengths: list[int]) -> PendingAudio:
        """One device->host copy of the batch's audio (concatenated on the device first)."""
        flat = audios[0] if len(audios) == 1 else torch.cat(audios)
        spans, pos = [], 0
        for n in lengths:
            spans.append((pos, pos + n))
            pos += n
        if self.device.type != "cuda":
            return PendingAudio(host_read(flat.float(), "piper batch: the audio").numpy(), spans)
        host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
        done = torch.cuda.Event()
        self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._copy_stream):
            flat.record_stream(self._copy_stream)
            host.copy_(flat.float(), non_blocking=True)
            done.record()
        return PendingAudio(host, spans, done)

    def _check(self, items: Sequence[VitsItem | VitsContinuation]) -> None:
        for it in items:
            if isinstance(it, VitsContinuation):
                if it.m.shape[-1] <= it.left:
                    raise ValueError("a continuation has no frames left")
                continue
            if len(it.ids) == 0:
                raise ValueError("an item has no phoneme ids")
            if min(it.ids) < 0 or max(it.ids) >= self.dims.n_vocab:
                raise ValueError(f"phoneme id out of range 0..{self.dims.n_vocab - 1}")
            if self.dims.n_speakers > 1 and not 0 <= it.speaker_id < self.dims.n_speakers:
                raise ValueError(f"speaker id {it.speaker_id} out of range 0..{self.dims.n_speakers - 1}")

    def _stage(self, name: str):
        return self.offloader.stage(name) if self.offloader else nullcontext()

    def _encode(self, items: Sequence[VitsItem], gens) -> EncodeOutputs:
        """One padded text-encoder + duration batch."""
        t_lens = [len(it.ids) for it in items]
        T = geometric_bucket(max(t_lens)) if self.buckets else max(t_lens)  # masked padding
        ids = np.zeros((len(items), T), dtype=np.int64)
        for i, it in enumerate(items):
            ids[i, : t_lens[i]] = it.ids
        sid = None
        if self.dims.n_speakers > 1:
            sid = self._to_device(torch.tensor([it.speaker_id for it in items]))
        noise = self._noise(items, gens, t_lens, 2, lambda it: it.noise_w)
        x = EncodeInputs(
            ids=self._to_device(torch.from_numpy(ids)),
            lengths=self._to_device(torch.tensor(t_lens)),
            length_scale=self._to_device(torch.tensor([it.length_scale for it in items], dtype=torch.float32)),
            dur_noise=F.pad(noise, (0, T - noise.shape[2])) if T > noise.shape[2] else noise,
            sid=sid,
        )
        with self._stage("encode"):
            return self.stages.encode(x)

    def encode_groups(self, t_lens: Sequence[int], waste: float = 0.25) -> list[list[int]]:
        """Length-aware encoder batches: items sorted by length, a group grows while its padded
        size stays within (1 + waste) x its real size. Order inside the result is by length."""
        order = sorted(range(len(t_lens)), key=lambda i: t_lens[i], reverse=True)
        groups: list[list[int]] = []
        for i in order:
            if groups:
                grp = groups[-1]
                longest = t_lens[grp[0]]
                if longest * (len(grp) + 1) <= (1 + waste) * (sum(t_lens[j] for j in grp) + t_lens[i]):
                    grp.append(i)
                    continue
            groups.append([i])
        return groups

    def _run_packed(self, items: Sequence[VitsItem | VitsContinuation], early: Sequence[int] = (),
                    max_cost: int | None = None, over: dict[int, int] | None = None, spare: bool = False):
        """Encoder in length groups; flow + decoder on the pieces laid end to end (a gap of
        zeros between), in runs of at most max_decode_frames. -> audio per item (on the
        device), its length in samples, and the continuation of each item that was cut."""
        m = self.model
        B = len(items)
        C = self.dims.inter_channels
        # every item as a segment: frame-level prior [C, L], noise, speaker, context on the left
        segs: list[list] = [None] * B  # type: ignore[list-item]
        durs: list[np.ndarray | None] = [None] * B
        fresh = [i for i, it in enumerate(items) if isinstance(it, VitsItem)]
        n_groups = 0
        if fresh:
            f_items = [items[i] for i in fresh]
            gens = [self._generator(it.seed) for it in f_items]
            groups = self.encode_groups([len(it.ids) for it in f_items])
            n_groups = len(groups)
            enc = [(grp, self._encode([f_items[j] for j in grp], [gens[j] for j in grp])) for grp in groups]
            # the one device->host read of the batch: every item's frame count (the shapes of
            # what follows), and the durations of its ids (word timestamps), in one transfer
            order = [j for grp in groups for j in grp]
            host = host_read(torch.cat([e.frame_lengths.float() for _, e in enc]
                                       + [e.durations.reshape(-1).float() for _, e in enc]),
                             "piper batch: frame counts and durations").numpy()
            y: dict[int, int] = dict(zip(order, host[: len(order)].astype(np.int64).tolist()))
            pos = len(order)
            for grp, e in enc:
                T = e.durations.shape[1]
                for r, j in enumerate(grp):
                    durs[fresh[j]] = host[pos + r * T : pos + r * T + len(f_items[j].ids)].astype(np.int32)
                pos += len(grp) * T
            for j, it in enumerate(f_items):  # over its limit: one frame of work, result replaced
                if over is not None and over_limit(it, y[j]):
                    over[fresh[j]] = y[j]
                    y[j] = 1
            for grp, e in enc:
                n = max(y[j] for j in grp)
                mm, ll, _ = m.expand(e.m_p, e.logs_p, e.durations, e.frame_lengths, n)  # [b, C, n]
                for r, j in enumerate(grp):
                    g = None if e.g is None else e.g[r, :, 0].float()
                    segs[fresh[j]] = [mm[r, :, : y[j]], ll[r, :, : y[j]], None, g, 0,
                                      len(f_items[j].ids) / max(y[j], 1)]
            for j, it in enumerate(f_items):  # after the duration noise, from the same generator
                if it.noise_scale:
                    segs[fresh[j]][2] = torch.randn(C, y[j], generator=gens[j], device=self.device) * it.noise_scale
        for i, it in enumerate(items):
            if isinstance(it, VitsContinuation):
                segs[i] = [it.m, it.logs, it.noise, it.g, it.left, it.ids_per_frame]

        # cut: pieces (item, span [lo, hi) of its segment, delivered [keep_lo, keep_hi))
        ctx = self.context
        early_set = set(early)
        pieces: list[tuple[int, int, int, int, int]] = []
        rests: list[VitsContinuation | None] = [None] * B
        for i, (mk, lk, nk, gk, left, ipf) in enumerate(segs):
            L = mk.shape[1]
            cut = self.head_frames(L - left, spare) if i in early_set else 0
            cut = cut or self.piece_frames(L - left, ipf, max_cost)
            if not cut:
                pieces.append((i, 0, L, left, L))
                continue
            c = left + cut
            pieces.append((i, 0, min(L, c + ctx), left, c))
            lo = c - min(ctx, c)
            rests[i] = VitsContinuation(mk[:, lo:].clone(), lk[:, lo:].clone(),
                                        None if nk is None else nk[:, lo:].clone(), gk, c - lo, ipf)

        # pack the pieces end to end, `gap` zero frames between
        dt = segs[0][0].dtype
        lens = [hi - lo for _, lo, hi, _, _ in pieces]
        starts, pos = [], 0
        for n in lens:
            starts.append(pos)
            pos += n + self.gap
        P = pos - self.gap

        def pack(get, channels: int, dtype) -> torch.Tensor:  # -> [channels, P]
            parts = []
            gap = torch.zeros(channels, self.gap, device=self.device, dtype=dtype)
            for k, (i, lo, hi, _, _) in enumerate(pieces):
                if k:
                    parts.append(gap)
                t = get(segs[i])
                parts.append(torch.zeros(channels, hi - lo, device=self.device, dtype=dtype) if t is None
                             else t[:, lo:hi] if t.dim() == 2 else t[:, None].expand(channels, hi - lo).to(dtype))
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

        m_pk = pack(lambda sg: sg[0], C, dt)
        logs_pk = pack(lambda sg: sg[1], C, dt)
        z_noise = pack(lambda sg: sg[2], C, torch.float32)
        g_pk = pack(lambda sg: sg[3], self.dims.gin_channels, torch.float32) if self.dims.n_speakers > 1 else None
        mask_np = np.zeros(P, dtype=np.float32)
        for st, n in zip(starts, lens):
            mask_np[st : st + n] = 1.0
        mask = self._to_device(torch.from_numpy(mask_np)).view(1, 1, P)

        hop = self.dims.hop_length
        # what the decoder needs of each piece: the delivered frames and the decoder's own
        # receptive field around them; the flow's context beyond that only feeds the flow
        dctx = self.decode_context
        dspans = [(max(lo, k0 - dctx), min(hi, k1 + dctx)) for _, lo, hi, k0, k1 in pieces]
        split = isinstance(self.stages, EagerStages)  # graphed stages run flow + decoder fused

        def bucket(L: int) -> int:  # a masked tail makes shapes repeat (oneDNN kernels reused)
            return geometric_bucket(L) if self.buckets else L

        def dbucket(L: int) -> int:  # decoder-only calls
            return decode_bucket(L) if self.buckets else L

        def bucketed(t: torch.Tensor, L: int, to=bucket) -> torch.Tensor:  # [.., L] -> [.., to(L)]
            return F.pad(t, (0, to(L) - L)) if to(L) > L else t

        def gap_mask(run_starts: list[int], run_lens: list[int], L: int, to=bucket) -> GapMask:
            """Eager decoder mask: only the gap frames between pieces and the bucket tail."""
            gaps = [np.arange(s0 + n0, s1) for s0, n0, s1 in zip(run_starts, run_lens, run_starts[1:])]
            idx = np.concatenate([np.zeros(0, np.int64), *gaps]).astype(np.int64)
            return GapMask(self._to_device(torch.from_numpy(idx)), to(L), tail_from=L)

        def synth_span(a: int, b: int, run: list[int]) -> tuple[torch.Tensor, dict[int, int]]:
            """Flow + decoder over packed frames [a, b) holding the pieces of `run` -> audio
            and, per piece, the audio frame of its segment's frame 0 (a bucket tail cut off)."""
            L = b - a
            x = SynthInputs(*(None if t is None else bucketed(t[None, :, a:b], L)
                              for t in (m_pk, logs_pk, z_noise, mask[0], g_pk)))
            Lb = x.m.shape[-1]
            if split and len(run) == 1 and L > self.decode_cap and dspans[run[0]] == pieces[run[0]][1:3]:
                # one long sentence: flow over it whole, decoder in windows, so its activations
                # stay bounded by decode_cap frames (peak RSS, see Transforms.cpu_decode_frames)
                cap, dctx_ = self.decode_cap, self.decode_context
                with self._stage("synth"):
                    z = self.stages.flow(x)  # [1, C, Lb]
                    outs = []
                    for w0 in range(0, L, cap):
                        w1 = min(L, w0 + cap)
                        d0, d1 = max(0, w0 - dctx_), min(L, w1 + dctx_)
                        n = d1 - d0
                        zd = bucketed(z[:, :, d0:d1], n, dbucket)
                        gd = None if g_pk is None else bucketed(g_pk[None, :, a + d0 : a + d1], n, dbucket)
                        dmask = gap_mask([0], [n], n, dbucket) if zd.shape[-1] > n else None
                        outs.append(self.stages.decode(zd, gd, dmask)[(w0 - d0) * hop : (w1 - d0) * hop])
                    audio = torch.cat(outs)
                return audio, {p: starts[p] - a - pieces[p][1] for p in run}
            if not split or all(dspans[p] == pieces[p][1:3] for p in run):
                if isinstance(self.stages, EagerStages) and (len(run) > 1 or Lb > L):
                    # eager: zero only the gap and tail frames (O(gap), in place)
                    x.decode_mask = gap_mask([starts[p] - a for p in run], [lens[p] for p in run], L)
                with self._stage("synth"):
                    audio = self.stages.synth(x, single_item=len(run) == 1 and Lb == L)[: L * hop]
                return audio, {p: starts[p] - a - pieces[p][1] for p in run}
            # a cut piece: run the flow over its whole span, decode only what dspans keeps
            with self._stage("synth"):
                z = self.stages.flow(x)  # [1, C, Lb]
                zs, gs, base, d_starts, d_lens, pos = [], [], {}, [], [], 0
                for p in run:
                    (_, lo, _, _, _), (d0, d1) = pieces[p], dspans[p]
                    if zs:  # zeros between pieces (for g too: each piece's speaker, none in gaps)
                        zs.append(z.new_zeros(1, C, self.gap))
                        gs.append(None if g_pk is None else g_pk.new_zeros(1, g_pk.shape[0], self.gap))
                        pos += self.gap
                    src = starts[p] - a + d0 - lo
                    zs.append(z[:, :, src : src + d1 - d0])
                    gs.append(None if g_pk is None else g_pk[None, :, a + src : a + src + d1 - d0])
                    base[p] = pos - d0
                    d_starts.append(pos)
                    d_lens.append(d1 - d0)
                    pos += d1 - d0
                zd = bucketed(torch.cat(zs, dim=2), pos, dbucket)
                gd = None if g_pk is None else bucketed(torch.cat(gs, dim=2), pos, dbucket)
                dmask = gap_mask(d_starts, d_lens, pos, dbucket) if len(run) > 1 or zd.shape[-1] > pos else None
                audio = self.stages.decode(zd, gd, dmask)[: pos * hop]
            return audio, base

        audios: list[torch.Tensor] = [None] * B  # type: ignore[list-item]
        for run in self._decode_groups(lens):
            a = starts[run[0]]
            audio, base = synth_span(a, starts[run[-1]] + lens[run[-1]], run)
            for p in run:
                i, _, _, k0, k1 = pieces[p]
                audios[i] = audio[(base[p] + k0) * hop : (base[p] + k1) * hop]
        self.last_stats = {"batch": B, "frames": float(sum(lens)), "encoder_groups": float(n_groups),
                           "cut": float(sum(r is not None for r in rests))}
        return audios, [(k1 - k0) * hop for _, _, _, k0, k1 in pieces], rests, durs

    def _run_padded(self, items: Sequence[VitsItem], over: dict[int, int] | None = None
                    ) -> tuple[list[torch.Tensor], list[int], list[np.ndarray]]:
        """The reference layout: one padded batch through every stage, dense masks everywhere
        (always eager; items are never cut)."""
        m = self.model
        B = len(items)
        gens = [self._generator(it.seed) for it in items]
        t_lens = [len(it.ids) for it in items]
        ids = np.zeros((B, max(t_lens)), dtype=np.int64)
        for i, it in enumerate(items):
            ids[i, : t_lens[i]] = it.ids
        sid = self._to_device(torch.tensor([it.speaker_id for it in items])) if self.dims.n_speakers > 1 else None
        dur_noise = self._noise(items, gens, t_lens, 2, lambda it: it.noise_w)
        length_scale = self._to_device(torch.tensor([it.length_scale for it in items], dtype=torch.float32))
        with self._stage("encode"):
            g = m.speaker_embedding(sid)
            m_p, logs_p, _, durations = m.encode(self._to_device(torch.from_numpy(ids)),
                                                 self._to_device(torch.tensor(t_lens)), g, dur_noise, length_scale)
        y_t = m.frame_lengths(durations)
        # the one device->host read of the batch: frame counts (the shapes of what follows)
        # and the ids' durations
        host = host_read(torch.cat([y_t.float(), durations.reshape(-1).float()]),
                         "piper batch: frame counts and durations").numpy()
        y_len = host[:B].astype(np.int64).tolist()
        T = durations.shape[1]
        durs = [host[B + i * T : B + i * T + n].astype(np.int32) for i, n in enumerate(t_lens)]
        if over is not None and any(over_limit(it, n) for it, n in zip(items, y_len)):
            for i, it in enumerate(items):  # over its limit: one frame of work, result replaced
                if over_limit(it, y_len[i]):
                    over[i], y_len[i] = y_len[i], 1
            y_t = upload(y_len, y_t.dtype, y_t.device)
        n = max(y_len)
        mm, ll, y_mask = m.expand(m_p, logs_p, durations, y_t, n)
        z_noise = self._noise(items, gens, y_len, self.dims.inter_channels, lambda it: it.noise_scale)
        hop = self.dims.hop_length
        audios = []
        with self._stage("synth"):
            z = m.flow_reverse(mm, ll, y_mask, z_noise, g)
            for run in self._decode_groups(y_len):
                idx = upload(run, torch.long, self.device)
                nn_ = max(y_len[i] for i in run)
                full = all(y_len[i] == nn_ for i in run)
                audio = m.decode(z.index_select(0, idx)[:, :, :nn_],
                                 None if full else y_mask.index_select(0, idx)[:, :, :nn_],
                                 None if g is None else g.index_select(0, idx))
                audios.extend(audio[j, 0, : y_len[i] * hop] for j, i in enumerate(run))
        self.last_stats = {"batch": B, "frames": float(sum(y_len)), "encoder_groups": 1.0}
        return audios, [n * hop for n in y_len], durs

    @property
    def decode_cap(self) -> int:
        """Frames per decoder call: max_decode_frames, on CPU at most cpu_decode_frames."""
        cap, cpu_cap = self.config.max_decode_frames, self.transforms.cpu_decode_frames
        if self.device.type == "cpu" and cpu_cap is not None:
            return min(cap, cpu_cap)
        return cap

    def _decode_groups(self, y_lengths: Sequence[int]) -> list[list[int]]:
        """Consecutive runs of items whose frames (with gaps) stay under decode_cap."""
        cap = self.decode_cap
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
