"""Disconnect stress: N clients per route and format that leave mid-answer, against a real
`voxserve serve` run with faulthandler on; reports how many disconnects the server survived per
route and format, and whether it still answers correctly. Not run in CI (tests/reliability/
test_disconnects.py is the short version).

    python benchmarks/disconnect_stress.py --per-case 20 [--concurrency 8] [--python-malloc debug]

Each case cycles through the leave points of test_disconnects.py (right after sending, at the
first bytes, mid-answer with a reset). The server is the tiny test voice (tests/vits_fixtures.py)
on a free loopback port; its log (faulthandler's stack on a native crash) is printed if it dies.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "reliability")]

from server_process import ServerProcess, free_port  # noqa: E402
from test_disconnects import POINTS, ROUTES, VOICE, WHOLE, WHOLE_POINTS, leave_http, leave_wyoming  # noqa: E402
from vits_fixtures import write_tiny_voice  # noqa: E402


def cases(s, per_case: int) -> list[tuple[str, tuple]]:
    """(label, (function, *args)) for every route x format, `per_case` times, points in turn."""
    out = []
    for name, (path, body, formats) in ROUTES.items():
        for fmt in formats:
            whole = (name, fmt) in WHOLE
            points = WHOLE_POINTS if whole else POINTS
            out += [(f"{name}/{fmt}", (leave_http, s.port, path, body(fmt), points[k % len(points)], whole))
                    for k in range(per_case)]
    for streamed in (False, True):
        out += [(f"wyoming/{'streamed' if streamed else 'synthesize'}",
                 (leave_wyoming, s.wyoming_port, streamed, POINTS[k % len(POINTS)])) for k in range(per_case)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-case", type=int, default=20, help="disconnects per route and format")
    ap.add_argument("--concurrency", type=int, default=8, help="clients at once")
    ap.add_argument("--python-malloc", default=None, help="PYTHONMALLOC for the server (e.g. debug)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="voxserve-stress-"))
    write_tiny_voice(tmp)
    env = {"VOXSERVE_VOICES_PATH": str(tmp), "PYTHONFAULTHANDLER": "1"}
    if args.python_malloc:
        env["PYTHONMALLOC"] = args.python_malloc
    wy = free_port()
    log = tmp / "server.log"
    s = ServerProcess(["--voice", VOICE, "--no-warmup", "--wyoming", f"tcp://127.0.0.1:{wy}",
                       "--max-queued-sentences", "4096", "--max-queue-wait-s", "3600"], env=env, ready_timeout=300, log_path=log)
    s.wyoming_port = wy
    work = cases(s, args.per_case)
    survived: Counter = Counter()
    dead_at = None
    t0 = time.monotonic()
    try:
        def one(item):
            label, (fn, *rest) = item
            if s.proc.poll() is not None:
                return label, False
            try:
                fn(*rest)
            except OSError:
                pass
            return label, s.proc.poll() is None

        with ThreadPoolExecutor(args.concurrency) as pool:
            for label, alive in pool.map(one, work):
                if alive:
                    survived[label] += 1
                elif dead_at is None:
                    dead_at = label
        ok = s.proc.poll() is None and s.client.get("/health").status_code == 200
        if ok:
            r = s.client.post("/v1/synthesize", json={"text": "Still here.", "response_format": "wav"})
            ok = r.status_code == 200 and r.content[:4] == b"RIFF"
    finally:
        s.stop()
    elapsed = time.monotonic() - t0
    labels = list(dict.fromkeys(label for label, _ in work))
    print(f"{'route/format':34s} survived")
    for label in labels:
        print(f"{label:34s} {survived[label]}/{args.per_case}")
    total = sum(survived.values())
    print(f"total: {total}/{len(work)} disconnects survived in {elapsed:.0f} s; server answered after: {ok}; "
          f"PYTHONMALLOC={args.python_malloc or 'default'}; cpu: {os.cpu_count()} cores")
    if dead_at is not None or not ok:
        print(f"the server died (first seen at {dead_at}); its log:\n{log.read_text(errors='replace')[-8000:]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
