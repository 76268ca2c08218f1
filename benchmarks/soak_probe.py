"""Where a soak's RSS growth comes from: `voxserve serve` on jemalloc with an in-process
sampler (VmRSS, jemalloc's allocated / resident / retained bytes, each arena's resident bytes
and Python's allocated blocks every 10 s; /proc/self/smaps and pymalloc's statistics every
minute) and oneDNN's primitive creations logged (ONEDNN_VERBOSE=profile_create), under
lean_server.py's soak.

    PY=.venv/bin/python
    $PY benchmarks/soak_probe.py --minutes 8 --out OUT     # then read OUT/*

Prints the RSS series, the jemalloc series and the primitives created per 30 s window after
the first minute, by layer. Linux with libjemalloc2 only.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import os
import re
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
MB = 1 << 20


def serve(out: str, port: int, trace: bool, garbage: bool) -> int:
    """The server, with the sampler thread (run in the child, jemalloc preloaded)."""
    lib = ctypes.CDLL(None)

    def stat(name: str) -> int:
        v, sz = ctypes.c_size_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        return v.value if lib.mallctl(name.encode(), ctypes.byref(v), ctypes.byref(sz), None, ctypes.c_size_t(0)) == 0 else -1

    def sample() -> None:
        f, t0, last = open(out, "w", buffering=1), time.time(), None
        while True:
            e = ctypes.c_uint64(1)  # refresh jemalloc's statistics
            lib.mallctl(b"epoch", None, None, ctypes.byref(e), ctypes.c_size_t(8))
            rss = next(int(x.split()[1]) // 1024 for x in open("/proc/self/status") if x.startswith("VmRSS:"))
            narenas = ctypes.c_uint(0)
            lib.mallctl(b"arenas.narenas", ctypes.byref(narenas), ctypes.byref(ctypes.c_size_t(4)), None, ctypes.c_size_t(0))
            arenas = [stat(f"stats.arenas.{i}.resident") // MB for i in range(narenas.value)]
            f.write(f"{time.time() - t0:.0f} rss={rss} " + " ".join(
                f"{k}={stat('stats.' + k) // MB}" for k in ("allocated", "resident", "retained"))
                + f" pyblocks={sys.getallocatedblocks()}" + " arenas=" + ",".join(map(str, arenas)) + "\n")
            t = time.time() - t0
            each_minute = int(t) // 10 % 6 == 0  # (samples are 10 s apart)
            if t >= 60 and each_minute:  # which mappings hold the RSS
                with open("/proc/self/smaps") as src, open(Path(out).with_name(f"smaps-{int(t) // 60}.txt"), "w") as g:
                    g.write(src.read())
                sys.stderr.flush()
                os.write(2, f"--- pymalloc at {t:.0f} s\n".encode())
                sys._debugmallocstats()  # (to the C stderr: OUT/stderr.txt)
            if garbage and 180 <= t < 190:  # what only a full collection frees (cycles), by type
                gc.set_debug(gc.DEBUG_SAVEALL)
                before = sys.getallocatedblocks()
                n = gc.collect()
                kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
                gc.garbage.clear()
                gc.set_debug(0)
                with open(Path(out).with_name("garbage.txt"), "w") as g:
                    g.write(f"at {t:.0f} s: {n} objects in cycles, Python blocks {before} -> "
                            f"{sys.getallocatedblocks()}\n" + "".join(f"{c:7d} {k}\n" for k, c in kinds.most_common(40)))
            if trace and 60 <= t < 70:
                tracemalloc.start(12)  # from the end of the first minute: what is allocated and kept
            elif trace and t >= 120 and each_minute:
                snap = tracemalloc.take_snapshot().filter_traces(
                    [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)])
                with open(Path(out).with_name("tracemalloc.txt"), "a") as g:  # (no source lines: linecache allocates)
                    g.write(f"=== at {t:.0f} s: held since the first minute, by line\n")
                    g.writelines(f"{st}\n" for st in snap.statistics("lineno")[:15])
                    if last is not None:
                        g.write("--- grown in the last minute\n")
                        g.writelines(f"{st}\n" for st in snap.compare_to(last, "lineno")[:15])
                last = snap
            time.sleep(10)

    threading.Thread(target=sample, daemon=True).start()
    from voxserve.cli import main as cli

    return cli(["serve", "--port", str(port), "--device", "cpu"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=8)
    p.add_argument("--out", required=True, help="folder for the samples and oneDNN's log")
    p.add_argument("--port", type=int, default=18842)
    p.add_argument("--trace", action="store_true",
                   help="tracemalloc from the end of the first minute: the Python allocations still held "
                        "(OUT/tracemalloc.txt, appended every minute; slows the server)")
    p.add_argument("--garbage", action="store_true",
                   help="at 3 min, a full garbage collection: what it frees, by type (OUT/garbage.txt)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    out = Path(args.out)
    if args.serve:
        sys.exit(serve(str(out / "samples.txt"), args.port, args.trace, args.garbage))
    sys.path.insert(0, str(HERE))
    import lean_server as L

    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:  # another server there would answer /ready in this one's place
        probe.bind(("127.0.0.1", args.port))
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"), LD_PRELOAD="libjemalloc.so.2",
               ONEDNN_VERBOSE="profile_create", ONEDNN_VERBOSE_TIMESTAMP="1")
    env.setdefault("MALLOC_CONF", "dirty_decay_ms:-1,muzzy_decay_ms:-1")  # as runtime/allocator.py
    s = L.Server.__new__(L.Server)
    s.kind, s.port, s.ready_path, s.t0 = "voxserve", args.port, "/ready", time.perf_counter()
    with open(out / "onednn.log", "w") as log, open(out / "stderr.txt", "w") as err:
        s.proc = subprocess.Popen([sys.executable, __file__, "--serve", "--out", str(out), "--port", str(args.port)]
                                  + ["--trace"] * args.trace + ["--garbage"] * args.garbage,
                                  env=env, stdout=log, stderr=err)
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
