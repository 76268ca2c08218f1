"""The serving engine: requests in, sentences batched across requests, audio out per request.

Threads:
* one inference worker per device: the only thread that calls `voice.run_units` (all device
  work), looping `step()` = schedule -> run -> update;
* a small pool for the text front end (`voice.units`: split, normalise, phonemise; espeak-ng),
  which feeds each request's sentences into the scheduler a few at a time (a lookahead window),
  so a 1,000-sentence text is not phonemised ahead of need and a cancelled one stops early.
Callers (the asyncio side, tests) talk to it through `submit` / `cancel` and a `Sink` per
request whose methods are called from those threads. `submit` admits by time: it refuses a
request (OverloadedError) whose wait, or the delay it would cause accepted ones, passes
`EngineConfig.max_queue_wait_s` at the device's observed speed.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AudioTooLongError, EngineClosedError, UnknownVoiceError
from ..options import SynthesisOptions
from ..runtime.allocator import MemoryRelease
from ..runtime.cpu import (
    fitted_team,
    intra_op_threads,
    lower_thread_priority,
    release_openmp_threads,
    set_thread_team,
    thread_teams,
)
from ..voice import AudioBudget, SharedComponent, StepResult, StepRunner, Voice, piece_words
from .admission import Accepted, DeviceAdmission, check_memory
from .scheduler import Batch, Item, Scheduler, SchedulerConfig

log = logging.getLogger(__name__)

# A started engine gives its allocator's free pages back at the end of every period of this
# length in which it served (runtime/allocator.py, MemoryRelease): the first batch after each
# release faults its pages in again, so that cost comes once a minute, not once a batch.
RELEASE_PERIOD_S = 60.0

_NOTHING = object()  # `_Worker._takes`: a reniced lane sits out while other processes load the CPU
_CONTENDED_RECHECK_S = 1.0


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    frontend_lookahead: int = 16
    """Sentences a request may have queued before its front end pauses."""
    frontend_threads: int = 2
    """Threads for the text front end (espeak-ng itself runs one call at a time)."""
    executor: str = "auto"
    """How a CPU device runs its batches: "auto" runs lanes (two batches at once, each on its
    share of the threads, with urgent lanes and spill: see `_Worker`) on a CPU with at least 2
    intra-op threads whose voices all allow it (`Voice.concurrent_runs`: VITS in eager mode);
    "serial" runs one batch at a time on every thread. GPUs, step runners (Bark), offload and
    torch.compile always run serially."""
    max_queue_wait_s: float = 20.0
    """A new request is refused (OverloadedError, HTTP 429) when the work that may go before it
    on its device would take longer than this at the device's observed speed, or when its work
    would make an accepted request finish later than this plus that request's own synthesis
    time under load (its work at one lane's speed: its deadline; the scheduler's "Admission by
    time"). A request's own work is not part of its wait, so a text that takes longer than this
    to synthesise is still served (refused only while others are ahead of it). Until the device
    has run a batch (the server's warm-up sentence runs one before /ready) there is no speed to
    go by, and only the sentence bound (`SchedulerConfig.max_queued_sentences`: memory) applies."""

    def validate(self) -> "EngineConfig":
        self.scheduler.validate()
        if self.frontend_lookahead < 1:
            raise ValueError("frontend_lookahead must be at least 1")
        if self.frontend_threads < 1:
            raise ValueError("frontend_threads must be at least 1")
        if self.executor not in ("auto", "serial"):
            raise ValueError(f"executor must be auto or serial, not {self.executor!r}")
        if not 0.1 <= self.max_queue_wait_s <= 3600:
            raise ValueError(f"max_queue_wait_s must be in 0.1..3600 seconds, not {self.max_queue_wait_s!r}")
        return self


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

    def on_done(self, n_sentences: int) -> None:
        """Every sentence was delivered."""

    def on_error(self, error: BaseException) -> None:
        """The request failed (its audio so far was delivered, the rest never comes)."""


class BatchObserver:
    """Told about the device work as it runs (the server's metrics)."""

    def on_batch(self, voice: str, size: int, cost: int, seconds: float, audio_seconds: float) -> None:
        """One one-shot batch of `voice` ran."""

    def on_step(self, voice: str, active: int, finished: int, seconds: float, audio_seconds: float) -> None:
        """One step of a step voice ran (its share of the step's seconds and audio)."""


@dataclass
class _RequestState:
    id: int
    voice: str
    units: Iterator
    sink: Sink
    worker: "_Worker"
    produced: int = 0
    delivered: int = 0
    total: int | None = None  # known when the front end is exhausted
    order: deque = field(default_factory=deque)  # sentence indices produced, not yet all delivered
    held: dict = field(default_factory=dict)  # index -> [(audio, text, partial)] that came early
    frontend_running: bool = False
    finished: bool = False
    chars: int = 0  # length of the request's text
    est_cost: float = 0.0  # its predicted cost (chars x the voice's cost per char) until the front end ends
    produced_cost: int = 0  # the cost of the sentences its front end has queued
    deadline: float = float("inf")  # monotonic: admission keeps its finish before it (inf: no speed known)
    budget: AudioBudget | None = None  # the audio it has made, against its voice's limit
    staged: int = 0  # sentences waiting for a shared component's stage (not yet in the scheduler)
    starved_since: float | None = None
    """Monotonic: since when it waits on its own front end with nothing on the device. Such a
    request is not late by anyone's fault: its deadline moves by that time (`live_deadline`), so
    a slow text never makes every new request "delay" it (429 for all while it runs)."""

    def live_deadline(self, now: float) -> float:
        return self.deadline + (now - self.starved_since if self.starved_since is not None else 0.0)


@dataclass
class _Sequence:
    """A unit running in a step runner: its scheduler item, and whether audio of it went out."""

    voice: str
    item: Item
    started: bool = False
    seconds: float = 0.0  # device time of the steps it took part in, shared among their sequences


class _Worker:
    """One device: a scheduler, its lock, and the lane threads that run its batches.

    Lanes (CPU): on a GPU one thread runs every batch. On a CPU, one batch at a time leaves
    cores idle in its serial parts (Python, small ops, the host read between the stages), and
    splitting every op over all cores costs synchronisation. With `lanes` > 1, up to that many
    batches run at once, each on its share of the intra-op threads (`set_thread_team`), which
    makes more audio per second than one batch on every core. A batch with nothing else waiting
    runs on lane 0 with every thread, so a lone request is as fast as with one lane. A request
    has at most one batch in flight (the scheduler's rule), so its audio still comes back in order.

    Urgent lanes: with lanes, the work is split in two classes
    (the scheduler's "Urgent work": requests whose client waits for little, and the others),
    each with its own set of `lanes` threads. The other work's threads are reniced below the
    urgent ones, so when a short request arrives while long pieces hold every core, the kernel
    preempts them for it at once instead of it waiting for a piece to end (a batch cannot be
    interrupted); when there is no urgent work, the other lanes have the cores to themselves.
    A lone batch (nothing else running or waiting) of either class runs on urgent lane 0 with
    every thread: a reniced team on every thread would crawl once urgent work came, each of its
    OpenMP barriers waiting for the thread that shares a core with an urgent lane. While other
    processes keep cores busy (`fitted_team` below `threads`), the reniced lanes take nothing and
    the urgent ones take all work: a reniced thread loses its core to every outside process.

    Spill: a lane that finds nothing to take while a core is free takes
    the next sentence of a request that has one in flight (the scheduler's "Spill"), and the
    request's audio waits in `_deliver` until the sentences before it are delivered. A lone
    request's sentences after its first then run two at a time on one thread each, and its
    batch claims one thread, not every one, when a sentence of its own may run beside it (a
    stream's first sentence still runs alone on every thread: first audio).
    """

    LANES = 2
    """Batches a CPU runs at once with lanes (each class); docs/serving.md, "Engine", says why 2."""
    LANE_NICE = 10
    """How far the non-urgent lanes' threads are reniced (CFS weights: at +10 a nice-0 thread
    gets ~90% of a core it shares with one of them)."""
    LANE_BATCH = 1
    """Sentences per batch with lanes: on a CPU a batch costs about the sum of its sentences and
    the lanes give the overlap batching would, so one a batch lets a short request start at once."""
    SPILL = True
    """Whether lanes spill (see above); tests turn it off to see one batch per request."""

    def __init__(self, engine: "Engine", device: str, lanes: int = 1, threads: int = 1,
                 voices: Sequence[str] = ()):
        self.engine = engine
        self.device = device
        self.voices = list(voices)
        # this device's accepted requests, by id, guarded by `cond`: the engine's index of all
        # requests is only for lookups by id, never iterated (each worker has its own lock)
        self.requests: dict[int, _RequestState] = {}
        self.scheduler = Scheduler(engine.config.scheduler)
        self.running_cost: dict[str, int] = {}  # cost of the batches in flight, per voice
        self._busy_from = 0.0  # when the device last went from idle to busy (monotonic)
        self._last_done = 0.0  # when its last batch ended
        self.cond = threading.Condition()
        self.lanes = max(1, lanes)
        # the device's speed per voice, each voice's cost per character, the time test
        self.admission = DeviceAdmission(self.voices, engine.config.max_queue_wait_s, self.lanes)
        self.threads = max(1, threads)  # intra-op threads each class of lanes shares
        self.urgent = self.lanes > 1
        n = self.lanes * (2 if self.urgent else 1)  # lanes k >= self.lanes: the urgent class
        self._team = [0] * n  # threads each lane's batch holds (0: idle)
        name = f"voxserve-worker-{device}"
        self.lane_threads = [threading.Thread(target=self._loop, args=(k,), daemon=True,
                                              name=name if n == 1 else f"{name}-{self._lane_name(k)}")
                             for k in range(n)]
        self.running_batch = 0  # items in the batches being run
        self._max_items = self.LANE_BATCH if self.lanes > 1 else None
        self.spill = self.lanes > 1 and self.SPILL
        # step voices: their runners and the sequences in them (key -> _Sequence)
        self.steppers: dict[str, StepRunner] = {}
        for v in self.voices:
            runner = engine.voices[v].step_runner()
            if runner is not None:
                self.steppers[v] = runner
        self._seqs: dict[tuple, _Sequence] = {}
        self._seq_ids = itertools.count()
        # shared components: one instance per key on this device, run as a stage of their own
        self.components: dict[Any, SharedComponent] = {}
        for v in self.voices:
            for key, comp in engine.voices[v].components().items():
                if self.components.setdefault(key, comp) is not comp:
                    log.warning("voice %s brought a second instance of shared component %r; the first is used", v, key)
        self.stage_queue: deque[tuple[_RequestState, Any]] = deque()  # (request, unit) in arrival order
        self._stage_busy = False
        self._last_join: Batch | None = None

    def _lane_name(self, lane: int) -> str:
        return f"urgent-{lane - self.lanes}" if lane >= self.lanes else str(lane)

    def _class(self, lane: int) -> bool | None:
        """The work a lane takes: None = any (no urgent lanes), True = urgent, False = other."""
        return (lane >= self.lanes) if self.urgent else None

    def _peers(self, lane: int) -> list[int]:
        """The lanes of a lane's class, its lane 0 first."""
        first = self.lanes if self._class(lane) else 0
        return list(range(first, first + self.lanes))

    def _takes(self, urgent: bool | None):
        """The work a lane of class `urgent` takes now (lock held): its class's, unless other
        processes keep a core busy (`fitted_team`): then the reniced lanes, which would get a
        small share of a core against them, take nothing, and the urgent lanes take any work."""
        if not self.urgent or fitted_team(self.threads) >= self.threads:
            return urgent
        return _NOTHING if urgent is False else None

    def _lone(self) -> bool:
        """Nothing runs and one request waits: its batch will run alone (lock held)."""
        return not any(self._team) and self.scheduler.waiting_requests() == 1

    def _may_schedule(self, lane: int) -> bool:
        if self.lanes == 1:
            return True
        if self._class(lane) is False and self._lone():
            return False  # a lone batch is urgent lane 0's (see the class doc)
        # within a class: its lane 0 first (the one that may take every thread), and one of
        # the class's threads must be free
        peers = self._peers(lane)
        return (lane == peers[0] or self._team[peers[0]] > 0) and sum(self._team[k] for k in peers) < self.threads

    # ---------------------------------------------------------------- speed and work (lock held)
    def _started(self, batch: Batch) -> None:
        if self.running_batch == 0:
            self._busy_from = time.monotonic()
        self.running_batch += len(batch)
        self.running_cost[batch.voice] = self.running_cost.get(batch.voice, 0) + batch.cost

    def _ended(self, batch: Batch, done_cost: int | None) -> None:
        """A batch is over; done_cost: the work it did (None: it failed, no measurement). Its
        device seconds are the busy time since the previous batch ended (or the device went
        busy), so with several lanes overlapping batches are not counted twice."""
        self.running_batch -= len(batch)
        self.running_cost[batch.voice] = self.running_cost.get(batch.voice, 0) - batch.cost
        t = time.monotonic()
        if done_cost:
            self.admission.observe(batch.voice, done_cost, t - max(self._last_done, self._busy_from))
        self._last_done = t

    def work_ahead(self) -> dict[str, float]:
        """The cost a new request would find ahead of it, per voice: queued sentences, half the
        batches in flight (on average half done), and what accepted requests' front ends have
        not queued yet (predicted from their text's length). A new request does not count: its
        wait is the time before its own work, and a text longer than the bound must be servable."""
        work = {v: float(self.scheduler.queued_cost_of(v)) for v in self.voices}
        for v, c in self.running_cost.items():
            work[v] = work.get(v, 0.0) + 0.5 * c
        for r in self.requests.values():
            if r.total is None and not r.finished:
                work[r.voice] = work.get(r.voice, 0.0) + max(0.0, r.est_cost - r.produced_cost)
        return work

    def wait_estimate(self) -> float | None:
        """Seconds the device needs for all the work ahead (None: no batch timed yet)."""
        return self.admission.wait_s(self.work_ahead())

    def accepted(self, now: float) -> dict[int, Accepted]:
        """This device's accepted requests as admission sees them (the scheduler's accounting)."""
        out = {}
        for r in self.requests.values():
            if not r.finished:
                left = self.scheduler.pending_cost(r.id)
                if r.total is None:
                    left += max(0.0, r.est_cost - r.produced_cost)
                out[r.id] = Accepted(r.voice, left, r.live_deadline(now))
        return out

    def _claim(self, lane: int, batch: Batch, now: float) -> int:
        """Threads for a lane's batch (lock held): every free one if nothing else is waiting
        and no other lane runs, else the lane's share."""
        self._started(batch)
        if self.lanes == 1:
            return 0
        peers = self._peers(lane)
        free = self.threads - sum(self._team[k] for k in peers)
        more = self.scheduler.next_deadline(now) is not None
        if not more and self.spill and not batch.early:  # its own next sentence may run beside it
            more = self.scheduler.next_deadline(now, self._max_items, spill=True) is not None
        alone = lane == peers[0] and not more and not any(self._team) and self._class(lane) is not False
        team = free if alone else max(1, min(free, self.threads // self.lanes))
        self._team[lane] = team
        if more:
            self.cond.notify_all()  # another lane may take what is left
        return team

    # ---------------------------------------------------------------- step voices (lock held)
    def _room(self, joins_only: bool = False) -> dict[str, int] | None:
        """Sequences each step voice may take now (the scheduler's `room`); joins_only: the
        one-shot voices get none (a step's turn)."""
        if not self.steppers:
            return None
        room = {v: r.capacity - r.active for v, r in self.steppers.items()}
        if joins_only:
            room.update({v: 0 for v in self.voices if v not in self.steppers})
        return room

    def _stepping(self) -> bool:
        return any(r.active for r in self.steppers.values())

    def _step_turn(self) -> bool:
        """Whether the next work is a step of the active step voices rather than a one-shot
        batch: the voice that has used less device time goes first, as between batches."""
        active = [v for v, r in self.steppers.items() if r.active]
        if not active:
            return False
        others = [v for v in self.voices if v not in self.steppers and self.scheduler.queued_cost_of(v) > 0]
        if not others:
            return True
        return min(map(self.scheduler.voice_time, active)) <= min(map(self.scheduler.voice_time, others))

    def _join(self, batch: Batch) -> None:
        """A step voice's batch: its items join the runner as sequences (run from the next step)."""
        self._started(batch)
        self._last_join = batch
        runner = self.steppers[batch.voice]
        for it in batch.items:
            key = (it.request_id, it.index, next(self._seq_ids))
            self._seqs[key] = _Sequence(batch.voice, it)
            runner.join(key, it.payload)

    def _seq_done(self, key: tuple, ok: bool) -> None:
        q = self._seqs.pop(key, None)
        if q is None:
            return
        self.scheduler.complete(Batch(q.voice, [q.item]))
        self.running_batch -= 1
        self.running_cost[q.voice] = self.running_cost.get(q.voice, 0) - q.item.cost
        if ok and q.seconds > 0:
            self.admission.observe(q.voice, q.item.cost, q.seconds)
        self._last_done = time.monotonic()

    def _drop_cancelled(self, voice: str) -> None:
        runner = self.steppers[voice]
        for key, q in list(self._seqs.items()):
            if q.voice == voice:
                r = self.engine._requests.get(q.item.request_id)
                if r is None or r.finished:
                    runner.leave(key)
                    self._seq_done(key, ok=False)

    def _step_result(self, voice: str, res: StepResult, resume: list) -> None:
        eng = self.engine
        q = self._seqs.get(res.key)
        if q is None:
            return
        done = res.final or res.error is not None
        r = eng._requests.get(q.item.request_id)
        if done:
            self._seq_done(res.key, ok=res.error is None)
            if res.error is None:
                with eng._stats_lock:
                    eng.sentences_run += 1
        if r is None or r.finished:
            if not done:
                self.steppers[voice].leave(res.key)
                self._seq_done(res.key, ok=False)
            return
        if res.error is not None:
            eng._fail(r, res.error)
            return
        audio = res.audio if res.audio is not None else np.zeros(0, dtype=np.float32)
        if not len(audio) and not done:
            return
        try:
            r.budget.add(len(audio), sentence_start=not q.started and not q.item.continues)
        except AudioTooLongError as e:
            if not done:
                self.steppers[voice].leave(res.key)
                self._seq_done(res.key, ok=False)
            eng._fail(r, e)
            return
        text = "" if q.started or q.item.continues else q.item.payload.text
        q.started = True
        eng._deliver(r, q.item.index, audio, text, partial=not done)
        if done:
            eng._maybe_finish(r)
            if eng._needs_frontend(r):
                r.frontend_running = True
                resume.append(r)

    def _run_steps(self) -> None:
        """One step of every active step runner, then its results delivered. Voices that share
        one runner (one model, several saved voices) are stepped together, once."""
        resume: list[_RequestState] = []
        groups: dict[int, tuple[StepRunner, list[str]]] = {}
        for voice, runner in self.steppers.items():
            groups.setdefault(id(runner), (runner, []))[1].append(voice)
        for runner, voices in groups.values():
            with self.cond:
                for voice in voices:
                    self._drop_cancelled(voice)
                if not runner.active:
                    continue
            t0 = time.perf_counter()
            error: BaseException | None = None
            results: list[StepResult] = []
            try:
                results = runner.step()
            except Exception as e:  # the runner's failure fails its sequences, not the worker
                log.exception("step of %s failed", "/".join(voices))
                error = e
            dt = time.perf_counter() - t0
            with self.cond:
                mine = [k for k, q in self._seqs.items() if q.voice in voices]
                counts = {v: 0 for v in voices}
                for k in mine:
                    counts[self._seqs[k].voice] += 1
                    self._seqs[k].seconds += dt / len(mine)
                for voice, n in counts.items():  # each voice pays for its share of the step's sequences
                    if n:
                        self.scheduler.charge(voice, dt * n / len(mine))
                owner = {res.key: self._seqs[res.key].voice for res in results if res.key in self._seqs}
                if error is not None:
                    for k in mine:
                        runner.leave(k)
                        r = self.engine._requests.get(self._seqs[k].item.request_id)
                        self._seq_done(k, ok=False)
                        if r is not None:
                            self.engine._fail(r, error)
                else:
                    for res in results:
                        if res.key in owner:
                            self._step_result(owner[res.key], res, resume)
                observer = self.engine.observer
                if observer is not None and error is None:
                    for voice, n in counts.items():
                        if not n:
                            continue
                        own = [x for x in results if owner.get(x.key) == voice]
                        audio_s = sum(len(x.audio) for x in own if x.audio is not None) / self.engine.voices[voice].sample_rate
                        observer.on_step(voice, n, sum(1 for x in own if x.final and x.error is None), dt * n / len(mine), audio_s)
                self.cond.notify_all()
        for r in resume:
            self.engine._start_frontend(r)

    # ---------------------------------------------------------------- shared components
    def _take_stage(self) -> tuple[SharedComponent, list] | None:
        """The next batch of a shared component's work, in arrival order across requests and
        voices (lock held); None if there is none or another lane runs one."""
        if self._stage_busy or not self.stage_queue:
            return None
        while self.stage_queue and self.stage_queue[0][0].finished:
            self.stage_queue.popleft()[0].staged -= 1
        if not self.stage_queue:
            return None
        key = self.stage_queue[0][1].component
        comp = self.components[key]
        taken, kept, blocked = [], [], set()
        while self.stage_queue and len(taken) < comp.max_batch:
            r, u = self.stage_queue.popleft()
            if r.finished:
                r.staged -= 1
            elif u.component == key and r.id not in blocked:
                taken.append((r, u))
            else:  # another component's: it keeps its place (and its request's later units too)
                blocked.add(r.id)
                kept.append((r, u))
        self.stage_queue.extendleft(reversed(kept))
        self._stage_busy = True
        return comp, taken

    def _run_stage(self, comp: SharedComponent, taken: list) -> None:
        eng = self.engine
        t0 = time.perf_counter()
        error: BaseException | None = None
        outs: list = []
        try:  # one batch of every waiting request's and voice's inputs; outputs stay on the device
            outs = list(comp.run([u.component_input for _, u in taken]))
            if len(outs) != len(taken):
                raise RuntimeError(f"shared component {comp.key!r} gave {len(outs)} outputs for {len(taken)} inputs")
        except Exception as e:
            log.exception("shared component %r failed on %d inputs", comp.key, len(taken))
            error = e
        dt = time.perf_counter() - t0
        with self.cond:
            self._stage_busy = False
            now = time.monotonic()
            for k, (r, u) in enumerate(taken):
                r.staged -= 1
                self.scheduler.charge(r.voice, dt / len(taken))  # each voice pays its share
                if r.finished:
                    continue
                if error is not None:
                    eng._fail(r, error)
                    continue
                try:
                    unit = eng.voices[r.voice].with_component_output(u, outs[k])
                except Exception as e:
                    eng._fail(r, e)
                    continue
                self.scheduler.add_item(r.id, unit.index, unit.cost, unit, now)
            self.cond.notify_all()

    # The lane loop: everything below except the device work holds the lock.
    def _loop(self, lane: int) -> None:
        urgent = self._class(lane)
        if urgent is False:  # the other work yields the cores to urgent work
            lower_thread_priority(self.LANE_NICE)
        while True:
            with self.cond:
                work = None
                while work is None:
                    if self.engine._stopping_now:
                        return
                    now = time.monotonic()
                    takes = self._takes(urgent)
                    if takes is _NOTHING:  # back when the other processes' load is gone
                        self.cond.wait(_CONTENDED_RECHECK_S)
                        continue
                    work = self._next_work(now, lane, takes)
                    if work is None:
                        may = self._may_schedule(lane)
                        # urgent lane 0 also waits for a lone batch of the other class (only
                        # then: other work that it may not take would make it spin)
                        lone = takes and lane == self.lanes and self._lone()
                        wake = self.scheduler.next_deadline(now, self._max_items, None if lone else takes)
                        self.cond.wait(wake if may else None)
                kind, arg = work
                team = self._claim(lane, arg, now) if kind == "batch" else 0
            if team:
                set_thread_team(team)
            try:
                self._dispatch(kind, arg, lane)
            except Exception:  # a bug in delivery must not kill the device's only worker
                log.exception("internal error while delivering a batch")
                with self.cond:
                    self._team[lane] = 0
                    self.cond.notify_all()
                    if kind == "batch":
                        for rid in {it.request_id for it in arg.items}:
                            r = self.engine._requests.get(rid)
                            if r is not None:
                                self.engine._fail(r, RuntimeError("internal error"))

    def _next_work(self, now: float, lane: int | None, urgent: bool | None, force: bool = False):
        """(kind, arg) of the next work (lock held): ("stage", (component, entries)), ("step",
        None) after any joins, ("batch", batch), or None. lane None: `step()` by hand."""
        self._last_join = None
        stage = self._take_stage()
        if stage is not None:
            return "stage", stage
        if self._step_turn():
            joins = self.scheduler.schedule(now, force=True, room=self._room(joins_only=True))
            if joins is not None:
                self._join(joins)
            return "step", None
        batch = None
        if lane is None:
            batch = self.scheduler.schedule(now, force=force, room=self._room())
        elif self._may_schedule(lane):
            room = self._room()
            batch = self.scheduler.schedule(now, max_items=self._max_items, urgent=urgent, room=room)
            if batch is None and urgent and lane == self.lanes and self._lone():
                batch = self.scheduler.schedule(now, max_items=self._max_items, room=room)
            if batch is None and self.spill and sum(self._team) < self.threads:
                batch = self.scheduler.schedule(now, max_items=self._max_items, urgent=urgent, spill=True)
        if batch is not None and batch.voice in self.steppers:
            self._join(batch)
            return "step", None
        if batch is not None:
            return "batch", batch
        if self._stepping():
            return "step", None
        return None

    def _dispatch(self, kind: str, arg, lane: int | None) -> None:
        if kind == "stage":
            self._run_stage(*arg)
        elif kind == "step":
            self._run_steps()
        else:
            self._run_and_update(arg, lane)

    def step(self, now: float | None = None, force: bool = True) -> Batch | None:
        """One schedule -> run -> update on the calling thread (tests, or a caller without the
        worker thread): a one-shot batch, a shared component's batch, or a step of the step
        voices (with any sequences that joined before it). Returns the batch that ran (for a
        step, the joiners, possibly none; for a stage, an empty batch of the component's key),
        or None when there was nothing to do."""
        with self.cond:
            work = self._next_work(time.monotonic() if now is None else now, None, None, force=force)
            if work is None:
                return None
            kind, arg = work
            joined = self._last_join
            if kind == "batch":
                self._started(arg)
        self._dispatch(kind, arg, None)
        if kind == "stage":
            return Batch(arg[0].key, [])
        if kind == "step":
            return joined or Batch(next(v for v, r in self.steppers.items()), [])
        return arg

    def _run_and_update(self, batch: Batch, lane: int | None = None) -> None:
        eng = self.engine
        voice = eng.voices[batch.voice]
        t0 = time.perf_counter()
        error: BaseException | None = None
        results: Sequence[tuple[np.ndarray, Any]] = ()
        try:  # the device work; long items come back cut, with a rest to queue again
            results = voice.run_pieces([it.payload for it in batch.items], early=batch.early,
                                       max_cost=self.scheduler.config.max_batch_phonemes)
        except Exception as e:  # a model failure fails the batch's requests, not the worker
            log.exception("batch of %d sentences failed", len(batch))
            error = e
        dt = time.perf_counter() - t0
        if error is None:
            audio_s = sum(len(a) for a, _ in results if not isinstance(a, BaseException)) / voice.sample_rate
            with eng._stats_lock:
                eng.sentences_run += sum(rest is None for _, rest in results)
                eng.batches_run += 1
            if eng.observer is not None:
                eng.observer.on_batch(batch.voice, len(batch), batch.cost, dt, audio_s)
        # update: deliver in order, under the lock so that cancel() cannot interleave
        resume = []
        with self.cond:
            self.scheduler.complete(batch, dt)  # the voice's device time: voices share the device fairly
            # the work done: a cut item's rest is queued again and counted when it runs
            done = None if error is not None else batch.cost - sum(rest.cost for _, rest in results if rest is not None)
            self._ended(batch, done)
            if lane is not None:
                self._team[lane] = 0
            for k, it in enumerate(batch.items):
                r = eng._requests.get(it.request_id)
                if r is None or r.finished:
                    continue  # cancelled while running: its audio goes nowhere
                if error is not None:
                    eng._fail(r, error)
                    continue
                audio, rest = results[k]
                if isinstance(audio, BaseException):  # this sentence alone failed (over its limit)
                    eng._fail(r, audio)
                    continue
                try:
                    r.budget.add(len(audio), sentence_start=not it.continues)
                except AudioTooLongError as e:
                    eng._fail(r, e)
                    continue
                text = "" if it.continues else it.payload.text
                if rest is not None:  # a piece: the rest goes back to the front of its queue
                    if any(x.request_id == it.request_id for x in batch.items[k + 1 :]):
                        # the scheduler keeps cuttable items apart from their successors
                        log.error("a cut item shared its batch with a later item of its request")
                        eng._fail(r, RuntimeError("internal error"))
                        continue
                    eng._deliver(r, it.index, audio, text, partial=True, words=piece_words(results[k]))
                    self.scheduler.requeue(it.request_id, it.index, rest.cost, rest, time.monotonic())
                    continue
                eng._deliver(r, it.index, audio, text, words=piece_words(results[k]))
                eng._maybe_finish(r)
            for rid in {it.request_id for it in batch.items}:
                r = eng._requests.get(rid)
                if r is not None and eng._needs_frontend(r):
                    r.frontend_running = True
                    resume.append(r)
            self.cond.notify_all()
        for r in resume:
            eng._start_frontend(r)


class Engine:
    """Voices by name; one worker per device. Thread safe."""

    def __init__(self, voices: Mapping[str, Voice] | Sequence[Voice], config: EngineConfig | None = None,
                 observer: BatchObserver | None = None):
        self.config = (config or EngineConfig()).validate()
        if not isinstance(voices, Mapping):
            voices = {v.name: v for v in voices}
        if not voices:
            raise ValueError("an engine needs at least one voice")
        for name, v in voices.items():
            if not isinstance(v, Voice):
                raise TypeError(f"voice {name!r} is a {type(v).__name__}, not a voxserve.voice.Voice")
        self.voices: dict[str, Voice] = dict(voices)
        self.observer = observer
        self._workers: dict[str, _Worker] = {}
        self._worker_of: dict[str, _Worker] = {}
        on: dict[str, list[str]] = {}
        for name, v in self.voices.items():
            on.setdefault(str(v.device), []).append(name)
        for dev, names in on.items():
            lanes, threads = self._lanes(dev, [self.voices[n] for n in names])
            self._workers[dev] = _Worker(self, dev, lanes, threads, names)
            for name in names:
                self._worker_of[name] = self._workers[dev]
        self._requests: dict[int, _RequestState] = {}
        self._ids = itertools.count(1)
        self._frontend = ThreadPoolExecutor(self.config.frontend_threads, thread_name_prefix="voxserve-frontend")
        self._accepting = False
        self._stopping_now = False
        self._started = False
        self._memory_release: MemoryRelease | None = None
        self.sentences_run = 0  # sentences synthesised (only ever grows)
        self.batches_run = 0
        self.sentences_dropped = 0  # queued sentences dropped by cancellation
        self._stats_lock = threading.Lock()

    def _lanes(self, device: str, voices: list[Voice]) -> tuple[int, int]:
        """(lanes, intra-op threads they share) for a device's worker."""
        steps = any(v.step_runner() is not None for v in voices)
        if steps or not device.startswith("cpu") or not all(v.concurrent_runs for v in voices):
            return 1, 1  # (a step runner is called from one thread)
        threads = intra_op_threads()
        if not thread_teams():  # without per-thread teams, lanes would oversubscribe the cores
            return 1, threads
        if self.config.executor == "serial":
            return 1, threads
        return max(1, min(_Worker.LANES, threads)), threads

    def warm_voice(self, name: str) -> None:
        """Run a voice's own warm-up (`Voice.warmup`: CPU per-shape kernels, CUDA graphs) on
        the calling thread, once per OpenMP team size its device's lanes use: oneDNN builds its
        kernels per shape and per thread count, so a team size not warmed runs its first
        sentences slowly. Call before traffic: it uses the model from this thread."""
        warm = self.voice(name).warmup
        w = self._worker_of[name]
        sizes = [w.threads] + ([max(1, w.threads // w.lanes)] if w.lanes > 1 else [])
        for n in dict.fromkeys(sizes):  # (in order, once each)
            if w.lanes > 1:
                set_thread_team(n)
            warm()
        if w.lanes > 1:
            set_thread_team(w.threads)
            release_openmp_threads()  # the lanes' teams stay the only ones (runtime/cpu.py)

    def device_of(self, voice_name: str) -> str:
        """The device whose worker runs the voice."""
        self.voice(voice_name)  # UnknownVoiceError
        return self._worker_of[voice_name].device

    @property
    def lanes(self) -> dict[str, int]:
        """Lanes per device (batches each runs at once)."""
        return {dev: w.lanes for dev, w in self._workers.items()}

    @property
    def urgent_lanes(self) -> dict[str, bool]:
        """Whether each device has urgent lanes (it does when it has lanes)."""
        return {dev: w.urgent for dev, w in self._workers.items()}

    # ------------------------------------------------------------------ lifecycle
    def start(self, threads: bool = True) -> "Engine":
        """Accept requests; threads=False runs no worker threads (drive it with `step()`)."""
        if threads and not self._started:
            self._started = True
            # the caller (usually the thread that loaded and warmed the voices) gives up its
            # OpenMP team, so the worker's is the only one and keeps spinning between ops
            release_openmp_threads()
            for w in self._workers.values():
                for t in w.lane_threads:
                    t.start()
            self._memory_release = MemoryRelease(RELEASE_PERIOD_S)
            self._mark_activity()
        self._accepting = True
        return self

    def _mark_activity(self) -> None:
        if self._memory_release is not None:
            self._memory_release.busy(bool(self._requests))

    def stop_accepting(self) -> None:
        self._accepting = False

    def drain(self, timeout: float) -> bool:
        """Wait (up to timeout seconds) for every accepted request to finish. True if they did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._requests:
                return True
            time.sleep(0.02)
        return not self._requests

    def shutdown(self, timeout: float = 30.0) -> bool:
        """Refuse new requests, finish the accepted ones (bounded by timeout), stop the workers."""
        self.stop_accepting()
        finished = self.drain(timeout)
        for w in self._workers.values():
            with w.cond:
                for r in list(w.requests.values()):
                    self._fail(r, EngineClosedError("the server is shutting down"))
        self._stopping_now = True
        for w in self._workers.values():
            with w.cond:
                w.cond.notify_all()
        for w in self._workers.values():
            for t in w.lane_threads:
                if t.is_alive():
                    t.join(timeout=max(1.0, timeout))
        self._frontend.shutdown(wait=False, cancel_futures=True)
        if self._memory_release is not None:
            self._memory_release.stop()
        return finished

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ requests
    def voice(self, name: str) -> Voice:
        try:
            return self.voices[name]
        except KeyError:
            raise UnknownVoiceError(name, sorted(self.voices)) from None

    def queued_sentences(self) -> int:
        return sum(w.scheduler.queued for w in self._workers.values())

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    def submit(self, voice_name: str, text: str, options: SynthesisOptions | None, sink: Sink,
               streaming: bool = False) -> int:
        """Accept a request; raises at once for bad input (EmptyTextError, InvalidOptionError,
        UnknownSpeakerError, UnknownVoiceError), OverloadedError or EngineClosedError.
        Results arrive through `sink`. Returns the request id (for `cancel`)."""
        if not self._accepting:
            raise EngineClosedError("the engine is not accepting requests (starting or shutting down)")
        voice = self.voice(voice_name)
        units = voice.units(text, options)  # validates now; the sentences come lazily
        w = self._worker_of[voice_name]
        with w.cond:
            waiting = sum(1 for r in w.requests.values() if r.produced == 0)
            if w.scheduler.queued + waiting >= w.scheduler.config.max_queued_sentences:  # memory
                check_memory(w.scheduler.queued, waiting, w.scheduler.config.max_queued_sentences, w.wait_estimate())
            # the front end runs later: the request's own cost is predicted from its length
            est = len(text) * w.admission.cost_per_char(voice_name)
            now = time.monotonic()
            deadline = w.admission.check(voice_name, est, now, w.accepted(now), w.running_cost)
            rid = next(self._ids)
            w.scheduler.add_request(rid, voice_name, streaming=streaming)
            r = _RequestState(rid, voice_name, units, sink, w, frontend_running=True, chars=len(text), est_cost=est,
                              deadline=deadline,
                              budget=AudioBudget(voice.limits, voice.sample_rate, voice.silence_after(options)),
                              starved_since=now)
            self._requests[rid] = r
            w.requests[rid] = r
            self._mark_activity()
        self._start_frontend(r)
        return rid

    def queue_wait_s(self, voice_name: str, text: str | None = None) -> float | None:
        """The estimated wait of a request submitted now for this voice: for `text`, the work
        that may go before it (as admission computes it); without, the time the voice's device
        needs for all the work ahead. None before the device has run a batch (until then only
        the sentence bound applies)."""
        self.voice(voice_name)  # UnknownVoiceError
        w = self._worker_of[voice_name]
        with w.cond:
            if text is None:
                return w.wait_estimate()
            now = time.monotonic()
            adm = w.admission.decide(voice_name, len(text) * w.admission.cost_per_char(voice_name), now,
                                     w.accepted(now), w.running_cost)
            return None if adm is None else adm[0].wait_s

    def cost_per_s(self, voice_name: str) -> float | None:
        """The observed speed of the voice's device (phoneme ids per busy second), if any."""
        self.voice(voice_name)
        w = self._worker_of[voice_name]
        with w.cond:
            return w.admission.cost_per_s(voice_name)

    def cancel(self, request_id: int) -> None:
        """Drop a request: its queued sentences are never synthesised; no more callbacks."""
        r = self._requests.get(request_id)
        if r is None:
            return
        with r.worker.cond:
            if r.finished:
                return
            r.finished = True
            self._requests.pop(request_id, None)
            r.worker.requests.pop(request_id, None)
            self._mark_activity()
            self.sentences_dropped += r.worker.scheduler.cancel(request_id)
            r.worker.cond.notify_all()

    # ------------------------------------------------------------------ front end
    def _needs_frontend(self, r: _RequestState) -> bool:
        return (not r.finished and r.total is None and not r.frontend_running
                and self._pending(r) < self.config.frontend_lookahead)

    @staticmethod
    def _pending(r: _RequestState) -> int:
        """Sentences of a request produced and not yet run (queued, or in a shared stage)."""
        return r.worker.scheduler.pending_items(r.id) + r.staged

    def _start_frontend(self, r: _RequestState) -> None:
        try:
            self._frontend.submit(self._frontend_job, r)
        except RuntimeError:  # the pool is shut down: the engine is stopping
            with r.worker.cond:
                self._fail(r, EngineClosedError("the server is shutting down"))

    def _frontend_job(self, r: _RequestState) -> None:
        """Produce up to the lookahead window of sentences for one request, then yield the
        thread (so a long text does not hold a front-end thread while others wait)."""
        w = r.worker
        budget = self.config.frontend_lookahead
        try:
            while budget > 0:
                with w.cond:
                    if r.finished:
                        return
                    if self._pending(r) >= self.config.frontend_lookahead:
                        r.frontend_running = False
                        if self._needs_frontend(r):  # consumed meanwhile: keep going
                            r.frontend_running = True
                        else:
                            return
                    if r.starved_since is None and self._pending(r) == 0:
                        r.starved_since = time.monotonic()  # the device ran all it had
                try:
                    unit = next(r.units)
                except StopIteration:
                    with w.cond:
                        r.total = r.produced
                        w.admission.learn_cost_per_char(r.voice, r.chars, r.produced_cost)
                        w.scheduler.input_done(r.id)
                        r.frontend_running = False
                        self._maybe_finish(r)
                    return
                budget -= 1
                with w.cond:
                    if r.finished:
                        return
                    if r.starved_since is not None:  # from now it has device work
                        r.deadline = r.live_deadline(time.monotonic())
                        r.starved_since = None
                    if unit.component is None:
                        w.scheduler.add_item(r.id, unit.index, unit.cost, unit, time.monotonic())
                    elif unit.component in w.components:  # its shared component's stage first
                        w.stage_queue.append((r, unit))
                        r.staged += 1
                    else:
                        raise RuntimeError(f"voice {r.voice!r} gave a unit for shared component "
                                           f"{unit.component!r}, which none of its device's voices has")
                    r.order.append(unit.index)
                    r.produced += 1
                    r.produced_cost += max(int(unit.cost), 1)
                    w.cond.notify_all()
        except Exception as e:  # UnpronounceableTextError, or a front-end failure
            with w.cond:
                self._fail(r, e)
            return
        with w.cond:  # budget used up: queue another round behind other requests' work
            if r.finished:
                return
        self._start_frontend(r)

    # ------------------------------------------------------------------ completion (lock held)
    def _deliver(self, r: _RequestState, index: int, audio: np.ndarray, text: str, partial: bool = False,
                 words: tuple = ()) -> None:
        """Hand audio to the request's sink in sentence order: with spill a sentence may finish
        before the one ahead of it, and waits here until that one is delivered."""
        r.held.setdefault(index, []).append((audio, text, partial, words))
        while r.order and r.order[0] in r.held:
            k = r.order[0]
            whole = False
            for a, t, p, w in r.held.pop(k):  # a cut sentence's pieces, in the order they ran
                if w:
                    r.sink.on_words(k, w)
                if p:
                    r.sink.on_audio(k, a, t, partial=True)
                else:  # as before pieces existed: sinks written then take (index, samples, text)
                    r.sink.on_audio(k, a, t)
                whole = not p
            if not whole:
                return  # the rest of sentence k is still to come
            r.order.popleft()
            r.delivered += 1

    def _maybe_finish(self, r: _RequestState) -> None:
        if not r.finished and r.total is not None and r.delivered >= r.total:
            r.finished = True
            self._requests.pop(r.id, None)
            r.worker.requests.pop(r.id, None)
            self._mark_activity()
            r.worker.scheduler.finish_request(r.id)
            r.sink.on_done(r.total)

    def _fail(self, r: _RequestState, error: BaseException) -> None:
        if r.finished:
            return
        r.finished = True
        self._requests.pop(r.id, None)
        r.worker.requests.pop(r.id, None)
        self._mark_activity()
        self.sentences_dropped += r.worker.scheduler.cancel(r.id)
        r.sink.on_error(error)

    # ------------------------------------------------------------------ stepping by hand
    def step(self) -> Batch | None:
        """One schedule -> run -> update on this thread, for engines not `start`ed with
        worker threads (tests, scripts). Runs the first due batch of any device."""
        for w in self._workers.values():
            b = w.step()
            if b is not None:
                return b
        return None
