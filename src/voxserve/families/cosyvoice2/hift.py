"""CosyVoice 2's vocoder, HiFT: 80-bin mel (50 frames a second) -> 24 kHz waveform.

A neural source filter: an F0 predictor (5 convs + ELU, a linear head, |.|) gives F0 per frame;
it is upsampled to samples (nearest, 480 per frame), turned into 9 harmonics (sines of the
integrated phase, computed at frame rate and interpolated back) plus noise, merged by a linear
layer + tanh into one source signal. The mel goes through HiFi-GAN upsampling (8, 5, 3) with
Snake resblocks, fused at each scale with the source's STFT (downsampled to that scale); the
last layer gives the magnitude and phase of a 16-point iSTFT with hop 4.

The source draws random numbers (initial phases, noise): they come from the caller's generator,
in upstream's order (rand [B, 9]; randn [B, L, 9]; randn [B, L, 1]), so a request has its own
stream and a seeded one reproduces upstream's output under the same seed. Weight norm is folded
into plain weights when loading (`fold_weight_norm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class HiftDims:
    mel: int = 80
    base: int = 512
    harmonics: int = 8
    sample_rate: int = 24000
    sine_amp: float = 0.1
    noise_std: float = 0.003
    voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernels: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop: int = 4
    resblock_kernels: tuple[int, ...] = (3, 7, 11)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_kernels: tuple[int, ...] = (7, 7, 11)
    source_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_channels: int = 512

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * self.hop

    @classmethod
    def from_config(cls, hift: dict) -> "HiftDims":
        ist = hift.get("istft_params") or {}
        f0 = hift.get("f0_predictor") or {}
        t = lambda v: tuple(tuple(x) if isinstance(x, list) else x for x in v)  # noqa: E731
        d = cls(mel=int(hift.get("in_channels", 80)), base=int(hift.get("base_channels", 512)),
                harmonics=int(hift.get("nb_harmonics", 8)), sample_rate=int(hift.get("sampling_rate", 24000)),
                sine_amp=float(hift.get("nsf_alpha", 0.1)), noise_std=float(hift.get("nsf_sigma", 0.003)),
                voiced_threshold=float(hift.get("nsf_voiced_threshold", 10)),
                upsample_rates=t(hift["upsample_rates"]), upsample_kernels=t(hift["upsample_kernel_sizes"]),
                n_fft=int(ist.get("n_fft", 16)), hop=int(ist.get("hop_len", 4)),
                resblock_kernels=t(hift["resblock_kernel_sizes"]), resblock_dilations=t(hift["resblock_dilation_sizes"]),
                source_kernels=t(hift["source_resblock_kernel_sizes"]),
                source_dilations=t(hift["source_resblock_dilation_sizes"]),
                lrelu_slope=float(hift.get("lrelu_slope", 0.1)), audio_limit=float(hift.get("audio_limit", 0.99)),
                f0_channels=int(f0.get("cond_channels", 512)))
        if d.sample_rate == 22050:
            raise ValueError("hift: the 22.05 kHz source module (CosyVoice 1) is not supported")
        return d


def fold_weight_norm(state: dict) -> dict:
    """Weight-normed tensors (`X.weight_g`/`X.weight_v`, or the parametrization's
    `X.parametrizations.weight.original0/1`) -> plain `X.weight` (g * v / |v| over dims 1..)."""
    out = {}
    for key, v in state.items():
        for g_suffix, v_suffix in (("weight_g", "weight_v"), ("parametrizations.weight.original0",
                                                             "parametrizations.weight.original1")):
            if key.endswith(v_suffix):
                base = key[: -len(v_suffix)]
                g = state.get(base + g_suffix)
                if g is None:
                    raise KeyError(f"{key} has no {base + g_suffix}")
                norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
                out[base + "weight"] = g * v / norm
                break
            if key.endswith(g_suffix):
                break
        else:
            out[key] = v
    return out


class Snake(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(c))

    def forward(self, x):  # [B, C, T]
        a = self.alpha[None, :, None]
        return x + (1.0 / (a + 1e-9)) * torch.sin(x * a).pow(2)


def _pad(k: int, d: int) -> int:
    return (k * d - d) // 2


class ResBlock(nn.Module):
    def __init__(self, c: int, k: int, dilations):
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(c, c, k, dilation=d, padding=_pad(k, d)) for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(c, c, k, padding=_pad(k, 1)) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(c) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(c) for _ in dilations)

    def forward(self, x):
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + c2(a2(c1(a1(x))))
        return x


class F0Predictor(nn.Module):
    def __init__(self, mel: int, c: int):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            layers += [nn.Conv1d(mel if i == 0 else c, c, 3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, 1)

    def forward(self, mel):  # [B, 80, T] -> [B, T] Hz
        return self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1).abs()


class SourceModule(nn.Module):
    """F0 at sample rate -> the merged harmonic source [B, L, 1]."""

    def __init__(self, dims: HiftDims):
        super().__init__()
        self.dims = dims
        self.l_linear = nn.Linear(dims.harmonics + 1, 1)

    def forward(self, f0: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """f0 [B, L, 1] Hz (per sample) -> [B, L, 1]."""
        d = self.dims
        b, n, _ = f0.shape
        scale = d.samples_per_frame
        harm = f0 * torch.arange(1, d.harmonics + 2, device=f0.device, dtype=f0.dtype)[None, None]  # [B, L, 9]
        rad = (harm / d.sample_rate) % 1
        ini = torch.rand(b, d.harmonics + 1, device=f0.device, generator=generator)
        ini[:, 0] = 0
        rad[:, 0, :] = rad[:, 0, :] + ini
        # integrate the phase at frame rate and interpolate it back: upstream's SineGen2
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / scale, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * math.pi
        phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=scale, mode="linear").transpose(1, 2)
        sines = torch.sin(phase) * d.sine_amp
        uv = (f0 > d.voiced_threshold).to(torch.float32)
        amp = uv * d.noise_std + (1 - uv) * d.sine_amp / 3
        # empty_like keeps the transposed layout: the draws fill memory in upstream's order
        noise = amp * torch.empty_like(sines).normal_(generator=generator)
        sines = sines * uv + noise
        torch.empty_like(uv).normal_(generator=generator)  # upstream draws (and drops) one more
        return torch.tanh(self.l_linear(sines))


class HiFT(nn.Module):
    def __init__(self, dims: HiftDims):
        super().__init__()
        d = dims
        self.dims = d
        self.f0_predictor = F0Predictor(d.mel, d.f0_channels)
        self.m_source = SourceModule(d)
        self.conv_pre = nn.Conv1d(d.mel, d.base, 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(d.base // 2**i, d.base // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(d.upsample_rates, d.upsample_kernels)))
        down = [1, *list(d.upsample_rates[::-1][:-1])]
        cum = [math.prod(down[: i + 1]) for i in range(len(down))][::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (u, k, dil) in enumerate(zip(cum, d.source_kernels, d.source_dilations)):
            c = d.base // 2 ** (i + 1)
            self.source_downs.append(nn.Conv1d(d.n_fft + 2, c, 1) if u == 1 else
                                     nn.Conv1d(d.n_fft + 2, c, u * 2, u, padding=u // 2))
            self.source_resblocks.append(ResBlock(c, k, dil))
        self.resblocks = nn.ModuleList(ResBlock(d.base // 2 ** (i + 1), k, dil)
                                       for i in range(len(self.ups))
                                       for k, dil in zip(d.resblock_kernels, d.resblock_dilations))
        self.conv_post = nn.Conv1d(d.base // 2 ** len(self.ups), d.n_fft + 2, 7, padding=3)
        self.register_buffer("window", torch.hann_window(d.n_fft, periodic=True), persistent=False)

    def source(self, mel: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """mel [B, 80, T] -> source [B, 1, T * 480]."""
        f0 = self.f0_predictor(mel)  # [B, T]
        f0 = f0.repeat_interleave(self.dims.samples_per_frame, dim=1)[:, :, None]  # nearest upsampling
        return self.m_source(f0, generator).transpose(1, 2)

    def decode(self, mel: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, T], source [B, 1, T * 480] -> wave [B, T * 480]."""
        d = self.dims
        spec = torch.stft(s.squeeze(1), d.n_fft, d.hop, d.n_fft, window=self.window, return_complex=True)
        s_stft = torch.cat([spec.real, spec.imag], dim=1)
        x = self.conv_pre(mel)
        k = len(d.resblock_kernels)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, d.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            x = sum(self.resblocks[i * k + j](x) for j in range(k)) / k
        x = self.conv_post(F.leaky_relu(x))
        half = d.n_fft // 2 + 1
        mag = torch.exp(x[:, :half]).clamp(max=1e2)
        phase = torch.sin(x[:, half:])
        wave = torch.istft(torch.polar(mag, phase), d.n_fft, d.hop, d.n_fft, window=self.window)
        return wave.clamp(-d.audio_limit, d.audio_limit)

    def forward(self, mel: torch.Tensor, generator: torch.Generator | None = None,
                cache_source: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """mel [B, 80, T] -> (wave [B, T * 480], source [B, 1, T * 480]); cache_source
        [B, 1, S]: the first S source samples are these (a stream's overlap with its last chunk)."""
        s = self.source(mel, generator)
        if cache_source is not None and cache_source.shape[-1]:
            s[:, :, : cache_source.shape[-1]] = cache_source
        return self.decode(mel, s), s
