"""Helpers of the idle-unload tests (tests/engine/test_unload.py and each family's): a request
through the engine, the check that a voice is never unloaded while a request of it runs, and
a script's JSON result from a child process (RSS is measured in a process of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable

import numpy as np

from voxserve.engine import Sink
from voxserve.engine.unload import IdleUnloader

RSS = """
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
"""


def child_json(script: str, timeout: float = 300) -> dict:
    """Run `script` (with `rss_mb()` defined) in a child Python on one thread; its last stdout
    line, as JSON."""
    p = subprocess.run([sys.executable, "-c", RSS + script], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


class AllAudio(Sink):
    """Every audio call of a request, in order (streamed chunks included)."""

    def __init__(self):
        self.parts: list[np.ndarray] = []
        self.done, self.error = threading.Event(), None

    def on_audio(self, index, samples, text, partial=False):
        self.parts.append(np.asarray(samples))

    def on_done(self, n):
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.done.set()

    def joined(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.float32)


def speak(eng, voice: str, text: str, options=None, timeout: float = 120) -> np.ndarray:
    """One request through a started engine: its whole audio (fails on the request's error)."""
    s = AllAudio()
    eng.submit(voice, text, options, s)
    assert s.done.wait(timeout), "the request did not end"
    assert s.error is None, s.error
    return s.joined()


def never_unloaded_while_running(eng, voice, text: str, options, hold: Callable[[threading.Event], None]) -> None:
    """`hold(gate)` makes the voice's model work wait for `gate`: while a request of it waits
    there, the unloader (idle time 1 s, on a fake clock) leaves the voice loaded; once it ended
    and one idle period passed, the voice is unloaded."""
    gate = threading.Event()
    hold(gate)
    u = IdleUnloader(eng, after_s=1, clock=lambda: 0.0)
    s = AllAudio()
    eng.submit(voice.name, text, options, s)
    try:
        assert eng.voice_activity()[voice.name][0] == 1
        for t in (100.0, 200.0):
            assert u.check(t) == [] and voice.loaded  # in flight: never
    finally:
        gate.set()
    assert s.done.wait(120) and s.error is None, s.error
    assert u.check(200.5) == []  # used since the last check
    assert u.check(201.5) == [voice.name] and not voice.loaded
