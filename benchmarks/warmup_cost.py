"""Where a CPU voice's start-up and memory go (issue 18, docs/benchmarks.md "A lean server").

In one process, on one thread (torch.set_num_threads(1); times are this thread's CPU time, so
a shared machine's load changes them little):
  * import and load times, RSS after each;
  * a shape bucket's first use against its later ones (oneDNN builds per-shape kernels);
  * RSS and glibc's heap (mallinfo2: in use, free but kept) over the short and medium corpus
    texts, twice, then after malloc_trim.

    PYTHONPATH=src .venv/bin/python benchmarks/warmup_cost.py
"""

from __future__ import annotations

import ctypes
import json
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "en_bench.jsonl"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2

    def report(tag: str) -> None:
        m, mb = libc.mallinfo2(), 1 << 20
        print(f"{tag}: RSS {rss()} MB, heap in use {m.uordblks // mb} MB, free but kept {m.fordblks // mb} MB",
              flush=True)

    t0 = time.perf_counter()
    import torch

    print(f"import torch: {time.perf_counter() - t0:.2f} s, RSS {rss()} MB")
    import voxserve
    from voxserve.families.piper.buckets import geometric_bucket

    torch.set_num_threads(1)
    t = time.perf_counter()
    v = voxserve.load_voice(device="cpu")
    print(f"load: {time.perf_counter() - t:.2f} s, RSS {rss()} MB")
    v.warmup()
    report("one warm-up sentence")
    r = v.runner
    clock = time.thread_time
    with torch.inference_mode():
        for n in (120, 200, 340, 500):
            b = geometric_bucket(n)
            x = r._zeros_synth(b)
            ts = []
            for _ in range(3):
                c = clock()
                r.stages.synth(x, single_item=False)
                ts.append(clock() - c)
            print(f"synth bucket {b}: first {ts[0]:.3f} s CPU, later {min(ts[1:]):.3f} s")
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    texts = [d["text"] for d in rows if d["category"] in ("short", "medium")]
    for k in range(2):
        for text in texts:
            v.synthesize(text)
        report(f"short+medium texts, pass {k + 1}")
    libc.malloc_trim(0)
    report("after malloc_trim")


if __name__ == "__main__":
    main()
