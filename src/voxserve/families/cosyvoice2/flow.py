"""CosyVoice 2's flow: speech tokens -> 80-bin mel frames (50 a second), conditioned on the
speaker's embedding and the prompt's mel.

token embedding -> UpsampleConformerEncoder (linear input, relative-position self-attention,
a 3-token look-ahead convolution, x2 nearest upsampling + causal conv, 4 more blocks) ->
projection to 80 channels (`mu`) -> conditional flow matching: 10 Euler steps on the cosine
schedule from a fixed noise buffer, each one call of the causal 1-D UNet estimator on a doubled
batch (classifier-free guidance: the second half has no mu, speaker or prompt).

Streaming mode uses the chunk masks the model was trained with (`static_chunk_size` frames a
chunk, every earlier chunk visible); full mode attends everywhere. The two give different mel,
so a request keeps one mode. State-dict keys are upstream's (flow.pt loads strictly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

NOISE_FRAMES = 50 * 300  # upstream's fixed noise buffer: 300 s of mel frames, seed 0


@dataclass(frozen=True)
class FlowDims:
    vocab: int = 6561
    input_size: int = 512
    mel: int = 80
    spk_embed: int = 192
    encoder_heads: int = 8
    encoder_units: int = 2048
    encoder_blocks: int = 6
    up_blocks: int = 4
    encoder_chunk: int = 0
    """The encoder's static chunk (tokens) in streaming mode; 0: it attends everywhere."""
    lookahead: int = 3
    token_mel_ratio: int = 2
    est_in: int = 320
    est_channels: int = 256
    est_heads: int = 8
    est_head_dim: int = 64
    est_blocks: int = 4
    est_mid_blocks: int = 12
    est_chunk: int = 50
    """The estimator's chunk (mel frames) in streaming mode."""
    cfg_rate: float = 0.7
    steps: int = 10

    @classmethod
    def from_config(cls, flow: dict) -> "FlowDims":
        enc, dec = flow["encoder"], flow["decoder"]
        est = dec["estimator"]
        cfm = dec.get("cfm_params") or {}
        channels = est.get("channels", [256])
        if len(channels) != 1:
            raise ValueError(f"flow.decoder.estimator.channels must have one entry (CosyVoice 2's UNet has one "
                             f"resolution), not {channels}")
        if cfm.get("t_scheduler", "cosine") != "cosine" or cfm.get("solver", "euler") != "euler":
            raise ValueError("flow.decoder.cfm_params: only the euler solver on the cosine schedule is supported")
        return cls(vocab=int(flow["vocab_size"]), input_size=int(flow["input_size"]), mel=int(flow["output_size"]),
                   spk_embed=int(flow["spk_embed_dim"]), encoder_heads=int(enc.get("attention_heads", 4)),
                   encoder_units=int(enc.get("linear_units", 2048)), encoder_blocks=int(enc.get("num_blocks", 6)),
                   encoder_chunk=int(enc.get("static_chunk_size", 0)), lookahead=int(flow.get("pre_lookahead_len", 3)),
                   token_mel_ratio=int(flow.get("token_mel_ratio", 2)), est_in=int(est["in_channels"]),
                   est_channels=int(channels[0]), est_heads=int(est.get("num_heads", 4)),
                   est_head_dim=int(est.get("attention_head_dim", 64)), est_blocks=int(est.get("n_blocks", 1)),
                   est_mid_blocks=int(est.get("num_mid_blocks", 2)), est_chunk=int(est.get("static_chunk_size", 50)),
                   cfg_rate=float(cfm.get("inference_cfg_rate", 0.7)))


