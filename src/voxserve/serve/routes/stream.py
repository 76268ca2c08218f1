"""/v1/audio/speech/stream: text in over a WebSocket as it is written (an LLM's tokens), audio out
as each sentence completes.

The client sends a start message (voice, format, the options of /v1/audio/speech:
`SpeechStreamStart`), then `{"type": "text", "text": ...}` pieces of any size, split anywhere,
then `{"type": "end"}`. Each sentence goes to the engine as soon as the text after it shows it
has ended (`SentenceBuffer`, as Wyoming's synthesize-chunk streaming), the rest at the end; so
its sentences are batched with every other route's. The server answers `{"type": "start"}` (the
sample rate and media type), then the audio as binary frames (one encoded stream for the whole
session), a `{"type": "words"}` message before a sentence's audio where the voice times its
words, and `{"type": "done"}` before it closes (code 1000). An error is `{"type": "error",
"error": {...}}` (OpenAI's error body) and then a close: 1008 bad input or a client too slow,
1009 a message too large, 1011 a server error, 1013 overloaded or not ready (try again later).

Bounded: the text held and not yet spoken (`max_input_chars`; a client ahead of the audio waits
for room), a message's size, a session's total time (`request_timeout_s`), a client that sends
nothing while no audio is owed or does not take a frame (`stream_idle_timeout_s`), and the
sessions open at once (`stream_max_connections`). A client that leaves cancels its sentences.
"""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import APIRouter, Depends, WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketState

from ...audio import EncoderOwner, SentenceJoiner
from ...engine import SpeechStream
from ...errors import OverloadedError, TextTooLongError, UnpronounceableTextError, VoxserveError
from ...text.split import SentenceBuffer
from ..guard import key_ok
from ..http_errors import BadRequest, InternalError, error_body, error_for, error_response
from ..schemas import SpeechStreamStart, StreamEnd, StreamText
from ..service import SpeechService, service, until
from .speech import words_json

log = logging.getLogger(__name__)
router = APIRouter()

PATH = "/v1/audio/speech/stream"
MAX_MESSAGE_CHARS = 64 * 1024
"""A text message over this is refused (1009): far more than a piece of streamed text needs."""
MAX_MESSAGE_BYTES = 4 * MAX_MESSAGE_CHARS
"""The server's bound on a WebSocket message as received (UTF-8: up to 4 bytes a character);
pass it as uvicorn's `ws_max_size`, whose default (16 MiB) is far above it."""
_END = object()


class _Closing(Exception):
    """Ends a session with an error message and a close code."""

    def __init__(self, status: int, body: dict, close_code: int):
        super().__init__(body["error"]["code"])
        self.status, self.body, self.close_code = status, body, close_code


def _bad(message: str, code: str, close_code: int = 1008, status: int = 400) -> _Closing:
    return _Closing(status, error_body(message, "invalid_request_error", code), close_code)


def _closing_for(exc: BaseException) -> _Closing:
    if isinstance(exc, _Closing):
        return exc
    if isinstance(exc, BadRequest):
        return _Closing(exc.status, error_body(exc.message, "invalid_request_error", exc.code, exc.param), 1008)
    known = isinstance(exc, VoxserveError) and not isinstance(exc, InternalError)
    if not known:
        log.error("stream session failed", exc_info=exc)
    r = error_for(exc if known else InternalError("internal error"), log_internal=False)
    code = 1011 if r.status_code >= 500 and r.status_code != 503 else 1013 if r.status_code in (429, 503) else 1008
    return _Closing(r.status_code, json.loads(r.body), code)


