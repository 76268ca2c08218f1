"""The HTTP server's outer guards: `Guard` (API key, body size and deadline, request counting:
pure ASGI, so that a refused body is never read past the limit) and `http_protocol` (uvicorn's
protocol with a request-head timeout and a bound on connections)."""

from __future__ import annotations

import asyncio
import hmac
import json

from .config import AppConfig
from .encode import ROUTE as ENCODE_ROUTE
from .encode import body_limit
from .http_errors import CLIENT_CLOSED, FAILED_LATE, error_body, error_response
from .metrics import Metrics
from .playground import PATHS as PLAYGROUND_PATHS

ROUTES = ("/", "/v1/audio/speech", "/v1/audio/voices", "/v1/audio/captioned_speech", "/v1/synthesize", "/v1/voices",
          "/v1/models", "/health", "/ready", "/metrics", "/v1/audio/speech/stream", ENCODE_ROUTE)
"""The routes counted by name in the request metrics (others: "other")."""
UPLOAD_PATH = "/v1/audio/voices"
"""The route whose bodies (a recording) are bounded by `max_upload_bytes`."""


# ----------------------------------------------------------------------------- ASGI guard
def key_ok(config: AppConfig, scope) -> bool:
    """Whether a request (HTTP or WebSocket scope) may pass: no key set, or `Authorization:
    Bearer <key>` (compared in constant time)."""
    key = config.api_key
    if not key:
        return True
    headers = dict(scope.get("headers") or [])
    got = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = got.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


class Guard:
    """Outermost layer: API key, body size limit and deadline, request counting. Pure ASGI so
    that a refused body is never read past the limit."""

    def __init__(self, app, config: AppConfig, metrics: Metrics):
        self.app, self.config, self.metrics = app, config, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        state = {"status": None, "complete": False, "disconnected": False, "failed": False}
        failed_late: list[tuple[int, str]] = []  # filled by the route (`FAILED_LATE`)
        scope[FAILED_LATE] = failed_late

        async def send_counted(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                state["complete"] = True
            try:
                await send(message)
            except OSError:  # ASGI 2.4 servers raise on a closed connection
                state["disconnected"] = True
                raise

        async def receive_watched():
            msg = await receive()
            if msg["type"] == "http.disconnect" and not state["complete"]:
                state["disconnected"] = True
            return msg

        try:
            await self._serve(scope, path, receive_watched, send_counted)
        except BaseException:
            state["failed"] = True
            raise
        finally:
            # a client that left is not a server error: without this, an aborted upload (no
            # response started) would count as the 500 the server never sent
            if failed_late:  # failed after its first bytes: counted as its error
                status, code = failed_late[0]
                self.metrics.failed_after_first_bytes.labels(route, code).inc()
            elif state["disconnected"] and not state["complete"]:
                status = CLIENT_CLOSED
            elif state["status"] is None or (state["failed"] and not state["complete"]):
                status = 500  # uvicorn answers 500, or cuts a started response short
            else:
                status = state["status"]
            self.metrics.requests.labels(route, str(status)).inc()

    async def _serve(self, scope, path, receive, send):
        denied = self._check_key(scope, path)
        if denied is not None:
            return await denied(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        limit = self.config.max_upload_bytes if path == UPLOAD_PATH else body_limit(path, self.config.max_body_bytes)
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            return await self._refuse(scope, receive, send, 413, f"request body over {limit} bytes", "body_too_large")
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body = bytearray()
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        return
                    body += msg.get("body", b"")
                    if len(body) > limit:
                        return await self._refuse(scope, receive, send, 413, f"request body over {limit} bytes",
                                                  "body_too_large")
                    if not msg.get("more_body"):
                        break
        except TimeoutError:
            return await self._refuse(scope, receive, send, 408,
                                      f"request body not received within {self.config.body_timeout_s:g} s "
                                      f"(got {len(body)} of {declared or 'unknown'} bytes)", "request_timeout")
        if body and _is_json(headers.get(b"content-type")):
            try:  # JSON on the wire is UTF-8 (RFC 8259); refuse the rest here, in the JSON error's shape
                bytes(body).decode("utf-8")
            except UnicodeDecodeError as e:
                return await self._refuse(scope, receive, send, 422,
                                          f"request body is not valid JSON: not UTF-8 text (byte {e.start})",
                                          "invalid_json")
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # then the real channel (http.disconnect)

        return await self.app(scope, replay, send)

    def _check_key(self, scope, path: str):
        if path == "/health" or path in PLAYGROUND_PATHS or key_ok(self.config, scope):
            return None  # the page is public; its API calls send the key
        return error_response(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                              "invalid_request_error", "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def _refuse(self, scope, receive, send, status: int, message: str, code: str):
        # the rest of the body is never read: close the connection after the answer
        r = error_response(status, message, "invalid_request_error", code, headers={"Connection": "close"})
        await r(scope, receive, send)


def _is_json(content_type: bytes | None) -> bool:
    """FastAPI parses a body as JSON when it has no content type or a JSON one."""
    if not content_type:
        return True
    main = content_type.decode("latin-1").split(";", 1)[0].strip().lower()
    return main == "application/json" or main.endswith("+json")


# ----------------------------------------------------------------------------- connections
def http_protocol(app) -> type:
    """uvicorn's h11 protocol with the connection-level guards of `app`'s AppConfig: the request
    head timeout and the connection bound (uvicorn itself has neither a timeout for a request's
    headers nor a bound on idle connections). Pass it as `uvicorn.Config(app, http=...)`."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    config: AppConfig = app.state.config
    metrics: Metrics = app.state.metrics

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_timer = None
            self._head_for = None  # the cycle that was current when the timer was set
            self._head_started = False
            if config.max_connections is not None and len(self.connections) > config.max_connections:
                metrics.connections_dropped.labels("too_many_connections").inc()
                self.app = _too_many_connections  # this connection's requests: 503, then close
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm_head_timer()  # the first byte of the next request on a kept-alive connection
            self._head_started = self._head_started or bool(data)
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not self._head_for:
                self._head_timer.cancel()  # a new request's head is complete
                self._head_timer = None

        def handle_websocket_upgrade(self, event) -> None:
            # the connection is the WebSocket protocol's from here: this timer's 408 would be
            # written into its frames (and the connection closed) mid-session
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().handle_websocket_upgrade(event)

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._head_for, self._head_started = self.cycle, False
            self._head_timer = self.loop.call_later(config.header_timeout_s, self._head_timed_out)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.cycle is not self._head_for or self.transport.is_closing():
                return
            metrics.connections_dropped.labels("header_timeout").inc()
            if self._head_started:  # part of a request came: say why it is dropped
                body = json.dumps(error_body(f"request headers not received within {config.header_timeout_s:g} s",
                                             "invalid_request_error", "request_timeout")).encode()
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                     b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()

    return GuardedH11Protocol


async def _too_many_connections(scope, receive, send) -> None:
    r = error_response(503, "too many open connections; retry later", "server_error", "too_many_connections",
                       headers={"Connection": "close", "Retry-After": "1"})
    await r(scope, receive, send)
