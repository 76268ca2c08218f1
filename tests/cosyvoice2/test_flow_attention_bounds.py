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
        full = attn(x, mask, pos)
        seen = _scores_seen(monkeypatch)
        monkeypatch.setattr(flow, "SCORE_BLOCK", 2 * 2 * 7 * (2 * 97 - 1))  # 7 query rows a step
        rows = attn(x, mask, pos)
    assert len(seen) == 14 and max(seen) <= flow.SCORE_BLOCK
    torch.testing.assert_close(rows, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("block", [2 * 2 * 97, 2 * 2 * 10 * 97])  # one row, ten rows a step
def test_decoder_attention_by_query_rows_equals_the_full_one(monkeypatch, block):
    torch.manual_seed(0)
    attn = flow.Attention(16, 2, 8).eval()
    x, mask = _inputs()
    bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    with torch.no_grad():
        full = attn(x, bias)
        seen = _scores_seen(monkeypatch)
        monkeypatch.setattr(flow, "SCORE_BLOCK", block)
        rows = attn(x, bias)
    assert len(seen) > 1 and max(seen) <= block
    torch.testing.assert_close(rows, full, rtol=0, atol=1e-6)


def test_short_inputs_take_the_plain_path_in_one_step(monkeypatch):
    attn = flow.Attention(16, 2, 8).eval()
    x, mask = _inputs(t=40)
    seen = _scores_seen(monkeypatch)
    with torch.no_grad():
        attn(x, torch.zeros(mask.shape).masked_fill(~mask, float("-inf")))
    assert seen == [2 * 2 * 40 * 40]
