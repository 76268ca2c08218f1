"""The voice API: text in, typed audio out.

A `Voice` is what every family subclasses: the engine's contract (`voxserve.contract`:
`units`, `run_pieces`, step runners, shared components) plus the library, `synthesize`,
`stream` and `synthesize_batch`. The library runs on an `Engine` of the voice's own, made at
its first call in the caller's process and driven by the callers' threads (`Engine.add`,
`Engine.drive`), as vLLM's `LLM` steps its engine core: the engine's scheduler batches the
text's sentences, its steps run them and its output path delivers them, in the library as in
the server.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from .audio import Audio, AudioChunk, SentenceJoiner, silence_samples
from .contract import (  # noqa: F401 (re-exported: families and tools import them from here)
    Piece,
    SharedComponent,
    StepResult,
    StepRunner,
    Unit,
    VoiceContract,
    joined_words,
    limited,
    piece_error,
    run_steps,
    sentence_seed,
    shift_words,
)
from .engine.engine import Engine
from .engine.output import Sink
from .families import synthesis_options_of
from .options import SynthesisOptions

_ENGINE_LOCK = threading.Lock()  # makes each voice's library engine once, whichever thread asks first


class Voice(VoiceContract):
    """A loaded voice on one device: the engine's contract (`VoiceContract`) and the library
    API. Thread safe: threads that share a voice share its engine, whose steps run one at a
    time on whichever of them waits (their sentences batched together)."""

    _library_engine: Engine | None = None  # (library_engine: made at the first call)

    @property
    def synthesis_options(self) -> type[SynthesisOptions]:
        """The options class this voice takes per request (`Family.synthesis_options`, e.g.
        PiperOptions); `synthesize` and the others take one, or a plain SynthesisOptions."""
        return synthesis_options_of(self)

    def warmup(self) -> None:
        """Get ready for traffic (servers call this before reporting ready): one sentence."""
        self.synthesize("Warm up.")

    # ---------------------------------------------------------------- API
    def synthesize(self, text: str, options: SynthesisOptions | None = None) -> Audio:
        """The whole text as one Audio (sentences batched, joined with sentence_silence)."""
        return self.synthesize_batch([text], options)[0]

    def stream(self, text: str, options: SynthesisOptions | None = None) -> Iterator[AudioChunk]:
        """One AudioChunk per sentence, in order, as the engine's scheduler runs them for a
        stream: the first sentence first, alone (a long one as a head, `partial=True`, then
        the rest, in pieces as the decoder makes them; see `run_pieces`), later ones batched. Options are
        checked now; the engine works while the caller waits for the next chunk, and its
        front end only a few sentences ahead, so memory stays bounded whatever the length of
        the text. A consumer that stops iterating (or closes the iterator) cancels the rest.

        The sentence silence (`sentence_silence`) is in the stream as in `synthesize`: at the end
        of the chunk that ends each sentence but the last, so that the chunks joined are the
        whole audio and each chunk's words stay relative to its start."""
        units = self.units(text, options)  # validates now; the sentences come lazily
        chunks = self._streamed(text, options, units)
        gap = silence_samples(self.silence_after(options), self.sample_rate)
        return _with_silence(chunks, gap) if gap else chunks

    def synthesize_batch(self, texts: Sequence[str], options: SynthesisOptions | Sequence[SynthesisOptions | None] | None = None) -> list[Audio]:
        """Several texts, one request each; the engine's scheduler batches the sentences of all
        of them together. One Audio per text."""
        if isinstance(options, SynthesisOptions) or options is None:
            opts_list = [options] * len(texts)
        else:
            opts_list = list(options)
            if len(opts_list) != len(texts):
                raise ValueError("options must be one SynthesisOptions or one per text")
        units = [self.units(t, o) for t, o in zip(texts, opts_list)]  # every text validated first
        if not texts:
            return []
        engine = self.library_engine()
        cond = engine.condition(self.name)
        sinks = [_Collector(cond, self.sample_rate) for _ in texts]
        rids = []
        try:
            for t, o, u, s in zip(texts, opts_list, units, sinks):
                rids.append(engine.add(self.name, t, o, s, units=u))
            engine.drive(self.name, lambda: all(s.done for s in sinks) or any(s.error for s in sinks))
        finally:
            for rid in rids:  # (those that ended are gone already)
                engine.cancel(rid)
            engine.leave_ended(self.name)
        out = []
        for s, o in zip(sinks, opts_list):
            if s.error is not None:
                raise s.error
            chunks = s.take()
            silence = self.silence_after(o)
            out.append(Audio(SentenceJoiner(self.sample_rate, silence).join(chunks), self.sample_rate,
                             joined_words([(len(c.samples), c.words, c.partial) for c in chunks],
                                          self.sample_rate, silence)))
        return out

    def _streamed(self, text: str, options: SynthesisOptions | None, units: Iterator[Unit]) -> Iterator[AudioChunk]:
        engine = self.library_engine()
        sink = _Collector(engine.condition(self.name), self.sample_rate)
        rid = engine.add(self.name, text, options, sink, streaming=True, units=units)
        try:
            while True:
                engine.drive(self.name, sink.ready)
                with sink.cond:
                    chunks, error, done = sink.take(), sink.error, sink.done
                yield from chunks
                if error is not None:
                    raise error
                if done:
                    return
        finally:  # the consumer stopped (or it failed): the rest is never synthesised
            engine.cancel(rid)
            engine.leave_ended(self.name)

    # ---------------------------------------------------------------- the library's engine
    def library_engine(self) -> Engine:
        """The engine the library API runs on: this voice alone, made at the first call, with
        the server's configuration, driven by the calling threads (`Engine.drive`: no threads
        of its own but its front end's)."""
        engine = self._library_engine
        if engine is None:
            with _ENGINE_LOCK:
                engine = self._library_engine
                if engine is None:
                    engine = self._library_engine = Engine({self.name: self}).start(threads=False)
        return engine

    def close(self) -> None:
        """Stop the library's engine of this voice (its front-end threads; a later call makes
        another): calls in flight fail with EngineClosedError. Dropping the voice does it too."""
        with _ENGINE_LOCK:
            engine, self._library_engine = self._library_engine, None
        if engine is not None:
            engine.shutdown(timeout=0)