def chunk_mask(n: int, chunk: int, device) -> torch.Tensor:
    """[n, n] bool: frame i sees frames of its own chunk and every earlier one."""
    pos = torch.arange(n, device=device)
    return pos[None, :] < ((pos // chunk + 1) * chunk)[:, None]


def attention_mask(valid: torch.Tensor, chunk: int) -> torch.Tensor:
    """valid [B, T] bool -> [B, T, T] bool (key padding, and chunks if chunk > 0). A row that
    would see nothing (a padded query of a chunk of padding) sees everything, as upstream's."""
    mask = valid[:, None, :].expand(-1, valid.shape[1], -1)
    if chunk > 0:
        mask = mask & chunk_mask(valid.shape[1], chunk, valid.device)[None]
    empty = ~mask.any(-1, keepdim=True)
    return mask | empty


# ---------------------------------------------------------------------- encoder
class RelPositions(nn.Module):
    """ESPnet's relative sinusoidal positions: for T frames, 2T - 1 encodings of the offsets
    T-1 .. -(T-1)."""

    def __init__(self, d: int):
        super().__init__()
        self.d = d

    def forward(self, t: int, device, dtype) -> torch.Tensor:
        pos = torch.arange(t - 1, -t, -1, device=device, dtype=torch.float32)[:, None]  # [2T-1, 1]
        div = torch.exp(torch.arange(0, self.d, 2, device=device, dtype=torch.float32) * -(math.log(10000.0) / self.d))
        pe = torch.zeros(2 * t - 1, self.d, device=device)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        return pe.to(dtype)[None]  # [1, 2T-1, d]


class RelAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.linear_q, self.linear_k, self.linear_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.linear_out = nn.Linear(d, d)
        self.linear_pos = nn.Linear(d, d, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.dk))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.dk))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.dk)
        k = self.linear_k(x).view(b, t, self.h, self.dk).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.dk).transpose(1, 2)
        p = self.linear_pos(pos).view(1, -1, self.h, self.dk).transpose(1, 2)  # [1, H, 2T-1, dk]
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))  # [B, H, T, T]
        bd = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))  # [B, H, T, 2T-1]
        # query i, key j: offset i - j sits at index (T - 1) - (i - j) of the 2T - 1 encodings
        idx = (t - 1) - torch.arange(t, device=x.device)[:, None] + torch.arange(t, device=x.device)[None, :]
        bd = bd.gather(-1, idx[None, None].expand(b, self.h, t, t))
        scores = (ac + bd) / math.sqrt(self.dk)
        keep = mask[:, None]  # [B, 1, T, T]
        attn = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).masked_fill(~keep, 0.0)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, self.h * self.dk)
        return self.linear_out(out)


class FeedForward(nn.Module):
    def __init__(self, d: int, units: int):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d, units), nn.Linear(units, d)

    def forward(self, x):
        return self.w_2(F.silu(self.w_1(x)))


class ConformerBlock(nn.Module):
    """Pre-norm self-attention + feed-forward (CosyVoice 2 uses neither macaron nor conv)."""

    def __init__(self, d: int, heads: int, units: int):
        super().__init__()
        self.self_attn = RelAttention(d, heads)
        self.feed_forward = FeedForward(d, units)
        self.norm_mha = nn.LayerNorm(d, eps=1e-12)
        self.norm_ff = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, mask, pos):
        x = x + self.self_attn(self.norm_mha(x), mask, pos)
        return x + self.feed_forward(self.norm_ff(x))


class LinearEmbed(nn.Module):
    """Linear + LayerNorm, scaled by sqrt(d) (the positional module's x-scale)."""

    def __init__(self, d_in: int, d: int):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(d_in, d), nn.LayerNorm(d, eps=1e-5))
        self.xscale = math.sqrt(d)

    def forward(self, x):
        return self.out(x) * self.xscale


class PreLookahead(nn.Module):
    """A conv reading `lookahead` frames ahead, then a causal conv of 3; residual."""

    def __init__(self, d: int, lookahead: int):
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(d, d, lookahead + 1)
        self.conv2 = nn.Conv1d(d, d, 3)

    def forward(self, ext: torch.Tensor) -> torch.Tensor:
        """ext [B, T + lookahead, d]: each row's frames, then what it looks ahead at (the next
        tokens, or zeros past its end) -> [B, T, d]."""
        h = F.leaky_relu(self.conv1(ext.transpose(1, 2)))
        h = self.conv2(F.pad(h, (2, 0)))
        return h.transpose(1, 2) + ext[:, : h.shape[-1]]


