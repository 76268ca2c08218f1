"""A/B of one change of the Piper voice's options (PiperRuntimeOptions or Transforms) on the CPU, per model stage, in one process: the default
voice (A) against the same voice loaded with the given fields changed (B), on every sentence
of the chosen corpus categories, one call each, deterministic. The two voices alternate
sentence by sentence (the first to go alternates each pass), so a shared machine's drift hits
both alike; each stage's figure is the median of the per-sentence ratios B / A, with its
interquartile range. The audio of A and B is compared first.

    .venv/bin/python benchmarks/runtime_ab.py FIELD=VALUE [FIELD=VALUE...] [--threads 1]
        [--categories short,medium] [--passes 6]
    e.g. benchmarks/runtime_ab.py cpu_gemm_convs=false --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch

import voxserve
from voxserve.families.piper.loader import load_piper_voice
from voxserve.families.piper.options import PiperRuntimeOptions, Transforms
from voxserve.voices.registry import resolve_voice
from bench_stages import STAGE_METHODS, corpus_units, time_stages

STAGES = tuple(STAGE_METHODS)


def parse_field(text: str) -> tuple[str, object]:
    name, _, raw = text.partition("=")
    fields = {f.name: f for cls in (PiperRuntimeOptions, Transforms) for f in dataclasses.fields(cls)}
    if name not in fields or not raw:
        raise SystemExit(f"{text!r}: expected FIELD=VALUE with FIELD one of {', '.join(fields)}")
    low = raw.lower()
    value: object = {"true": True, "false": False, "none": None}.get(low, raw)
    if isinstance(value, str):
        try:
            value = int(raw)
        except ValueError:
            pass
    return name, value


def _load_b(change: dict):
    switches = {f.name for f in dataclasses.fields(Transforms)}
    src = resolve_voice(None)
    return load_piper_voice(src.path, src.config_path, name=src.name, device="cpu",
                            runtime=PiperRuntimeOptions(**{k: v for k, v in change.items() if k not in switches}),
                            transforms=Transforms(**{k: v for k, v in change.items() if k in switches}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("change", nargs="+", help="FIELD=VALUE of PiperRuntimeOptions or Transforms for voice B")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--categories", default="short,medium")
    ap.add_argument("--passes", type=int, default=6)
    args = ap.parse_args()
    change = dict(parse_field(c) for c in args.change)
    torch.set_num_threads(args.threads)

    spent = time_stages()
    voices = {"A": voxserve.load_voice(device="cpu"),
              "B": _load_b(change)}
    for v in voices.values():
        v.warmup()
    units = corpus_units(voices["A"], args.categories.split(","), voxserve.DETERMINISTIC)

    worst = 0.0
    for u in units:
        a, b = (voices[k].run_units([u])[0] for k in "AB")
        if len(a) != len(b):
            print(f"sentence {u.text[:40]!r}: A made {len(a)} samples, B {len(b)}")
            worst = float("inf")
        else:
            worst = max(worst, float(np.abs(a - b).max()))

    ratios: dict[str, list[float]] = {k: [] for k in (*STAGES, "total")}
    sums = {k: dict.fromkeys(ratios, 0.0) for k in "AB"}
    for p in range(args.passes):
        for u in units:
            got = {}
            for k in ("AB" if p % 2 else "BA"):
                spent.update(dict.fromkeys(STAGES, 0.0))
                t = time.perf_counter()
                voices[k].run_units([u])
                got[k] = {**spent, "total": time.perf_counter() - t}
                for s, x in got[k].items():
                    sums[k][s] += x
            for s in ratios:
                ratios[s].append(got["B"][s] / got["A"][s])

    print(f"B = {', '.join(f'{k}={v}' for k, v in change.items())}; {len(units)} sentences "
          f"({args.categories}), {args.threads} thread(s), {args.passes} passes; "
          f"max |A - B| {worst:.2g}")
    print(f"{'stage':8s} {'A ms/pass':>10s} {'B ms/pass':>10s} {'B/A median':>11s} {'IQR':>13s}")
    for s, xs in ratios.items():
        q = statistics.quantiles(xs, n=4)
        print(f"{s:8s} {sums['A'][s] * 1e3 / args.passes:10.0f} {sums['B'][s] * 1e3 / args.passes:10.0f} "
              f"{statistics.median(xs):10.3f}x {q[0]:6.3f}-{q[2]:.3f}")


if __name__ == "__main__":
    main()
