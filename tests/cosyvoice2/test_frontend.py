"""CosyVoice 2 prompt front end: the DSP against the reference values of make_frontend.py, the
encoder on the tiny ONNX stand-ins against the reference's zero-shot path, saved voices and
spk2info.pt."""

from __future__ import annotations

import json
from pathlib import Path

import cv2_onnx_fixtures as onnx_fx
import numpy as np
import pytest
import torch
from fixtures.cosyvoice2.weights import make_state_dict, tensors_sha256

from voxserve.families.cosyvoice2 import features as F
from voxserve.families.cosyvoice2.frontend import (
    PromptEncoder,
    PromptFeatures,
    load_prompt,
    load_spk2info,
    save_prompt,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cosyvoice2"


@pytest.fixture(scope="module")
def ref():
    with np.load(FIX / "frontend.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads((FIX / "frontend.json").read_text())


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, ref):
    folder = tmp_path_factory.mktemp("cv2_onnx")
    tok, cam, record = onnx_fx.write_standins(folder)
    assert record == ref[1]["onnx_standins"], "stand-in weights differ from the ones the reference ran"
    return PromptEncoder(tok, cam, ["CPUExecutionProvider"])


def _close(ours, theirs, tol=1e-4):
    assert ours.shape == theirs.shape
    err = np.abs(ours.astype(np.float64) - theirs) / np.maximum(1.0, np.abs(theirs))
    assert err.max() <= tol, f"max relative error {err.max():.3g}"


def test_standin_weights_rebuild_from_recorded_shapes(ref):
    rec = ref[1]["onnx_standins"]
    for part in ("speech_tokenizer", "campplus"):
        w = make_state_dict(rec["seed"], rec[part]["shapes"])
        assert tensors_sha256(w) == rec[part]["tensors_sha256"]


def test_resampler_matches_torchaudio(ref):
    a, _ = ref
    w24 = F.resample(a["wave_16k"], 16000, 24000)
    assert w24.shape == (28800,)
    _close(w24[:2400], a["resample_16k_24k_head"], 1e-5)
    _close(w24[-2400:], a["resample_16k_24k_tail"], 1e-5)
    _close(F.resample(a["wave_44k"], 44100, 16000), a["resample_44k_16k"], 1e-5)
    _close(F.resample(a["wave_44k"], 44100, 24000), a["resample_44k_24k"], 1e-5)


def test_resampler_keeps_a_passband_tone():
    sr = 44100
    t = np.arange(sr // 2) / sr
    out = F.resample(np.sin(2 * np.pi * 1000 * t).astype(np.float32), sr, 16000)
    expect = np.sin(2 * np.pi * 1000 * np.arange(out.shape[0]) / 16000)
    assert np.abs(out - expect)[200:-200].max() < 2e-3  # edges see the zero padding


def test_whisper_log_mel_matches(ref):
    a, _ = ref
    _close(F.whisper_log_mel(a["wave_16k"], 128), a["whisper_log_mel"])


def test_kaldi_fbank_matches(ref):
    a, _ = ref
    ours, theirs = F.kaldi_fbank(a["wave_16k"], 16000, 80), a["kaldi_fbank"]
    assert ours.shape == theirs.shape == (118, 80)
    err = np.abs(ours.astype(np.float64) - theirs) / np.maximum(1.0, np.abs(theirs))
    # bins below e^-10 of energy carry the reference's float32 rounding (we compute in float64)
    assert err[theirs > -10].max() <= 1e-4
    assert err.max() <= 2e-4


def test_matcha_mel_matches(ref):
    a, _ = ref
    _close(F.matcha_mel(F.resample(a["wave_16k"], 16000, 24000)), a["matcha_mel"])


def test_encoder_matches_reference_zero_shot(encoder, ref):
    a, _ = ref
    np.testing.assert_array_equal(encoder.speech_tokens(a["wave_16k"]), a["raw_speech_tokens"])
    p = encoder.encode(a["wave_16k"], 16000)
    np.testing.assert_array_equal(p.speech_tokens, a["speech_token"])
    assert p.speech_tokens.dtype == np.int64 and p.speech_feat.dtype == np.float32
    _close(p.speech_feat, a["speech_feat"])
    _close(p.embedding, a["embedding"])


def test_encoder_trims_to_two_frames_per_token(encoder):
    rs = np.random.RandomState(3)
    wave = (0.3 * rs.standard_normal(int(16000 * 1.23))).astype(np.float32)
    # 1.23 s: 123 tokenizer frames -> 31 tokens; 24 kHz mel has 61 frames -> 30 tokens kept
    assert encoder.speech_tokens(wave).shape == (31,)
    p = encoder.encode(wave, 16000)
    assert p.speech_tokens.shape == (30,) and p.speech_feat.shape == (60, 80) and p.embedding.shape == (192,)
    p48 = encoder.encode(F.resample(wave, 16000, 48000), 48000)
    assert p48.speech_feat.shape[0] == 2 * p48.speech_tokens.shape[0]
    stereo = encoder.encode(np.stack([wave, wave]), 16000)
    np.testing.assert_array_equal(stereo.speech_tokens, p.speech_tokens)


@pytest.mark.parametrize(
    "wave, sr, message",
    [
        (np.zeros(4000, np.float32), 16000, "at least 0.5 s"),
        (np.zeros(16000 * 31, np.float32), 16000, "at most 30 s"),
        (np.zeros(16000, np.int16), 16000, "floats"),
        (np.zeros((3, 2, 16000), np.float32), 16000, "mono"),
        (np.zeros(8000, np.float32), 8000, ">= 16000 Hz"),
        (np.full(16000, np.nan, np.float32), 16000, "non-finite"),
    ],
)
def test_encoder_rejects_bad_waves(encoder, wave, sr, message):
    with pytest.raises(ValueError, match=message):
        encoder.encode(wave, sr)


def test_missing_onnx_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="speech_tokenizer_v2.onnx"):
        PromptEncoder(tmp_path / "speech_tokenizer_v2.onnx", tmp_path / "campplus.onnx")


def _features(n=7, seed=0):
    rs = np.random.RandomState(seed)
    return PromptFeatures(
        speech_tokens=rs.randint(0, 6561, n).astype(np.int64),
        speech_feat=rs.standard_normal((2 * n, 80)).astype(np.float32),
        embedding=rs.standard_normal(192).astype(np.float32),
        prompt_text="Hello there.",
        prompt_text_tokens=np.array([9707, 1052, 13], dtype=np.int64),
    )


def test_saved_voice_round_trips(tmp_path):
    f = _features()
    path = tmp_path / "voice.npz"
    save_prompt(path, f)
    g = load_prompt(path)
    for name in ("speech_tokens", "speech_feat", "embedding", "prompt_text_tokens"):
        a, b = getattr(f, name), getattr(g, name)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert (g.prompt_text, g.token_sample_rate, g.feat_sample_rate) == ("Hello there.", 16000, 24000)


def test_bad_voice_files_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npz"):
        load_prompt(tmp_path / "nope.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="junk.npz"):
        load_prompt(junk)
    good = tmp_path / "good.npz"
    save_prompt(good, _features())
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[:300])
    with pytest.raises(ValueError, match="cut.npz"):
        load_prompt(cut)
    partial = tmp_path / "partial.npz"
    with open(partial, "wb") as fh:
        np.savez(fh, speech_tokens=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="partial.npz.*'meta'"):
        load_prompt(partial)
    bad = _features()
    bad.speech_feat = bad.speech_feat[:-1]
    with pytest.raises(ValueError, match="speech_feat has 13 frames"):
        save_prompt(tmp_path / "bad.npz", bad)


def test_spk2info_both_layouts(tmp_path):
    f = _features(5)
    data = {
        "sft_speaker": {"embedding": torch.from_numpy(f.embedding)[None]},
        "zero_shot": {  # as upstream's add_zero_shot_spk stores the model input
            "prompt_text": torch.tensor([[9707, 1052, 13]], dtype=torch.int32),
            "llm_prompt_speech_token": torch.from_numpy(f.speech_tokens).int()[None],
            "flow_prompt_speech_token": torch.from_numpy(f.speech_tokens).int()[None],
            "prompt_text_len": torch.tensor([3], dtype=torch.int32),
            "llm_prompt_speech_token_len": torch.tensor([5], dtype=torch.int32),
            "flow_prompt_speech_token_len": torch.tensor([5], dtype=torch.int32),
            "prompt_speech_feat_len": torch.tensor([10], dtype=torch.int32),
            "prompt_speech_feat": torch.from_numpy(f.speech_feat)[None],
            "llm_embedding": torch.from_numpy(f.embedding)[None],
            "flow_embedding": torch.from_numpy(f.embedding)[None],
        },
    }
    path = tmp_path / "spk2info.pt"
    torch.save(data, path)
    spk = load_spk2info(path)
    assert set(spk) == {"sft_speaker", "zero_shot"}
    assert spk["sft_speaker"].speech_tokens.shape == (0,) and spk["sft_speaker"].speech_feat.shape == (0, 80)
    z = spk["zero_shot"]
    np.testing.assert_array_equal(z.speech_tokens, f.speech_tokens)
    np.testing.assert_array_equal(z.speech_feat, f.speech_feat)
    np.testing.assert_array_equal(z.embedding, f.embedding)
    np.testing.assert_array_equal(z.prompt_text_tokens, [9707, 1052, 13])


def test_spk2info_errors_name_speaker_and_key(tmp_path):
    path = tmp_path / "spk2info.pt"
    torch.save({"alice": {"embedding": torch.zeros(1, 80)}}, path)
    with pytest.raises(ValueError, match="'alice'.*'embedding'.*\\[1, 80\\]"):
        load_spk2info(path)
    torch.save({"bob": {"speech_token": torch.zeros(1, 3, dtype=torch.int64)}}, path)
    with pytest.raises(ValueError, match="'bob': no speaker embedding"):
        load_spk2info(path)
    torch.save(
        {
            "carol": {
                "embedding": torch.zeros(192),
                "speech_token": torch.zeros(1, 3, dtype=torch.int64),
                "speech_feat": torch.zeros(1, 5, 80),
            }
        },
        path,
    )
    with pytest.raises(ValueError, match="'carol'.*speech_feat has 5 frames"):
        load_spk2info(path)

    class Evil:
        def __reduce__(self):
            return (print, ("pickle code ran",))

    torch.save({"dave": {"embedding": Evil()}}, path)
    with pytest.raises(ValueError, match="weights-only"):
        load_spk2info(path)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_spk2info(tmp_path / "missing.pt")
