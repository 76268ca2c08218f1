"""/v1/audio/speech/stream end to end: a real WebSocket client (`websockets`) against the app
served by uvicorn on 127.0.0.1. Text split mid-word, two clients at once, a client that stops
reading, a disconnect mid-sentence (nothing left in flight or queued), the API key and the bounds."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
from serve_fakes import FakeVoice
from server_process import serving_in_thread
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from voxserve.audio import float_to_int16
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.serve.app import AppConfig, create_app

PATH = "/v1/audio/speech/stream"


class LongVoice(FakeVoice):
    """A sentence's audio is 10 s (320 kB of pcm): a few fill the socket buffers of a client
    that does not read."""

    @staticmethod
    def audio_for(sentence: str, sample_rate: int = 16000) -> np.ndarray:
        return np.full(10 * sample_rate, 0.25, dtype=np.float32)


@contextmanager
def serving(voice, max_batch_size: int = SchedulerConfig.max_batch_size, **config):
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_batch_size=max_batch_size)))
    app = create_app(eng, AppConfig(warmup=False, **config))
    with serving_in_thread(app) as (port, client):
        yield port, app, client


def ws(port: int, key: str | None = None, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return connect(f"ws://127.0.0.1:{port}{PATH}", additional_headers=headers, proxy=None, open_timeout=10,
                   close_timeout=5, **kw)


def read_all(c, timeout: float = 30) -> tuple[bytes, list[dict]]:
    """The audio and the JSON messages until the server closes."""
    audio, msgs = bytearray(), []
    try:
        while True:
            m = c.recv(timeout=timeout)
            if isinstance(m, bytes):
                audio += m
            else:
                msgs.append(json.loads(m))
    except ConnectionClosed:
        pass
    return bytes(audio), msgs


def start(c, **fields) -> dict:
    c.send(json.dumps({"type": "start", "response_format": "pcm", **fields}))
    reply = json.loads(c.recv(timeout=30))
    assert reply["type"] == "start", reply
    return reply


def pcm_of(voice: FakeVoice, sentences: list[str]) -> bytes:
    return b"".join(float_to_int16(voice.audio_for(s, voice.sample_rate)).tobytes() for s in sentences)


def settled(app, timeout: float = 20) -> bool:
    """Nothing of any session left: no request in flight, no sentence queued, no session open."""
    svc, eng = app.state.service, app.state.engine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if eng.in_flight == 0 and eng.queued_sentences() == 0 and svc.stream_sessions == 0:
            return True
        time.sleep(0.05)
    return False


def counted(client, status: str) -> float:
    m = re.search(rf'^voxserve_requests_total\{{route="{re.escape(PATH)}",status="{status}"\}} (\S+)$',
                  client.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_text_split_mid_word_is_spoken_sentence_by_sentence_as_each_completes():
    voice = FakeVoice(sample_rate=16000)
    with serving(voice) as (port, app, client), ws(port) as c:
        reply = start(c, voice="alloy")
        assert reply["sample_rate"] == 16000 and reply["format"] == "pcm"
        for piece in ("Hel", "lo wor", "ld. How a"):
            c.send(json.dumps({"type": "text", "text": piece}))
        # the first sentence is spoken before the text is over: its audio comes now
        first = c.recv(timeout=30)
        assert isinstance(first, bytes) and len(first) > 0
        assert voice.run_texts == ["Hello world"]
        for piece in ("re yo", "u? Fi", "ne"):
            c.send(json.dumps({"type": "text", "text": piece}))
        c.send(json.dumps({"type": "end"}))
        audio, msgs = read_all(c)
        assert msgs[-1]["type"] == "done" and msgs[-1]["sentences"] == 3, msgs
        assert c.close_code == 1000
    assert sorted(voice.run_texts) == ["Fine", "Hello world", "How are you?"]  # (run in any order)
    assert first + audio == pcm_of(voice, ["Hello world", "How are you?", "Fine"])
    assert settled(app)


def test_two_clients_at_once_each_get_their_own_audio():
    voice = FakeVoice(sample_rate=16000, delay_s=0.01)
    texts = {0: ["First client speaks.", " Then it ", "stops. Done."], 1: ["Other one ta", "lks here. And more."]}
    want = {0: ["First client speaks", "Then it stops", "Done"], 1: ["Other one talks here", "And more"]}
    got: dict[int, bytes] = {}
    errors: list[BaseException] = []
    with serving(voice) as (port, app, client):
        def run(k):
            try:
                with ws(port) as c:
                    start(c)
                    for piece in texts[k]:
                        c.send(json.dumps({"type": "text", "text": piece}))
                        time.sleep(0.01)
                    c.send(json.dumps({"type": "end"}))
                    got[k] = read_all(c)[0]
            except BaseException as e:  # reported by the test thread
                errors.append(e)

        threads = [threading.Thread(target=run, args=(k,)) for k in texts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert settled(app)
    for k in texts:
        assert got[k] == pcm_of(voice, want[k])


def test_a_client_that_stops_reading_is_closed_and_leaves_nothing_behind():
    voice = LongVoice(sample_rate=16000, delay_s=0.01)
    text = " ".join(f"Sentence {k} is here." for k in range(60))  # 10 minutes of audio, 19 MB of pcm
    with serving(voice, stream_idle_timeout_s=1.0) as (port, app, client):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        sock.connect(("127.0.0.1", port))
        with ws(port, sock=sock, max_queue=1, compression=None) as c:
            start(c)
            c.send(json.dumps({"type": "text", "text": text}))
            c.send(json.dumps({"type": "end"}))
            # the client reads nothing more: the server must give up on it, not hold its audio
            deadline = time.monotonic() + 30
            while counted(client, "400") < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert counted(client, "400") == 1
            assert settled(app)
            with pytest.raises(ConnectionClosed):  # what it had not read, then the server's close
                while True:
                    c.recv(timeout=10)


def test_a_disconnect_mid_sentence_leaves_nothing_in_flight_or_queued():
    voice = FakeVoice(sample_rate=16000)
    voice.gate = threading.Event()  # the first batch waits: the client leaves while it runs
    with serving(voice, max_batch_size=1) as (port, app, client):  # (so the others wait in the queue)
        with ws(port) as c:
            start(c)
            c.send(json.dumps({"type": "text", "text": "One is here. Two is here. Three is here. Fo"}))
            deadline = time.monotonic() + 20
            while app.state.engine.in_flight < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert app.state.engine.in_flight == 3
        # (closed)
        while counted(client, "499") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        voice.gate.set()
        assert settled(app)
        assert counted(client, "499") == 1
        assert "Three is here" not in voice.run_texts


def test_the_api_key_is_needed_as_on_the_other_routes():
    voice = FakeVoice(sample_rate=16000)
    with serving(voice, api_key="sekret") as (port, app, client):
        with pytest.raises(InvalidStatus) as e:
            ws(port)
        assert e.value.response.status_code == 401
        assert json.loads(e.value.response.body)["error"]["code"] == "invalid_api_key"
        with pytest.raises(InvalidStatus):
            ws(port, key="wrong")
        with ws(port, key="sekret") as c:
            start(c)
            c.send(json.dumps({"type": "text", "text": "Hello there."}))
            c.send(json.dumps({"type": "end"}))
            audio, msgs = read_all(c)
        assert audio == pcm_of(voice, ["Hello there"]) and msgs[-1]["type"] == "done"


def error_of(c) -> tuple[dict, int]:
    _, msgs = read_all(c)
    assert msgs and msgs[-1]["type"] == "error", msgs
    return msgs[-1]["error"], c.close_code


@pytest.mark.parametrize("first,code", [
    ({"type": "start", "voice": "nobody"}, "voice_not_found"),
    ({"type": "start", "response_format": "flac"}, "invalid_schema"),
    ({"type": "start", "speed": 99.0}, "invalid_option"),
    ({"type": "start", "speaker": "zed"}, "invalid_input"),
    ({"type": "text", "text": "hi"}, "bad_sequence"),
])
def test_a_bad_start_is_refused_with_the_speech_routes_error(first, code):
    with serving(FakeVoice(sample_rate=16000)) as (port, app, client), ws(port) as c:
        c.send(json.dumps(first))
        err, close = error_of(c)
        assert err["code"] == code and close == 1008
        assert settled(app)


def test_bounds_connections_message_size_text_held_and_idle_time():
    voice = FakeVoice(sample_rate=16000)
    with serving(voice, stream_max_connections=1, max_input_chars=100, stream_idle_timeout_s=0.5) as (port, app, _):
        with ws(port) as c1:
            start(c1)
            with ws(port) as c2:  # one session at most
                err, close = error_of(c2)
                assert err["code"] == "too_many_connections" and close == 1013
            c1.send(json.dumps({"type": "text", "text": "x" * 101}))  # one sentence over the bound
            err, close = error_of(c1)
            assert err["code"] == "input_too_long"
        with ws(port) as c:
            c.send("{" + " " * (70 * 1024) + "}")
            err, close = error_of(c)
            assert err["code"] == "message_too_large" and close == 1009
        with ws(port) as c:
            start(c)
            err, close = error_of(c)  # says nothing, and no audio is owed to it
            assert err["code"] == "idle_timeout" and close == 1008
        assert settled(app)


def test_text_ahead_of_the_audio_waits_for_room_rather_than_failing():
    voice = FakeVoice(sample_rate=16000, delay_s=0.02)
    sentences = [f"Sentence number {k} here." for k in range(40)]  # ~1000 characters, bound 100
    with serving(voice, max_input_chars=100) as (port, app, _), ws(port) as c:
        start(c)
        for s in sentences:
            c.send(json.dumps({"type": "text", "text": s + " "}))
        c.send(json.dumps({"type": "end"}))
        audio, msgs = read_all(c)
        assert msgs[-1]["type"] == "done" and msgs[-1]["sentences"] == 40
        assert audio == pcm_of(voice, [s.rstrip(".") for s in sentences])


def test_word_timings_come_as_json_before_each_sentences_audio(joe_voice):
    with serving(joe_voice) as (port, app, _), ws(port) as c:
        reply = start(c, seed=1)
        rate = reply["sample_rate"]
        for piece in ("The quick brown fo", "x jumps. Over the la", "zy dog."):
            c.send(json.dumps({"type": "text", "text": piece}))
        c.send(json.dumps({"type": "end"}))
        audio, msgs = read_all(c, timeout=120)
    words = [m for m in msgs if m["type"] == "words"]
    assert [m["index"] for m in words] == [0, 1]
    assert [w["word"] for w in words[0]["words"]][:2] == ["The", "quick"]
    seconds = len(audio) / 2 / rate
    assert words[1]["offset"] > words[0]["words"][-1]["end"] - 1e-6
    assert 0 < words[1]["words"][-1]["end"] <= seconds + 1e-3


def test_a_session_outlasting_the_request_head_timeout_is_not_cut():
    # the HTTP protocol's head timer must stop at the upgrade: it once wrote a 408 into the
    # WebSocket's frames and closed the connection after header_timeout_s
    voice = FakeVoice(sample_rate=16000, delay_s=0.3)
    with serving(voice, header_timeout_s=0.5) as (port, app, client), ws(port) as c:
        start(c)
        for k in range(4):
            c.send(json.dumps({"type": "text", "text": f"Sentence {k} here. "}))
            time.sleep(0.3)
        c.send(json.dumps({"type": "end"}))
        audio, msgs = read_all(c)
        assert msgs[-1]["type"] == "done" and c.close_code == 1000
        assert audio == pcm_of(voice, [f"Sentence {k} here" for k in range(4)])
