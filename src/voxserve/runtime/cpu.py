"""CPU process tuning.

glibc returns every freed block over its mmap threshold (at most 32 MiB) to the kernel, so
each decoder activation of a long sentence ([1, 32, 10^5+] floats) is a fresh mmap whose pages
fault in on first touch, several times slower than reused memory (docs/benchmarks.md,
"Figures behind the code's defaults"). Turning mmap allocation off and raising the trim
threshold makes freed activations stay in the heap and be reused, as ONNX Runtime's arena does.
The cost: the process keeps its peak heap. Disable with VOXSERVE_MALLOPT=0.

OpenMP thread teams. Every thread that runs a parallel torch op keeps its own OpenMP team
(libgomp: one helper thread per extra core, for the thread's life). Once the process holds
more such threads than CPUs, libgomp stops spinning between parallel regions and parks its
helpers on a futex, so each of a sentence's parallel regions pays a wake-up: the inference
worker thread ran slower than the main thread just because the main thread had loaded and
warmed the voice (docs/benchmarks.md, "Figures behind the code's defaults").
`release_openmp_threads` frees the calling thread's team, so the worker thread's team is the
only one and spins as the main thread's did.

Per-thread team size. OpenMP's thread count (nthreads-var) is an ICV of each thread, and
torch's parallel regions, oneDNN and MKL read the calling thread's. `set_thread_team(n)` sets
it for the calling thread alone, leaving torch.get_num_threads() (a process-wide value that
some kernels size per-thread buffers by) at its maximum: two inference lanes may then run one
single-threaded batch each on a 2-core CPU, or one lane a batch on both cores.

Thread priority. A batch cannot be interrupted, but the kernel can share a core between two
threads. `lower_thread_priority` renices the calling thread (Linux nice is per thread): an
urgent batch on a thread at the process's own priority then takes a core from the lowered
ones at once, at little cost to the total audio per second (docs/serving.md, "Engine",
"Urgent lanes", has the probe).

Busy machines. An OpenMP team of n threads stalls at every barrier when fewer than n cores are
free: a thread descheduled for another process holds the whole team for its time slice, each
of a sentence's parallel regions. `fitted_team(n)` is the team a batch should use now: n when no
other process keeps a core busy, fewer when other processes' (not niced) CPU time over the last
fraction of a second leaves fewer cores free; `cpu_team` applies it to one batch. A batch of
several sentences then runs better as groups on one-thread teams at once than as one team
that waits at each barrier for a descheduled thread: `contended_groups` splits it by cost only
under contention and `run_groups` runs the groups.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_done = False


def libc() -> ctypes.CDLL:
    """The C library, for its allocator's calls (OSError where it cannot be loaded)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def tune_malloc() -> bool:
    """Apply once per process; True if the allocator was tuned."""
    global _done
    if _done:
        return True
    if os.environ.get("VOXSERVE_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = libc().mallopt
    except (OSError, AttributeError):  # musl or another libc without mallopt
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
    _done = ok
    log.debug("glibc malloc tuned for tensor reuse: %s", ok)
    return ok


_OMP_PAUSE_SOFT = 1


def _omp_libs() -> list[str]:
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "libgomp" in line or "libiomp" in line})
    except OSError:
        return []


_omp_fns: dict[str, object] = {}


def _omp_fn(name: str, argtypes=(), restype=None):
    """An OpenMP runtime function of the library torch runs on (found once), or None."""
    if name not in _omp_fns:
        _omp_fns[name] = None
        for path in _omp_libs():
            try:
                fn = getattr(ctypes.CDLL(path), name)
            except (OSError, AttributeError):
                continue
            fn.argtypes, fn.restype = list(argtypes), restype
            _omp_fns[name] = fn
            break
    return _omp_fns[name]


def intra_op_threads() -> int:
    import torch

    return torch.get_num_threads()


def thread_teams() -> bool:
    """Whether `set_thread_team` can work here (torch runs on an OpenMP runtime we found)."""
    return _omp_fn("omp_set_num_threads", [ctypes.c_int]) is not None


def set_thread_team(n: int) -> bool:
    """Set the calling thread's OpenMP team size (omp_set_num_threads) to n >= 1; other
    threads keep theirs. True if an OpenMP runtime took it."""
    fn = _omp_fn("omp_set_num_threads", [ctypes.c_int])
    if fn is None:
        return False
    fn(max(1, int(n)))
    return True


def thread_team() -> int | None:
    """The calling thread's OpenMP team size (omp_get_max_threads), or None without one."""
    fn = _omp_fn("omp_get_max_threads", restype=ctypes.c_int)
    return int(fn()) if fn is not None else None


class OtherLoad:
    """Cores that other processes keep busy, from /proc/stat and /proc/self/stat deltas over
    the time since the previous reading (at most every `every_s`). Niced processes' time is not
    counted: they yield the cores to us. Linux only; elsewhere always 0."""

    def __init__(self, every_s: float = 0.25):
        self.every_s = every_s
        self._last: tuple[float, float, float] | None = None  # (time, busy ticks all, our ticks)
        self.cores = 0.0
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

        self._lock = threading.Lock()

    @staticmethod
    def _read() -> tuple[float, float] | None:
        try:
            with open("/proc/stat") as f:
                v = [float(x) for x in f.readline().split()[1:9]]
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            return None
        user, _nice, system, _idle, _iowait, irq, softirq, steal = v
        return user + system + irq + softirq + steal, float(fields[11]) + float(fields[12])

    def other_cores(self) -> float:
        import time

        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < self.every_s:
                return self.cores
            r = self._read()
            if r is None:
                return 0.0
            if self._last is not None:
                dt = (now - self._last[0]) * self._tick
                self.cores = max(0.0, (r[0] - self._last[1]) - (r[1] - self._last[2])) / dt
            self._last = (now, r[0], r[1])
            return self.cores


