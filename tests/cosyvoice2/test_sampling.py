"""CosyVoice 2's repetition-aware sampling against its written rule (sampling.py's docstring),
row by row in plain Python with the same uniform numbers, and its batch independence."""

from __future__ import annotations

import math

import pytest
import torch

from voxserve.families.cosyvoice2.sampling import RasSampler, ras_pick

V, EOS = 40, 37  # 37 speech tokens, then EOS and two specials above it


def rule(logp: list[float], history: list[int], us, *, min_tokens: int, top_p=0.8, top_k=25, win=10, tau=0.1):
    """The docstring's rule for one row; us yields the row's uniform numbers in order."""
    m = max(logp)
    p = [math.exp(x - m) for x in logp]
    z = sum(p)
    p = [x / z for x in p]
    order = sorted(range(len(p)), key=lambda i: -p[i])  # Python's sort is stable

    def draw(cands):
        total = sum(p[i] for i in cands)
        target, acc = next(us) * total, 0.0
        for i in cands:
            acc += p[i]
            if acc > target:
                return i
        return cands[-1]

    for _ in range(100):
        kept, mass = [], 0.0
        for i in order[:top_k]:
            if kept and mass >= top_p:
                break
            kept.append(i)
            mass += p[i]
        tok = draw(kept)
        if sum(1 for t in history[-win:] if t == tok) >= win * tau:
            tok = draw(order)
        if tok > EOS or (tok == EOS and len(history) < min_tokens):
            continue
        return tok
    raise AssertionError("no draw")


def uniforms(seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        yield float(torch.rand(1, generator=g))


@pytest.mark.parametrize("scale", [0.5, 1.0, 1.5])
def test_ras_follows_the_written_rule_row_by_row(scale):
    rng = torch.Generator().manual_seed(11)
    n, steps = 6, 60
    logits = torch.randn(steps, n, V, generator=rng) * scale
    logits[:, :, EOS] += 1.5  # make EOS (and refusals under the minimum) frequent
    logits[:, :, EOS + 1:] -= 1.0
    samplers = [RasSampler(100 + r, EOS, min_tokens=20 + 5 * r) for r in range(n)]
    streams = [uniforms(100 + r) for r in range(n)]
    hist: list[list[int]] = [[] for _ in range(n)]
    redrawn = 0
    for t in range(steps):
        logp = logits[t].log_softmax(-1)
        got = ras_pick(logp, samplers, hist)
        for r in range(n):
            want = rule(logp[r].tolist(), hist[r], streams[r], min_tokens=samplers[r].min_tokens)
            assert got[r] == want, (t, r)
            redrawn += got[r] in hist[r][-10:]
            hist[r].append(got[r])
    assert all(max(h[: s.min_tokens]) < EOS for h, s in zip(hist, samplers))
    assert redrawn > 0  # the repetition branch ran
    assert any(EOS in h for h in hist)


def test_a_rows_tokens_do_not_depend_on_the_other_rows():
    rng = torch.Generator().manual_seed(3)
    logits = torch.randn(80, 4, V, generator=rng)
    alone_s, batch_s = RasSampler(9, EOS, 30), [RasSampler(s, EOS, 30) for s in (1, 9, 2, 5)]
    alone_h, batch_h = [], [[] for _ in range(4)]
    for t in range(80):
        (a,) = ras_pick(logits[t, 1:2].log_softmax(-1), [alone_s], [alone_h])
        b = ras_pick(logits[t].log_softmax(-1), batch_s, batch_h)
        assert a == b[1]
        alone_h.append(a)
        for h, x in zip(batch_h, b):
            h.append(x)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="top_p"):
        RasSampler(0, EOS, top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        RasSampler(0, EOS, top_k=0)
