"""One Ray cluster, all the Ray Serve checks, results as JSON (tests/ray/test_ray_serve.py runs
this inside a network namespace holding only `lo`, and asserts on what it writes).

Steps: references by direct library synthesis; `voxserve serve --ray --replicas 2 --threads 1`
(a local cluster, 2 CPU replicas of 1 CPU each); 16 concurrent requests; a load during which one
replica's process is SIGKILLed; Serve's replacement of it; the command's shutdown (SIGTERM).
Every request has a timeout; the caller holds a hard timeout over the whole run.

    python tests/ray/ray_cluster_check.py --out result.json [--port P]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = httpx.Timeout(120.0, connect=10.0)
DET = {"noise_scale": 0, "noise_w": 0}
_SEEN_LOCK = threading.Lock()


def interfaces() -> list[str]:
    """This network namespace's interfaces (/proc/net/dev is per namespace; /sys/class/net is
    the host's unless sysfs is mounted again)."""
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    return sorted(line.split(":", 1)[0].strip() for line in lines)


def texts_from_corpus() -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in (ROOT / "corpus" / "en_bench.jsonl").read_text().splitlines() if line.strip()]
    short = [r["text"] for r in rows if r["category"] in ("short", "medium")]
    long = [r["text"] for r in rows if r["category"] == "medium"]  # a few sentences each
    return short, long


def references(texts: list[str]) -> dict[str, np.ndarray]:
    """int16 PCM of each text by `voice.synthesize` with deterministic options."""
    import voxserve
    from voxserve.audio import float_to_int16

    voice = voxserve.load_voice(device="cpu")
    return {t: float_to_int16(voice.synthesize(t, voxserve.DETERMINISTIC).samples) for t in set(texts)}


