"""The CPU layout transforms (channels-last, GEMM convolutions) compute the same function as the plain model."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from vits_fixtures import load_piper

import voxserve
from voxserve.families.piper import PiperOptions
from voxserve.families.piper.options import Transforms
from voxserve.runtime.layout import (
    ChannelsLastConv1d,
    GemmConv1d,
    convert_convs_channels_last,
    convert_convs_gemm,
)


def test_conv_wrappers_match():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 100)
    for conv in (torch.nn.Conv1d(8, 6, 5, dilation=3, padding=6), torch.nn.Conv1d(8, 8, 3, groups=8, padding=1),
                 torch.nn.ConvTranspose1d(8, 4, 8, 4, padding=2)):
        assert torch.allclose(ChannelsLastConv1d(conv)(x), conv(x), atol=1e-5)


def test_transformed_voice_matches_plain(tiny_voice_path):
    fast = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    plain = load_piper(tiny_voice_path, transforms=Transforms(cpu_channels_last=False))
    assert any(isinstance(m, ChannelsLastConv1d) for m in fast.runner.model.modules())
    assert not any(isinstance(m, ChannelsLastConv1d) for m in plain.runner.model.modules())
    ids = [[1, 0] + list(range(3, 40)) + [2], [1, 0, 5, 0, 7, 0, 2]]
    a = fast.synthesize_ids(ids, voxserve.DETERMINISTIC)
    b = plain.synthesize_ids(ids, voxserve.DETERMINISTIC)
    for x, y in zip(a, b):
        assert len(x) == len(y) and np.abs(x - y).max() <= 1e-4


def test_fold_average_matches(tiny_voice_path):
    folded = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    plain = load_piper(tiny_voice_path, transforms=Transforms(fold_average=False, cpu_channels_last=False))
    assert folded.runner.model.dec.average_folded and not plain.runner.model.dec.average_folded
    ids = [[1, 0] + list(range(3, 40)) + [2]]
    o = PiperOptions(speaker=1, noise_scale=0, noise_w=0)
    assert np.abs(folded.synthesize_ids(ids, o)[0] - plain.synthesize_ids(ids, o)[0]).max() <= 1e-4


def test_convert_counts_modules():
    m = torch.nn.Sequential(torch.nn.Conv1d(2, 2, 3), torch.nn.Sequential(torch.nn.ConvTranspose1d(2, 2, 4, 2)))
    m2 = copy.deepcopy(m)
    assert convert_convs_channels_last(m2) == 2


def test_gemm_conv_matches_conv1d_in_every_layout():
    torch.manual_seed(0)
    for conv in (torch.nn.Conv1d(8, 6, 5, dilation=2, padding=4), torch.nn.Conv1d(8, 12, 1),
                 torch.nn.Conv1d(8, 8, 3, padding=1, bias=False), torch.nn.Conv1d(8, 5, 3, dilation=3),
                 torch.nn.Conv1d(8, 4, 1, padding=2), torch.nn.Conv1d(8, 6, 7, padding=1)):
        x = torch.randn(3, 8, 37)  # a batch of 3, contiguous [B, C, T]
        want = conv(x)
        for src in (conv, ChannelsLastConv1d(conv)):
            g = GemmConv1d(src)
            for inp in (x, x.unsqueeze(2).contiguous(memory_format=torch.channels_last).squeeze(2)):
                got = g(inp)
                assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
                assert got.transpose(1, 2).is_contiguous()  # channels-last out, as the next op expects
    with pytest.raises(ValueError, match="shorter than the kernel"):
        GemmConv1d(torch.nn.Conv1d(8, 4, 5))(torch.randn(1, 8, 3))


def test_convert_gemm_skips_what_it_cannot_run():
    m = torch.nn.Sequential(torch.nn.Conv1d(4, 4, 3, padding=1), torch.nn.Conv1d(4, 4, 3, stride=2),
                            torch.nn.Conv1d(4, 4, 3, groups=2), torch.nn.ConvTranspose1d(4, 4, 4, 2),
                            ChannelsLastConv1d(torch.nn.Conv1d(4, 4, 5, padding=2)),
                            ChannelsLastConv1d(torch.nn.ConvTranspose1d(4, 4, 4, 2)))
    assert convert_convs_gemm(m) == 2
    assert [type(c).__name__ for c in m] == ["GemmConv1d", "Conv1d", "Conv1d", "ConvTranspose1d",
                                            "GemmConv1d", "ChannelsLastConv1d"]


def test_gemm_convs_voice_matches_plain(tiny_voice_path):
    fast = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    plain = load_piper(tiny_voice_path, transforms=Transforms(cpu_gemm_convs=False))
    for stage in (fast.runner.model.enc_p, fast.runner.model.dp, fast.runner.model.flow):
        assert any(isinstance(m, GemmConv1d) for m in stage.modules())
    assert not any(isinstance(m, GemmConv1d) for m in fast.runner.model.dec.modules())
    assert not any(isinstance(m, GemmConv1d) for m in plain.runner.model.modules())
    ids = [[1, 0] + list(range(3, 40)) + [2], [1, 0, 5, 0, 7, 0, 2]]
    o = PiperOptions(speaker=1, noise_scale=0, noise_w=0)
    for x, y in zip(fast.synthesize_ids(ids, o), plain.synthesize_ids(ids, o)):
        assert len(x) == len(y) and np.abs(x - y).max() <= 1e-4
