"""The int8 decoder (families/piper/int8.py, `RuntimeOptions.cpu_int8`) is the fp32 decoder up
to quantisation error: every sentence keeps its length, the audio stays close, and a failed
calibration leaves the fp32 decoder in place. Its speed is a matter for docs/precision.md."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import voxserve
from voxserve.families.piper.int8 import Int8Conv1d, quantize_decoder
from voxserve.families.piper.model import Generator, VitsDims
from voxserve.families.piper.options import RuntimeOptions
from voxserve.families.piper.precision import compare_audio
from voxserve.options import SynthesisOptions
from voxserve.runtime.layout import convert_convs_channels_last

DIMS = VitsDims(n_vocab=10, inter_channels=12, upsample_initial_channel=32, upsample_rates=(8, 8, 4),
                upsample_kernel_sizes=(16, 16, 8))
TEXTS = ["Hello there.", "The quick brown fox jumps over the lazy dog.",
         "Would you like me to read your messages now?", "Battery low. Please connect the charger."]


def _generator() -> Generator:
    torch.manual_seed(0)
    gen = Generator(DIMS).eval().requires_grad_(False)
    for p in gen.parameters():
        p.normal_(0, 0.15)
    return gen


def _rel_err(ref: torch.Tensor, got: torch.Tensor) -> float:
    return float((ref - got).norm() / ref.norm())


@pytest.mark.parametrize("channels_last", [False, True])
def test_quantised_generator_is_close_to_fp32(channels_last, one_torch_thread):
    gen = _generator()
    if channels_last:  # as a CPU voice's decoder is built before it is quantised
        convert_convs_channels_last(gen)
    z = [torch.randn(1, DIMS.inter_channels, n, generator=torch.Generator().manual_seed(n)) for n in (40, 70)]
    ref = [gen(x) for x in z]
    q = copy.deepcopy(gen)
    n = quantize_decoder(q, lambda: [q(x) for x in z])
    assert n == 1 + len(DIMS.upsample_rates) + sum(len(b.convs) for b in gen.resblocks)
    assert isinstance(q.conv_pre, Int8Conv1d) and not isinstance(q.conv_post, Int8Conv1d)
    for r, x in zip(ref, z):
        got = q(x)
        assert got.shape == r.shape and got.dtype == torch.float32
        assert _rel_err(r, got) < 0.1  # int8 per convolution, 7-bit activations: a few %
        assert _rel_err(r, got) > 0  # it did change the arithmetic


def test_failed_calibration_leaves_the_fp32_decoder(one_torch_thread):
    gen = _generator()
    z = torch.randn(1, DIMS.inter_channels, 30)
    ref = gen(z)

    def fail():
        gen(z)
        raise RuntimeError("calibration failed")

    with pytest.raises(RuntimeError, match="calibration failed"):
        quantize_decoder(gen, fail)
    assert not any(isinstance(m, Int8Conv1d) for m in gen.modules())
    assert torch.equal(gen(z), ref)


def test_int8_voice_keeps_every_length_and_stays_close(tiny_voice_path, one_torch_thread):
    plain = voxserve.load_voice(tiny_voice_path, device="cpu")
    int8 = voxserve.load_voice(tiny_voice_path, device="cpu", runtime=RuntimeOptions(cpu_int8=True))
    assert any(isinstance(m, Int8Conv1d) for m in int8.runner.model.dec.modules())
    opts = SynthesisOptions(seed=11)
    ref = [plain.synthesize(t, opts).samples for t in TEXTS]
    got = [int8.synthesize(t, opts).samples for t in TEXTS]
    cmp = compare_audio(ref, got)
    assert cmp["length_changed"] == 0
    assert cmp["snr_db"] > 10  # the real voice's figure is in docs/precision.md
    # calibrated with a fixed seed: two loads quantise alike
    again = voxserve.load_voice(tiny_voice_path, device="cpu", runtime=RuntimeOptions(cpu_int8=True))
    assert np.array_equal(again.synthesize(TEXTS[0], opts).samples, got[0])


def test_int8_needs_an_fp32_cpu_voice(tiny_voice_path):
    with pytest.raises(ValueError, match="cpu_int8"):
        voxserve.load_voice(tiny_voice_path, device="cpu", dtype="bf16", runtime=RuntimeOptions(cpu_int8=True))
