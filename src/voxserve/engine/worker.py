"""One device's worker: its requests, its scheduler and the step `schedule -> execute -> update`.

    schedule(now)            under the device's lock: which work runs next, as a `Plan`
        |                    (a shared component's batch, or joins/leaves + one step of the
        v                    step runners, or a one-shot batch); accounting is charged here
    execute(plan)            no lock: the device work only (model calls), timed -> `Outcome`
        |
        v
    update(plan, outcome)    under the lock: the scheduler learns the time used, results go
                             to the output path (`Engine._emit`), failures to their requests

The decisions inside `schedule` are the pure scheduler's (engine/scheduler.py: fairness
between voices and requests by device time, first audio before bulk, starvation bounds) and
the two rules here: a shared component's waiting inputs go first (they gate their voices'
sentences), and step voices take turns with one-shot voices by device time. An executor
(engine/executors.py) drives the step: one thread (serial: GPUs, the default) or CPU lanes.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..options import SynthesisOptions
from ..contract import SharedComponent, StepResult, StepRunner, Unit, VoiceContract, piece_error, piece_words
from .admission import Accepted, DeviceAdmission
from .output import RequestOutput
from .device_time import DeviceTime
from .scheduler import ANY, NOW, Batch, Item, Pick, Scheduler, SchedulerConfig

log = logging.getLogger(__name__)


@dataclass
class RequestState:
    id: int
    voice: str
    units: Iterator[Unit] | None
    """Its sentences, from the voice's front end (None until the front end has started: `accept`)."""
    out: RequestOutput
    worker: "DeviceWorker"
    text: str = ""
    options: SynthesisOptions | None = None
    produced: int = 0
    total: int | None = None  # known when the front end is exhausted
    frontend_running: bool = False
    finished: bool = False
    chars: int = 0  # length of the request's text
    est_cost: float = 0.0  # its predicted cost (chars x the voice's cost per char) until the front end ends
    produced_cost: int = 0  # the cost of the sentences its front end has queued
    deadline: float = float("inf")  # monotonic: admission keeps its finish before it (inf: no speed known)
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


@dataclass
class Plan:
    """The work of one step on one device, as `schedule` decided it: one kind per step."""

    stage: tuple[SharedComponent, list[tuple[RequestState, Unit]]] | None = None
    """A shared component's batch: its inputs, across requests and voices, in arrival order."""
    leaves: list[tuple[StepRunner, tuple]] = field(default_factory=list)
    """Sequences of cancelled requests, to drop from their runners before the step."""
    joins: list[tuple[StepRunner, tuple, Unit]] = field(default_factory=list)
    """Sequences that join their runner before the step (continuous batching)."""
    joined: Batch | None = None  # (the scheduler's batch the joins came from)
    step: list[tuple[StepRunner, list[str]]] = field(default_factory=list)
    """Runners to step once each, with their voices (voices of one model share its runner)."""
    batch: Batch | None = None
    """A one-shot batch (VITS, SBV2's synthesiser): run whole, long sentences cut in pieces."""
    spare: bool = False
    """Nothing else runs or waits beside the batch: a stream's first sentence may be cut for
    first audio even when short (`run_pieces`), since the cut's extra work delays no one."""


@dataclass
class Outcome:
    """What the device work of a plan gave; device seconds, monotonic clock."""

    seconds: float = 0.0
    error: BaseException | None = None  # the whole stage or batch failed
    outputs: list = field(default_factory=list)  # a stage's output per input; a batch's Piece per item
    steps: list[tuple[StepRunner, list[str], list[StepResult], BaseException | None, float]] = field(default_factory=list)


class BatchObserver:
    """Told about the device work as it runs (the server's metrics)."""

    def on_batch(self, voice: str, size: int, cost: int, seconds: float, audio_seconds: float, finished: int) -> None:
        """One one-shot batch of `voice` ran: `size` units, `finished` of them the end of their
        sentence (a sentence cut in pieces counts once, with its last piece)."""

    def on_step(self, voice: str, active: int, finished: int, seconds: float, audio_seconds: float) -> None:
        """One step of a step voice ran (its share of the step's seconds and audio)."""


