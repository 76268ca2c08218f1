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

In streaming mode a frame depends only on its own chunk and earlier ones (chunk masks, causal
convolutions), so when the encoder is chunk-masked too a stream's next chunk needs of the earlier
frames only what `FlowCache` keeps: the encoder's keys and values and up-conv context, and per
Euler step each estimator conv's last inputs and each attention layer's keys and values.
`CosyFlow.chunk` runs both over the new frames alone (O(N) for a stream, not the O(N^2) of
recomputing the prefix every chunk).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...runtime import attention
from ...runtime.sync import upload

SCORE_BLOCK = attention.SCORE_BLOCK  # longer inputs attend by rows of queries (runtime/attention.py)
NOISE_FRAMES = 50 * 300  # upstream's fixed noise buffer: 300 s of mel frames, seed 0
LEFT_CONTEXT = 2  # tokens before a chunk's first that its look-ahead layer reads (causal conv of 3)


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
    """ESPnet's relative sinusoidal positions: for T queries after P cached frames, the P + 2T - 1
    encodings of the offsets P+T-1 .. -(T-1) (query minus key)."""

    def __init__(self, d: int):
        super().__init__()
        self.d = d

    def forward(self, t: int, device, dtype, past: int = 0) -> torch.Tensor:
        pos = torch.arange(past + t - 1, -t, -1, device=device, dtype=torch.float32)[:, None]  # [P+2T-1, 1]
        div = torch.exp(torch.arange(0, self.d, 2, device=device, dtype=torch.float32) * -(math.log(10000.0) / self.d))
        pe = torch.zeros(pos.shape[0], self.d, device=device)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        return pe.to(dtype)[None]  # [1, P+2T-1, d]


class RelAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.linear_q, self.linear_k, self.linear_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.linear_out = nn.Linear(d, d)
        self.linear_pos = nn.Linear(d, d, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.dk))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.dk))

    def forward(self, x: torch.Tensor, mask: "KeepRows", pos: torch.Tensor, past: "ChunkRows | None" = None,
                out_kv=None) -> torch.Tensor:
        """x [B, T, d]; mask: [B, T, T] by rows (unused with `past`); pos from RelPositions(T,
        past=P). past: the rows' cached keys and values (P = the most cached): each row attends
        to its own cache and new keys, one row at a time (no batched copy of the caches);
        out_kv: a list that gets this call's (k, v)."""
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.dk).transpose(1, 2)  # [B, H, T, dk]
        k = self.linear_k(x).view(b, t, self.h, self.dk).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.dk).transpose(1, 2)
        if out_kv is not None:
            out_kv += [k, v]
        p = self.linear_pos(pos).view(1, -1, self.h, self.dk).transpose(1, 2)  # [1, H, P+2T-1, dk]
        scale = 1.0 / math.sqrt(self.dk)
        qv, qu, pt = (q + self.pos_bias_v[None, :, None]) * scale, q + self.pos_bias_u[None, :, None], p.transpose(-2, -1)
        if past is None:
            out = self._attend(qv, qu, k, v, pt, lambda i0, i1: mask.rows(i0, i1), 0)
        else:
            most = max(past.past)
            out = torch.empty_like(q)
            for j, (kj, vj) in enumerate(past.keys(k, v)):
                out[j] = self._attend(qv[j:j + 1], qu[j:j + 1], kj[None], vj[None], pt,
                                      lambda i0, i1, j=j: past.keep(j, i0, i1, kj.shape[1])[None], most - past.past[j])[0]
        return self.linear_out(out.transpose(1, 2).reshape(b, t, self.h * self.dk))

    def _attend(self, qv, qu, k, v, pt, keep, shift: int) -> torch.Tensor:
        """qv, qu [b, H, T, dk] the queries with either position bias; k, v [b, H, K, dk] (the
        first K - T cached: P - shift of them); pt [1, H, dk, P + 2T - 1]; keep(i0, i1) ->
        [b, i1 - i0, K] bool -> [b, H, T, dk]."""
        b, t, n_keys = qv.shape[0], qv.shape[2], k.shape[2]
        rows = attention.query_rows(b * self.h, t, pt.shape[-1], SCORE_BLOCK)
        outs = []
        for i0 in range(0, t, rows):
            i1 = min(t, i0 + rows)
            bd = torch.matmul(qv[:, :, i0:i1], pt)  # [b, H, rows, P+2T-1]
            # query i, key j: offset (P - shift) + i - j sits at index shift + (T - 1) - i + j, a
            # strided view of bd (no copy)
            bd = bd.as_strided((b, self.h, i1 - i0, n_keys), (bd.stride(0), bd.stride(1), bd.stride(2) - 1, 1),
                               bd.storage_offset() + shift + t - 1 - i0)
            bias = bd.masked_fill(~keep(i0, i1)[:, None], float("-inf"))  # [b, H, rows, K]; every row keeps a key
            outs.append(F.scaled_dot_product_attention(qu[:, :, i0:i1], k, v, attn_mask=bias))
        return outs[0] if len(outs) == 1 else torch.cat(outs, 2)


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

    def forward(self, x, mask, pos, past=None, out_kv=None):
        x = x + self.self_attn(self.norm_mha(x), mask, pos, past, out_kv)
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

    def forward(self, ext: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """ext [B, T + lookahead, d]: each row's frames, then what it looks ahead at (the next
        tokens, or zeros past its end) -> [B, T, d]. keep [B, T] bool: the frames that exist
        (a window that starts before a row's first frame: the causal conv sees zeros there)."""
        h = F.leaky_relu(self.conv1(ext.transpose(1, 2)))
        if keep is not None:
            h = h * keep[:, None].to(h.dtype)
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

    def forward(self, emb: torch.Tensor, lengths: Sequence[int], seen: Sequence[int], streaming: bool):
        """emb [B, W, d] token embeddings; lengths [B]: the tokens to encode; seen [B] >= lengths:
        the tokens a row has (the ones past `lengths` are look-ahead context only); both host
        ints -> [B, 2 T, d] (T = max length) and the frame lengths (host ints)."""
        t = max(lengths)
        frames = [n * self.dims.token_mel_ratio for n in lengths]
        lengths, seen = upload(lengths, torch.long, emb.device), upload(seen, torch.long, emb.device)
        width = t + self.dims.lookahead
        if emb.shape[1] < width:
            emb = F.pad(emb, (0, 0, 0, width - emb.shape[1]))
        emb = emb[:, :width]
        pos = torch.arange(width, device=emb.device)
        # zero past what a row has, after the input layer: the reference pads there with zeros
        x = self.embed(emb) * (pos[None] < seen[:, None]).unsqueeze(-1).to(emb.dtype)
        valid = pos[None, :t] < lengths[:, None]
        chunk = self.dims.encoder_chunk if streaming else 0
        mask = KeepRows(valid, chunk)
        x = self.pre_lookahead_layer(x)
        pos = self.pos(t, x.device, x.dtype)
        for layer in self.encoders:
            x = layer(x, mask, pos)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        lengths = lengths * self.dims.token_mel_ratio
        t2 = x.shape[1]
        valid = torch.arange(t2, device=x.device)[None] < lengths[:, None]
        x = self.up_embed(x)
        mask = KeepRows(valid, chunk * self.dims.token_mel_ratio)
        pos = self.pos(t2, x.device, x.dtype)
        for layer in self.up_encoders:
            x = layer(x, mask, pos)
        return self.after_norm(x), frames

    def chunk(self, emb: torch.Tensor, lengths: Sequence[int], seen: Sequence[int], caches: "list[FlowCache]"):
        """Streaming (chunk-masked) encoding of the tokens past each row's cache: emb [B, W, d]
        each row's token embeddings from `LEFT_CONTEXT` tokens before its first new one
        through the look-ahead of its last (zeros outside its tokens; `CosyFlow.chunk` makes
        them), lengths and seen as `forward`'s -> ([B, 2N, d] the new frames, their
        counts [B] (host ints)).
        The input layer and look-ahead convs run over the window only (what the new tokens'
        outputs read); the conformer blocks attend from the new frames to the cached keys."""
        d = self.dims
        dev = emb.device
        past_n = [c.frames // d.token_mel_ratio for c in caches]  # tokens
        new_n = [a - b for a, b in zip(lengths, past_n)]
        n = max(new_n)
        past, new = upload(past_n, torch.long, dev), upload(new_n, torch.long, dev)
        seen = upload(seen, torch.long, dev)
        at = past[:, None] - LEFT_CONTEXT + torch.arange(emb.shape[1], device=dev)[None]  # [B, W] absolute token
        x = self.embed(emb) * ((at >= 0) & (at < seen[:, None])).unsqueeze(-1).to(emb.dtype)
        # before a row's first token the causal conv's context is zeros, as in `forward`
        x = self.pre_lookahead_layer(x, at[:, : x.shape[1] - d.lookahead] >= 0)  # [B, W - lookahead, d]
        x = x[:, LEFT_CONTEXT: LEFT_CONTEXT + n]  # [B, N, d] the new tokens
        kv_in = None if all(c.enc_kv is None for c in caches) else [c.enc_kv for c in caches]
        kv_out: list[torch.Tensor] = []
        x = self._stack(self.encoders, x, past, new, past_n, new_n, d.encoder_chunk, kv_in, kv_out, 0)
        # the up conv reads 4 upsampled frames back: the last 2 tokens before the chunk
        tail = torch.stack([c.enc_tail if c.enc_tail is not None else x.new_zeros(2, x.shape[-1]) for c in caches])
        ctx = torch.cat([tail, x], 1)  # [B, 2 + N, d]
        tails = ctx.gather(1, (new[:, None] + torch.arange(2, device=dev)[None])[:, :, None].expand(-1, -1, x.shape[-1]))
        up = F.interpolate(ctx.transpose(1, 2), scale_factor=float(d.token_mel_ratio), mode="nearest")
        r = d.token_mel_ratio
        x = F.conv1d(up, self.up_layer.conv.weight, self.up_layer.conv.bias).transpose(1, 2)  # [B, 2N, d]
        x = self.up_embed(x)
        x = self._stack(self.up_encoders, x, past * r, new * r, [k * r for k in past_n], [k * r for k in new_n],
                        d.encoder_chunk * r, kv_in, kv_out, 2 * len(self.encoders))
        for j, c in enumerate(caches):
            c.enc_tail = tails[j]
            # the token blocks' keys are a token each, the up blocks' a frame each
            own = [t[j, :, : new_n[j] * (1 if i < 2 * len(self.encoders) else r)] for i, t in enumerate(kv_out)]
            if c.enc_kv is None:
                c.enc_kv = [o.contiguous() for o in own]  # not a view of the batch's tensor
            else:  # slot by slot: one slot of one row held twice at a time
                for i, o in enumerate(own):
                    c.enc_kv[i] = torch.cat([c.enc_kv[i], o], 1)
        return self.after_norm(x), [k * r for k in new_n]

    def _stack(self, layers, x, past, new, past_n, new_n, chunk, kv_in, kv_out, first):
        """Conformer blocks over new frames x [B, N, d] after `past` cached ones per row
        (past_n, new_n: the same counts as host ints)."""
        p = max(past_n)
        n = x.shape[1]
        # rows without a cache anywhere attend as a batch; else each row its own (ChunkRows)
        keep = KeepRows(whole=_chunk_keep(past, new, p, n, chunk, left=True)) if kv_in is None else None
        pos = self.pos(n, x.device, x.dtype, past=p)
        for k, layer in enumerate(layers):
            i = first + 2 * k
            rows = None if kv_in is None else ChunkRows([r and r[i] for r in kv_in], [r and r[i + 1] for r in kv_in],
                                                        past_n, new_n, chunk, 1)
            x = layer(x, keep, pos, rows, kv_out)
        return x


# ---------------------------------------------------------------------- estimator
class CausalConv1d(nn.Conv1d):
    def forward(self, x, tape: "Tape | None" = None):
        if tape is not None:
            return tape.conv(self, x)
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class CausalBlock(nn.Module):
    """causal conv 3 -> LayerNorm over channels -> Mish, masked before and after."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.block = nn.ModuleList([CausalConv1d(c_in, c_out, 3), nn.Identity(), nn.LayerNorm(c_out)])

    def forward(self, x, mask, tape=None):
        h = self.block[0](x * mask, tape)
        h = self.block[2](h.transpose(1, 2)).transpose(1, 2)
        return F.mish(h) * mask


class CausalResnet(nn.Module):
    def __init__(self, c_in: int, c_out: int, t_dim: int):
        super().__init__()
        self.mlp = nn.ModuleList([nn.Mish(), nn.Linear(t_dim, c_out)])
        self.block1 = CausalBlock(c_in, c_out)
        self.block2 = CausalBlock(c_out, c_out)
        self.res_conv = nn.Conv1d(c_in, c_out, 1)

    def forward(self, x, mask, temb, tape=None):
        h = self.block1(x, mask, tape) + self.mlp[1](F.mish(temb))[:, :, None]
        return self.block2(h, mask, tape) + self.res_conv(x * mask)


class KeepRows:
    """Which keys each query of the flow's attentions sees, [B, T, T'] bool, made a block of
    query rows at a time (`rows`): the whole mask is frames squared per batch row (in the
    estimator, bool copies and a float one were 1.8 GB for the 14 rows (7 sentences, CFG doubled)
    of 3,400 frames a sentence run to the LM's length bound makes). Either `attention_mask(valid, chunk)` by rows,
    or rows of a given mask (a chunk's, `Tape.keep`: small)."""

    def __init__(self, valid: torch.Tensor | None = None, chunk: int = 0, whole: torch.Tensor | None = None):
        self.valid, self.chunk, self.whole = valid, chunk, whole  # valid [B, T] bool

    def rows(self, i0: int, i1: int) -> torch.Tensor:
        """[B, i1 - i0, T'] bool: rows i0..i1 of the mask (equal to attention_mask's rows)."""
        if self.whole is not None:
            return self.whole[:, i0:i1]
        n = self.valid.shape[1]
        mask = self.valid[:, None, :].expand(-1, i1 - i0, -1)
        if self.chunk > 0:
            q = torch.arange(i0, i1, device=self.valid.device)
            mask = mask & (torch.arange(n, device=self.valid.device)[None, :] < ((q // self.chunk + 1) * self.chunk)[:, None])[None]
        return mask | ~mask.any(-1, keepdim=True)


def _bias(keep: torch.Tensor, dtype) -> torch.Tensor:
    """keep [B, rows, T'] bool -> the additive mask [B, 1, rows, T'] for one attention step."""
    return (~keep)[:, None].to(dtype) * -1.0e10


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, head_dim: int):
        super().__init__()
        self.h, self.hd = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(d, inner, bias=False)
        self.to_k = nn.Linear(d, inner, bias=False)
        self.to_v = nn.Linear(d, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, d)])

    def forward(self, x, keep: KeepRows, tape=None):  # x [B, T, d]; keep: [B, T, T'] (T' = T without a tape)
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.h, self.hd).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        out = None if tape is None else tape.attend(q, k, v)
        if out is not None:
            return self.to_out[0](out.transpose(1, 2).reshape(b, t, self.h * self.hd))
        rows = attention.query_rows(b * self.h, t, k.shape[2], SCORE_BLOCK)
        out = torch.cat([F.scaled_dot_product_attention(q[:, :, i:i + rows], k, v,
                                                        attn_mask=_bias(keep.rows(i, min(t, i + rows)), q.dtype))
                         for i in range(0, t, rows)], 2) if rows < t else \
            F.scaled_dot_product_attention(q, k, v, attn_mask=_bias(keep.rows(0, t), q.dtype))
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

    def forward(self, x, keep, tape=None):
        x = x + self.attn1(self.norm1(x), keep, tape)
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

    def _blocks(self, blocks, x, keep, tape):
        h = x.transpose(1, 2)
        for blk in blocks:
            h = blk(h, keep, tape)
        return h.transpose(1, 2)

    def forward(self, x, mask, mu, t, spks, cond, streaming: bool, tape: "Tape | None" = None):
        """x, mu, cond [B, 80, T]; mask [B, 1, T]; t [B]; spks [B, 80] -> [B, 80, T]. With a
        tape, the T frames follow each row's cached ones (chunk-masked attention over both)."""
        temb = self.time_mlp(timestep_embedding(t, self.dims.est_in).to(x.dtype))
        h = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, x.shape[-1]), cond], 1)
        if tape is None:
            keep = KeepRows(mask[:, 0] > 0, self.dims.est_chunk if streaming else 0)
        else:  # None: the rows have caches and attend one stream at a time (Tape.attend)
            keep = None if tape.keep is None else KeepRows(whole=tape.keep)
        # keep: [B, T, T], each attention step makes its rows' mask (KeepRows, _bias)
        res, blocks, conv = self.down_blocks[0]
        h = self._blocks(blocks, res(h, mask, temb, tape), keep, tape)
        skip = h
        h = conv(h * mask, tape)
        for res, blocks in self.mid_blocks:
            h = self._blocks(blocks, res(h, mask, temb, tape), keep, tape)
        res, blocks, conv = self.up_blocks[0]
        h = torch.cat([h, skip], 1)
        h = self._blocks(blocks, res(h, mask, temb, tape), keep, tape)
        h = conv(h * mask, tape)
        h = self.final_block(h, mask, tape)
        return self.final_proj(h * mask) * mask


