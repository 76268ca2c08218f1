"""The HTTP API's errors: OpenAI's JSON shape {"error": {"message", "type", "param", "code"}},
`code` always set and `param` the top-level request field at fault (None for the request as a
whole), and the exceptions routes raise to answer with one."""

from __future__ import annotations

import logging
import math

from fastapi.responses import JSONResponse

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

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499
"""Status counted for a request whose client went away before its response was complete
(nginx's "client closed request"); no such response is sent."""

FAILED_LATE = "voxserve.failed_after_first_bytes"
"""Scope key of the guard's list where a route puts (status, code) of a request that failed
after its first bytes, for the guard to count it as itself (413 audio_too_long, 504 timeout,
...), not as the 500 of an unknown exception."""


def error_body(message: str, type_: str, code: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, code: str, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status, headers=headers)


def error_for(exc: BaseException, log_internal: bool = True) -> JSONResponse:
    """The response of a library error (an unknown exception: a 500 saying only "internal error")."""
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


class InternalError(VoxserveError):
    """A failure inside the engine, surfaced as a plain 500 (details go to the log only)."""


class CutShort(Exception):
    """Ends a response that failed after its first bytes went out: the failure is logged and
    left for the guard to count (`FAILED_LATE`) where it happened; raised out of a raw stream,
    it makes the server abort the connection (uvicorn's own traceback of it is dropped,
    `QuietCutShort`), so that the client sees a broken transfer, not a short file that looks
    whole. `error` is the failure's error body (an SSE stream sends it as its last event)."""

    def __init__(self, error: dict):
        super().__init__(error["error"]["code"])
        self.error = error


class QuietCutShort(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" traceback of a `CutShort`: the failure
    is logged once, by the route, where it happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], CutShort))


QUIET_CUT_SHORT = QuietCutShort()


class BadRequest(Exception):
    """A route's refusal: `status` (4xx), `code`, and the request field at fault."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_input", status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status