class _Session:
    def __init__(self, svc: SpeechService, ws: WebSocket):
        self.svc, self.ws, self.config = svc, ws, svc.config
        self.parts: asyncio.Queue = asyncio.Queue()  # (SpeechStream, its text's length) in order, then _END
        self.live: list[SpeechStream] = []  # submitted, not yet spoken to the end
        self.buf = SentenceBuffer()
        self.owed = 0  # characters held or submitted and not yet spoken
        self.room = asyncio.Event()  # set when spoken text frees room
        self.ended = False
        self.voice = ""
        self.options = None
        self.sentences = 0
        self.samples = 0

    # ------------------------------------------------------------------ reading
    async def receive_json(self, idle: bool) -> dict | None:
        """The next message as a JSON object (None: the client left). `idle`: time out only
        while no audio is owed to the client."""
        while True:
            try:
                async with asyncio.timeout(self.config.stream_idle_timeout_s):
                    msg = await self.ws.receive()
            except TimeoutError:
                if idle and (self.live or not self.parts.empty()):
                    continue  # the client waits for audio: not idle
                raise _bad(f"nothing received for {self.config.stream_idle_timeout_s:g} s", "idle_timeout") from None
            if msg["type"] == "websocket.disconnect":
                return None
            text = msg.get("text")
            if text is None:
                raise _bad("send JSON text messages ({\"type\": \"start\" | \"text\" | \"end\"}), not binary ones",
                           "invalid_message")
            if len(text) > MAX_MESSAGE_CHARS:
                raise _bad(f"a message is at most {MAX_MESSAGE_CHARS} characters", "message_too_large", 1009, 413)
            try:
                data = json.loads(text)
            except ValueError as e:
                raise _bad(f"a message is a JSON object: {e}", "invalid_json") from None
            if not isinstance(data, dict):
                raise _bad("a message is a JSON object", "invalid_json")
            return data

    @staticmethod
    def parse(model, data: dict):
        try:
            return model.model_validate(data)
        except ValidationError as e:
            errs = e.errors()[:5]
            msg = "; ".join(f"{'.'.join(map(str, x.get('loc', ()))) or 'message'}: {x.get('msg', 'invalid')}"
                            for x in errs)
            raise _bad(msg, "invalid_schema") from None

    async def open(self) -> EncoderOwner | None:
        """The start message -> the session's voice, options and encoder (the reply is sent);
        None if the client left first."""
        data = await self.receive_json(idle=False)
        if data is None:
            return None
        if data.get("type") != "start":
            raise _bad("the first message is {\"type\": \"start\", ...}", "bad_sequence")
        start = self.parse(SpeechStreamStart, data)
        svc = self.svc
        svc.check_ready()
        svc.check_model(start.model)
        self.voice, self.options = svc.voice_and_options(start.voice_name, True, start.option_values())
        voice = svc.engine.voice(self.voice)
        voice.units("Hello.", self.options)  # options (a speaker too) are checked now; nothing runs
        encoder = svc.open_encoder(self.voice, start.response_format)
        self.fmt, self.silence_s = start.response_format, voice.silence_after(self.options)
        media, _ = svc.headers_for(encoder, self.fmt)
        await self.ws.send_json({"type": "start", "voice": self.voice, "format": self.fmt,
                                 "sample_rate": encoder.sample_rate, "media_type": media})
        return encoder

    async def read(self) -> None:
        """Text pieces -> sentences submitted as they complete; returns when the client leaves."""
        while (data := await self.receive_json(idle=True)) is not None:
            kind = data.get("type")
            if self.ended:
                raise _bad("no message may follow {\"type\": \"end\"}", "bad_sequence")
            if kind == "text":
                await self.add_text(self.parse(StreamText, data).text)
            elif kind == "end":
                self.parse(StreamEnd, data)
                self.ended = True
                for sentence in self.buf.finish():
                    self.submit(sentence)
                self.parts.put_nowait(_END)
            else:
                raise _bad(f"unknown message type {kind!r}; after start: text, end", "bad_sequence")

    async def add_text(self, text: str) -> None:
        limit = self.config.max_input_chars
        # a client ahead of the audio waits until spoken sentences free room; text that cannot
        # fit even then (one sentence longer than the bound) is refused
        while self.owed + len(text) > limit and self.owed > len(self.buf.text):
            self.room.clear()
            await self.room.wait()
        if self.owed + len(text) > limit:
            raise TextTooLongError(self.owed + len(text), limit)
        self.owed += len(text)
        buf = self.buf
        if not buf.add(text):
            return
        for sentence in (await asyncio.to_thread(buf.split) if buf.heavy else buf.split()):
            self.submit(sentence)

    def submit(self, sentence: str) -> None:
        try:
            stream = self.svc.aengine.submit(self.voice, sentence, self.options, streaming=True)
        except UnpronounceableTextError:  # "..." or an emoji between sentences: nothing to say
            self.spoken(len(sentence))
            return
        self.live.append(stream)
        self.parts.put_nowait((stream, len(sentence)))

    def spoken(self, chars: int) -> None:
        self.owed = max(len(self.buf.text), self.owed - chars)
        self.room.set()

    # ------------------------------------------------------------------ writing
    async def send(self, send, payload) -> None:
        try:
            async with asyncio.timeout(self.config.stream_idle_timeout_s):
                await send(payload)
        except TimeoutError:  # the client does not read: its audio is not buffered without end
            raise _bad(f"the client took no audio for {self.config.stream_idle_timeout_s:g} s",
                       "client_too_slow") from None

    async def write(self, encoder: EncoderOwner) -> None:
        svc, fmt = self.svc, self.fmt
        joiner = None
        while (part := await self.parts.get()) is not _END:
            stream, chars = part
            if joiner is None:
                joiner = SentenceJoiner(stream.sample_rate, self.silence_s)
            try:
                async for chunk in until(stream, svc.deadline(stream)):
                    pieces = joiner.pieces(chunk.samples, chunk.partial)
                    if chunk.words:  # the chunk that starts a sentence: its words, after its silence
                        lead = sum(len(p) for p in pieces[:-1])
                        await self.send(self.ws.send_json, {
                            "type": "words", "index": self.sentences, "text": chunk.text,
                            "offset": round((self.samples + lead) / stream.sample_rate, 6),
                            "words": words_json(chunk.words, (self.samples + lead) / stream.sample_rate)})
                    for samples in pieces:
                        self.samples += len(samples)
                        data = await svc.encode(encoder, fmt, samples)
                        if data:
                            await self.send(self.ws.send_bytes, data)
                    self.sentences += not chunk.partial
            except UnpronounceableTextError:
                pass  # a sentence with nothing to say is skipped, as in Wyoming's streaming
            except TimeoutError:
                raise svc.timeout_error() from None
            finally:
                stream.cancel()
                self.live.remove(stream)
            self.spoken(chars)
        tail = await svc.encode_tail(encoder, fmt)
        if tail:
            await self.send(self.ws.send_bytes, tail)
        rate = encoder.sample_rate
        await self.send(self.ws.send_json, {"type": "done", "sentences": self.sentences,
                                            "audio_seconds": round(self.samples / rate, 3) if rate else 0.0})

    def cancel_all(self) -> None:
        for s in self.live:
            s.cancel()
        self.live.clear()
        while not self.parts.empty():
            part = self.parts.get_nowait()
            if part is not _END:
                part[0].cancel()


