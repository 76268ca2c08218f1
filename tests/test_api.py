"""The public API: load_voice, synthesize, stream, synthesize_batch, options and errors."""

from __future__ import annotations

import numpy as np
import pytest
from audio_compare import BATCH_ATOL

import voxserve
from voxserve import (
    Audio,
    AudioChunk,
    EmptyTextError,
    InvalidOptionError,
    SynthesisOptions,
    UnknownSpeakerError,
    UnknownVoiceError,
    UnpronounceableTextError,
)
from voxserve.families.piper import PiperOptions


def test_synthesize_returns_typed_audio(joe_voice):
    a = joe_voice.synthesize("Hello world.")
    assert isinstance(a, Audio) and a.sample_rate == 22050
    assert a.samples.dtype == np.float32 and a.samples.ndim == 1
    assert 0.3 < a.duration < 3.0
    assert np.abs(a.samples).max() <= 1.0 and np.abs(a.samples).max() > 0.05  # speech, not silence


def test_stream_yields_one_chunk_per_sentence_in_order(joe_voice):
    text = "One. Two three. Four five six. Seven eight. Nine. Ten eleven twelve thirteen."
    chunks = list(joe_voice.stream(text, voxserve.DETERMINISTIC))
    assert [c.index for c in chunks] == list(range(6))
    assert all(isinstance(c, AudioChunk) for c in chunks)
    assert [c.is_last for c in chunks] == [False] * 5 + [True]
    assert chunks[1].text == "Two three."
    whole = joe_voice.synthesize(text, voxserve.DETERMINISTIC)
    assert np.abs(np.concatenate([c.samples for c in chunks]) - whole.samples).max() <= BATCH_ATOL


def test_synthesize_batch_matches_single(joe_voice):
    texts = ["Good morning.", "The train leaves at nine. Please hurry!", "Thanks."]
    batch = joe_voice.synthesize_batch(texts, voxserve.DETERMINISTIC)
    for t, a in zip(texts, batch):
        ref = joe_voice.synthesize(t, voxserve.DETERMINISTIC)
        assert len(a.samples) == len(ref.samples)
        assert np.abs(a.samples - ref.samples).max() <= BATCH_ATOL


def test_sentence_silence_and_speed(joe_voice):
    base = joe_voice.synthesize("One. Two.", voxserve.DETERMINISTIC)
    gap = joe_voice.synthesize("One. Two.", voxserve.DETERMINISTIC.merged(SynthesisOptions(sentence_silence=0.5)))
    assert len(gap.samples) - len(base.samples) == round(0.5 * 22050)
    fast = joe_voice.synthesize("One. Two.", voxserve.DETERMINISTIC.merged(SynthesisOptions(speed=2.0)))
    assert len(fast.samples) < 0.7 * len(base.samples)


def test_seed_reproducible_and_noise_varies(joe_voice):
    a = joe_voice.synthesize("Reproducible speech.", SynthesisOptions(seed=5))
    b = joe_voice.synthesize("Reproducible speech.", SynthesisOptions(seed=5))
    c = joe_voice.synthesize("Reproducible speech.", SynthesisOptions(seed=6))
    assert np.array_equal(a.samples, b.samples)
    assert len(a.samples) != len(c.samples) or not np.array_equal(a.samples, c.samples)


@pytest.mark.parametrize("opts,option", [
    (SynthesisOptions(speed=0), "speed"),
    (SynthesisOptions(speed=-1.0), "speed"),
    (PiperOptions(noise_scale=-0.1), "noise_scale"),
    (PiperOptions(noise_w=float("nan")), "noise_w"),
    (SynthesisOptions(sentence_silence=-1), "sentence_silence"),
])
def test_invalid_options_name_the_option(joe_voice, opts, option):
    with pytest.raises(InvalidOptionError) as e:
        joe_voice.synthesize("Hi.", opts)
    assert e.value.option == option and option in str(e.value)
    assert isinstance(e.value, ValueError)


