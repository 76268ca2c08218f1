"""`voxserve loadtest`: N concurrent clients against a TTS server on this machine.

Closed loop: each client sends a request, reads the whole response (timing the first body
byte and the last), and sends the next, until the request count or the time limit is reached.
Texts come from the benchmark corpus, chosen by category. Targets:
* `voxserve`: POST /v1/audio/speech (OpenAI shape), streamed raw PCM;
* `piper`: Piper's own server (`python -m piper.http_server`), POST /synthesize, a WAV file.
Only loopback addresses are allowed: this is a local benchmark, not a traffic generator.

Reports latency p50/p95/p99, time to first audio byte, audio seconds produced per wall second,
and errors, overall and per text category.
"""

from __future__ import annotations

import argparse
import http.client
import io
import ipaddress
import json
import random
import socket
import sys
import threading
import time
import wave
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlparse


@dataclass(frozen=True)
class LoadConfig:
    url: str = "http://127.0.0.1:8000"
    target: str = "voxserve"
    """voxserve or piper."""
    clients: int = 4
    requests: int = 40
    """Total timed requests (all clients together)."""
    duration_s: float = 120.0
    """Stop starting new requests after this many seconds."""
    categories: tuple[str, ...] = ("short", "medium")
    corpus: str = "corpus/en_bench.jsonl"
    response_format: str = "pcm"
    voice: str = "alloy"
    warmup: int = 2
    timeout_s: float = 300.0
    api_key: str | None = None

    def validate(self) -> "LoadConfig":
        if self.target not in ("voxserve", "piper"):
            raise ValueError("target must be voxserve or piper")
        if self.clients < 1 or self.requests < 1:
            raise ValueError("clients and requests must be at least 1")
        if self.duration_s <= 0:
            raise ValueError("duration must be positive")
        check_loopback(self.url)
        return self


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        raise ValueError(f"cannot resolve {host!r}") from None
    for a in addrs:
        if not ipaddress.ip_address(a.split("%")[0]).is_loopback:
            raise ValueError(f"{url}: loadtest only targets this machine (loopback addresses), not {a}")


@dataclass
class Result:
    category: str
    text_id: str
    status: int
    latency_s: float
    ttfa_s: float | None
    audio_s: float
    error: str = ""
    start_s: float = 0.0
    """When it was sent, in seconds after the timed run's start (the load over time: the start
    burst, the drain at the end)."""


def request_order(n_rows: int, seed: int = 0) -> list[int]:
    """The texts of requests 0, 1, 2, ...: a fixed shuffle of the rows, repeated. Request n gets
    row order[n % n_rows] whichever client sends it, so two runs of the same count (against two
    servers) send the same texts, and client timing cannot change the mix."""
    order = list(range(n_rows))
    random.Random(seed).shuffle(order)
    return order


def load_texts(path: str, categories) -> list[dict]:
    rows = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    rows = [r for r in rows if r["category"] in categories and r["text"].strip()]
    if not rows:
        raise ValueError(f"no texts of categories {', '.join(categories)} in {path}")
    return rows


def _request_parts(cfg: LoadConfig, text: str) -> tuple[str, bytes, dict]:
    headers = {"Content-Type": "application/json"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    if cfg.target == "piper":
        return "/synthesize", json.dumps({"text": text}).encode(), headers
    body = {"model": "tts-1", "input": text, "voice": cfg.voice, "response_format": cfg.response_format}
    return "/v1/audio/speech", json.dumps(body).encode(), headers


def _audio_seconds(cfg: LoadConfig, data: bytes, headers) -> float:
    if cfg.target == "piper" or cfg.response_format == "wav":
        if cfg.target == "voxserve":  # streaming WAV: sizes unknown; count the PCM after the header
            rate = int(headers.get("X-Sample-Rate") or 22050)
            return max(0, len(data) - 44) / 2 / rate
        with wave.open(io.BytesIO(data)) as w:
            return w.getnframes() / w.getframerate()
    if cfg.response_format == "pcm":
        rate = int(headers.get("X-Sample-Rate") or 22050)
        return len(data) / 2 / rate
    return 0.0  # compressed formats: not decoded here


def one_request(cfg: LoadConfig, conn_box: list, row: dict) -> Result:
    u = urlparse(cfg.url)
    path, body, headers = _request_parts(cfg, row["text"])
    t0 = time.perf_counter()
    ttfa = None
    try:
        if conn_box[0] is None:
            conn_box[0] = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=cfg.timeout_s)
        conn = conn_box[0]
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        chunks = []
        while True:
            b = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not b:
                break
            if ttfa is None:
                ttfa = time.perf_counter() - t0
            chunks.append(b)
        # read1 leaves a Content-Length answer (a 429's) open at its end: the connection would
        # refuse its next request (ResponseNotReady)
        resp.close()
        latency = time.perf_counter() - t0
        data = b"".join(chunks)
        if resp.status != 200:
            return Result(row["category"], row["id"], resp.status, latency, None, 0.0, data[:200].decode("utf-8", "replace"))
        return Result(row["category"], row["id"], 200, latency, ttfa, _audio_seconds(cfg, data, resp.headers))
    except (OSError, http.client.HTTPException) as e:
        if conn_box[0] is not None:
            conn_box[0].close()
        conn_box[0] = None
        return Result(row["category"], row["id"], 0, time.perf_counter() - t0, None, 0.0, f"{type(e).__name__}: {e}")


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(results: list[Result], wall_s: float) -> dict:
    def block(rs: list[Result]) -> dict:
        ok = [r for r in rs if r.status == 200]
        lat = [r.latency_s for r in ok]
        tt = [r.ttfa_s for r in ok if r.ttfa_s is not None]
        errors: dict[str, int] = {}
        for r in rs:
            if r.status != 200:
                errors[str(r.status)] = errors.get(str(r.status), 0) + 1
        audio = sum(r.audio_s for r in ok)
        return {
            "requests": len(rs), "ok": len(ok), "errors": errors,
            "latency_p50_s": percentile(lat, 0.5), "latency_p95_s": percentile(lat, 0.95),
            "latency_p99_s": percentile(lat, 0.99), "latency_mean_s": sum(lat) / len(lat) if lat else None,
            "ttfa_p50_s": percentile(tt, 0.5), "ttfa_p95_s": percentile(tt, 0.95),
            "audio_s": audio, "audio_s_per_s": audio / wall_s if wall_s > 0 else None,
        }

    out = {"wall_s": wall_s, "all": block(results), "by_category": {}}
    for cat in sorted({r.category for r in results}):
        out["by_category"][cat] = block([r for r in results if r.category == cat])
    return out


