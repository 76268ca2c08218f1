"""The one output path: a request's audio, in sentence order, against its audio budget, to its sink.

Every result of the device work (a one-shot batch's pieces, a step runner's chunks) reaches a
request's `Sink` through `RequestOutput.put`, and its end through `finish` or `fail`. Errors
are exceptions: a sentence's own failure (over its limit, a step runner's error) travels as
the exception it is; so does one that a sink raises, which fails its request at once.
"""

from __future__ import annotations

import logging
from collections import deque

import numpy as np

from ..contract import AudioBudget

log = logging.getLogger(__name__)


class Sink:
    """Where a request's results go. Called from engine threads, in order, for one request,
    never after `on_done` or `on_error`. A method that raises fails its request at once (its
    `on_error` is called with that exception; if that raises too, nothing more is called)."""

    def on_words(self, index: int, words: tuple) -> None:
        """Just before the `on_audio` that starts sentence `index` of a voice with word
        timestamps: its words, in seconds from the start of that audio."""

    def on_audio(self, index: int, samples: np.ndarray, text: str, partial: bool = False) -> None:
        """A sentence's audio; partial=True: a piece of it (a long sentence is cut, see
        Voice.run_pieces), the rest of sentence `index` follows in the next calls (text "")."""

    def on_sentence(self, index: int) -> None:
        """The request's front end has produced sentence `index` (its audio follows). With
        `on_total`, a stream knows whether a sentence it has is its last."""

    def on_total(self, n_sentences: int) -> None:
        """The request's front end has given its last sentence: it has `n_sentences` (called
        once, before `on_done`; audio may come before and after it). A stream marks its last
        chunk by it."""

    def on_done(self, n_sentences: int) -> None:
        """Every sentence was delivered."""

    def on_error(self, error: BaseException) -> None:
        """The request failed (its audio so far was delivered, the rest never comes)."""


class RequestOutput:
    """One request's delivery: the sentences its front end produced, in order; pieces that
    finished before the sentences ahead of them (the CPU executor's spill), held back; its
    audio budget; its sink. Not thread safe: its device's worker lock guards it."""

    def __init__(self, sink: Sink, budget: AudioBudget):
        self.sink = sink
        self.budget = budget
        self.order: deque[int] = deque()  # sentence indices produced, not yet all delivered
        self.held: dict[int, list] = {}  # index -> [(audio, text, partial, words)] that came early
        self.delivered = 0  # whole sentences handed to the sink
        self.closed = False

    def expect(self, index: int) -> None:
        """The front end produced sentence `index` (its audio is delivered in this order; the
        sink's `on_sentence`). Raises what the sink raised: the caller then fails the request."""
        self.order.append(index)
        self.sink.on_sentence(index)

    def put(self, index: int, audio: np.ndarray, text: str, *, partial: bool = False,
            sentence_start: bool = True, words: tuple = ()) -> None:
        """A sentence's audio, or a piece of it (partial: the rest follows; sentence_start:
        this piece starts the sentence). Raises AudioTooLongError past the request's budget, or
        what its sink raised: the caller then fails the request."""
        self.budget.add(len(audio), sentence_start)
        self.held.setdefault(index, []).append((audio, text, partial, words))
        while self.order and self.order[0] in self.held:
            k = self.order[0]
            whole = False
            for a, t, p, w in self.held.pop(k):  # a cut sentence's pieces, in the order they ran
                if w:
                    self.sink.on_words(k, w)
                if p:
                    self.sink.on_audio(k, a, t, partial=True)
                else:  # as before pieces existed: sinks written then take (index, samples, text)
                    self.sink.on_audio(k, a, t)
                whole = not p
            if not whole:
                return  # the rest of sentence k is still to come
            self.order.popleft()
            self.delivered += 1

    def total(self, n_sentences: int) -> None:
        """The front end is done: the request has `n_sentences` (the sink's `on_total`).
        Raises what the sink raised: the caller then fails the request."""
        if not self.closed:
            self.sink.on_total(n_sentences)

    def finish(self, n_sentences: int) -> None:
        """Every sentence delivered: the sink's `on_done`."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sink.on_done(n_sentences)
        except Exception:
            log.exception("a sink's on_done failed")

    def fail(self, error: BaseException) -> None:
        """The request failed: the sink's `on_error` (once; nothing after it)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sink.on_error(error)
        except Exception:
            log.exception("a sink's on_error failed")
