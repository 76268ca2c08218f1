#!/usr/bin/env python3
"""Plain `voxserve serve` against `voxserve serve --ray`, side by side in one run, on CPUs:

* serve      one process, 2 model threads
* ray 1x2    Ray Serve, 1 replica of 2 CPUs
* ray 2x1    Ray Serve, 2 replicas of 1 CPU each

Per arm: start-up time to /ready; what Ray adds per request (sequential GET /health, and one
short sentence at a time); 8 closed-loop clients (`voxserve.loadtest`, short and medium texts,
the same requests in every arm, all admitted):
audio seconds per wall second, p50/p95 latency, errors; RSS summed over the server's whole
process tree (Ray's GCS, raylet, controller, proxy and replicas included), idle and at its peak
under load. Arms run one after the other, each alone on the machine; the load average is
recorded before and after each.

Ray binds to the host's address whatever it is told: run it where only loopback exists,
    unshare --net -- sh -c 'ip link set lo up && python benchmarks/ray_vs_serve.py --out rvs.json'
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "serve": ["--threads", "2"],
    "ray 1x2": ["--ray", "--replicas", "1", "--threads", "2"],
    "ray 2x1": ["--ray", "--replicas", "2", "--threads", "1"],
}
COMMON = ["--max-queue-wait-s", "3600"]
"""Every request admitted in every arm: the load is the same work for each, and a 429 (whose
bound follows the measured speed of a machine that others share) never stands in for one."""
SHORT = "Your order is ready for pickup."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss_mb(root: int) -> tuple[float, int]:
    """RSS (MB) summed over `root` and all its descendants, and how many processes."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            pages = int(Path(f"/proc/{d}/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
        rss[int(d)] = pages
    todo, seen = [root], []
    while todo:
        p = todo.pop()
        if p in rss:
            seen.append(p)
        todo.extend(children.get(p, ()))
    return sum(rss[p] for p in seen) * os.sysconf("SC_PAGE_SIZE") / 2**20, len(seen)


def timed(client: httpx.Client, n: int, method: str, path: str, **kw) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = client.request(method, path, **kw)
        r.raise_for_status()
        out.append(time.perf_counter() - t)
    return out


def run_arm(name: str, flags: list[str], requests: int, home: str) -> dict:
    from voxserve.loadtest import LoadConfig, run_load

    port = free_port()
    env = {**os.environ, "HOME": home, "RAY_TMPDIR": tempfile.mkdtemp(prefix="vxr-", dir="/tmp"),
           "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "voxserve", "serve", "--device", "cpu", "--port", str(port), *COMMON, *flags]
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=url, timeout=httpx.Timeout(300.0, connect=10.0))
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name}: the server exited with {proc.returncode}")
            try:
                if client.get("/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: not ready in 600 s")
            time.sleep(0.5)
        start_s = time.monotonic() - t0
        time.sleep(5)  # let the start-up's stragglers settle before the idle figure
        idle_mb, procs = tree_rss_mb(proc.pid)
        health = timed(client, 50, "GET", "/health")
        body = {"text": SHORT, "response_format": "pcm"}
        timed(client, 3, "POST", "/v1/synthesize", json=body)  # warm the path
        short = timed(client, 10, "POST", "/v1/synthesize", json=body)

        peak = [idle_mb]
        stop = threading.Event()

        def sample():
            while not stop.wait(1.0):
                peak[0] = max(peak[0], tree_rss_mb(proc.pid)[0])

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = run_load(LoadConfig(url=url, clients=8, requests=requests, duration_s=1800,
                                   corpus=str(ROOT / "corpus" / "en_bench.jsonl")))
        stop.set()
        sampler.join(5)
        load.pop("requests", None)
        return {
            "arm": name, "flags": flags, "start_s": start_s, "processes": procs,
            "rss_idle_mb": idle_mb, "rss_peak_mb": peak[0],
            "health_p50_ms": statistics.median(health) * 1e3,
            "short_p50_ms": statistics.median(short) * 1e3,
            "load": load["all"], "wall_s": load["wall_s"],
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        }
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def table(rows: list[dict]) -> str:
    out = ["| arm | start s | processes | RSS idle MB | RSS peak MB | /health p50 ms | 1 short sentence p50 ms "
           "| 8 clients: audio s/s | p50 s | p95 s | errors | load avg before/after |",
           "| :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- | :--- |"]
    for r in rows:
        ld = r["load"]
        out.append(f"| {r['arm']} | {r['start_s']:.0f} | {r['processes']} | {r['rss_idle_mb']:.0f} | "
                   f"{r['rss_peak_mb']:.0f} | {r['health_p50_ms']:.1f} | {r['short_p50_ms']:.0f} | "
                   f"{ld['audio_s_per_s']:.2f} | {ld['latency_p50_s']:.2f} | {ld['latency_p95_s']:.2f} | "
                   f"{ld['errors'] or '-'} | {r['loadavg_before'][0]:.2f} / {r['loadavg_after'][0]:.2f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON of every figure")
    ap.add_argument("--requests", type=int, default=40, help="requests per arm at 8 clients (the same texts in each)")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of: " + ", ".join(ARMS))
    ns = ap.parse_args()
    home = tempfile.mkdtemp(prefix="vxr-home-")  # Ray writes its token to ~/.ray
    rows = []
    for name in ns.arms.split(","):
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run_arm(name, ARMS[name], ns.requests, home))
        Path(ns.out).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
