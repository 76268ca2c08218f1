"""The OpenAI speech API as the current SDK speaks it, in-process around a fake voice: every
SpeechModel id, voice objects, `stream_format="sse"`, `instructions`, voxserve options sent as
extensions, GET /v1/audio/voices. The SDK itself against a real server: test_server_e2e.py."""

from __future__ import annotations

import base64
import json
import typing

import numpy as np
import pytest
from serve_fakes import FakeVoice
from test_app_inprocess import assert_error, make_client, speech

from voxserve.audio import available_stream_formats, float_to_int16
from voxserve.errors import InvalidOptionError
from voxserve.families import synthesis_rules
from voxserve.families.cosyvoice2 import CosyOptions
from voxserve.families.cosyvoice2.synthesis import MAX_INSTRUCTIONS_CHARS
from voxserve.options import options_for
from voxserve.serve.schemas import SpeechRequest

TEXT = "Hello there. General Kenobi."


@pytest.fixture(scope="module")
def client():
    c, voice, eng, app = make_client()
    with c:
        yield c, voice, eng, app


def events(r) -> list[dict]:
    """The JSON payloads of a text/event-stream body, in order (every event is one `data:` line)."""
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    blocks = [b for b in r.text.split("\n\n") if b.strip()]
    out = []
    for block in blocks:
        lines = block.split("\n")
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        out.append(json.loads(lines[0][len("data: "):]))
    return out


def test_every_model_the_sdk_lists_is_accepted_and_listed(client):
    from openai.types.audio.speech_model import SpeechModel

    c, *_ = client
    sdk_models = typing.get_args(SpeechModel)
    assert "gpt-4o-mini-tts-2025-12-15" in sdk_models
    listed = {m["id"] for m in c.get("/v1/models").json()["data"]}
    for model in sdk_models:
        assert speech(c, model=model).status_code == 200, model
        assert model in listed


def test_voice_as_a_name_or_an_object(client):
    c, voice, *_ = client
    expected = float_to_int16(voice.expected(TEXT))
    for v in ("alloy", {"id": "alloy"}, "fake", {"id": "fake"}, {"id": "fake", "name": "ignored"}):
        r = speech(c, voice=v)
        assert r.status_code == 200, (v, r.text)
        np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"), expected)
    assert_error(speech(c, voice={"id": "no-such-voice"}), 404, "voice_not_found", "voice")
    assert_error(speech(c, voice={"name": "fake"}), 422, "invalid_schema", "voice")
    assert_error(speech(c, voice={"id": ""}), 422, "invalid_schema", "voice")
    assert_error(speech(c, voice=7), 422, "invalid_schema", "voice")


def test_sse_deltas_are_the_audio_stream_then_done_with_usage(client):
    c, voice, *_ = client
    for fmt in ("pcm", "wav", "mp3"):
        plain = speech(c, response_format=fmt).content
        r = speech(c, response_format=fmt, stream_format="sse")
        assert r.status_code == 200, r.text
        evs = events(r)
        assert [e["type"] for e in evs[:-1]] == ["speech.audio.delta"] * (len(evs) - 1) and len(evs) >= 2
        done = evs[-1]
        assert done["type"] == "speech.audio.done"
        data = b"".join(base64.b64decode(e["audio"]) for e in evs[:-1])
        assert data == plain, fmt  # the same encoder over the same samples
        n = len(float_to_int16(voice.expected(TEXT)))
        assert done["usage"] == {"input_tokens": len(TEXT), "output_tokens": n, "total_tokens": len(TEXT) + n}
        assert r.headers["x-sample-rate"] == "16000"


@pytest.mark.skipif("aac" not in available_stream_formats(), reason="this build has no AAC encoder")
def test_sse_carries_aac(client):
    c, *_ = client
    evs = events(speech(c, response_format="aac", stream_format="sse"))
    data = b"".join(base64.b64decode(e["audio"]) for e in evs if e["type"] == "speech.audio.delta")
    assert data[:2] in (b"\xff\xf1", b"\xff\xf9")  # ADTS sync word


def test_sse_errors_before_audio_are_plain_http_errors(client):
    c, *_ = client
    assert_error(speech(c, input="   ", stream_format="sse"), 400, "invalid_input")
    assert_error(speech(c, speed=9.0, stream_format="sse"), 400, "invalid_option", "speed")
    assert_error(speech(c, stream_format="json"), 422, "invalid_schema", "stream_format")


