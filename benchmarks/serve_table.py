#!/usr/bin/env python3
"""The ratio table of a benchmarks/serve_vs_piper.sh run: each voxserve arm against Piper's
server, per round (the rounds stay separate: on a shared machine their spread is the news), then
each ratio's median over the rounds. Rows whose load was not run (SVP_LOADS) are left out.

    python benchmarks/serve_table.py OUTDIR ROUNDS ARM [ARM...]
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from pathlib import Path


def main(out: Path, rounds: int, arms: list[str]) -> None:
    ticks = dict(re.findall(r"CPU (\S+) (\d+) ticks", (out / "runs.txt").read_text()))

    def load(name: str) -> dict:
        return json.loads((out / f"{name}.json").read_text())

    def cell(arm: str, r: int, figure) -> tuple[str, float | None]:
        try:
            a, b, unit, fmt = figure(lambda who, load_: load(f"r{r}_{who}_{load_}"), arm)
        except (OSError, KeyError):  # a run that failed or was cut: runs.txt says which
            return "-", None
        return f"{a:{fmt}} / {b:{fmt}}{unit} = {a / b:.2f}x", a / b

    def row(arm: str, load_: str, name: str, cells: list[tuple[str, float | None]]) -> None:
        ratios = [x for _, x in cells if x is not None]
        if ratios:
            print(f"| {arm} | {load_} | {name} | " + " | ".join(text for text, _ in cells)
                  + f" | {statistics.median(ratios):.2f}x ({len(ratios)}) |")

    def thr(c):
        return lambda get, arm: (get(arm, f"c{c}")["all"]["audio_s_per_s"],
                                 get("piper", f"c{c}")["all"]["audio_s_per_s"], "", ".2f")

    def lat(cat, q):
        key = f"latency_{q}_s"
        return lambda get, arm: (get(arm, "c8")["by_category"][cat][key] * 1e3,
                                 get("piper", "c8")["by_category"][cat][key] * 1e3, " ms", ".0f")

    def first_audio(c):  # voxserve's first audio (streamed) against Piper's whole answer
        return lambda get, arm: (get(arm, f"long_c{c}")["all"]["ttfa_p50_s"] * 1e3,
                                 get("piper", f"long_c{c}")["all"]["latency_p50_s"] * 1e3, " ms", ".0f")

    rows = [
        ("1 client, short+medium", "throughput (audio s/s)", thr(1)),
        ("4 clients, short+medium", "throughput", thr(4)),
        ("8 clients, short+medium", "throughput", thr(8)),
        ("8 clients", "p95 latency, short requests", lat("short", "p95")),
        ("8 clients", "p50 latency, short requests", lat("short", "p50")),
        ("8 clients", "p95 latency, medium requests", lat("medium", "p95")),
        ("1 client, long, streamed", "first audio / Piper's total", first_audio(1)),
        ("4 clients, long, streamed", "first audio / Piper's total", first_audio(4)),
    ]
    head = ("| arm | load | figure | " + " | ".join(f"round {r}: voxserve / Piper" for r in range(1, rounds + 1))
            + " | median (rounds) |")
    print(head)
    print("| :--- | :--- | :--- |" + " ---: |" * (rounds + 1))
    for arm in arms:
        for load_, name, fig in rows:
            row(arm, load_, name, [cell(arm, r, fig) for r in range(1, rounds + 1)])
        # CPU time per audio second at 8 clients: the cost of the work, whatever the schedule
        cells: list[tuple[str, float | None]] = []
        for r in range(1, rounds + 1):
            try:
                v, p = (int(ticks[f"r{r}_{who}_c8"]) / os.sysconf("SC_CLK_TCK") / load(f"r{r}_{who}_c8")["all"]["audio_s"]
                        for who in (arm, "piper"))
            except (OSError, KeyError):
                cells.append(("-", None))
                continue
            cells.append((f"{v:.3f} / {p:.3f} = {v / p:.2f}x", v / p))
        row(arm, "8 clients, short+medium", "CPU s per audio s", cells)

if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] or ["vox"])
