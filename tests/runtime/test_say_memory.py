"""Bounded decoder memory on CPU (issue 18): a sentence longer than the decode cap is decoded
in windows, each with the decoder's receptive field of real context, and sounds the same as
decoded whole. (Peak RSS itself is measured by benchmarks/say_memory.py, not asserted here.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from audio_compare import BATCH_ATOL

import voxserve
from voxserve.families.piper.buckets import DECODE_ALIGN
from voxserve.families.piper.options import Transforms

LONG = ("This is a long sentence, written to check that the decoder gives the same audio when it "
        "runs in windows as when it runs over the whole sentence at once, because every window "
        "has the receptive field of real context on both sides.")


def _with_config(runner, **kw):
    old = runner.transforms
    runner.transforms = dataclasses.replace(old, **kw)
    return old


def test_cpu_caps_decode_runs(joe_voice):
    assert joe_voice.runner.decode_cap == Transforms().cpu_decode_frames
    with pytest.raises(ValueError):
        Transforms(cpu_decode_frames=10).validate()


@pytest.mark.parametrize("cap", [128, 200])
def test_windowed_decode_equals_whole(joe_voice, cap):
    runner = joe_voice.runner
    ids = [s.ids for s in joe_voice.frontend.sentences(LONG)]
    batch = ids + [ids[0][:20]]  # the long one alone in its run, then a short one
    old = _with_config(runner, cpu_decode_frames=None)
    try:
        whole = joe_voice.synthesize_ids(batch, voxserve.DETERMINISTIC)
        _with_config(runner, cpu_decode_frames=cap)
        windowed = joe_voice.synthesize_ids(batch, voxserve.DETERMINISTIC)
    finally:
        runner.transforms = old
    assert len(whole[0]) > 3 * cap * runner.dims.hop_length  # several windows
    for a, ref in zip(windowed, whole):
        assert len(a) == len(ref)
        assert np.abs(a - ref).max() <= BATCH_ATOL


def test_windowed_decode_multispeaker(tiny_voice_path):
    """Per-frame speaker conditioning is windowed with the latents."""
    voice = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    ids = [1, 0] + [int(x) for x in np.random.default_rng(2).integers(3, 40, 120)] + [2]
    old = _with_config(voice.runner, cpu_decode_frames=None)
    decoded = []
    decode = voice.runner.stages.decode
    voice.runner.stages.decode = lambda z, g, m: decoded.append(z.shape[-1]) or decode(z, g, m)
    try:
        whole = voice.synthesize_ids([ids], voxserve.SynthesisOptions(speaker=1, seed=5))[0]
        _with_config(voice.runner, cpu_decode_frames=64)
        windowed = voice.synthesize_ids([ids], voxserve.SynthesisOptions(speaker=1, seed=5))[0]
    finally:
        voice.runner.transforms = old
        del voice.runner.stages.decode
    assert len(whole) > 2 * 64 * voice.runner.dims.hop_length
    assert len(decoded) >= 3 and all(w % DECODE_ALIGN == 0 for w in decoded), decoded  # few kernel shapes
    assert np.abs(windowed - whole).max() <= BATCH_ATOL