def same_pcm(got: bytes, ref: np.ndarray) -> bool:
    sys.path.insert(0, str(ROOT / "tests"))
    from audio_compare import PCM_ATOL

    pcm = np.frombuffer(got[: len(got) // 2 * 2], dtype="<i2")
    return len(pcm) == len(ref) and int(np.abs(pcm.astype(np.int32) - ref.astype(np.int32)).max()) <= PCM_ATOL


def call(client: httpx.Client, text: str, stream: bool, seen: dict | None = None, active: dict | None = None) -> dict:
    """One request; what came back (status, replica, bytes, or how it failed). `seen` counts
    the responses each replica started, `active` those still being read."""
    out = {"text": text, "status": None, "replica": None, "retried": None, "bytes": b"", "error": None,
           "complete": False}
    body = {"text": text, "response_format": "pcm", "stream": stream, **DET}
    try:
        with client.stream("POST", "/v1/synthesize", json=body) as r:
            out["status"], out["replica"] = r.status_code, r.headers.get("x-voxserve-replica")
            out["retried"] = r.headers.get("x-voxserve-retried")
            if seen is not None and out["replica"]:
                with _SEEN_LOCK:
                    seen[out["replica"]] = seen.get(out["replica"], 0) + 1
                    if active is not None:
                        active[out["replica"]] = active.get(out["replica"], 0) + 1
            data = bytearray()
            try:
                for chunk in r.iter_bytes():
                    data += chunk
            finally:
                if active is not None and out["replica"]:
                    with _SEEN_LOCK:
                        active[out["replica"]] -= 1
            out["bytes"], out["complete"] = bytes(data), True
    except httpx.HTTPError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def summary(res: dict, refs: dict) -> dict:
    body = res["bytes"]
    s = {k: res[k] for k in ("status", "replica", "retried", "error", "complete")}
    s["text"] = res["text"][:40]
    s["equal"] = res["status"] == 200 and res["complete"] and same_pcm(body, refs[res["text"]])
    if res["status"] is not None and res["status"] != 200:
        try:
            s["message"] = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            s["message"] = body[:200].decode("utf-8", "replace")
    return s


def wait_until(pred, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:g} s")


def processes_naming(text: str) -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                pass
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--temp", required=True, help="Ray's temp dir (keep it short: socket paths are bounded)")
    ns = ap.parse_args()
    result: dict = {"interfaces": interfaces()}
    t0 = time.monotonic()
    short, long = texts_from_corpus()
    burst = [short[k % len(short)] for k in range(16)]
    load = [long[k % len(long)] for k in range(16)]
    refs = references(burst + load)
    result["references_s"] = round(time.monotonic() - t0, 1)

    # the command users run; no time bound on admission, so any failure is the kill's
    cmd = [sys.executable, "-m", "voxserve", "serve", "--ray", "--replicas", "2", "--threads", "1",
           "--device", "cpu", "--max-queue-wait-s", "3600", "--port", str(ns.port)]
    log = open(Path(ns.temp) / "serve.log", "w+")
    t1 = time.monotonic()
    server = subprocess.Popen(cmd, env={**os.environ, "RAY_TMPDIR": ns.temp}, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{ns.port}", timeout=TIMEOUT)
    try:
        def serving():  # printed once serve.run has returned: both replicas are up and warm
            if server.poll() is not None:
                raise RuntimeError(f"voxserve serve --ray exited with {server.returncode}")
            log.seek(0)
            return "voxserve: serving" in log.read()

        wait_until(serving, 180, "voxserve serve --ray serving")
        wait_until(lambda: client.get("/ready").status_code == 200, 60, "/ready through the proxy")
        result["start_s"] = round(time.monotonic() - t1, 1)

        # 16 concurrent requests (whole files and streams): all 200 and equal to the references
        seen: dict = {}
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda k: call(client, burst[k], k % 2 == 0, seen), range(16)))
        result["burst"] = [summary(g, refs) for g in got]
        result["burst_replicas"] = seen

        # load on both replicas, then one replica's process is killed while it streams
        seen, active = {}, {}

        def streaming_on_both():
            with _SEEN_LOCK:
                busy = sorted(r for r, n in active.items() if n > 0)
                return busy[0] if len(seen) >= 2 and busy else None

        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(call, client, load[k], True, seen, active) for k in range(16)]
            victim = wait_until(streaming_on_both, 120, "streams started on both replicas", every=0.05)
            with _SEEN_LOCK:
                result["streaming_on_victim_at_kill"] = active[victim]
                os.kill(int(victim.rsplit("/", 1)[1]), signal.SIGKILL)
            result["killed"] = victim
            got = [f.result() for f in futures]
        result["load"] = [summary(g, refs) for g in got]

        # Serve replaces the replica: a new one answers, then both the survivor and it do
        old = set(result["burst_replicas"]) | {g["replica"] for g in got if g["replica"]}
        answered: set = set()

        def new_replica():
            r = call(client, burst[0], False)
            if r["status"] == 200:
                answered.add(r["replica"])
            return next((n for n in answered if n not in old), None)

        t2 = time.monotonic()
        result["replacement"] = wait_until(new_replica, 120, "a replacement replica answering")
        wait_until(lambda: new_replica() and len(answered - {victim}) >= 2, 60, "2 replicas answering again",
                   every=0.1)
        result["answering_after"] = sorted(answered)
        result["replaced_s"] = round(time.monotonic() - t2, 1)
        result["ray_processes_running"] = processes_naming(ns.temp)
    finally:
        client.close()
        t3 = time.monotonic()
        server.send_signal(signal.SIGTERM)  # the command's own shutdown: serve.shutdown, ray.shutdown
        try:
            result["server_exit"] = server.wait(90)
        except subprocess.TimeoutExpired:
            server.kill()
            result["server_exit"] = f"killed after 90 s: {server.wait(10)}"
        result["shutdown_s"] = round(time.monotonic() - t3, 1)
        log.seek(0)
        result["server_log_tail"] = log.read()[-3000:]
        log.close()
        result["total_s"] = round(time.monotonic() - t0, 1)
        Path(ns.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
