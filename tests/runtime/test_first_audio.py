"""First audio of streams: a long early sentence is synthesised as a head (delivered at once)
and a rest, and head + rest equal the sentence synthesised whole."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import voxserve
from voxserve.runtime.vits_runner import VitsRunner, synth_context_frames

SEEDED = voxserve.SynthesisOptions(seed=11)  # noise on: the split must not change it


def _ids(rng, n):
    return [1, 0] + [int(x) for x in rng.integers(3, 40, n)] + [2]


@pytest.fixture
def tiny_split(tiny_voice_path, monkeypatch):
    """The tiny voice with a small split threshold, so that its sentences are split."""
    v = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    v.runner.config = dataclasses.replace(v.runner.config, first_audio_frames=8, first_audio_split_frames=64)
    return v


def _run_early(voice, items, early):
    heads: dict[int, np.ndarray] = {}

    def on_early(k, samples):
        assert k not in heads, "a head was delivered twice"
        heads[k] = samples

    rest = voice.runner.run(items, early, on_early)
    return heads, rest


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_head_plus_rest_equals_whole(tiny_split, layout):
    v = tiny_split
    v.runner.layout = layout
    rng = np.random.default_rng(3)
    items = [v._item(_ids(rng, n), SEEDED.validate(), i) for i, n in enumerate((120, 9, 150, 60))]
    whole = v.runner.run(items)
    heads, rest = _run_early(v, items, early=[0, 1, 2])
    hop = v.runner.dims.hop_length
    frames = [len(a) // hop for a in whole]
    split = [k for k in range(len(items)) if v.runner.head_frames(frames[k])]
    assert 0 in split and 2 in split and 1 not in split  # item 1 is too short to split
    assert sorted(heads) == split
    for k, a in enumerate(whole):
        if k in heads:
            assert len(heads[k]) == v.runner.head_frames(frames[k]) * hop
            got = np.concatenate([heads[k], rest[k]])
        else:
            got = rest[k]
        assert len(got) == len(a)
        assert np.abs(got - a).max() <= 1e-4, k


def test_without_context_the_seam_differs(tiny_split, monkeypatch):
    """The check above can fail: with 2 frames of context instead of the receptive field, the
    parts no longer join exactly."""
    v = tiny_split
    rng = np.random.default_rng(4)
    items = [v._item(_ids(rng, 150), SEEDED.validate(), 0)]
    whole = v.runner.run(items)[0]
    monkeypatch.setattr(VitsRunner, "context", property(lambda self: 2))
    heads, rest = _run_early(v, items, early=[0])
    assert np.abs(np.concatenate([heads[0], rest[0]]) - whole).max() > 1e-3


def test_context_covers_flow_and_decoder(tiny_split):
    d = tiny_split.runner.dims
    flow = d.flow_n_flows * d.flow_n_layers * (d.flow_kernel_size - 1) // 2  # dilation rate 1
    assert d.flow_dilation_rate == 1
    assert synth_context_frames(d) > flow


def test_short_or_plain_batches_are_not_split(tiny_split):
    v = tiny_split
    rng = np.random.default_rng(5)
    items = [v._item(_ids(rng, 150), SEEDED.validate(), 0)]
    whole = v.runner.run(items)[0]
    assert len(v.runner.run(items, [0], None)[0]) == len(whole)  # no callback: nothing early
    v.runner.config = dataclasses.replace(v.runner.config, first_audio_frames=0)
    heads, rest = _run_early(v, items, early=[0])
    assert not heads and len(rest[0]) == len(whole)


def test_out_of_memory_after_the_head_loses_and_repeats_nothing(tiny_split, monkeypatch):
    v = tiny_split
    runner = v.runner
    rng = np.random.default_rng(6)
    items = [v._item(_ids(rng, n), SEEDED.validate(), i) for i, n in enumerate((150, 20, 40))]
    whole = runner.run(items)
    real = runner.submit
    calls = []

    def fake(batch, early=(), on_early=None):
        calls.append(len(batch))
        if len(calls) == 1:  # the head goes out, then the device runs out of memory
            real(batch, early, on_early)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(batch, early, on_early)

    monkeypatch.setattr(runner, "submit", fake)
    heads, rest = _run_early(v, items, early=[0])
    assert list(heads) == [0] and len(calls) > 1
    got = [np.concatenate([heads[0], rest[0]])] + rest[1:]
    for a, b in zip(got, whole):
        assert len(a) == len(b) and np.abs(a - b).max() <= 1e-4


def test_default_voice_long_sentence_split_is_exact(joe_voice, corpus):
    """The real voice, the corpus's longest first sentence, default thresholds."""
    text = next(d["text"] for d in corpus if d["category"] == "long")
    unit = next(joe_voice.units(text, SEEDED))
    whole = joe_voice.run_units([unit])[0]
    heads: dict[int, np.ndarray] = {}
    rest = joe_voice.run_units([unit], early=[0], on_early=lambda k, a: heads.__setitem__(k, a))[0]
    assert 0 in heads and len(heads[0]) < len(whole) // 8  # a head, not the sentence
    got = np.concatenate([heads[0], rest])
    assert len(got) == len(whole)
    assert np.abs(got - whole).max() <= 1e-4
