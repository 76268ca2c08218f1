"""HTTP API (FastAPI): OpenAI-compatible /v1/audio/speech, native /v1/synthesize, voices,
models, health, readiness and Prometheus metrics. Thin: requests become engine submissions;
audio streams back as the engine makes it, encoded chunk by chunk.

Errors use OpenAI's JSON shape {"error": {"message", "type", "param", "code"}}, `code` always
set and `param` the top-level request field at fault (None for the request as a whole):
400 bad input or option, 401 missing/wrong API key, 404 unknown voice/model/route,
408 a client too slow to send its request, 413 input, body or audio too long, 422 malformed body
(not JSON, or a field of the wrong type), 429 overloaded (with Retry-After), 503 not ready /
shutting down / too many connections; anything else is a 500 whose body says only "internal error".
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..audio import EncoderOwner, SentenceJoiner, available_stream_formats, encode_audio, open_stream_encoder
from ..engine import AsyncEngine, Engine, SpeechStream
from ..errors import (
    AudioTooLongError,
    EngineClosedError,
    InvalidInputError,
    InvalidOptionError,
    OverloadedError,
    TextTooLongError,
    UnknownSpeakerError,
    UnknownVoiceError,
    VoxserveError,
)
from ..options import SynthesisOptions
from ..voice import joined_words
from .config import AppConfig
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .playground import PATHS as PLAYGROUND_PATHS
from .playground import mount_playground
from .schemas import (
    MODEL_ID,
    OPENAI_MODELS,
    OPENAI_VOICES,
    AudioVoice,
    AudioVoicesResponse,
    CaptionedSpeechRequest,
    ModelInfo,
    ModelsResponse,
    SpeechRequest,
    SynthesizeRequest,
    VoiceInfo,
    VoicesResponse,
)

log = logging.getLogger(__name__)

ROUTES = ("/", "/v1/audio/speech", "/v1/audio/voices", "/v1/audio/captioned_speech", "/v1/synthesize", "/v1/voices",
          "/v1/models", "/health", "/ready", "/metrics")
CAPTION_STREAM_FORMATS = ("pcm", "wav")
"""Audio of a streamed captioned response's lines: each line's audio is a whole file."""


# ----------------------------------------------------------------------------- errors
def error_body(message: str, type_: str, code: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, code: str, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status, headers=headers)


def _error_for(exc: BaseException, log_internal: bool = True) -> JSONResponse:
    if isinstance(exc, AudioTooLongError):
        return error_response(413, str(exc), "invalid_request_error", "audio_too_long", exc.option)
    if isinstance(exc, TextTooLongError):
        return error_response(413, str(exc), "invalid_request_error", "input_too_long", "input")
    if isinstance(exc, InvalidOptionError):
        return error_response(400, str(exc), "invalid_request_error", "invalid_option", exc.option)
    if isinstance(exc, UnknownSpeakerError):  # the message lists the voice's speakers (Bark: presets)
        return error_response(400, str(exc), "invalid_request_error", "invalid_input", "speaker")
    if isinstance(exc, InvalidInputError):
        return error_response(400, str(exc), "invalid_request_error", "invalid_input")
    if isinstance(exc, UnknownVoiceError):
        return error_response(404, str(exc), "invalid_request_error", "voice_not_found", "voice")
    if isinstance(exc, OverloadedError):
        retry = str(max(1, int(math.ceil(exc.retry_after_s))))
        return error_response(429, str(exc), "rate_limit_error", "overloaded", headers={"Retry-After": retry})
    if isinstance(exc, EngineClosedError):
        return error_response(503, str(exc), "server_error", "unavailable")
    if log_internal:
        log.error("internal error", exc_info=exc)
    return error_response(500, "internal error", "server_error", "internal_error")


class _InternalError(VoxserveError):
    """A failure inside the engine, surfaced as a plain 500 (details go to the log only)."""


class _CutShort(Exception):
    """Ends a response that failed after its first bytes went out: the failure is logged and
    left for the guard to count (`_FAILED_LATE`) where it happened; raised out of a raw stream,
    it makes the server abort the connection (uvicorn's own traceback of it is dropped,
    `_QuietCutShort`), so that the client sees a broken transfer, not a short file that looks
    whole. `error` is the failure's error body (an SSE stream sends it as its last event)."""

    def __init__(self, error: dict):
        super().__init__(error["error"]["code"])
        self.error = error


