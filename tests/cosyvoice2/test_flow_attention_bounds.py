"""The flow's attention holds at most SCORE_BLOCK scores a step: past it, queries go in rows
against every key, equal to the full attention (each row's softmax is its own). A sentence the
LM runs to its length bound took single score tensors of ~400 MB on the tiny test model."""

from __future__ import annotations

import pytest
import torch

from voxserve.families.cosyvoice2 import flow


def _inputs(b=2, t=97, d=16, chunk=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, d, generator=g)
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, t - 13:] = False  # a padded row
    return x, flow.attention_mask(valid, chunk)


def mask_valid(chunk, b=2, t=97):
    """The `valid` that `_inputs` makes its mask from."""
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, t - 13:] = False
    return valid


def _scores_seen(monkeypatch):
    seen = []
    sdpa = flow.F.scaled_dot_product_attention

    def counting(q, k, v, attn_mask=None):
        seen.append(q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2])
        return sdpa(q, k, v, attn_mask=attn_mask)

    monkeypatch.setattr(flow.F, "scaled_dot_product_attention", counting)
    return seen


@pytest.mark.parametrize("chunk", [0, 25])
def test_relative_attention_by_query_rows_equals_the_full_one(monkeypatch, chunk):
    torch.manual_seed(0)
    attn = flow.RelAttention(16, 2).eval()
    x, mask = _inputs(chunk=chunk)
    pos = flow.RelPositions(16)(x.shape[1], x.device, x.dtype)
    with torch.no_grad():
        full = attn(x, flow.KeepRows(whole=mask), pos)
        seen = _scores_seen(monkeypatch)
        monkeypatch.setattr(flow, "SCORE_BLOCK", 2 * 2 * 7 * (2 * 97 - 1))  # 7 query rows a step
        rows = attn(x, flow.KeepRows(valid=mask_valid(chunk), chunk=chunk), pos)  # made by rows: the same
    assert len(seen) == 14 and max(seen) <= flow.SCORE_BLOCK
    torch.testing.assert_close(rows, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("block", [2 * 2 * 97, 2 * 2 * 10 * 97])  # one row, ten rows a step
def test_decoder_attention_by_query_rows_equals_the_full_one(monkeypatch, block):
    """(By rows of a given mask: a chunk's `Tape.keep`.)"""
    torch.manual_seed(0)
    attn = flow.Attention(16, 2, 8).eval()
    x, mask = _inputs()
    with torch.no_grad():
        full = attn(x, flow.KeepRows(whole=mask))
        seen = _scores_seen(monkeypatch)
        monkeypatch.setattr(flow, "SCORE_BLOCK", block)
        rows = attn(x, flow.KeepRows(whole=mask))
    assert len(seen) > 1 and max(seen) <= block
    torch.testing.assert_close(rows, full, rtol=0, atol=1e-6)


def test_short_inputs_take_the_plain_path_in_one_step(monkeypatch):
    attn = flow.Attention(16, 2, 8).eval()
    x, mask = _inputs(t=40)
    seen = _scores_seen(monkeypatch)
    with torch.no_grad():
        attn(x, flow.KeepRows(whole=mask))
    assert seen == [2 * 2 * 40 * 40]


def _tiny_estimator():
    dims = flow.FlowDims(est_in=4 * 8, mel=8, est_channels=16, est_heads=2, est_head_dim=8, est_blocks=1,
                         est_mid_blocks=1, est_chunk=25)
    torch.manual_seed(0)
    return flow.Estimator(dims).eval(), dims


class _Largest(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the largest tensor any op makes."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("streaming", [False, True])
def test_the_estimator_makes_no_frames_squared_mask(monkeypatch, streaming):
    """The estimator's attention mask was made whole, [B, T, T] as bools (3 copies) and floats:
    1.8 GB for the 14 rows (7 sentences, CFG doubled) of 3,400 frames that the library's batch of
    sentences run to the LM's length bound gives (issue 49). Each attention step now makes only
    its rows of the mask (KeepRows); the result is the same as with the whole one."""
    est, d = _tiny_estimator()
    b, t = 4, 400
    g = torch.Generator().manual_seed(1)
    x, mu, cond = (torch.randn(b, d.mel, t, generator=g) for _ in range(3))
    mask = torch.ones(b, 1, t)
    mask[1, :, t - 37:] = 0  # a padded row
    spks, tt = torch.randn(b, d.mel, generator=g), torch.rand(b, generator=g)
    monkeypatch.setattr(flow, "SCORE_BLOCK", b * d.est_heads * t * 50)  # 50 query rows a step, as past 2^22
    with torch.no_grad():
        rec = _Largest()
        with rec:
            got = est(x, mask, mu, tt, spks, cond, streaming)
        # the reference: the whole float mask, as before
        keep = flow.attention_mask(mask[:, 0] > 0, d.est_chunk if streaming else 0)
        whole = (1.0 - keep.to(x.dtype)) * -1.0e10

        def reference(self, h, keep_, tape=None):
            bb, n, _ = h.shape
            q, k, v = (f(h).view(bb, n, self.h, self.hd).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
            out = flow.F.scaled_dot_product_attention(q, k, v, attn_mask=whole[:, None])
            return self.to_out[0](out.transpose(1, 2).reshape(bb, n, self.h * self.hd))

        orig = flow.Attention.forward
        flow.Attention.forward = reference
        try:
            want = est(x, mask, mu, tt, spks, cond, streaming)
        finally:
            flow.Attention.forward = orig
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # largest: a step's scores/mask (<= SCORE_BLOCK) or activations, never B x T x T
    assert rec.largest <= flow.SCORE_BLOCK < b * t * t, rec.largest


@pytest.mark.parametrize("chunk", [0, 25])
def test_mask_rows_equal_the_whole_mask(chunk):
    valid = torch.ones(3, 97, dtype=torch.bool)
    valid[1, 80:] = False
    valid[2, 30:] = False  # whole chunks of padding: rows that would see nothing see everything
    whole = flow.attention_mask(valid, chunk)
    lazy = flow.KeepRows(valid, chunk)
    for i0, i1 in ((0, 97), (0, 7), (7, 40), (90, 97), (50, 51)):
        assert torch.equal(lazy.rows(i0, i1), whole[:, i0:i1])
