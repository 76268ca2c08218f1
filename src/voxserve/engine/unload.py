"""Idle unload (`voxserve serve --unload-after SECONDS`): a voice unused for that long releases its
weights (`Voice.unload`) and loads again (`Voice.reload`) when its next request's front end
starts, so that request waits for the load instead of failing. Never while a request of the
voice is queued or running.

Three parts: the policy (`idle_voices`, pure: which voices to unload, given when each was last
used and how many of its requests are in flight), the loads (`VoiceLoads`: one lock per voice,
so that a reload and an unload never overlap and a request waits for either), and the driver
(`IdleUnloader`: reads the engine's activity each period, on a clock that tests replace).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

log = logging.getLogger(__name__)


def idle_voices(last_used: Mapping[str, float], in_flight: Mapping[str, int], loaded: Collection[str],
                now: float, after_s: float) -> list[str]:
    """The loaded voices to unload now: none of their requests in flight, last used at least
    `after_s` seconds before `now` (a voice never seen used counts from its entry in last_used)."""
    return sorted(v for v in loaded
                  if in_flight.get(v, 0) == 0 and v in last_used and now - last_used[v] >= after_s)


class VoiceLoads:
    """One lock per watched voice around its unload and reload: a request's front end calls
    `ensure` (waiting while an unload or a load of its voice is under way); the unloader
    `unload`s only while `still_idle()` holds under that lock. Voices not `watch`ed (no
    `--unload-after`, or a family that cannot unload) are never touched."""

    def __init__(self) -> None:
        self._locks: dict[int, threading.Lock] = {}  # by id(voice): an engine's key need not be its name
        self.reloads = 0
        self.unloads = 0

    def watch(self, voice: Any) -> None:
        """Make `voice` one that may be unloaded (before any request can see it unloaded)."""
        self._locks.setdefault(id(voice), threading.Lock())

    def ensure(self, voice: Any) -> None:
        """Load `voice` again if it was unloaded (on the caller's thread: the request waits).
        Always under the lock: an unload under way still reads as loaded until it ends."""
        lock = self._locks.get(id(voice))
        if lock is None:
            return
        with lock:
            if not voice.loaded:
                t = time.perf_counter()
                voice.reload()
                self.reloads += 1
                log.info("voice %s loaded again in %.2f s", voice.name, time.perf_counter() - t)

    def unload(self, voice: Any, still_idle: Callable[[], bool]) -> bool:
        """Unload `voice` if it is loaded and `still_idle()` (checked under its lock). True if it was."""
        with self._locks[id(voice)]:
            if not voice.loaded or not still_idle():
                return False
            voice.unload()
            self.unloads += 1
            log.info("voice %s unloaded after being idle", voice.name)
            return True


class IdleUnloader:
    """Unloads the engine's idle voices: `check(now)` once a period on a daemon thread (`start`),
    or by hand in tests. A voice counts as used while a request of it is in flight and whenever
    its count of submitted requests has grown since the last check (so a request that comes and
    goes between two checks still counts)."""

    def __init__(self, engine: Any, after_s: float, clock: Callable[[], float] = time.monotonic,
                 period_s: float | None = None):
        if not after_s > 0:
            raise ValueError(f"unload_after must be over 0 seconds, not {after_s!r}")
        self.engine, self.after_s, self.clock = engine, float(after_s), clock
        self.period_s = period_s if period_s is not None else min(30.0, max(0.5, after_s / 10))
        self.voices = {n: v for n, v in engine.voices.items() if v.can_unload}
        for v in self.voices.values():
            engine.loads.watch(v)
        now = clock()
        self.last_used = {n: now for n in self.voices}
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for n, v in engine.voices.items():
            if not v.can_unload:
                log.info("voice %s (%s) cannot unload: it stays loaded", n, v.family)

    def check(self, now: float | None = None) -> list[str]:
        """Note the voices' use, then unload those idle for `after_s`; returns their names."""
        now = self.clock() if now is None else now
        activity = self.engine.voice_activity()  # name -> (requests in flight, submitted so far)
        in_flight = {}
        for n in self.voices:
            busy, submitted = activity.get(n, (0, 0))
            in_flight[n] = busy
            if busy or submitted != self._seen.get(n, 0):
                self.last_used[n] = now
            self._seen[n] = submitted
        loaded = [n for n, v in self.voices.items() if v.loaded]
        done = []
        for n in idle_voices(self.last_used, in_flight, loaded, now, self.after_s):
            seen = self._seen[n]

            def still_idle(n=n, seen=seen) -> bool:  # nothing submitted since the activity read
                return self.engine.voice_activity().get(n, (0, 0)) == (0, seen)

            if self.engine.loads.unload(self.voices[n], still_idle):
                done.append(n)
        return done

    def start(self) -> "IdleUnloader":
        self._thread = threading.Thread(target=self._run, name="voxserve-unload", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.check()
            except Exception:  # a failed unload leaves the voice loaded; the server goes on
                log.exception("idle unload failed")