_FAILED_LATE = "voxserve.failed_after_first_bytes"
"""Scope key of the guard's list where a route puts (status, code) of a request that failed
after its first bytes, for the guard to count it as itself (413 audio_too_long, 504 timeout,
...), not as the 500 of an unknown exception."""


class _QuietCutShort(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" traceback of a `_CutShort`: the failure
    is logged once, by the route, where it happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _CutShort))


_QUIET_CUT_SHORT = _QuietCutShort()


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_input", status: int = 400):
        self.message, self.param, self.code, self.status = message, param, code, status


# ----------------------------------------------------------------------------- ASGI guard
CLIENT_CLOSED = 499
"""Status counted for a request whose client went away before its response was complete
(nginx's "client closed request"); no such response is sent."""


class _Guard:
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
        failed_late: list[tuple[int, str]] = []  # filled by the route (`_FAILED_LATE`)
        scope[_FAILED_LATE] = failed_late

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
        limit = self.config.max_body_bytes
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
        key = self.config.api_key
        if not key or path == "/health" or path in PLAYGROUND_PATHS:  # the page is public; its API calls send the key
            return None
        headers = dict(scope.get("headers") or [])
        got = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = got.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
            return None
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
def http_protocol(app: FastAPI) -> type:
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


# ----------------------------------------------------------------------------- the app
def create_app(engine: Engine, config: AppConfig | None = None) -> FastAPI:
    """The HTTP app around an engine. The app starts the engine (if needed) and warms it up on
    startup, and drains it on shutdown."""
    config = config or AppConfig()
    metrics = Metrics(engine)
    if engine.observer is None:
        engine.observer = metrics
    aengine = AsyncEngine(engine)
    default_voice = next(iter(engine.voices))
    ready = threading.Event()

    warmed: list[str] = []  # the voices whose warm-up ran to the end, in order (app.state.warmed_up)

    def warm_up() -> None:
        # Until `ready` is set every request is refused (503): nothing else is on the models
        warmed.extend(engine.warm_up())
        ready.set()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        if config.warmup:
            threading.Thread(target=warm_up, name="voxserve-warmup", daemon=True).start()
        else:
            ready.set()
        try:
            yield
        finally:
            ready.clear()
            await asyncio.to_thread(engine.shutdown, config.shutdown_timeout_s)

    app = FastAPI(title="voxserve", version="0.1.0", lifespan=lifespan)
    app.state.engine = engine
    app.state.config = config
    app.state.metrics = metrics
    app.state.ready = ready
    app.state.warmed_up = warmed

    # --------------------------------------------------------------- error mapping
    @app.exception_handler(VoxserveError)
    async def _voxserve_error(request: Request, exc: VoxserveError):
        return _error_for(exc)

    @app.exception_handler(_BadRequest)
    async def _bad_request(request: Request, exc: _BadRequest):
        return error_response(exc.status, exc.message, "invalid_request_error", exc.code, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errs = exc.errors() or [{}]
        if errs[0].get("type") == "json_invalid":  # its loc holds a character offset, not a field
            why = (errs[0].get("ctx") or {}).get("error", "malformed")
            return error_response(422, f"request body is not valid JSON: {why}", "invalid_request_error",
                                  "invalid_json")
        msgs = [f"{_field(e) or 'request body'}: {e.get('msg', 'invalid')}" for e in errs[:5]]
        return error_response(422, "; ".join(msgs), "invalid_request_error", "invalid_schema", _field(errs[0]))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's 400 for JSON too deep to parse
            return error_response(422, "request body is not valid JSON: nested too deeply", "invalid_request_error",
                                  "invalid_json")
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = _HTTP_CODES.get(exc.status_code, "invalid_request" if exc.status_code < 500 else "server_error")
        return error_response(exc.status_code, str(exc.detail), kind, code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        if isinstance(exc, _CutShort):  # logged where it happened; the response has started
            return Response(status_code=500)
        return _error_for(exc)

    logging.getLogger("uvicorn.error").addFilter(_QUIET_CUT_SHORT)  # once: a logger keeps one of each

    # --------------------------------------------------------------- helpers
    def voice_for(name: str | None, openai: bool) -> str:
        if name is None:
            return default_voice
        if name in engine.voices:
            return name
        if openai and name.lower() in OPENAI_VOICES:
            return default_voice
        from ..voices.registry import resolve_voice

        resolve_voice(name, allow_paths=False)  # unknown: UnknownVoiceError (404) listing the registry
        raise UnknownVoiceError(name, sorted(engine.voices))  # installed but not loaded here

    def check_ready() -> None:
        if not ready.is_set():
            raise EngineClosedError("the server is not ready yet (loading or warming up voices)")

    async def start(voice: str, text: str, options: SynthesisOptions, fmt: str, streaming: bool):
        check_ready()
        if not isinstance(text, str) or len(text) > config.max_input_chars:
            raise TextTooLongError(len(text), config.max_input_chars)
        try:
            encoder = EncoderOwner(open_stream_encoder(fmt, engine.voice(voice).sample_rate))
        except ValueError as e:
            raise _BadRequest(str(e), "response_format", "unsupported_format") from None
        try:
            stream = aengine.submit(voice, text, options, streaming=streaming)
        except BaseException:
            encoder.abandon()
            raise
        try:
            async with asyncio.timeout(config.request_timeout_s):
                await stream.first()  # errors the front end finds late (nothing pronounceable) -> 4xx
        except BaseException as e:
            stream.cancel()
            encoder.abandon()
            if isinstance(e, TimeoutError):
                raise _BadRequest(f"the request took over {config.request_timeout_s:g} s and was cancelled",
                                  code="timeout", status=504) from None
            if isinstance(e, Exception) and not isinstance(e, VoxserveError):
                log.error("request failed", exc_info=e)
                raise _InternalError("internal error") from None
            raise
        return stream, encoder

    def headers_for(encoder: EncoderOwner, fmt: str) -> tuple[str, dict]:
        sr = encoder.sample_rate
        headers = {"X-Sample-Rate": str(sr), "Cache-Control": "no-store"}
        media = encoder.media_type
        if fmt == "pcm":
            media = f"audio/L16; rate={sr}; channels=1"
            headers["X-Audio-Format"] = "s16le; channels=1"
        return media, headers

    async def encode(encoder: EncoderOwner, fmt: str, samples: np.ndarray) -> bytes:
        if fmt in ("pcm", "wav"):
            return encoder.write(samples)
        return await asyncio.to_thread(encoder.write, samples)  # lame/opus/flac: off the loop

    async def encode_tail(encoder: EncoderOwner, fmt: str) -> bytes:
        if fmt in ("pcm", "wav"):
            return encoder.finish()
        return await asyncio.to_thread(encoder.finish)

    def cut_short(request: Request, stream: SpeechStream, exc: Exception) -> _CutShort:
        """A failure after the first bytes went out: logged once (a traceback only for a server
        error), left for the guard to count as its own status; the _CutShort to raise."""
        if isinstance(exc, TimeoutError):
            status, error = 504, error_body(f"the request took over {config.request_timeout_s:g} s and was "
                                            "cancelled", "invalid_request_error", "timeout")
        else:
            known = isinstance(exc, VoxserveError) and not isinstance(exc, _InternalError)
            r = _error_for(exc if known else _InternalError("internal error"), log_internal=False)
            status, error = r.status_code, json.loads(r.body)
        if status >= 500:
            log.error("request %s failed after its first bytes", stream.request_id, exc_info=exc)
        else:
            log.warning("request %s failed after its first bytes (%s): %s", stream.request_id,
                        error["error"]["code"], error["error"]["message"])
        request.scope[_FAILED_LATE].append((status, error["error"]["code"]))
        return _CutShort(error)

    async def timed_chunks(stream: SpeechStream) -> AsyncIterator:
        """The stream's chunks until the request's deadline; its time to first audio is observed
        when the first one comes."""
        first = True
        async for chunk in _until(stream, stream.timing.submitted + config.request_timeout_s):
            if first:
                first = False
                if stream.timing.first_audio is not None:
                    metrics.ttfa.observe(stream.timing.first_audio - stream.timing.submitted)
            yield chunk

    async def body(request: Request, stream: SpeechStream, encoder: EncoderOwner, fmt: str, silence_s: float,
                   sent: list[int] | None = None) -> AsyncIterator[bytes]:
        """The encoded stream; `sent[0]` counts the samples encoded so far."""
        joiner = SentenceJoiner(stream.sample_rate, silence_s)
        try:
            async for chunk in timed_chunks(stream):
                for samples in joiner.pieces(chunk.samples, chunk.partial):
                    if sent is not None:
                        sent[0] += len(samples)
                    data = await encode(encoder, fmt, samples)
                    if data:
                        yield data
            tail = await encode_tail(encoder, fmt)
            if tail:
                yield tail
        except Exception as e:
            # the status line is already sent: abort the connection (no closing chunk) so the
            # client sees a broken transfer rather than a short file that looks complete
            raise cut_short(request, stream, e) from e
        finally:
            stream.cancel()
            encoder.abandon()  # a client that left: closed once the write under way returns

    async def respond(request: Request, stream: SpeechStream, encoder: EncoderOwner, fmt: str,
                      silence_s: float, chunked: bool) -> Response:
        media, headers = headers_for(encoder, fmt)
        if chunked:
            return StreamingResponse(body(request, stream, encoder, fmt, silence_s), media_type=media, headers=headers)
        chunks = await collect(request, stream, encoder)
        if chunks is None:
            return Response(status_code=CLIENT_CLOSED)  # no one reads it; counted as a disconnect
        samples = SentenceJoiner(stream.sample_rate, silence_s).join(chunks)
        return Response(await encode_whole(samples, stream.sample_rate, fmt), media_type=media, headers=headers)

    async def collect(request: Request, stream: SpeechStream, encoder: EncoderOwner):
        """A whole request's chunks (cancelling if the client goes away: None), within its timeout."""
        try:
            async with asyncio.timeout(max(0.0, stream.timing.submitted + config.request_timeout_s - time.monotonic())):
                chunks = await _collect_or_cancel(stream, request)
        except TimeoutError:
            stream.cancel()
            raise _BadRequest(f"the request took over {config.request_timeout_s:g} s and was cancelled",
                              code="timeout", status=504) from None
        except VoxserveError:
            raise
        except Exception as e:
            log.error("request failed", exc_info=e)
            raise _InternalError("internal error") from None
        finally:
            encoder.abandon()  # never written: the whole file is encoded on its own
        if chunks is not None and stream.timing.first_audio is not None:
            metrics.ttfa.observe(stream.timing.first_audio - stream.timing.submitted)
        return chunks

    async def encode_whole(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
        if fmt in ("wav", "pcm"):  # a header and a copy: no thread needed
            return encode_audio(samples, sample_rate, fmt)
        if fmt in ("flac", "mp3"):
            return await asyncio.to_thread(encode_audio, samples, sample_rate, fmt)
        enc = open_stream_encoder(fmt, sample_rate)
        return await asyncio.to_thread(lambda: enc.write(samples) + enc.close())

    # --------------------------------------------------------------- routes
    async def synthesis(request: Request, req, voice: str, text: str, streaming: bool, chunked: bool) -> Response:
        options = req.options()
        stream, encoder = await start(voice, text, options, req.response_format, streaming=streaming)
        silence = engine.voice(voice).silence_after(options)
        return await respond(request, stream, encoder, req.response_format, silence, chunked=chunked)

    async def sse(request: Request, stream: SpeechStream, encoder: EncoderOwner, fmt: str, silence_s: float,
                  input_chars: int) -> AsyncIterator[bytes]:
        """OpenAI's speech events: one `speech.audio.delta` per encoded chunk, then
        `speech.audio.done`. A failure after the first event is an `error` event, since the
        event framing (unlike raw bytes) can say so."""
        sent = [0]
        try:
            async for data in body(request, stream, encoder, fmt, silence_s, sent):
                yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
        except _CutShort as e:  # logged and counted: the event framing can say so
            yield _event({"type": "error", **e.error})
            return
        # voxserve has no tokens: usage counts input characters and output audio samples
        yield _event({"type": "speech.audio.done",
                      "usage": {"input_tokens": input_chars, "output_tokens": sent[0],
                                "total_tokens": input_chars + sent[0]}})

    @app.post("/v1/audio/speech")
    async def speech(req: SpeechRequest, request: Request):
        if req.model not in OPENAI_MODELS and req.model != MODEL_ID and req.model not in engine.voices:
            raise _BadRequest(f"unknown model {req.model!r}; use one of: {', '.join((MODEL_ID,) + OPENAI_MODELS)}",
                              "model", "model_not_found", status=404)
        voice = voice_for(req.voice_name, openai=True)
        if req.stream_format == "audio":
            # FLAC records its length (STREAMINFO total samples) only if known before its first
            # byte; libsndfile (soundfile.read) cannot read one without it: sent whole
            streamed = req.response_format != "flac"
            return await synthesis(request, req, voice, req.input, streaming=streamed, chunked=streamed)
        options = req.options()
        stream, encoder = await start(voice, req.input, options, req.response_format, streaming=True)
        media, headers = headers_for(encoder, req.response_format)
        headers |= {"X-Audio-Media-Type": media, "X-Accel-Buffering": "no"}
        silence = engine.voice(voice).silence_after(options)
        return StreamingResponse(sse(request, stream, encoder, req.response_format, silence, len(req.input)),
                                 media_type="text/event-stream", headers=headers)

    @app.post("/v1/synthesize")
    async def synthesize(req: SynthesizeRequest, request: Request):
        voice = voice_for(req.voice, openai=False)
        return await synthesis(request, req, voice, req.text, streaming=req.stream, chunked=req.stream)

    @app.get("/v1/voices", response_model=VoicesResponse)
    async def voices():
        out = []
        for name, v in engine.voices.items():
            out.append(VoiceInfo(name=name, family=getattr(v, "family", ""), sample_rate=v.sample_rate,
                                 speakers=list(v.speakers), styles=list(getattr(v, "styles", ())),
                                 languages=list(v.language_codes), default=name == default_voice))
        return VoicesResponse(voices=out, openai_aliases=sorted(OPENAI_VOICES))

    @app.get("/v1/audio/voices", response_model=AudioVoicesResponse)
    async def audio_voices():
        infos = await voices()
        data = [AudioVoice(id=v.name, **v.model_dump()) for v in infos.voices]
        return AudioVoicesResponse(data=data, voices=[v.id for v in data], openai_aliases=infos.openai_aliases)

    @app.get("/v1/models", response_model=ModelsResponse)
    async def models():
        return ModelsResponse(data=[ModelInfo(id=m) for m in (MODEL_ID,) + OPENAI_MODELS])

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready_route():
        if not ready.is_set():
            return error_response(503, "not ready: voices are loading or warming up", "server_error", "not_ready")
        return {"status": "ready", "voices": list(engine.voices), "formats": list(available_stream_formats())}

    @app.get("/metrics")
    async def metrics_route():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # --------------------------------------------------------------- captioned speech
    def words_json(words, offset: float = 0.0) -> list[dict]:
        return [{"word": w.word, "start": round(w.start + offset, 3), "end": round(w.end + offset, 3)}
                for w in words]

    @app.post("/v1/audio/captioned_speech")
    async def captioned_speech(req: CaptionedSpeechRequest, request: Request):
        """The speech body, answered as JSON: the whole file (base64) and its words, or with
        `stream`, NDJSON lines of one sentence each (pcm or wav), words in whole-audio time."""
        if req.model not in OPENAI_MODELS and req.model != MODEL_ID and req.model not in engine.voices:
            raise _BadRequest(f"unknown model {req.model!r}; use one of: {', '.join((MODEL_ID,) + OPENAI_MODELS)}",
                              "model", "model_not_found", status=404)
        voice = voice_for(req.voice_name, openai=True)
        if not getattr(engine.voice(voice), "word_timestamps", False):
            raise _BadRequest(f"voice {voice!r} gives no word timestamps; use /v1/audio/speech", "voice",
                              "unsupported_voice")
        fmt = req.response_format
        if req.stream and fmt not in CAPTION_STREAM_FORMATS:
            raise _BadRequest(f"a streamed captioned response carries {' or '.join(CAPTION_STREAM_FORMATS)} "
                              f"audio, not {fmt!r}", "response_format", "unsupported_format")
        options = req.options()
        silence = engine.voice(voice).silence_after(options)
        stream, encoder = await start(voice, req.input, options, fmt, streaming=req.stream)
        if not req.stream:
            chunks = await collect(request, stream, encoder)
            if chunks is None:
                return Response(status_code=CLIENT_CLOSED)
            sr = stream.sample_rate
            samples = SentenceJoiner(sr, silence).join(chunks)
            words = joined_words([(len(c.samples), c.words, c.partial) for c in chunks], sr, silence)
            data = await encode_whole(samples, sr, fmt)
            return JSONResponse({"audio": base64.b64encode(data).decode("ascii"), "format": fmt,
                                 "sample_rate": encoder.sample_rate, "words": words_json(words)},
                                headers={"Cache-Control": "no-store"})
        encoder.abandon()  # each line is encoded on its own
        return StreamingResponse(caption_lines(request, stream, fmt, silence), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store", "X-Sample-Rate": str(stream.sample_rate)})

    async def caption_lines(request: Request, stream: SpeechStream, fmt: str, silence_s: float) -> AsyncIterator[bytes]:
        sr = stream.sample_rate
        joiner = SentenceJoiner(sr, silence_s)
        pos = 0  # samples of the whole sent so far
        parts: list[np.ndarray] = []  # this sentence's audio, its silence first
        words, lead = (), 0
        try:
            async for chunk in timed_chunks(stream):
                got = joiner.pieces(chunk.samples, chunk.partial)
                if not parts:  # the chunk that starts a sentence: its words, after its silence
                    lead, words = sum(len(p) for p in got[:-1]), chunk.words
                parts.extend(got)
                if chunk.partial:
                    continue  # one line per sentence: wait for its rest
                samples = np.concatenate(parts)
                data = encode_audio(samples, sr, fmt)
                line = {"index": chunk.index, "audio": base64.b64encode(data).decode("ascii"), "format": fmt,
                        "sample_rate": sr, "offset": round(pos / sr, 6),
                        "words": words_json(words, (pos + lead) / sr)}
                yield (json.dumps(line) + "\n").encode()
                pos += len(samples)
                parts, words = [], ()
        except Exception as e:  # the status is sent: abort the connection, as `body` does
            raise cut_short(request, stream, e) from e
        finally:
            stream.cancel()

    mount_playground(app)
    app.add_middleware(_Guard, config=config, metrics=metrics)
    return app


_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def _field(err: dict) -> str | None:
    """The top-level request field a validation error is about (its loc also names union
    members and list indexes below it); None for the body as a whole."""
    loc = [x for x in err.get("loc", ()) if x != "body"]
    return str(loc[0]) if loc and err.get("loc", ("",))[0] == "body" else None


def _event(payload: dict) -> bytes:
    """One server-sent event holding a JSON object."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _until(stream: SpeechStream, deadline: float) -> AsyncIterator:
    """The stream's chunks; past `deadline` (monotonic seconds) it is cancelled and TimeoutError raised."""
    it = stream.__aiter__()
    try:
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    chunk = await it.__anext__()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        await it.aclose()


async def _collect_or_cancel(stream: SpeechStream, request: Request, poll_s: float = 0.2):
    """All chunks of a stream, or None if the client disconnected first (the request is then
    cancelled: its queued sentences are dropped). Checked again once the chunks are all there:
    the server drops an answer to a client that has left without a word, so it would count as
    a success."""
    task = asyncio.ensure_future(stream.collect())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if await request.is_disconnected():
                stream.cancel()
                if done and not task.cancelled():
                    task.exception()  # retrieved: the answer goes nowhere either way
                return None
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()


