"""Exact rewrites of a built VITS model that save memory passes.

fold_resblock_average: the decoder averages its parallel resblocks (x / K) right before a
leaky ReLU and a convolution. leaky_relu is positively homogeneous (lrelu(x / K) = lrelu(x) / K)
and masking commutes with scaling, so the 1/K can live in the next convolution's weights
(the next upsampling layer, or conv_post after the last stage). That drops one full pass over
the activation per upsampling stage - the last one at the full sample rate.
"""

from __future__ import annotations

import torch

from ...models.vits import Generator


@torch.no_grad()
def fold_resblock_average(dec: Generator) -> bool:
    if dec.average_folded:
        return False
    k = float(dec.num_kernels)
    nexts = [*list(dec.ups)[1:], dec.conv_post]
    for conv in nexts:
        conv.weight.div_(k)  # bias untouched: it is added after the (scaled) input is convolved
    dec.average_folded = True
    return True


# The decoder's later stages hold most of its activations (the last one at the full sample
# rate); over tiles of this many latent frames they stay within a few MB, in cache.
TILE_FRAMES = 128


def tile_decoder(dec: Generator, frames: int = TILE_FRAMES, first: int = 1) -> bool:
    """Run the decoder's stages from `first` on over tiles of `frames` latent frames, each
    with the stages' receptive field of real context on both sides (exact: the same values as
    the whole sequence, up to float rounding). CPU only: a GPU wants the long kernels."""
    if not 0 <= first < len(dec.ups) or frames < 1:
        raise ValueError(f"tile_decoder: first stage {first} or {frames} frames out of range")
    dec.tiles = (first, frames)
    return True
