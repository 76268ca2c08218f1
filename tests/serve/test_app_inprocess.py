"""The HTTP app in-process (TestClient) around an engine with a fake voice: every error status,
the error shape, auth, limits, formats, voices/models/health/ready/metrics. No torch."""

from __future__ import annotations

import io
import json
import wave

import numpy as np
import pytest
import soundfile as sf
from fastapi.testclient import TestClient
from serve_fakes import FakeVoice

from voxserve.audio import available_stream_formats, float_to_int16
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine import Sink as EngineSink
from voxserve.serve.app import AppConfig, create_app


def make_client(api_key=None, warmup=False, **sched):
    voice = FakeVoice(sample_rate=16000)
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(**{"max_wait_ms": 0, **sched})))
    app = create_app(eng, AppConfig(api_key=api_key, warmup=warmup, max_input_chars=500, max_body_bytes=4096,
                                    shutdown_timeout_s=5))
    return TestClient(app), voice, eng, app


@pytest.fixture(scope="module")
def client():
    c, voice, eng, app = make_client()
    with c:
        yield c, voice, eng, app


def assert_error(r, status, code=None, param="any"):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    assert "Traceback" not in r.text
    assert body["error"]["code"], body  # every error has a code
    if code:
        assert body["error"]["code"] == code, body
    if param != "any":
        assert body["error"]["param"] == param, body


def speech(c, **kw):
    body = {"model": "tts-1", "input": "Hello there. General Kenobi.", "voice": "alloy", "response_format": "pcm"} | kw
    return c.post("/v1/audio/speech", json=body)


def test_speech_pcm_matches_voice_output_and_says_the_rate(client):
    c, voice, *_ = client
    r = speech(c)
    assert r.status_code == 200
    assert r.headers["x-sample-rate"] == "16000"
    assert r.headers["content-type"].startswith("audio/L16; rate=16000")
    got = np.frombuffer(r.content, dtype="<i2")
    np.testing.assert_array_equal(got, float_to_int16(voice.expected("Hello there. General Kenobi.")))


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac"])
def test_speech_formats_decode(client, fmt):
    c, voice, *_ = client
    r = speech(c, response_format=fmt, input="One. Two. Three.")
    assert r.status_code == 200, r.text
    data = r.content
    n_expected = len(voice.expected("One. Two. Three."))
    if fmt == "wav":
        assert data[:4] == b"RIFF"
        pcm = np.frombuffer(data[44:], dtype="<i2")
        np.testing.assert_array_equal(pcm, float_to_int16(voice.expected("One. Two. Three.")))
        return
    if fmt == "flac":  # sent whole, its length in STREAMINFO: libsndfile reads it as it is
        assert data[:4] == b"fLaC" and int(r.headers["content-length"]) == len(data)
        assert sf.info(io.BytesIO(data)).frames == n_expected
    y, rate = sf.read(io.BytesIO(data), dtype="float32")
    if fmt == "opus":
        assert rate == 16000 and abs(len(y) - n_expected) < 16000 * 0.1  # an Opus rate: no resampling
    elif fmt == "mp3":
        assert rate == 16000 and 0 <= len(y) - n_expected < 16000 * 0.2  # encoder delay + padding
    else:
        assert rate == 16000 and len(y) == n_expected
        np.testing.assert_allclose(y, voice.expected("One. Two. Three."), atol=1e-3)


def test_native_synthesize_whole_file_with_options(client):
    c, voice, *_ = client
    r = c.post("/v1/synthesize", json={"text": "A b. C d.", "speaker": "b", "speed": 1.5, "noise_scale": 0.1,
                                       "noise_w": 0.2, "sentence_silence": 0.25, "seed": 7, "response_format": "wav"})
    assert r.status_code == 200
    with wave.open(io.BytesIO(r.content)) as w:
        assert w.getframerate() == 16000
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    a, b = voice.audio_for("A b"), voice.audio_for("C d")
    expected = np.concatenate([a, np.zeros(4000, np.float32), b])
    np.testing.assert_array_equal(pcm, float_to_int16(expected))
    assert int(r.headers["content-length"]) == len(r.content)


