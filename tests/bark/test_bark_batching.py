"""Batched Bark generation: per sentence, the same tokens as alone; outputs trimmed per item."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bark_fixtures import TEXTS

import voxserve
from voxserve import SynthesisOptions
from voxserve.families.bark import BarkOptions

HOP = 320  # the tiny EnCodec's samples per frame (24 kHz, 75 Hz)


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in ("semantic", "coarse", "fine"))


def test_greedy_batch_equals_alone_and_lengths_differ(bark_voice):
    items = bark_voice.items(TEXTS, voxserve.DETERMINISTIC)
    batch = bark_voice.runner.generate_tokens(items)
    alone = [bark_voice.runner.generate_tokens([it])[0] for it in items]
    for text, b, a in zip(TEXTS, batch, alone):
        assert _same(b, a), text
    lengths = [r["semantic"].numel() for r in batch]
    # the fixture's weights make greedy runs stop at different points: trimming is exercised
    assert len(set(lengths)) >= 2, lengths
    assert max(r["fine"].shape[-1] for r in batch) > 32, "no sentence ran more than one fine window"
    for r in batch:
        assert r["coarse"].numel() == 2 * r["fine"].shape[-1]  # two coarse codebooks, interleaved
        assert r["fine"].shape[0] == 8
        assert not (r["semantic"] == 40).any()  # no EOS / padding left inside a trimmed row


def test_sampled_batch_equals_alone_with_seeds(bark_voice):
    # every row samples from its own generator: its tokens do not depend on its batch mates
    opts = [BarkOptions(seed=10 + k, temperature=0.9) for k in range(len(TEXTS))]
    items = [bark_voice.items([t], o)[0] for t, o in zip(TEXTS, opts)]
    batch = bark_voice.runner.generate_tokens(items)
    alone = [bark_voice.runner.generate_tokens([it])[0] for it in items]
    for text, b, a in zip(TEXTS, batch, alone):
        assert _same(b, a), text
    # reversed order, other batch mates: still the same per sentence
    rev = bark_voice.runner.generate_tokens(items[::-1])[::-1]
    assert all(_same(b, r) for b, r in zip(batch, rev))
    assert len({r["semantic"].numel() for r in batch}) >= 2


def test_sampling_is_live_and_seeded(bark_voice):
    def one(seed, t=0.9):
        opts = BarkOptions(seed=seed, temperature=t)
        return bark_voice.runner.generate_tokens(bark_voice.items(["i like pizza but also reading."], opts))[0]

    a, b, c = one(1), one(1), one(2)
    assert _same(a, b)
    assert not torch.equal(a["semantic"], c["semantic"])  # the semantic stage samples
    assert not torch.equal(a["coarse"][: min(a["coarse"].numel(), c["coarse"].numel())],
                           c["coarse"][: min(a["coarse"].numel(), c["coarse"].numel())])
    greedy = one(1, 0.0)
    assert _same(greedy, one(2, 0.0))  # temperature 0: the seed does not matter


def test_bark_never_touches_the_global_rng(bark_voice):
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    bark_voice.runner.generate_tokens(bark_voice.items(TEXTS[:2], BarkOptions(seed=3, temperature=0.8)))
    assert torch.equal(torch.rand(4), expected)


def test_audio_batched_equals_alone_and_is_trimmed(bark_voice):
    units = [u for t in TEXTS for u in bark_voice.units(t, voxserve.DETERMINISTIC)]
    assert len(units) == len(TEXTS)
    assert bark_voice.runner.hop_length == HOP
    batch = bark_voice.run_units(units)
    tokens = bark_voice.runner.generate_tokens([u.payload for u in units])
    for u, a, r in zip(units, batch, tokens):
        assert a.dtype == np.float32 and a.ndim == 1
        assert len(a) == r["fine"].shape[-1] * HOP, u.text
        alone = bark_voice.run_units([u])[0]
        np.testing.assert_array_equal(a, alone)
    assert len({len(a) for a in batch}) >= 2


def test_speakers_in_one_batch(bark_voice):
    # transformers takes one history prompt per batch: units of several speakers are grouped
    speakers = ["v2/en_speaker_0", "announcer", None, "v2/en_speaker_1", "v2/en_speaker_0", None]
    units = [next(iter(bark_voice.units(t, voxserve.DETERMINISTIC.merged(SynthesisOptions(speaker=s)))))
             for t, s in zip(TEXTS, speakers)]
    mixed = bark_voice.run_units(units)
    for u, a in zip(units, mixed):
        np.testing.assert_array_equal(a, bark_voice.run_units([u])[0])
    # the history prompt changes what is said
    plain = bark_voice.runner.generate_tokens(bark_voice.items([TEXTS[1]], voxserve.DETERMINISTIC))[0]
    spk = bark_voice.runner.generate_tokens(
        bark_voice.items([TEXTS[1]], voxserve.DETERMINISTIC.merged(SynthesisOptions(speaker="announcer"))))[0]
    assert not _same(plain, spk)


def test_synthesize_and_stream(bark_voice):
    text = "Hello world. The cat is on the mat. A dog."
    audio = bark_voice.synthesize(text, voxserve.DETERMINISTIC)
    assert audio.sample_rate == 24000
    chunks = list(bark_voice.stream(text, voxserve.DETERMINISTIC))
    assert [c.index for c in chunks] == [0, 1, 2]
    assert [c.is_last for c in chunks] == [False, False, True]
    assert all(c.sample_rate == 24000 for c in chunks)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), audio.samples)
    gap = bark_voice.synthesize(text, voxserve.DETERMINISTIC.merged(SynthesisOptions(sentence_silence=0.5)))
    assert len(gap.samples) == len(audio.samples) + 2 * 12000


@pytest.mark.parametrize("n", [1, 3])
def test_synthesize_batch_shares_batches(bark_voice, n):
    texts = ["Hello world. A dog.", "I like pizza.", "Seven eight. Short."][:n]
    out = bark_voice.synthesize_batch(texts, voxserve.DETERMINISTIC)
    for t, a in zip(texts, out):
        np.testing.assert_array_equal(a.samples, bark_voice.synthesize(t, voxserve.DETERMINISTIC).samples)