class WorkerHost(ABC):
    """What a device's worker reads and calls of the engine that owns it (`Engine` is the one
    host): declared here so that the worker depends on this seam, not on the engine that builds
    it. The methods are called with the request's device lock held."""

    voices: Mapping[str, VoiceContract]
    observer: BatchObserver | None

    @abstractmethod
    def _emit(self, r: RequestState, index: int, audio: np.ndarray, text: str, *, partial: bool = False,
              sentence_start: bool = True, words: tuple = ()) -> bool:
        """Deliver a sentence's (or piece's) audio to the request's output path; False: the
        request failed there and was told so."""

    @abstractmethod
    def _fail(self, r: RequestState, error: BaseException) -> None:
        """End the request with `error` (its queued work dropped)."""

    @abstractmethod
    def _count(self, sentences: int = 0, batches: int = 0) -> None:
        """Add to the engine's work counters."""

    @abstractmethod
    def _needs_frontend(self, r: RequestState) -> bool:
        """Whether the request's front end should produce more sentences now."""

    @abstractmethod
    def _start_frontend(self, r: RequestState) -> None:
        """Have the request's front end produce its next sentences (off the device's thread)."""


class DeviceWorker:
    """One device: its accepted requests (it alone owns them, under its `cond`), its scheduler,
    the admission accounting fed by what it runs, and the step."""

    def __init__(self, engine: WorkerHost, device: str, voices: Sequence[str], ids: Iterator[int],
                 scheduler: SchedulerConfig, max_queue_wait_s: float, lanes: int = 1):
        self.engine = engine
        self.device = device
        self.voices = list(voices)
        self.ids = ids  # this device's request ids (the engine finds a request's worker by its id)
        self.requests: dict[int, RequestState] = {}
        self.time = DeviceTime()  # predicted device seconds: the scheduler's and admission's unit
        self.scheduler = Scheduler(scheduler, self.time)
        self.cond = threading.Condition()
        self.lanes = max(1, lanes)
        # each voice's cost per character and the time test, in the same device seconds
        self.admission = DeviceAdmission(self.time, max_queue_wait_s, self.lanes)
        self.running_cost: dict[str, int] = {}  # cost of the work in flight, per voice
        self.running_batch = 0  # items in the work in flight
        self._busy_from = 0.0  # when the device last went from idle to busy (monotonic)
        self._last_done = 0.0  # when its last work ended
        self._alone = False  # the work in flight started on an idle device and nothing joined it
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
        self.stage_queue: deque[tuple[RequestState, Unit]] = deque()  # (request, unit) in arrival order
        self._stage_busy = False

    # ================================================================ schedule (lock held)
    def schedule(self, now: float, picks: Sequence[Pick]) -> Plan | None:
        """The next step's work, or None if none is due. `picks`: what the executor may take
        now, tried in order (the serial one: `ANY`; a CPU lane: its class, then fallbacks)."""
        stage = self._take_stage()
        if stage is not None:
            return Plan(stage=stage)
        if self._step_turn():  # a step of the running sequences, newcomers joining first
            return self._step_plan(self.scheduler.schedule(now, NOW, room=self._room(joins_only=True)))
        batch, room = None, self._room()
        for pick in picks:
            batch = self.scheduler.schedule(now, pick, room)
            if batch is not None:
                break
        if batch is not None and batch.voice in self.steppers:
            return self._step_plan(batch)
        if batch is not None:
            spare = self.running_batch == 0 and not self.stage_queue and self.scheduler.waiting_requests() == 0
            self._started(batch)
            return Plan(batch=batch, spare=spare)
        if self._stepping():
            return self._step_plan(None)
        return None

    def _step_plan(self, joins: Batch | None) -> Plan:
        plan = Plan(joined=joins)
        for key, q in self._seqs.items():  # cancelled requests' sequences leave first
            r = self.requests.get(q.item.request_id)
            if r is None or r.finished:
                plan.leaves.append((self.steppers[q.voice], key))
        for _, key in plan.leaves:
            self._seq_done(key, ok=False)
        if joins is not None:
            self._started(joins)
            runner = self.steppers[joins.voice]
            for it in joins.items:
                key = (it.request_id, it.index, next(self._seq_ids))
                self._seqs[key] = _Sequence(joins.voice, it)
                plan.joins.append((runner, key, it.payload))
        groups: dict[int, tuple[StepRunner, list[str]]] = {}
        for voice, runner in self.steppers.items():
            groups.setdefault(id(runner), (runner, []))[1].append(voice)
        plan.step = list(groups.values())
        return plan

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

    def _take_stage(self) -> tuple[SharedComponent, list] | None:
        """The next batch of a shared component's work, in arrival order across requests and
        voices; None if there is none or another lane runs one."""
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

    # ================================================================ execute (no lock)
    def execute(self, plan: Plan) -> Outcome:
        """The plan's device work on the calling thread. A model failure is caught and travels
        in the outcome (it fails the requests concerned, not the worker)."""
        if plan.stage is not None:
            return self._execute_stage(*plan.stage)
        if plan.batch is not None:
            return self._execute_batch(plan.batch, plan.spare)
        out = Outcome()
        for runner, key in plan.leaves:
            runner.leave(key)
        for runner, key, unit in plan.joins:
            runner.join(key, unit)
        for runner, voices in plan.step:
            if not runner.active:
                continue
            t0 = time.perf_counter()
            error, results = None, []
            try:
                results = runner.step()
            except Exception as e:  # the runner's failure fails its sequences, not the worker
                log.exception("step of %s failed", "/".join(voices))
                error = e
            out.steps.append((runner, voices, results, error, time.perf_counter() - t0))
        return out

    def _execute_stage(self, comp: SharedComponent, taken: list) -> Outcome:
        t0 = time.perf_counter()
        try:  # one batch of every waiting request's and voice's inputs; outputs stay on the device
            outs = list(comp.run([u.component_input for _, u in taken]))
            if len(outs) != len(taken):
                raise RuntimeError(f"shared component {comp.key!r} gave {len(outs)} outputs for {len(taken)} inputs")
        except Exception as e:
            log.exception("shared component %r failed on %d inputs", comp.key, len(taken))
            return Outcome(time.perf_counter() - t0, e)
        return Outcome(time.perf_counter() - t0, outputs=outs)

    def _execute_batch(self, batch: Batch, spare: bool = False) -> Outcome:
        voice = self.engine.voices[batch.voice]
        t0 = time.perf_counter()
        try:  # long items come back cut, with a rest to queue again
            pieces = voice.run_pieces([it.payload for it in batch.items], early=batch.early,
                                      max_cost=self.scheduler.config.max_batch_phonemes, spare=spare)
        except Exception as e:  # a model failure fails the batch's requests, not the worker
            log.exception("batch of %d sentences failed", len(batch))
            return Outcome(time.perf_counter() - t0, e)
        return Outcome(time.perf_counter() - t0, outputs=list(pieces))

    # ================================================================ update
    def update(self, plan: Plan, outcome: Outcome) -> None:
        """Apply a plan's outcome: time and work to the scheduler and admission, audio and
        failures to the requests. Takes the lock; resumes paused front ends after it."""
        resume: list[RequestState] = []
        with self.cond:
            if plan.stage is not None:
                self._update_stage(plan.stage[1], outcome)
            elif plan.batch is not None:
                self._update_batch(plan.batch, outcome, resume)
            else:
                for runner, voices, results, error, dt in outcome.steps:
                    self._update_step(runner, voices, results, error, dt, resume)
            self.cond.notify_all()
        for r in resume:
            self.engine._start_frontend(r)

    def _update_stage(self, taken: list, outcome: Outcome) -> None:
        eng = self.engine
        self._stage_busy = False
        now = time.monotonic()
        for k, (r, u) in enumerate(taken):
            r.staged -= 1
            self.scheduler.charge(r.voice, outcome.seconds / len(taken))  # each voice pays its share
            if r.finished:
                continue
            if outcome.error is not None:
                eng._fail(r, outcome.error)
                continue
            try:
                unit = eng.voices[r.voice].with_component_output(u, outcome.outputs[k])
            except Exception as e:
                eng._fail(r, e)
                continue
            self.scheduler.add_item(r.id, unit.index, unit.cost, unit, now)

    def _update_batch(self, batch: Batch, outcome: Outcome, resume: list) -> None:
        eng, dt, error, pieces = self.engine, outcome.seconds, outcome.error, outcome.outputs
        if error is None:
            audio_s = sum(len(a) for a, _ in pieces) / eng.voices[batch.voice].sample_rate
            finished = sum(rest is None for _, rest in pieces)
            eng._count(sentences=finished, batches=1)
            if eng.observer is not None:
                eng.observer.on_batch(batch.voice, len(batch), batch.cost, dt, audio_s, finished)
        self.scheduler.complete(batch, dt)  # the voice's device time: voices share the device fairly
        # the work done: a cut item's rest is queued again and counted when it runs
        done = None if error is not None else batch.cost - sum(rest.cost for _, rest in pieces if rest is not None)
        # a piece of a cut sentence costs its share of the ids but not of the time (the encoder
        # ran once for all of it, the cut adds context): it says nothing of the work's own speed
        whole = error is None and not any(it.continues for it in batch.items) and all(rest is None for _, rest in pieces)
        self._ended(batch, done, whole)
        for k, it in enumerate(batch.items):
            r = self.requests.get(it.request_id)
            if r is None or r.finished:
                continue  # cancelled while running: its audio goes nowhere
            if error is not None:
                eng._fail(r, error)
                continue
            audio, rest = pieces[k]
            failed = piece_error(pieces[k])
            if failed is not None:  # this sentence alone failed (over its limit)
                eng._fail(r, failed)
                continue
            if rest is not None and any(x.request_id == it.request_id for x in batch.items[k + 1 :]):
                # the scheduler keeps cuttable items apart from their successors
                log.error("a cut item shared its batch with a later item of its request")
                eng._fail(r, RuntimeError("internal error"))
                continue
            if not eng._emit(r, it.index, audio, "" if it.continues else it.payload.text, partial=rest is not None,
                             sentence_start=not it.continues, words=piece_words(pieces[k])):
                continue
            if rest is not None:  # a piece: the rest goes back to the front of its queue
                self.scheduler.requeue(it.request_id, it.index, rest.cost, rest, time.monotonic())
        for rid in {it.request_id for it in batch.items}:
            self._maybe_resume(rid, resume)

    def _update_step(self, runner: StepRunner, voices: list[str], results: list[StepResult],
                     error: BaseException | None, dt: float, resume: list) -> None:
        eng = self.engine
        mine = [k for k, q in self._seqs.items() if q.voice in voices]
        if not mine:
            return
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
                r = self.requests.get(self._seqs[k].item.request_id)
                self._seq_done(k, ok=False)
                if r is not None:
                    eng._fail(r, error)
            return
        for res in results:
            if res.key in owner:
                self._step_result(runner, res, resume)
        if eng.observer is not None:
            for voice, n in counts.items():
                if not n:
                    continue
                own = [x for x in results if owner.get(x.key) == voice]
                audio_s = sum(len(x.audio) for x in own if x.audio is not None) / eng.voices[voice].sample_rate
                eng.observer.on_step(voice, n, sum(1 for x in own if x.final and x.error is None), dt * n / len(mine), audio_s)

    def _step_result(self, runner: StepRunner, res: StepResult, resume: list) -> None:
        eng = self.engine
        q = self._seqs[res.key]
        done = res.final or res.error is not None
        r = self.requests.get(q.item.request_id)
        if done:
            self._seq_done(res.key, ok=res.error is None)
            if res.error is None:
                eng._count(sentences=1)
        if r is None or r.finished:
            if not done:
                runner.leave(res.key)
                self._seq_done(res.key, ok=False)
            return
        if res.error is not None:
            eng._fail(r, res.error)
            return
        audio = res.audio if res.audio is not None else np.zeros(0, dtype=np.float32)
        if not len(audio) and not done:
            return
        start = not q.started and not q.item.continues
        q.started = True
        if not eng._emit(r, q.item.index, audio, q.item.payload.text if start else "",
                         partial=not done, sentence_start=start):
            if not done:
                runner.leave(res.key)
                self._seq_done(res.key, ok=False)
            return
        if done:
            self._maybe_resume(r.id, resume)

    def _seq_done(self, key: tuple, ok: bool) -> None:
        q = self._seqs.pop(key, None)
        if q is None:
            return
        self.scheduler.complete(Batch(q.voice, [q.item]))
        self.running_batch -= 1
        self.running_cost[q.voice] = self.running_cost.get(q.voice, 0) - q.item.cost
        if ok and q.seconds > 0:
            self.time.observe(q.voice, q.item.cost, q.seconds)
        self._last_done = time.monotonic()

    def _maybe_resume(self, rid: int, resume: list) -> None:
        r = self.requests.get(rid)
        if r is not None and self.engine._needs_frontend(r):
            r.frontend_running = True
            resume.append(r)

    def release(self, plan: Plan) -> None:
        """A plan whose update failed (an internal error): its requests fail, the device goes on
        (lock held)."""
        self._stage_busy = False if plan.stage is not None else self._stage_busy
        rids = set()
        if plan.batch is not None:
            rids = {it.request_id for it in plan.batch.items}
        elif plan.stage is not None:
            rids = {r.id for r, _ in plan.stage[1]}
        for rid in rids:
            r = self.requests.get(rid)
            if r is not None:
                self.engine._fail(r, RuntimeError("internal error"))

    # ================================================================ accounting (lock held)
    def _started(self, batch: Batch) -> None:
        self._alone = self.running_batch == 0
        if self._alone:
            self._busy_from = time.monotonic()
        self.running_batch += len(batch)
        self.running_cost[batch.voice] = self.running_cost.get(batch.voice, 0) + batch.cost

    def _ended(self, batch: Batch, done_cost: int | None, whole: bool) -> None:
        """A batch is over; done_cost: the work it did (None: it failed, no measurement). Its
        device seconds are the busy time since the previous batch ended (or the device went
        busy), so with several lanes overlapping batches are not counted twice; a batch of whole
        sentences that had the device to itself also times the work's own speed
        (`DeviceTime.seconds`)."""
        self.running_batch -= len(batch)
        self.running_cost[batch.voice] = self.running_cost.get(batch.voice, 0) - batch.cost
        t = time.monotonic()
        if done_cost:
            alone = whole and self._alone and self.running_batch == 0
            self.time.observe(batch.voice, done_cost, t - max(self._last_done, self._busy_from), alone)
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
        """This device's accepted requests as admission sees them: the work each has left in the
        scheduler's unit (predicted device seconds) and its deadline."""
        out = {}
        for r in self.requests.values():
            if not r.finished:
                left = self.scheduler.pending_cost(r.id)
                if r.total is None:
                    left += max(0.0, r.est_cost - r.produced_cost)
                out[r.id] = Accepted(self.time.under_load_s(r.voice, left), r.live_deadline(now))
        return out

    # ================================================================ by hand
    def step(self, now: float | None = None, force: bool = True) -> Batch | None:
        """One schedule -> execute -> update on the calling thread (tests, or a caller without
        the executor's threads). Returns the batch that ran (for a step, the joiners, possibly
        none; for a stage, an empty batch of the component's key), or None when there was
        nothing to do."""
        with self.cond:
            plan = self.schedule(time.monotonic() if now is None else now, (NOW if force else ANY,))
        if plan is None:
            return None
        self.update(plan, self.execute(plan))
        if plan.stage is not None:
            return Batch(plan.stage[0].key, [])
        if plan.batch is not None:
            return plan.batch
        return plan.joined or Batch(next(iter(self.steppers)), [])
