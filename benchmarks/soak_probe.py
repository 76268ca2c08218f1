"""Where a soak's RSS growth comes from: `voxserve serve` on jemalloc with an in-process
sampler (VmRSS and jemalloc's allocated / resident / retained bytes every 10 s) and oneDNN's
primitive creations logged (ONEDNN_VERBOSE=profile_create), under lean_server.py's soak.

    PY=.venv/bin/python
    $PY benchmarks/soak_probe.py --minutes 8 --out OUT     # then read OUT/*

Prints the RSS series, the jemalloc series and the primitives created per 30 s window after
the first minute, by layer. Linux with libjemalloc2 only.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MB = 1 << 20


def serve(out: str, port: int) -> int:
    """The server, with the sampler thread (run in the child, jemalloc preloaded)."""
    lib = ctypes.CDLL(None)

    def stat(name: str) -> int:
        v, sz = ctypes.c_size_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        return v.value if lib.mallctl(name.encode(), ctypes.byref(v), ctypes.byref(sz), None, ctypes.c_size_t(0)) == 0 else -1

    def sample() -> None:
        f, t0 = open(out, "w", buffering=1), time.time()
        while True:
            e = ctypes.c_uint64(1)  # refresh jemalloc's statistics
            lib.mallctl(b"epoch", None, None, ctypes.byref(e), ctypes.c_size_t(8))
            rss = next(int(x.split()[1]) // 1024 for x in open("/proc/self/status") if x.startswith("VmRSS:"))
            f.write(f"{time.time() - t0:.0f} rss={rss} " + " ".join(
                f"{k}={stat('stats.' + k) // MB}" for k in ("allocated", "resident", "retained")) + "\n")
            time.sleep(10)

    threading.Thread(target=sample, daemon=True).start()
    from voxserve.cli import main as cli

    return cli(["serve", "--port", str(port), "--device", "cpu"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=8)
    p.add_argument("--out", required=True, help="folder for the samples and oneDNN's log")
    p.add_argument("--port", type=int, default=18842)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    out = Path(args.out)
    if args.serve:
        sys.exit(serve(str(out / "samples.txt"), args.port))
    sys.path.insert(0, str(HERE))
    import lean_server as L

    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"), LD_PRELOAD="libjemalloc.so.2",
               ONEDNN_VERBOSE="profile_create", ONEDNN_VERBOSE_TIMESTAMP="1")
    env.setdefault("MALLOC_CONF", "dirty_decay_ms:-1,muzzy_decay_ms:-1")  # as runtime/allocator.py
    s = L.Server.__new__(L.Server)
    s.kind, s.port, s.ready_path, s.t0 = "voxserve", args.port, "/ready", time.perf_counter()
    with open(out / "onednn.log", "w") as log:
        s.proc = subprocess.Popen([sys.executable, __file__, "--serve", "--out", str(out), "--port", str(args.port)],
                                  env=env, stdout=log, stderr=subprocess.DEVNULL)
        try:
            s.wait_ready()
            print(f"ready in {s.ready_s:.1f} s, RSS {s.ready_rss:.0f} MB; CPU {L.cpu_model()}", flush=True)
            series = L.soak(s, args.minutes, 4)
        finally:
            s.stop()
    print("RSS (MB, every 10 s):", " ".join(f"{r:.0f}" for _, r in series))
    print((out / "samples.txt").read_text(), end="")
    misses = [x.split(",") for x in open(out / "onednn.log") if "create:cache_miss" in x]
    if not misses:
        return
    t0 = float(misses[0][2])  # ms; the first creation is at the server's start
    late: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for m in misses:
        t = (float(m[2]) - t0) / 1000
        if t > 60 + 10:  # the soak starts ~10 s after the first creation
            shape = re.search(r"ic(\d+)oc(\d+)", m[-2])
            late[int(t // 30 * 30)][f"{m[6]} {shape.group(0) if shape else ''}"] += 1
    print(f"primitives created: {len(misses)}, after the first minute: {sum(sum(c.values()) for c in late.values())}")
    for w, c in sorted(late.items()):
        print(f"  {w}-{w + 30} s:", ", ".join(f"{n} {k}" for k, n in c.most_common()))


if __name__ == "__main__":
    main()
