"""The servers' memory allocator.

A server's heap takes tensors of ever-changing sizes from several worker threads. glibc's
malloc, kept from giving freed blocks back (cpu.tune_malloc: re-faulting them would slow every
batch), fragments under that traffic: each thread's arena keeps its largest free holes and the
server's RSS creeps up for minutes. jemalloc's size classes reuse memory across sizes, and with
purging off it never re-faults pages, so a server stays flatter and lower at the same speed
(docs/benchmarks.md, "A lean server"); PyTorch's CPU inference guides preload it for the same
reason. A preloaded allocator must be in the process from its start, so `voxserve serve`
restarts itself once (the same pid, `exec`) with jemalloc preloaded when the system has it
(Debian and Ubuntu: the package libjemalloc2). VOXSERVE_ALLOCATOR=system keeps glibc's malloc.

Kept pages are for the next batch, but kept for ever they record the largest batch of the
process's life, which under traffic arrives now and then for hours: `MemoryRelease` gives them
back once a minute while serving and once after it (an engine starts one), so a server's RSS
follows its recent load, and a server left alone shrinks.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping

from .cpu import libc

log = logging.getLogger(__name__)

ENV = "VOXSERVE_ALLOCATOR"
CHOICES = ("auto", "system")
JEMALLOC = "libjemalloc.so.2"
# purging returns pages that the next batch faults in again; a server's working set comes back
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
_TRIED = "VOXSERVE_ALLOCATOR_RESTARTED"  # set across the exec: never restart twice


def choice(env: Mapping[str, str]) -> str:
    value = env.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={env[ENV]!r}: expected one of {', '.join(CHOICES)}")
    return value


def jemalloc_loaded(maps: str | None = None) -> bool:
    """Whether jemalloc is mapped into this process (maps: /proc/self/maps's text)."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return False
    return "libjemalloc" in maps


def find_jemalloc() -> str | None:
    """jemalloc's library as the dynamic loader finds it, or None."""
    if not sys.platform.startswith("linux"):
        return None
    return JEMALLOC if ctypes.util.find_library("jemalloc") else None


def restart_env(env: Mapping[str, str], loaded: bool, library: str | None) -> dict[str, str] | None:
    """The environment to restart the process with so that jemalloc is preloaded, or None to
    go on as it is (chosen off, already loaded, already tried, or not installed)."""
    if choice(env) == "system" or loaded or env.get(_TRIED) or library is None:
        return None
    new = dict(env)
    new[_TRIED] = "1"
    new["LD_PRELOAD"] = " ".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    new.setdefault("MALLOC_CONF", JEMALLOC_CONF)  # a user's own tuning wins
    return new


def restart_with_jemalloc() -> None:
    """Restart this process (the command line it was started with) with jemalloc preloaded,
    when `restart_env` says so; returns only when it does not restart."""
    env = restart_env(os.environ, jemalloc_loaded(), find_jemalloc())
    if env is None:
        if os.environ.get(_TRIED) and not jemalloc_loaded():
            log.warning("jemalloc could not be preloaded; serving with the system's malloc")
        return
    argv = [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, env)
    except OSError as e:  # the process goes on as it is
        log.warning("could not restart with jemalloc (%s); serving with the system's malloc", e)


_MALLCTL_ARENAS_ALL = 4096  # jemalloc's index for "every arena" in arena.<i>.* names


def release_free_memory() -> bool:
    """Give the allocator's free pages back to the OS (jemalloc: purge every arena; glibc:
    malloc_trim). Live memory is untouched; the next use of a released page faults it in
    again. True if an allocator did it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        if jemalloc_loaded():
            lib = ctypes.CDLL(JEMALLOC)
            name = f"arena.{_MALLCTL_ARENAS_ALL}.purge".encode()
            return lib.mallctl(name, None, None, None, ctypes.c_size_t(0)) == 0
        libc().malloc_trim(0)
        return True
    except (OSError, AttributeError):  # another libc, or an allocator without these calls
        return False


class MemoryRelease:
    """Calls `release` at the end of every `period_s` in which the owner was busy, on a daemon
    thread of its own: under steady traffic once a period, and once more after the traffic
    stops; while idle, never. The allocator's kept pages then hold the last period's largest
    working set, not the largest of the process's whole life. `busy` is cheap: callers mark
    every change of their in-flight count."""

    def __init__(self, period_s: float, release: Callable[[], object] = release_free_memory):
        if not period_s > 0:
            raise ValueError(f"period_s must be positive, not {period_s!r}")
        self.period_s, self._release = period_s, release
        self._cv = threading.Condition()
        self._busy = False
        self._used = False  # busy at some time since the last release
        self._stopped = False
        self.releases = 0
        self._thread = threading.Thread(target=self._run, name="voxserve-memory-release", daemon=True)
        self._thread.start()

    def busy(self, busy: bool) -> None:
        with self._cv:
            self._busy = busy
            if busy and not self._used:
                self._used = True
                self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._used and not self._stopped:
                    self._cv.wait()
                end = time.monotonic() + self.period_s  # the period starts with its first use
                while not self._stopped and (left := end - time.monotonic()) > 0:
                    self._cv.wait(left)
                if self._stopped:
                    return
                self._used = self._busy  # still busy: the next period starts in use
            try:  # outside the lock: `busy` never waits for a purge
                self._release()
                self.releases += 1
            except Exception:  # memory kept is not worth a dead thread
                log.exception("releasing free memory failed")