_other = OtherLoad()
_other.other_cores()  # the baseline, so that the first batch's reading covers a window


_HOLD_S = 5.0  # a team size is kept this long: each switch costs cold per-team-size kernels
_decided: dict[int, tuple[float, int]] = {}


def fitted_team(n: int) -> int:
    """A team of at most n threads that fits the cores other processes left free over the last
    seconds (re-decided at most every few seconds)."""
    if n <= 1:
        return max(1, n)
    import time

    now = time.monotonic()
    d = _decided.get(n)
    if d is not None and now - d[0] < _HOLD_S:
        _other.other_cores()  # keep the window short
        return d[1]
    free = (os.cpu_count() or n) - _other.other_cores()
    team = max(1, min(n, int(free + 0.5)))  # (half a core busy elsewhere already stalls a team)
    _decided[n] = (now, team)
    return team


class cpu_team:
    """with cpu_team(): the calling thread's OpenMP team fitted to the free cores for one batch
    (see the module doc), restored after."""

    def __enter__(self):
        self.before = thread_team() if thread_teams() else None
        if self.before is not None:
            want = fitted_team(self.before)
            if want != self.before:
                set_thread_team(want)
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            set_thread_team(self.before)
        return False


def contended_groups(costs: Sequence[float]) -> list[list[int]] | None:
    """Indices of a batch's items in groups to run at once, one group per thread on a team of
    one (`run_groups`), when other processes keep cores busy (`fitted_team` below the calling
    thread's team): independent single-thread runs lose no time at barriers, where one team
    waits at each of them for its thread that the kernel gave to another process. None when
    the batch should run as it is (an idle machine, one item, a team of one). Groups are
    balanced by cost (largest first, each to the lightest group), each in the batch's order."""
    n = thread_team() if thread_teams() else None
    if n is None or n < 2 or len(costs) < 2 or fitted_team(n) >= n:
        return None
    k = min(n, len(costs))
    groups: list[list[int]] = [[] for _ in range(k)]
    load = [0.0] * k
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        g = min(range(k), key=load.__getitem__)
        groups[g].append(i)
        load[g] += costs[i]
    return [sorted(g) for g in groups]


_pool = None
_pool_lock = threading.Lock()


def run_groups(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run the calls at once, each on a thread whose OpenMP team is one thread (the first on
    the calling thread, its team restored after); their results in order, or the first
    exception raised."""
    global _pool
    from concurrent.futures import ThreadPoolExecutor

    with _pool_lock:
        if _pool is None or _pool._max_workers < len(calls) - 1:  # (grows, never shrinks)
            _pool = ThreadPoolExecutor(max(1, len(calls) - 1), thread_name_prefix="voxserve-split",
                                       initializer=set_thread_team, initargs=(1,))
        pool = _pool
    futures = [pool.submit(c) for c in calls[1:]]
    before = thread_team()
    set_thread_team(1)
    try:
        first = calls[0]()
    finally:
        if before is not None:
            set_thread_team(before)
    return [first] + [f.result() for f in futures]


def in_passing_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) on a new thread that ends with it: its result, or its exception
    raised here. For model loading and warm-up in a process whose inference runs on a worker
    thread: libgomp counts a thread's OpenMP team for as long as the thread lives (the main
    thread's even after `release_openmp_threads`), and once it counts more threads than CPUs
    it throttles spinning, so the worker's helpers sleep on a futex at every parallel region
    (docs/cosyvoice2.md, "Threads", has the slowdown). The torch thread count fn set is
    applied to the calling thread too (it is per thread under OpenMP)."""

    box: dict = {}

    def run() -> None:
        try:
            box["out"] = fn(*args, **kwargs)
        except BaseException as e:  # re-raised in the caller
            box["err"] = e
        finally:
            if "torch" in sys.modules:
                box["threads"] = sys.modules["torch"].get_num_threads()

    t = threading.Thread(target=run, name="voxserve-load", daemon=True)
    t.start()
    t.join()
    torch = sys.modules.get("torch")
    if torch is not None and "threads" in box and torch.get_num_threads() != box["threads"]:
        torch.set_num_threads(box["threads"])  # sets this thread's count; starts no team
    if "err" in box:
        raise box["err"]
    return box["out"]


def release_openmp_threads() -> bool:
    """Free the calling thread's OpenMP helper threads (omp_pause_resource_all), e.g. in the
    thread that loaded the voices, before an inference worker thread takes over the model; they
    are re-created if this thread runs parallel work again. True if the runtime did it."""
    for path in _omp_libs():
        try:
            pause = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):  # an OpenMP runtime older than 5.0
            continue
        pause.argtypes = [ctypes.c_int]
        if pause(_OMP_PAUSE_SOFT) == 0:
            log.debug("released this thread's OpenMP team (%s)", os.path.basename(path))
            return True
    return False


def lower_thread_priority(delta: int) -> bool:
    """Raise the calling thread's nice value by delta (Linux: nice is per thread), so the
    kernel gives a core to the process's other threads first when they compete for it. Any
    thread may lower its own priority; raising it back needs privileges, so this is one-way.
    True if it was applied."""
    if delta <= 0 or not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return False

    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + int(delta)))
    except OSError as e:  # e.g. a sandbox that forbids it
        log.debug("could not lower the thread's priority: %s", e)
        return False
    return True
