"""The tiled decoder (transforms.tile_decoder) computes what the whole-sequence decoder does:
for every mask kind the runner uses, several tile sizes and first stages, both resblock types,
and with the voice's other CPU transforms on top. Its halo (`Generator.tail_reach`) is checked
against the receptive field measured by perturbing one input sample."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from vits_fixtures import load_piper

import voxserve
from voxserve.families.piper.options import Transforms
from voxserve.families.piper.transforms import TILE_FRAMES, tile_decoder
from voxserve.models.vits import GapMask, Generator, VitsDims

DIMS = {
    "2": VitsDims(n_vocab=10, inter_channels=12, upsample_initial_channel=32, upsample_rates=(8, 8, 4),
                  upsample_kernel_sizes=(16, 16, 8), gin_channels=6),
    "1": VitsDims(n_vocab=10, inter_channels=12, resblock="1", resblock_kernel_sizes=(3, 5),
                  resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)), upsample_initial_channel=32,
                  upsample_rates=(4, 4), upsample_kernel_sizes=(8, 8), gin_channels=6),
}


def _generator(resblock: str) -> Generator:
    torch.manual_seed(0)
    gen = Generator(DIMS[resblock]).eval()
    with torch.no_grad():
        for p in gen.parameters():
            p.normal_(0, 0.15)
    return gen


def _masks(n: int):
    """Each mask kind the runner passes: none, dense, a packed run's gaps with a bucket tail."""
    dense = torch.ones(1, 1, n)
    dense[..., n - 9 :] = 0
    gaps = GapMask(torch.tensor([20, 21, 22, 23, 60, 61, 62, 63]), n, tail_from=n - 5)
    return {"none": None, "dense": dense, "gaps": gaps}


def _inputs(n: int, mask):
    torch.manual_seed(1)
    z = torch.randn(1, 12, n)
    g = torch.randn(1, 6, n)
    if isinstance(mask, GapMask):
        z[..., mask.index] = 0
        z[..., mask.tail_from :] = 0
    elif mask is not None:
        z = z * mask
    return z, g


@pytest.mark.parametrize("n", [100, 157])
@pytest.mark.parametrize("resblock", ["1", "2"])
@pytest.mark.parametrize("mask_kind", ["none", "dense", "gaps"])
def test_tiles_equal_the_whole_sequence(resblock, mask_kind, n):
    gen = _generator(resblock)
    mask = _masks(n)[mask_kind]
    z, g = _inputs(n, mask)
    with torch.inference_mode():
        whole = gen(z, mask, g)
        for first in range(len(gen.ups)):
            for frames in (1, 3, 7, 32, 99, 200):
                gen.tiles = (first, frames)
                tiled = gen(z, mask, g)
                assert tiled.shape == whole.shape
                assert (tiled - whole).abs().max().item() <= 1e-5, (first, frames)
    gen.tiles = None


def test_tile_widths_come_from_a_few_whatever_the_length():
    """Each tile width is a kernel shape that oneDNN keeps (per thread team): over every length,
    the tiles of long sequences take one of a few widths, and end tiles step by a quarter tile."""
    gen = _generator("2")
    first, frames = 1, 8
    gen.tiles = (first, frames)
    r = gen.upsample_rates[0]
    step, halo, quantum = frames * r, gen.tail_reach(first), frames // 4 * r
    widths: dict[int, set[int]] = {}
    tail = gen.tail
    gen.tail = lambda x, mask, f: widths.setdefault(n, set()).add(x.shape[-1]) or tail(x, mask, f)
    with torch.inference_mode():
        for n in range(1, 120):
            gen(torch.randn(1, 12, n), None, torch.randn(1, 6, n))
    long = set().union(*(w for n, w in widths.items() if n * r >= 2 * step + 2 * halo))
    ends = set(range(quantum, step + 2 * halo + quantum, quantum))  # up to the middle tile's, rounded up
    assert long <= {step + halo, step + 2 * halo} | ends, long
    assert len(long) <= 2 + len(ends), long
    assert all(len(w) == 1 for n, w in widths.items() if n * r <= step + halo)  # one call: not tiled


@pytest.mark.parametrize("resblock", ["1", "2"])
def test_halo_covers_the_measured_receptive_field(resblock):
    """Changing one input sample of a tail stage moves no output further than tail_reach."""
    gen = _generator(resblock)
    with torch.inference_mode():
        for first in range(len(gen.ups)):
            ch = gen.ups[first].in_channels
            n = 64
            x = torch.randn(1, ch, n)
            base = gen.tail(x, None, first)[0, 0]
            x2 = x.clone()
            x2[..., n // 2] += 5.0
            moved = ((gen.tail(x2, None, first)[0, 0] - base).abs() > 0).nonzero().flatten()
            up = int(np.prod(gen.upsample_rates[first:]))
            centre = (n // 2) * up
            reach = max(centre - moved.min().item(), moved.max().item() - centre - up + 1) / up
            assert 0 < reach <= gen.tail_reach(first) - 1, (first, reach, gen.tail_reach(first))


def test_tile_decoder_validates():
    gen = _generator("2")
    with pytest.raises(ValueError):
        tile_decoder(gen, frames=0)
    with pytest.raises(ValueError):
        tile_decoder(gen, first=3)
    assert tile_decoder(copy.deepcopy(gen)) and gen.tiles is None


def test_voice_tiles_on_cpu_and_equals_untiled(joe_voice):
    dec = joe_voice.runner.model.dec
    assert dec.tiles == (1, TILE_FRAMES)
    plain = load_piper(transforms=Transforms(cpu_decode_tiles=False))
    assert plain.runner.model.dec.tiles is None
    ids = [s.ids for s in joe_voice.frontend.sentences(
        "A short one. Then a much longer sentence that runs over several decoder tiles, so that the "
        "tiles meet inside words and inside the gaps between packed sentences. Done.")]
    a = joe_voice.synthesize_ids(ids, voxserve.DETERMINISTIC)
    b = plain.synthesize_ids(ids, voxserve.DETERMINISTIC)
    assert max(len(x) for x in a) > 2 * TILE_FRAMES * joe_voice.runner.dims.hop_length
    for x, y in zip(a, b):
        assert len(x) == len(y) and np.abs(x - y).max() <= 1e-4