class UpsampleLayer(nn.Module):
    def __init__(self, d: int, stride: int = 2):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(d, d, stride * 2 + 1)

    def forward(self, x):  # [B, d, T] -> [B, d, stride T]
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (self.stride * 2, 0)))


class UpsampleEncoder(nn.Module):
    def __init__(self, dims: FlowDims):
        super().__init__()
        d = dims.input_size
        self.dims = dims
        self.embed = LinearEmbed(d, d)
        self.pre_lookahead_layer = PreLookahead(d, dims.lookahead)
        self.encoders = nn.ModuleList(ConformerBlock(d, dims.encoder_heads, dims.encoder_units)
                                      for _ in range(dims.encoder_blocks))
        self.up_layer = UpsampleLayer(d, dims.token_mel_ratio)
        self.up_embed = LinearEmbed(d, d)
        self.up_encoders = nn.ModuleList(ConformerBlock(d, dims.encoder_heads, dims.encoder_units)
                                         for _ in range(dims.up_blocks))
        self.after_norm = nn.LayerNorm(d, eps=1e-5)
        self.pos = RelPositions(d)

    def forward(self, emb: torch.Tensor, lengths: torch.Tensor, seen: torch.Tensor, streaming: bool):
        """emb [B, W, d] token embeddings; lengths [B]: the tokens to encode; seen [B] >= lengths:
        the tokens a row has (the ones past `lengths` are look-ahead context only) ->
        [B, 2 T, d] (T = max length) and the frame lengths."""
        t = int(lengths.max())
        width = t + self.dims.lookahead
        if emb.shape[1] < width:
            emb = F.pad(emb, (0, 0, 0, width - emb.shape[1]))
        emb = emb[:, :width]
        pos = torch.arange(width, device=emb.device)
        # zero past what a row has, after the input layer: the reference pads there with zeros
        x = self.embed(emb) * (pos[None] < seen[:, None]).unsqueeze(-1).to(emb.dtype)
        valid = pos[None, :t] < lengths[:, None]
        chunk = self.dims.encoder_chunk if streaming else 0
        mask = attention_mask(valid, chunk)
        x = self.pre_lookahead_layer(x)
        pos = self.pos(t, x.device, x.dtype)
        for layer in self.encoders:
            x = layer(x, mask, pos)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        lengths = lengths * self.dims.token_mel_ratio
        t2 = x.shape[1]
        valid = torch.arange(t2, device=x.device)[None] < lengths[:, None]
        x = self.up_embed(x)
        mask = attention_mask(valid, chunk * self.dims.token_mel_ratio)
        pos = self.pos(t2, x.device, x.dtype)
        for layer in self.up_encoders:
            x = layer(x, mask, pos)
        return self.after_norm(x), lengths


