"""bf16 on CPU: the decoder (HiFi-GAN, most of the work) in bf16, every fragile stage in fp32,
checked against the fp32 voice (the same policy as on CUDA; see docs/precision.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import voxserve
from voxserve.families.piper.runner import VitsItem
from voxserve.models.vits import dtype_of
from voxserve.models.vits_precision import compare_audio
from voxserve.runtime.device import cpu_has_native_bf16, resolve_dtype

DET = voxserve.DETERMINISTIC


@pytest.fixture(scope="module")
def joe_bf16():
    return voxserve.load_voice(device="cpu", dtype="bf16")


def _corpus_ids(voice, corpus: list[dict], n_texts: int) -> list[list[int]]:
    return [s.ids for row in corpus[:n_texts] for s in voice.frontend.sentences(row["text"])]


def test_dtype_resolution_on_cpu():
    cpu = torch.device("cpu")
    assert resolve_dtype("bf16", cpu) is torch.bfloat16
    assert resolve_dtype(None, cpu) is torch.float32
    with pytest.raises(ValueError, match="CUDA"):
        resolve_dtype("fp16", cpu)
    assert isinstance(cpu_has_native_bf16(), bool)


def test_cpu_bf16_keeps_fragile_stages_fp32(joe_bf16):
    m = joe_bf16.runner.model
    assert {n: dtype_of(getattr(m, n)) for n in ("enc_p", "dp", "flow", "dec")} == {
        "enc_p": torch.float32, "dp": torch.float32, "flow": torch.float32, "dec": torch.bfloat16}


def test_cpu_bf16_quality_on_corpus(joe_voice, joe_bf16, corpus):
    """Durations are computed in fp32, so every sentence keeps its length; the waveform stays
    >= 30 dB from fp32 (measured 39.7 dB over 8 corpus texts: docs/precision.md)."""
    ids = _corpus_ids(joe_voice, corpus, 4)
    ref = joe_voice.synthesize_ids(ids, DET)
    half = joe_bf16.synthesize_ids(ids, DET)
    assert all(a.dtype == np.float32 for a in half)
    r = compare_audio(ref, half)
    assert r["length_changed"] == 0, r
    assert r["snr_db"] >= 30, r


def test_cpu_bf16_batch_and_pieces_stay_close(joe_bf16, corpus):
    """bf16 rounds each convolution's output, and oneDNN's blocking depends on the shape, so a
    sentence alone and in a batch, or whole and in pieces, agree closely but not bit for bit
    (fp32 is exact: tests/runtime/test_first_audio.py)."""
    ids = _corpus_ids(joe_bf16, corpus, 2)
    alone = [joe_bf16.synthesize_ids([i], DET)[0] for i in ids]
    batch = joe_bf16.synthesize_ids(ids, DET)
    assert compare_audio(alone, batch)["snr_db"] >= 40
    r = joe_bf16.runner
    item = VitsItem(max(ids, key=len), noise_scale=0.0, noise_w=0.0, seed=1)
    whole = r.run([item])[0]
    (head, rest), = r.run_pieces([item], max_cost=80)
    assert rest is not None
    joined = np.concatenate([head, r.run([rest])[0]])
    assert len(joined) == len(whole)
    assert compare_audio([whole], [joined])["snr_db"] >= 40
