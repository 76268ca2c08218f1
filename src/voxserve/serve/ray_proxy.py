"""A middleware for Ray Serve's HTTP proxy: a request whose replica died before answering is
sent once more (to a live replica), and if that fails too the client gets a 503 in voxserve's
error shape instead of the proxy's bare "500 Internal Server Error".

Ray loads it in every proxy from `RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=PROXY_CALLBACK`,
which must be in the environment of `ray start` (or of the process that starts Ray), since the
proxies inherit it. Light on purpose: the proxy imports this module, not the engine.

A response that had started (status line sent: a stream whose replica died mid-way) cannot be
taken back; the proxy ends it without its closing chunk, so the client sees a broken transfer,
never a short file that looks complete.
"""

from __future__ import annotations

import json
import logging

from starlette.middleware import Middleware

log = logging.getLogger(__name__)

PROXY_CALLBACK = "voxserve.serve.ray_proxy:proxy_middlewares"
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
REPLAY_BYTES = 1 << 20
"""Request bodies kept for a retry (the server's default body bound); a larger one is passed
through without a retry."""
ATTEMPTS = 2
RETRIED_HEADER = b"x-voxserve-retried"


class RetryUnanswered:
    """ASGI middleware: if the app returns (or raises) without starting a response, which is how
    Ray's proxy ends a request whose replica died, try once more with the same body; then 503."""

    def __init__(self, app, replay_bytes: int = REPLAY_BYTES):
        self.app, self.replay_bytes = app, replay_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = bytearray()
        buffered = None  # None: not all read yet; False: over the bound; bytes: the whole body
        client_gone = False

        async def first_receive():  # the first attempt reads the real channel, keeping the body
            nonlocal buffered, client_gone
            msg = await receive()
            if msg["type"] == "http.request" and buffered is None:
                body.extend(msg.get("body", b""))
                if len(body) > self.replay_bytes:
                    body.clear()
                    buffered = False  # too large to replay
                elif not msg.get("more_body"):
                    buffered = bytes(body)
            elif msg["type"] == "http.disconnect":
                client_gone = True
            return msg

        started = False
        attempt = 0

        async def watched_send(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
                if attempt:  # says that the answer came from a second replica
                    msg = {**msg, "headers": [*msg.get("headers", ()), (RETRIED_HEADER, str(attempt).encode())]}
            await send(msg)

        error = None
        for attempt in range(ATTEMPTS):
            rx = first_receive if attempt == 0 else _replay(buffered, receive)
            try:
                await self.app(scope, rx, watched_send)
                error = None
            except Exception as e:  # the proxy raised before answering: same as no answer
                if started:
                    raise
                error = e
            if started or client_gone:
                return
            retry = attempt + 1 < ATTEMPTS and isinstance(buffered, bytes)
            log.warning("request %s %s got no answer from its replica%s", scope.get("method"), scope.get("path"),
                        "; retrying" if retry else "")
            if not retry:
                break
        why = f" ({type(error).__name__})" if error is not None else ""
        body_out = json.dumps({"error": {
            "message": "the replica running this request stopped before answering; retry later" + why,
            "type": "server_error", "param": None, "code": "replica_failed"}}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                (b"content-length", str(len(body_out)).encode())]})
        await send({"type": "http.response.body", "body": body_out})


def _replay(body: bytes, receive):
    sent = False

    async def rx():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then the real channel (http.disconnect)

    return rx


def proxy_middlewares() -> list:
    """Ray Serve's proxy callback (`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`)."""
    return [Middleware(RetryUnanswered)]
