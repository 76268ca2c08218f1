"""Fixtures for the CosyVoice 2 tests: the tiny random model folder rebuilt from seeds into
tmp_path in the official layout (with a saved speaker in spk2info.pt and the ONNX stand-ins),
loaded through the loader a downloaded CosyVoice2-0.5B folder goes through."""

from __future__ import annotations

import numpy as np
import pytest

import cv2_fixtures as fx
import cv2_onnx_fixtures as onnx_fx


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def cv2_dir(tmp_path_factory):
    d = fx.write_model_folder(tmp_path_factory.mktemp("cv2") / "tiny-cosyvoice2", speakers={"spk": fx.prompt_entry()})
    onnx_fx.write_standins(d)
    return d


@pytest.fixture(scope="session")
def cv2_voice(cv2_dir):
    import voxserve

    return voxserve.load_voice(f"cosyvoice2:{cv2_dir}", device="cpu")


@pytest.fixture(scope="session")
def prompt_wav(tmp_path_factory):
    """A 2 s 16 kHz recording: a vowel-like harmonic tone with a little noise."""
    rate = 16000
    t = np.arange(2 * rate) / rate
    rng = np.random.default_rng(5)
    y = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 6)) * 0.2 + 0.01 * rng.standard_normal(t.size)
    import soundfile as sf  # here: the CUDA tests run where soundfile is not (scripts/gpu-check)

    path = tmp_path_factory.mktemp("rec") / "prompt.wav"
    sf.write(path, y.astype(np.float32), rate)
    return path
