"""The serving engine: requests in, sentences batched across requests, audio out per request.

Threads:
* per device, a worker (engine/worker.py) whose step is schedule -> execute -> update, driven
  by its executor's threads (engine/executors.py: one serial thread, or CPU lanes), the only
  threads that call the device's models;
* a small pool for the text front end (`voice.units`: split, normalise, phonemise; espeak-ng),
  which feeds each request's sentences into the scheduler a few at a time (a lookahead window),
  so a 1,000-sentence text is not phonemised ahead of need and a cancelled one stops early.
Callers (the asyncio side, tests) talk to it through `submit` / `cancel` and a `Sink` per
request whose methods are called from those threads. The library (`voxserve.voice.Voice`:
`synthesize`, `stream`, `synthesize_batch`) drives an engine of its own from its callers'
threads instead of executor threads (`add`, `drive`), as vLLM's `LLM` steps its engine core in
the caller's process: the same scheduler, steps and output path. `submit` admits by time: it
refuses a request (OverloadedError) whose wait, or the delay it would cause accepted ones, passes
`EngineConfig.max_queue_wait_s` at the device's observed speed.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import EngineClosedError, UnknownVoiceError
from ..options import SynthesisOptions
from ..runtime.allocator import MemoryRelease
from ..runtime.cpu import in_passing_thread, intra_op_threads, release_openmp_threads, thread_teams
from ..contract import AudioBudget, VoiceContract
from .admission import check_memory
from .executors import CpuExecutor, CpuLanes, Executor, SerialExecutor
from .output import RequestOutput, Sink
from .scheduler import Batch, Pick, SchedulerConfig
from .worker import BatchObserver, DeviceWorker, RequestState, WorkerHost
from .unload import VoiceLoads

log = logging.getLogger(__name__)

# A started engine gives its allocator's free pages back at the end of every period of this
# length in which it served (runtime/allocator.py, MemoryRelease): the first batch after each
# release faults its pages in again, so that cost comes once a minute, not once a batch.
RELEASE_PERIOD_S = 60.0


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    frontend_lookahead: int = 16
    """Sentences a request may have queued before its front end pauses."""
    frontend_threads: int = 2
    """Threads for the text front end (espeak-ng itself runs one call at a time)."""
    executor: str = "auto"
    """How a CPU device runs its batches: "auto" runs lanes (two batches at once, each on its
    share of the threads, with urgent lanes and spill: engine/executors.py) on a CPU with at least 2
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


