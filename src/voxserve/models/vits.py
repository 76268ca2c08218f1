"""VITS (as trained by Piper) for inference: modules and a dims dataclass only.

The model is split into the stages the runtime schedules separately:

    encode()  ids -> text-encoder stats + integer frame durations   (text resolution)
    expand()  durations -> frame-level prior (no host sync)          (frame resolution)
    flow()    prior sample -> latent z, reversed residual coupling  (frame resolution)
    decode()  z -> waveform, HiFi-GAN                               (sample resolution)

Between encode() and expand() the caller reads the predicted frame lengths once (the only
device->host read of a batch). All noise comes in as tensors: sampling policy lives in the
runtime, so a seeded request gives the same audio alone or inside any batch.

Shapes: B batch, T text positions (phoneme ids), F frames, S samples = F * hop_length,
C channels. Masks are float tensors [B, 1, T] / [B, 1, F] of 0/1.

Every convolution input is masked where the sequence ends, so a padded (or packed) batch
computes exactly what each item computes alone: zero padding at the item's edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

LRELU_SLOPE = 0.1


@dataclass(frozen=True)
class VitsDims:
    """Every size of a VITS generator; derived from a checkpoint's tensors and graph."""

    n_vocab: int
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    window_size: int = 4
    inter_channels: int = 192
    # duration predictor
    use_sdp: bool = True
    dp_filter_channels: int = 192
    dp_kernel_size: int = 3
    dp_n_flows: int = 4
    dp_num_bins: int = 10
    dp_tail_bound: float = 5.0
    # residual coupling flow
    flow_n_flows: int = 4
    flow_hidden_channels: int = 192
    flow_kernel_size: int = 5
    flow_dilation_rate: int = 1
    flow_n_layers: int = 4
    # HiFi-GAN generator
    resblock: str = "2"
    resblock_kernel_sizes: tuple[int, ...] = (3, 5, 7)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 2), (2, 6), (3, 12))
    upsample_rates: tuple[int, ...] = (8, 8, 4)
    upsample_initial_channel: int = 256
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8)
    # speakers
    n_speakers: int = 1
    gin_channels: int = 0

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)

    @property
    def k_channels(self) -> int:
        return self.hidden_channels // self.n_heads


# --------------------------------------------------------------------------- helpers


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """[B] lengths -> [B, max_length] bool."""
    return torch.arange(max_length, device=lengths.device) < lengths.unsqueeze(1)


class GapMask:
    """Mask of a packed sequence: the few gap frames between items, as indices, and a masked
    tail from `tail_from` on (bucket padding).

    Zeroing these in place costs O(gap) instead of O(sequence) for a dense multiply; at the
    decoder's full sample rate that is most of the masking cost. `apply_` writes into its
    argument: callers pass tensors they own (fresh outputs).
    """

    def __init__(self, index: torch.Tensor, length: int, tail_from: int | None = None):
        self.index = index  # [N] int64 positions to zero (frames, or samples after upsample)
        self.length = length
        self.tail_from = tail_from if tail_from is not None and tail_from < length else None

    def upsample(self, rate: int) -> "GapMask":
        idx = (self.index.unsqueeze(1) * rate + torch.arange(rate, device=self.index.device)).reshape(-1)
        tail = None if self.tail_from is None else self.tail_from * rate
        return GapMask(idx, self.length * rate, tail)

    def window(self, lo: int, hi: int) -> "GapMask":
        """The mask of positions [lo, hi), as positions 0 .. hi - lo."""
        idx = self.index
        if idx.numel():
            idx = idx[(idx >= lo) & (idx < hi)] - lo
        tail = None if self.tail_from is None else max(0, self.tail_from - lo)
        return GapMask(idx, hi - lo, tail)

    def apply_(self, x: torch.Tensor) -> torch.Tensor:
        if self.index.numel():
            x.index_fill_(-1, self.index, 0.0)
        if self.tail_from is not None:
            x[..., self.tail_from :] = 0.0
        return x


Mask = torch.Tensor | GapMask | None


def upsample_mask(mask: Mask, rate: int) -> Mask:
    """Dense [B, 1, L] -> [B, 1, L * rate]; masks are piecewise constant per frame."""
    if mask is None:
        return None
    if isinstance(mask, GapMask):
        return mask.upsample(rate)
    return mask.repeat_interleave(rate, dim=2)


