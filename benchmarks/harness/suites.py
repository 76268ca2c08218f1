"""The benchmark's suites. Each suite says which tasks each arm runs and turns the samples
into a JSON section; report.py and plots.py render the built-in sections.

Extension point (e.g. a Bark suite, in a module such as benchmarks/bench_bark.py, which
the harness imports when it is asked for):

    class BarkArm(arms.Arm):            # open / prepare / run_batch / run_sequential / stream
        ...
    arms.register_engine("bark", BarkArm)

    @register_suite
    class BarkSuite(Suite):
        name, title = "bark", "Bark: precision, offload, batching"
        def pool_size(self, settings):  # pool sentences its tasks index (0: none)
            return 4
        def extra_arms(self, ctx):      # its own configurations (engine "bark"), e.g. fp16 + offload
            return [ArmSpec("bark-fp16", "Bark fp16", engine="bark", device=ctx.device, dtype="fp16"), ...]
        def tasks(self, ctx, spec):     # each arm's workloads (Task kinds: batch, sequential, stream)
            return [Task(self.name, "bark/1", "batch", (0,), memory=True)] if spec.engine == "bark" else []
        def build(self, ctx, res, refs):    # samples -> a JSON section (timing(), ratio(), res.mem())
            ...
        def markdown(self, result, section):    # optional: its table(s)
            ...
        def plot(self, result, section, out, plt):  # optional: its PNGs, a list of paths
            ...
        def check(self, result, section, problems):  # optional: its section's JSON checks
            ...

`python benchmarks/bench.py --suites batching,configs,stream,bark` then measures it in the same run, with
the same clocks, memory probes, time budget and JSON checks. An arm a suite adds runs only that
suite's tasks (ArmSpec.suite, set by the runner); ArmSpec.runs gives it its own number of timed
rounds. benchmarks/bench_bark.py is a real one.
"""

from __future__ import annotations

import importlib
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .arms import OK, ArmSpec, Sentence
from .measure import Sample, Task, memory_entry, stat


# ---------------------------------------------------------------------------- shared state
@dataclass
class Context:
    """What every suite sees: settings, corpus, the sentence pool, the arms."""

    settings: Any
    corpus: list[dict]
    pool: list[Sentence]
    stream_indices: list[int]
    specs: list[ArmSpec]
    device: str

    @property
    def texts(self) -> list[str]:
        return [d["text"] for d in self.corpus]


@dataclass
class Results:
    """Everything measured, by (arm name, task key)."""

    status: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)
    memory: dict[tuple[str, str], dict | None] = field(default_factory=dict)
    info: dict[str, dict] = field(default_factory=dict)

    def ok(self, arm: str) -> bool:
        return self.status.get(arm, ("", None))[0] == OK

    def get(self, arm: str, key: str) -> list[Sample] | None:
        s = self.samples.get((arm, key))
        return s if s and self.ok(arm) else None

    def mem(self, arm: str, key: str) -> dict | None:
        return self.memory.get((arm, key)) if self.ok(arm) else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def timing(samples: Sequence[Sample]) -> dict:
    """Latency, audio, real-time factor and throughput of one task's timed rounds."""
    secs = [s.seconds for s in samples]
    audio = [s.audio_s for s in samples]
    rtfs = [s.seconds / s.audio_s for s in samples if s.audio_s > 0]
    rtf = statistics.median(rtfs) if rtfs else None
    return {
        "latency_s": stat(secs),
        "audio_s": statistics.median(audio),
        "rtf": rtf,
        "throughput": (1.0 / rtf) if rtf else None,
    }


def mem_ratio(m: dict | None, ref: dict | None) -> float | None:
    if not m or not ref or m.get("kind") != ref.get("kind"):
        return None  # GPU bytes against a CPU resident set would compare nothing
    return ratio(m["peak_mb"], ref["peak_mb"])


# ---------------------------------------------------------------------------- suites
class Suite:
    name = ""
    title = ""

    def extra_arms(self, ctx: Context) -> list[ArmSpec]:
        """Arms this suite adds to the run (other model families)."""
        return []

    def pool_size(self, settings) -> int:
        """How many pool sentences this suite's tasks index."""
        return 0

    def tasks(self, ctx: Context, spec: ArmSpec) -> list[Task]:
        raise NotImplementedError

    def build(self, ctx: Context, res: Results, refs: list[str]) -> dict:
        raise NotImplementedError

    # optional, for suites report.py / plots.py do not know:
    # def markdown(self, result: dict, section: dict) -> str
    # def plot(self, result: dict, section: dict, out: Path, plt) -> list[Path]
    # def check(self, result: dict, section: dict, problems: list[str]) -> None  (appends problems)


