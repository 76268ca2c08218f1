"""Executors: the threads that drive a device's step (`DeviceWorker`: schedule -> execute -> update).

* `SerialExecutor` (the default; what a GPU, step runners, offload and torch.compile use): one
  thread runs every step, one plan at a time, on every intra-op thread.
* `CpuExecutor` (a CPU whose voices allow it: `Voice.concurrent_runs`): lanes, below.

Lanes (CPU): one batch at a time leaves cores idle in its serial parts (Python, small ops, the
host read between the stages), and splitting every op over all cores costs synchronisation.
With `lanes` > 1, up to that many batches run at once, each on its share of the intra-op
threads (`set_team`), which makes more audio per second than one batch on every core. A batch
with nothing else waiting runs on lane 0 with every thread, so a lone request is as fast as with
one lane. A request has at most one batch in flight (the scheduler's rule), so its audio still
comes back in order.

Urgent lanes: the work is split in two classes (the scheduler's "Urgent work": requests whose
client waits for little, and the others), each with its own set of `lanes` threads. The other
work's threads are reniced below the urgent ones, so when a short request arrives while long
pieces hold every core, the kernel preempts them for it at once instead of it waiting for a
piece to end (a batch cannot be interrupted). A lone batch (nothing else running or waiting) of
either class runs on urgent lane 0 with every thread: a reniced team on every thread would
crawl once urgent work came. While other processes keep cores busy (`fitted_team` below
`threads`), the reniced lanes take nothing and the urgent ones take all work.

Spill: a lane that finds nothing to take while a core is free takes the next sentence of a
request that has one in flight (the scheduler's "Spill"); the output path holds its audio until
the sentences before it are delivered (engine/output.py). A lone request's sentences after its
first then run two at a time on one thread each (a stream's first sentence still runs alone on
every thread: first audio).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..runtime.cpu import fitted_team, lower_thread_priority, release_openmp_threads, set_thread_team
from .scheduler import ANY, Batch, Pick
from .worker import DeviceWorker, Plan

URGENT_MAX_S = 0.3
"""A request is urgent while what its client waits for is predicted to take at most this much
device time (the scheduler's "Urgent work"): a short sentence on a small CPU at its pace under
load; why this value: docs/benchmarks.md, "The short-request p95 at 8 clients, fixed"."""

log = logging.getLogger(__name__)

class Executor:
    """Drives one device's worker on threads of its own."""

    lanes: int = 1
    """Plans it runs at once (admission counts a request's own work at 1 / lanes of the device)."""

    def __init__(self, worker: DeviceWorker, stopping: Callable[[], bool]):
        self.worker = worker
        self.stopping = stopping
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            if t.is_alive():
                t.join(timeout=timeout)

    def warm(self, warmup: Callable[[], None]) -> None:
        """Run a voice's warm-up as this executor's threads will run its work."""
        warmup()

    def _run(self, plan: Plan) -> None:
        w = self.worker
        try:
            w.update(plan, w.execute(plan))
        except Exception:  # a bug in delivery must not kill the device's only worker
            log.exception("internal error while running a step")
            with w.cond:
                w.release(plan)
                w.cond.notify_all()


class SerialExecutor(Executor):
    """One thread: schedule -> execute -> update, one plan at a time."""

    def __init__(self, worker: DeviceWorker, stopping: Callable[[], bool]):
        super().__init__(worker, stopping)
        self.threads = [threading.Thread(target=self._loop, daemon=True, name=f"voxserve-worker-{worker.device}")]

    def _loop(self) -> None:
        w = self.worker
        while True:
            with w.cond:
                plan = None
                while plan is None:
                    if self.stopping():
                        return
                    now = time.monotonic()
                    plan = w.schedule(now, (ANY,))
                    if plan is None:
                        w.cond.wait(w.scheduler.next_deadline(now))
            self._run(plan)


@dataclass(frozen=True)
class CpuLanes:
    """How the CPU executor runs; the defaults are the product's, tests pass their own."""

    lanes: int = 2
    """Batches a CPU runs at once (each class); docs/serving.md, "Engine", says why 2."""
    batch: int = 1
    """Sentences per batch: on a CPU a batch costs about the sum of its sentences and the lanes
    give the overlap batching would, so one a batch lets a short request start at once."""
    spill: bool = True
    nice: int = 10
    """How far the non-urgent lanes' threads are reniced (CFS weights: at +10 a nice-0 thread
    gets ~90% of a core it shares with one of them)."""
    threads: int | None = None
    """Intra-op threads each class of lanes shares (None: the process's)."""
    teams: bool | None = None
    """Whether each thread may take its own OpenMP team size (None: as runtime/cpu.py finds)."""
    urgent_max_s: float = URGENT_MAX_S
    """A request is urgent while what its client waits for is predicted to take at most this
    many device seconds (the scheduler's "Urgent work")."""
    recheck_s: float = 1.0
    """How often a reniced lane that sits out under outside load looks again."""
    set_team: Callable[[int], object] = set_thread_team
    fitted_team: Callable[[int], int] = fitted_team
    lower_priority: Callable[[int], object] = lower_thread_priority
    release_threads: Callable[[], object] = release_openmp_threads


class CpuExecutor(Executor):
    """Lanes (see the module doc): 2 x `lanes` threads, urgent work on the higher-priority half."""

    def __init__(self, worker: DeviceWorker, stopping: Callable[[], bool], settings: CpuLanes, threads: int):
        super().__init__(worker, stopping)
        self.settings = settings
        self.lanes = max(1, settings.lanes)
        self.nthreads = max(1, threads)  # intra-op threads each class of lanes shares
        # each lane's picks, built once: its class (None: any, the urgent lanes' while other
        # processes keep cores busy), and that class with a request's second sentence (spill)
        size, cut = settings.batch, settings.urgent_max_s
        self._class = {True: Pick.short(cut, size), False: Pick.long(cut, size), None: Pick(items=size)}
        self._spill = {k: replace(p, second=True) for k, p in self._class.items()}
        self._team = [0] * (2 * self.lanes)  # threads each lane's batch holds (0: idle); k >= lanes: urgent
        name = f"voxserve-worker-{worker.device}"
        self.threads = [threading.Thread(target=self._loop, args=(k,), daemon=True, name=f"{name}-{self._lane_name(k)}")
                        for k in range(2 * self.lanes)]

    def warm(self, warmup: Callable[[], None]) -> None:
        """Once per OpenMP team size the lanes use: oneDNN builds its kernels per shape and per
        thread count, so a team size not warmed runs its first sentences slowly."""
        set_team = self.settings.set_team
        for n in dict.fromkeys([self.nthreads, max(1, self.nthreads // self.lanes)]):
            set_team(n)
            warmup()
        set_team(self.nthreads)
        self.settings.release_threads()  # the lanes' teams stay the only ones (runtime/cpu.py)

    def _lane_name(self, lane: int) -> str:
        return f"urgent-{lane - self.lanes}" if lane >= self.lanes else str(lane)

    def _urgent(self, lane: int) -> bool:
        return lane >= self.lanes

    def _peers(self, lane: int) -> list[int]:
        """The lanes of a lane's class, its lane 0 first."""
        first = self.lanes if self._urgent(lane) else 0
        return list(range(first, first + self.lanes))

    def _contended(self) -> bool:
        """Other processes keep a core busy: the reniced lanes sit out, the urgent ones take all."""
        return self.settings.fitted_team(self.nthreads) < self.nthreads

    def _lone(self) -> bool:
        """Nothing runs and one request waits: its batch will run alone (lock held)."""
        return not any(self._team) and self.worker.scheduler.waiting_requests() == 1

    def _may_schedule(self, lane: int) -> bool:
        if not self._urgent(lane) and self._lone():
            return False  # a lone batch is urgent lane 0's (see the module doc)
        # within a class: its lane 0 first (the one that may take every thread), and one of
        # the class's threads must be free
        peers = self._peers(lane)
        return (lane == peers[0] or self._team[peers[0]] > 0) and sum(self._team[k] for k in peers) < self.nthreads

    def _picks(self, lane: int, takes: bool | None) -> tuple[Pick, ...]:
        """What a lane may take now, tried in order (lock held): its class; urgent lane 0 also
        a lone batch of any class; with a core free, a second sentence of its class (spill)."""
        if not self._may_schedule(lane):
            return ()
        picks = [self._class[takes]]
        if takes and lane == self.lanes and self._lone():
            picks.append(self._class[None])
        if self.settings.spill and sum(self._team) < self.nthreads:
            picks.append(self._spill[takes])
        return tuple(picks)

    def _claim(self, lane: int, batch: Batch, now: float) -> int:
        """Threads for a lane's batch (lock held): every free one if nothing else is waiting
        and no other lane runs, else the lane's share."""
        s = self.worker.scheduler
        peers = self._peers(lane)
        free = self.nthreads - sum(self._team[k] for k in peers)
        more = s.next_deadline(now) is not None
        if not more and self.settings.spill and not batch.early:  # its own next sentence may run beside it
            more = s.next_deadline(now, self._spill[None]) is not None
        alone = lane == peers[0] and not more and not any(self._team) and self._urgent(lane)
        team = free if alone else max(1, min(free, self.nthreads // self.lanes))
        self._team[lane] = team
        if more:
            self.worker.cond.notify_all()  # another lane may take what is left
        return team

    def _loop(self, lane: int) -> None:
        w, urgent = self.worker, self._urgent(lane)
        if not urgent:  # the other work yields the cores to urgent work
            self.settings.lower_priority(self.settings.nice)
        while True:
            with w.cond:
                plan = None
                while plan is None:
                    if self.stopping():
                        return
                    now = time.monotonic()
                    contended = self._contended()
                    if contended and not urgent:  # back when the other processes' load is gone
                        w.cond.wait(self.settings.recheck_s)
                        continue
                    takes = None if contended else urgent  # (contended: the urgent lanes take any work)
                    plan = w.schedule(now, self._picks(lane, takes))
                    if plan is None:
                        may = self._may_schedule(lane)
                        # urgent lane 0 also waits for a lone batch of the other class (only
                        # then: other work that it may not take would make it spin)
                        lone = takes and lane == self.lanes and self._lone()
                        wake = w.scheduler.next_deadline(now, self._class[None if lone else takes])
                        w.cond.wait(wake if may else None)
                team = self._claim(lane, plan.batch, now) if plan.batch is not None else 0
            if team:
                self.settings.set_team(team)
            try:
                self._run(plan)
            finally:
                with w.cond:
                    self._team[lane] = 0
                    w.cond.notify_all()
