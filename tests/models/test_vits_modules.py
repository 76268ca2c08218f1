"""Module-level equivalences of voxserve's VITS against the formulations it replaces."""

from __future__ import annotations

import math

import pytest
import torch

from voxserve.models.vits import (
    RelativeMultiHeadAttention,
    VitsModel,
    rational_quadratic_spline_inverse,
    sequence_mask,
)


@pytest.mark.parametrize("t", [1, 3, 5, 9, 40])
def test_banded_attention_equals_skew(t):
    torch.manual_seed(0)
    attn = RelativeMultiHeadAttention(16, 2, 4)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(3, 16, t)
    lengths = torch.tensor([t, max(1, t - 2), 1])
    m = sequence_mask(lengths, t).unsqueeze(1).float()
    mask = m.unsqueeze(2) * m.unsqueeze(-1)
    attn.impl = "skew"
    ref = attn(x * m, mask)
    attn.impl = "banded"
    got = attn(x * m, mask)
    assert torch.allclose(got * m, ref * m, atol=1e-5)


def test_spline_inverse_matches_piper_transform():
    from piper.train.vits.transforms import piecewise_rational_quadratic_transform

    torch.manual_seed(0)
    x = torch.randn(2, 1, 50) * 4  # some outside the +-5 tail bound
    x[0, 0, :3] = torch.tensor([-7.0, 6.0, 5.0])
    w, h, d = torch.randn(2, 1, 50, 10), torch.randn(2, 1, 50, 10), torch.randn(2, 1, 50, 9)
    ref, _ = piecewise_rational_quadratic_transform(x, w, h, d.clone(), inverse=True, tails="linear", tail_bound=5.0)
    got = rational_quadratic_spline_inverse(x, w, h, d, 5.0)
    assert torch.allclose(got, ref, atol=1e-5)


def test_expand_equals_vits_alignment_path():
    from piper.train.vits.commons import generate_path

    torch.manual_seed(0)
    b, c, t = 3, 4, 7
    m_p, logs_p = torch.randn(b, c, t), torch.randn(b, c, t)
    durations = torch.randint(0, 4, (b, t)).float()
    durations[2, 3:] = 0  # a shorter item
    y_lengths = VitsModel.frame_lengths(durations)
    n = int(y_lengths.max())
    x_mask = (torch.arange(t) < torch.tensor([t, t, 3]).unsqueeze(1)).unsqueeze(1).float()
    y_mask = sequence_mask(y_lengths, n).unsqueeze(1).float()
    path = generate_path(durations.unsqueeze(1), x_mask.unsqueeze(2) * y_mask.unsqueeze(-1))
    ref_m = torch.matmul(path.squeeze(1), m_p.transpose(1, 2)).transpose(1, 2)
    m, logs, ym = VitsModel.expand(m_p, logs_p, durations, y_lengths, n)
    assert torch.equal(ym, y_mask)
    assert torch.allclose(m, ref_m, atol=0)


def test_model_files_hold_modules_only():
    """Style rule 1: no I/O in the model file."""
    import inspect

    import voxserve.models.vits as vits

    src = inspect.getsource(vits)
    for banned in ("open(", "argparse", "json.", "Path(", "onnx"):
        assert banned not in src


def test_layer_count_from_dims():
    from voxserve.models.vits import VitsDims

    dims = VitsDims(n_vocab=10, hidden_channels=8, filter_channels=16, n_layers=3, inter_channels=8,
                    dp_filter_channels=8, flow_hidden_channels=8, upsample_initial_channel=16)
    model = VitsModel(dims)
    assert len(model.enc_p.encoder.attn_layers) == 3
    assert model.dims.hop_length == math.prod(dims.upsample_rates)
