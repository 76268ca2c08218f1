"""INT8 decoder on CPU: static quantisation of the HiFi-GAN decoder's convolutions.

Each convolution of the decoder becomes: its fp32 input quantised to uint8 with a per-tensor
scale calibrated on a few sentences, an int8 convolution (weights int8, one scale per output
channel; per tensor for the transposed upsampling convolutions, which PyTorch's x86 back end
supports only so), its output requantised with a calibrated scale and read back as fp32. The
leaky ReLUs, masks and residual adds between them stay fp32. CPUs with VNNI (AVX512-VNNI,
AVX-VNNI, AMX) run int8 products natively; on AVX2 alone they are emulated with 16-bit
intermediates, so activations use 7 bits (0..127), which the x86 back end needs to
avoid saturation there. conv_post (one output channel, the waveform) stays fp32.

Opt-in (`RuntimeOptions.cpu_int8`): it pays only if it is faster than fp32 on the CPU at hand,
and it is measured so far only on AVX2 (docs/precision.md, "INT8 decoder on CPU").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from ...runtime.layout import ChannelsLastConv1d
from .model import Generator

# Sentences run once at load to calibrate the activation scales: ordinary prose, a question,
# numbers and a long clause, so that the ranges cover more than one kind of sentence.
CALIBRATION_TEXTS = (
    "The quick brown fox jumps over the lazy dog, and then it runs back into the forest.",
    "Would you like me to read your messages now, or later this evening?",
    "On the fourteenth of March, three hundred and twelve people visited the museum.",
    "She sells sea shells by the sea shore; the shells she sells are surely sea shells.",
)


def _float_conv(conv: nn.Module) -> nn.Conv1d | nn.ConvTranspose1d:
    """An nn.Conv1d / nn.ConvTranspose1d equal to `conv` (plain or ChannelsLastConv1d)."""
    if isinstance(conv, (nn.Conv1d, nn.ConvTranspose1d)):
        return conv
    assert isinstance(conv, ChannelsLastConv1d)
    w = conv.weight.detach()[:, :, 0]  # [O, I, K] (transposed: [I, O, K])
    kw = dict(stride=conv.stride[1], padding=conv.padding[1], dilation=conv.dilation[1],
              groups=conv.groups, bias=conv.bias is not None)
    if conv.transposed:
        out = nn.ConvTranspose1d(w.shape[0], w.shape[1] * conv.groups, w.shape[2],
                                 output_padding=conv.output_padding[1], **kw)
    else:
        out = nn.Conv1d(w.shape[1] * conv.groups, w.shape[0], w.shape[2], **kw)
    with torch.no_grad():
        out.weight.copy_(w.contiguous())
        if conv.bias is not None:
            out.bias.copy_(conv.bias.detach())
    return out.eval()


def _qconfig(transposed: bool):
    from torch.ao.quantization import MinMaxObserver, PerChannelMinMaxObserver, QConfig

    # min/max ranges: a histogram observer's search took over a minute per load on a few sentences
    act = MinMaxObserver.with_args(dtype=torch.quint8, quant_min=0, quant_max=127)
    if transposed:
        weight = MinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    else:
        weight = PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    return QConfig(activation=act, weight=weight)


class _Observed(nn.Module):
    """A convolution during calibration: fp32 as before, its input and output ranges recorded."""

    def __init__(self, conv: nn.Module):
        super().__init__()
        self.conv = _float_conv(conv)
        self.conv.qconfig = _qconfig(isinstance(self.conv, nn.ConvTranspose1d))
        self.conv.activation_post_process = self.conv.qconfig.activation()  # the output's range
        self.inputs = self.conv.qconfig.activation()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        self.inputs(x)
        y = self.conv(x)
        self.conv.activation_post_process(y)
        return y


class Int8Conv1d(nn.Module):
    """Drop-in for a decoder convolution: fp32 [B, C, T] in, fp32 [B, O, T'] out, int8 inside."""

    def __init__(self, observed: _Observed):
        super().__init__()
        import torch.ao.nn.quantized as nnq

        cls = nnq.ConvTranspose1d if isinstance(observed.conv, nn.ConvTranspose1d) else nnq.Conv1d
        with warnings.catch_warnings():  # torch.ao's deprecation notice: the ops themselves stay
            warnings.simplefilter("ignore")
            self.conv = cls.from_float(observed.conv)
        scale, zero_point = observed.inputs.calculate_qparams()
        self.scale, self.zero_point = float(scale), int(zero_point)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.quantize_per_tensor(x.contiguous(), self.scale, self.zero_point, torch.quint8)
        return self.conv(q).dequantize()


def _convs(dec: Generator) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of each decoder convolution to quantise: all but conv_post and cond."""
    out: list[tuple[nn.Module, str]] = []
    out += [(dec, "conv_pre")]
    out += [(dec.ups, str(i)) for i in range(len(dec.ups))]
    for block in dec.resblocks:
        for name, child in block.named_modules():
            if isinstance(child, nn.ModuleList):
                out += [(child, str(i)) for i in range(len(child))]
    return out


@torch.no_grad()
def quantize_decoder(dec: Generator, calibrate: Callable[[], object]) -> int:
    """Replace the decoder's convolutions by Int8Conv1d, in place, with activation scales from
    running `calibrate()` (which must run the decoder over a few sentences). Returns how many."""
    torch.backends.quantized.engine = "x86"  # process-wide, as PyTorch's engine setting is
    slots = _convs(dec)
    originals = [getattr(parent, name) for parent, name in slots]
    observed = []
    for parent, name in slots:
        obs = _Observed(getattr(parent, name))
        setattr(parent, name, obs)
        observed.append(obs)
    try:
        calibrate()
    except BaseException:
        for (parent, name), conv in zip(slots, originals):
            setattr(parent, name, conv)
        raise
    for (parent, name), obs in zip(slots, observed):
        setattr(parent, name, Int8Conv1d(obs))
    return len(slots)
