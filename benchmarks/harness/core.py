"""Run the benchmark: settings -> arms x tasks -> timed rounds -> memory -> JSON result."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from voxserve import SynthesisOptions, load_voice, resolve_voice
from voxserve.families.piper.cache import file_sha256

from .arms import (
    ENGINES,
    FAILED,
    OK,
    SKIPPED,
    UNAVAILABLE,
    ArmSpec,
    arms_for,
    availability,
    build_pool,
    make_arm,
    quick_skip,
)
from .corpus import load_corpus, pool_texts, stream_selection
from .machine import load_average, machine_info
from .measure import Task, execute, memory_entry, prepare, probe_request, run_probe
from .suites import SUITES, Context, Results, checkout_suites, cuda_memory, find_suite

log = logging.getLogger("harness")
SCHEMA = "voxserve.bench/1"


@dataclass(frozen=True)
class BenchSettings:
    voice: str | None = None
    """Voice name or path (default: the default voice)."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto' (CUDA when present)."""
    corpus: str | None = None
    """JSON-lines or plain-text corpus (default: the repository's corpus/en_bench.jsonl)."""
    runs: int = 5
    """Timed rounds per task; figures are their median."""
    warmup: int = 1
    """Untimed rounds first."""
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Sentence counts of the sequential-vs-batched suite."""
    batches: tuple[int, ...] = (1, 8)
    """Batch sizes of the configurations suite."""
    categories: tuple[str, ...] = ("short", "medium", "long")
    """Corpus categories of the time-to-first-audio suite."""
    texts_per_category: int = 1
    """Texts per category (sorted by length: the median one; n: spread over the lengths)."""
    suites: tuple[str, ...] = ("batching", "configs", "stream")
    configs: tuple[str, ...] = ()
    """Arm names to run (references are always added); () = the device's whole table."""
    quick: bool = False
    memory: bool = True
    """Measure peak memory (CPU: one child process per arm and workload)."""
    memory_largest_only: bool = False
    """Peak memory only of the largest workload of each suite (--quick: fewer child processes)."""
    seed: int = 1234
    """Base of the noise seeds: every run draws new noise (new durations, as in real use),
    reproducibly from this seed."""
    max_minutes: float | None = None
    """Stop measuring after this long (a running configuration is interrupted); what was
    measured is kept, what was cut is reported."""
    jobs: int = 0
    """Memory probes run at once (0: half the CPUs, 2 to 4)."""

    def validate(self) -> BenchSettings:
        if self.runs < 1 or self.warmup < 0:
            raise ValueError("runs must be >= 1 and warmup >= 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if not self.sizes or min(self.sizes) < 1 or not self.batches or min(self.batches) < 1:
            raise ValueError("sizes and batches must be positive")
        unknown = [s for s in self.suites if find_suite(s) is None]
        if unknown:
            raise ValueError(f"unknown suite(s) {unknown}; known: {sorted(set(SUITES) | set(checkout_suites()))}")
        if self.texts_per_category < 1:
            raise ValueError("texts_per_category must be >= 1")
        return self


QUICK = dict(
    sizes=(2, 8),
    batches=(1, 8),
    categories=("short", "medium"),
    texts_per_category=1,
    memory_largest_only=True,
)
"""--quick: the table's quick rows, two batch sizes, one short and one medium text, peak memory of
the largest workloads only; still the median of `runs` timed runs after warm-up."""


def quick_settings(s: BenchSettings) -> BenchSettings:
    return replace(s, quick=True, **QUICK)


class BudgetExceeded(BaseException):
    """--max-minutes ran out while a configuration was being measured. A BaseException, so
    that the per-configuration error handling (which isolates failures) does not swallow it."""


@contextmanager
def _deadline(seconds: float | None):
    """Interrupt the measuring after `seconds` (SIGALRM; main thread on POSIX, else no-op):
    a configuration that hangs (a compiler, a driver) must not cost the whole report."""
    if (
        seconds is None
        or threading.current_thread() is not threading.main_thread()
        or not hasattr(signal, "setitimer")
    ):
        yield
        return

    def fire(signum, frame):
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise BudgetExceeded()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this PyTorch build sees no CUDA GPU")
    return device


# ---------------------------------------------------------------------------- planning
def _context(
    settings: BenchSettings, device: str, arms: Sequence[ArmSpec] | None = None
) -> tuple[Context, list]:
    corpus = load_corpus(settings.corpus)
    suites = [SUITES[n]() for n in settings.suites]
    front = load_voice(settings.voice, device="cpu")  # the front end of the pool (CPU, fp32)
    n = max([1] + [s.pool_size(settings) for s in suites])
    pool = build_pool(
        front, [d["text"] for d in corpus], pool_texts(corpus), n, SynthesisOptions(seed=settings.seed)
    )
    del front
    ctx = Context(
        settings,
        corpus,
        pool,
        stream_selection(corpus, settings.categories, settings.texts_per_category),
        [],
        device,
    )
    # the suites' own configurations (another model family's), each tagged with its suite
    extra = [
        s if s.suite else replace(s, suite=suite.name) for suite in suites for s in suite.extra_arms(ctx)
    ]
    if arms is not None:
        specs = list(arms)
    else:
        extra_names = {s.name for s in extra}
        table_names = tuple(n for n in settings.configs if n not in extra_names)
        if settings.configs:
            # --configs names rows of the table and of the suites; a suite whose rows it does
            # not name runs them all
            picked = {n for n in settings.configs if n in extra_names}
            named_suites = {s.suite for s in extra if s.name in picked}
            extra = [s for s in extra if s.name in picked or s.suite not in named_suites]
        if settings.configs and not table_names:
            specs = [a for a in arms_for(device, settings.quick) if a.reference]
        else:
            try:
                specs = arms_for(device, settings.quick, table_names or None)
            except ValueError as e:
                raise ValueError(f"{e}; the suites add: {sorted(extra_names)}") from None
    names = {s.name for s in specs}
    ctx.specs = specs + [s for s in extra if s.name not in names]
    return ctx, suites


def plan(settings: BenchSettings, device: str | None = None, arms: Sequence[ArmSpec] | None = None) -> dict:
    """What a run would do, without running a model: arms, availability, task counts."""
    settings = settings.validate()
    if device is None:
        import torch

        device = (
            "cuda"
            if settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available())
            else "cpu"
        )
    ctx, suites = _context(settings, device, arms)
    rows = []
    for spec in ctx.specs:
        tasks = _tasks(suites, ctx, spec)
        if not tasks:
            continue
        reason = availability(spec)
        skip = quick_skip(spec) if reason is None and settings.quick else None
        rows.append(
            {
                "name": spec.name,
                "label": spec.label,
                "status": UNAVAILABLE if reason else SKIPPED if skip else "would run",
                "reason": reason or skip,
                "tasks": len(_unique(tasks)),
                "rounds": _rounds(settings, spec),
                "suite": spec.suite,
                "memory_probes": len(_memory_tasks(settings, tasks))
                if spec.device == "cpu" and settings.memory
                else 0,
            }
        )
    return {
        "device": device,
        "settings": _settings_dict(settings),
        "arms": rows,
        "pool_sentences": len(ctx.pool),
        "stream_texts": [ctx.corpus[i]["id"] for i in ctx.stream_indices],
        "rounds": settings.warmup + settings.runs,
    }