def window_mask(mask: Mask, lo: int, hi: int) -> Mask:
    """A mask's positions [lo, hi) along its last axis."""
    if mask is None:
        return None
    if isinstance(mask, GapMask):
        return mask.window(lo, hi)
    return mask[..., lo:hi]


def _masked(x: torch.Tensor, mask: Mask) -> torch.Tensor:
    if mask is None:
        return x
    if isinstance(mask, GapMask):
        return mask.apply_(x)
    return x * mask


def leaky_relu(x: torch.Tensor, slope: float) -> torch.Tensor:
    # On [B, C, T] tensors with channels-last strides (see runtime/layout.py) PyTorch's CPU
    # leaky_relu takes a slow strided path (docs/benchmarks.md, "Figures behind the code's
    # defaults"); the transposed view is contiguous and gives the same values in the same
    # memory layout.
    if x.dim() == 3 and not x.is_contiguous() and x.transpose(1, 2).is_contiguous():
        return F.leaky_relu(x.transpose(1, 2), slope).transpose(1, 2)
    return F.leaky_relu(x, slope)


class LayerNorm(nn.Module):
    """LayerNorm over the channel axis of [B, C, T]."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # statistics in fp32 whatever the storage dtype (fp16 LayerNorm overflows/NaNs)
        y = F.layer_norm(x.transpose(1, -1).float(), self.gamma.shape, self.gamma.float(), self.beta.float(), self.eps)
        return y.to(x.dtype).transpose(1, -1)


def _softmax32(scores: torch.Tensor) -> torch.Tensor:
    """Softmax in fp32, result in the scores' dtype (fp16 softmax loses small weights)."""
    return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


def dtype_of(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


# --------------------------------------------------------------------------- text encoder


class RelativeMultiHeadAttention(nn.Module):
    """Self-attention with learned relative-position keys and values (window +-w, heads share).

    `impl="skew"` is VITS's formulation (pad/reshape skews over all 2T-1 offsets);
    `impl="banded"` gathers only the 2w+1 offsets that carry weights and is the default.
    Both compute the same function; tests check them against each other.
    """

    def __init__(self, channels: int, n_heads: int, window_size: int):
        super().__init__()
        assert channels % n_heads == 0
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))
        self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))
        self.impl = "banded"

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T]; attn_mask: [B, 1, T, T] (1 = attend)
        b, c, t = x.shape
        h, d = self.n_heads, self.k_channels
        q = self.conv_q(x).view(b, h, d, t).transpose(2, 3) / math.sqrt(d)  # [B, H, T, d]
        k = self.conv_k(x).view(b, h, d, t).transpose(2, 3)
        v = self.conv_v(x).view(b, h, d, t).transpose(2, 3)
        if self.impl == "skew":
            out = self._attend_skew(q, k, v, attn_mask)
        else:
            out = self._attend_banded(q, k, v, attn_mask)
        return self.conv_o(out.transpose(2, 3).reshape(b, c, t))

    # -- banded: only the 2w+1 diagonals that carry embeddings, O(T*w) extra work
    def _attend_banded(self, q, k, v, attn_mask):
        b, h, t, d = q.shape
        w = self.window_size
        scores = torch.matmul(q, k.transpose(-2, -1))  # [B, H, T, T]
        rel_logits = torch.matmul(q, self.emb_rel_k.transpose(-2, -1))  # [B, H, T, 2w+1]
        offsets = range(-min(w, t - 1), min(w, t - 1) + 1)
        for r in offsets:  # diagonal r holds the pairs (i, i + r)
            rows = slice(max(0, -r), t - max(0, r))
            scores.diagonal(offset=r, dim1=-2, dim2=-1).add_(rel_logits[:, :, rows, r + w])
        p = _softmax32(scores.masked_fill(attn_mask == 0, -1e4))
        out = torch.matmul(p, v)
        band = p.new_zeros(b, h, t, 2 * w + 1)  # band[..., i, r + w] = p[..., i, i + r]
        for r in offsets:
            band[:, :, max(0, -r) : t - max(0, r), r + w] = p.diagonal(offset=r, dim1=-2, dim2=-1)
        return out + torch.matmul(band, self.emb_rel_v)

    # -- skew: the reference formulation
    def _rel_embeddings(self, emb: torch.Tensor, t: int) -> torch.Tensor:
        w = self.window_size
        pad = max(t - (w + 1), 0)
        start = max((w + 1) - t, 0)
        if pad > 0:
            emb = F.pad(emb, (0, 0, pad, pad, 0, 0))
        return emb[:, start : start + 2 * t - 1]

    def _attend_skew(self, q, k, v, attn_mask):
        b, h, t, d = q.shape
        scores = torch.matmul(q, k.transpose(-2, -1))
        rel = torch.matmul(q, self._rel_embeddings(self.emb_rel_k, t).unsqueeze(0).transpose(-2, -1))
        # relative -> absolute: [B, H, T, 2T-1] -> [B, H, T, T]
        rel = F.pad(rel, (0, 1)).view(b, h, 2 * t * t)
        rel = F.pad(rel, (0, t - 1)).view(b, h, t + 1, 2 * t - 1)[:, :, :t, t - 1 :]
        p = _softmax32((scores + rel).masked_fill(attn_mask == 0, -1e4))
        out = torch.matmul(p, v)
        # absolute -> relative: [B, H, T, T] -> [B, H, T, 2T-1]
        pr = F.pad(p, (0, t - 1)).view(b, h, t * (2 * t - 1))
        pr = F.pad(pr, (t, 0)).view(b, h, t, 2 * t)[:, :, :, 1:]
        return out + torch.matmul(pr, self._rel_embeddings(self.emb_rel_v, t).unsqueeze(0))


