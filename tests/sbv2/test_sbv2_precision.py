"""The SBV2 synthesizer under the precision policy (`load_voice("sbv2:...", dtype=...)`): the
text encoder and both duration predictors stay fp32, so durations (and the audio's length) are
exactly fp32's; the decoder (and under fp16 the flow) run in half. bf16 runs on the CPU here
(emulated where the CPU lacks native bf16: slow, fine for the tiny fixtures); fp16 is CUDA only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import sbv2_fixtures as fx  # noqa: E402

import voxserve  # noqa: E402
from voxserve.families.sbv2 import Sbv2Options
from voxserve.families.sbv2.loader import load_sbv2_checkpoint  # noqa: E402
from voxserve.families.sbv2.voice import SYNTH_FP32, Sbv2Voice  # noqa: E402
from voxserve.models.vits_precision import snr_db  # noqa: E402

DET = Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)
# SNR of half against fp32 on the fixtures' tiny random models (measured: see the test's print);
# random weights give no meaning to the figure beyond "the half path computes the same thing"
MIN_SNR_DB = {torch.bfloat16: 15.0, torch.float16: 30.0}


def texts(variant: str) -> list[str]:
    return [d["text"] for d in fx.frontend()["jp"] if 6 <= len(d["text"]) <= 30][:4]  # both variants speak JP


def part_dtypes(voice) -> dict[str, torch.dtype]:
    return {name: next(m.parameters()).dtype for name, m in voice.model.named_children()}


@pytest.fixture(scope="module")
def half_bert_root(tmp_path_factory):
    """A second copy of the BERT folder: BERTs are shared per (folder, device) in one dtype, so a
    voice in another dtype on the same device needs its own folder."""
    return fx.write_bert_root(tmp_path_factory.mktemp("half_bert"), names=(fx.JP_BERT, fx.EN_BERT))


def check_half(variant, folder, bert_root, half_root, device, dtype):
    """The synthesizer alone in half (fed the fp32 voice's BERT features): same length, close
    audio; then the whole voice in half (its BERT too), which may move a duration by a frame."""
    ref = voxserve.load_voice(f"sbv2:{folder}", device=device, bert_dir=bert_root)
    synth = Sbv2Voice("half-synth", load_sbv2_checkpoint(folder), ref.berts, ref.device, dtype)
    parts = part_dtypes(synth)
    assert {n for n, d in parts.items() if d == torch.float32} == set(SYNTH_FP32[dtype]), parts
    assert all(d == dtype for n, d in parts.items() if n not in SYNTH_FP32[dtype]), parts
    snrs = []
    for text in texts(variant):
        a, b = ref.synthesize(text, DET).samples, synth.synthesize(text, DET).samples
        assert b.dtype == np.float32 and a.shape == b.shape, text  # fp32 durations: same length
        assert np.isfinite(b).all()
        snrs.append(snr_db(a, b))
    print(f"{variant} {device} {dtype} synthesizer: SNR vs fp32 min {min(snrs):.1f} dB, "
          f"median {np.median(snrs):.1f} dB")
    assert min(snrs) >= MIN_SNR_DB[dtype]
    whole = voxserve.load_voice(f"sbv2:{folder}", device=device, bert_dir=half_root, dtype=dtype)
    assert whole.berts["JP"].dtype == dtype and part_dtypes(whole) == parts
    for text in texts(variant):
        a, b = ref.synthesize(text, DET).samples, whole.synthesize(text, DET).samples
        assert np.isfinite(b).all() and abs(len(b) - len(a)) <= 0.1 * len(a), text
        assert np.sqrt(np.mean(b**2)) > 0.1 * np.sqrt(np.mean(a**2))


@pytest.mark.parametrize("variant", fx.VARIANTS)
def test_cpu_bf16_synthesizer_keeps_durations_and_follows_fp32(sbv2_folders, sbv2_bert_root, half_bert_root,
                                                               variant):
    check_half(variant, sbv2_folders[variant], sbv2_bert_root, half_bert_root, "cpu", torch.bfloat16)


def test_fp16_is_refused_on_cpu(sbv2_folders, sbv2_bert_root):
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        voxserve.load_voice(f"sbv2:{sbv2_folders['jp_extra']}", device="cpu", bert_dir=sbv2_bert_root, dtype="fp16")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cuda_half_synthesizer(sbv2_folders, sbv2_bert_root, tmp_path, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    # the voices speak Japanese text: pyopenjtalk (128 MB with its dictionary) does not travel to
    # scripts/gpu-check's machine, where this skips saying so
    pytest.importorskip("pyopenjtalk", reason="the Japanese front end (pyopenjtalk) is not installed")
    half_root = fx.write_bert_root(tmp_path / "bert", names=(fx.JP_BERT,))
    check_half("jp_extra", sbv2_folders["jp_extra"], sbv2_bert_root, half_root, "cuda", dtype)
