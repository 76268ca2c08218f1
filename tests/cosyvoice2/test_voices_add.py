"""`voxserve voices add` for CosyVoice 2: a voice saved from a recording and its transcript is
found by name (through $VOXSERVE_VOICES_PATH), listed, and speaks as its own default speaker;
a damaged voice file is refused with its name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import voxserve
from voxserve import SynthesisOptions
from voxserve.cli import main
from voxserve.errors import VoiceLoadError


@pytest.fixture
def saved(cv2_dir, prompt_wav, tmp_path, monkeypatch):
    folder = tmp_path / "voices"
    rc = main(["voices", "add", "me", "--model", f"cosyvoice2:{cv2_dir}", "--prompt-wav", str(prompt_wav),
               "--prompt-text", "Hello, this is my voice.", "--dir", str(folder)])
    assert rc == 0
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(folder))
    return folder


def test_a_saved_voice_loads_by_name_and_speaks(saved, cv2_voice, capsys):
    voice = voxserve.load_voice("me", device="cpu")
    assert voice.family == "cosyvoice2" and voice.speakers == ["me"]
    a = voice.synthesize("Hello there.", SynthesisOptions(seed=1)).samples
    b = cv2_voice.synthesize("Hello there.", SynthesisOptions(speaker="spk", seed=1)).samples
    assert len(a) > 0 and np.isfinite(a).all()
    assert len(a) != len(b) or not np.allclose(a, b)  # it speaks with the recording's voice
    capsys.readouterr()
    assert main(["voices", "--json"]) == 0
    assert "me" in capsys.readouterr().out


def test_a_damaged_voice_file_is_refused_by_name(saved):
    meta = next(saved.rglob("*.json"))
    meta.write_text(json.dumps({"family": "cosyvoice2"}))
    with pytest.raises(VoiceLoadError, match=meta.name):
        voxserve.load_voice("me", device="cpu")


def test_a_family_without_cloning_is_refused(tmp_path, prompt_wav, capsys):
    rc = main(["voices", "add", "x", "--model", "en_US-joe-medium", "--prompt-wav", str(prompt_wav),
               "--prompt-text", "hi", "--dir", str(tmp_path)])
    assert rc != 0
    assert "no voices from recordings" in capsys.readouterr().err


@pytest.mark.parametrize("name,message", [("en_US-joe-medium", "taken by the piper voice"),
                                          ("alloy", "OpenAI's voice names"), ("Nova", "OpenAI's voice names")])
def test_a_taken_or_reserved_name_is_refused(cv2_dir, prompt_wav, tmp_path, monkeypatch, capsys, name, message):
    folder = tmp_path / "voices"
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(folder))
    rc = main(["voices", "add", name, "--model", f"cosyvoice2:{cv2_dir}", "--prompt-wav", str(prompt_wav),
               "--prompt-text", "Hello, this is my voice.", "--dir", str(folder)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not folder.exists() or not any(folder.iterdir())  # nothing saved
    from voxserve.voices.registry import resolve_voice

    assert resolve_voice("en_US-joe-medium").family == "piper"  # the Piper voice is not shadowed


def test_saving_a_voice_again_in_its_folder_replaces_it(saved, cv2_dir, prompt_wav):
    rc = main(["voices", "add", "me", "--model", f"cosyvoice2:{cv2_dir}", "--prompt-wav", str(prompt_wav),
               "--prompt-text", "A new take of my voice.", "--dir", str(saved)])
    assert rc == 0
    assert "A new take" in (saved / "me.cosyvoice2" / "voice.json").read_text()