def _cosine_span(steps: int, device, dtype) -> torch.Tensor:
    span = torch.linspace(0, 1, steps + 1, device=device, dtype=dtype)
    return 1 - torch.cos(span * 0.5 * torch.pi)


class CFM(nn.Module):
    def __init__(self, dims: FlowDims):
        super().__init__()
        self.dims = dims
        self.estimator = Estimator(dims)

    def forward(self, mu, mask, spks, cond, noise, streaming: bool, tapes: "list[Tape] | None" = None) -> torch.Tensor:
        """mu, cond, noise [B, 80, T]; mask [B, 1, T]; spks [B, 80] -> mel [B, 80, T]. Each Euler
        step is one estimator call on 2B rows: B conditioned, B with mu, spks and cond zero.
        tapes: one per Euler step (chunk-masked, the frames after each row's cached ones)."""
        b = mu.shape[0]
        x = noise
        span = _cosine_span(self.dims.steps, mu.device, mu.dtype)
        t, dt = span[0:1], span[1] - span[0]
        zeros = torch.zeros_like(mu)
        mu2, spks2, cond2 = torch.cat([mu, zeros]), torch.cat([spks, torch.zeros_like(spks)]), torch.cat([cond, zeros])
        mask2 = torch.cat([mask, mask])
        r = self.dims.cfg_rate
        for step in range(1, len(span)):
            tape = None if tapes is None else tapes[step - 1]
            v = self.estimator(torch.cat([x, x]), mask2, mu2, t.expand(2 * b), spks2, cond2, streaming, tape)
            v, v_uncond = v[:b], v[b:]
            x = x + dt * ((1.0 + r) * v - r * v_uncond)
            t = t + dt
            if step < len(span) - 1:
                dt = span[step + 1] - t
        return x


