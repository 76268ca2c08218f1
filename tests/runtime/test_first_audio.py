"""Cutting sentences into pieces: a long early sentence (a stream's first) is synthesised as a
head (delivered at once) and a rest; with max_cost any long sentence is cut into bounded
pieces whose rests run in later batches. The pieces join exactly: they equal the sentence
synthesised whole."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from audio_compare import BATCH_ATOL

import voxserve
from voxserve.families.piper import PiperOptions
from voxserve.families.piper.buckets import DECODE_ALIGN
from voxserve.families.piper.runner import VitsRunner, synth_context_frames

SEEDED = PiperOptions(seed=11)  # noise on: the split must not change it (VitsVoice._item takes PiperOptions)


def _ids(rng, n):
    return [1, 0] + [int(x) for x in rng.integers(3, 40, n)] + [2]


@pytest.fixture
def tiny_split(tiny_voice_path, monkeypatch):
    """The tiny voice with a small split threshold, so that its sentences are split."""
    v = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    v.runner.transforms = dataclasses.replace(v.runner.transforms, first_audio_frames=8, first_audio_split_frames=64)
    return v


def _run_early(voice, items, early):
    heads: dict[int, np.ndarray] = {}

    def on_early(k, samples):
        assert k not in heads, "a head was delivered twice"
        heads[k] = samples

    rest = voice.runner.run(items, early, on_early)
    return heads, rest


def test_head_plus_rest_equals_whole(tiny_split):
    v = tiny_split
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
        assert np.abs(got - a).max() <= BATCH_ATOL, k


@pytest.mark.parametrize("attr", ["context", "decode_context"])
def test_without_context_the_seam_differs(tiny_split, monkeypatch, attr):
    """The check above can fail: with 2 frames of context instead of the receptive field, the
    parts no longer join exactly; both for the flow's context (`context`) and for the part of
    it that a cut piece decodes (`decode_context`, the decoder's receptive field)."""
    v = tiny_split
    rng = np.random.default_rng(4)
    items = [v._item(_ids(rng, 150), SEEDED.validate(), 0)]
    whole = v.runner.run(items)[0]
    monkeypatch.setattr(VitsRunner, attr, property(lambda self: 2))
    heads, rest = _run_early(v, items, early=[0])
    assert np.abs(np.concatenate([heads[0], rest[0]]) - whole).max() > 1e-3


def test_cut_pieces_decode_only_the_decoder_context(tiny_split, monkeypatch):
    """A cut costs the flow two full contexts but the decoder (most of the work) only two
    decoder contexts: the decoded frames are the sentence plus 2 x decode_context."""
    v = tiny_split
    runner = v.runner
    runner.buckets = False  # exact frame counts (no masked bucket tails)
    # a head longer than the context, so that the rest has a full context on its left
    runner.transforms = dataclasses.replace(runner.transforms, first_audio_frames=runner.context + 4)
    decoded, flowed = [], []
    flow, decode = runner.stages.flow, runner.stages.decode
    monkeypatch.setattr(runner.stages, "flow", lambda x: flowed.append(x.m.shape[-1]) or flow(x))
    monkeypatch.setattr(runner.stages, "decode", lambda z, g, m: decoded.append(z.shape[-1]) or decode(z, g, m))
    rng = np.random.default_rng(9)
    items = [v._item(_ids(rng, 250), SEEDED.validate(), 0)]
    frames = len(runner.run(items)[0]) // runner.dims.hop_length
    assert not decoded  # an uncut item runs flow + decoder fused
    heads, rest = _run_early(v, items, early=[0])
    assert heads and runner.decode_context < runner.context
    assert len(decoded) == 2 and sum(decoded) == frames + 2 * runner.decode_context
    assert sum(flowed) == frames + 2 * runner.context


def test_decoder_only_calls_take_few_widths(tiny_split, monkeypatch):
    """Cut pieces are decoded at widths rounded to DECODE_ALIGN frames (masked tails, exact:
    see test_head_plus_rest_equals_whole), whatever lengths the batches happen to pack."""
    v = tiny_split
    runner = v.runner
    assert runner.buckets  # CPU default
    decoded = []
    decode = runner.stages.decode
    monkeypatch.setattr(runner.stages, "decode", lambda z, g, m: decoded.append(z.shape[-1]) or decode(z, g, m))
    rng = np.random.default_rng(5)
    for n in (70, 95, 130, 171, 240):
        _run_early(v, [v._item(_ids(rng, n), SEEDED.validate(), 0)], early=[0])
    assert len(decoded) >= 5 and len(set(decoded)) < len(decoded)
    assert all(w % DECODE_ALIGN == 0 for w in decoded), decoded


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
    v.runner.transforms = dataclasses.replace(v.runner.transforms, first_audio_frames=0)
    heads, rest = _run_early(v, items, early=[0])
    assert not heads and len(rest[0]) == len(whole)
    assert v.runner.run_pieces(items, [0], max_cost=None)[0][1] is None


def test_padded_layout_never_cuts(tiny_split):
    v = tiny_split
    v.runner.layout = "padded"
    rng = np.random.default_rng(7)
    items = [v._item(_ids(rng, 150), SEEDED.validate(), 0)]
    whole = v.runner.run(items)[0]
    heads, rest = _run_early(v, items, early=[0])
    assert not heads and np.abs(rest[0] - whole).max() <= BATCH_ATOL
    assert v.runner.run_pieces(items, [0], max_cost=8)[0][1] is None


def test_max_cost_pieces_and_their_rests_join_exactly(tiny_split):
    """Every item cut into bounded pieces; each round runs the rests (continuations) together
    with a fresh item in one packed batch, until nothing is left."""
    v = tiny_split
    runner = v.runner
    rng = np.random.default_rng(8)
    opts = SEEDED.validate()
    items = [v._item(_ids(rng, n), opts, i) for i, n in enumerate((700, 450, 12))]
    fresh = [v._item(_ids(rng, 30), opts, 10 + i) for i in range(6)]
    whole = runner.run(items + fresh)
    max_cost = 60  # ids: pieces of 4 contexts (the least a piece may be)
    parts: dict[int, list[np.ndarray]] = {i: [] for i in range(len(items))}
    pending = list(enumerate(items))
    rounds = 0
    fresh_out = []
    while pending:
        batch = [it for _, it in pending] + fresh[rounds : rounds + 1]
        out = runner.run_pieces(batch, max_cost=max_cost)
        nxt = []
        for (i, _), (audio, rest) in zip(pending, out):
            parts[i].append(audio)
            if rest is not None:
                assert rest.frames > 0 and rest.cost >= 1
                nxt.append((i, rest))
        if rounds < len(fresh):
            fresh_out.append(out[-1][0])
        pending, rounds = nxt, rounds + 1
    assert rounds >= 3  # the long items were cut more than once
    hop = runner.dims.hop_length
    assert max(len(p) for ps in parts.values() for p in ps[:-1]) // hop <= runner.piece_frames(10**6, 1.0, max_cost)
    for i in range(len(items)):
        got = np.concatenate(parts[i])
        assert len(got) == len(whole[i]) and np.abs(got - whole[i]).max() <= BATCH_ATOL, i
    assert len(parts[2]) == 1  # the short item is not cut
    for a, b in zip(fresh_out, whole[len(items):]):
        assert np.abs(a - b).max() <= BATCH_ATOL


def test_out_of_memory_splits_a_batch_with_early_items(tiny_split, monkeypatch):
    v = tiny_split
    runner = v.runner
    rng = np.random.default_rng(6)
    items = [v._item(_ids(rng, n), SEEDED.validate(), i) for i, n in enumerate((40, 20, 150))]
    whole = runner.run(items)
    real = runner._submit

    def fake(batch, early, max_cost, spare=False):
        if len(batch) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(batch, early, max_cost, spare)

    monkeypatch.setattr(runner, "_submit", fake)
    heads, rest = _run_early(v, items, early=[2])
    assert list(heads) == [2]
    got = rest[:2] + [np.concatenate([heads[2], rest[2]])]
    for a, b in zip(got, whole):
        assert len(a) == len(b) and np.abs(a - b).max() <= BATCH_ATOL


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
    assert np.abs(got - whole).max() <= BATCH_ATOL


def test_with_the_device_spare_a_short_early_sentence_is_cut_too_and_joins_exactly(tiny_voice_path):
    """Below first_audio_split_frames an early sentence is cut only when the engine says the
    device is spare (nothing else runs or waits): its head comes first, head + rest = whole."""
    v = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    rng = np.random.default_rng(9)
    items = [v._item(_ids(rng, 200), SEEDED.validate(), 0)]
    whole = v.runner.run(items)[0]
    frames = len(whole) // v.runner.dims.hop_length
    assert frames < v.runner.transforms.first_audio_split_frames
    assert v.runner.head_frames(frames) == 0 and v.runner.head_frames(frames, spare=True) > 0
    assert v.runner.run_pieces(items, [0])[0][1] is None  # a busy device: not cut
    head, rest = v.runner.run_pieces(items, [0], spare=True)[0]
    assert rest is not None and len(head) == v.runner.head_frames(frames, spare=True) * v.runner.dims.hop_length
    (tail, more), = v.runner.run_pieces([rest])
    assert more is None
    np.testing.assert_allclose(np.concatenate([head, tail]), whole, atol=BATCH_ATOL)
