"""CosyVoice 2's token choice: upstream's repetition-aware sampling (RAS, from VALL-E 2), one
generator per sequence, the arithmetic batched over the rows.

The rule, for one row with log-probabilities `logp` [V], its tokens so far and its generator:

1. nucleus: sort p = softmax(logp) descending (stable); keep the tokens, in that order, while
   the sum of the kept ones is below top_p (0.8) and fewer than top_k (25) are kept (the first
   is always kept); draw one of them in proportion to p;
2. repetition: if that token occurs at least win_size * tau_r times (10 x 0.1 = once) among the
   row's last win_size (10) tokens, draw again from the whole of p (in the same sorted order);
3. while the row is under its minimum length, a draw of EOS or of a token above it is refused
   and steps 1-2 run again (at most 100 times, then it fails); above its minimum, EOS stops the
   row and a token above EOS is refused the same way (upstream's unistream rule).

A draw is inverse-CDF sampling with one uniform number from the row's generator
(`torch.rand(1)`), so a row's tokens depend on its own logits and generator only. The CDF is
summed in float64 over the sorted probabilities: in float32 a sum over the whole vocabulary
rounds differently when a row's logits move by batch-level float noise (~1e-6), which flipped
about one full-distribution redraw in a hundred on a near-uniform model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MAX_TRIALS = 100


class RasSampler:
    """One sequence's sampling state: its generator and its length bounds."""

    def __init__(self, seed: int, eos: int, min_tokens: int = 0, top_p: float = 0.8, top_k: int = 25,
                 win_size: int = 10, tau_r: float = 0.1, device: torch.device | str = "cpu"):
        if not 0 < top_p <= 1 or top_k < 1 or win_size < 1 or not tau_r > 0:
            raise ValueError(f"bad sampling settings: top_p {top_p}, top_k {top_k}, win_size {win_size}, tau_r {tau_r}")
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed & ((1 << 63) - 1))
        self.eos, self.min_tokens = eos, min_tokens
        self.top_p, self.top_k, self.win_size, self.tau_r = top_p, top_k, win_size, tau_r

    def uniform(self) -> torch.Tensor:
        return torch.rand(1, generator=self.generator, device=self.generator.device)


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs [n, K] (unnormalised, >= 0), u [n] in [0, 1) -> the index drawn per row."""
    cdf = probs.cumsum(-1)
    target = u * cdf[:, -1]
    idx = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
    return idx.clamp(max=probs.shape[-1] - 1)


def ras_step(logp: torch.Tensor, samplers: Sequence[RasSampler], histories: Sequence[Sequence[int]]) -> list[int]:
    """One draw (steps 1-2) for every row: logp [n, V] -> token ids."""
    n = logp.shape[0]
    s0 = samplers[0]
    p = logp.double().softmax(-1)
    p, order = p.sort(dim=-1, descending=True, stable=True)  # [n, V] each
    k = min(s0.top_k, p.shape[-1])
    sp = p[:, :k]
    before = sp.cumsum(-1) - sp  # mass kept before each candidate
    keep = before < s0.top_p
    keep[:, 0] = True
    u = torch.cat([s.uniform() for s in samplers]).to(p.device).double()
    out = order.gather(1, _draw(sp * keep, u)[:, None]).squeeze(1).tolist()
    redo = []
    for r in range(n):
        win = histories[r][-samplers[r].win_size:]
        if sum(1 for t in win if t == out[r]) >= samplers[r].win_size * samplers[r].tau_r:
            redo.append(r)
    if redo:
        u2 = torch.cat([samplers[r].uniform() for r in redo]).to(p.device).double()
        full = order[redo].gather(1, _draw(p[redo], u2)[:, None]).squeeze(1).tolist()
        for r, t in zip(redo, full):
            out[r] = t
    return out


def ras_pick(logp: torch.Tensor, samplers: Sequence[RasSampler], histories: Sequence[Sequence[int]]) -> list[int]:
    """The whole rule (steps 1-3) for every row: logp [n, V] -> token ids."""
    out = ras_step(logp, samplers, histories)
    for _ in range(MAX_TRIALS):
        bad = [r for r, t in enumerate(out)
               if t > samplers[r].eos or (t == samplers[r].eos and len(histories[r]) < samplers[r].min_tokens)]
        if not bad:
            return out
        for r, t in zip(bad, ras_step(logp[bad], [samplers[r] for r in bad], [histories[r] for r in bad])):
            out[r] = t
    raise RuntimeError(f"sampling drew EOS or a special token {MAX_TRIALS} times in a row (under the minimum length)")