def test_native_streaming(client):
    c, voice, *_ = client
    with c.stream("POST", "/v1/synthesize", json={"text": "x y. z w.", "response_format": "pcm", "stream": True}) as r:
        assert r.status_code == 200
        data = b"".join(r.iter_bytes())
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), float_to_int16(voice.expected("x y. z w.")))


@pytest.mark.parametrize("stream", [True, False])
def test_first_audio_head_joins_its_sentence_without_silence(client, stream):
    """A streamed first sentence long enough for an early head arrives in two chunks; the
    sentence silence goes between sentences only, never inside the split one."""
    c, voice, *_ = client
    # over half of max_batch_phonemes (256): it runs without its successor, so it may be cut
    first, second = "this first sentence is long enough for a head, " * 3 + "and then some", "then a short one"
    before = voice.cuts
    with c.stream("POST", "/v1/synthesize", json={"text": f"{first}. {second}.", "response_format": "pcm",
                                                  "sentence_silence": 0.25, "stream": stream}) as r:
        assert r.status_code == 200
        data = b"".join(r.iter_bytes())
    expected = np.concatenate([voice.audio_for(first), np.zeros(4000, np.float32), voice.audio_for(second)])
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), float_to_int16(expected))
    assert voice.cuts == before + (1 if stream else 0)  # only streams get an early head


@pytest.mark.parametrize("body,status,code", [
    ({"input": "   "}, 400, "invalid_input"),
    ({"input": "... 42 ..."}, 400, "invalid_input"),
    ({"speed": 5.0}, 400, "invalid_option"),
    ({"speed": 0.1}, 400, "invalid_option"),
    pytest.param({"response_format": "aac"}, 400, "unsupported_format",
                 marks=pytest.mark.skipif("aac" in available_stream_formats(), reason="this build encodes AAC")),
    ({"voice": "no-such-voice"}, 404, "voice_not_found"),
    ({"model": "whisper-1"}, 404, "model_not_found"),
    ({"input": "x" * 501}, 413, "input_too_long"),
    ({"response_format": "ogg-vorbis"}, 422, "invalid_schema"),
    ({"speed": "fast"}, 422, "invalid_schema"),
    ({"speed": True}, 422, "invalid_schema"),
    ({"input": None}, 422, "invalid_schema"),
])
def test_speech_error_statuses(client, body, status, code):
    c, *_ = client
    assert_error(speech(c, **body), status, code)


def test_native_error_statuses(client):
    c, *_ = client
    assert_error(c.post("/v1/synthesize", json={"text": "hi.", "speaker": "nobody"}), 400, "invalid_input")
    assert_error(c.post("/v1/synthesize", json={"text": "hi.", "noise_scale": -1}), 400, "invalid_option")
    assert_error(c.post("/v1/synthesize", json={"text": "hi.", "unknown_field": 1}), 422, "invalid_schema")
    assert_error(c.post("/v1/synthesize", json={"text": "hi.", "voice": "/etc/passwd"}), 404, "voice_not_found")
    assert_error(c.post("/v1/synthesize", content=b"{not json", headers={"content-type": "application/json"}), 422,
                 "invalid_json", None)
    assert_error(c.post("/v1/synthesize", content=b'{"text": "\xff"}', headers={"content-type": "application/json"}),
                 422, "invalid_json", None)
    assert_error(c.post("/v1/synthesize", json={"text": "hi.", "stream": "yes"}), 422, "invalid_schema", "stream")
    assert_error(c.post("/v1/synthesize", json={"text": "hi.", "speaker": True}), 422, "invalid_schema", "speaker")
    assert_error(c.post("/v1/synthesize", content=b"x" * 5000, headers={"content-type": "application/json"}), 413,
                 "body_too_large")
    assert_error(c.get("/v1/nothing-here"), 404)
    assert_error(c.get("/v1/synthesize"), 405)


