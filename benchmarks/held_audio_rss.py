"""RSS of a server given 12 whole answers of SSML silence at once (issue 49, item 7).

    PYTHONPATH=src python benchmarks/held_audio_rss.py [--max-held-audio-mb MB] [--n 12]

Starts `voxserve serve` (the default voice, loopback, a free port) under an address-space cap,
waits for /ready, then sends N requests at once to /v1/synthesize (a whole WAV, not streamed) of
`<speak>hi` + `<break time="10s"/>` x 179 + `bye</speak>` (3.4 KB, 1790 s of audio), sampling
the server's RSS every 20 ms. Prints the statuses, RSS at /ready and the peak. A large
--max-held-audio-mb (e.g. 1000000) gives the behaviour before the budget existed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

SSML = "<speak>hi" + '<break time="10s"/>' * 179 + "bye</speak>"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-held-audio-mb", type=float, default=None)
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--as-bytes", default="8000000000")
    a = ap.parse_args()
    port = free_port()
    cmd = ["prlimit", f"--as={a.as_bytes}", "--", sys.executable, "-m", "voxserve", "serve", "--port", str(port),
           "--max-queue-wait", "3600"]
    if a.max_held_audio_mb is not None:
        cmd += ["--max-held-audio-mb", str(a.max_held_audio_mb)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(base + "/ready", timeout=1).status == 200:
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        else:
            raise SystemExit("the server did not get ready")
        # the server process: prlimit execs python, which may re-exec itself with jemalloc (same pid)
        pid = server.pid
        at_ready = rss_mb(pid)
        peak = [at_ready]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], rss_mb(pid))
                except OSError:
                    return
                time.sleep(0.02)

        statuses: list[int] = []
        sizes: list[int] = []
        errors: set[str] = set()

        def go():
            body = json.dumps({"text": SSML, "response_format": "wav"}).encode()
            req = urllib.request.Request(base + "/v1/synthesize", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    sizes.append(len(r.read()))
                    statuses.append(r.status)
            except urllib.error.HTTPError as e:
                statuses.append(e.code)
                errors.add(json.loads(e.read())["error"]["message"][:160])

        t = threading.Thread(target=sample)
        t.start()
        t0 = time.perf_counter()
        clients = [threading.Thread(target=go) for _ in range(a.n)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        took = time.perf_counter() - t0
        stop.set()
        t.join()
        print(json.dumps({"max_held_audio_mb": a.max_held_audio_mb, "statuses": sorted(statuses),
                          "wav_mb": sorted({round(s / 1e6, 1) for s in sizes}), "rss_at_ready_mb": round(at_ready),
                          "peak_rss_mb": round(peak[0]), "seconds": round(took, 1),
                          "alive": server.poll() is None, "errors": sorted(errors)}))
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