class FFN(nn.Module):
    """Two same-padded convolutions with ReLU, masked inputs."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel_size == 1:
            return x
        return F.pad(x, ((self.kernel_size - 1) // 2, self.kernel_size // 2))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv_1(self._pad(x * x_mask)))
        return self.conv_2(self._pad(x * x_mask)) * x_mask


class Encoder(nn.Module):
    def __init__(self, dims: VitsDims):
        super().__init__()
        hc = dims.hidden_channels
        n = dims.n_layers
        self.attn_layers = nn.ModuleList(
            RelativeMultiHeadAttention(hc, dims.n_heads, dims.window_size) for _ in range(n)
        )
        self.norm_layers_1 = nn.ModuleList(LayerNorm(hc) for _ in range(n))
        self.ffn_layers = nn.ModuleList(
            FFN(hc, dims.filter_channels, dims.kernel_size) for _ in range(n)
        )
        self.norm_layers_2 = nn.ModuleList(LayerNorm(hc) for _ in range(n))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)  # [B, 1, T, T]
        x = x * x_mask
        for attn, norm1, ffn, norm2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2
        ):
            x = norm1(x + attn(x, attn_mask))
            x = norm2(x + ffn(x, x_mask))
        return x * x_mask


class TextEncoder(nn.Module):
    def __init__(self, dims: VitsDims):
        super().__init__()
        self.hidden_channels = dims.hidden_channels
        self.out_channels = dims.inter_channels
        self.emb = nn.Embedding(dims.n_vocab, dims.hidden_channels)
        self.encoder = Encoder(dims)
        self.proj = nn.Conv1d(dims.hidden_channels, dims.inter_channels * 2, 1)

    def forward(self, ids: torch.Tensor, x_mask: torch.Tensor):
        # ids [B, T] -> x [B, H, T], m/logs [B, C, T]
        x = self.emb(ids) * math.sqrt(self.hidden_channels)
        x = self.encoder(x.transpose(1, -1), x_mask)
        stats = self.proj(x) * x_mask
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return x, m, logs


# --------------------------------------------------------------------------- duration


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions (dilation kernel_size**i)."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int):
        super().__init__()
        self.convs_sep = nn.ModuleList()
        self.convs_1x1 = nn.ModuleList()
        self.norms_1 = nn.ModuleList()
        self.norms_2 = nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            self.convs_sep.append(
                nn.Conv1d(
                    channels,
                    channels,
                    kernel_size,
                    groups=channels,
                    dilation=dilation,
                    padding=(kernel_size * dilation - dilation) // 2,
                )
            )
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(LayerNorm(channels))
            self.norms_2.append(LayerNorm(channels))

    def forward(self, x, x_mask, g=None):
        if g is not None:
            x = x + g
        for sep, pw, n1, n2 in zip(self.convs_sep, self.convs_1x1, self.norms_1, self.norms_2):
            y = F.gelu(n1(sep(x * x_mask)))
            y = F.gelu(n2(pw(y)))
            x = x + y
        return x * x_mask


def rational_quadratic_spline_inverse(
    inputs: torch.Tensor,
    unnormalized_widths: torch.Tensor,
    unnormalized_heights: torch.Tensor,
    unnormalized_derivatives: torch.Tensor,
    tail_bound: float,
    min_bin_width: float = 1e-3,
    min_bin_height: float = 1e-3,
    min_derivative: float = 1e-3,
) -> torch.Tensor:
    """Inverse of the unconstrained monotonic rational-quadratic spline, linear tails.

    Branch-free (torch.where instead of boolean indexing) so that shapes never depend on data:
    no host sync, capturable in a CUDA graph. inputs [...], params [..., K] / [..., K-1].
    """
    num_bins = unnormalized_widths.shape[-1]
    inside = (inputs >= -tail_bound) & (inputs <= tail_bound)
    x = inputs.clamp(-tail_bound, tail_bound)

    const = math.log(math.exp(1 - min_derivative) - 1)
    derivs = F.pad(unnormalized_derivatives, (1, 1), value=const)

    def knots(unnormalized, min_size):
        sizes = torch.softmax(unnormalized, dim=-1)
        sizes = min_size + (1 - min_size * num_bins) * sizes
        cum = F.pad(torch.cumsum(sizes, dim=-1), (1, 0), value=0.0)
        cum = 2 * tail_bound * cum - tail_bound
        cum = torch.cat([torch.full_like(cum[..., :1], -tail_bound), cum[..., 1:-1],
                         torch.full_like(cum[..., :1], tail_bound)], dim=-1)
        return cum, cum[..., 1:] - cum[..., :-1]

    cumwidths, widths = knots(unnormalized_widths, min_bin_width)
    cumheights, heights = knots(unnormalized_heights, min_bin_height)
    derivatives = min_derivative + F.softplus(derivs)

    # bin search over heights (the inverse maps y -> x); the last edge is nudged up by 1e-6
    search = torch.cat([cumheights[..., :-1], cumheights[..., -1:] + 1e-6], dim=-1)
    bin_idx = (torch.sum(x.unsqueeze(-1) >= search, dim=-1) - 1).unsqueeze(-1)

    def pick(t):
        return t.gather(-1, bin_idx).squeeze(-1)

    in_cumwidths = pick(cumwidths)
    in_widths = pick(widths)
    in_cumheights = pick(cumheights)
    delta = heights / widths
    in_delta = pick(delta)
    in_d = pick(derivatives)
    in_d1 = pick(derivatives[..., 1:])
    in_heights = pick(heights)

    dy = x - in_cumheights
    s = in_d + in_d1 - 2 * in_delta
    a = dy * s + in_heights * (in_delta - in_d)
    b = in_heights * in_d - dy * s
    c = -in_delta * dy
    disc = (b.pow(2) - 4 * a * c).clamp_min(0)
    root = (2 * c) / (-b - torch.sqrt(disc))
    out = root * in_widths + in_cumwidths
    return torch.where(inside, out, inputs)


class ConvFlow(nn.Module):
    def __init__(self, in_channels: int, filter_channels: int, kernel_size: int, n_layers: int,
                 num_bins: int, tail_bound: float):
        super().__init__()
        self.filter_channels = filter_channels
        self.num_bins = num_bins
        self.tail_bound = tail_bound
        self.half_channels = in_channels // 2
        self.pre = nn.Conv1d(self.half_channels, filter_channels, 1)
        self.convs = DDSConv(filter_channels, kernel_size, n_layers)
        self.proj = nn.Conv1d(filter_channels, self.half_channels * (num_bins * 3 - 1), 1)

    def reverse(self, x, x_mask, g):
        x0, x1 = torch.split(x, [self.half_channels] * 2, 1)
        h = self.convs(self.pre(x0), x_mask, g=g)
        h = self.proj(h) * x_mask
        b, c, t = x0.shape
        h = h.reshape(b, c, -1, t).permute(0, 1, 3, 2)  # [B, c, T, 3K-1]
        scale = math.sqrt(self.filter_channels)
        k = self.num_bins
        x1 = rational_quadratic_spline_inverse(
            x1, h[..., :k] / scale, h[..., k : 2 * k] / scale, h[..., 2 * k :], self.tail_bound
        )
        return torch.cat([x0, x1], 1) * x_mask


class ElementwiseAffine(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.m = nn.Parameter(torch.zeros(channels, 1))
        self.logs = nn.Parameter(torch.zeros(channels, 1))

    def reverse(self, x, x_mask, g=None):
        return (x - self.m) * torch.exp(-self.logs) * x_mask


class Flip(nn.Module):
    def reverse(self, x, x_mask=None, g=None):
        return torch.flip(x, [1])


class UnusedFlow(nn.Module):
    """Placeholder for the ConvFlow that VITS skips at inference (no parameters)."""

    def reverse(self, x, x_mask=None, g=None):  # pragma: no cover - never called
        raise RuntimeError("this flow is skipped at inference")


class StochasticDurationPredictor(nn.Module):
    """Inference half of VITS's SDP: reverse flows from noise to log-durations.

    The posterior flows used only in training are not built. Like VITS, the reverse pass skips
    the first ConvFlow (flows[1]); Piper's exports do not even contain its weights.
    """

    def __init__(self, dims: VitsDims):
        super().__init__()
        fc = dims.dp_filter_channels
        self.pre = nn.Conv1d(dims.hidden_channels, fc, 1)
        self.proj = nn.Conv1d(fc, fc, 1)
        self.convs = DDSConv(fc, dims.dp_kernel_size, n_layers=3)
        flows: list[nn.Module] = [ElementwiseAffine(2)]
        for i in range(dims.dp_n_flows):
            # flows[1] never runs at inference; keep its slot so checkpoint indices line up
            flows.append(
                UnusedFlow() if i == 0
                else ConvFlow(2, fc, dims.dp_kernel_size, 3, dims.dp_num_bins, dims.dp_tail_bound)
            )
            flows.append(Flip())
        self.flows = nn.ModuleList(flows)
        if dims.gin_channels:
            self.cond = nn.Conv1d(dims.gin_channels, fc, 1)

    def reverse_flows(self) -> list[nn.Module]:
        flows = list(reversed(self.flows))
        return flows[:-2] + [flows[-1]]  # drop flows[1], as VITS does at inference

    def forward(self, x, x_mask, g, noise):
        # noise [B, 2, T] already scaled by noise_w
        x = self.pre(x)
        if g is not None:
            x = x + self.cond(g)
        x = self.proj(self.convs(x, x_mask)) * x_mask
        z = noise
        for flow in self.reverse_flows():
            z = flow.reverse(z, x_mask, g=x)
        return z[:, :1]  # log-durations [B, 1, T]


class DurationPredictor(nn.Module):
    """Deterministic duration predictor (VITS with use_sdp=False)."""

    def __init__(self, dims: VitsDims):
        super().__init__()
        fc, k = dims.dp_filter_channels, dims.dp_kernel_size
        self.conv_1 = nn.Conv1d(dims.hidden_channels, fc, k, padding=k // 2)
        self.norm_1 = LayerNorm(fc)
        self.conv_2 = nn.Conv1d(fc, fc, k, padding=k // 2)
        self.norm_2 = LayerNorm(fc)
        self.proj = nn.Conv1d(fc, 1, 1)
        if dims.gin_channels:
            self.cond = nn.Conv1d(dims.gin_channels, dims.hidden_channels, 1)

    def forward(self, x, x_mask, g, noise=None):
        if g is not None:
            x = x + self.cond(g)
        x = self.norm_1(torch.relu(self.conv_1(x * x_mask)))
        x = self.norm_2(torch.relu(self.conv_2(x * x_mask)))
        return self.proj(x * x_mask) * x_mask


# --------------------------------------------------------------------------- flow


class WN(nn.Module):
    """WaveNet-style gated dilated convolutions (weight norm already folded)."""

    def __init__(self, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int, gin: int):
        super().__init__()
        self.hidden = hidden
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        for i in range(n_layers):
            d = dilation_rate**i
            self.in_layers.append(
                nn.Conv1d(hidden, 2 * hidden, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2)
            )
            out = 2 * hidden if i < n_layers - 1 else hidden
            self.res_skip_layers.append(nn.Conv1d(hidden, out, 1))
        if gin:
            self.cond_layer = nn.Conv1d(gin, 2 * hidden * n_layers, 1)

    def forward(self, x, x_mask, g=None):
        output = torch.zeros_like(x)
        if g is not None:
            g = self.cond_layer(g)
        n = len(self.in_layers)
        h = self.hidden
        for i, (inl, rs) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            x_in = inl(x)
            if g is not None:
                x_in = x_in + g[:, i * 2 * h : (i + 1) * 2 * h]
            acts = torch.tanh(x_in[:, :h]) * torch.sigmoid(x_in[:, h:])
            res_skip = rs(acts)
            if i < n - 1:
                x = (x + res_skip[:, :h]) * x_mask
                output = output + res_skip[:, h:]
            else:
                output = output + res_skip
        return output * x_mask


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling."""

    def __init__(self, dims: VitsDims):
        super().__init__()
        self.half = dims.inter_channels // 2
        hid = dims.flow_hidden_channels
        self.pre = nn.Conv1d(self.half, hid, 1)
        self.enc = WN(hid, dims.flow_kernel_size, dims.flow_dilation_rate, dims.flow_n_layers, dims.gin_channels)
        self.post = nn.Conv1d(hid, self.half, 1)

    def reverse(self, x, x_mask, g=None):
        x0, x1 = torch.split(x, [self.half] * 2, 1)
        h = self.pre(x0) * x_mask
        h = self.enc(h, x_mask, g=g)
        m = self.post(h) * x_mask
        return torch.cat([x0, (x1 - m) * x_mask], 1)