class _WarmupSink(Sink):
    """The warm-up sentence's sink: drops the audio, keeps the end."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None

    def on_done(self, n_sentences: int) -> None:
        self.done.set()

    def on_error(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class Engine(WorkerHost):
    """Voices by name; one worker per device. Thread safe."""

    def __init__(self, voices: Mapping[str, VoiceContract] | Sequence[VoiceContract], config: EngineConfig | None = None,
                 observer: BatchObserver | None = None, cpu: CpuLanes | None = None):
        """`cpu`: how the CPU executor runs where a CPU device uses it (the default: the
        product's lanes on this process's threads; tests pass their own)."""
        self.config = (config or EngineConfig()).validate()
        if not isinstance(voices, Mapping):
            voices = {v.name: v for v in voices}
        if not voices:
            raise ValueError("an engine needs at least one voice")
        for name, v in voices.items():
            if not isinstance(v, VoiceContract):
                raise TypeError(f"voice {name!r} is a {type(v).__name__}, not a voxserve.voice.Voice (VoiceContract)")
        self.voices: dict[str, VoiceContract] = dict(voices)
        self.observer = observer
        self._cpu = cpu or CpuLanes()
        self._workers: dict[str, DeviceWorker] = {}
        self._worker_of: dict[str, DeviceWorker] = {}
        self._executors: dict[str, Executor] = {}
        on: dict[str, list[str]] = {}
        for name, v in self.voices.items():
            on.setdefault(str(v.device), []).append(name)
        for k, (dev, names) in enumerate(on.items()):
            # request ids k+1, k+1+n, ...: a request's id names its worker, the only owner of
            # its state (no index of requests is shared across devices)
            w = self._workers[dev] = DeviceWorker(self, dev, names, itertools.count(k + 1, len(on)),
                                                 self.config.scheduler, self.config.max_queue_wait_s)
            ex = self._executors[dev] = self._executor_for(w, [self.voices[n] for n in names])
            w.lanes = w.admission.lanes = ex.lanes
            for name in names:
                self._worker_of[name] = self._workers[dev]
        self._worker_list = list(self._workers.values())
        self._frontend = ThreadPoolExecutor(self.config.frontend_threads, thread_name_prefix="voxserve-frontend")
        self._accepting = False
        self._stopping_now = False
        self._started = False
        self._memory_release: MemoryRelease | None = None
        self.sentences_run = 0  # sentences synthesised (only ever grows)
        self.batches_run = 0
        self.sentences_dropped = 0  # queued sentences dropped by cancellation
        self._stats_lock = threading.Lock()
        self.loads = VoiceLoads()  # idle unload (engine/unload.py): a request's voice is loaded before its units
        self._submitted = dict.fromkeys(self.voices, 0)  # requests accepted per voice (only ever grows)
        self._driving: set[str] = set()  # devices whose step a caller's thread runs now (`drive`)

    def _executor_for(self, w: DeviceWorker, voices: list[VoiceContract]) -> Executor:
        """Serial, or CPU lanes where they may run: a CPU with several intra-op threads that
        each take a team of their own, and voices that allow two batches at once."""
        stopping = lambda: self._stopping_now  # noqa: E731
        if (self.config.executor == "serial" or not w.device.startswith("cpu")
                or any(v.step_runner() is not None for v in voices)  # (a step runner is called from one thread)
                or not all(v.concurrent_runs for v in voices)):
            return SerialExecutor(w, stopping)
        cpu = self._cpu
        threads = cpu.threads if cpu.threads is not None else intra_op_threads()
        teams = cpu.teams if cpu.teams is not None else thread_teams()
        if not teams or min(cpu.lanes, threads) < 2:  # without per-thread teams, lanes would oversubscribe the cores
            return SerialExecutor(w, stopping)
        return CpuExecutor(w, stopping, replace(cpu, lanes=min(cpu.lanes, threads)), threads)

    def warm_voice(self, name: str) -> None:
        """Run a voice's own warm-up (`Voice.warmup`: CPU per-shape kernels, CUDA graphs) on
        the calling thread as its device's executor will run its work (CPU lanes: once per
        OpenMP team size they use). Call before traffic: it uses the model from this thread."""
        self._executors[self.device_of(name)].warm(self.voice(name).warmup)

    def warm_up(self, names: Sequence[str] | None = None, timeout_s: float = 300.0) -> list[str]:
        """The one warm-up (HTTP and Wyoming servers call it before they report ready): per
        voice, its own warm-up (`warm_voice`, on a thread that ends with it: runtime/cpu.py,
        `in_passing_thread`), then one sentence through this engine, so that a first request
        is as fast as the next and admission has a speed to go by. Blocks; call it on a thread
        of its own, after `start()` and before traffic. A failed warm-up is logged (it leaves
        a slower first request, not a dead server). Returns the voices warmed to the end."""
        warmed = []
        for name in self.voices if names is None else names:
            try:
                in_passing_thread(self.warm_voice, name)
                sink = _WarmupSink()
                self.submit(name, "Hello.", None, sink)
                if not sink.done.wait(timeout_s):
                    log.warning("warm-up of voice %s: no answer in %g s; its first request may be slow", name, timeout_s)
                elif sink.error is not None:
                    log.warning("warm-up of voice %s failed (%s); its first request may be slow", name, sink.error)
                else:
                    warmed.append(name)
            except Exception:
                log.exception("warm-up of voice %s failed", name)
        return warmed

    def device_of(self, voice_name: str) -> str:
        """The device whose worker runs the voice."""
        self.voice(voice_name)  # UnknownVoiceError
        return self._worker_of[voice_name].device

    @property
    def lanes(self) -> dict[str, int]:
        """Lanes per device (batches each runs at once)."""
        return {dev: ex.lanes for dev, ex in self._executors.items()}

    @property
    def urgent_lanes(self) -> dict[str, bool]:
        """Whether each device has urgent lanes (it does when it has lanes)."""
        return {dev: isinstance(ex, CpuExecutor) for dev, ex in self._executors.items()}

    # ------------------------------------------------------------------ lifecycle
    def start(self, threads: bool = True) -> "Engine":
        """Accept requests; threads=False runs no worker threads (drive it with `step()`)."""
        if threads and not self._started:
            self._started = True
            # the caller (usually the thread that loaded and warmed the voices) gives up its
            # OpenMP team, so the worker's is the only one and keeps spinning between ops
            release_openmp_threads()
            for ex in self._executors.values():
                ex.start()
            self._memory_release = MemoryRelease(RELEASE_PERIOD_S)
            self._mark_activity()
        self._accepting = True
        return self

    def _mark_activity(self) -> None:
        if self._memory_release is not None:
            self._memory_release.busy(self.in_flight > 0)

    def stop_accepting(self) -> None:
        self._accepting = False

    def drain(self, timeout: float) -> bool:
        """Wait (up to timeout seconds) for every accepted request to finish. True if they did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.in_flight:
                return True
            time.sleep(0.02)
        return not self.in_flight

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
        for ex in self._executors.values():
            ex.join(max(1.0, timeout))
        self._frontend.shutdown(wait=False, cancel_futures=True)
        if self._memory_release is not None:
            self._memory_release.stop()
        return finished

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ requests
    def voice(self, name: str) -> VoiceContract:
        try:
            return self.voices[name]
        except KeyError:
            raise UnknownVoiceError(name, sorted(self.voices)) from None

    def queued_sentences(self) -> int:
        return sum(w.scheduler.queued for w in self._workers.values())

    @property
    def in_flight(self) -> int:
        return sum(len(w.requests) for w in self._worker_list)  # (each len is one atomic read)

    def submit(self, voice_name: str, text: str, options: SynthesisOptions | None, sink: Sink,
               streaming: bool = False) -> int:
        """Accept a request; raises at once for bad input (EmptyTextError, InvalidOptionError,
        UnknownSpeakerError, UnknownVoiceError), OverloadedError or EngineClosedError.
        Results arrive through `sink`. Returns the request id (for `cancel`). The voice's
        front end validates on the calling thread (for an event loop: `accept`)."""
        units = self.voice(voice_name).units(text, options)  # validates now; the sentences come lazily
        return self._admit(voice_name, text, options, sink, streaming, units)

    def accept(self, voice_name: str, text: str, options: SynthesisOptions | None, sink: Sink,
               streaming: bool = False) -> int:
        """As `submit`, but none of the request's front end runs on the calling thread (an
        event loop's: SSML parsing and normalisation of a long text take long): bad input
        fails the request through `sink.on_error`. Raises at once only UnknownVoiceError,
        OverloadedError and EngineClosedError."""
        return self._admit(voice_name, text, options, sink, streaming, None)

    def add(self, voice_name: str, text: str, options: SynthesisOptions | None, sink: Sink,
            streaming: bool = False, units: Iterator | None = None) -> int:
        """A request of a caller that waits for its own answer and drives the engine itself
        (the library: `drive`), as `submit` (`units`: the voice's `units(text, options)` if
        the caller has already validated), but never refused by admission: a library caller's
        own calls are its queue, and the engine's front-end window bounds what it holds."""
        if units is None:
            units = self.voice(voice_name).units(text, options)
        return self._admit(voice_name, text, options, sink, streaming, units, admit=False)

    def _admit(self, voice_name: str, text: str, options: SynthesisOptions | None, sink: Sink,
               streaming: bool, units: Iterator | None, admit: bool = True) -> int:
        if not self._accepting:
            raise EngineClosedError("the engine is not accepting requests (starting or shutting down)")
        voice = self.voice(voice_name)
        w = self._worker_of[voice_name]
        with w.cond:
            # the front end runs later: the request's own cost is predicted from its length
            est = len(text) * w.admission.cost_per_char(voice_name)
            now = time.monotonic()
            deadline = float("inf")
            if admit:
                waiting = sum(1 for r in w.requests.values() if r.produced == 0)
                check_memory(w.scheduler.queued, waiting, w.scheduler.config.max_queued_sentences, w.wait_estimate)
                deadline = w.admission.check(voice_name, est, now, w.accepted(now), w.running_cost)
            rid = next(w.ids)
            w.scheduler.add_request(rid, voice_name, streaming=streaming)
            out = RequestOutput(sink, AudioBudget(voice.limits, voice.sample_rate, voice.silence_after(options)))
            r = RequestState(rid, voice_name, units, out, w, text=text, options=options, frontend_running=True,
                              chars=len(text), est_cost=est, deadline=deadline, starved_since=now)
            w.requests[rid] = r
            self._submitted[voice_name] += 1
            self._mark_activity()
        self._start_frontend(r)
        return rid

    def voice_activity(self) -> dict[str, tuple[int, int]]:
        """Per voice: (its requests in flight, its requests accepted so far), for idle unload."""
        out = {}
        for w in self._workers.values():
            with w.cond:  # (submit counts under it)
                busy = dict.fromkeys(w.voices, 0)
                for r in w.requests.values():
                    busy[r.voice] += 1
                out.update({v: (n, self._submitted[v]) for v, n in busy.items()})
        return out

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
        if not isinstance(request_id, int) or request_id < 1:
            return
        w = self._worker_list[(request_id - 1) % len(self._worker_list)]  # its owner (see __init__)
        with w.cond:
            r = w.requests.get(request_id)
            if r is None or r.finished:
                return
            self._forget(r)
            self.sentences_dropped += w.scheduler.cancel(request_id)
            w.cond.notify_all()

    def leave_ended(self, voice_name: str) -> None:
        """For an engine driven by its callers (`drive`), after `cancel`: the sequences of
        requests that ended leave their step runners now (their caches freed), as the next
        step's plan would take them out; nothing if a caller runs a step of the device now
        (its plan does it). An engine with executor threads needs none of this."""
        w = self._worker_of[voice_name]
        with w.cond:
            if not w.steppers or w.device in self._driving:
                return
            plan = w._step_plan(None)  # the leaves, and a step that is not taken here
            if not plan.leaves:
                return
            plan.step = []
            self._driving.add(w.device)
        try:
            w.update(plan, w.execute(plan))
        finally:
            with w.cond:
                self._driving.discard(w.device)
                w.cond.notify_all()

    # ------------------------------------------------------------------ front end
    def _needs_frontend(self, r: RequestState) -> bool:
        return (not r.finished and r.total is None and not r.frontend_running
                and self._pending(r) < self.config.frontend_lookahead)

    @staticmethod
    def _pending(r: RequestState) -> int:
        """Sentences of a request produced and not yet run (queued, or in a shared stage)."""
        return r.worker.scheduler.pending_items(r.id) + r.staged

    def _start_frontend(self, r: RequestState) -> None:
        try:
            self._frontend.submit(self._frontend_job, r)
        except RuntimeError:  # the pool is shut down: the engine is stopping
            with r.worker.cond:
                self._fail(r, EngineClosedError("the server is shutting down"))

    def _frontend_job(self, r: RequestState) -> None:
        """Produce up to the lookahead window of sentences for one request, then yield the
        thread (so a long text does not hold a front-end thread while others wait)."""
        w = r.worker
        budget = self.config.frontend_lookahead
        try:
            if r.produced == 0:
                self.loads.ensure(self.voices[r.voice])  # unloaded while idle: this request waits for the load
            if r.units is None:  # `accept`: the voice's front end validates and starts here
                r.units = self.voice(r.voice).units(r.text, r.options)
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
                        if r.finished:
                            return
                        r.total = r.produced
                        w.admission.learn_cost_per_char(r.voice, r.chars, r.produced_cost)
                        w.scheduler.input_done(r.id)
                        r.frontend_running = False
                        try:
                            r.out.total(r.total)
                        except Exception as e:  # its sink raised: the request fails (Sink's rule)
                            self._fail(r, e)
                            return
                        self._maybe_finish(r)
                        w.cond.notify_all()
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
                    r.out.expect(unit.index)
                    r.produced += 1
                    r.produced_cost += max(int(unit.cost), 1)
                    w.cond.notify_all()
        except Exception as e:  # UnpronounceableTextError, or a front-end failure
            with w.cond:
                self._fail(r, e)
                w.cond.notify_all()
            return
        with w.cond:  # budget used up: queue another round behind other requests' work
            if r.finished:
                return
        self._start_frontend(r)

    # ------------------------------------------------------------------ completion (lock held)
    def _emit(self, r: RequestState, index: int, audio: np.ndarray, text: str, *, partial: bool = False,
              sentence_start: bool = True, words: tuple = ()) -> bool:
        """The one way results reach a request (lock held): its audio, in order, through its
        budget to its sink; then its end if that was its last sentence. False: the request
        failed here (over its audio limit, or its sink raised) and was told so at once."""
        try:
            r.out.put(index, audio, text, partial=partial, sentence_start=sentence_start, words=words)
        except Exception as e:
            self._fail(r, e)
            return False
        if not partial:
            self._maybe_finish(r)
        return True

    def _maybe_finish(self, r: RequestState) -> None:
        if not r.finished and r.total is not None and r.out.delivered >= r.total:
            self._forget(r)
            r.worker.scheduler.finish_request(r.id)
            r.out.finish(r.total)

    def _fail(self, r: RequestState, error: BaseException) -> None:
        if r.finished:
            return
        self._forget(r)
        self.sentences_dropped += r.worker.scheduler.cancel(r.id)
        r.out.fail(error)

    def _forget(self, r: RequestState) -> None:
        r.finished = True
        r.worker.requests.pop(r.id, None)
        self._mark_activity()

    def _count(self, sentences: int = 0, batches: int = 0) -> None:
        with self._stats_lock:
            self.sentences_run += sentences
            self.batches_run += batches

    # ------------------------------------------------------------------ driven by its callers
    def condition(self, voice_name: str) -> threading.Condition:
        """The lock of the voice's device, under which its requests' sinks are called (a sink
        that `drive`'s `until` reads notifies it)."""
        self.voice(voice_name)  # UnknownVoiceError
        return self._worker_of[voice_name].cond

    def drive(self, voice_name: str, until: Callable[[], bool]) -> None:
        """Run the steps of the voice's device on the calling thread until `until()` holds
        (checked under the device's lock; something that makes it true must notify the lock's
        condition, as a request's sink calls and the front end do): an engine driven by its
        callers' threads (the library), each step as the device's executor runs one (its
        batches as one of its threads takes them), due work whoever's it is. Several threads
        may drive one engine: one runs a step at a time (a model or a step runner is called
        from one thread at a time), the others wait for their results or their turn. Raises
        EngineClosedError once the engine shuts down."""
        w = self._worker_of[voice_name]
        ex = self._executors[w.device]
        # the batches the device's executor takes, for one thread: the CPU executor's lane size
        # (one sentence: on a CPU a batch costs about the sum of its sentences), else the serial one's
        size = ex.settings.batch if isinstance(ex, CpuExecutor) else None
        pick = Pick(items=size)
        while True:
            with w.cond:
                plan = None
                while plan is None:
                    if until():
                        return
                    if self._stopping_now or not self._accepting:
                        raise EngineClosedError("the engine is shut down")
                    if w.device in self._driving:  # another caller runs a step: its end notifies
                        w.cond.wait()
                        continue
                    now = time.monotonic()
                    plan = w.schedule(now, (pick,))
                    if plan is None:  # nothing due yet: the front end's next sentence notifies
                        w.cond.wait(w.scheduler.next_deadline(now, pick))
                self._driving.add(w.device)
            try:
                w.update(plan, w.execute(plan))
            except BaseException as e:  # a bug in delivery, or the caller interrupted (Ctrl-C):
                if isinstance(e, Exception):  # the plan's requests fail, the engine goes on
                    log.exception("internal error while running a step")
                with w.cond:
                    w.release(plan)
                if not isinstance(e, Exception):
                    raise
            finally:
                with w.cond:
                    self._driving.discard(w.device)
                    w.cond.notify_all()

    # ------------------------------------------------------------------ stepping by hand
    def step(self) -> Batch | None:
        """One schedule -> execute -> update on this thread (`DeviceWorker.step`), for engines
        not `start`ed with executor threads (tests, scripts, the library). Runs the first due
        work of any device; returns its batch (None: nothing to do)."""
        for w in self._worker_list:
            b = w.step()
            if b is not None:
                return b
        return None
