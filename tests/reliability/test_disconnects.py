"""A client that leaves at any point of an answer never takes the server down.

Every route and format that encodes (the OpenAI route streamed and as SSE, /v1/synthesize
streamed and whole, captioned speech whole and streamed, the playground's download request, and
the Wyoming server) gets clients that close right after sending, after the first bytes and
mid-answer (some with a reset), first one by one right after the server starts and then all at
once. The server is the reliability tests' real `voxserve serve` subprocess (conftest.py), run
with faulthandler on: a native crash (closing a codec under a write killed it with SIGSEGV or
LAME's SIGABRT) fails the test with the stack it printed. Afterwards the server must still
answer a normal request with the same audio as before, and have counted no 5xx and logged no
traceback for any of it.
"""

from __future__ import annotations

import io
import json
import re
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

TEXT = " ".join(f"This is sentence number {k} of a long answer." for k in range(1, 7))
LONG = {"sentence_silence": 6.0}
"""~32 s of audio (the server's bound is 60 s), most of it silence that is encoded like speech:
each write of a codec takes long enough that a client leaving lands in one (with speech alone,
the tiny voice's writes are too short to be hit often)."""
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
VOICE = "tiny-multi"


def speech(fmt: str) -> dict:
    return {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": fmt} | LONG


ROUTES = {  # name: (path, body for a format, formats); flac on /v1/audio/speech is sent whole
    "speech": ("/v1/audio/speech", speech, FORMATS),
    "speech_sse": ("/v1/audio/speech", lambda f: speech(f) | {"stream_format": "sse"}, FORMATS),
    "synthesize_stream": ("/v1/synthesize",
                          lambda f: {"text": TEXT, "voice": VOICE, "response_format": f, "stream": True} | LONG, FORMATS),
    "synthesize_whole": ("/v1/synthesize",
                         lambda f: {"text": TEXT, "voice": VOICE, "response_format": f} | LONG, FORMATS),
    "captioned": ("/v1/audio/captioned_speech", speech, FORMATS),
    "captioned_stream": ("/v1/audio/captioned_speech", lambda f: speech(f) | {"stream": True}, ("pcm", "wav")),
    # the playground's download: the WAV it played, sent back to be encoded (static/playground.js
    # finish), in the formats the server encodes for it
    "playground_download": ("/v1/audio/encode?response_format={fmt}", lambda f: played_wav(),
                            ("mp3", "opus", "aac", "flac")),
}
WHOLE = {("synthesize_whole", f) for f in FORMATS} | {("captioned", f) for f in FORMATS} | {
    ("speech", "flac")} | {("playground_download", f) for f in FORMATS}
"""Answers sent whole once made: their client can leave only before the first byte."""
POINTS = ("sent", "first_bytes", "mid_answer")


def played_wav(seconds: float = 30.0, rate: int = 16000) -> bytes:
    """What the playground sends to be encoded: a 16-bit mono WAV (here noise: every codec write
    takes its full time)."""
    import numpy as np

    from voxserve.audio import wav_header

    samples = (np.random.default_rng(0).standard_normal(int(seconds * rate)) * 3000).astype("<i2")
    return wav_header(rate, len(samples)) + samples.tobytes()

WHOLE_POINTS = ("sent", "mid_answer")


def _connect(port: int, reset: bool = False) -> socket.socket:
    k = socket.create_connection(("127.0.0.1", port), timeout=30)
    if reset:  # close with RST instead of FIN: the server's next write fails at once
        k.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return k


def _http_request(path: str, body: dict | bytes) -> bytes:
    """A JSON body, or bytes: a WAV (the encode route's)."""
    data, media = (body, "audio/wav") if isinstance(body, bytes) else (json.dumps(body).encode(), "application/json")
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {media}\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def _recv_until(k: socket.socket, done) -> bytes:
    got = b""
    while not done(got):
        try:
            b = k.recv(65536)
        except (TimeoutError, OSError):
            break
        if not b:
            break
        got += b
    return got


def _body_bytes(got: bytes) -> int:
    head, sep, rest = got.partition(b"\r\n\r\n")
    return len(rest) if sep else 0


def leave_http(port: int, path: str, body: dict | bytes, point: str, whole: bool = False) -> None:
    """One request whose client closes at `point`: 50 ms after sending it (the report's case),
    at its first body bytes, or mid-answer with a reset: 0.2 s after the first bytes (a whole
    answer: 0.3 s after sending, while it is being made)."""
    k = _connect(port, reset=point == "mid_answer")
    try:
        k.sendall(_http_request(path, body))
        if point == "sent":
            time.sleep(0.05)
        elif point == "first_bytes":
            _recv_until(k, lambda got: _body_bytes(got) > 0)
        elif whole:
            time.sleep(0.3)
        else:
            _recv_until(k, lambda got: _body_bytes(got) > 0)
            k.settimeout(0.2)
            _recv_until(k, lambda got: False)
    finally:
        k.close()


def _wyoming_events(streamed: bool) -> bytes:
    def event(type_: str, data: dict | None = None) -> bytes:
        return (json.dumps({"type": type_, "data": data or {}}) + "\n").encode()

    voice = {"voice": {"name": VOICE}}
    if not streamed:
        return event("synthesize", {"text": TEXT} | voice)
    return event("synthesize-start", voice) + event("synthesize-chunk", {"text": TEXT}) + event("synthesize-stop")


def leave_wyoming(port: int, streamed: bool, point: str) -> None:
    k = _connect(port, reset=point == "mid_answer")
    try:
        k.sendall(_wyoming_events(streamed))
        if point == "sent":
            time.sleep(0.05)
        elif point == "first_bytes":
            _recv_until(k, lambda got: b"audio-chunk" in got)
        else:
            _recv_until(k, lambda got: b"audio-chunk" in got)
            k.settimeout(0.2)
            _recv_until(k, lambda got: False)
    finally:
        k.close()


def all_cases(s) -> list[tuple]:
    """(function, *args) of every route, format and point."""
    cases = []
    for name, (path, body, formats) in ROUTES.items():
        for fmt in formats:
            whole = (name, fmt) in WHOLE
            cases += [(leave_http, s.port, path.format(fmt=fmt), body(fmt), point, whole)
                      for point in (WHOLE_POINTS if whole else POINTS)]
    if s.wyoming_port is not None:
        cases += [(leave_wyoming, s.wyoming_port, streamed, point) for streamed in (False, True) for point in POINTS]
    return cases


def run_case(case: tuple) -> None:
    fn, *args = case
    try:
        fn(*args)
    except OSError:  # refused or reset: the server is gone, which assert_alive then shows
        pass


def assert_alive(s) -> None:
    code = s.proc.poll()
    if code is not None:
        log = s.log_path.read_text(errors="replace")
        pytest.fail(f"the server died (exit {code}); the end of its log:\n{log[-6000:]}")
    assert s.client.get("/health").status_code == 200


def reference(s) -> bytes:
    """A short deterministic answer (pcm): equal before and after the disconnects."""
    r = s.client.post("/v1/synthesize", json={"text": "Hello there. All is well.", "voice": VOICE,
                                              "response_format": "pcm", "seed": 3})
    assert r.status_code == 200, r.text
    return r.content


def counts(s) -> dict[tuple[str, str], float]:
    text = s.client.get("/metrics").text
    return {(m[1], m[2]): float(m[3]) for m in
            re.finditer(r'^voxserve_requests_total\{route="([^"]+)",status="(\d+)"\} ([0-9.e+]+)$', text, re.M)}


def test_disconnects_right_after_start_and_under_load_leave_the_server_serving(http_server):
    s = http_server
    log_from, counts_before = s.log_path.stat().st_size, counts(s)
    # right after /ready, one at a time: the report's three mp3 requests closed after 50 ms, then
    # the same for every route and format
    for fmt in ("mp3", "aac", "opus"):
        for _ in range(3):
            run_case((leave_http, s.port, "/v1/audio/speech", speech(fmt), "sent"))
        assert_alive(s)
    cases = all_cases(s)
    for case in cases:
        if "sent" in case:
            run_case(case)
    assert_alive(s)
    before = reference(s)
    # under load: every route, format and point at once, on 16 client threads
    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(run_case, case) for case in cases]:
            f.result()
    assert_alive(s)
    # the left requests' work is cancelled and nothing was a server error
    deadline = time.monotonic() + 60
    while s.metric("voxserve_in_flight_requests") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s.metric("voxserve_in_flight_requests") == 0
    assert_alive(s)
    assert reference(s) == before
    r = s.client.post("/v1/audio/speech", json=speech("mp3") | {"input": "Still here."})
    assert r.status_code == 200 and r.content
    import av

    with av.open(io.BytesIO(r.content)) as c:
        samples = sum(f.samples for f in c.decode(audio=0))
    assert samples > 0
    bad = {k: v for k, v in counts(s).items() if k[1].startswith("5") and v != counts_before.get(k, 0)}
    assert not bad, bad
    with open(s.log_path, "rb") as f:
        f.seek(log_from)
        log = f.read().decode(errors="replace")
    assert not re.search(r"(?i)traceback|error|exception", log), log[-6000:]  # a client leaving is no failure
