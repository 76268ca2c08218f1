"""Home Assistant's Wyoming protocol (text to speech) around an engine.

Each connection is a stream of events (a JSON header line, then its data and payload). This
server answers `describe` with `info` (every loaded voice, its languages and speakers),
`synthesize` with `audio-start`, `audio-chunk`s and `audio-stop`, and a streamed request
(`synthesize-start`, `synthesize-chunk`s, `synthesize-stop`) with the same audio followed by
`synthesize-stopped`: a sentence goes to the engine as soon as the text after it shows that
it has ended, and the rest on `synthesize-stop`. Audio is 16-bit mono PCM at the voice's rate
in chunks of 1,024 samples (the last one shorter), as wyoming-piper sends it.

Requests go through `AsyncEngine`, so they share admission, scheduling and batching with the
HTTP server's (`voxserve serve --wyoming` runs both around one engine). Every input is
bounded: an event's size, the text of a request, the events of a connection, the requests
queued on one connection, the connections, the time a client may stay idle or take to send
(or read) an event. A client that disconnects cancels its requests.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlparse

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from .. import __version__
from ..audio import SentenceJoiner, float_to_int16
from ..engine import AsyncEngine, Engine, SpeechStream
from ..errors import (
    EngineClosedError,
    InvalidInputError,
    OverloadedError,
    TextTooLongError,
    UnknownSpeakerError,
    UnknownVoiceError,
    UnpronounceableTextError,
    VoxserveError,
)
from ..families import synthesis_options_of, synthesis_rules
from ..options import SynthesisOptions, check_values, options_for
from ..text.split import SentenceBuffer

log = logging.getLogger(__name__)

DEFAULT_URI = "tcp://127.0.0.1:10200"
SAMPLES_PER_CHUNK = 1024
"""Samples per audio-chunk event (wyoming-piper's size)."""
WIDTH, CHANNELS = 2, 1  # 16-bit mono
MAX_QUEUED = 4
YIELD_EVERY = 32
"""Events one connection handles before the event loop's other work gets a turn."""
"""Replies (requests, info) one connection may have waiting behind the one being written."""
_ATTRIBUTION = Attribution(name="voxserve", url="")


@dataclass(frozen=True)
class WyomingConfig:
    uri: str = DEFAULT_URI
    """tcp://HOST:PORT (loopback by default; port 0 picks a free one) or unix://PATH."""
    max_input_chars: int = 4096
    """Text of one request (a streamed one: all its chunks); the HTTP server's bound."""
    max_connections: int = 64
    """Connections open at once; one beyond gets an error event and is closed."""
    max_events: int = 20_000
    """Events one connection may send (Home Assistant opens one per request; a streamed request
    sends a chunk per few characters)."""
    max_event_bytes: int = 1 << 16
    """An event's header line, and its data and payload together."""
    idle_timeout_s: float = 60.0
    """A connection with no request running that sends nothing for this long is closed."""
    io_timeout_s: float = 30.0
    """Seconds a client has to send the rest of an event it has begun, or to take one we send."""
    request_timeout_s: float = 600.0
    """A request (each engine request of a streamed one) still running after this is cancelled."""
    options: Mapping[str, object] = field(default_factory=dict)
    """Synthesis options every request uses (the protocol carries only voice, speaker and
    language), by name: each voice takes those of its family's class, as over HTTP."""

    def validate(self) -> "WyomingConfig":
        parse_uri(self.uri)
        for name in ("max_input_chars", "max_connections", "max_events", "max_event_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "io_timeout_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be over 0 s, got {getattr(self, name)}")
        check_values(self.options, synthesis_rules())
        return self


def parse_uri(uri: str) -> tuple[str, str, int | None]:
    """("tcp", host, port) or ("unix", path, None); ValueError for anything else."""
    u = urlparse(uri)
    if u.scheme == "tcp":
        try:
            port = u.port
        except ValueError:
            port = None
        if not u.hostname or port is None:
            raise ValueError(f"a Wyoming URI needs a host and a port (tcp://127.0.0.1:10200), got {uri!r}")
        return "tcp", u.hostname, port
    if u.scheme == "unix" and u.path:
        return "unix", u.path, None
    raise ValueError(f"a Wyoming URI is tcp://HOST:PORT or unix://PATH, got {uri!r}")


class _ProtocolError(Exception):
    """The client broke the protocol or a bound: answered with an error event, then closed."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def error_code(exc: BaseException) -> str:
    """The `code` of the error event for an exception (as the HTTP edge's codes)."""
    for kind, code in ((UnknownVoiceError, "voice_not_found"), (UnknownSpeakerError, "unknown_speaker"),
                       (TextTooLongError, "text_too_long"), (InvalidInputError, "invalid_input"),
                       (OverloadedError, "busy"), (EngineClosedError, "unavailable"),
                       (TimeoutError, "timeout")):
        if isinstance(exc, kind):
            return code
    return "server_error"


def _lang_key(lang: str) -> str:
    return lang.replace("-", "_").lower()


class _Chunker:
    """Float samples -> 16-bit PCM chunks of exactly `n` samples; `flush` gives the rest."""

    def __init__(self, n: int = SAMPLES_PER_CHUNK):
        self.n = n
        self.rest = np.zeros(0, dtype="<i2")

    def push(self, samples: np.ndarray) -> list[bytes]:
        pcm = np.concatenate([self.rest, float_to_int16(samples)])
        full = len(pcm) // self.n * self.n
        self.rest = pcm[full:]
        return [pcm[i:i + self.n].tobytes() for i in range(0, full, self.n)]

    def flush(self) -> list[bytes]:
        out, self.rest = ([self.rest.tobytes()] if len(self.rest) else []), self.rest[:0]
        return out


_END = object()


class _Job:
    """One request's reply: its engine streams in order (one for `synthesize`, one per sentence
    for a streamed request), ended by _END or an exception (then an error event)."""

    def __init__(self, voice: str, options: SynthesisOptions, sample_rate: int, silence_s: float, streaming: bool):
        self.voice, self.options, self.streaming = voice, options, streaming
        self.sample_rate, self.silence_s = sample_rate, silence_s
        self.parts: asyncio.Queue = asyncio.Queue()
        self.streams: list[SpeechStream] = []
        self.ended = False

    def add(self, stream: SpeechStream) -> None:
        self.streams.append(stream)
        self.parts.put_nowait(stream)

    def end(self, error: BaseException | None = None) -> None:
        if not self.ended:
            self.ended = True
            self.parts.put_nowait(_END if error is None else error)

    def cancel(self) -> None:
        for s in self.streams:
            s.cancel()


class _Connection:
    def __init__(self, server: "WyomingServer", reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server, self.reader, self.writer = server, reader, writer
        self.config = server.config
        self.engine = server.engine
        self.replies: asyncio.Queue = asyncio.Queue()  # Events, _Jobs
        self.queued = 0  # replies not yet written
        self.jobs: set[_Job] = set()  # not yet written to their end
        self.streamed: _Job | None = None  # the streamed request taking synthesize-chunks
        self.streamed_text = SentenceBuffer()
        self.streamed_chars = 0
        self.streamed_failed = False  # after its error, its chunks are ignored until synthesize-stop

    # ------------------------------------------------------------------ reading
    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_replies())
        try:
            for n in itertools.count(1):
                event = await self._read_event()
                if event is None:
                    return  # the client is gone (or closed its side): its requests are cancelled below
                if n > self.config.max_events:
                    raise _ProtocolError(f"over {self.config.max_events} events on one connection; open a new one",
                                         "too_many_events")
                if SynthesizeChunk.is_type(event.type):
                    await self._stream_chunk(event)  # may split on a worker thread
                else:
                    self._handle(event)
                if n % YIELD_EVERY == 0:
                    # buffered events are read without a pause: let the loop's other work
                    # (other connections, the HTTP server) run between bursts
                    await asyncio.sleep(0)
        except _ProtocolError as e:
            log.info("wyoming client %s: %s", self._peer(), e)
            # the writer stops between events (a cancelled write leaves whole events buffered)
            writer_task.cancel()
            await asyncio.gather(writer_task, return_exceptions=True)
            try:
                await self._send(Error(text=str(e), code=e.code).event())
            except (TimeoutError, ConnectionError):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # gone, or too slow to send the rest of an event
        finally:
            writer_task.cancel()
            for job in self.jobs:
                job.cancel()
            self.writer.close()

    def _peer(self) -> str:
        return str(self.writer.get_extra_info("peername"))

    async def _read_event(self) -> Event | None:
        cfg = self.config
        while True:
            try:
                async with asyncio.timeout(cfg.idle_timeout_s):
                    line = await self.reader.readline()
                break
            except TimeoutError:
                if self.streamed is not None:
                    raise _ProtocolError(f"no text for {cfg.idle_timeout_s:g} s in a streamed request",
                                         "timeout") from None
                if not self.jobs:  # idle: no request running
                    return None
                # audio is being sent: waiting for the client's next event is normal
            except ValueError:  # over the reader's limit (max_event_bytes)
                raise _ProtocolError(f"an event header is over {cfg.max_event_bytes} bytes", "event_too_large") from None
        if not line:
            return None
        try:
            header = json.loads(line)
        except RecursionError:  # nested past the parser's depth: an answer, not a dead task
            raise _ProtocolError("an event header is nested too deeply", "bad_event") from None
        except ValueError:
            raise _ProtocolError("an event header is not JSON", "bad_event") from None
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            raise _ProtocolError("an event header is a JSON object with a string 'type'", "bad_event")
        data = header.get("data") or {}
        lengths = [header.get("data_length") or 0, header.get("payload_length") or 0]
        if not isinstance(data, dict) or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in lengths):
            raise _ProtocolError("an event's data is an object and its lengths whole numbers", "bad_event")
        if len(line) + sum(lengths) > cfg.max_event_bytes:
            raise _ProtocolError(f"an event is over {cfg.max_event_bytes} bytes", "event_too_large")
        payload = None
        async with asyncio.timeout(cfg.io_timeout_s):
            if lengths[0]:
                try:
                    more = json.loads(await self.reader.readexactly(lengths[0]))
                except RecursionError:
                    raise _ProtocolError("an event's data is nested too deeply", "bad_event") from None
                except ValueError:
                    raise _ProtocolError("an event's data is not JSON", "bad_event") from None
                if not isinstance(more, dict):
                    raise _ProtocolError("an event's data is a JSON object", "bad_event")
                data = {**data, **more}
            if lengths[1]:
                payload = await self.reader.readexactly(lengths[1])
        return Event(type=header["type"], data=data, payload=payload)

    # ------------------------------------------------------------------ events
    def _reply(self, item) -> None:
        self.queued += 1
        self.replies.put_nowait(item)

    def _room(self) -> None:
        """Before a request (or describe): the replies waiting on this connection are bounded."""
        if self.queued > MAX_QUEUED:
            raise _ProtocolError(f"over {MAX_QUEUED} replies waiting on one connection; wait for them",
                                 "too_many_requests")

    def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            self._room()
            self._reply(self.server.info().event())
        elif Synthesize.is_type(event.type):
            if self.streamed is not None or self.streamed_failed:
                return  # a streaming client repeats the whole text in one for older servers
            self._synthesize(event)
        elif SynthesizeStart.is_type(event.type):
            self._stream_start(event)
        elif SynthesizeStop.is_type(event.type):
            self._stream_stop()
        # other events (ping, audio of other programs) are not for a TTS server: ignored

    def _voice_and_options(self, data: dict) -> tuple[str, SynthesisOptions]:
        name, values = self._voice_and_values(data)
        return name, options_for(synthesis_options_of(self.engine.voice(name)), values, synthesis_rules())

    def _voice_and_values(self, data: dict) -> tuple[str, dict]:
        voice = data.get("voice")
        opts = dict(self.config.options)
        if voice is None:
            return self.server.default_voice, opts
        if not isinstance(voice, dict):
            raise InvalidInputError("'voice' is an object with a name, a language or a speaker")
        name, lang, speaker = voice.get("name"), voice.get("language"), voice.get("speaker")
        for key, v in (("name", name), ("language", lang), ("speaker", speaker)):
            if v is not None and not isinstance(v, str):
                raise InvalidInputError(f"voice {key} must be a string, got {v!r}")
        if name is not None:
            if name not in self.engine.voices:
                raise UnknownVoiceError(name, sorted(self.engine.voices))
        elif lang is not None:
            name, lang_option = self.server.voice_for_language(lang)
            if lang_option is not None:
                opts["language"] = lang_option
        else:
            name = self.server.default_voice
        if speaker is not None:
            opts["speaker"] = speaker
        return name, opts

    def _new_job(self, data: dict, streaming: bool) -> _Job:
        self.server.check_ready()
        name, opts = self._voice_and_options(data)
        voice = self.engine.voice(name)
        # options (an unknown speaker too) are checked at once; its sentences are lazy, never run
        voice.units("Hello.", opts)
        return _Job(name, opts, voice.sample_rate, voice.silence_after(opts), streaming)

    def _submit(self, job: _Job, text: str) -> None:
        job.add(self.server.aengine.submit(job.voice, text, job.options, streaming=True))

    def _failed(self, exc: BaseException) -> None:
        self._reply(Error(text=str(exc), code=error_code(exc)).event())

    def _synthesize(self, event: Event) -> None:
        self._room()
        text = event.data.get("text")
        try:
            if not isinstance(text, str):
                raise InvalidInputError("'synthesize' needs a 'text' string")
            if len(text) > self.config.max_input_chars:
                raise TextTooLongError(len(text), self.config.max_input_chars)
            job = self._new_job(event.data, streaming=False)
            self._submit(job, text)
        except VoxserveError as e:
            self._failed(e)
            return
        job.end()
        self.jobs.add(job)
        self._reply(job)

    def _stream_start(self, event: Event) -> None:
        if self.streamed is not None:
            raise _ProtocolError("synthesize-start before the previous request's synthesize-stop", "bad_sequence")
        self._room()
        self.streamed_text, self.streamed_chars, self.streamed_failed = SentenceBuffer(), 0, False
        try:
            job = self._new_job(event.data, streaming=True)
        except VoxserveError as e:
            self.streamed_failed = True
            self._failed(e)
            return
        self.streamed = job
        self.jobs.add(job)
        self._reply(job)

    async def _stream_chunk(self, event: Event) -> None:
        job = self.streamed
        if job is None:
            if self.streamed_failed:
                return
            raise _ProtocolError("synthesize-chunk without synthesize-start", "bad_sequence")
        text = event.data.get("text")
        if not isinstance(text, str):
            raise _ProtocolError("'synthesize-chunk' needs a 'text' string", "bad_event")
        # a chunk counts as one character at least: empty chunks, which cost an event each,
        # cannot go on for ever within a request's bound
        self.streamed_chars += max(1, len(text))
        buf = self.streamed_text
        try:
            if self.streamed_chars > self.config.max_input_chars:
                raise TextTooLongError(self.streamed_chars, self.config.max_input_chars)
            if not buf.add(text):
                return
            sentences = await asyncio.to_thread(buf.split) if buf.heavy else buf.split()
            if self.streamed is not job:  # gone meanwhile
                return
            for sentence in sentences:
                self._submit_sentence(job, sentence)
        except VoxserveError as e:
            self._stream_failed(job, e)

    def _submit_sentence(self, job: _Job, sentence: str) -> None:
        try:
            self._submit(job, sentence)
        except UnpronounceableTextError:  # "..." or an emoji between sentences: nothing to say
            pass

    def _stream_failed(self, job: _Job, exc: BaseException) -> None:
        job.cancel()
        job.end(exc)
        self.streamed, self.streamed_failed = None, True

    def _stream_stop(self) -> None:
        job = self.streamed
        if job is None:
            if self.streamed_failed:  # its error went out: close the exchange as the client expects
                self.streamed_failed = False
                self._reply(SynthesizeStopped().event())
                return
            raise _ProtocolError("synthesize-stop without synthesize-start", "bad_sequence")
        try:
            for sentence in self.streamed_text.finish():
                self._submit_sentence(job, sentence)
        except VoxserveError as e:
            self._stream_failed(job, e)
            self.streamed_failed = False
            self._reply(SynthesizeStopped().event())
            return
        self.streamed = None
        job.end()

    # ------------------------------------------------------------------ writing
    async def _send(self, event: Event) -> None:
        async with asyncio.timeout(self.config.io_timeout_s):
            await async_write_event(event, self.writer)

    async def _write_replies(self) -> None:
        try:
            while (item := await self.replies.get()) is not None:
                if isinstance(item, _Job):
                    try:
                        await self._write_job(item)
                    finally:
                        self.jobs.discard(item)
                else:
                    await self._send(item)
                self.queued -= 1
        except ConnectionError:  # the client left: the reader then sees the end and cancels its requests
            self.writer.close()

    async def _write_job(self, job: _Job) -> None:
        rate = job.sample_rate
        await self._send(AudioStart(rate=rate, width=WIDTH, channels=CHANNELS).event())
        joiner, chunker = SentenceJoiner(rate, job.silence_s), _Chunker()

        async def send(pcm: list[bytes]) -> None:
            for data in pcm:
                await self._send(AudioChunk(rate=rate, width=WIDTH, channels=CHANNELS, audio=data).event())

        while (part := await job.parts.get()) is not _END:
            if isinstance(part, BaseException):
                await self._send(Error(text=str(part), code=error_code(part)).event())
                job.cancel()
                return
            try:
                async with asyncio.timeout_at(self._deadline(part)):
                    async for chunk in part:
                        for samples in joiner.pieces(chunk.samples, chunk.partial):
                            await send(chunker.push(samples))
            except UnpronounceableTextError as e:
                if not job.streaming:  # a streamed request just skips a sentence with nothing to say
                    return await self._job_error(job, e)
            except (VoxserveError, TimeoutError) as e:
                return await self._job_error(job, e)
            except ConnectionError:  # the client left mid-answer: not a failure of the request
                raise
            except Exception as e:
                log.error("wyoming request failed", exc_info=e)
                return await self._job_error(job, VoxserveError("internal error"))
            if job.parts.empty():  # the audio caught up with the text: send what is held back
                await send(chunker.flush())
        await send(chunker.flush())
        await self._send(AudioStop().event())
        if job.streaming:
            await self._send(SynthesizeStopped().event())

    def _deadline(self, stream: SpeechStream) -> float:
        # the request's deadline on the loop's clock (the stream's timing is time.monotonic())
        left = stream.timing.submitted + self.config.request_timeout_s - time.monotonic()
        return asyncio.get_running_loop().time() + max(0.0, left)

    async def _job_error(self, job: _Job, exc: BaseException) -> None:
        job.cancel()
        if isinstance(exc, TimeoutError):
            exc = TimeoutError(f"the request took over {self.config.request_timeout_s:g} s and was cancelled")
        await self._send(Error(text=str(exc), code=error_code(exc)).event())
        if job.streaming and self.streamed is job:  # the client is still streaming its text
            self.streamed, self.streamed_failed = None, True
        elif job.streaming:
            await self._send(SynthesizeStopped().event())


class WyomingServer:
    """The Wyoming server of an engine. `await start()` binds, `await close()` stops; the
    engine is started and shut down by whoever owns it. `ready` (if given) gates synthesis:
    until it is set, requests get an error event (describe still works)."""

    def __init__(self, engine: Engine, config: WyomingConfig | None = None, ready: threading.Event | None = None):
        self.engine = engine
        self.aengine = AsyncEngine(engine)
        self.config = (config or WyomingConfig()).validate()
        self.ready = ready
        self.default_voice = next(iter(engine.voices))
        self.languages = {name: list(v.language_codes) for name, v in engine.voices.items()}  # (fixed at start)
        self._info: Info | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ voices
    def info(self) -> Info:
        if self._info is None:  # the voices are fixed at start
            voices = []
            for name, v in self.engine.voices.items():
                speakers = [TtsVoiceSpeaker(name=s) for s in v.speakers] or None
                voices.append(TtsVoice(name=name, attribution=_ATTRIBUTION, installed=True,
                                       description=f"{name} ({v.family}, {v.sample_rate} Hz)",
                                       version=None, languages=self.languages[name], speakers=speakers))
            program = TtsProgram(name="voxserve", attribution=_ATTRIBUTION, installed=True,
                                 description="voxserve text to speech", version=__version__, voices=voices,
                                 supports_synthesize_streaming=True)
            self._info = Info(tts=[program])
        return self._info

    def voice_for_language(self, lang: str) -> tuple[str, str | None]:
        """The first voice speaking `lang` ("en" matches "en_US"; "-" and "_" alike), and the
        language option to pass (the tag) if the voice speaks several."""
        want = _lang_key(lang)
        for name, v in self.engine.voices.items():
            for have in self.languages[name]:
                key = _lang_key(have)
                if key == want or key.split("_")[0] == want:
                    return name, (have if v.languages else None)  # the option takes the tags
        raise InvalidInputError(f"no voice here speaks {lang!r} (voices: {', '.join(self.engine.voices)})")

    def check_ready(self) -> None:
        if self.ready is not None and not self.ready.is_set():
            raise EngineClosedError("the server is not ready yet (loading or warming up voices)")

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        kind, where, port = parse_uri(self.config.uri)
        limit = self.config.max_event_bytes  # the reader's bound on one header line
        if kind == "tcp":
            self._server = await asyncio.start_server(self._accept, host=where, port=port, limit=limit)
        else:
            self._server = await asyncio.start_unix_server(self._accept, path=where, limit=limit)

    @property
    def address(self) -> str:
        """The URI it listens on (with the port chosen when the configured one is 0)."""
        sock = self._server.sockets[0]
        name = sock.getsockname()
        if isinstance(name, tuple):
            host = name[0] if ":" not in name[0] else f"[{name[0]}]"
            return f"tcp://{host}:{name[1]}"
        return f"unix://{name}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tasks) >= self.config.max_connections:
            try:
                async with asyncio.timeout(self.config.io_timeout_s):
                    await async_write_event(Error(text=f"over {self.config.max_connections} connections; retry later",
                                                  code="too_many_connections").event(), writer)
            except (TimeoutError, ConnectionError):
                pass
            writer.close()
            return
        # the connection runs as a task of its own, which close() cancels: asyncio logs a
        # cancelled connection callback (this coroutine) as an error
        task = asyncio.create_task(_Connection(self, reader, writer).run())
        self._tasks.add(task)
        try:
            (result,) = await asyncio.gather(task, return_exceptions=True)
        finally:
            self._tasks.discard(task)
        if isinstance(result, Exception):
            log.error("wyoming connection failed", exc_info=result)

    @property
    def connections(self) -> int:
        return len(self._tasks)

    def stop_listening(self) -> None:
        """No new connections; the open ones go on."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop listening and end every connection (their requests are cancelled)."""
        self.stop_listening()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


async def warm_up(engine: Engine) -> None:
    """Each voice's own warm-up, then one sentence through the engine (a first request is then
    as fast as the next). Before any traffic: it uses the models from a worker thread."""
    await asyncio.to_thread(engine.warm_up)


async def serve(engine: Engine, config: WyomingConfig, warmup: bool = True, shutdown_timeout_s: float = 30.0,
                on_ready=None) -> None:
    """`voxserve wyoming`: start the engine, warm it up, serve until SIGINT or SIGTERM, then
    stop listening and let accepted requests finish (up to shutdown_timeout_s)."""
    engine.start()
    try:
        if warmup:
            await warm_up(engine)
        server = WyomingServer(engine, config)
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
                pass
        if on_ready is not None:
            on_ready(server)
        await stop.wait()
        server.stop_listening()
        await asyncio.to_thread(engine.drain, shutdown_timeout_s)  # accepted requests finish
        await server.close()
    finally:
        await asyncio.to_thread(engine.shutdown, shutdown_timeout_s)


async def serve_with_http(http_server, ready: threading.Event, engine: Engine, config: WyomingConfig,
                          on_ready=None) -> None:
    """`voxserve serve --wyoming`: the Wyoming server beside the HTTP one (a uvicorn Server, whose
    app owns the engine's start, warm-up and shutdown), on one event loop and one engine."""
    server = WyomingServer(engine, config, ready=ready)
    await server.start()  # a port in use fails here, before the HTTP server starts
    if on_ready is not None:
        on_ready(server)
    try:
        await http_server.serve()
    finally:
        await server.close()