# ---------------------------------------------------------------------- streaming state
@dataclass(eq=False)
class FlowCache:
    """One stream's estimator state after its first `frames` mel frames (prompt included),
    chunk-masked mode: `steps[s]` holds, for Euler step s, each causal conv's last inputs
    ([2, C, k - 1]) and each attention layer's keys and values ([2, H, frames, head_dim]), in
    the order the estimator meets them; row 0 conditioned, row 1 the guidance row."""

    frames: int = 0
    steps: list[list[torch.Tensor]] | None = None
    enc_kv: list[torch.Tensor] | None = None
    """The encoder's conformer keys and values, [H, tokens or frames, dk] per block."""
    enc_tail: torch.Tensor | None = None
    """[2, d] the token blocks' output for the last two tokens (the up conv's left context)."""
    bytes: int = 0

    def nbytes(self) -> int:
        held = [t for step in self.steps or () for t in step] + list(self.enc_kv or ())
        return sum(t.numel() * t.element_size() for t in held)

    def copy(self) -> "FlowCache":
        """A cache to extend on its own (the tensors are shared: a cache only ever grows by new ones)."""
        return FlowCache(self.frames, None if self.steps is None else [list(s) for s in self.steps],
                         None if self.enc_kv is None else list(self.enc_kv), self.enc_tail, self.bytes)


