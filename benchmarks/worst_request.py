"""Peak RSS of `voxserve serve` under the largest requests its limits admit.

Starts a server on a free loopback port, reads its RSS at /ready, then sends each request of a
fixed list one at a time (the biggest a client can ask for within --max-input-chars and the
option ranges, and a few the limits refuse) and reads the server's peak RSS (VmHWM) after each.

    python benchmarks/worst_request.py [--voice en_US-joe-medium] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PROSE = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
         "of foolishness, it was the epoch of belief, it was the epoch of incredulity. ")


def text_of(chars: int, unit: str) -> str:
    return (unit * (chars // len(unit) + 1))[:chars].rsplit(" ", 1)[0]


def cases(max_chars: int) -> list[tuple[str, str, dict]]:
    prose = text_of(max_chars, PROSE)
    slow = {"speed": 0.25, "noise_w": 1.5, "noise_scale": 2.0, "seed": 1}
    return [
        ("max prose, slowest, whole wav", "/v1/synthesize", {"text": prose, **slow, "response_format": "wav"}),
        ("max prose, slowest, 10 s gaps, whole wav", "/v1/synthesize",
         {"text": prose, **slow, "sentence_silence": 10.0, "response_format": "wav"}),
        ("max prose, slowest, streamed flac", "/v1/synthesize",
         {"text": prose, **slow, "response_format": "flac", "stream": True}),
        ("max short sentences, 10 s gaps (refused)", "/v1/synthesize",
         {"text": text_of(max_chars, "Go. "), "sentence_silence": 10.0, "response_format": "wav"}),
        ("one unbroken 4096-char word run, slowest", "/v1/synthesize",
         {"text": text_of(max_chars, "la "), **slow, "response_format": "pcm"}),
        ("OpenAI route, max prose at 0.25x", "/v1/audio/speech",
         {"model": "tts-1", "voice": "alloy", "input": prose, "speed": 0.25, "response_format": "mp3"}),
    ]


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--voice", default="en_US-joe-medium")
    ap.add_argument("--max-input-chars", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    port = free_port()
    exe = Path(sys.executable).with_name("voxserve")
    proc = subprocess.Popen([str(exe), "serve", "--device", "cpu", "--port", str(port), "--voice", a.voice,
                             "--max-input-chars", str(a.max_input_chars)],
                            stdout=subprocess.DEVNULL, stderr=(log := tempfile.TemporaryFile()))
    rows = []
    try:
        base = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        with httpx.Client(base_url=base, timeout=a.timeout) as c:
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"server exited: {log.read().decode(errors='replace')[-2000:]}")
                try:
                    if c.get("/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > 300:
                    raise SystemExit("server not ready after 300 s")
                time.sleep(0.5)
            ready_s = time.monotonic() - t0
            rss0 = status_kb(proc.pid, "VmRSS")
            print(f"ready in {ready_s:.1f} s, RSS {rss0 / 1024:.0f} MB ({platform.processor() or platform.machine()}, "
                  f"{os.cpu_count()} CPUs)", flush=True)
            print("| request | status | audio bytes | seconds | RSS after (MB) | peak RSS so far (MB) |")
            print("|---|---|---|---|---|---|")
            for name, route, body in cases(a.max_input_chars):
                t = time.monotonic()
                n = 0
                with c.stream("POST", route, json=body) as r:
                    for chunk in r.iter_bytes():
                        n += len(chunk)
                    status = r.status_code
                dt = time.monotonic() - t
                row = {"request": name, "status": status, "bytes": n, "seconds": round(dt, 1),
                       "rss_mb": round(status_kb(proc.pid, "VmRSS") / 1024), "peak_mb": round(status_kb(proc.pid, "VmHWM") / 1024)}
                rows.append(row)
                print(f"| {name} | {status} | {n} | {dt:.1f} | {row['rss_mb']} | {row['peak_mb']} |", flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if a.json:
        Path(a.json).write_text(json.dumps({"ready_s": ready_s, "rss_ready_mb": round(rss0 / 1024), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