def test_sse_failure_after_the_first_audio_is_an_error_event():
    c, voice, eng, app = make_client(max_batch_size=1)  # one sentence a batch: the first is sent first
    run = voice.run_pieces

    def failing(units, *args, **kw):
        if any(u.payload == "General Kenobi" for u in units):
            raise RuntimeError("secret detail")
        return run(units, *args, **kw)

    voice.run_pieces = failing
    with c:
        r = speech(c, stream_format="sse")
        assert r.status_code == 200
        evs = events(r)
        assert evs[0]["type"] == "speech.audio.delta"
        assert evs[-1] == {"type": "error", "error": {"message": "internal error", "type": "server_error",
                                                      "param": None, "code": "internal_error"}}
        assert "secret" not in r.text
        assert c.get("/health").status_code == 200


def test_instructions_are_accepted_and_bounded(client):
    c, voice, *_ = client
    expected = float_to_int16(voice.expected(TEXT))
    r = speech(c, model="gpt-4o-mini-tts", instructions="Speak in a cheerful and positive tone.")
    np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"), expected)
    body = {"model": "tts-1", "input": "Hi.", "voice": "alloy"}
    req = SpeechRequest.model_validate(body | {"instructions": "x" * MAX_INSTRUCTIONS_CHARS})
    assert options_for(CosyOptions, req.option_values(), synthesis_rules()).instructions == req.instructions
    with pytest.raises(InvalidOptionError, match="instructions"):  # this app's body bound would answer 413 first
        too_long = SpeechRequest.model_validate(body | {"instructions": "x" * (MAX_INSTRUCTIONS_CHARS + 1)})
        options_for(CosyOptions, too_long.option_values(), synthesis_rules())
    assert_error(speech(c, instructions=3), 422, "invalid_schema", "instructions")


def test_voxserve_options_ride_along_as_extensions(client):
    c, voice, *_ = client
    r = speech(c, sentence_silence=0.25)
    got = np.frombuffer(r.content, "<i2")
    first, second = voice.audio_for("Hello there"), voice.audio_for("General Kenobi")
    expected = np.concatenate([first, np.zeros(4000, np.float32), second])
    np.testing.assert_array_equal(got, float_to_int16(expected))
    assert_error(speech(c, speaker="nobody"), 400, "invalid_input", "speaker")
    assert_error(speech(c, sentence_silence=-1.0), 400, "invalid_option", "sentence_silence")
    assert_error(speech(c, normalize="yes"), 422, "invalid_schema", "normalize")
    assert speech(c, some_future_openai_field=1).status_code == 200  # OpenAI's body: unknown fields ignored


def test_openapi_lists_the_extensions_with_their_ranges(client):
    c, *_ = client
    spec = c.get("/openapi.json").json()
    props = spec["components"]["schemas"]["SpeechRequest"]["properties"]
    assert props["stream_format"]["enum"] == ["audio", "sse"]
    assert props["sentence_silence"]["anyOf"][0]["minimum"] == 0


def test_audio_voices_lists_the_loaded_voices():
    voices = [FakeVoice("fake", sample_rate=16000), FakeVoice("other", sample_rate=22050, speakers=())]
    from fastapi.testclient import TestClient

    from voxserve.engine import Engine, EngineConfig, SchedulerConfig
    from voxserve.serve.app import AppConfig, create_app

    eng = Engine(voices, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    with TestClient(create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=5))) as c:
        body = c.get("/v1/audio/voices").json()
        assert body["object"] == "list" and body["voices"] == ["fake", "other"]
        assert body["data"][0] == {"id": "fake", "object": "audio.voice", "name": "fake", "created_at": 0,
                                   "family": "fake", "sample_rate": 16000, "speakers": ["a", "b"], "styles": [],
                                   "languages": [], "options": ["speaker", "speed", "sentence_silence", "seed"],
                                   "default": True}
        assert body["data"][1]["default"] is False and body["data"][1]["sample_rate"] == 22050
        assert "alloy" in body["openai_aliases"]
        r = c.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": {"id": "other"},
                                             "response_format": "pcm"})
        assert r.headers["x-sample-rate"] == "22050"