SUITES: dict[str, type[Suite]] = {}


def register_suite(cls: type[Suite]) -> type[Suite]:
    SUITES[cls.name] = cls
    return cls


CHECKOUT_BENCHMARKS = Path(__file__).resolve().parents[1]
"""benchmarks/: the suites of other families live there, as bench_<name>.py."""


def find_suite(name: str) -> type[Suite] | None:
    """The suite `name`, importing benchmarks/bench_<name>.py of a source checkout if it is not
    registered yet (importing it registers it); None if there is none."""
    if name not in SUITES and name.isidentifier() and (CHECKOUT_BENCHMARKS / f"bench_{name}.py").is_file():
        if str(CHECKOUT_BENCHMARKS) not in sys.path:
            sys.path.insert(0, str(CHECKOUT_BENCHMARKS))
        importlib.import_module(f"bench_{name}")  # under that name: the memory probe's child imports it so
    return SUITES.get(name)


def checkout_suites() -> list[str]:
    """Names of the suites a source checkout's benchmarks/ holds (not imported)."""
    if not CHECKOUT_BENCHMARKS.is_dir():
        return []
    return sorted(p.stem[len("bench_"):] for p in CHECKOUT_BENCHMARKS.glob("bench_*.py")
                  if "@register_suite" in p.read_text(encoding="utf-8", errors="replace"))


@register_suite
class BatchingSuite(Suite):
    """Seed 000: n sentences one `run_units` call each vs one call for all n."""

    name = "batching"
    title = "Sequential vs batched synthesis"

    def pool_size(self, settings) -> int:
        return max(settings.sizes)

    def tasks(self, ctx, spec):
        sizes = ctx.settings.sizes
        if spec.engine == "voxserve" and spec.primary:
            out = []
            for n in sizes:
                idx = tuple(range(n))
                out.append(Task(self.name, f"{self.name}/{n}/sequential", "sequential", idx, memory=True))
                out.append(Task(self.name, f"{self.name}/{n}/batched", "batch", idx, memory=True))
            return out
        if spec.reference:
            return [
                Task(self.name, f"{self.name}/{n}/sequential", "sequential", tuple(range(n)), memory=True)
                for n in sizes
            ]
        return []

    def build(self, ctx, res, refs):
        primary = next((s.name for s in ctx.specs if s.primary and s.engine == "voxserve"), None)
        rows = []
        for n in ctx.settings.sizes:
            seq = res.get(primary, f"{self.name}/{n}/sequential") if primary else None
            bat = res.get(primary, f"{self.name}/{n}/batched") if primary else None
            row: dict[str, Any] = {"sentences": n, "phoneme_ids": sum(len(ctx.pool[i].ids) for i in range(n))}
            if seq and bat:
                ts, tb = timing(seq), timing(bat)
                row.update(
                    {
                        "audio_s": tb["audio_s"],
                        "sequential": ts,
                        "batched": tb,
                        "speedup": ratio(ts["latency_s"]["median"], tb["latency_s"]["median"]),
                        "memory": {
                            "sequential": res.mem(primary, f"{self.name}/{n}/sequential"),
                            "batched": res.mem(primary, f"{self.name}/{n}/batched"),
                        },
                    }
                )
            row["vs"] = {}
            for ref in refs:
                rs = res.get(ref, f"{self.name}/{n}/sequential")
                if not rs:
                    continue
                tr = timing(rs)
                rmem = res.mem(ref, f"{self.name}/{n}/sequential")
                entry = {"sequential": tr, "memory": rmem}
                if seq and bat:
                    entry.update(
                        {
                            "batched_speedup": ratio(
                                tr["latency_s"]["median"], row["batched"]["latency_s"]["median"]
                            ),
                            "sequential_speedup": ratio(
                                tr["latency_s"]["median"], row["sequential"]["latency_s"]["median"]
                            ),
                            "batched_throughput_ratio": ratio(row["batched"]["throughput"], tr["throughput"]),
                            "batched_memory_ratio": mem_ratio(row["memory"]["batched"], rmem),
                        }
                    )
                row["vs"][ref] = entry
            rows.append(row)
        return {"title": self.title, "arm": primary, "references": refs, "rows": rows}


