"""CosyVoice 2 as a step runner: the language model's sequences batched continuously, their
speech tokens turned into audio in chunks batched across requests.

One `step()`:
1. schedule: newcomers' prompts are laid out (`CosyLM.prompt_embeddings`) and joined to the
   decoder; the chunks that are ready (`ChunkSchedule.ready`) are collected, first chunks
   first, then the oldest;
2. execute: one decode step of every running sequence (`runtime.step.Decoder`: a newcomer is
   prefilled, the others decode one token, each sampled from its own generator); then
   token2wav batches of ready chunks (flow + HiFT, padded across requests) while the step's
   time budget lasts, at least one batch a step so that audio always moves;
3. update: each chunk's audio is a StepResult (final with the sentence's last chunk); a
   sequence that failed leaves alone.

A sequence's tokens and audio never depend on what runs beside it: its sampler has its own
generator, the decoder's rows are masked, and token2wav rows are cut back to their own frames.
The per-request streaming state (schedule, flow and HiFT caches) lives on the sequence.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import AudioTooLongError
from ...runtime.step import Decoder, LMSequence, StopRule
from ...voice import StepResult, StepRunner, Unit
from .schedule import ChunkSchedule

# token2wav time a step may spend beyond its first batch: first audio of a newcomer is not held
# back by other requests' later chunks, and decode steps keep their pace under load
CHUNK_BUDGET_S = 0.25


@dataclass(eq=False)
class _Seq:
    key: Hashable
    unit: Unit
    schedule: ChunkSchedule
    stream: Any
    """The token2wav state of this sequence (its flow and HiFT caches)."""
    lm: LMSequence | None = None
    finished: bool = False
    """The language model has stopped (EOS or its length bound)."""
    tokens: list[int] = field(default_factory=list)
    ready_since: float = 0.0


class CosyStepRunner(StepRunner):
    """The language model and token2wav of one CosyVoice 2 model, for every voice using it."""

    def __init__(self, model, capacity: int = 16, max_chunk_rows: int = 8, streaming: bool = True):
        self.model = model  # a CosyModel (model.py)
        self.capacity = capacity
        self.max_chunk_rows = max_chunk_rows
        self.streaming = streaming
        self.decoder = Decoder(model.lm_forward, device=model.device, next_input=model.next_input,
                               pick=model.pick)
        self._pending: list[tuple[Hashable, Unit]] = []
        self._seqs: dict[Hashable, _Seq] = {}

    @property
    def active(self) -> int:
        return len(self._pending) + len(self._seqs)

    def join(self, key: Hashable, unit: Unit) -> None:
        if key in self._seqs or any(k == key for k, _ in self._pending):
            raise ValueError(f"sequence key {key!r} is already active")
        self._pending.append((key, unit))

    def leave(self, key: Hashable) -> None:
        self._pending = [(k, u) for k, u in self._pending if k != key]
        if self._seqs.pop(key, None) is not None:
            self.decoder.remove(key)

    # ------------------------------------------------------------------ step
    def step(self) -> list[StepResult]:
        out: list[StepResult] = []
        t0 = time.perf_counter()
        with torch.inference_mode():
            self._start_pending(out)
            if len(self.decoder):
                self._decode(out)
            self._token2wav(out, t0)
        return out

    def _start_pending(self, out: list[StepResult]) -> None:
        room = max(0, self.capacity - len(self._seqs))
        start, self._pending = self._pending[:room], self._pending[room:]
        for key, unit in start:
            try:
                item = unit.payload
                seq = _Seq(key, unit, self.model.chunk_schedule(item.prompt.n_speech_tokens),
                           self.model.start_stream(item))
                most = item.max_tokens
                if item.max_audio_s is not None:  # one token past the sentence's audio limit is enough to refuse it
                    most = min(most, self.model.audio_tokens(item.max_audio_s, item.speed) + 1)
                seq.lm = LMSequence(key, self.model.prompt(item), self.model.sampler(item),
                                    StopRule(eos=self.model.eos, max_new_tokens=most), state=item)
                self.decoder.add(seq.lm)
                self._seqs[key] = seq
            except Exception as e:  # this unit only
                out.append(StepResult(key, error=e))

    def _decode(self, out: list[StepResult]) -> None:
        try:
            stopped = self.decoder.step()
        except Exception as e:
            # the cache may be half-updated: every sequence in it fails, nothing else
            for s in self.decoder.fail_all():
                self._seqs.pop(s.key, None)
                out.append(StepResult(s.key, error=e))
            return
        now = time.perf_counter()
        for s in stopped:
            seq = self._seqs.get(s.key)
            if seq is None:
                continue
            item = seq.unit.payload
            made = len(s.output)
            if item.max_audio_s is not None and made > self.model.audio_tokens(item.max_audio_s, item.speed):
                # over the sentence's limit: refused now, before token2wav runs on the rest of it
                self.leave(s.key)
                out.append(StepResult(s.key, error=AudioTooLongError(
                    "a sentence", self.model.audio_seconds(made, item.speed), item.max_audio_s,
                    "max_sentence_audio_seconds")))
                continue
            seq.finished = True
        for seq in self._seqs.values():
            if seq.lm is not None:
                seq.tokens = seq.lm.output
                if not seq.ready_since and self._ready(seq) is not None:
                    seq.ready_since = now

    def _ready(self, seq: _Seq) -> tuple[int, bool] | None:
        if not self._streams(seq):
            # the whole sentence at once (full attention; a speed change stretches all of it)
            return (len(seq.tokens), True) if seq.finished else None
        return seq.schedule.ready(len(seq.tokens), seq.finished)

    def _streams(self, seq: _Seq) -> bool:
        return self.streaming and seq.unit.payload.speed == 1.0

    def _trim_caches(self) -> None:
        """Hold the streams' flow caches within the model's budget: drop the largest first."""
        held = [(s.stream.flow.bytes, s) for s in self._seqs.values() if s.stream.flow is not None]
        total = sum(b for b, _ in held)
        for b, seq in sorted(held, key=lambda x: -x[0]):
            if total <= self.model.flow_cache_budget:
                break
            seq.stream.flow = None
            total -= b

    def _token2wav(self, out: list[StepResult], t0: float) -> None:
        self._trim_caches()
        while True:
            jobs = [(seq, r) for seq in self._seqs.values() if (r := self._ready(seq)) is not None]
            if not jobs:
                return
            # first chunks first (time to first audio), then the chunk waiting longest
            jobs.sort(key=lambda j: (not j[0].schedule.first, j[0].ready_since))
            batch = jobs[: self.max_chunk_rows]
            try:
                waves = self.model.token2wav([
                    (seq.stream, seq.tokens, seq.schedule.offset, end, final, self._streams(seq))
                    for seq, (end, final) in batch])
            except Exception as e:
                for seq, _ in batch:
                    self.leave(seq.key)
                    out.append(StepResult(seq.key, error=e))
                continue
            for (seq, (end, final)), wave in zip(batch, waves):
                seq.schedule.advance(end)
                seq.ready_since = 0.0
                if final:
                    self._seqs.pop(seq.key, None)
                    self.decoder.remove(seq.key)
                elif self._ready(seq) is not None:
                    seq.ready_since = time.perf_counter()
                out.append(StepResult(seq.key, audio=np.asarray(wave, dtype=np.float32), final=final))
            if time.perf_counter() - t0 > CHUNK_BUDGET_S:
                return
