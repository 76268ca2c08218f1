"""A request that fails after its first bytes went out (here: its audio passes the request's
limit while it streams, `audio_too_long`) is logged once, by voxserve, with no traceback from the
server, and counted as itself: its error's status (413) in voxserve_requests_total and its code
in voxserve_failed_after_first_bytes_total, never as a 500. A raw stream is cut (the client sees
a broken transfer, not a short file that looks whole); an SSE stream ends with an error event.
Against a real uvicorn server (in a thread) on a free loopback port."""

from __future__ import annotations

import json
import logging
import re
import threading
import time

import httpx
import pytest
import uvicorn
from serve_fakes import FakeVoice
from server_process import free_port

from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.limits import Limits
from voxserve.serve.app import AppConfig, create_app, http_protocol

TEXT = " ".join(f"Sentence number {k} of a longer answer." for k in range(12))  # ~35 ms of audio each
CASES = {  # route: (path, body, how the failure shows)
    "speech": ("/v1/audio/speech", {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "mp3"}, "cut"),
    "synthesize": ("/v1/synthesize", {"text": TEXT, "response_format": "pcm", "stream": True}, "cut"),
    "captioned": ("/v1/audio/captioned_speech", {"model": "tts-1", "input": TEXT, "voice": "alloy",
                                                 "response_format": "pcm", "stream": True}, "cut"),
    "sse": ("/v1/audio/speech", {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "pcm",
                                 "stream_format": "sse"}, "event"),
}


class Captions(FakeVoice):
    word_timestamps = True  # for the captioned route (its words are not looked at here)


@pytest.fixture(scope="module")
def server():
    voice = Captions(sample_rate=16000, delay_s=0.02)
    voice.limits = Limits(max_audio_seconds=0.15)  # passed at the 4th or 5th sentence, while streaming
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_batch_size=1)))
    app = create_app(eng, AppConfig(warmup=False))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=http_protocol(app), log_config=None,
                            log_level="info", access_log=False)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if client.get("/ready").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    yield client, app
    client.close()
    srv.should_exit = True
    thread.join(30)


def counts(client) -> dict[tuple[str, str], float]:
    text = client.get("/metrics").text
    return {(m[1], m[2]): float(m[3]) for m in
            re.finditer(r'^voxserve_requests_total\{route="([^"]+)",status="(\d+)"\} ([0-9.e+]+)$', text, re.M)}


def failed_late(client, route: str, code: str) -> float:
    m = re.search(rf'^voxserve_failed_after_first_bytes_total\{{code="{code}",route="{re.escape(route)}"\}} (\S+)$',
                  client.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("case", CASES)
def test_a_failure_after_the_first_bytes_is_logged_once_and_counted_as_itself(server, case, caplog):
    client, app = server
    path, body, shows = CASES[case]
    before, late_before = counts(client), failed_late(client, path, "audio_too_long")
    caplog.set_level(logging.INFO)
    caplog.clear()
    got = bytearray()
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200  # the first bytes went out before the limit was passed
        if shows == "cut":
            with pytest.raises(httpx.RemoteProtocolError):  # no closing chunk: a broken transfer
                for b in r.iter_bytes():
                    got += b
            assert got  # some audio came first
        else:
            for b in r.iter_bytes():
                got += b
    if shows == "event":
        events = [json.loads(line[6:]) for line in got.decode().splitlines() if line.startswith("data: ")]
        assert events[0]["type"] == "speech.audio.delta"
        assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "audio_too_long"
    deadline = time.monotonic() + 5  # the guard counts as the response ends, on the server's side
    while counts(client).get((path, "413"), 0) == before.get((path, "413"), 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    after = counts(client)
    assert after.get((path, "413"), 0) == before.get((path, "413"), 0) + 1, after
    assert after.get((path, "500"), 0) == before.get((path, "500"), 0), after
    assert failed_late(client, path, "audio_too_long") == late_before + 1
    about = [rec for rec in caplog.records if rec.levelno >= logging.WARNING and "first bytes" in rec.getMessage()]
    assert len(about) == 1 and "audio_too_long" in about[0].getMessage(), [r.getMessage() for r in about]
    noisy = [rec for rec in caplog.records if rec.exc_info or rec.levelno >= logging.ERROR]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]  # no traceback, no "ASGI" error
