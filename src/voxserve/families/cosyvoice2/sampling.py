"""CosyVoice 2's token choice: upstream's repetition-aware sampling (RAS, from VALL-E 2), one
generator per sequence, the arithmetic batched over the rows.

The rule, for one row with log-probabilities `logp` [V], its tokens so far and its generator:

1. nucleus: sort p = softmax(logp) descending (stable); keep the tokens, in that order, while
   the sum of the kept ones is below top_p (0.8) and fewer than top_k (25) are kept (the first
   is always kept); draw one of them in proportion to p;
2. repetition: if that token occurs at least win_size * tau_r times (10 x 0.1 = once) among the
   row's last win_size (10) tokens, draw again from the whole of p (in the same sorted order);
3. while the row is under its minimum length, a draw of EOS or of a token above it is refused
   and steps 1-2 run again (at most 100 trials; none admissible: the row gets -1 and the
   decode step fails); above its minimum, EOS stops the row and a token above EOS is refused
   the same way (upstream's unistream rule).

A draw is inverse-CDF sampling with one uniform number. A row's uniforms come from its own
generator, a fixed block per step: 2 per trial (the nucleus draw's, then the redraw's, used
or not) for all 100 trials, so the trials run at once on the device and the step reads
nothing back; a row's tokens depend on its own logits, history and generator only. The CDF is
summed in float64 over the sorted probabilities: in float32 a sum over the whole vocabulary
rounds differently when a row's logits move by batch-level float noise (~1e-6), which flipped
about one full-distribution redraw in a hundred on a near-uniform model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...runtime.sync import upload

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

    @property
    def rule(self) -> tuple:
        """The settings rows must share to be sampled together."""
        return self.eos, self.top_p, self.top_k, self.win_size, self.tau_r

    def uniforms(self) -> torch.Tensor:
        """One step's uniform numbers: [MAX_TRIALS, 2] (float32, on the generator's device)."""
        return torch.rand(MAX_TRIALS, 2, generator=self.generator, device=self.generator.device)


def _draw(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """cdf [n, K] (cumulative unnormalised probabilities), u [n, T] in [0, 1) -> [n, T] the
    index drawn per row and trial."""
    target = u * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).clamp(max=cdf.shape[-1] - 1)


def ras_pick(logp: torch.Tensor, samplers: Sequence[RasSampler], histories: Sequence[Sequence[int]]) -> torch.Tensor:
    """The whole rule (steps 1-3) for every row, on the device: logp [n, V] -> ids [n] (long;
    -1 where no trial was admissible)."""
    s0 = samplers[0]
    if any(s.rule != s0.rule for s in samplers):
        raise ValueError("rows sampled together must share their sampling settings")
    dev = logp.device
    p = logp.double().softmax(-1)
    p, order = p.sort(dim=-1, descending=True, stable=True)  # [n, V] each
    k = min(s0.top_k, p.shape[-1])
    sp = p[:, :k]
    before = sp.cumsum(-1) - sp  # mass kept before each candidate
    keep = before < s0.top_p
    keep[:, 0] = True
    u = torch.stack([s.uniforms() for s in samplers]).to(dev).double()  # [n, T, 2]
    first = order.gather(1, _draw((sp * keep).cumsum(-1), u[:, :, 0]))  # [n, T] step 1 of every trial
    again = order.gather(1, _draw(p.cumsum(-1), u[:, :, 1]))  # [n, T] its redraw
    # the rows' last win_size tokens, -1 where a history is shorter
    w = s0.win_size
    window = upload([[-1] * (w - len(h[-w:])) + list(h[-w:]) for h in histories], torch.long, dev)  # [n, w]
    seen = (first[:, :, None] == window[:, None, :]).sum(-1)  # [n, T]
    tok = torch.where(seen >= w * s0.tau_r, again, first)
    under = upload([len(h) < s.min_tokens for h, s in zip(histories, samplers)], torch.bool, dev)
    ok = (tok < s0.eos) | ((tok == s0.eos) & ~under[:, None])  # [n, T]
    chosen = tok.gather(1, ok.long().argmax(-1, keepdim=True)).squeeze(1)  # the first admissible trial
    return torch.where(ok.any(-1), chosen, torch.full_like(chosen, -1))