def median_sentence(pool: Sequence[Sentence], n: int) -> int:
    """Index of the sentence of median length among the first n (batch-1 workload)."""
    order = sorted(range(n), key=lambda i: (len(pool[i].ids), i))
    return order[(n - 1) // 2]


@register_suite
class ConfigsSuite(Suite):
    """Seeds 003/004: every configuration at batch 1 and batch 8."""

    name = "configs"
    title = "Configurations side by side"

    def pool_size(self, settings) -> int:
        return max(settings.batches)

    def workload(self, ctx, batch: int) -> tuple[int, ...]:
        if batch == 1:
            return (median_sentence(ctx.pool, max(ctx.settings.batches)),)
        return tuple(range(batch))

    def tasks(self, ctx, spec):
        return [
            Task(self.name, f"{self.name}/{b}", "batch", self.workload(ctx, b), memory=True)
            for b in ctx.settings.batches
        ]

    def build(self, ctx, res, refs):
        rows = []
        for spec in ctx.specs:
            if not self.tasks(ctx, spec) or spec.suite not in (None, self.name):
                continue  # another suite's arm (e.g. Bark's): its own table has it
            st, reason = res.status.get(spec.name, ("skipped", "not run"))
            for b in ctx.settings.batches:
                key = f"{self.name}/{b}"
                row: dict[str, Any] = {"arm": spec.name, "batch": b, "status": st}
                samples = res.get(spec.name, key)
                if not samples:
                    row["reason"] = reason or "no samples"
                    rows.append(row)
                    continue
                t = timing(samples)
                m = res.mem(spec.name, key)
                row.update(t)
                row["sentences_per_s"] = b / t["latency_s"]["median"]
                row["memory"] = m
                row["vs"] = {}
                for ref in refs:
                    rsamp = res.get(ref, key)
                    if not rsamp:
                        continue
                    tr = timing(rsamp)
                    row["vs"][ref] = {
                        "latency_speedup": ratio(tr["latency_s"]["median"], t["latency_s"]["median"]),
                        "throughput_ratio": ratio(t["throughput"], tr["throughput"]),
                        "memory_ratio": mem_ratio(m, res.mem(ref, key)),
                    }
                rows.append(row)
        return {
            "title": self.title,
            "batches": list(ctx.settings.batches),
            "references": refs,
            "rows": rows,
            "workloads": {str(b): list(self.workload(ctx, b)) for b in ctx.settings.batches},
        }


@register_suite
class StreamSuite(Suite):
    """Time to first audio and total time, short / medium / long texts, text in -> audio out
    (front end included): `Voice.stream` vs `PiperVoice.synthesize` (one chunk a sentence)."""

    name = "stream"
    title = "Time to first audio"

    def tasks(self, ctx, spec):
        if not spec.stream:
            return []
        return [
            Task(self.name, f"{self.name}/{ctx.corpus[i]['id']}", "stream", text_index=i)
            for i in ctx.stream_indices
        ]

    def build(self, ctx, res, refs):
        rows = []
        streamers = [s for s in ctx.specs if s.stream]
        for i in ctx.stream_indices:
            item = ctx.corpus[i]
            key = f"{self.name}/{item['id']}"
            for spec in streamers:
                samples = res.get(spec.name, key)
                row: dict[str, Any] = {
                    "text_id": item["id"],
                    "category": item["category"],
                    "chars": len(item["text"]),
                    "arm": spec.name,
                }
                if not samples:
                    row["status"], row["reason"] = res.status.get(spec.name, ("skipped", "not run"))
                    rows.append(row)
                    continue
                t = timing(samples)
                first = stat([s.first_s for s in samples])
                row.update(
                    {
                        "status": OK,
                        "first_audio_s": first,
                        "total_s": t["latency_s"],
                        "audio_s": t["audio_s"],
                        "rtf": t["rtf"],
                        "vs": {},
                    }
                )
                for ref in refs:
                    rsamp = res.get(ref, key)
                    if not rsamp:
                        continue
                    row["vs"][ref] = {
                        "first_audio_speedup": ratio(
                            statistics.median(s.first_s for s in rsamp), first["median"]
                        ),
                        "total_speedup": ratio(
                            statistics.median(s.seconds for s in rsamp), t["latency_s"]["median"]
                        ),
                    }
                rows.append(row)
        by_cat: dict[str, dict[str, float]] = {}
        for r in rows:
            if r.get("status") == OK:
                by_cat.setdefault(r["category"], {}).setdefault(r["arm"], []).append(
                    r["first_audio_s"]["median"]
                )
        summary = {c: {a: statistics.median(v) for a, v in arms.items()} for c, arms in by_cat.items()}
        return {"title": self.title, "references": refs, "rows": rows, "first_audio_by_category": summary}


def cuda_memory(samples: Sequence[Sample]) -> dict | None:
    """The largest CUDA peak of an arm's timed rounds of one task."""
    peaks = [s.peak_bytes for s in samples if s.peak_bytes is not None]
    return memory_entry("cuda", max(peaks)) if peaks else None
