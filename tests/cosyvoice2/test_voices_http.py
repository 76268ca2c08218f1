"""Voices over HTTP, end to end over loopback with the tiny CosyVoice 2 model: POST
/v1/audio/voices makes a voice from a recording, saved where `voxserve voices add` saves one
and usable at once on every route (speech, synthesize, the stream WebSocket); DELETE removes
it; names, recordings, sizes, the API key and servers without a cloning voice are refused."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf
from cv2_fixtures import assert_same_audio
from serve_fakes import FakeVoice
from server_process import serving_in_thread
from websockets.sync.client import connect

import voxserve
from voxserve import SynthesisOptions
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.serve.app import AppConfig, create_app

TEXT = "Hello there. How are you?"


@pytest.fixture
def server(cv2_dir, tmp_path, monkeypatch):
    folder = tmp_path / "voices"
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(folder))
    voice = voxserve.load_voice(f"cosyvoice2:{cv2_dir}", device="cpu")  # its own speakers, the shared model
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    app = create_app(eng, AppConfig(warmup=False, api_key="k", voice_dir=folder, max_upload_bytes=2 << 20))
    with serving_in_thread(app) as (port, client):
        client.headers["Authorization"] = "Bearer k"
        yield port, client, folder, voice


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767


def wav_bytes(path) -> bytes:
    return open(path, "rb").read()


def post(client, name="bob", audio: bytes | None = None, text="Hello, this is my voice.", **extra):
    files = {"prompt_audio": ("prompt.wav", audio, "audio/wav")}
    return client.post("/v1/audio/voices", data={"name": name, "prompt_text": text, **extra}, files=files)


def test_a_voice_made_over_http_is_saved_and_spoken_at_once_on_every_route(server, prompt_wav):
    port, client, folder, voice = server
    r = post(client, audio=wav_bytes(prompt_wav))
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "bob" and r.json()["model"] == voice.name
    assert (folder / "bob.cosyvoice2" / "voice.json").is_file()  # `voxserve voices add`'s store
    listed = client.get("/v1/audio/voices").json()
    assert "bob" in listed["voices"] and "bob" in [v["name"] for v in client.get("/v1/voices").json()["voices"]]

    # the same voice as the library loads from the store (to batch-level float noise)
    saved = voxserve.load_voice("bob", device="cpu")
    want = np.clip(saved.synthesize(TEXT, SynthesisOptions(seed=3)).samples, -1, 1)
    native = client.post("/v1/synthesize", json={"text": TEXT, "voice": "bob", "response_format": "pcm", "seed": 3})
    assert native.status_code == 200
    assert_same_audio(pcm(native.content), want)
    openai = client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": {"id": "bob"},
                                                    "response_format": "pcm", "seed": 3})
    assert openai.status_code == 200
    assert_same_audio(pcm(openai.content), want)
    spk = client.post("/v1/synthesize", json={"text": TEXT, "voice": voice.name, "speaker": "spk",
                                              "response_format": "pcm", "seed": 3})
    assert len(spk.content) != len(native.content) or spk.content != native.content  # not the model's speaker
    with connect(f"ws://127.0.0.1:{port}/v1/audio/speech/stream", additional_headers={"Authorization": "Bearer k"},
                 proxy=None, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "start", "voice": "bob", "seed": 3}))
        assert json.loads(ws.recv(timeout=60))["voice"] == voice.name
        ws.send(json.dumps({"type": "text", "text": "Hello the"}))
        ws.send(json.dumps({"type": "text", "text": "re. How are you?"}))
        ws.send(json.dumps({"type": "end"}))
        audio = b"".join(m for m in ws if isinstance(m, bytes))
    # each sentence a request of its own with the session's seed: the library's sentences alike
    per_sentence = np.concatenate([np.clip(saved.synthesize(s, SynthesisOptions(seed=3)).samples, -1, 1)
                                   for s in ("Hello there.", "How are you?")])
    assert_same_audio(pcm(audio), per_sentence)

    # the voice's only speaker is itself
    other = client.post("/v1/synthesize", json={"text": TEXT, "voice": "bob", "speaker": "spk"})
    assert other.status_code == 400 and other.json()["error"]["param"] == "speaker"

    d = client.delete("/v1/audio/voices/bob")
    assert d.status_code == 200 and d.json()["deleted"] is True
    assert not (folder / "bob.cosyvoice2").exists()
    assert "bob" not in client.get("/v1/audio/voices").json()["voices"]
    assert "bob" not in voice.speakers
    gone = client.post("/v1/synthesize", json={"text": TEXT, "voice": "bob"})
    assert gone.status_code == 404
    assert client.delete("/v1/audio/voices/bob").status_code == 404


def test_bad_names_recordings_and_sizes_are_refused_and_nothing_is_saved(server, prompt_wav):
    port, client, folder, voice = server
    good = wav_bytes(prompt_wav)
    cases = [
        (dict(name="alloy", audio=good), 400, "invalid_name"),
        (dict(name="../../etc/x", audio=good), 400, "invalid_name"),
        (dict(name=voice.name, audio=good), 409, "name_taken"),
        (dict(name="en_US-joe-medium", audio=good), 409, "name_taken"),
        (dict(audio=b"RIFF not audio at all" * 10), 400, "invalid_audio"),
        (dict(audio=good, text="  "), 400, "invalid_input"),
        (dict(audio=good, model="nope"), 400, "cloning_unsupported"),
    ]
    for kw, status, code in cases:
        r = post(client, **kw)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), (kw.get("name"), r.text)
    buf = io.BytesIO()
    sf.write(buf, np.zeros(16000 * 31, dtype=np.float32), 16000, format="FLAC")  # 31 s, small as FLAC
    r = post(client, audio=buf.getvalue())
    assert r.status_code == 413 and r.json()["error"]["code"] == "audio_too_long"
    r = post(client, audio=b"\0" * (3 << 20))  # over max_upload_bytes: refused before it is read
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    r = client.post("/v1/audio/voices", json={"name": "bob"})
    assert r.status_code == 415
    r = client.post("/v1/audio/voices", headers={"Authorization": ""},
                    data={"name": "bob", "prompt_text": "hi"}, files={"prompt_audio": ("a.wav", good)})
    assert r.status_code == 401
    assert client.delete("/v1/audio/voices/" + voice.name).status_code == 409  # loaded at start
    assert not folder.exists() or not any(folder.iterdir())
    assert voice.speakers == ["spk"]


def test_a_server_without_a_cloning_voice_says_so(prompt_wav, tmp_path):
    eng = Engine([FakeVoice()], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    app = create_app(eng, AppConfig(warmup=False, voice_dir=tmp_path))
    with serving_in_thread(app) as (_, client):
        r = post(client, audio=wav_bytes(prompt_wav))
    assert r.status_code == 400 and r.json()["error"]["code"] == "cloning_unsupported"
    assert "CosyVoice 2" in r.json()["error"]["message"]