class Tape:
    """One estimator call of a chunk batch: it feeds each stateful layer the rows' cached
    state, in order, and records what the rows' caches gain. Rows are 2B: B streams'
    conditioned rows, then their guidance rows. An attention layer reads each stream's cache
    as it is (`ChunkRows`): no batched copy of the caches is made."""

    def __init__(self, caches: "list[FlowCache]", step: int, past_n: list[int], new_n: list[int], chunk: int,
                 new_len: torch.Tensor, keep: torch.Tensor | None):
        self.caches, self.step, self.new_len, self.keep = caches, step, new_len, keep
        self.past_n, self.new_n, self.chunk = past_n, new_n, chunk
        self.i = 0
        self.out: list[torch.Tensor] = []

    def _next(self) -> list[torch.Tensor | None] | None:
        """The next slot of each row's cache ([2, ...]; None: a row without one), None if no row has one."""
        rows = [None if c.steps is None else c.steps[self.step][self.i] for c in self.caches]
        self.i += 1
        return None if all(r is None for r in rows) else rows

    def conv(self, conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
        """A causal conv of the new frames x [R, C, N] after each row's cached inputs."""
        k = conv.kernel_size[0] - 1
        rows = self._next()
        if rows is None:
            prev = x.new_zeros(x.shape[0], x.shape[1], k)
        else:  # [2B, C, k]: the conditioned rows, then the guidance rows
            parts = [x.new_zeros(2, x.shape[1], k) if r is None else r for r in rows]
            prev = torch.cat([torch.stack([q[h] for q in parts]) for h in (0, 1)])
        xx = torch.cat([prev, x], -1)
        idx = self.new_len[:, None] + torch.arange(k, device=x.device)[None]  # the row's last k inputs
        self.out.append(xx.gather(-1, idx[:, None, :].expand(-1, x.shape[1], -1)))
        return F.conv1d(xx, conv.weight, conv.bias)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
        """An attention layer's new frames q, k, v [R, H, N, hd] -> its output [R, H, N, hd],
        each stream's two rows attending to their cache and new keys (one stream at a time: no
        batched copy of the caches); None if no row has a cache (the layer attends as a batch
        with `keep`)."""
        pk, pv = self._next(), self._next()
        self.out += [k, v]
        if pk is None:
            return None
        rows = ChunkRows(pk, pv, self.past_n, self.new_n, self.chunk, 2)
        out = q.new_empty(q.shape).unflatten(0, (2, len(self.caches)))  # [2, B, H, N, hd]
        q2 = q.unflatten(0, (2, len(self.caches)))
        for j, (kj, vj) in enumerate(rows.keys(k, v)):
            n_keys, n = kj.shape[2], q.shape[2]
            step = attention.query_rows(2 * q.shape[1], n, n_keys, SCORE_BLOCK)
            for i0 in range(0, n, step):
                i1 = min(n, i0 + step)
                out[:, j, :, i0:i1] = F.scaled_dot_product_attention(
                    q2[:, j, :, i0:i1], kj, vj, attn_mask=_bias(rows.keep(j, i0, i1, n_keys)[None], q.dtype))
        return out.flatten(0, 1)


class ChunkRows:
    """A cached chunk batch's attention layer, row by row: each row's cached keys and values
    ([pairs, H, P_j, dk], or [H, P_j, dk] if pairs is 1; None: none yet), its cached and new
    frames (host ints) and the attention's chunk. A row's new frame i (absolute P_j + i) sees
    every cached frame and the new ones of its own chunk or earlier."""

    def __init__(self, k: list, v: list, past: list[int], new: list[int], chunk: int, pairs: int):
        self.k, self.v, self.past, self.new, self.chunk, self.pairs = k, v, past, new, chunk, pairs
        self.device: torch.device | None = None  # the batch's, once `keys` ran

    def keys(self, k: torch.Tensor, v: torch.Tensor):
        """The batch's new k, v [pairs x B, H, N, dk] -> per row (its keys, its values), the
        cached ones first: [pairs, H, P_j + n_j, dk] ([H, ...] if pairs is 1)."""
        b = len(self.past)
        self.device = k.device
        k2, v2 = k.unflatten(0, (self.pairs, b)), v.unflatten(0, (self.pairs, b))
        for j in range(b):
            nk, nv = k2[:, j, :, : self.new[j]], v2[:, j, :, : self.new[j]]
            if self.pairs == 1:
                nk, nv = nk[0], nv[0]
            if self.k[j] is not None and self.past[j]:
                nk, nv = torch.cat([self.k[j], nk], -2), torch.cat([self.v[j], nv], -2)
            yield nk, nv

    def keep(self, j: int, i0: int, i1: int, n_keys: int) -> torch.Tensor:
        """[i1 - i0, n_keys] bool: which of row j's keys its new frames i0..i1 see."""
        dev = self.device
        q = self.past[j] + torch.arange(i0, i1, device=dev)
        return torch.arange(n_keys, device=dev)[None] < ((q // self.chunk + 1) * self.chunk)[:, None]


def _chunk_keep(past_len: torch.Tensor, new_len: torch.Tensor, p: int, n: int, chunk: int,
                left: bool = False) -> torch.Tensor:
    """[R, N, P + N] bool: new frame i of row r (absolute P_r + i) sees its cached frames
    (P_r of the P slots: the first ones, or the last ones if `left`-padded; p = P = max P_r)
    and the new ones of its own chunk or earlier."""
    dev = past_len.device
    i = torch.arange(n, device=dev)[None, :, None]
    a = past_len[:, None, None] + i  # absolute query frame
    jp = torch.arange(p, device=dev)[None, None, :]
    old = jp >= p - past_len[:, None, None] if left else jp < past_len[:, None, None]
    jn = torch.arange(n, device=dev)[None, None, :]
    new = (jn < new_len[:, None, None]) & (past_len[:, None, None] + jn < (a // chunk + 1) * chunk)
    keep = torch.cat([old.expand(-1, n, -1), new], -1)
    return keep | ~keep.any(-1, keepdim=True)


def _extend(caches: list[FlowCache], tapes: list[Tape], new_len: Sequence[int], frames: Sequence[int]) -> None:
    """Append each row's new state (its own frames only) to its cache."""
    b = len(caches)
    for j, c in enumerate(caches):
        n = new_len[j]
        if c.steps is None:
            c.steps = [[None] * len(tape.out) for tape in tapes]
        for s, tape in enumerate(tapes):
            for slot, t in enumerate(tape.out):
                pair = t[[j, b + j]]  # a copy: the batch's tensor is not kept
                if t.dim() == 4 and c.steps[s][slot] is not None:  # keys / values: cached, then this chunk's
                    pair = torch.cat([c.steps[s][slot], pair[:, :, :n]], 2)
                elif t.dim() == 4:
                    pair = pair[:, :, :n].contiguous()
                # slot by slot: the old tensor goes now (one slot of one row held twice at a time)
                c.steps[s][slot] = pair
        c.frames = frames[j]
        c.bytes = c.nbytes()


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

    def _inputs(self, tokens, lengths: torch.Tensor, embedding):
        """-> (spks [B, 80], token embeddings [B, T, d], zero past each row's length)."""
        spks = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        keep = (pos[None] < lengths[:, None]).unsqueeze(-1).to(spks.dtype)
        return spks, self.input_embedding(tokens.clamp(min=0).long()) * keep

    def condition(self, tokens, lengths, prompt_feat, prompt_frames, embedding, streaming: bool, finalize: bool):
        """The estimator's conditions over every encoded frame: (mu [B, 80, 2T'], frames [B]
        (host ints), spks [B, 80], cond [B, 80, 2T']); arguments as `forward`'s."""
        d = self.dims
        lengths, prompt_frames = [int(n) for n in lengths], [int(n) for n in prompt_frames]
        dev = tokens.device
        spks, emb = self._inputs(tokens, upload(lengths, torch.long, dev), embedding)
        core = lengths if finalize else [n - d.lookahead for n in lengths]
        h, frames = self.encoder(emb, core, lengths, streaming)
        mu = self.encoder_proj(h).transpose(1, 2)  # [B, 80, 2T]
        n = mu.shape[-1]
        cond = torch.zeros_like(mu)
        pf = prompt_feat.transpose(1, 2)[:, :, :n]
        pframes = upload(prompt_frames, torch.long, dev)
        cond[:, :, : pf.shape[-1]] = pf * (torch.arange(pf.shape[-1], device=mu.device)[None] < pframes[:, None]).to(mu.dtype)[:, None]
        return mu, frames, spks, cond

    def forward(self, tokens, lengths, prompt_feat, prompt_frames, embedding, streaming: bool, finalize: bool):
        """tokens [B, T] (prompt tokens first, each row's own; padding past `lengths`),
        prompt_feat [B, Tm, 80] (zero past each row's `prompt_frames`), embedding [B, 192];
        lengths and prompt_frames [B]: host ints (a list or a CPU tensor: the caller knows
        them, and a read back would wait for the device) -> (mel [B, 80, 2 T'], frames [B],
        host ints): two frames per encoded token, prompt included (a row's frames past its
        `frames` are padding). finalize=False: each row's last `lookahead` tokens are
        look-ahead context only, not encoded."""
        mu, frames, spks, cond = self.condition(tokens, lengths, prompt_feat, prompt_frames, embedding,
                                                streaming, finalize)
        n = mu.shape[-1]
        f = upload(frames, torch.long, mu.device)
        mask = (torch.arange(n, device=mu.device)[None] < f[:, None]).to(mu.dtype)[:, None]  # [B, 1, 2T]
        noise = self.noise[:, :, :n].to(mu.dtype).expand(mu.shape[0], -1, -1)
        return self.decoder(mu, mask, spks, cond, noise, streaming), frames

    def chunk(self, tokens, lengths, prompt_feat, prompt_frames, embedding, caches: list[FlowCache]):
        """The next streaming chunk of B streams, each after its cached frames: arguments as
        `forward(..., streaming=True, finalize=False)` (the whole prefix of tokens) ->
        (mel [B, 80, N] of the frames past each cache, their counts [B], host ints); the
        caches grow by them. Equal to slicing `forward`'s chunk-masked mel."""
        d = self.dims
        dev = tokens.device
        lengths, prompt_frames = [int(n) for n in lengths], [int(n) for n in prompt_frames]
        core = [n - d.lookahead for n in lengths]
        frames = [n * d.token_mel_ratio for n in core]
        past_n = [c.frames for c in caches]
        new_n = [f - p for f, p in zip(frames, past_n)]
        if min(new_n) <= 0 or any(f % d.est_chunk for f in frames):
            # a cache must end on the chunk grid: frames of a chunk see each other
            raise ValueError(f"a streaming chunk must add whole chunks of {d.est_chunk} frames: "
                             f"{past_n} -> {frames}")
        past, new = upload(past_n, torch.long, dev), upload(new_n, torch.long, dev)
        # the tokens the encoder's chunk reads: from LEFT_CONTEXT before each row's new ones
        # through their look-ahead ([B, W], absolute positions; zero outside the row's tokens)
        past_tok = [p // d.token_mel_ratio for p in past_n]
        width = max(c - p for c, p in zip(core, past_tok)) + LEFT_CONTEXT + d.lookahead
        at = (past // d.token_mel_ratio - LEFT_CONTEXT)[:, None] + torch.arange(width, device=dev)[None]
        have = (at >= 0) & (at < upload(lengths, torch.long, dev)[:, None])
        window = tokens.gather(1, at.clamp(0, tokens.shape[1] - 1)).clamp(min=0).long()
        spks = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        emb = self.input_embedding(window) * have.unsqueeze(-1).to(spks.dtype)
        h, _ = self.encoder.chunk(emb, core, lengths, caches)
        n = h.shape[1]
        mask = (torch.arange(n, device=dev)[None] < new[:, None]).to(spks.dtype)[:, None]  # [B, 1, N]
        mu = self.encoder_proj(h).transpose(1, 2) * mask  # [B, 80, N]
        at = past[:, None] + torch.arange(n, device=dev)[None]  # [B, N] absolute frames
        pf = prompt_feat.transpose(1, 2)  # [B, 80, Tm]
        cond = pf.gather(-1, at.clamp(max=pf.shape[-1] - 1)[:, None, :].expand(-1, pf.shape[1], -1))
        pframes = upload(prompt_frames, torch.long, dev)
        cond = cond * ((at < pframes[:, None]) & (at < pf.shape[-1]))[:, None].to(cond.dtype) * mask
        noise = self.noise[0, :, at.clamp(max=self.noise.shape[-1] - 1)].permute(1, 0, 2).to(mu.dtype)  # [B, 80, N]
        past2, new2 = torch.cat([past, past]), torch.cat([new, new])
        # the batch's mask, for a batch of streams without caches (else each row makes its own)
        keep = _chunk_keep(past2, new2, 0, n, d.est_chunk) if max(past_n) == 0 else None
        tapes = [Tape(caches, s, past_n, new_n, d.est_chunk, new2, keep) for s in range(d.steps)]
        mel = self.decoder(mu, mask, spks, cond, noise * mask, True, tapes)
        _extend(caches, tapes, new_n, frames)
        return mel, new_n
