"""`voxserve loadtest`: statistics, loopback guard, and a request mix that timing cannot change
(the end-to-end run against a real server is in tests/serve/test_server_e2e.py)."""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import pytest

from voxserve import loadtest
from voxserve.loadtest import LoadConfig, Result, check_loopback, percentile, run_load, summarize


def test_percentile_interpolates():
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([4.0, 1.0, 2.0, 3.0], 0.5) == 2.5
    assert percentile(list(map(float, range(101))), 0.95) == pytest.approx(95.0)


def test_summarize_counts_errors_and_audio_per_second():
    rs = [Result("short", "a", 200, 0.1, 0.05, 2.0), Result("short", "b", 200, 0.3, 0.1, 4.0),
          Result("medium", "c", 429, 0.01, None, 0.0, "busy")]
    s = summarize(rs, wall_s=2.0)
    assert s["all"]["requests"] == 3 and s["all"]["ok"] == 2 and s["all"]["errors"] == {"429": 1}
    assert s["all"]["audio_s_per_s"] == pytest.approx(3.0)
    assert s["all"]["latency_p50_s"] == pytest.approx(0.2)  # errors are not latencies
    assert s["by_category"]["medium"]["ok"] == 0


def test_only_loopback_targets():
    check_loopback("http://127.0.0.1:8000")
    check_loopback("http://localhost:8000")
    with pytest.raises(ValueError, match="loopback"):
        check_loopback("http://10.1.2.3:8000")
    with pytest.raises(ValueError, match="loopback"):
        LoadConfig(url="http://192.0.2.1:80").validate()


@pytest.fixture
def corpus20(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{"id": f"t{k}", "category": "short" if k % 2 else "medium", "text": f"text {k}"} for k in range(20)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_request_mix_does_not_depend_on_timing(corpus20, monkeypatch):
    """Every run of N requests sends the same texts, however the clients' requests interleave,
    so two servers are compared on the same work (each text twice for 40 requests of 20)."""
    seen: list[list[str]] = []

    def fake_request(cfg, conn_box, row):
        time.sleep(random.random() * 0.004)  # clients finish in a random order
        seen[-1].append(row["id"])
        return Result(row["category"], row["id"], 200, 0.001, 0.001, 1.0)

    monkeypatch.setattr(loadtest, "one_request", fake_request)
    for clients in (1, 3, 8):
        seen.append([])
        s = run_load(LoadConfig(clients=clients, requests=40, corpus=corpus20, warmup=0,
                                categories=("short", "medium")))
        assert s["all"]["ok"] == 40 and len(s["requests"]) == 40
        assert Counter(seen[-1]) == {f"t{k}": 2 for k in range(20)}
        starts = [r["start_s"] for r in s["requests"]]  # when each was sent, within the run
        assert all(0.0 <= t <= s["wall_s"] for t in starts) and max(starts) > 0.0
    # the first requests are a spread of the corpus, not its first rows
    first = [loadtest.request_order(20)[n] for n in range(10)]
    assert sorted(first) != list(range(10))


def test_a_refused_request_does_not_break_the_clients_next_one():
    """A 429 with a Content-Length body, then a 200 on the same kept-alive connection: the
    client read the refusal to its end without closing the response, and its next request
    failed with status 0 (ResponseNotReady) on every 429 of a loaded benchmark."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answers = iter([(429, b'{"error": "busy"}'), (200, b"\x00\x00" * 2205)])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            status, body = next(answers)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Sample-Rate", "22050")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = LoadConfig(url=f"http://127.0.0.1:{server.server_port}", timeout_s=10).validate()
        box = [None]
        row = {"category": "short", "id": "s1", "text": "Hello."}
        first, second = loadtest.one_request(cfg, box, row), loadtest.one_request(cfg, box, row)
    finally:
        server.shutdown()
        server.server_close()
    assert first.status == 429
    assert second.status == 200, second.error
    assert second.audio_s == pytest.approx(0.1)
