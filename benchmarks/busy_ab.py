"""The busy-machine ratio of two checkouts: Piper's server and `voxserve serve` from each of two
`src` folders (e.g. the commit before a change and after it) side by side, one long corpus text
per request, rounds interleaved, with two `while True: pass` processes beside them ("busy"; "idle":
none). Prints each round, then per arm the median seconds, its speed against Piper's, and
AFTER / BEFORE (above 1: the second tree is faster). docs/benchmarks.md, issue 44's section.

    PY=.venv/bin/python
    $PY benchmarks/busy_ab.py BEFORE_SRC AFTER_SRC busy 3
    $PY benchmarks/busy_ab.py BEFORE_SRC AFTER_SRC busy 3 --vox-flags "--executor serial"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lean_server as L  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the first checkout's src folder")
    ap.add_argument("after", type=Path, help="the second checkout's src folder")
    ap.add_argument("load", choices=("busy", "idle"))
    ap.add_argument("rounds", type=int)
    ap.add_argument("--vox-flags", default="", help="flags for both voxserve servers")
    ap.add_argument("--port", type=int, default=18880)
    args = ap.parse_args()
    srv = {"piper": L.Server("piper", args.port),
           "before": L.Server("voxserve", args.port + 1, args.vox_flags, args.before),
           "after": L.Server("voxserve", args.port + 2, args.vox_flags, args.after)}
    loops = []
    try:
        for s in srv.values():
            s.wait_ready()
        for s in srv.values():
            s.speak("Hello there, a warm up.")
        text = L.texts("long")[0]
        res: dict[str, list[float]] = {}
        loops = L.busy_loops() if args.load == "busy" else []
        for r in range(args.rounds):
            # each round in a rotated order: neither tree always runs first after the other
            names = list(srv)[r % 3:] + list(srv)[:r % 3]
            for k in names:
                t = time.perf_counter()
                srv[k].speak(text)
                res.setdefault(k, []).append(time.perf_counter() - t)
            print(r, {k: round(v[-1], 2) for k, v in res.items()}, "load", os.getloadavg()[0], flush=True)
    finally:
        L.stop_all(loops)
        for s in srv.values():
            s.stop()
    med = {k: statistics.median(v) for k, v in res.items()}
    for k, v in med.items():
        print(f"{k:7} median {v:.2f} s, speed vs piper {med['piper'] / v:.2f}")
    print(f"after / before speed {med['before'] / med['after']:.2f}; per round "
          f"{[round(b / a, 2) for b, a in zip(res['before'], res['after'])]}")


if __name__ == "__main__":
    main()