class ResidualCouplingBlock(nn.Module):
    def __init__(self, dims: VitsDims):
        super().__init__()
        flows: list[nn.Module] = []
        for _ in range(dims.flow_n_flows):
            flows.append(ResidualCouplingLayer(dims))
            flows.append(Flip())
        self.flows = nn.ModuleList(flows)

    def reverse(self, x, x_mask, g=None):
        for flow in reversed(self.flows):
            x = flow.reverse(x, x_mask, g=g)
        return x


# --------------------------------------------------------------------------- HiFi-GAN


def _padding(kernel_size: int, dilation: int = 1) -> int:
    return (kernel_size * dilation - dilation) // 2


class ResBlock1(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilation: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_padding(kernel_size, d))
            for d in dilation
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=_padding(kernel_size)) for _ in dilation
        )

    def forward(self, x, mask: Mask = None):
        for c1, c2 in zip(self.convs1, self.convs2):
            xt = c1(_masked(leaky_relu(x, LRELU_SLOPE), mask))
            x = c2(_masked(leaky_relu(xt, LRELU_SLOPE), mask)).add_(x)
        return _masked(x, mask)


class ResBlock2(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilation: tuple[int, ...]):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_padding(kernel_size, d))
            for d in dilation
        )

    def forward(self, x, mask: Mask = None):
        for c in self.convs:
            x = c(_masked(leaky_relu(x, LRELU_SLOPE), mask)).add_(x)
        return _masked(x, mask)


