"""Fakes for the engine's step voices and shared components: no torch model, deterministic."""

from __future__ import annotations

import threading

import numpy as np

from voxserve.limits import DEFAULT_LIMITS
from voxserve.options import SynthesisOptions
from voxserve.text.frontend import check_text
from voxserve.voice import SharedComponent, StepResult, StepRunner, Unit, Voice, sentence_seed

CHUNK = 160  # samples a fake sequence makes per step


def chunk(seed: int, text: str, step: int) -> np.ndarray:
    """The audio of one step of one sequence: a function of its own seed, text and step only."""
    rng = np.random.default_rng([seed & 0xFFFFFFFF, sum(map(ord, text)), step])
    return rng.standard_normal(CHUNK).astype(np.float32) * 0.1


class FakeStepRunner(StepRunner):
    """A sequence runs len(text) // 4 + 1 steps; `stream`: audio every step (final=False until
    the last), else all of it with the final result. Records who was active at every step."""

    def __init__(self, capacity: int = 8, stream: bool = False):
        self.capacity = capacity
        self.stream = stream
        self.seqs: dict = {}  # key -> [unit, steps done, audio so far]
        self.history: list[set] = []  # active keys at each step
        self.left: list = []
        self.fail_next: BaseException | None = None
        self.fail_key_text: str | None = None  # a sequence whose text this is fails at its first step
        self.gate: threading.Event | None = None

    @property
    def active(self) -> int:
        return len(self.seqs)

    def join(self, key, unit):
        assert len(self.seqs) < self.capacity, "joined past capacity"
        self.seqs[key] = [unit, 0, []]

    def leave(self, key):
        if self.seqs.pop(key, None) is not None:
            self.left.append(key)

    @staticmethod
    def steps_of(text: str) -> int:
        return len(text) // 4 + 1

    def step(self):
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail_next is not None:
            e, self.fail_next = self.fail_next, None
            raise e
        self.history.append(set(self.seqs))
        out = []
        for key, s in list(self.seqs.items()):
            unit, n, parts = s
            if unit.text == self.fail_key_text:
                del self.seqs[key]
                out.append(StepResult(key, error=ValueError(f"cannot say {unit.text!r}")))
                continue
            a = chunk(unit.payload, unit.text, n)
            s[1] = n = n + 1
            final = n >= self.steps_of(unit.text)
            if final:
                del self.seqs[key]
            if self.stream:
                out.append(StepResult(key, a, final=final))
            else:
                parts.append(a)
                if final:
                    out.append(StepResult(key, np.concatenate(parts)))
        return out


class FakeStepVoice(Voice):
    """Sentences split at '.', each one sequence of its step runner; payload = its seed."""

    family = "fake-step"
    sample_rate = 16000
    limits = DEFAULT_LIMITS
    device = "cpu"

    def __init__(self, name: str = "ar", capacity: int = 8, stream: bool = False):
        self.name = name
        self.runner = FakeStepRunner(capacity, stream)

    def step_runner(self):
        return self.runner

    def units(self, text, options=None):
        check_text(text)
        opts = (options or SynthesisOptions()).validate()
        parts = [s.strip() for s in text.split(".") if s.strip()]
        return iter([Unit(i, s, len(s), sentence_seed(opts.seed, i)) for i, s in enumerate(parts)])

    def run_units(self, units, early=(), on_early=None):
        from voxserve.voice import run_steps

        return run_steps(self.runner, units)

    def expected(self, text: str, seed: int) -> list[np.ndarray]:
        """Each sentence's audio as it comes alone."""
        out = []
        for u in self.units(text, SynthesisOptions(seed=seed)):
            out.append(np.concatenate([chunk(u.payload, u.text, k) for k in range(FakeStepRunner.steps_of(u.text))]))
        return out


class FakeEncoder(SharedComponent):
    """A shared 'text encoder': one vector per text; records every batch it ran."""

    def __init__(self, key="enc"):
        self.key = key
        self.max_batch = 16
        self.batches: list[list[str]] = []
        self.outputs: list = []
        self.fail_next: BaseException | None = None

    @staticmethod
    def encode(text: str) -> np.ndarray:
        return np.array([len(text), sum(map(ord, text)) % 997], dtype=np.float32)

    def run(self, inputs):
        if self.fail_next is not None:
            e, self.fail_next = self.fail_next, None
            raise e
        self.batches.append(list(inputs))
        out = [self.encode(t) for t in inputs]
        self.outputs.extend(out)
        return out


class FakeEncodedVoice(Voice):
    """A one-shot voice whose units need the shared encoder's output: its audio is made from
    that output and the voice's own pitch, so a mix-up between sentences or voices would show."""

    family = "fake-encoded"
    sample_rate = 16000
    limits = DEFAULT_LIMITS
    device = "cpu"

    def __init__(self, name: str, encoder: FakeEncoder, pitch: float):
        self.name, self.encoder, self.pitch = name, encoder, pitch
        self.seen: list = []  # the component outputs its batches received, by identity

    def components(self):
        return {self.encoder.key: self.encoder}

    def units(self, text, options=None):
        check_text(text)
        (options or SynthesisOptions()).validate()
        parts = [s.strip() for s in text.split(".") if s.strip()]
        return iter([Unit(i, s, len(s), s, component=self.encoder.key, component_input=s)
                     for i, s in enumerate(parts)])

    def with_component_output(self, unit, output):
        from dataclasses import replace

        return replace(unit, component=None, component_input=None, payload=(unit.payload, output))

    def audio_for(self, text: str, enc: np.ndarray) -> np.ndarray:
        t = np.arange(int(enc[0]) * 10 + 10) / self.sample_rate
        return (np.sin(2 * np.pi * (self.pitch + enc[1]) * t)).astype(np.float32)

    def run_units(self, units, early=(), on_early=None):
        out = []
        for u in units:
            assert u.component is None, "a unit reached its voice without its component's output"
            text, enc = u.payload
            self.seen.append(enc)
            out.append(self.audio_for(text, enc))
        return out
