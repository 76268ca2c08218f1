"""The channels-last CPU transform computes the same function as the plain model."""

from __future__ import annotations

import copy

import numpy as np
import torch

import voxserve
from voxserve.runtime.layout import ChannelsLastConv1d, convert_convs_channels_last


def test_conv_wrappers_match():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 100)
    for conv in (torch.nn.Conv1d(8, 6, 5, dilation=3, padding=6), torch.nn.Conv1d(8, 8, 3, groups=8, padding=1),
                 torch.nn.ConvTranspose1d(8, 4, 8, 4, padding=2)):
        assert torch.allclose(ChannelsLastConv1d(conv)(x), conv(x), atol=1e-5)


def test_transformed_voice_matches_plain(tiny_voice_path):
    fast = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    plain = voxserve.load_voice(str(tiny_voice_path), device="cpu",
                                runtime=voxserve.RuntimeOptions(cpu_channels_last=False))
    assert any(isinstance(m, ChannelsLastConv1d) for m in fast.runner.model.modules())
    assert not any(isinstance(m, ChannelsLastConv1d) for m in plain.runner.model.modules())
    ids = [[1, 0] + list(range(3, 40)) + [2], [1, 0, 5, 0, 7, 0, 2]]
    a = fast.synthesize_ids(ids, voxserve.DETERMINISTIC)
    b = plain.synthesize_ids(ids, voxserve.DETERMINISTIC)
    for x, y in zip(a, b):
        assert len(x) == len(y) and np.abs(x - y).max() <= 1e-4


def test_fold_average_matches(tiny_voice_path):
    folded = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    plain = voxserve.load_voice(str(tiny_voice_path), device="cpu",
                                runtime=voxserve.RuntimeOptions(fold_average=False, cpu_channels_last=False))
    assert folded.runner.model.dec.average_folded and not plain.runner.model.dec.average_folded
    ids = [[1, 0] + list(range(3, 40)) + [2]]
    o = voxserve.SynthesisOptions(speaker=1, noise_scale=0, noise_w=0)
    assert np.abs(folded.synthesize_ids(ids, o)[0] - plain.synthesize_ids(ids, o)[0]).max() <= 1e-4


def test_convert_counts_modules():
    m = torch.nn.Sequential(torch.nn.Conv1d(2, 2, 3), torch.nn.Sequential(torch.nn.ConvTranspose1d(2, 2, 4, 2)))
    m2 = copy.deepcopy(m)
    assert convert_convs_channels_last(m2) == 2
