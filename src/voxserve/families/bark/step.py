"""Bark as a step runner: sentences join and leave between decode steps (continuous batching).

Each sequence (one unit, one sentence) goes through Bark's stages on its own schedule:

1. semantic: its prompt (the text's embedding plus its speaker's semantic history, then the
   infer token: [max_input_semantic_length + 1, H] embeddings) is prefilled when it joins,
   then one token a step, batched with the other semantic rows; Bark's suppressed tokens and
   EOS rule (min_eos_p) apply per row; it ends at EOS or after max_new_tokens.
2. coarse: autoregressive in sliding windows, codebooks alternating, batched with the other
   coarse rows. Each window has a prompt of its own (semantic context + the coarse history),
   so a window change re-prefills that row only; its sampling stream runs on across windows.
3. fine + EnCodec, one-shot for that sentence when its coarse ends (inside that step): the
   fine model is not causal and runs per sentence anyway (see runner.py).

The stages are the algorithms of transformers' BarkSemanticModel / BarkCoarseModel.generate,
row by row (coarse histories are prepared by BarkCoarseModel.preprocess_histories), with the
same logits processing in the same order (suppression, EOS rule, codebook alternation, then
log-softmax) and the same per-sentence streams as BarkRunner (seed * 3 + stage), so greedy
runs give BarkRunner's tokens and audio. A sentence's tokens never depend on its neighbours:
its logits are its own (runtime/step.py) and so is its random stream; speakers may differ
per row.

CPU offload moves one stage's weights in at a time, which interleaved stages cannot share:
with offload on, `BarkVoice.step_runner()` is None and the voice runs BarkRunner's one-shot
batches.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...runtime.step import Decoder, LMSequence, StopRule, TokenSampler, hf_forward
from ...runtime.sync import upload
from ...voice import StepResult, StepRunner, Unit
from .runner import BarkItem, BarkRunner

MASK63 = (1 << 63) - 1


@dataclass(eq=False)
class _Sentence:
    """One sequence's state across its stages."""

    key: Hashable
    item: BarkItem
    history: dict[str, torch.Tensor] | None = None
    semantic: list[int] | None = None
    # coarse: the semantic context ([L] ids, history first), the coarse tokens so far (history
    # first, [len_history + made]) and how many of them are the history's
    context: torch.Tensor | None = None
    base: int = 0
    coarse: torch.Tensor | None = None
    n_history: int = 0
    n_coarse: int = 0
    """Coarse tokens to make (Bark's length rule from the semantic length)."""
    coarse_sampler: TokenSampler | None = None

    @property
    def made(self) -> int:
        return self.coarse.numel() - self.n_history