# ---------------------------------------------------------------------- estimator
class CausalConv1d(nn.Conv1d):
    def forward(self, x):
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class CausalBlock(nn.Module):
    """causal conv 3 -> LayerNorm over channels -> Mish, masked before and after."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.block = nn.ModuleList([CausalConv1d(c_in, c_out, 3), nn.Identity(), nn.LayerNorm(c_out)])

    def forward(self, x, mask):
        h = self.block[0](x * mask)
        h = self.block[2](h.transpose(1, 2)).transpose(1, 2)
        return F.mish(h) * mask


class CausalResnet(nn.Module):
    def __init__(self, c_in: int, c_out: int, t_dim: int):
        super().__init__()
        self.mlp = nn.ModuleList([nn.Mish(), nn.Linear(t_dim, c_out)])
        self.block1 = CausalBlock(c_in, c_out)
        self.block2 = CausalBlock(c_out, c_out)
        self.res_conv = nn.Conv1d(c_in, c_out, 1)

    def forward(self, x, mask, temb):
        h = self.block1(x, mask) + self.mlp[1](F.mish(temb))[:, :, None]
        return self.block2(h, mask) + self.res_conv(x * mask)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, head_dim: int):
        super().__init__()
        self.h, self.hd = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(d, inner, bias=False)
        self.to_k = nn.Linear(d, inner, bias=False)
        self.to_v = nn.Linear(d, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, d)])

    def forward(self, x, bias):  # x [B, T, d], bias [B, T, T] additive
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.h, self.hd).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, None].to(q.dtype))
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, self.h * self.hd))


class GeluProj(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.proj = nn.Linear(d_in, d_out)

    def forward(self, x):
        return F.gelu(self.proj(x))


class TransformerBlock(nn.Module):
    def __init__(self, d: int, heads: int, head_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn1 = Attention(d, heads, head_dim)
        self.norm3 = nn.LayerNorm(d)
        self.ff = nn.Module()
        self.ff.net = nn.ModuleList([GeluProj(d, 4 * d), nn.Identity(), nn.Linear(4 * d, d)])

    def forward(self, x, bias):
        x = x + self.attn1(self.norm1(x), bias)
        h = self.ff.net[0](self.norm3(x))
        return x + self.ff.net[2](h)


class TimeMLP(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(c_in, c_out), nn.Linear(c_out, c_out)

    def forward(self, t):
        return self.linear_2(F.silu(self.linear_1(t)))


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[B] -> [B, dim]: sin | cos of 1000 t at geometric frequencies."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    e = 1000 * t[:, None].float() * freq[None]
    return torch.cat([e.sin(), e.cos()], -1)


class Estimator(nn.Module):
    """The causal conditional UNet: (x, mask, mu, t, spks, cond) -> the flow's velocity."""

    def __init__(self, dims: FlowDims):
        super().__init__()
        c = dims.est_channels
        t_dim = 4 * c
        self.dims = dims
        self.time_mlp = TimeMLP(dims.est_in, t_dim)

        def stage(c_in, conv):
            res = CausalResnet(c_in, c, t_dim)
            blocks = nn.ModuleList(TransformerBlock(c, dims.est_heads, dims.est_head_dim) for _ in range(dims.est_blocks))
            return nn.ModuleList([res, blocks, CausalConv1d(c, c, 3)] if conv else [res, blocks])

        self.down_blocks = nn.ModuleList([stage(dims.est_in, True)])
        self.mid_blocks = nn.ModuleList(stage(c, False) for _ in range(dims.est_mid_blocks))
        self.up_blocks = nn.ModuleList([stage(2 * c, True)])
        self.final_block = CausalBlock(c, c)
        self.final_proj = nn.Conv1d(c, dims.mel, 1)

    def _blocks(self, blocks, x, mask, bias):
        h = x.transpose(1, 2)
        for blk in blocks:
            h = blk(h, bias)
        return h.transpose(1, 2)

    def forward(self, x, mask, mu, t, spks, cond, streaming: bool):
        """x, mu, cond [B, 80, T]; mask [B, 1, T]; t [B]; spks [B, 80] -> [B, 80, T]."""
        temb = self.time_mlp(timestep_embedding(t, self.dims.est_in).to(x.dtype))
        h = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, x.shape[-1]), cond], 1)
        valid = mask[:, 0] > 0
        keep = attention_mask(valid, self.dims.est_chunk if streaming else 0)
        bias = (1.0 - keep.to(h.dtype)) * -1.0e10  # [B, T, T]
        res, blocks, conv = self.down_blocks[0]
        h = self._blocks(blocks, res(h, mask, temb), mask, bias)
        skip = h
        h = conv(h * mask)
        for res, blocks in self.mid_blocks:
            h = self._blocks(blocks, res(h, mask, temb), mask, bias)
        res, blocks, conv = self.up_blocks[0]
        h = torch.cat([h, skip], 1)
        h = self._blocks(blocks, res(h, mask, temb), mask, bias)
        h = conv(h * mask)
        h = self.final_block(h, mask)
        return self.final_proj(h * mask) * mask