@pytest.mark.parametrize("route", ["/v1/synthesize", "/v1/audio/speech", "/v1/audio/captioned_speech"])
def test_json_nested_too_deeply_is_invalid_json(client, route):
    """Deeper than the JSON parser goes (RecursionError in FastAPI's parse): 422 invalid_json, as
    for any body that does not parse, not a bare 400 (docs/serving.md)."""
    c, *_ = client
    for deep in ("[" * 1500 + "]" * 1500, '{"input": "hi", "voice": "alloy", "x": ' + "[" * 1500 + "]" * 1500 + "}"):
        assert_error(c.post(route, content=deep.encode(), headers={"content-type": "application/json"}), 422,
                     "invalid_json", None)


def test_voices_models_health_ready_metrics(client):
    c, *_ = client
    v = c.get("/v1/voices").json()
    assert v["voices"][0] == {"name": "fake", "family": "fake", "sample_rate": 16000, "speakers": ["a", "b"], "styles": [], "languages": [],
                               "options": ["speaker", "speed", "sentence_silence", "seed"], "default": True}
    assert "alloy" in v["openai_aliases"]
    assert "tts-1" in [m["id"] for m in c.get("/v1/models").json()["data"]]
    assert c.get("/health").json() == {"status": "ok"}
    assert c.get("/ready").status_code == 200
    m = c.get("/metrics").text
    for name in ("voxserve_requests_total", "voxserve_queue_depth_sentences", "voxserve_batch_size_bucket",
                 "voxserve_batch_phonemes_bucket", "voxserve_time_to_first_audio_seconds_bucket",
                 "voxserve_real_time_factor_bucket", "voxserve_in_flight_requests", "voxserve_device_memory_bytes"):
        assert name in m, name


def test_not_ready_and_shutting_down_are_503():
    c, voice, eng, app = make_client()
    with c:
        app.state.ready.clear()
        assert_error(c.get("/ready"), 503, "not_ready")
        assert_error(speech(c), 503, "unavailable")
        app.state.ready.set()
        eng.stop_accepting()
        assert_error(speech(c), 503, "unavailable")


def test_overload_is_429_with_retry_after():
    import threading
    import time

    c, voice, eng, app = make_client(max_queued_sentences=1, max_batch_size=1)
    voice.gate = threading.Event()
    done = threading.Event()

    class Sink(EngineSink):  # an accepted request, submitted straight to the engine
        def on_audio(self, *a): pass
        def on_done(self, n): done.set()
        def on_error(self, e): raise AssertionError(e)

    with c:
        eng.submit("fake", "a b. c d. e f.", None, Sink())
        deadline = time.time() + 5
        while eng.queued_sentences() < 1 and time.time() < deadline:
            time.sleep(0.01)  # one sentence runs (held by the gate), the others queue
        r = speech(c, input="more.")
        assert_error(r, 429, "overloaded")
        assert int(r.headers["retry-after"]) >= 1
        voice.gate.set()
        assert done.wait(10)  # the accepted request completes
        assert c.get("/health").status_code == 200
        assert speech(c, input="after.").status_code == 200


def test_api_key_required_except_health():
    c, *_ = make_client(api_key="s3cret")
    with c:
        assert c.get("/health").status_code == 200
        assert_error(c.get("/v1/voices"), 401, "invalid_api_key")
        assert_error(c.get("/metrics", headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(speech(c), 401)
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/v1/voices", headers=ok).status_code == 200
        assert c.post("/v1/audio/speech", headers=ok, json={"model": "tts-1", "input": "Hi.", "voice": "alloy",
                                                            "response_format": "pcm"}).status_code == 200


def test_server_error_never_leaks_a_traceback():
    c, voice, eng, app = make_client()

    def boom(units, *args, **kw):
        raise RuntimeError("secret internal detail /home/x/model.py line 3")

    voice.run_pieces = boom
    with c:
        r = c.post("/v1/synthesize", json={"text": "hello."})
        assert r.status_code == 500
        assert "secret" not in r.text and "Traceback" not in r.text
        assert r.json()["error"]["message"] == "internal error"
        assert c.get("/health").status_code == 200


def test_errors_are_json_for_openai_sdk_shape(client):
    c, *_ = client
    r = speech(c, input="")
    assert json.loads(r.text)["error"]["type"] == "invalid_request_error"


def test_request_timeout_cancels_and_answers_504():
    import threading

    voice = FakeVoice(sample_rate=16000)
    voice.gate = threading.Event()
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_batch_size=1)))
    app = create_app(eng, AppConfig(warmup=False, request_timeout_s=0.3))
    with TestClient(app) as c:
        r = c.post("/v1/synthesize", json={"text": "one. two. three. four."})
        assert_error(r, 504, "timeout")
        voice.gate.set()
        import time

        deadline = time.time() + 5
        while eng.in_flight and time.time() < deadline:
            time.sleep(0.01)
        assert eng.in_flight == 0
        assert len(voice.run_texts) <= 2  # the sentence held at the gate (and at most one more)


