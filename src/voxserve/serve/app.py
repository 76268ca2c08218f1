"""HTTP API (FastAPI): OpenAI-compatible /v1/audio/speech, native /v1/synthesize, voices (listed,
made from a recording, deleted), models, health, readiness and Prometheus metrics;
/v1/audio/speech/stream (WebSocket) takes text as it is written. Thin: requests become engine
submissions; audio streams back as the engine makes it, encoded chunk by chunk.

The app is routers (`routes/`: speech, stream, synthesize, voices, health, playground) over one
`SpeechService` (service.py: the engine, settings, metrics, readiness), inside the `Guard`
(guard.py: API key, body limits, request counting).

Errors use OpenAI's JSON shape {"error": {"message", "type", "param", "code"}}, `code` always
set and `param` the top-level request field at fault (None for the request as a whole):
400 bad input or option, 401 missing/wrong API key, 404 unknown voice/model/route,
408 a client too slow to send its request, 413 input, body or audio too long, 422 malformed body
(not JSON, or a field of the wrong type), 429 overloaded (with Retry-After), 503 not ready /
shutting down / too many connections; anything else is a 500 whose body says only "internal error".
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import Engine
from ..errors import VoxserveError
from .config import AppConfig
from .encode import router as encode_router
from .guard import ROUTES, Guard, http_protocol  # noqa: F401  (http_protocol: the server's, from here)
from .http_errors import QUIET_CUT_SHORT, BadRequest, CutShort, error_for, error_response
from .metrics import Metrics
from .playground import playground_router
from .routes import health, speech, stream, synthesize, voices
from .routes.stream import MAX_MESSAGE_BYTES as WS_MAX_BYTES  # noqa: F401  (uvicorn's ws_max_size)
from .service import SpeechService

_error_for = error_for  # (the name tests and older callers use)

_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def _field(err: dict) -> str | None:
    """The top-level request field a validation error is about (its loc also names union
    members and list indexes below it); None for the body as a whole."""
    loc = [x for x in err.get("loc", ()) if x != "body"]
    return str(loc[0]) if loc and err.get("loc", ("",))[0] == "body" else None


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(VoxserveError)
    async def _voxserve_error(request: Request, exc: VoxserveError):
        return error_for(exc)

    @app.exception_handler(BadRequest)
    async def _bad_request(request: Request, exc: BadRequest):
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
        if isinstance(exc, CutShort):  # logged where it happened; the response has started
            return Response(status_code=500)
        return error_for(exc)


def create_app(engine: Engine, config: AppConfig | None = None) -> FastAPI:
    """The HTTP app around an engine. The app starts the engine (if needed) and warms it up on
    startup, and drains it on shutdown."""
    config = config or AppConfig()
    metrics = Metrics(engine)
    if engine.observer is None:
        engine.observer = metrics
    svc = SpeechService(engine, config, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        svc.start_up()
        try:
            yield
        finally:
            await svc.shut_down()

    app = FastAPI(title="voxserve", version="0.1.0", lifespan=lifespan)
    app.state.service = svc
    app.state.engine = engine
    app.state.config = config
    app.state.metrics = metrics
    app.state.ready = svc.ready
    app.state.warmed_up = svc.warmed
    app.state.held_audio = svc.aengine.held  # the whole answers' audio budget (engine/held_audio.py)

    _add_error_handlers(app)
    logging.getLogger("uvicorn.error").addFilter(QUIET_CUT_SHORT)  # once: a logger keeps one of each
    for router in (speech.router, stream.router, synthesize.router, voices.router, health.router, encode_router,
                   playground_router()):
        app.include_router(router)
    app.add_middleware(Guard, config=config, metrics=metrics)
    return app
