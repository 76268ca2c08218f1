"""Loading Piper voices: dims from tensors, errors that name the tensor, the weights cache."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import voxserve
from voxserve.errors import UnknownVoiceError, VoiceLoadError
from voxserve.families.piper import cache as vcache
from voxserve.families.piper.onnx_import import read_piper_onnx
from voxserve.voices.registry import resolve_voice


def test_default_voice_dims_from_tensors(joe_voice):
    d = joe_voice.runner.dims
    assert (d.hidden_channels, d.filter_channels, d.n_heads, d.n_layers) == (192, 768, 2, 6)
    assert d.upsample_rates == (8, 8, 4) and d.resblock == "2" and d.n_vocab == 256
    assert d.resblock_dilation_sizes == ((1, 2), (2, 6), (3, 12))
    assert joe_voice.sample_rate == 22050


def test_tiny_voice_dims(tiny_voice_path):
    d, _ = read_piper_onnx(tiny_voice_path)
    assert d.n_speakers == 3 and d.gin_channels == 8 and d.resblock == "1"
    assert d.resblock_dilation_sizes == ((1, 3, 5), (1, 3, 5))
    assert d.upsample_rates == (4, 4) and d.hidden_channels == 16


def test_dims_do_not_come_from_the_file_name(tiny_voice_path, tmp_path):
    renamed = tmp_path / "en_US-lessac-high.onnx"
    shutil.copy(tiny_voice_path, renamed)
    d, _ = read_piper_onnx(renamed)
    assert d.hidden_channels == 16


def _edit(src: Path, dst: Path, fn) -> Path:
    m = onnx.load(str(src))
    fn(m)
    onnx.save(m, str(dst))
    return dst


def test_wrong_shape_names_the_tensor(tiny_voice_path, tmp_path):
    def grow(m):
        for i, t in enumerate(m.graph.initializer):
            if t.name == "enc_p.encoder.attn_layers.1.conv_v.bias":
                m.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.zeros(17, np.float32), t.name))
    bad = _edit(tiny_voice_path, tmp_path / "bad.onnx", grow)
    with pytest.raises(VoiceLoadError, match=r"enc_p\.encoder\.attn_layers\.1\.conv_v\.bias"):
        read_piper_onnx(bad)


def test_missing_tensor_names_the_tensor(tiny_voice_path, tmp_path):
    def drop(m):
        keep = [t for t in m.graph.initializer if t.name != "dec.ups.1.bias"]
        del m.graph.initializer[:]
        m.graph.initializer.extend(keep)
    bad = _edit(tiny_voice_path, tmp_path / "bad2.onnx", drop)
    with pytest.raises(VoiceLoadError, match=r"dec\.ups\.1\.bias"):
        read_piper_onnx(bad)


def test_not_an_onnx_file(tmp_path):
    p = tmp_path / "x.onnx"
    p.write_bytes(b"not a model")
    with pytest.raises(VoiceLoadError, match="cannot read ONNX"):
        read_piper_onnx(p)


def test_cache_second_load_fast_and_corrupt_entry_rebuilt(tiny_voice_path, tmp_path, monkeypatch):
    monkeypatch.setenv("VOXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def convert(p):
        calls.append(p)
        return read_piper_onnx(p)

    d1, t1 = vcache.load_cached(tiny_voice_path, convert)
    d2, t2 = vcache.load_cached(tiny_voice_path, convert)
    assert len(calls) == 1 and d1 == d2
    assert all(np.array_equal(t1[k], t2[k]) for k in t1)
    [entry] = list((tmp_path / "cache" / "vits").glob("*.safetensors"))
    # flip bytes inside the tensor data: detected by the digest, rebuilt
    data = bytearray(entry.read_bytes())
    data[-50] ^= 0xFF
    entry.write_bytes(bytes(data))
    vcache.load_cached(tiny_voice_path, convert)
    assert len(calls) == 2
    # truncate: detected by the parser, rebuilt
    entry.write_bytes(entry.read_bytes()[:100])
    d3, _ = vcache.load_cached(tiny_voice_path, convert)
    assert len(calls) == 3 and d3 == d1
    vcache.load_cached(tiny_voice_path, convert)
    assert len(calls) == 3


def test_default_voice_loads_from_cache_quickly(joe_voice):
    t = time.perf_counter()
    voxserve.load_voice(device="cpu")  # the session fixture already converted it
    assert time.perf_counter() - t < 30  # generous: only guards against re-conversion loops


def test_registry_lists_and_resolves(tiny_voice_path, monkeypatch):
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(tiny_voice_path.parent))
    names = voxserve.available_voices()
    assert "en_US-joe-medium" in names and "tiny-multi" in names
    assert resolve_voice("tiny-multi").path == tiny_voice_path
    assert resolve_voice(str(tiny_voice_path)).name == "tiny-multi"
    with pytest.raises(UnknownVoiceError) as e:
        resolve_voice("no-such-voice")
    assert "en_US-joe-medium" in str(e.value) and "tiny-multi" in str(e.value)
    with pytest.raises(UnknownVoiceError):  # the server's mode: names only
        resolve_voice(str(tiny_voice_path), allow_paths=False)


def test_register_voice(tiny_voice_path):
    voxserve.register_voice("my-voice", tiny_voice_path)
    v = voxserve.load_voice("my-voice", device="cpu")
    assert v.name == "my-voice" and v.speakers == ["spk0", "spk1", "spk2"]


def test_missing_config_file(tiny_voice_path, tmp_path):
    lonely = tmp_path / "lonely.onnx"
    shutil.copy(tiny_voice_path, lonely)
    with pytest.raises(VoiceLoadError, match="lonely.onnx.json"):
        voxserve.load_voice(str(lonely), device="cpu")


def test_config_errors_name_the_key(tiny_voice_path, tmp_path):
    v = tmp_path / "v.onnx"
    shutil.copy(tiny_voice_path, v)
    cfg = json.loads(Path(str(tiny_voice_path) + ".json").read_text())
    del cfg["espeak"]
    Path(str(v) + ".json").write_text(json.dumps(cfg))
    with pytest.raises(VoiceLoadError, match="espeak"):
        voxserve.load_voice(str(v), device="cpu")


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("VOXSERVE_CACHE_DIR", str(tmp_path))
    assert vcache.cache_dir() == tmp_path
    assert os.fspath(vcache.cache_dir())


def test_cache_note_spares_hashing_until_a_file_changes(tiny_voice_path, tmp_path, monkeypatch):
    """A load with a settled voice file and cache entry hashes neither (a `say` paid for both on
    every run); a replaced entry, or a replaced voice file, is hashed and checked again."""
    monkeypatch.setenv("VOXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(vcache, "RACY_NS", 0)  # the test's files are seconds old, not settled
    voice = tmp_path / "v.onnx"
    shutil.copy(tiny_voice_path, voice)
    hashed, digested = [], []
    sha, digest = vcache.file_sha256, vcache._tensor_digest
    monkeypatch.setattr(vcache, "file_sha256", lambda p, *a: hashed.append(p) or sha(p, *a))
    monkeypatch.setattr(vcache, "_tensor_digest", lambda t: digested.append(1) or digest(t))
    calls = []

    def convert(p):
        calls.append(p)
        return read_piper_onnx(p)

    d1, t1 = vcache.load_cached(voice, convert)  # converts and writes the entry
    vcache.load_cached(voice, convert)  # checks the entry, notes both files
    hashed.clear(), digested.clear()
    d2, t2 = vcache.load_cached(voice, convert)
    assert (hashed, digested, len(calls)) == ([], [], 1)
    assert d1 == d2 and all(np.array_equal(t1[k], t2[k]) for k in t1)
    # an entry edited in place and put back under its name: a new file, checked, rebuilt
    [entry] = list((tmp_path / "cache" / "vits").glob("*.safetensors"))
    data = bytearray(entry.read_bytes())
    data[-50] ^= 0xFF
    edited = entry.with_suffix(".edited")
    edited.write_bytes(bytes(data))
    os.replace(edited, entry)
    vcache.load_cached(voice, convert)
    assert len(calls) == 2 and digested
    # a new voice file under the same path is hashed again
    hashed.clear()
    tmp = tmp_path / "v2.onnx"
    shutil.copy(tiny_voice_path, tmp)
    os.replace(tmp, voice)
    vcache.load_cached(voice, convert)
    assert hashed == [voice]


def test_build_draws_no_random_weights_and_holds_the_files_weights(tiny_voice_path, tmp_path, monkeypatch):
    """Every parameter is replaced by the voice's weights, so the model is built without its
    layers' random initialisation (it cost a `say` more than a tenth of a second); the weights
    are the file's, bit for bit."""
    import torch
    from torch.overrides import TorchFunctionMode

    from voxserve.families.piper import loader

    monkeypatch.setenv("VOXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    drawn = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("uniform_", "normal_", "kaiming_uniform_"):
                drawn.append(func.__name__)
            return func(*args, **(kwargs or {}))

    vcache.load_cached(tiny_voice_path, read_piper_onnx)  # converted first: only the build is counted
    with Count():
        model = loader.build_vits(tiny_voice_path)
    assert drawn == []
    _, tensors = read_piper_onnx(tiny_voice_path)
    state = model.state_dict()
    assert set(state) == set(tensors)
    assert all(torch.equal(state[k], torch.from_numpy(tensors[k])) for k in tensors)
    x = torch.randn(4, 8)
    assert torch.nn.Linear(8, 2)(x).abs().sum() > 0  # torch's own init is not left switched off


def test_build_refuses_a_tensor_that_is_not_float32(tiny_voice_path, monkeypatch):
    from voxserve.families.piper import loader

    dims, tensors = read_piper_onnx(tiny_voice_path)
    key = sorted(tensors)[0]
    tensors[key] = tensors[key].astype(np.float16)
    monkeypatch.setattr(loader, "load_cached", lambda *a, **k: (dims, tensors))
    with pytest.raises(VoiceLoadError, match=f"{key} is float16"):
        loader.build_vits(tiny_voice_path)
    del tensors[key]
    with pytest.raises(VoiceLoadError, match="missing"):  # never left uninitialised
        loader.build_vits(tiny_voice_path)