def test_audio_too_long_is_413_naming_the_limit():
    from voxserve.errors import AudioTooLongError
    from voxserve.serve.app import _error_for

    r = _error_for(AudioTooLongError("the request", 2000.0, 1800.0))
    body = json.loads(r.body)["error"]
    assert r.status_code == 413 and (body["code"], body["param"]) == ("audio_too_long", "max_audio_seconds")
    r = _error_for(AudioTooLongError("a sentence", 200.0, 120.0, "max_sentence_audio_seconds"))
    assert json.loads(r.body)["error"]["param"] == "max_sentence_audio_seconds"


def test_guard_counts_aborted_uploads_as_499_and_times_out_slow_bodies():
    import asyncio

    voice = FakeVoice(sample_rate=16000)
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    app = create_app(eng, AppConfig(warmup=False, body_timeout_s=0.2))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "path": "/v1/synthesize", "raw_path": b"/v1/synthesize", "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")]}

    async def run(messages):
        sent = []
        it = iter(messages)

        async def receive():
            m = next(it, None)
            if m is None:
                await asyncio.sleep(3600)  # a client that stalls
            return m

        async def send(m):
            sent.append(m)

        await asyncio.wait_for(app(dict(scope), receive, send), 10)
        return sent

    sent = asyncio.run(run([{"type": "http.request", "body": b'{"te', "more_body": True}, {"type": "http.disconnect"}]))
    assert sent == []  # nobody to answer
    sent = asyncio.run(run([{"type": "http.request", "body": b'{"te', "more_body": True}]))
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_timeout"
    counts = app.state.metrics.requests
    assert counts.labels("/v1/synthesize", "499")._value.get() == 1
    assert counts.labels("/v1/synthesize", "408")._value.get() == 1
    assert counts.labels("/v1/synthesize", "500")._value.get() == 0


def test_a_whole_answer_finished_after_its_client_left_counts_as_499_not_200():
    # The client sends its request and leaves; the answer is ready before the first poll. The
    # server must not count an answer that goes nowhere (uvicorn drops it silently) as a 200.
    import asyncio

    voice = FakeVoice(sample_rate=16000)
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    app = create_app(eng, AppConfig(warmup=False))
    body = json.dumps({"text": "Hello there.", "response_format": "pcm"}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "path": "/v1/synthesize", "raw_path": b"/v1/synthesize", "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}

    async def run():
        messages = iter([{"type": "http.request", "body": body, "more_body": False}])
        sent = []

        async def receive():  # then the client is gone: every later receive says so at once
            return next(messages, {"type": "http.disconnect"})

        async def send(m):
            sent.append(m)

        async with app.router.lifespan_context(app):
            await asyncio.wait_for(app(dict(scope), receive, send), 10)
        return sent

    sent = asyncio.run(run())
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] in ([], [499])
    assert not any(m.get("body") for m in sent)  # nothing encoded for no one
    counts = app.state.metrics.requests
    assert counts.labels("/v1/synthesize", "499")._value.get() == 1
    assert counts.labels("/v1/synthesize", "200")._value.get() == 0
