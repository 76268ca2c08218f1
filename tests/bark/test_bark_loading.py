"""Loading a Bark checkpoint directory: the loader a user's snapshot goes through, and its errors."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

import voxserve
from voxserve import SynthesisOptions
from voxserve.errors import UnknownSpeakerError, VoiceLoadError
from voxserve.families.bark import BarkOptions
from voxserve.families.bark.voice import BarkRuntimeOptions, BarkVoiceConfig, load_bark_voice


def test_loads_through_load_voice(bark_voice, tiny_bark_dir):
    assert bark_voice.family == "bark"
    assert bark_voice.name == tiny_bark_dir.name
    assert bark_voice.sample_rate == 24000
    # presets from speaker_embeddings_path.json and from presets/*.npz
    assert bark_voice.speakers == ["announcer", "v2/en_speaker_0", "v2/en_speaker_1"]
    assert str(bark_voice.device) == "cpu"


def test_registered_name(tiny_bark_dir):
    voxserve.register_voice("tiny-bark-registered", tiny_bark_dir, family="bark")
    v = voxserve.load_voice("tiny-bark-registered", device="cpu")
    assert v.name == "tiny-bark-registered" and v.family == "bark"


def test_cli_say(tiny_bark_dir, tmp_path):
    import soundfile as sf

    from voxserve.cli import main

    out = tmp_path / "bark.wav"
    rc = main(["say", "--voice", f"bark:{tiny_bark_dir}", "--device", "cpu", "--speaker", "announcer",
               "--temperature", "0", "-o", str(out), "Hello world. A dog."])
    assert rc == 0
    data, sr = sf.read(out)
    assert sr == 24000 and len(data) > 0


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("remove, says", [
    ("model.safetensors", "model weights"),
    ("generation_config.json", "generation_config.json"),
    ("tokenizer.json", "tokenizer"),
    ("tokenizer_config.json", "tokenizer_config.json"),
    ("config.json", "config.json is missing"),
])
def test_incomplete_directory(tiny_bark_dir, tmp_path, remove, says):
    d = _copy(tiny_bark_dir, tmp_path / "ckpt")
    (d / remove).unlink()
    with pytest.raises(VoiceLoadError, match=says):
        voxserve.load_voice(f"bark:{d}", device="cpu")


def test_missing_shard_is_named(tiny_bark_dir, tmp_path):
    d = _copy(tiny_bark_dir, tmp_path / "ckpt")
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(VoiceLoadError, match="model-00002-of-00002.safetensors"):
        voxserve.load_voice(f"bark:{d}", device="cpu")


def test_missing_directory(tmp_path):
    with pytest.raises(VoiceLoadError, match="not found"):
        voxserve.load_voice(f"bark:{tmp_path / 'nowhere'}", device="cpu")


def test_not_a_bark_checkpoint(tmp_path):
    d = tmp_path / "bert"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(VoiceLoadError, match="not a Bark checkpoint.*'bert'"):
        voxserve.load_voice(f"bark:{d}", device="cpu")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(VoiceLoadError, match="not a Bark checkpoint"):
        voxserve.load_voice(f"bark:{empty}", device="cpu")
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    with pytest.raises(VoiceLoadError, match="not a directory"):
        voxserve.load_voice(f"bark:{f}", device="cpu")


def test_unknown_speaker_lists_presets(bark_voice):
    with pytest.raises(UnknownSpeakerError, match="announcer, v2/en_speaker_0, v2/en_speaker_1"):
        bark_voice.units("Hello.", SynthesisOptions(speaker="v2/de_speaker_9"))  # raises now, not lazily
    with pytest.raises(UnknownSpeakerError):
        bark_voice.units("Hello.", SynthesisOptions(speaker=7))
    # an index into the sorted presets is accepted (the CLI turns "--speaker 1" into 1)
    assert next(iter(bark_voice.units("Hello.", SynthesisOptions(speaker=1)))).payload.speaker == "v2/en_speaker_0"


def test_unknown_default_speaker(tiny_bark_dir):
    with pytest.raises(UnknownSpeakerError, match="announcer"):
        load_bark_voice(tiny_bark_dir, device="cpu", config=BarkVoiceConfig(default_speaker="nobody"))


def test_preset_files_missing_are_left_out(tiny_bark_dir, tmp_path, caplog):
    d = _copy(tiny_bark_dir, tmp_path / "ckpt")
    (d / "speaker_embeddings" / "v2" / "en_speaker_1_fine_prompt.npy").unlink()
    with caplog.at_level(logging.WARNING, logger="voxserve.families.bark.voice"):
        v = load_bark_voice(d, device="cpu")
    assert v.speakers == ["announcer", "v2/en_speaker_0"]
    assert "en_speaker_1" in caplog.text


def test_preset_path_outside_directory(tiny_bark_dir, tmp_path):
    d = _copy(tiny_bark_dir, tmp_path / "ckpt")
    index = json.loads((d / "speaker_embeddings_path.json").read_text())
    index["v2/en_speaker_0"]["semantic_prompt"] = "../../etc/passwd"
    (d / "speaker_embeddings_path.json").write_text(json.dumps(index))
    with pytest.raises(VoiceLoadError, match="outside"):
        load_bark_voice(d, device="cpu")


def test_bad_npz_preset(tiny_bark_dir, tmp_path):
    d = _copy(tiny_bark_dir, tmp_path / "ckpt")
    np.savez(d / "presets" / "broken.npz", semantic_prompt=np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(VoiceLoadError, match="broken.*semantic_prompt must be a 1-D"):
        load_bark_voice(d, device="cpu")


def test_preset_for_another_model(tiny_bark_dir, tmp_path):
    from bark_fixtures import tiny_preset

    arrays = tiny_preset(np.random.default_rng(2), 10)
    arrays["coarse_prompt"] = arrays["coarse_prompt"] + 1000  # codes of a 1024-entry codebook
    np.savez(tmp_path / "big.npz", **arrays)
    with pytest.raises(VoiceLoadError, match="'big': coarse_prompt has tokens outside 0..15"):
        load_bark_voice(tiny_bark_dir, device="cpu", presets={"big": tmp_path / "big.npz"})


def test_extra_npz_preset(tiny_bark_dir, tmp_path):
    from bark_fixtures import tiny_preset

    p = tmp_path / "mine.npz"
    np.savez(p, **tiny_preset(np.random.default_rng(1), 12))
    v = load_bark_voice(tiny_bark_dir, device="cpu", presets={"mine": p})
    assert "mine" in v.speakers
    unit = next(iter(v.units("Hello.", BarkOptions(speaker="mine", temperature=0))))
    assert unit.payload.speaker == "mine"
    assert len(v.run_units([unit])[0]) > 0


def test_runtime_option_errors(tiny_bark_dir):
    with pytest.raises(ValueError, match="attention"):
        BarkRuntimeOptions(attention="fast").validate()
    with pytest.raises(ValueError, match="flash"):
        load_bark_voice(tiny_bark_dir, device="cpu", runtime=BarkRuntimeOptions(attention="flash_attention_2"))
    with pytest.raises(ValueError, match="CUDA"):
        load_bark_voice(tiny_bark_dir, device="cpu", dtype="fp16")
    with pytest.raises(ValueError, match="max_sentence_seconds"):
        BarkVoiceConfig(max_sentence_seconds=30).validate()
