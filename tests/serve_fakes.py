"""A fake voice for engine and server tests: no torch, counts every sentence it synthesises."""

from __future__ import annotations

import threading
import time

import numpy as np

from voxserve.errors import UnknownSpeakerError, UnpronounceableTextError
from voxserve.options import SynthesisOptions
from voxserve.text.frontend import check_text
from voxserve.voice import Unit


class FakeVoice:
    """Sentences are split at '.'; a sentence's audio is a tone whose pitch encodes (request text
    hash, sentence index), so mixing between requests would show. `delay_s` per batch."""

    family = "fake"

    def __init__(self, name: str = "fake", sample_rate: int = 16000, delay_s: float = 0.0, speakers=("a", "b")):
        self.name = name
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
        self.early_heads = 0  # heads delivered early (streams' first sentences)

    @property
    def speakers(self):
        return self._speakers

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

    HEAD_MIN_SAMPLES = 600  # early units this long get their first third delivered at once

    def run_units(self, units, early=(), on_early=None):
        with self.lock:
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.gate is not None:
                self.gate.wait(10)
            audios = [self.audio_for(u.payload, self.sample_rate) for u in units]
            heads = {}
            for k in early if on_early else ():
                if len(audios[k]) >= self.HEAD_MIN_SAMPLES:
                    heads[k] = len(audios[k]) // 3
                    on_early(k, audios[k][: heads[k]])
            if self.delay_s:
                time.sleep(self.delay_s)
            with self.lock:
                self.run_texts.extend(u.payload for u in units)
                self.batches.append(len(units))
                self.early_heads += len(heads)
            return [a[heads.get(k, 0):] for k, a in enumerate(audios)]
        finally:
            with self.lock:
                self.concurrent -= 1

    def expected(self, text: str) -> np.ndarray:
        return np.concatenate([self.audio_for(u.payload, self.sample_rate) for u in self.units(text)])
