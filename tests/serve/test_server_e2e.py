"""`voxserve serve` as a real subprocess on a free loopback port. Traffic goes to 127.0.0.1 only,
bounded in count and time (every request has a timeout; every server is stopped)."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from audio_compare import assert_pcm_close
from server_process import ROOT, ServerProcess

import voxserve
from voxserve.audio import float_to_int16
from voxserve.families.piper import PiperOptions


@pytest.fixture(scope="module")
def tiny_env(tiny_voice_path):
    return {"VOXSERVE_VOICES_PATH": str(tiny_voice_path.parent)}


@pytest.fixture(scope="module")
def server(tiny_env):
    s = ServerProcess(["--voice", "en_US-joe-medium", "--voice", "tiny-multi", "--max-batch-size", "4",
                "--max-queued-sentences", "1024", "--max-queue-wait-s", "3600"], env=tiny_env)  # all accepted: it tests mixing
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tiny_voice(tiny_voice_path):
    return voxserve.load_voice(str(tiny_voice_path), device="cpu")


def long_text(n: int) -> str:
    return " ".join(f"This is sentence number {k} of a long text that streams." for k in range(1, n + 1))


def pcm(r) -> np.ndarray:
    return np.frombuffer(r.content, dtype="<i2")


def test_32_concurrent_mixed_requests_match_direct_synthesis(server, tiny_voice, corpus):
    texts = [r["text"] for r in corpus if r["category"] in ("short", "medium", "long")]
    jobs = [(texts[k % len(texts)], k % 3, k % 2 == 0) for k in range(32)]  # text, speaker, stream

    def call(job):
        text, speaker, stream = job
        body = {"text": text, "voice": "tiny-multi", "speaker": speaker, "noise_scale": 0, "noise_w": 0,
                "response_format": "pcm", "stream": stream}
        return server.client.post("/v1/synthesize", json=body)

    with ThreadPoolExecutor(32) as pool:
        responses = list(pool.map(call, jobs))
    assert [r.status_code for r in responses] == [200] * 32
    for (text, speaker, _), r in zip(jobs, responses):
        ref = float_to_int16(tiny_voice.synthesize(text, PiperOptions(noise_scale=0, noise_w=0,
                                                                                    speaker=speaker)).samples)
        assert_pcm_close(pcm(r), ref, text[:40])


def test_joe_voice_parity_and_openai_voice_alias(server, joe_voice):
    text = "The train to Boston leaves from platform nine. Please hold while I transfer your call."
    r = server.client.post("/v1/synthesize", json={"text": text, "noise_scale": 0, "noise_w": 0,
                                                   "response_format": "pcm"})
    assert r.status_code == 200 and r.headers["x-sample-rate"] == "22050"
    ref = float_to_int16(joe_voice.synthesize(text, voxserve.DETERMINISTIC).samples)
    assert_pcm_close(pcm(r), ref, text[:40])


def test_streaming_first_bytes_before_last_sentence(server):
    n = 30
    before = server.metric("voxserve_sentences_synthesized_total")
    with server.client.stream("POST", "/v1/audio/speech", json={"model": "tts-1", "voice": "alloy",
                                                                "input": long_text(n), "response_format": "pcm"}) as r:
        assert r.status_code == 200
        it = r.iter_bytes()
        first = next(it)
        assert first
        done_at_first_bytes = server.metric("voxserve_sentences_synthesized_total") - before
        rest = b"".join(it)
    assert done_at_first_bytes < n, done_at_first_bytes
    assert len(first) + len(rest) > 22050 * 2 * n  # more than a second a sentence came back
    assert server.metric("voxserve_sentences_synthesized_total") - before == n


def test_client_disconnect_stops_the_work(server):
    n = 60
    before = server.metric("voxserve_sentences_synthesized_total")
    with server.client.stream("POST", "/v1/audio/speech", json={"model": "tts-1", "voice": "alloy",
                                                                "input": long_text(n), "response_format": "pcm"}) as r:
        assert r.status_code == 200
        next(r.iter_bytes())
    # the connection is closed: wait until nothing more is being synthesised
    last, _ = server.wait_settled("voxserve_sentences_synthesized_total", quiet_s=1.5, timeout_s=60)
    run = last - before
    # the first sentence, the batch in flight and at most one more batch of 4: never the rest
    assert run <= 1 + 2 * 4, run
    assert server.metric("voxserve_sentences_dropped") > 0
    assert server.metric("voxserve_in_flight_requests") == 0
    assert server.client.get("/health").status_code == 200


def test_openai_sdk_create_and_streaming(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello from the SDK.", response_format="wav")
    assert audio.content[:4] == b"RIFF" and len(audio.content) > 44 + 22050
    got = bytearray()
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="nova", input="One. Two. Three.",
                                                            response_format="pcm", speed=1.25) as resp:
        assert resp.headers["x-sample-rate"] == "22050"
        for chunk in resp.iter_bytes(4096):
            got += chunk
    assert len(got) > 22050  # about a second and a half of s16le
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model="tts-1", voice="alloy", input="", response_format="mp3")
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="tts-1", voice="not-a-voice", input="Hi.", response_format="mp3")


def test_openai_sdk_sse_voice_object_and_current_model(server):
    """The SDK's own calls with what it offers today: stream_format="sse", a voice object, the
    dated model id, instructions; the SSE deltas decode to the same samples as the audio stream."""
    openai = pytest.importorskip("openai")
    import base64
    import json

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    kw = dict(model="gpt-4o-mini-tts-2025-12-15", input="One. Two. Three.", response_format="pcm",
              instructions="Calm and clear.", extra_body={"noise_scale": 0.0, "noise_w": 0.0})
    plain = client.audio.speech.create(voice={"id": "en_US-joe-medium"}, **kw).content
    events = []
    with client.audio.speech.with_streaming_response.create(voice="alloy", stream_format="sse", **kw) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    assert events[-1]["type"] == "speech.audio.done" and len(events) >= 2
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(plain) > 22050 and audio == plain
    assert events[-1]["usage"]["output_tokens"] == len(plain) // 2


def test_loadtest_against_the_server(server, corpus):
    """`voxserve loadtest`'s run against a real server: every request succeeds, and the audio it
    counts is the audio of the texts it sent (PCM length / rate; durations are sampled, so a
    second synthesis of the same texts differs by a few percent)."""
    from voxserve.loadtest import LoadConfig, request_order, run_load

    cfg = LoadConfig(url=server.url, clients=3, requests=6, categories=("short",), warmup=1,
                     corpus=str(ROOT / "corpus" / "en_bench.jsonl"), timeout_s=60)
    s = run_load(cfg)
    assert s["all"]["ok"] == 6 and s["all"]["errors"] == {}, s["all"]
    assert s["all"]["latency_p50_s"] > 0 and s["all"]["ttfa_p50_s"] <= s["all"]["latency_p95_s"]
    shorts = [r for r in corpus if r["category"] == "short"]
    sent = [shorts[request_order(len(shorts))[n]]["text"] for n in range(6)]
    direct = sum(len(server.client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": t,
                                                                   "response_format": "pcm"}).content)
                 for t in sent) / 2 / 22050
    assert s["all"]["audio_s"] == pytest.approx(direct, rel=0.1)


def test_every_error_status_over_the_wire(server):
    c = server.client
    base = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}
    cases = [
        (c.post("/v1/audio/speech", json=base | {"input": ""}), 400),
        (c.post("/v1/audio/speech", json=base | {"speed": 9}), 400),
        (c.post("/v1/synthesize", json={"text": "Hi.", "voice": "tiny-multi", "speaker": "spk9"}), 400),
        (c.post("/v1/audio/speech", json=base | {"voice": "../../etc/passwd"}), 404),
        (c.post("/v1/audio/speech", json=base | {"input": "x" * 5000}), 413),
        (c.post("/v1/audio/speech", content=b"{" + b" " * (2 << 20) + b"}",
                headers={"content-type": "application/json"}), 413),
        (c.post("/v1/audio/speech", json={"input": "Hi."}), 422),
    ]
    for r, status in cases:
        assert r.status_code == status, (status, r.text)
        assert set(r.json()["error"]) >= {"message", "type", "code"}
    assert c.get("/health").status_code == 200


@pytest.fixture(scope="module")
def small_server(tiny_env):
    s = ServerProcess(["--max-queued-sentences", "3", "--max-batch-size", "1"], env={**tiny_env, "VOXSERVE_API_KEY": "k3y"},
               api_key="k3y")
    yield s
    s.stop()


def test_api_key_from_environment(small_server):
    url = small_server.url
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.get(url + "/v1/voices", timeout=10).status_code == 401
    assert httpx.get(url + "/v1/voices", timeout=10, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert small_server.client.get("/v1/voices").status_code == 200


def test_overload_429_then_healthy_and_accepted_requests_complete(small_server, corpus):
    text = next(r["text"] for r in corpus if r["id"] == "medium-06")  # several sentences

    def call(_):  # deterministic, so every complete answer has the same length
        return small_server.client.post("/v1/synthesize", json={"text": text, "noise_scale": 0, "noise_w": 0,
                                                                "response_format": "pcm", "stream": True})

    with ThreadPoolExecutor(12) as pool:
        rs = list(pool.map(call, range(12)))
    statuses = sorted(r.status_code for r in rs)
    assert 429 in statuses and 200 in statuses and set(statuses) <= {200, 429}, statuses
    ok = [pcm(r) for r in rs if r.status_code == 200]
    assert len({len(x) for x in ok}) == 1 and len(ok[0]) > 22050  # every accepted one is whole
    for r in rs:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "overloaded"
    assert small_server.client.get("/health").status_code == 200
    assert call(0).status_code == 200


def test_graceful_shutdown_finishes_in_flight_request(small_server):
    result = {}

    def stream():
        with small_server.client.stream("POST", "/v1/audio/speech", json={
                "model": "tts-1", "voice": "alloy", "input": long_text(6), "response_format": "pcm"}) as r:
            it = r.iter_bytes()
            result["first"] = next(it)
            started.set()
            result["rest"] = b"".join(it)
            result["status"] = r.status_code

    started = threading.Event()
    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    small_server.proc.send_signal(signal.SIGTERM)
    t.join(90)
    assert result.get("status") == 200
    n = len(result["first"]) + len(result["rest"])
    assert n > 22050 * 2 * 6  # all six sentences (over a second each) arrived
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly
    assert small_server.proc.wait(60) in (0, -signal.SIGTERM)
