"""Bark attention through PyTorch's scaled-dot-product attention.

Bark itself is `transformers`' BarkModel (semantic -> coarse -> fine transformers, then EnCodec).
`transformers` offers Bark only an eager attention (matmul, mask, softmax, matmul) and
flash-attention-2 (needs the flash-attn package); no SDPA path, in 4.x or 5.x. This is
"fused attention": the same weights, the attention product computed by `F.scaled_dot_product_attention`, which picks a fused kernel (flash / memory
efficient on CUDA, a fused CPU kernel) instead of materialising the [B, heads, q, k] scores.

`set_bark_attention(model, "sdpa" | "eager")` swaps the class of every BarkSelfAttention in
place (same parameters and buffers) and can be undone; tests/bark checks sdpa against eager.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bark.modeling_bark import BarkSelfAttention


class BarkSdpaSelfAttention(BarkSelfAttention):
    """BarkSelfAttention whose attention product runs through F.scaled_dot_product_attention."""

    def _attn(self, query, key, value, attention_mask=None):
        # query [B, H, q, d]; key/value [B, H, k, d] (k = q + cached length); attention_mask: the
        # additive float mask [B, 1, q, k] that transformers builds for eager attention, or None
        q_len, k_len = query.size(-2), key.size(-2)
        mask = attention_mask
        is_causal = False
        if self.is_causal and q_len > 1:
            if mask is None and q_len == k_len:
                is_causal = True  # prefill without cache: SDPA's own (top-left) causal mask fits
            else:
                # the eager path's bottom-right-aligned causal block: query i sees keys <= k-q+i
                causal = self.bias[:, :, k_len - q_len : k_len, :k_len]
                if mask is None:
                    mask = causal
                else:
                    mask = mask.masked_fill(~causal, torch.finfo(mask.dtype).min)
        # q_len == 1 (a decode step) sees every cached key: no causal mask needed
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal, scale=1.0 / math.sqrt(self.head_dim),
        )
        return out, None


def bark_attention_modules(model: nn.Module) -> list[BarkSelfAttention]:
    # the flash-attention-2 class derives from BarkSelfAttention too; it is left alone
    return [m for m in model.modules() if type(m) in (BarkSelfAttention, BarkSdpaSelfAttention)]


def set_bark_attention(model: nn.Module, impl: str) -> int:
    """Switch every eager/SDPA Bark attention of `model` to `impl`; returns how many switched."""
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"attention must be 'sdpa' or 'eager' here, not {impl!r}")
    cls = BarkSdpaSelfAttention if impl == "sdpa" else BarkSelfAttention
    mods = bark_attention_modules(model)
    for m in mods:
        m.__class__ = cls
    return len(mods)
