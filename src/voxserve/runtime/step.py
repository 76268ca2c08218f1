"""Continuous batching for causal language models: sequences join, decode together one token
a step, and leave, each sampled from its own generator.

What a family's step runner builds on (Bark's semantic and coarse stages today; a Qwen2-style
LM such as CosyVoice 2's later):

* `Decoder`: the sequences of one causal LM. `add` queues an `LMSequence` (prompt, sampler,
  stop rule, the family's state; its prompt is prefilled in the next `step`), `step` advances every sequence by one token (one batched decode call for
  the running ones, one prefill call per prompt length for the newcomers), applies the family's
  logits processing, samples every row at once on the device (each from its own generator),
  reads the tokens back once (the step's one host read, for the stop rules), and returns the
  sequences that stopped (they have left). `remove` drops one (a cancelled request).
* `KVBatch`: the batched KV cache under it. Rows are left-padded so that every row appends at
  the same column: a decode step is one call with per-row positions and an attention mask
  that hides the padding. A joiner is prefilled alone or with joiners of the same prompt
  length (no padding inside a prompt), then padded in; a leaving row is cut out, and the
  leading columns no remaining row uses are trimmed, so the cache is as wide as the longest
  row, never wider (an absolute-position model's block size holds as it does alone). It is
  the one place that reaches into the cache's layers (DynamicLayer.keys / .values).
* `TokenSampler`: one sequence's sampling: greedy at temperature 0, else Gumbel-max from its
  own seeded generator (optionally within the top k); `pick_rows` applies a batch's samplers
  at once; `StopRule`: EOS tokens, a token budget, a family predicate.

Batch invariance: a row's logits are the ones it gets alone (padding is masked to exactly zero
weight; only float summation order may differ), and its random draws come from its own
generator, so its tokens do not depend on what runs beside it.

The model is reached through an `LMForward` (`hf_forward` adapts a transformers causal LM):
forward(input_ids [B, T] or None, inputs_embeds [B, T, H] or None, attention_mask [B, K] or
None (no padding: every row has all K columns), position_ids [B, T], cache) -> logits [B, T, V],
the cache (a transformers DynamicCache, K = cached + T columns) updated in place.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .sync import host_read, upload

LMForward = Callable[[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor, Any], torch.Tensor]


def hf_forward(model: torch.nn.Module, cache_arg: str = "cache") -> LMForward:
    """An LMForward for a transformers causal LM. cache_arg: the keyword its forward takes the
    cache by (transformers 5 says "cache"; "past_key_values" before it)."""

    def forward(input_ids, inputs_embeds, attention_mask, position_ids, cache):
        mask = hf_mask(model.config, attention_mask, position_ids.shape[1], model.dtype)
        out = model(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=mask,
                    position_ids=position_ids, use_cache=True, return_dict=True, **{cache_arg: cache})
        return out.logits

    return forward


def hf_mask(config, mask: torch.Tensor | None, q: int, dtype: torch.dtype) -> torch.Tensor | None:
    """A decode step's key mask [B, K] -> the 4D mask transformers would build from it for its
    sdpa or eager attention ([B, 1, 1, K]: bool, or 0 / dtype's min added to the scores).
    Given the 2D mask, transformers checks on the host whether it has any padding (a read
    back per forward); a prepared mask is taken as it is. Other cases pass through."""
    if mask is None or q != 1:
        return mask
    keep = mask.bool()[:, None, None, :]
    if config._attn_implementation == "sdpa":
        return keep
    if config._attn_implementation == "eager":
        return torch.where(keep, torch.zeros((), device=keep.device, dtype=dtype), torch.finfo(dtype).min)
    return mask


def new_cache():
    """An empty transformers DynamicCache (its layers appear as the model fills them)."""
    from transformers import DynamicCache

    return DynamicCache()


# ---------------------------------------------------------------------- sampling
class TokenSampler:
    """One sequence's token choice. Temperature 0: argmax. Else the Gumbel-max trick:
    argmax(scores / T + Gumbel noise) is an exact sample of softmax(scores / T), the noise drawn
    from this sequence's own generator (one draw of the vocabulary's size per token), so its
    tokens never depend on other rows. top_k: sample among the k best only."""

    def __init__(self, temperature: float = 0.0, seed: int | None = None, top_k: int | None = None,
                 device: torch.device | str = "cpu"):
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, not {temperature!r}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be at least 1, not {top_k!r}")
        self.temperature = float(temperature)
        self.top_k = top_k
        self.generator: torch.Generator | None = None
        if self.temperature > 0:
            if seed is None:
                raise ValueError("a sampling TokenSampler needs a seed (its own stream)")
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(seed & ((1 << 63) - 1))

    def pick(self, scores: torch.Tensor) -> int:
        """scores [V] (processed logits) -> the chosen token id (one row, read back: for tools
        and tests; a Decoder picks every row at once with `pick_rows`)."""
        return int(pick_rows([self], scores[None])[0])


def pick_rows(samplers: Sequence[TokenSampler], scores: torch.Tensor) -> torch.Tensor:
    """Every row's token at once, on the device: scores [n, V] -> ids [n] (long), row i as
    samplers[i].pick would choose it alone (the same noise from its own generator, the same
    float32 arithmetic), with no read back to the host."""
    n, v = scores.shape
    out = scores.float()
    if all(s.generator is None for s in samplers):
        return out.argmax(-1)
    out = out.clone()
    dev = out.device
    ks = [s.top_k if s.generator is not None and s.top_k is not None and s.top_k < v else 0 for s in samplers]
    if any(ks):
        top = out.topk(max(ks), dim=-1).values  # [n, kmax], descending
        kth = top.gather(1, upload([max(k, 1) - 1 for k in ks], torch.long, dev)[:, None])  # [n, 1]
        kth = kth.masked_fill(upload([k == 0 for k in ks], torch.bool, dev)[:, None], float("-inf"))
        out.masked_fill_(out < kth, float("-inf"))
    # -log(-log U), U ~ U[0, 1): U = 0 gives -inf (never picked) and U < 1 keeps it finite,
    # so -inf scores stay -inf and nothing becomes NaN; greedy rows: no noise, temperature 1
    zero = out.new_zeros(v)
    noise = torch.stack([zero if s.generator is None else
                         torch.rand(v, dtype=torch.float32, device=dev, generator=s.generator).log_().neg_().log_()
                         for s in samplers])  # [n, V]
    temp = upload([s.temperature if s.generator is not None else 1.0 for s in samplers], torch.float32, dev)
    out.div_(temp[:, None]).sub_(noise)
    return out.argmax(-1)


@dataclass(frozen=True)
class StopRule:
    """When a sequence stops: on one of `eos` (kept as its last token), after max_new_tokens,
    or when predicate(tokens) says so (a family's own rule)."""

    eos: frozenset[int] = frozenset()
    max_new_tokens: int | None = None
    predicate: Callable[[list[int]], bool] | None = None

    def stops(self, tokens: list[int]) -> bool:
        if tokens and tokens[-1] in self.eos:
            return True
        if self.max_new_tokens is not None and len(tokens) >= self.max_new_tokens:
            return True
        return self.predicate is not None and self.predicate(tokens)


@dataclass(eq=False)
class LMSequence:
    """One sequence of a Decoder: its prompt, how it samples and stops, what it made."""

    key: Hashable
    prompt: torch.Tensor
    """[P] token ids (integer) or [P, H] input embeddings (float)."""
    sampler: TokenSampler
    stop: StopRule
    state: Any = None
    """The family's own (what the sequence is for)."""
    tokens: list[int] = field(default_factory=list)
    """Tokens made so far (a stopping EOS included)."""

    @property
    def output(self) -> list[int]:
        """The tokens without a stopping EOS."""
        if self.tokens and self.tokens[-1] in self.stop.eos:
            return self.tokens[:-1]
        return list(self.tokens)


# ---------------------------------------------------------------------- KV cache
class KVBatch:
    """Rows of one causal LM in one batched KV cache ([B, heads, W, head_dim] per layer), each
    row's tokens right-aligned: row i holds its `lengths[i]` tokens in columns W - lengths[i]
    .. W - 1 and zeros before them, which the attention mask hides."""

    def __init__(self, forward: LMForward):
        self.forward = forward
        self.keys: list[Hashable] = []
        self.lengths: list[int] = []
        # the same lengths on the cache's device ([B] long), kept there as rows join, decode
        # and leave: a decode step's mask and positions need no copy from the host
        self._lengths: torch.Tensor | None = None
        self.cache = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def width(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    def _layers(self, cache=None):
        return (cache if cache is not None else self.cache).layers

    def _mask(self, extra: int, device) -> torch.Tensor | None:
        # [B, W + extra]: 1 where row i has a token (its last lengths[i] columns, then `extra`);
        # None when no row is padded (known here on the host)
        w = self.width
        if min(self.lengths) == w:
            return None
        cols = torch.arange(w + extra, device=device)
        start = w - self._lengths
        return (cols[None, :] >= start[:, None]).long()

    def decode(self, inputs: torch.Tensor) -> torch.Tensor:
        """One token for every row, in row order: inputs [B] ids or [B, H] embeddings ->
        logits [B, V] of that position (float32)."""
        if len(inputs) != len(self.keys):
            raise ValueError(f"decode takes one input per row: {len(inputs)} for {len(self.keys)} rows")
        device = inputs.device
        mask = self._mask(1, device)  # [B, W + 1]
        pos = self._lengths[:, None]  # [B, 1]: each row's own next position
        ids, embeds = (inputs[:, None], None) if not inputs.is_floating_point() else (None, inputs[:, None])
        logits = self.forward(ids, embeds, mask, pos, self.cache)  # [B, 1, V]
        self.lengths = [n + 1 for n in self.lengths]
        self._lengths = self._lengths + 1
        return logits[:, -1].float()

    def prefill(self, keys: Sequence[Hashable], prompts: torch.Tensor) -> torch.Tensor:
        """New rows with prompts of one length: prompts [n, P] ids or [n, P, H] embeddings ->
        logits [n, V] of their last positions; the rows then join the batch."""
        n, p = prompts.shape[:2]
        device = prompts.device
        cache = new_cache()
        mask = None  # no padding inside a prompt
        pos = torch.arange(p, device=device)[None].expand(n, p)
        ids, embeds = (prompts, None) if not prompts.is_floating_point() else (None, prompts)
        logits = self.forward(ids, embeds, mask, pos, cache)  # [n, P, V]
        self._merge(list(keys), cache, p, torch.full((n,), p, dtype=torch.long, device=device))
        return logits[:, -1].float()

    def _merge(self, keys: list[Hashable], cache, p: int, lengths: torch.Tensor) -> None:
        if self.cache is None or not self.keys:
            self.cache, self.keys, self.lengths, self._lengths = cache, keys, [p] * len(keys), lengths
            return
        w = self.width
        width = max(w, p)
        for mine, theirs in zip(self._layers(), self._layers(cache)):
            # left-pad the narrower side (dim -2 is the column) so the last columns line up
            mine.keys = torch.cat([F.pad(mine.keys, (0, 0, width - w, 0)), F.pad(theirs.keys, (0, 0, width - p, 0))])
            mine.values = torch.cat([F.pad(mine.values, (0, 0, width - w, 0)),
                                     F.pad(theirs.values, (0, 0, width - p, 0))])
        self.keys += keys
        self.lengths += [p] * len(keys)
        self._lengths = torch.cat([self._lengths, lengths])

    def remove(self, key: Hashable) -> None:
        """Cut a row out; trim the leading columns that no remaining row uses."""
        i = self.keys.index(key)
        del self.keys[i], self.lengths[i]
        if not self.keys:
            self.cache, self._lengths = None, None
            return
        self._lengths = _without_row(self._lengths, i)
        trim = self.width - max(self.lengths)
        for layer in self._layers():
            layer.keys = _without_row(layer.keys, i)[:, :, trim:]
            layer.values = _without_row(layer.values, i)[:, :, trim:]


def _without_row(t: torch.Tensor, i: int) -> torch.Tensor:
    """t without row i (slices: no index tensor to copy to the device)."""
    return torch.cat([t[:i], t[i + 1:]])


# ---------------------------------------------------------------------- decoder
Process = Callable[[list[LMSequence], torch.Tensor], torch.Tensor]
"""process(sequences, logits [n, V]) -> scores [n, V]: the family's logits processing (token
suppression, its EOS rule, ...), row by row (a row's scores must depend on its own row only)."""
NextInput = Callable[[LMSequence, int], torch.Tensor]
"""next_input(sequence, token) -> what the model takes next for it: a 0-d id or an [H] embedding."""
Pick = Callable[[list[LMSequence], torch.Tensor], torch.Tensor]
"""pick(sequences, scores [n, V]) -> ids [n] (long, on the scores' device): a family's own
sampling of all rows at once (each row from its own generator), instead of `pick_rows` over
the sequences' samplers; it must not read back to the host (the step reads the ids once).
An id of -1: no admissible token for that row; the step raises."""


class Decoder:
    """The sequences of one causal LM, stepped together (see the module docstring)."""

    def __init__(self, forward: LMForward, process: Process | None = None, next_input: NextInput | None = None,
                 device: torch.device | str = "cpu", pick: Pick | None = None):
        self.batch = KVBatch(forward)
        self.process = process
        self.next_input = next_input
        self.pick = pick
        self.device = torch.device(device)
        self.waiting: list[LMSequence] = []
        self.running: dict[Hashable, LMSequence] = {}
        # [B] the ids picked last step, in the batch's row order, on the device: the next
        # inputs without a copy from the host (when next_input is None)
        self._last: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.running or any(s.key == key for s in self.waiting)

    def sequences(self) -> list[LMSequence]:
        return [*self.waiting, *self.running.values()]

    def add(self, seq: LMSequence) -> None:
        """Queue a sequence: its prompt is prefilled in the next step."""
        if seq.key in self:
            raise ValueError(f"a sequence with key {seq.key!r} is already in this decoder")
        if seq.prompt.ndim not in (1, 2) or len(seq.prompt) == 0:
            raise ValueError(f"a prompt is [P] ids or [P, H] embeddings with P >= 1, not shape {tuple(seq.prompt.shape)}")
        self.waiting.append(seq)

    def remove(self, key: Hashable) -> LMSequence | None:
        """Drop a sequence (cancelled); None if it is not here."""
        for k, s in enumerate(self.waiting):
            if s.key == key:
                return self.waiting.pop(k)
        seq = self.running.pop(key, None)
        if seq is not None:
            i = self.batch.keys.index(key)
            self.batch.remove(key)
            self._last = _without_row(self._last, i) if self.batch.keys else None
        return seq

    def step(self) -> list[LMSequence]:
        """One token for every sequence; returns those that stopped (they have left)."""
        seqs: list[LMSequence] = []
        logits: list[torch.Tensor] = []
        if self.running:
            rows = [self.running[k] for k in self.batch.keys]
            if self.next_input is None:
                inputs = self._last  # [B] ids
            else:
                made = [self.next_input(s, s.tokens[-1]) for s in rows]
                if len({x.is_floating_point() for x in made}) > 1:
                    raise ValueError("next inputs must all be ids or all embeddings")
                inputs = torch.stack(made)
            logits.append(self.batch.decode(inputs))  # [B, V]
            seqs += rows
        # newcomers: one prefill per prompt length and kind (no padding inside a prompt)
        groups: dict[tuple, list[LMSequence]] = {}
        for s in self.waiting:
            groups.setdefault((tuple(s.prompt.shape), s.prompt.is_floating_point()), []).append(s)
        self.waiting = []
        for group in groups.values():
            prompts = torch.stack([s.prompt.to(self.device) for s in group])  # [n, P] or [n, P, H]
            logits.append(self.batch.prefill([s.key for s in group], prompts))
            for s in group:
                self.running[s.key] = s
            seqs += group
        if not seqs:
            return []
        scores = torch.cat(logits)  # [n, V]
        if self.process is not None:
            scores = self.process(seqs, scores)
        # rows in the batch's order: the running ones, then each prefilled group as it joined
        picked = self.pick(seqs, scores) if self.pick is not None else pick_rows([s.sampler for s in seqs], scores)
        self._last = picked.to(self.device)
        # the step's one read back: the stop rules (EOS, budget, a family's predicate) and the
        # families' next steps decide on the host
        toks = host_read(picked, "decode step: the tokens, for the stop rules").tolist()
        if min(toks) < 0:
            bad = [s.key for s, t in zip(seqs, toks) if t < 0]
            raise RuntimeError(f"sampling found no admissible token for sequence(s) {bad}")
        stopped = []
        for s, tok in zip(seqs, toks):
            s.tokens.append(tok)
            if s.stop.stops(s.tokens):
                stopped.append(s)
        for s in stopped:
            self.remove(s.key)
        return stopped

    def fail_all(self) -> list[LMSequence]:
        """Drop every sequence (after a model call failed: the cache may be half-updated)."""
        out = self.sequences()
        self.waiting, self.running = [], {}
        self.batch = KVBatch(self.batch.forward)
        self._last = None
        return out