def run_load(cfg: LoadConfig) -> dict:
    """Run the load test; returns the summary dict (and the config)."""
    cfg.validate()
    rows = load_texts(cfg.corpus, cfg.categories)
    # warm-up, untimed: first requests pay for lazy initialisation on either server
    box: list = [None]
    for k in range(cfg.warmup):
        one_request(cfg, box, rows[k % len(rows)])
    if box[0] is not None:
        box[0].close()

    order = request_order(len(rows))
    lock = threading.Lock()
    counter = {"next": 0}
    results: list[Result] = []
    t_start = time.perf_counter()
    deadline = t_start + cfg.duration_s

    def client() -> None:
        conn: list = [None]
        while True:
            with lock:
                n = counter["next"]
                if n >= cfg.requests or time.perf_counter() >= deadline:
                    break
                counter["next"] += 1
            sent = time.perf_counter() - t_start
            r = replace(one_request(cfg, conn, rows[order[n % len(rows)]]), start_s=sent)
            with lock:
                results.append(r)
        if conn[0] is not None:
            conn[0].close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(cfg.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(cfg.duration_s + cfg.timeout_s)
    wall = time.perf_counter() - t_start
    summary = summarize(list(results), wall)
    # each request, in the order they finished: for distributions beyond the percentiles
    summary["requests"] = [asdict(r) for r in results]
    summary["config"] = asdict(cfg) | {"api_key": "***" if cfg.api_key else None}
    return summary


def _fmt(x, unit="s") -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if unit == "s" else f"{x:.2f}"


def print_summary(s: dict, file=sys.stdout) -> None:
    cfg = s["config"]
    print(f"{cfg['target']} at {cfg['url']}: {cfg['clients']} clients, {s['all']['requests']} requests "
          f"in {s['wall_s']:.1f} s", file=file)
    print(f"{'':8} {'n':>4} {'err':>4} {'p50':>9} {'p95':>9} {'p99':>9} {'ttfa50':>9} {'ttfa95':>9} {'audio s/s':>9}", file=file)
    for name, b in [("all", s["all"])] + sorted(s["by_category"].items()):
        err = sum(b["errors"].values())
        print(f"{name:8} {b['requests']:>4} {err:>4} {_fmt(b['latency_p50_s']):>9} {_fmt(b['latency_p95_s']):>9} "
              f"{_fmt(b['latency_p99_s']):>9} {_fmt(b['ttfa_p50_s']):>9} {_fmt(b['ttfa_p95_s']):>9} "
              f"{_fmt(b['audio_s_per_s'], ''):>9}", file=file)


def cmd_loadtest(ns: argparse.Namespace) -> int:
    cfg = LoadConfig(url=ns.url, target=ns.target, clients=ns.clients, requests=ns.requests, duration_s=ns.duration,
                     categories=tuple(c.strip() for c in ns.categories.split(",") if c.strip()), corpus=ns.corpus,
                     response_format=ns.format, voice=ns.voice, warmup=ns.warmup, api_key=ns.api_key)
    s = run_load(cfg)
    print_summary(s)
    if ns.json:
        Path(ns.json).write_text(json.dumps(s, indent=2), encoding="utf-8")
    return 0 if s["all"]["ok"] == s["all"]["requests"] else 1


def add_parser(sub) -> None:
    d = LoadConfig()
    p = sub.add_parser("loadtest", help="concurrent clients against a TTS server on this machine",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=d.url, help=f"server base URL, loopback only (default {d.url})")
    p.add_argument("--target", choices=["voxserve", "piper"], default=d.target,
                   help="voxserve (/v1/audio/speech) or piper (python -m piper.http_server: /synthesize)")
    p.add_argument("-c", "--clients", type=int, default=d.clients, help=f"concurrent clients (default {d.clients})")
    p.add_argument("-n", "--requests", type=int, default=d.requests, help=f"timed requests in all (default {d.requests})")
    p.add_argument("--duration", type=float, default=d.duration_s, help=f"time limit in seconds (default {d.duration_s:g})")
    p.add_argument("--categories", default=",".join(d.categories), help="corpus categories (short,medium,long,stress)")
    p.add_argument("--corpus", default=d.corpus, help=f"JSONL corpus (default {d.corpus})")
    p.add_argument("--format", default=d.response_format, choices=["pcm", "wav", "mp3", "opus", "flac"],
                   help="voxserve response_format (default pcm)")
    p.add_argument("--voice", default=d.voice)
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed requests first")
    p.add_argument("--api-key", default=None)
    p.add_argument("--json", help="also write the summary to this file")
    p.set_defaults(func=cmd_loadtest)