class BarkStepRunner(StepRunner):
    """Bark's semantic and coarse stages as continuous batches over a BarkRunner's model."""

    def __init__(self, runner: BarkRunner, capacity: int = 8):
        self.capacity = capacity
        self._pending: list[tuple[Hashable, Unit]] = []
        self._rows: dict[Hashable, _Sentence] = {}
        self.bind(runner)

    def bind(self, runner: BarkRunner | None) -> None:
        """Run `runner`'s model from now on; None lets the model go (idle unload: the engine's
        worker keeps this instance, so a reloaded voice binds its new runner here)."""
        if self.active:
            raise RuntimeError("a Bark step runner with sequences in it cannot change its model")
        self.runner = runner
        if runner is None:
            self.semantic = self.coarse_decoder = self._suppress = None
            return
        m = runner.model
        sc, cc = runner.semantic_config, runner.coarse_config
        self.device = runner.device
        self.semantic = Decoder(hf_forward(m.semantic), self._semantic_scores, device=self.device)
        self.coarse_decoder = Decoder(hf_forward(m.coarse_acoustics), self._coarse_scores, device=self.device)
        vocab = m.semantic.config.output_vocab_size
        pad = sc.semantic_pad_token
        suppress = torch.ones(vocab, dtype=torch.bool, device=self.device)
        suppress[: sc.semantic_vocab_size] = False
        suppress[pad] = False  # EOS (= the semantic pad) and the semantic tokens stay
        self._suppress = suppress  # [V]
        self.eos = int(sc.eos_token_id)
        self.min_eos_p = sc.min_eos_p
        self.ratio = cc.coarse_rate_hz / sc.semantic_rate_hz * cc.n_coarse_codebooks  # coarse per semantic token
        self.max_semantic_history = int(np.floor(cc.max_coarse_history / self.ratio))

    @property
    def active(self) -> int:
        return len(self._pending) + len(self._rows)

    def join(self, key: Hashable, unit: Unit) -> None:
        # a key twice is the caller's bug, not the unit's: raised here, not as a StepResult
        if key in self._rows or any(k == key for k, _ in self._pending):
            raise ValueError(f"sequence key {key!r} is already active")
        self._pending.append((key, unit))

    def leave(self, key: Hashable) -> None:
        self._pending = [(k, u) for k, u in self._pending if k != key]
        if self._rows.pop(key, None) is not None:
            self.semantic.remove(key)
            self.coarse_decoder.remove(key)

    # ------------------------------------------------------------------ step
    def step(self) -> list[StepResult]:
        out: list[StepResult] = []
        with torch.no_grad():
            for key, unit in self._pending:
                try:
                    self._start(key, unit)
                except Exception as e:  # this unit only: the others go on
                    self._rows.pop(key, None)
                    out.append(StepResult(key, error=e))
            self._pending = []
            for seq in self._advance(self.semantic, out):
                row = self._rows[seq.key]
                row.semantic = seq.output
                try:
                    self._to_coarse(row, out)
                except Exception as e:
                    self._fail(row, e, out)
            for seq in self._advance(self.coarse_decoder, out):
                row = self._rows[seq.key]
                row.coarse = torch.cat([row.coarse, upload(seq.tokens, torch.long, self.device)])
                try:
                    if row.made < row.n_coarse:
                        self._next_window(row)
                    else:
                        self._finish(row, out)
                except Exception as e:
                    self._fail(row, e, out)
        return out

    def _advance(self, decoder: Decoder, out: list[StepResult]) -> list[LMSequence]:
        """One step of a decoder; if its model call fails, its rows fail (the rest go on)."""
        if not len(decoder):
            return []
        try:
            return decoder.step()
        except Exception as e:
            for seq in decoder.fail_all():
                self._rows.pop(seq.key, None)
                out.append(StepResult(seq.key, error=e))
            return []

    def _fail(self, row: _Sentence, e: BaseException, out: list[StepResult]) -> None:
        self.leave(row.key)
        out.append(StepResult(row.key, error=e))

    # ------------------------------------------------------------------ semantic
    def _start(self, key: Hashable, unit: Unit) -> None:
        item = unit.payload
        if not isinstance(item, BarkItem):
            raise TypeError(f"a Bark step runner runs BarkItem units, not {type(item).__name__}")
        r, sc = self.runner, self.runner.semantic_config
        ids, mask, history = r._history(item.speaker, [item.text])  # ids, mask [1, L]
        row = _Sentence(key, item, history)
        L = sc.max_input_semantic_length
        ids = (ids + sc.text_encoding_offset).masked_fill(~mask.bool(), sc.text_pad_token)[0, :L]
        if history is not None:
            hist = history["semantic_prompt"][-L:]
            hist = F.pad(hist, (0, L - len(hist)), value=sc.semantic_pad_token)
        else:
            hist = torch.full((L,), sc.semantic_pad_token, dtype=torch.int, device=self.device)
        emb = r.model.semantic.input_embeds_layer
        infer = upload([sc.semantic_infer_token], torch.long, self.device)
        prompt = torch.cat([emb(ids) + emb(hist), emb(infer)])  # [L + 1, H]: text + history, infer token
        sampler = TokenSampler(item.temperatures[0], (item.seed * 3 + 0) & MASK63, device=self.device)
        stop = StopRule(eos=frozenset({self.eos}), max_new_tokens=int(sc.max_new_tokens))
        self._rows[key] = row
        self.semantic.add(LMSequence(key, prompt, sampler, stop, row))

    def _semantic_scores(self, seqs, logits: torch.Tensor) -> torch.Tensor:
        # logits [n, V]; Bark's order: suppress, EOS rule, log-softmax (renormalize_logits)
        scores = logits.masked_fill(self._suppress, float("-inf"))
        if self.min_eos_p:
            # EOS once its probability passes min_eos_p: every other token -inf for that row
            p_eos = scores.softmax(-1)[:, self.eos : self.eos + 1]  # [n, 1]
            only_eos = torch.full_like(scores, float("-inf"))
            only_eos[:, self.eos] = scores[:, self.eos]
            scores = torch.where(p_eos > self.min_eos_p, only_eos, scores)
        return scores.log_softmax(-1)

    # ------------------------------------------------------------------ coarse
    def _to_coarse(self, row: _Sentence, out: list[StepResult]) -> None:
        r, sc, cc = self.runner, self.runner.semantic_config, self.runner.coarse_config
        n_sem = torch.tensor([len(row.semantic)])
        # Bark's coarse length: whole frames of n_coarse codebooks (its float32 arithmetic)
        n = torch.round(torch.floor(n_sem * self.ratio / cc.n_coarse_codebooks) * cc.n_coarse_codebooks).int()
        row.n_coarse = int(n)
        if row.n_coarse == 0:  # the semantic model ended at once: nothing to say
            self._rows.pop(row.key, None)
            out.append(StepResult(row.key, np.zeros(0, dtype=np.float32)))
            return
        sem_hist, coarse_hist = r.model.coarse_acoustics.preprocess_histories(
            history_prompt=row.history, max_coarse_history=cc.max_coarse_history,
            semantic_to_coarse_ratio=self.ratio, batch_size=1, semantic_generation_config=sc,
            codebook_size=r.codebook_size)  # [1, Hs], [1, Hc]
        semantic = upload(row.semantic, torch.long, self.device)
        row.context = torch.cat([sem_hist[0].long().to(self.device), semantic])  # [Hs + n_sem]
        row.base = sem_hist.shape[1]
        row.coarse = coarse_hist[0].long().to(self.device)
        row.n_history = row.coarse.numel()
        row.coarse_sampler = TokenSampler(row.item.temperatures[1], (row.item.seed * 3 + 1) & MASK63,
                                          device=self.device)
        self._next_window(row)

    def _next_window(self, row: _Sentence) -> None:
        """The row's next sliding window as a sequence of its own (a fresh prompt: prefilled)."""
        cc = self.runner.coarse_config
        made = row.made
        idx = row.base + int(round(made / self.ratio))
        ctx = row.context[max(0, idx - self.max_semantic_history):][: cc.max_coarse_input_length]
        ctx = F.pad(ctx, (0, cc.max_coarse_input_length - len(ctx)), value=cc.coarse_semantic_pad_token)
        infer = ctx.new_full((1,), cc.coarse_infer_token)
        prompt = torch.cat([ctx, infer, row.coarse[-cc.max_coarse_history:]])  # [256 + 1 + history]
        n = min(int(cc.sliding_window_len), row.n_coarse - made)
        self.coarse_decoder.add(LMSequence(row.key, prompt, row.coarse_sampler, StopRule(max_new_tokens=n), row))

    def _coarse_scores(self, seqs, logits: torch.Tensor) -> torch.Tensor:
        # logits [n, V]; codebooks alternate within a window: even tokens from the first
        # codebook's range, odd ones above it (Bark masks only below for those), then log-softmax
        sv, cb = self.runner.semantic_config.semantic_vocab_size, self.runner.codebook_size
        cols = torch.arange(logits.shape[-1], device=logits.device)
        first = upload([len(s.tokens) % 2 == 0 for s in seqs], torch.bool, logits.device)[:, None]  # [n, 1]
        masked = torch.where(first, (cols < sv) | (cols >= sv + cb), (cols < sv + cb)[None])  # [n, V]
        return logits.masked_fill(masked, float("-inf")).log_softmax(-1)

    # ------------------------------------------------------------------ fine + codec
    def _finish(self, row: _Sentence, out: list[StepResult]) -> None:
        r = self.runner
        coarse = row.coarse[row.n_history:]  # [n_coarse]
        with r._lock:  # the fine sampler hook is the runner's shared state
            fine = r.fine_tokens(coarse, row.history, row.item.temperatures[2], row.item.seed)
            audio = r.decode_audio(fine)
        self._rows.pop(row.key, None)
        out.append(StepResult(row.key, audio))

