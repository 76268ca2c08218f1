"""CPU layout transform: run 1-D convolutions as channels-last 2-D convolutions.

oneDNN's 1-D convolution path reorders [B, C, T] activations into a blocked layout around
every call; for the decoder's long, narrow tensors ([1, 32, 10^5..10^6]) that reorder costs
more than the convolution. A [B, C, 1, T] tensor in channels-last (NHWC) memory is what its
fast kernels read directly, and pointwise ops (leaky_relu, add, mask) keep that layout, so
activations stay channels-last from one convolution to the next, which makes each convolution
several times faster (docs/benchmarks.md, "Figures behind the code's defaults"). The transform
is numerically the same function (checked by tests to 1e-5).

GEMM convolutions (`convert_convs_gemm`, for the flow): a stride-1 convolution over a
channels-last [B, T, C] activation is one matrix product, im2col [B*T, K*C] @ [K*C, O], and
the im2col copy is small at the flow's frame rate (5 x 192 floats a frame). At the flow's
widths MKL's sgemm beats oneDNN's convolution (and PyTorch's own slow path on short inputs);
at the decoder's narrow widths over long activations oneDNN is as fast or faster, so the
decoder keeps it (docs/benchmarks.md, "Per stage, against Piper, on one core").
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


class GemmConv1d(nn.Module):
    """Drop-in for a stride-1, ungrouped nn.Conv1d (or its ChannelsLastConv1d) as im2col + one
    GEMM. Input [B, C, T] in any layout; output [B, O, T] with channels-last strides."""

    def __init__(self, conv: nn.Conv1d | ChannelsLastConv1d):
        super().__init__()
        w = conv.weight.detach()
        if w.dim() == 4:  # ChannelsLastConv1d's [O, C, 1, K]
            w = w[:, :, 0]
        out_ch, in_ch, k = w.shape  # [O, C, K]
        self.kernel_size = k
        self.dilation = conv.dilation[-1]
        self.padding = conv.padding[-1]
        # [K*C, O]: row k*C + c multiplies input channel c at tap k, as im2col lays them out
        self.weight = nn.Parameter(w.permute(2, 1, 0).reshape(k * in_ch, out_ch).contiguous(),
                                   requires_grad=False)
        bias = conv.bias.detach() if conv.bias is not None else torch.zeros(out_ch, dtype=w.dtype)
        self.bias = nn.Parameter(bias.clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, _ = x.shape
        xt = x.transpose(1, 2)  # [B, T, C]: a free view of a channels-last activation
        if self.padding:
            xt = F.pad(xt, (0, 0, self.padding, self.padding))  # [B, T + 2p, C]
        xt = xt.contiguous()  # (a no-op for a padded or channels-last input)
        k, d = self.kernel_size, self.dilation
        t = xt.shape[1] - d * (k - 1)  # output frames, as nn.Conv1d counts them
        if t < 1:
            raise ValueError(f"input of {x.shape[-1]} frames is shorter than the kernel's reach")
        if k == 1:
            cols = xt.reshape(b * t, c)
        else:  # row (i, t) = the K taps x[t + j*d] side by side: an overlapping view, copied once
            cols = xt.as_strided((b, t, k, c), (xt.shape[1] * c, c, d * c, 1)).reshape(b * t, k * c)
        y = torch.addmm(self.bias, cols, self.weight)  # [B*T_out, O]
        return y.view(b, t, -1).transpose(1, 2)  # [B, O, T_out] with channels-last strides


def convert_convs_gemm(module: nn.Module) -> int:
    """Replace every stride-1, ungrouped, non-transposed convolution below `module` (plain or
    channels-last) by a GemmConv1d, in place. Returns how many."""
    n = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Conv1d):
            ok = child.stride[0] == 1 and child.groups == 1 and child.padding_mode == "zeros"
        elif isinstance(child, ChannelsLastConv1d):
            ok = not child.transposed and child.stride == (1, 1) and child.groups == 1
        else:
            n += convert_convs_gemm(child)
            continue
        if ok and isinstance(child.padding[-1], int):
            setattr(module, name, GemmConv1d(child))
            n += 1
    return n