@router.websocket(PATH)
async def speech_stream(ws: WebSocket, svc: SpeechService = Depends(service)):
    config, metrics = svc.config, svc.metrics
    if not key_ok(config, ws.scope):
        metrics.requests.labels(PATH, "401").inc()
        denied = error_response(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                "invalid_request_error", "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            return await ws.send_denial_response(denied)
        return await ws.close(1008)
    await ws.accept()
    if svc.stream_sessions >= config.stream_max_connections:
        metrics.requests.labels(PATH, "503").inc()
        await _close(ws, _Closing(503, error_body(f"over {config.stream_max_connections} open speech streams; "
                                                  "retry later", "server_error", "too_many_connections"), 1013))
        return
    svc.stream_sessions += 1
    session = _Session(svc, ws)
    encoder: EncoderOwner | None = None
    tasks: list[asyncio.Task] = []
    status = "200"
    try:
        async with asyncio.timeout(config.request_timeout_s):
            encoder = await session.open()
            if encoder is None:
                status = "499"
                return
            reader = asyncio.create_task(session.read())
            writer = asyncio.create_task(session.write(encoder))
            tasks = [reader, writer]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if writer in done:
                writer.result()  # its error, if any
                await _close(ws, None)
            else:
                reader.result()  # its error, if any; else the client left
                status = "499"
    except TimeoutError:
        c = _bad(f"the session took over {config.request_timeout_s:g} s and was ended", "timeout", 1008, 504)
        status = str(c.status)
        await _close(ws, c)
    except (_Closing, VoxserveError, BadRequest) as e:
        c = _closing_for(e)
        status = str(c.status)
        if isinstance(e, OverloadedError):
            c.body["error"]["retry_after_s"] = e.retry_after_s
        await _close(ws, c)
    except Exception as e:  # a broken connection (the client left mid-send) or a server error
        if _left(ws):
            status = "499"
        else:
            c = _closing_for(e)
            status = str(c.status)
            await _close(ws, c)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except BaseException:  # (already handled above, or cancelled)
                pass
        session.cancel_all()
        if encoder is not None:
            encoder.abandon()  # closed once a write under way returns
        svc.stream_sessions -= 1
        metrics.requests.labels(PATH, status).inc()


def _left(ws: WebSocket) -> bool:
    return ws.client_state != WebSocketState.CONNECTED or ws.application_state != WebSocketState.CONNECTED


async def _close(ws: WebSocket, c: _Closing | None) -> None:
    """The error message (if any) and the close, each within a second: a client that does not
    read is dropped without its closing handshake."""
    try:
        async with asyncio.timeout(1.0):
            if c is not None:
                await ws.send_json({"type": "error", **c.body})
            await ws.close(1000 if c is None else c.close_code)
    except Exception:  # gone, or not reading: the server drops the connection
        pass