class Generator(nn.Module):
    def __init__(self, dims: VitsDims):
        super().__init__()
        uic = dims.upsample_initial_channel
        self.upsample_rates = dims.upsample_rates
        self.num_kernels = len(dims.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(dims.inter_channels, uic, 7, 1, padding=3)
        block = ResBlock1 if dims.resblock == "1" else ResBlock2
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = uic
        for i, (u, k) in enumerate(zip(dims.upsample_rates, dims.upsample_kernel_sizes)):
            ch = uic // (2 ** (i + 1))
            self.ups.append(nn.ConvTranspose1d(uic // (2**i), ch, k, u, padding=(k - u) // 2))
            for rk, rd in zip(dims.resblock_kernel_sizes, dims.resblock_dilation_sizes):
                self.resblocks.append(block(ch, rk, tuple(rd)))
        self.conv_post = nn.Conv1d(ch, 1, 7, 1, padding=3, bias=False)
        if dims.gin_channels:
            self.cond = nn.Conv1d(dims.gin_channels, uic, 1)
        # True once transforms.fold_resblock_average has moved the 1/num_kernels of
        # the resblock average into the next convolution's weights
        self.average_folded = False
        # (first stage, latent frames) once transforms.tile_decoder has set it: the stages
        # from `first` on run over tiles of the sequence, each with its receptive field of
        # real context, so their activations are bounded by a tile, not by the sequence
        self.tiles: tuple[int, int] | None = None
        # one-sided reach of each stage (leaky ReLU, upsampling, resblocks), in its input samples
        self.stage_reach = []
        for u, k in zip(dims.upsample_rates, dims.upsample_kernel_sizes):
            blocks = [sum((rk - 1) // 2 * d for d in (list(rd) + ([1] * len(rd) if dims.resblock == "1" else [])))
                      for rk, rd in zip(dims.resblock_kernel_sizes, dims.resblock_dilation_sizes)]
            self.stage_reach.append(math.ceil(k / u) + max(blocks) / u)

    def tail_reach(self, first: int) -> int:
        """One-sided receptive field of the stages from `first` on and conv_post, in samples
        of stage `first`'s input, rounded up, plus one."""
        reach, scale = 0.0, 1
        for i in range(first, len(self.ups)):
            reach += self.stage_reach[i] / scale
            scale *= self.upsample_rates[i]
        return math.ceil(reach + 3 / scale) + 1

    def head(self, z: torch.Tensor, mask: Mask, g: torch.Tensor | None, stages: int) -> tuple[torch.Tensor, Mask]:
        """conv_pre (+ speaker) and the first `stages` upsampling stages -> (x, its mask)."""
        x = self.conv_pre(z)
        if g is not None:
            x = x + self.cond(g)
        for i in range(stages):
            x, mask = self.stage(i, x, mask)
        return x, mask

    def stage(self, i: int, x: torch.Tensor, mask: Mask) -> tuple[torch.Tensor, Mask]:
        x = self.ups[i](_masked(leaky_relu(x, LRELU_SLOPE), mask))
        mask = upsample_mask(mask, self.upsample_rates[i])
        blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
        xs = blocks[0](x, mask)
        for block in blocks[1:]:
            xs = xs.add_(block(x, mask))
        return (xs if self.average_folded else xs.div_(self.num_kernels)), mask

    def tail(self, x: torch.Tensor, mask: Mask, first: int) -> torch.Tensor:
        """The stages from `first` on and conv_post -> [B, 1, samples]."""
        for i in range(first, len(self.ups)):
            x, mask = self.stage(i, x, mask)
        x = self.conv_post(_masked(leaky_relu(x, 0.01), mask))  # default slope, as VITS
        return _masked(torch.tanh(x), mask)

    def forward(self, z: torch.Tensor, mask: Mask = None, g: torch.Tensor | None = None):
        # z [B, C, F] (zero where masked); mask: None, dense [B, 1, F] or GapMask;
        # g [B, gin, 1] or per frame [B, gin, F]. Returns [B, 1, F * hop].
        first, frames = self.tiles or (len(self.ups), 0)
        x, mask = self.head(z, mask, g, first)
        if not frames:
            return self.tail(x, mask, first)
        r = math.prod(self.upsample_rates[:first])  # samples of x per latent frame
        step, halo, n = frames * r, self.tail_reach(first), x.shape[-1]
        if n <= step + halo:
            return self.tail(x, mask, first)
        up = math.prod(self.upsample_rates[first:])
        quantum = max(1, frames // 4) * r  # end tiles' widths step by this (samples of x)
        outs = []
        for a in range(0, n, step):  # each tile computed with `halo` samples of context
            b = min(n, a + step)
            lo, hi = max(0, a - halo), min(n, b + halo)
            if hi == n and lo > 0:
                # a tile at the end reaches further left (real context: the same values) to a
                # width from a few, so that few kernel shapes exist (each costs memory, per team)
                lo = max(0, n - -(-(n - lo) // quantum) * quantum)
            y = self.tail(x[..., lo:hi], window_mask(mask, lo, hi), first)
            outs.append(y[..., (a - lo) * up : (b - lo) * up])
        return torch.cat(outs, dim=-1)


# --------------------------------------------------------------------------- the model


class VitsModel(nn.Module):
    """VITS generator, inference stages only. Parameter names follow Piper/VITS checkpoints."""

    def __init__(self, dims: VitsDims):
        super().__init__()
        self.dims = dims
        self.enc_p = TextEncoder(dims)
        self.dp: nn.Module = StochasticDurationPredictor(dims) if dims.use_sdp else DurationPredictor(dims)
        self.flow = ResidualCouplingBlock(dims)
        self.dec = Generator(dims)
        if dims.n_speakers > 1:
            self.emb_g = nn.Embedding(dims.n_speakers, dims.gin_channels)

    def speaker_embedding(self, sid: torch.Tensor | None) -> torch.Tensor | None:
        """[B] speaker ids -> g [B, gin, 1] (None for single-speaker voices)."""
        if self.dims.n_speakers <= 1:
            return None
        if sid is None:
            raise ValueError("this voice has several speakers: a speaker id is required")
        return self.emb_g(sid).unsqueeze(-1).float()

    def encode(self, ids, lengths, g, dur_noise, length_scale):
        """Text -> prior stats and integer durations.

        ids [B, T] int64, lengths [B], g [B, gin, 1] | None,
        dur_noise [B, 2, T] (standard normal x noise_w; zeros = deterministic), length_scale [B].
        Returns m_p, logs_p [B, C, T], x_mask [B, 1, T], durations [B, T] (frames, float).
        Each submodule runs in its own parameters' dtype (see models/vits_precision.py).
        """
        enc_dt, dp_dt = dtype_of(self.enc_p), dtype_of(self.dp)
        x_mask = sequence_mask(lengths, ids.shape[1]).unsqueeze(1).to(enc_dt)
        x, m_p, logs_p = self.enc_p(ids, x_mask)
        gd = None if g is None else g.to(dp_dt)
        logw = self.dp(x.to(dp_dt), x_mask.to(dp_dt), gd, dur_noise.to(dp_dt))
        w = torch.exp(logw) * x_mask.to(dp_dt) * length_scale.view(-1, 1, 1).to(dp_dt)
        return m_p, logs_p, x_mask, torch.ceil(w).squeeze(1).float()

    @staticmethod
    def frame_lengths(durations: torch.Tensor) -> torch.Tensor:
        """[B, T] durations -> [B] frame counts (at least one frame, as VITS)."""
        return durations.sum(1).clamp_min(1).long()

    @staticmethod
    def expand(m_p, logs_p, durations, y_lengths, n_frames: int):
        """Repeat each phoneme's stats over its frames. -> m, logs [B, C, F], y_mask [B, 1, F].

        Equivalent to VITS's hard alignment path matmul, as a gather (exact: each frame copies
        one phoneme's values). y_lengths [B] from frame_lengths(); n_frames >= max(y_lengths).
        """
        b, c, t = m_p.shape
        ends = torch.cumsum(durations, dim=1)  # [B, T]
        frames = torch.arange(n_frames, device=m_p.device, dtype=ends.dtype)
        idx = torch.searchsorted(ends.contiguous(), frames.expand(b, n_frames).contiguous(), right=True)
        aligned = (idx < t).unsqueeze(1).to(m_p.dtype)  # frames covered by some phoneme
        idx = idx.clamp_max(t - 1).unsqueeze(1).expand(b, c, n_frames)
        m = m_p.gather(2, idx) * aligned
        logs = logs_p.gather(2, idx) * aligned
        y_mask = sequence_mask(y_lengths, n_frames).unsqueeze(1).to(m_p.dtype)
        return m, logs, y_mask

    def flow_reverse(self, m, logs, y_mask, z_noise, g):
        """Prior sample -> latent. z_noise [B, C, F] standard normal x noise_scale (or zeros)."""
        dt = dtype_of(self.flow)
        z_p = m.to(dt) + z_noise.to(dt) * torch.exp(logs.to(dt))
        y_mask = y_mask.to(dt)
        return self.flow.reverse(z_p, y_mask, g=None if g is None else g.to(dt)) * y_mask

    def decode(self, z, mask=None, g=None):
        dt = dtype_of(self.dec)
        if isinstance(mask, torch.Tensor):
            mask = mask.to(dt)
        return self.dec(z.to(dt), mask, None if g is None else g.to(dt))


def attention_modules(model: nn.Module) -> list[RelativeMultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, RelativeMultiHeadAttention)]