def _settings_dict(s: BenchSettings) -> dict:
    d = dataclasses.asdict(s)
    for k, v in d.items():
        if isinstance(v, tuple):
            d[k] = list(v)
    return d


# ---------------------------------------------------------------------------- running
class _Progress:
    """A tqdm bar on stderr, or one line per phase where there is no terminal."""

    def __init__(self, total: int, enabled: bool | None):
        from tqdm import tqdm

        self.bar_on = sys.stderr.isatty() if enabled is None else enabled
        self.bar = tqdm(
            total=total,
            unit="run",
            file=sys.stderr,
            disable=not self.bar_on,
            dynamic_ncols=True,
            desc="bench",
        )
        self.t0 = time.perf_counter()

    def phase(self, text: str) -> None:
        if self.bar_on:
            self.bar.set_postfix_str(text[:60])
        else:
            print(f"[bench {time.perf_counter() - self.t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def run_bench(
    settings: BenchSettings,
    progress: bool | None = None,
    command: str | None = None,
    arms: Sequence[ArmSpec] | None = None,
) -> dict:
    """Measure; return the JSON-able result (see report.validate_result for its shape).

    arms: the configurations to compare (default: the device's table, see arms.py)."""
    settings = settings.validate()
    t_start = time.perf_counter()
    device = resolve_device(settings.device)
    ctx, suites = _context(settings, device, arms)
    tasks = {spec.name: _tasks(suites, ctx, spec) for spec in ctx.specs}
    for t in (t for ts in tasks.values() for t in ts):
        if any(not 0 <= i < len(ctx.pool) for i in t.sentences):
            raise ValueError(
                f"suite {t.suite!r}: task {t.key} uses pool sentences {t.sentences}, the pool has "
                f"{len(ctx.pool)} (its pool_size() is too small)"
            )
    ctx.specs = [s for s in ctx.specs if tasks[s.name]]
    res = Results()
    runnable = []
    for spec in ctx.specs:
        reason = availability(spec)
        skip = quick_skip(spec) if reason is None and settings.quick else None
        if reason is not None:
            res.status[spec.name] = (UNAVAILABLE, reason)
        elif skip is not None:
            res.status[spec.name] = (SKIPPED, skip)
        else:
            runnable.append(spec)
    rounds = max([settings.warmup + settings.runs] + [_rounds(settings, s) for s in runnable])
    probes = [
        (s, g)
        for s in runnable
        if s.device == "cpu" and settings.memory
        for g in _memory_tasks(settings, tasks[s.name])
    ]
    bar = _Progress(
        sum(_rounds(settings, s) * len(_unique(tasks[s.name])) for s in runnable) + len(probes), progress
    )
    machine = machine_info()
    notes: list[str] = []

    def over() -> bool:
        return (
            settings.max_minutes is not None and (time.perf_counter() - t_start) > settings.max_minutes * 60
        )

    budget_s = (
        None if settings.max_minutes is None else settings.max_minutes * 60 - (time.perf_counter() - t_start)
    )
    try:
        try:
            with _deadline(budget_s):
                if device == "cpu":
                    rounds_done = _interleaved(ctx, runnable, tasks, res, bar, over)
                    if rounds_done < rounds and runnable:  # (a suite may measure on its own)
                        notes.append(
                            f"time budget reached: {max(rounds_done - settings.warmup, 0)} timed rounds "
                            f"instead of {rounds - settings.warmup}"
                        )
                else:
                    _grouped(ctx, runnable, tasks, res, bar, over)
        except BudgetExceeded:
            notes.append(
                f"time budget of {settings.max_minutes} min ran out during the measurements; "
                "what was measured before is kept"
            )
            for spec in runnable:
                if spec.name not in res.status:
                    res.status[spec.name] = (SKIPPED, f"time budget of {settings.max_minutes} min reached")
                elif res.ok(spec.name) and not any(k[0] == spec.name for k in res.samples):
                    res.status[spec.name] = (
                        SKIPPED,
                        f"time budget of {settings.max_minutes} min reached while this configuration ran",
                    )
        for spec in runnable:  # CUDA peaks were taken around the timed calls
            if spec.device == "cuda" and res.ok(spec.name):
                for t in tasks[spec.name]:
                    if t.memory:
                        res.memory[(spec.name, t.key)] = cuda_memory(res.samples.get((spec.name, t.key), []))
        if probes:
            _memory_probes(ctx, [(s, t) for s, t in probes if res.ok(s.name)], res, bar, notes, over)
    finally:
        bar.close()

    refs = [s.name for s in ctx.specs if s.reference and res.ok(s.name)]
    result = {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "device": device,
        "settings": _settings_dict(settings),
        "machine": {**machine, "load_average_end": load_average()},
        "voice": _voice_info(settings.voice, res),
        "arms": [
            {
                **spec.to_dict(),
                "status": res.status.get(spec.name, (SKIPPED, "not run"))[0],
                "reason": res.status.get(spec.name, (SKIPPED, "not run"))[1],
                "info": res.info.get(spec.name, {}),
            }
            for spec in ctx.specs
        ],
        "references": refs,
        "pool": [{"text": s.text, "phoneme_ids": len(s.ids)} for s in ctx.pool],
        "suites": {s.name: s.build(ctx, res, refs) for s in suites},
        "notes": notes,
        "elapsed_s": time.perf_counter() - t_start,
    }
    result["spread"] = spread(result["suites"])
    result["timed_runs"] = sorted({len(v) for v in res.samples.values()})
    return result


