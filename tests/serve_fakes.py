"""A fake voice for engine and server tests: no torch, counts every sentence it synthesises."""

from __future__ import annotations

import threading
import time

import numpy as np

from voxserve.engine import Sink
from voxserve.errors import UnknownSpeakerError, UnpronounceableTextError
from voxserve.limits import DEFAULT_LIMITS
from voxserve.options import SynthesisOptions
from voxserve.text.frontend import check_text
from voxserve.voice import Unit, Voice


class FakeVoice(Voice):
    """Sentences are split at '.'; a sentence's audio is a tone whose pitch encodes (request text
    hash, sentence index), so mixing between requests would show. `delay_s` per batch."""

    family = "fake"
    limits = DEFAULT_LIMITS
    languages: tuple[str, ...] = ()  # as Voice's: no language option, languages not known
    language_codes: tuple[str, ...] = ()

    def predicted_audio_s(self, text, options=None) -> float:
        """Voice.predicted_audio_s: what a whole answer is charged at admission (the audio it
        holds is charged as it comes)."""
        return 0.0  # a low estimate: none

    def silence_after(self, options) -> float:
        return float(options.sentence_silence or 0.0) if options else 0.0

    def __init__(self, name: str = "fake", sample_rate: int = 16000, delay_s: float = 0.0, speakers=("a", "b"),
                 concurrent_runs: bool = False):
        self.name = name
        self._concurrent_runs = concurrent_runs  # the engine may then run batches on several lanes
        self.sample_rate = sample_rate
        self.delay_s = delay_s
        self.device = "cpu"
        self._speakers = list(speakers)
        self.lock = threading.Lock()
        self.run_texts: list[str] = []  # every sentence run, in order
        self.batches: list[int] = []
        self.concurrent = 0
        self.max_concurrent = 0
        self.gate: threading.Event | None = None  # if set, run_units waits for it
        self.cuts = 0  # units cut into a piece and a rest
        self.spans: list[tuple[float, float, list]] = []  # (start, end, payloads) per batch
        self.spares: list[bool] = []  # per batch: whether the engine said nothing else ran or waited

    @property
    def speakers(self):
        return self._speakers

    @property
    def concurrent_runs(self) -> bool:
        return self._concurrent_runs

    def units(self, text, options=None):
        check_text(text)
        opts = (options or SynthesisOptions()).validate()
        if opts.speaker is not None and opts.speaker not in self._speakers and opts.speaker not in range(len(self._speakers)):
            raise UnknownSpeakerError(opts.speaker, self.name, self._speakers)

        def gen():
            n = 0
            for s in text.split("."):
                s = s.strip()
                if s and any(ch.isalpha() for ch in s):
                    yield Unit(n, s, len(s), s)
                    n += 1
            if n == 0:
                raise UnpronounceableTextError(text)

        return gen()

    @staticmethod
    def audio_for(sentence: str, sample_rate: int = 16000) -> np.ndarray:
        f = 100 + (sum(map(ord, sentence)) % 2000)
        n = 200 + 10 * len(sentence)
        return (0.5 * np.sin(2 * np.pi * f * np.arange(n) / sample_rate)).astype(np.float32)

    HEAD_MIN_SAMPLES = 600  # an early unit this long is cut after its first third

    def run_units(self, units):
        return [a for a, _ in self.run_pieces(units)]

    def run_pieces(self, units, early=(), max_cost=None, spare=False):
        """Like a VITS voice: an early unit of HEAD_MIN_SAMPLES or more is cut after its first
        third, and with max_cost a unit costing over 1.25 x max_cost is cut after 10 * max_cost
        samples; the rest comes back
        as a Unit whose payload is ("rest", sentence, offset)."""
        with self.lock:
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.gate is not None:
                self.gate.wait(10)
            t0 = time.monotonic()
            out = []
            for k, u in enumerate(units):
                _, sent, off = u.payload if isinstance(u.payload, tuple) else ("", u.payload, 0)
                a = self.audio_for(sent, self.sample_rate)[off:]
                cut = 0
                if k in early and len(a) >= self.HEAD_MIN_SAMPLES:
                    cut = len(a) // 3
                elif max_cost and u.cost > 1.25 * max_cost:  # as VITS: only items that run alone
                    cut = 10 * max_cost
                if cut:
                    self.cuts += 1
                    out.append((a[:cut], Unit(u.index, u.text, max(1, (len(a) - cut) // 10), ("rest", sent, off + cut))))
                else:
                    out.append((a, None))
            if self.delay_s:
                time.sleep(self.delay_s)
            with self.lock:
                self.run_texts.extend(u.payload for u in units)
                self.batches.append(len(units))
                self.spans.append((t0, time.monotonic(), [u.payload for u in units]))
                self.spares.append(spare)
            return out
        finally:
            with self.lock:
                self.concurrent -= 1

    def expected(self, text: str) -> np.ndarray:
        return np.concatenate([self.audio_for(u.payload, self.sample_rate) for u in self.units(text)])


class RecordingSink(Sink):
    """An engine Sink that keeps each sentence's (last) audio, the end and the error."""

    def __init__(self):
        self.audio: dict[int, np.ndarray] = {}
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.calls_after_end = 0

    def on_audio(self, index, samples, text, partial=False):
        if self.done.is_set():
            self.calls_after_end += 1
        self.audio[index] = samples

    def on_done(self, n):
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.done.set()

    def joined(self) -> np.ndarray:
        return np.concatenate([self.audio[k] for k in sorted(self.audio)])
