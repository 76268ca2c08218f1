"""The server's one service object: the engine, its asyncio side, the settings, the metrics,
readiness and the voices (those made over HTTP: `ClonedVoices`); what every route (HTTP,
WebSocket) calls to start a request, encode its audio and end it. Routes hold no state of their
own (`service(request)` finds this)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
from starlette.requests import HTTPConnection, Request

from ..audio import EncoderOwner, SentenceJoiner, encode_audio, open_stream_encoder
from ..engine import AsyncEngine, Engine, SpeechStream
from ..engine.held_audio import HeldAudio
from ..errors import EngineClosedError, TextTooLongError, UnknownVoiceError, VoxserveError
from ..families import synthesis_options_of, synthesis_rules
from ..options import SynthesisOptions, options_for
from ..voices.registry import OPENAI_VOICES, resolve_voice
from .clones import ClonedVoices
from .config import AppConfig
from .http_errors import FAILED_LATE, BadRequest, CutShort, InternalError, error_body, error_for
from .metrics import Metrics
from .schemas import MODEL_ID, OPENAI_MODELS

log = logging.getLogger(__name__)


def service(conn: HTTPConnection) -> "SpeechService":
    """The app's service (a FastAPI dependency of every route; HTTP and WebSocket alike)."""
    return conn.app.state.service