def spread(obj) -> float | None:
    """Median over every timed figure of max/min of its runs: how repeatable this run was
    (close to 1 on a quiet machine; far more when other processes compete for the CPUs)."""
    ratios: list[float] = []

    def walk(o):
        if isinstance(o, dict):
            if "runs" in o and "min" in o and o.get("n", 0) > 1 and o["min"] > 0:
                ratios.append(o["max"] / o["min"])
            else:
                for v in o.values():
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(obj)
    if not ratios:
        return None
    ratios.sort()
    return ratios[len(ratios) // 2]


def _tasks(suites, ctx: Context, spec: ArmSpec) -> list[Task]:
    """The arm's tasks from every suite (an arm a suite added: from that suite only)."""
    return [
        dataclasses.replace(t, engine=spec.engine)
        for s in suites
        if spec.suite is None or spec.suite == s.name
        for t in s.tasks(ctx, spec)
    ]


def _rounds(settings: BenchSettings, spec: ArmSpec) -> int:
    """Rounds of one arm, warm-up included."""
    return settings.warmup + (spec.runs or settings.runs)


def _signature(t: Task) -> tuple:
    """Tasks with the same signature are the same work (e.g. configs/8 = batching/8/batched;
    for an engine without batches, a batch is its sequential run): run once per round, the
    sample counted for each."""
    kind = t.kind
    if kind == "batch" and not ENGINES[t.engine].batching:
        kind = "sequential"
    return (kind, t.sentences, t.text_index)


def _unique(tasks: list[Task]) -> list[list[Task]]:
    groups: dict[tuple, list[Task]] = {}
    for t in tasks:
        groups.setdefault(_signature(t), []).append(t)
    return list(groups.values())


def _memory_tasks(settings: BenchSettings, tasks: list[Task]) -> list[list[Task]]:
    """Groups of identical tasks whose peak memory is measured."""
    groups = [g for g in _unique(tasks) if any(t.memory for t in g)]
    if settings.memory_largest_only:
        largest: dict[str, int] = {}
        for t in (t for g in groups for t in g if t.memory):
            largest[t.suite] = max(largest.get(t.suite, 0), len(t.sentences))
        groups = [g for g in groups if any(t.memory and len(t.sentences) == largest[t.suite] for t in g)]
    return groups


def _fail(res: Results, name: str, e: BaseException) -> None:
    res.status[name] = (FAILED, f"{type(e).__name__}: {e}")
    log.warning("bench: %s failed: %s", name, e, exc_info=log.isEnabledFor(logging.DEBUG))


def _open(ctx: Context, spec: ArmSpec, tasks, res: Results):
    arm = make_arm(spec, ctx.settings.voice, ctx.settings.seed)
    try:
        arm.open()
        prepared = {
            _signature(g[0]): prepare(arm, g[0], ctx.pool, ctx.texts) for g in _unique(tasks[spec.name])
        }
    except Exception as e:  # one configuration failing must not lose the others
        _fail(res, spec.name, e)
        arm.close()
        return None, None
    res.status[spec.name] = (OK, None)
    res.info[spec.name] = arm.info
    return arm, prepared


def run_seed(base: int, round_index: int, arm: str, signature: tuple) -> int:
    """The noise seed of one run: new for every round, arm and workload (so no run meets frame
    counts an earlier run created kernels for), the same from one benchmark to the next."""
    return zlib.crc32(f"{base}/{round_index}/{arm}/{signature}".encode()) + (base << 32)


def _round(ctx, arm, prepared, tasks, res, bar, timed: bool, round_index: int = 0) -> None:
    arm.activate()
    for group in _unique(tasks[arm.name]):
        sig = _signature(group[0])
        try:
            s = execute(
                arm,
                group[0],
                prepared[sig],
                ctx.texts,
                run_seed(ctx.settings.seed, round_index, arm.name, sig),
            )
        except Exception as e:
            _fail(res, arm.name, e)
            return
        if timed:
            for t in group:
                res.samples.setdefault((arm.name, t.key), []).append(s)
        bar.update()


def _interleaved(ctx, specs, tasks, res, bar, over) -> int:
    """CPU: all arms loaded; each round runs every arm's tasks, arm after arm."""
    opened = {}
    for spec in specs:
        bar.phase(f"loading {spec.name}")
        arm, prepared = _open(ctx, spec, tasks, res)
        if arm is not None:
            opened[spec.name] = (arm, prepared)
    each = {spec.name: _rounds(ctx.settings, spec) for spec in specs}
    rounds = max([0] + [each[n] for n in opened])
    done = 0
    for r in range(rounds):
        if r > ctx.settings.warmup and over():
            break
        for name, (arm, prepared) in opened.items():
            if res.ok(name) and r < each[name]:
                bar.phase(
                    f"round {r + 1}/{each[name]} {'(warm-up) ' if r < ctx.settings.warmup else ''}{name}"
                )
                _round(ctx, arm, prepared, tasks, res, bar, timed=r >= ctx.settings.warmup, round_index=r)
        done = r + 1
    for arm, _ in opened.values():
        arm.close()
    return done


def _grouped(ctx, specs, tasks, res, bar, over) -> None:
    """CUDA: one arm loaded at a time (its peak memory is its own); references first, arms that
    compile last (compilation can take minutes: under --max-minutes they are the ones cut)."""
    order = sorted(specs, key=lambda s: (not s.reference, not s.primary, bool(s.runtime.get("compile"))))
    for spec in order:
        rounds = _rounds(ctx.settings, spec)
        if over():
            res.status[spec.name] = (SKIPPED, f"time budget of {ctx.settings.max_minutes} min reached")
            continue
        bar.phase(f"loading {spec.name}")
        arm, prepared = _open(ctx, spec, tasks, res)
        if arm is None:
            continue
        try:
            for r in range(rounds):
                if not res.ok(spec.name):
                    break
                bar.phase(f"{spec.name} round {r + 1}/{rounds}")
                _round(ctx, arm, prepared, tasks, res, bar, timed=r >= ctx.settings.warmup, round_index=r)
        finally:
            arm.close()


def _memory_probes(ctx, probes, res, bar, notes, over) -> None:
    # memory does not depend on CPU contention: two children at once even on two cores
    jobs = ctx.settings.jobs or max(2, min(4, (os.cpu_count() or 1) // 2))
    if over():
        notes.append("peak memory (child processes) not measured: time budget reached")
        return
    bar.phase(f"peak memory: {len(probes)} child processes, {jobs} at a time")

    def one(item):
        spec, group = item
        if over():
            return item, None, "time budget reached"
        try:
            r = run_probe(
                probe_request(spec, ctx.settings.voice, ctx.settings.seed, group[0], ctx.pool, ctx.texts)
            )
            return item, memory_entry("rss", r["peak_rss"], r.get("loaded_rss")), None
        except Exception as e:
            return item, None, f"{type(e).__name__}: {e}"

    with ThreadPoolExecutor(max_workers=jobs) as ex:
        for (spec, group), entry, err in ex.map(one, probes):
            for t in group:
                res.memory[(spec.name, t.key)] = entry
            if err:
                notes.append(f"peak memory of {spec.name} {group[0].key}: {err}")
            bar.update()


def _voice_info(voice: str | None, res: Results) -> dict:
    src = resolve_voice(voice)
    info = {"name": src.name, "family": src.family, "file": src.path.name}
    try:
        info["sha256"] = file_sha256(src.path)[:16]  # which voice file, exactly
    except OSError:
        pass
    try:
        import json

        d = json.loads(src.config_path.read_text(encoding="utf-8")) if src.config_path else {}
        info["sample_rate"] = (d.get("audio") or {}).get("sample_rate")
        info["quality"] = (d.get("audio") or {}).get("quality")
        info["speakers"] = d.get("num_speakers", 1)
        info["size_mb"] = round(src.path.stat().st_size / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return info
