"""The proxy middleware on its own (no Ray): a request the app never answered is replayed once
with its body, then a 503 in voxserve's error shape; a started response is never retried."""

from __future__ import annotations

import asyncio
import json

import pytest

from voxserve.serve.ray_proxy import RetryUnanswered


def run(app, body: bytes = b'{"text": "hi"}', chunks: int = 1, replay_bytes: int = 1 << 20):
    """One POST through the middleware; (messages sent, bodies the app saw per attempt)."""
    sent = []
    step = -(-len(body) // chunks)
    parts = [body[i:i + step] for i in range(0, len(body), step)]
    incoming = [{"type": "http.request", "body": p, "more_body": i + 1 < len(parts)} for i, p in enumerate(parts)]

    async def receive():
        if incoming:
            return incoming.pop(0)
        await asyncio.sleep(3600)  # a client that stays connected

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/v1/synthesize", "headers": []}
    asyncio.run(asyncio.wait_for(RetryUnanswered(app, replay_bytes)(scope, receive, send), 10))
    return sent


class FlakyApp:
    """Reads the whole body, then fails to answer `failures` times (returns or raises), then answers."""

    def __init__(self, failures: int, raise_: bool = False):
        self.failures, self.raise_, self.bodies = failures, raise_, []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.bodies.append(body)
        if len(self.bodies) <= self.failures:
            if self.raise_:
                raise RuntimeError("replica died")
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"audio:" + body})


@pytest.mark.parametrize("raise_", [False, True])
def test_unanswered_request_is_replayed_once_with_its_body(raise_):
    app = FlakyApp(1, raise_)
    sent = run(app, b'{"text": "a body in three chunks"}', chunks=3)
    assert app.bodies == [b'{"text": "a body in three chunks"}'] * 2
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"audio:" + app.bodies[0]
    assert (b"x-voxserve-retried", b"1") in sent[0]["headers"]


def test_unanswered_twice_is_a_503_in_the_error_shape():
    app = FlakyApp(2)
    sent = run(app)
    assert len(app.bodies) == 2
    assert sent[0]["status"] == 503 and (b"retry-after", b"1") in sent[0]["headers"]
    err = json.loads(sent[1]["body"])["error"]
    assert err["code"] == "replica_failed" and err["type"] == "server_error" and "stopped" in err["message"]


def test_body_over_the_replay_bound_is_not_retried():
    app = FlakyApp(1)
    sent = run(app, b"x" * 100, replay_bytes=50)
    assert len(app.bodies) == 1 and sent[0]["status"] == 503


def test_started_response_is_not_retried():
    calls = []

    async def app(scope, receive, send):
        calls.append(1)
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("replica died mid-stream")

    with pytest.raises(RuntimeError, match="mid-stream"):
        run(app)
    assert len(calls) == 1


def test_the_earlier_import_path_still_names_the_middlewares():
    """Clusters set up from earlier docs name `voxserve.ray_proxy:proxy_middlewares`."""
    import voxserve.ray_proxy
    import voxserve.serve.ray_proxy

    assert voxserve.ray_proxy.proxy_middlewares is voxserve.serve.ray_proxy.proxy_middlewares