class _Collector(Sink):
    """A library request's results as the engine delivers them (called under the device's
    lock, `cond`, which each call notifies: the driving threads wait on it): its chunks in
    order, its sentence count once the front end knows it, its end."""

    def __init__(self, cond: threading.Condition, sample_rate: int):
        self.cond, self.sample_rate = cond, sample_rate
        self.chunks: deque[tuple[AudioChunk, int | None]] = deque()  # (chunk, n-th whole sentence or None: a piece)
        self.whole = 0  # whole sentences received
        self.produced = 0  # sentences the front end has produced
        self.words: tuple = ()
        self.total: int | None = None
        self.done = False
        self.error: BaseException | None = None

    def _wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def on_words(self, index: int, words: tuple) -> None:
        self.words = words

    def on_audio(self, index: int, samples: np.ndarray, text: str, partial: bool = False) -> None:
        nth = None
        if not partial:
            self.whole += 1
            nth = self.whole
        self.chunks.append((AudioChunk(samples, self.sample_rate, self.words, index=index, text=text,
                                       partial=partial), nth))
        self.words = ()
        self._wake()

    def on_sentence(self, index: int) -> None:
        self.produced += 1

    def on_total(self, n_sentences: int) -> None:
        self.total = n_sentences
        self._wake()

    def on_done(self, n_sentences: int) -> None:
        self.total, self.done = n_sentences, True
        self._wake()

    def on_error(self, error: BaseException) -> None:
        self.error = error
        self._wake()

    def _known(self, nth: int | None) -> bool:
        """Whether it is known if the n-th whole sentence (None: a piece) is the last."""
        return nth is None or self.total is not None or self.produced > nth

    def ready(self) -> bool:
        """A chunk can be handed out (whether it is the last is known), or the request is over
        (lock held)."""
        if self.done or self.error is not None:
            return True
        return bool(self.chunks) and self._known(self.chunks[0][1])

    def take(self) -> list[AudioChunk]:
        """The chunks that can be handed out, `is_last` set on the last sentence's (lock held)."""
        out = []
        over = self.done or self.error is not None
        while self.chunks:
            chunk, nth = self.chunks[0]
            if not over and not self._known(nth):
                break  # whether it is the last is not known yet: the front end's next tells
            self.chunks.popleft()
            out.append(replace(chunk, is_last=True) if nth is not None and nth == self.total else chunk)
        return out


def _with_silence(chunks: Iterator[AudioChunk], gap: int) -> Iterator[AudioChunk]:
    """`gap` samples of silence after every sentence's last chunk but the last sentence's (the
    SentenceJoiner's rule, from the other side: after a sentence rather than before the next,
    so that no chunk waits for the next sentence and the words need no shift)."""
    for c in chunks:
        if c.partial or c.is_last:
            yield c
        else:
            yield replace(c, samples=np.concatenate([c.samples, np.zeros(gap, np.float32)]))

