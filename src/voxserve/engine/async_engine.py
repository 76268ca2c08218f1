"""The asyncio side of the engine: one awaitable stream of audio chunks per request.

Handlers never touch torch: results cross from the engine's threads through a per-request
asyncio queue (`loop.call_soon_threadsafe`). Leaving the stream early (a client disconnect, a
timeout, an exception) cancels the request, so its queued sentences are never synthesised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from ..audio import AudioChunk
from ..options import SynthesisOptions
from .engine import Engine, Sink
from .held_audio import HeldAudio

_DONE = object()


class _QueueSink(Sink):
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self._words: dict[int, tuple] = {}  # index -> its words, until its first audio is put

    def on_words(self, index: int, words: tuple) -> None:
        self._words[index] = words

    def _put(self, x) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, x)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def on_audio(self, index: int, samples: np.ndarray, text: str, partial: bool = False) -> None:
        self._put((index, samples, text, partial, self._words.pop(index, ())))

    def on_done(self, n_sentences: int) -> None:
        self._put(_DONE)

    def on_error(self, error: BaseException) -> None:
        self._put(error)


@dataclass
class RequestTiming:
    """Filled in as a stream runs (seconds, monotonic clock)."""

    submitted: float = 0.0
    first_audio: float | None = None
    finished: float | None = None
    audio_seconds: float = 0.0
    sentences: int = 0


class SpeechStream:
    """An accepted request. Iterate it (async) for AudioChunks in order; `aclose()` (or leaving an
    `async with`/`async for` early) cancels what is left."""

    def __init__(self, engine: Engine, request_id: int, sink: _QueueSink, sample_rate: int,
                 held: HeldAudio | None = None):
        self.engine = engine
        self._held = held  # a whole answer's charge of audio held (None: streamed, not charged)
        # the charge's key in `held`: not the stream itself, which the ledger would then keep
        # alive, so that a stream dropped unreleased never reached `__del__` (its release)
        self._held_key = object()
        self._samples = 0
        self.request_id = request_id
        self._sink = sink
        self.sample_rate = sample_rate
        self.timing = RequestTiming(submitted=time.monotonic())
        self._done = False
        self._peeked: AudioChunk | None = None

    async def _next(self) -> AudioChunk | None:
        if self._done:
            return None
        x = await self._sink.queue.get()
        if x is _DONE:
            self._done = True
            self.timing.finished = time.monotonic()
            return None
        if isinstance(x, BaseException):
            self._done = True
            self.release_held()
            raise x
        index, samples, text, partial, words = x
        if self._held is not None:
            self._samples += len(samples)
            self._held.holds(self._held_key, self._samples)
        if self.timing.first_audio is None:
            self.timing.first_audio = time.monotonic()
        self.timing.audio_seconds += len(samples) / self.sample_rate
        self.timing.sentences += not partial
        return AudioChunk(samples, self.sample_rate, words, index=index, text=text, partial=partial)

    async def first(self) -> AudioChunk | None:
        """Wait for the first chunk (or the request's error) without consuming it: lets an
        HTTP handler turn an error found by the front end into a 4xx before it starts a response."""
        if self._peeked is None:
            self._peeked = await self._next()
        return self._peeked

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[AudioChunk]:
        try:
            if self._peeked is not None:
                c, self._peeked = self._peeked, None
                yield c
            while (c := await self._next()) is not None:
                yield c
        finally:
            if not self._done:
                self.cancel()

    def cancel(self) -> None:
        self.release_held()
        if not self._done:
            self._done = True
            self.engine.cancel(self.request_id)

    def release_held(self) -> None:
        """A whole answer's audio is no longer held (sent, failed or dropped): its charge goes."""
        if self._held is not None:
            self._held.release(self._held_key)

    async def aclose(self) -> None:
        self.cancel()

    def __del__(self):  # a stream dropped without being read to the end frees its sentences
        try:
            self.cancel()
        except Exception:  # interpreter shutdown: nothing left to free
            pass

    async def collect(self) -> list[AudioChunk]:
        return [c async for c in self]


class AsyncEngine:
    def __init__(self, engine: Engine, held: HeldAudio | None = None):
        self.engine = engine
        self.held = held
        """The budget of audio whole answers hold (None: not bounded)."""

    def submit(self, voice: str, text: str, options: SynthesisOptions | None = None,
               streaming: bool = True) -> SpeechStream:
        """Accept a request now (raises UnknownVoiceError, OverloadedError, EngineClosedError; a
        whole answer past the held-audio budget: OverloadedError / AudioTooLongError) and return
        its stream. Must be called on the event loop thread, which runs none of the request's
        front end (`Engine.accept`): bad input (EmptyTextError, InvalidOptionError,
        UnpronounceableTextError, ...) is raised by the stream (`first()`, or iterating it).
        streaming=False: a whole answer, charged its predicted audio (silence included) against
        `held` until `release_held` or its end."""
        loop = asyncio.get_running_loop()
        sink = _QueueSink(loop)
        v = self.engine.voice(voice)
        held = None if streaming else self.held
        stream = SpeechStream(self.engine, 0, sink, v.sample_rate, held)
        try:
            if held is not None:
                retry = min(60.0, max(1.0, self.engine.queue_wait_s(voice) or 1.0))  # audio comes as work drains
                held.admit(stream._held_key, v.predicted_audio_s(text, options), v.sample_rate, retry)
            stream.request_id = self.engine.accept(voice, text, options, sink, streaming=streaming)
        except BaseException:
            stream.release_held()
            stream._done = True  # nothing to cancel
            raise
        return stream
