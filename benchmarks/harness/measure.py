"""Clocks and memory.

Timing: every timed call is bracketed by the arm's device sync (CUDA) and `perf_counter`;
inputs are prepared outside the clock; the first round is a warm-up and is discarded; the
figure is the median of the remaining rounds. On the CPU the arms are interleaved round by
round (arm A, arm B, ..., then again), so that the noise of a shared machine falls on every
arm alike.

Peak memory:
* CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, around each
  timed call, in the benchmark process (one CUDA arm is loaded at a time, so the figure is
  that arm's weights plus its activations).
* CPU: the peak resident set (VmHWM) of a fresh child process that loads only that arm and
  runs only that workload (twice). RSS cannot be attributed per configuration inside one
  process: voxserve keeps freed heap for reuse (runtime/cpu.py), so a process's RSS never
  comes back down after a large batch. The child also reports its RSS after loading, so the
  part the synthesis itself adds is known.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .arms import ENGINES, Arm, ArmSpec, Output, Sentence, make_arm

MB = 1024 * 1024
BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The benchmarks/ folder, which holds this package (the probe's child imports it from there)."""


@dataclass(frozen=True)
class Task:
    """One workload for one arm."""

    suite: str
    key: str
    """Unique among an arm's tasks, e.g. 'batching/8/batched'."""
    kind: str
    """'batch' (one run_units call), 'sequential' (one call per sentence) or 'stream'."""
    sentences: tuple[int, ...] = ()
    """Pool indices (batch / sequential)."""
    text_index: int | None = None
    """Corpus text (stream)."""
    memory: bool = False
    """Measure this task's peak memory."""
    engine: str = ""
    """The engine of the arm it runs on (set by the runner)."""


@dataclass
class Sample:
    seconds: float
    audio_s: float
    first_s: float | None = None
    peak_bytes: int | None = None


def execute(arm: Arm, task: Task, prepared: Any, texts: Sequence[str], seed: int | None = None) -> Sample:
    """Run one task once on an opened, activated arm; `seed`: fresh noise for this run."""
    if seed is not None:
        prepared = arm.reseed(prepared, seed)
    arm.memory_begin()
    arm.sync()
    t0 = time.perf_counter()
    first = None
    if task.kind == "batch":
        out = Output(arm.run_batch(prepared))
    elif task.kind == "sequential":
        out = Output(arm.run_sequential(prepared))
    elif task.kind == "stream":
        audios = []
        for a in arm.stream(texts[task.text_index]):
            if first is None:
                arm.sync()
                first = time.perf_counter() - t0
            audios.append(a)
        out = Output(audios, first)
    else:
        raise ValueError(f"unknown task kind {task.kind!r}")
    arm.sync()
    seconds = time.perf_counter() - t0
    peak = arm.memory_end()
    samples = sum(len(a) for a in out.audios)
    return Sample(seconds, samples / arm.sample_rate, out.first_s, peak)


def prepare(arm: Arm, task: Task, pool: Sequence[Sentence], texts: Sequence[str]) -> Any:
    if task.kind == "stream":
        return None
    return arm.prepare([pool[i] for i in task.sentences], texts)


def stat(values: Sequence[float]) -> dict:
    """Median and spread of the timed rounds."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("no samples")
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
        "runs": vals,
    }


# ---------------------------------------------------------------------------- process memory
def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes() -> int | None:
    kb = _status_kb("VmRSS")
    return None if kb is None else kb * 1024


def peak_rss_bytes() -> int:
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024


def probe_request(
    spec: ArmSpec,
    voice: str | None,
    seed: int,
    task: Task,
    pool: Sequence[Sentence],
    texts: Sequence[str],
    repeat: int = 2,
) -> dict:
    # only what the task needs travels
    used_texts = sorted({pool[i].text_index for i in task.sentences} | ({task.text_index} - {None}))
    engine = sys.modules[ENGINES[spec.engine].__module__]  # the child registers it by importing it
    return {
        "engine_module": engine.__name__,
        "engine_path": os.path.dirname(os.path.abspath(engine.__file__)) if "." not in engine.__name__ else None,
        "spec": spec.to_dict(),
        "voice": voice,
        "seed": seed,
        "task": asdict(task),
        "repeat": repeat,
        "pool": [asdict(s) for s in pool],
        "texts": {str(i): texts[i] for i in used_texts},
    }


def probe_main(request: Mapping[str, Any]) -> dict:
    """In a fresh process: load one arm, run one task `repeat` times, report memory."""
    base = rss_bytes()
    if request.get("engine_path"):  # an engine outside the package (benchmarks/bench_bark.py)
        sys.path.insert(0, request["engine_path"])
    importlib.import_module(request.get("engine_module") or __name__)
    spec = ArmSpec.from_dict(request["spec"])
    arm = make_arm(spec, request["voice"], request["seed"])
    arm.open()
    arm.activate()
    loaded = rss_bytes()
    t = request["task"]
    task = Task(**{**t, "sentences": tuple(t["sentences"])})
    pool = [Sentence(**{**s, "ids": tuple(s["ids"])}) for s in request["pool"]]
    texts_map = {int(k): v for k, v in request["texts"].items()}
    texts = [texts_map.get(i, "") for i in range(max(texts_map, default=-1) + 1)]
    prepared = prepare(arm, task, pool, texts)
    for _ in range(int(request.get("repeat", 2))):
        execute(arm, task, prepared, texts)
    return {"peak_rss": peak_rss_bytes(), "loaded_rss": loaded, "start_rss": base}


def run_probe(request: Mapping[str, Any], timeout_s: float = 600.0) -> dict:
    """probe_main in a child process (`python -m harness.probe`, benchmarks/ on its path)."""
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BENCHMARKS, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "harness.probe"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"memory probe failed (exit {proc.returncode}): {' | '.join(tail)}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError("memory probe printed no result")
    return json.loads(lines[-1])


def memory_entry(kind: str, peak: int | None, loaded: int | None = None) -> dict | None:
    """The JSON form of a peak: MB, and for RSS the part added after loading."""
    if peak is None:
        return None
    d: dict[str, Any] = {"kind": kind, "peak_mb": peak / MB}
    if loaded is not None:
        d["loaded_mb"] = loaded / MB
        d["run_mb"] = max(peak - loaded, 0) / MB
    return d