def test_bad_text(joe_voice):
    with pytest.raises(EmptyTextError):
        joe_voice.synthesize("")
    with pytest.raises(ValueError):
        joe_voice.synthesize("   \n ")
    with pytest.raises(UnpronounceableTextError):
        joe_voice.synthesize("🎉🎉")
    with pytest.raises(UnpronounceableTextError):
        list(joe_voice.stream("🎉🎉"))
    # a stray emoji among words is simply dropped
    assert joe_voice.synthesize("I ❤️ this! 🎉🎉").duration > 0.3


def test_unknown_voice_lists_voices():
    with pytest.raises(UnknownVoiceError, match="en_US-joe-medium"):
        voxserve.load_voice("nope", device="cpu")


def test_speakers(tiny_voice_path, joe_voice):
    v = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    a = v.synthesize("hello", SynthesisOptions(speaker="spk2", seed=1))
    b = v.synthesize("hello", SynthesisOptions(speaker=2, seed=1))
    assert np.array_equal(a.samples, b.samples)
    with pytest.raises(UnknownSpeakerError, match="spk0, spk1, spk2"):
        v.synthesize("hello", SynthesisOptions(speaker="nobody"))
    with pytest.raises(UnknownSpeakerError):
        v.synthesize("hello", SynthesisOptions(speaker=3))
    with pytest.raises(UnknownSpeakerError, match="single-speaker"):
        joe_voice.synthesize("hello", SynthesisOptions(speaker=1))


def test_huge_text_streams_in_bounded_batches(joe_voice, monkeypatch):
    """A long input runs batch by batch (the engine's scheduler: voice.py runs the library on
    an engine); no batch exceeds the scheduler's bounds."""
    from voxserve.engine import SchedulerConfig

    bounds = SchedulerConfig()
    seen, costs = [], []
    orig_pieces = joe_voice.run_pieces

    def spy_pieces(units, *a, **kw):
        seen.append(len(units))
        costs.append(sum(u.cost for u in units))
        return orig_pieces(units, *a, **kw)

    monkeypatch.setattr(joe_voice, "run_pieces", spy_pieces)
    text = " ".join(f"Sentence number {i}." for i in range(40))
    chunks = list(joe_voice.stream(text, voxserve.DETERMINISTIC))
    # one whole chunk a sentence (the first may come as a head first: a lone stream), one run each
    assert sum(not c.partial for c in chunks) == 40 and sum(seen) == len(chunks)
    assert max(seen) <= bounds.max_batch_size and max(costs) <= bounds.max_batch_phonemes


def test_stream_yields_a_long_first_sentence_head_first(joe_voice, corpus):
    """Voice.stream: the corpus's longest first sentence comes as a head (partial) and its rest
    (in pieces as the engine's decoder makes them, as the server streams it); together they
    equal the sentence synthesised whole."""
    text = next(d["text"] for d in corpus if d["category"] == "long")
    opts = SynthesisOptions(seed=3)
    chunks = []
    for c in joe_voice.stream(text, opts):
        chunks.append(c)
        if not c.partial:
            break
    assert len(chunks) >= 2 and all(c.partial for c in chunks[:-1]) and not chunks[-1].partial
    assert all(c.text == "" for c in chunks[1:])  # the sentence's text rides on its head
    whole = joe_voice.run_units([next(joe_voice.units(text, opts))])[0]
    got = np.concatenate([c.samples for c in chunks])
    assert len(got) == len(whole) and np.abs(got - whole).max() <= BATCH_ATOL


def test_audio_encoders_roundtrip(tmp_path):
    import soundfile as sf

    sr = 22050
    x = (0.3 * np.sin(np.arange(sr) / sr * 2 * np.pi * 220)).astype(np.float32)
    a = Audio(x, sr)
    for fmt in ("wav", "flac", "ogg", "mp3"):
        p = tmp_path / f"a.{fmt}"
        a.save(p)
        y, r = sf.read(p, dtype="float32")
        assert r == sr and abs(len(y) - len(x)) < 0.1 * sr
    assert len(a.encode("pcm")) == 2 * len(x)
