"""The encoder of a streamed response is closed only after its last write returns, whatever the
client does (a codec closed under a running write crashed the server: SIGSEGV in libsndfile,
SIGABRT in LAME or libopus). Deterministic: the write is held at a gate while the client leaves.
The same crash against a real server, at random points: test_disconnects.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest
from serve_fakes import FakeVoice

import voxserve.serve.service as app_module
from voxserve.audio import EncoderOwner, StreamEncoder, open_stream_encoder
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.serve.app import AppConfig, create_app


class GatedEncoder(StreamEncoder):
    """A real encoder whose first write waits at a gate; it records a close that comes while a
    write is running and any write after the close."""

    def __init__(self, inner: StreamEncoder):
        super().__init__(inner.in_rate)
        self.inner, self.sample_rate, self.media_type = inner, inner.sample_rate, inner.media_type
        self.entered, self.release = threading.Event(), threading.Event()
        self.writing = 0
        self.closes = 0
        self.closed_under_write = False
        self.writes_after_close = 0

    def write(self, samples: np.ndarray) -> bytes:
        self.writing += 1
        try:
            if not self.entered.is_set():
                self.entered.set()
                self.release.wait(10)
            if self.closes:
                self.writes_after_close += 1
                return b""
            return self.inner.write(samples)
        finally:
            self.writing -= 1

    def close(self) -> bytes:
        if self.writing:
            self.closed_under_write = True
        self.closes += 1
        return self.inner.close() if self.closes == 1 else b""


def test_owner_defers_a_close_asked_for_during_a_write():
    enc = GatedEncoder(open_stream_encoder("mp3", 22050))
    owner = EncoderOwner(enc)
    x = (0.3 * np.sin(np.arange(22050) / 7)).astype(np.float32)
    got = []
    writer = threading.Thread(target=lambda: got.append(owner.write(x)))
    writer.start()
    assert enc.entered.wait(10)
    t0 = time.monotonic()
    owner.abandon()  # the client left: must not wait for the write, nor close under it
    assert time.monotonic() - t0 < 1.0 and enc.closes == 0
    enc.release.set()
    writer.join(10)
    assert got == [b""]  # bytes of an abandoned response go nowhere
    assert enc.closes == 1 and not enc.closed_under_write
    assert owner.write(x) == b"" and owner.finish() == b"" and enc.writes_after_close == 0
    owner.abandon()
    assert enc.closes == 1


def test_owner_finish_gives_the_tail_once():
    owner = EncoderOwner(open_stream_encoder("opus", 24000))
    x = (0.3 * np.sin(np.arange(24000) / 7)).astype(np.float32)
    data = owner.write(x) + owner.finish()
    assert data[:4] == b"OggS" and owner.finish() == b""
    owner.abandon()  # after the end: nothing left to close


SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
         "method": "POST", "raw_path": b"", "query_string": b"", "root_path": "", "scheme": "http",
         "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
TEXT = " ".join(f"Sentence number {k} of a longer answer." for k in range(12))
ROUTES = {
    "speech": ("/v1/audio/speech", {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "mp3"}),
    "speech_sse": ("/v1/audio/speech", {"model": "tts-1", "input": TEXT, "voice": "alloy",
                                        "response_format": "opus", "stream_format": "sse"}),
    "synthesize_stream": ("/v1/synthesize", {"text": TEXT, "response_format": "aac", "stream": True}),
}


@pytest.mark.parametrize("route", ROUTES)
def test_a_client_leaving_during_a_write_never_closes_the_encoder_under_it(route, monkeypatch):
    path, body = ROUTES[route]
    made: list[GatedEncoder] = []

    def gated(fmt, rate):
        made.append(GatedEncoder(open_stream_encoder(fmt, rate)))
        return made[-1]

    monkeypatch.setattr(app_module, "open_stream_encoder", gated)
    eng = Engine([FakeVoice(sample_rate=24000)], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    app = create_app(eng, AppConfig(warmup=False))
    data = json.dumps(body).encode()
    scope = SCOPE | {"path": path, "headers": [(b"content-type", b"application/json"),
                                               (b"content-length", str(len(data)).encode())]}

    async def run():
        sent, first = [], [True]

        async def receive():
            if first[0]:
                first[0] = False
                return {"type": "http.request", "body": data, "more_body": False}
            while not (made and made[0].entered.is_set()):  # the client leaves mid-write
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(m):
            sent.append(m)

        async with app.router.lifespan_context(app):
            await asyncio.wait_for(app(dict(scope), receive, send), 20)
            enc = made[0]
            assert enc.closes == 0 or enc.closed_under_write, "closed before the write was let go"
            enc.release.set()  # the write goes on after the response is over, then returns
            deadline = time.monotonic() + 10
            while (enc.writing or not enc.closes) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        return sent

    sent = asyncio.run(run())
    enc = made[0]
    assert not enc.closed_under_write, "the encoder was closed while a write was running in it"
    assert enc.closes == 1 and enc.writes_after_close == 0
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [200]
    counts = app.state.metrics.requests
    assert counts.labels(path, "499")._value.get() == 1 and counts.labels(path, "500")._value.get() == 0
