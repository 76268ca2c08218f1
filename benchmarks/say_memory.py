"""Peak RSS and wall time of `voxserve say` against the length of the text (issue 18).

Each run is a fresh process under /usr/bin/time -v ("Maximum resident set size"). Texts are
the English bench corpus (corpus/en_bench.jsonl) repeated to one sentence, 4, 20 and 40 KB.

Arms:
  cli      `voxserve say -f TEXT -o OUT.wav --device cpu` (today's defaults)
  before   the same work in a script (`Voice.stream`, as cmd_say does) with
           Transforms(cpu_decode_frames=None): decoder runs of up to 4096 frames, the
           default before the CPU cap; `after` is the same script with the defaults.

    .venv/bin/python benchmarks/say_memory.py                  # cli arm, every size
    .venv/bin/python benchmarks/say_memory.py --arms before after --sizes 1 4 40
    .venv/bin/python benchmarks/say_memory.py --sizes 1 40 --rounds 3   # the issue's ratio

With --rounds N the sizes run interleaved N times (a process's peak varies by ~30 MB from run
to run) and the medians and each size's ratio to the one-sentence median are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

SCRIPT = """
import sys, voxserve
from voxserve.families.piper.loader import load_piper_voice
from voxserve.families.piper.options import Transforms
from voxserve.limits import Limits
from voxserve.voices.registry import resolve_voice
if sys.argv[2] == "before":
    src = resolve_voice(None)
    v = load_piper_voice(src.path, src.config_path, name=src.name, device="cpu", transforms=Transforms(cpu_decode_frames=None))
    v.limits = Limits(max_audio_seconds=None)
else:
    v = voxserve.load_voice(None, device="cpu", limits=Limits(max_audio_seconds=None))  # as cmd_say
n = sum(len(c.samples) for c in v.stream(open(sys.argv[1]).read()))
print(f"audio_s={n / v.sample_rate:.0f}", file=sys.stderr)
"""


def make_text(kb: int) -> str:
    texts = [json.loads(line)["text"] for line in open(ROOT / "corpus/en_bench.jsonl")]
    if kb <= 1:
        return "The weather today is mostly sunny, with a light breeze from the west.\n"
    prose = " ".join(t if t.rstrip()[-1:] in ".!?" else t + "." for t in texts)
    s = ""
    while len(s) < kb * 1000:
        s += prose + "\n\n"
    return s[: kb * 1000].rsplit(".", 1)[0] + ".\n"


def measure(arm: str, path: str, out: str) -> dict:
    if arm == "cli":
        cmd = [str(BIN / "voxserve"), "say", "-f", path, "-o", out, "--device", "cpu"]
    else:
        cmd = [sys.executable, "-c", SCRIPT, path, arm]
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(p.stderr[-2000:])
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    return {"peak_rss_mb": round(rss / 1024), "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=["cli"], choices=["cli", "before", "after"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[1, 4, 20, 40], help="KB; 1 = one sentence")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved runs of every size and arm")
    ns = ap.parse_args()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"# {cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print("| arm | text | peak RSS (MB) | wall (s) |\n|---|---|---:|---:|")
    peaks: dict[tuple[str, int], list[int]] = {}
    with tempfile.TemporaryDirectory() as d:
        for kb in ns.sizes:
            Path(d, f"t{kb}.txt").write_text(make_text(kb), encoding="utf-8")
        for _ in range(ns.rounds):
            for kb in ns.sizes:
                for arm in ns.arms:
                    r = measure(arm, os.path.join(d, f"t{kb}.txt"), os.path.join(d, "out.wav"))
                    peaks.setdefault((arm, kb), []).append(r["peak_rss_mb"])
                    label = "1 sentence" if kb <= 1 else f"{kb} KB"
                    print(f"| {arm} | {label} | {r['peak_rss_mb']} | {r['wall_s']} |", flush=True)
    if ns.rounds > 1:
        for arm in ns.arms:
            med = {kb: statistics.median(peaks[arm, kb]) for kb in ns.sizes}
            one = med.get(min(ns.sizes))
            print(f"# {arm}: median peak RSS (MB) " + ", ".join(
                f"{kb} KB {m:.0f} ({m / one:.2f}x)" for kb, m in med.items()))
    print(f"# load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