class CFM(nn.Module):
    def __init__(self, dims: FlowDims):
        super().__init__()
        self.dims = dims
        self.estimator = Estimator(dims)

    def forward(self, mu, mask, spks, cond, noise, streaming: bool) -> torch.Tensor:
        """mu, cond, noise [B, 80, T]; mask [B, 1, T]; spks [B, 80] -> mel [B, 80, T]. Each Euler
        step is one estimator call on 2B rows: B conditioned, B with mu, spks and cond zero."""
        b = mu.shape[0]
        x = noise
        span = torch.linspace(0, 1, self.dims.steps + 1, device=mu.device, dtype=mu.dtype)
        span = 1 - torch.cos(span * 0.5 * torch.pi)
        t, dt = span[0:1], span[1] - span[0]
        zeros = torch.zeros_like(mu)
        mu2, spks2, cond2 = torch.cat([mu, zeros]), torch.cat([spks, torch.zeros_like(spks)]), torch.cat([cond, zeros])
        mask2 = torch.cat([mask, mask])
        r = self.dims.cfg_rate
        for step in range(1, len(span)):
            v = self.estimator(torch.cat([x, x]), mask2, mu2, t.expand(2 * b), spks2, cond2, streaming)
            v, v_uncond = v[:b], v[b:]
            x = x + dt * ((1.0 + r) * v - r * v_uncond)
            t = t + dt
            if step < len(span) - 1:
                dt = span[step + 1] - t
        return x


class CosyFlow(nn.Module):
    def __init__(self, dims: FlowDims):
        super().__init__()
        self.dims = dims
        self.input_embedding = nn.Embedding(dims.vocab, dims.input_size)
        self.spk_embed_affine_layer = nn.Linear(dims.spk_embed, dims.mel)
        self.encoder = UpsampleEncoder(dims)
        self.encoder_proj = nn.Linear(dims.input_size, dims.mel)
        self.decoder = CFM(dims)
        g = torch.Generator().manual_seed(0)
        # upstream draws this buffer after seeding the global generator with 0: same stream
        self.register_buffer("noise", torch.randn(1, dims.mel, NOISE_FRAMES, generator=g), persistent=False)

    def forward(self, tokens, lengths, prompt_feat, prompt_frames, embedding, streaming: bool, finalize: bool):
        """tokens [B, T] (prompt tokens first, each row's own; padding past `lengths`),
        prompt_feat [B, Tm, 80] (zero past each row's `prompt_frames`), embedding [B, 192] ->
        (mel [B, 80, 2 T'], frames [B]): two frames per encoded token, prompt included (a row's
        frames past its `frames` are padding). finalize=False: each row's last `lookahead`
        tokens are look-ahead context only, not encoded."""
        d = self.dims
        b = tokens.shape[0]
        spks = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        core = lengths if finalize else lengths - d.lookahead
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        keep = (pos[None] < lengths[:, None]).unsqueeze(-1).to(spks.dtype)
        emb = self.input_embedding(tokens.clamp(min=0).long()) * keep
        h, frames = self.encoder(emb, core, lengths, streaming)
        mu = self.encoder_proj(h).transpose(1, 2)  # [B, 80, 2T]
        n = mu.shape[-1]
        mask = (torch.arange(n, device=mu.device)[None] < frames[:, None]).to(mu.dtype)[:, None]  # [B, 1, 2T]
        cond = torch.zeros_like(mu)
        pf = prompt_feat.transpose(1, 2)[:, :, :n]
        cond[:, :, : pf.shape[-1]] = pf * (torch.arange(pf.shape[-1], device=mu.device)[None] < prompt_frames[:, None]).to(mu.dtype)[:, None]
        noise = self.noise[:, :, :n].to(mu.dtype).expand(b, -1, -1)
        return self.decoder(mu, mask, spks, cond, noise, streaming), frames
