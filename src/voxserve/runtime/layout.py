"""CPU layout transform: run 1-D convolutions as channels-last 2-D convolutions.

oneDNN's 1-D convolution path reorders [B, C, T] activations into a blocked layout around
every call; for the decoder's long, narrow tensors ([1, 32, 10^5..10^6]) that reorder costs
more than the convolution. A [B, C, 1, T] tensor in channels-last (NHWC) memory is what its
fast kernels read directly, and pointwise ops (leaky_relu, add, mask) keep that layout, so
activations stay channels-last from one convolution to the next. Measured on a 2-core x86 CPU:
2-5x faster per convolution (see docs/benchmarks.md). The transform is numerically the same
function (checked by tests to 1e-5).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class ChannelsLastConv1d(nn.Module):
    """Drop-in for nn.Conv1d / nn.ConvTranspose1d holding a [O, I, 1, K] channels-last weight."""

    def __init__(self, conv: nn.Conv1d | nn.ConvTranspose1d):
        super().__init__()
        self.transposed = isinstance(conv, nn.ConvTranspose1d)
        weight = conv.weight.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach(), requires_grad=False)
        self.stride = (1, conv.stride[0])
        self.padding = (0, conv.padding[0])
        self.dilation = (1, conv.dilation[0])
        self.groups = conv.groups
        self.output_padding = (0, conv.output_padding[0]) if self.transposed else (0, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x4 = x.unsqueeze(2)  # [B, C, 1, T]
        if not x4.is_contiguous(memory_format=torch.channels_last):
            x4 = x4.contiguous(memory_format=torch.channels_last)
        if self.transposed:
            y = F.conv_transpose2d(x4, self.weight, self.bias, self.stride, self.padding,
                                   self.output_padding, self.groups, self.dilation)
        else:
            y = F.conv2d(x4, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return y.squeeze(2)  # [B, C, T] with channels-last strides


def convert_convs_channels_last(module: nn.Module) -> int:
    """Replace every Conv1d / ConvTranspose1d below `module` in place. Returns how many."""
    n = 0
    for name, child in list(module.named_children()):
        if isinstance(child, (nn.Conv1d, nn.ConvTranspose1d)):
            setattr(module, name, ChannelsLastConv1d(child))
            n += 1
        else:
            n += convert_convs_channels_last(child)
    return n