class SpeechService:
    """What the routes share. Built once per app by `create_app`."""

    def __init__(self, engine: Engine, config: AppConfig, metrics: Metrics):
        self.engine, self.config, self.metrics = engine, config, metrics
        self.aengine = AsyncEngine(engine, HeldAudio(int(config.max_held_audio_mb * 2**20)))
        self.default_voice = next(iter(engine.voices))
        self.ready = threading.Event()
        self.warmed: list[str] = []  # the voices whose warm-up ran to the end, in order
        self.clones = ClonedVoices(engine, config.voice_dir)
        self.stream_sessions = 0  # open /v1/audio/speech/stream sessions (changed on the event loop only)

    # ------------------------------------------------------------------ lifecycle
    def warm_up(self) -> None:
        # Until `ready` is set every request is refused (503): nothing else is on the models
        self.warmed.extend(self.engine.warm_up())
        self.ready.set()

    def start_up(self) -> None:
        """Start the engine and (in the background) warm it up; `ready` is set after."""
        self.engine.start()
        if self.config.warmup:
            threading.Thread(target=self.warm_up, name="voxserve-warmup", daemon=True).start()
        else:
            self.ready.set()

    async def shut_down(self) -> None:
        self.ready.clear()
        await asyncio.to_thread(self.engine.shutdown, self.config.shutdown_timeout_s)

    def check_ready(self) -> None:
        if not self.ready.is_set():
            raise EngineClosedError("the server is not ready yet (loading or warming up voices)")

    # ------------------------------------------------------------------ voices
    def voice_for(self, name: str | None, openai: bool) -> str:
        """The loaded voice a request names (None: the default; with `openai`, OpenAI's names
        mean the default too); UnknownVoiceError (404) otherwise."""
        engine = self.engine
        if name is None:
            return self.default_voice
        if name in engine.voices:
            return name
        if openai and name.lower() in OPENAI_VOICES:
            return self.default_voice
        resolve_voice(name, allow_paths=False)  # unknown: UnknownVoiceError (404) listing the registry
        raise UnknownVoiceError(name, sorted(engine.voices))  # installed but not loaded here

    def voice_and_options(self, name: str | None, openai: bool,
                          values: Mapping[str, Any]) -> tuple[str, SynthesisOptions]:
        """The loaded voice a request names and its options (name -> value, None: unset) as
        that voice's class (`options_for`: each value checked against its rule, InvalidOptionError
        naming a bad one; another family's options dropped); a voice made over HTTP
        (`ClonedVoices`) is its maker's voice with its speaker."""
        rules = synthesis_rules()
        if name is not None and name not in self.engine.voices:
            base = self.clones.made.get(name)
            if base is not None:
                return base, self.clones.with_speaker(name, options_for(synthesis_options_of(self.engine.voice(base)),
                                                                        values, rules))
        voice = self.voice_for(name, openai)
        return voice, options_for(synthesis_options_of(self.engine.voice(voice)), values, rules)

    def check_model(self, model: str) -> None:
        if model not in OPENAI_MODELS and model != MODEL_ID and model not in self.engine.voices:
            raise BadRequest(f"unknown model {model!r}; use one of: {', '.join((MODEL_ID,) + OPENAI_MODELS)}",
                             "model", "model_not_found", status=404)

    # ------------------------------------------------------------------ requests
    def open_encoder(self, voice: str, fmt: str) -> EncoderOwner:
        try:
            return EncoderOwner(open_stream_encoder(fmt, self.engine.voice(voice).sample_rate))
        except ValueError as e:
            raise BadRequest(str(e), "response_format", "unsupported_format") from None

    def check_text(self, text: str) -> None:
        if not isinstance(text, str) or len(text) > self.config.max_input_chars:
            raise TextTooLongError(len(text), self.config.max_input_chars)

    def timeout_error(self) -> BadRequest:
        return BadRequest(f"the request took over {self.config.request_timeout_s:g} s and was cancelled",
                          code="timeout", status=504)

    async def start(self, voice: str, text: str, options: SynthesisOptions, fmt: str, streaming: bool):
        """Submit a request and wait for its first chunk (an error the front end finds late is
        then still a 4xx): (its stream, its encoder)."""
        self.check_ready()
        self.check_text(text)
        encoder = self.open_encoder(voice, fmt)
        try:
            stream = self.aengine.submit(voice, text, options, streaming=streaming)
        except BaseException:
            encoder.abandon()
            raise
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                await stream.first()  # errors the front end finds late (nothing pronounceable) -> 4xx
        except BaseException as e:
            stream.cancel()
            encoder.abandon()
            if isinstance(e, TimeoutError):
                raise self.timeout_error() from None
            if isinstance(e, Exception) and not isinstance(e, VoxserveError):
                log.error("request failed", exc_info=e)
                raise InternalError("internal error") from None
            raise
        return stream, encoder

    @staticmethod
    def headers_for(encoder: EncoderOwner, fmt: str) -> tuple[str, dict]:
        sr = encoder.sample_rate
        headers = {"X-Sample-Rate": str(sr), "Cache-Control": "no-store"}
        media = encoder.media_type
        if fmt == "pcm":
            media = f"audio/L16; rate={sr}; channels=1"
            headers["X-Audio-Format"] = "s16le; channels=1"
        return media, headers

    @staticmethod
    async def encode(encoder: EncoderOwner, fmt: str, samples: np.ndarray) -> bytes:
        if fmt in ("pcm", "wav"):
            return encoder.write(samples)
        return await asyncio.to_thread(encoder.write, samples)  # lame/opus/flac: off the loop

    @staticmethod
    async def encode_tail(encoder: EncoderOwner, fmt: str) -> bytes:
        if fmt in ("pcm", "wav"):
            return encoder.finish()
        return await asyncio.to_thread(encoder.finish)

    @staticmethod
    async def encode_whole(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
        if fmt in ("wav", "pcm"):  # a header and a copy: no thread needed
            return encode_audio(samples, sample_rate, fmt)
        if fmt in ("flac", "mp3"):
            return await asyncio.to_thread(encode_audio, samples, sample_rate, fmt)
        enc = open_stream_encoder(fmt, sample_rate)
        return await asyncio.to_thread(lambda: enc.write(samples) + enc.close())

    def cut_short(self, request: Request, stream: SpeechStream, exc: Exception) -> CutShort:
        """A failure after the first bytes went out: logged once (a traceback only for a server
        error), left for the guard to count as its own status; the CutShort to raise."""
        if isinstance(exc, TimeoutError):
            status, error = 504, error_body(f"the request took over {self.config.request_timeout_s:g} s and was "
                                            "cancelled", "invalid_request_error", "timeout")
        else:
            known = isinstance(exc, VoxserveError) and not isinstance(exc, InternalError)
            r = error_for(exc if known else InternalError("internal error"), log_internal=False)
            status, error = r.status_code, json.loads(r.body)
        if status >= 500:
            log.error("request %s failed after its first bytes", stream.request_id, exc_info=exc)
        else:
            log.warning("request %s failed after its first bytes (%s): %s", stream.request_id,
                        error["error"]["code"], error["error"]["message"])
        request.scope[FAILED_LATE].append((status, error["error"]["code"]))
        return CutShort(error)

    def deadline(self, stream: SpeechStream) -> float:
        """The request's deadline (monotonic seconds)."""
        return stream.timing.submitted + self.config.request_timeout_s

    async def timed_chunks(self, stream: SpeechStream) -> AsyncIterator:
        """The stream's chunks until the request's deadline; its time to first audio is observed
        when the first one comes."""
        first = True
        async for chunk in until(stream, self.deadline(stream)):
            if first:
                first = False
                if stream.timing.first_audio is not None:
                    self.metrics.ttfa.observe(stream.timing.first_audio - stream.timing.submitted)
            yield chunk

    async def collect(self, request: Request, stream: SpeechStream, encoder: EncoderOwner):
        """A whole request's chunks (cancelling if the client goes away: None), within its timeout."""
        try:
            async with asyncio.timeout(max(0.0, self.deadline(stream) - time.monotonic())):
                chunks = await collect_or_cancel(stream, request)
        except TimeoutError:
            stream.cancel()
            raise self.timeout_error() from None
        except VoxserveError:
            raise
        except Exception as e:
            log.error("request failed", exc_info=e)
            raise InternalError("internal error") from None
        finally:
            encoder.abandon()  # never written: the whole file is encoded on its own
        if chunks is not None and stream.timing.first_audio is not None:
            self.metrics.ttfa.observe(stream.timing.first_audio - stream.timing.submitted)
        return chunks

    async def body(self, request: Request, stream: SpeechStream, encoder: EncoderOwner, fmt: str,
                   silence_s: float, sent: list[int] | None = None) -> AsyncIterator[bytes]:
        """The encoded stream; `sent[0]` counts the samples encoded so far."""
        joiner = SentenceJoiner(stream.sample_rate, silence_s)
        try:
            async for chunk in self.timed_chunks(stream):
                for samples in joiner.pieces(chunk.samples, chunk.partial):
                    if sent is not None:
                        sent[0] += len(samples)
                    data = await self.encode(encoder, fmt, samples)
                    if data:
                        yield data
            tail = await self.encode_tail(encoder, fmt)
            if tail:
                yield tail
        except Exception as e:
            # the status line is already sent: abort the connection (no closing chunk) so the
            # client sees a broken transfer rather than a short file that looks complete
            raise self.cut_short(request, stream, e) from e
        finally:
            stream.cancel()
            encoder.abandon()  # a client that left: closed once the write under way returns


async def until(stream: SpeechStream, deadline: float) -> AsyncIterator:
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


async def collect_or_cancel(stream: SpeechStream, request: Request, poll_s: float = 0.2):
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
