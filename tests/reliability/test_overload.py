"""Admission by time under overload: a real `voxserve serve` subprocess on a free loopback port,
64 clients in a closed loop sending short and medium texts to a server whose queue-wait bound
is small, so that the offered load is several times what the CPU can do. Traffic goes to
127.0.0.1 only, bounded in count and time (every request has a timeout; the server is stopped)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_process import ServerProcess

BOUND_S = 3.0  # --max-queue-wait-s
CLIENTS = 64
LOAD_S = 20.0  # how long the clients keep sending
# The wait is an estimate from a measured speed that drifts on a 2-core machine: single requests
# waited up to 3 s past the promise (docs/reliability.md has the runs); without admission they
# wait for most of LOAD_S
TOLERANCE_S = 2 * BOUND_S
LANES = 2  # batches the server's CPU runs at once (2 vCPUs; fewer threads only loosen the bound below)


@pytest.fixture(scope="module")
def server():
    s = ServerProcess(["--voice", "en_US-joe-medium", "--max-queue-wait-s", str(BOUND_S)])
    yield s
    s.stop()


def _post(client: httpx.Client, text: str) -> tuple[int, float, httpx.Response]:
    t0 = time.monotonic()
    r = client.post("/v1/synthesize", json={"text": text, "response_format": "pcm", "stream": False})
    return r.status_code, time.monotonic() - t0, r


@pytest.mark.slow
def test_64_clients_get_200_or_429_and_accepted_ones_wait_within_the_bound(server, corpus):
    texts = [r["text"] for r in corpus if r["category"] == "short"][:4]
    texts += [r["text"] for r in corpus if r["category"] == "medium"][:4]
    # the lanes' kernels for these shapes at one thread (a server's first minutes run them cold)
    with ThreadPoolExecutor(len(texts)) as pool:
        codes = [code for code, _, _ in pool.map(lambda t: _post(server.client, t), texts * 2)]
    assert set(codes) <= {200, 429} and 200 in codes, codes
    # each text's time alone (its own synthesis, HTTP included), the best of two on the idle server
    alone = []
    for t in texts:
        runs = [_post(server.client, t) for _ in range(2)]
        assert all(code == 200 for code, _, _ in runs)
        alone.append(min(s for _, s, _ in runs))

    results: list[tuple[int, int, float, str | None]] = []  # (text, status, seconds, retry-after)
    lock = threading.Lock()
    stop_at = time.monotonic() + LOAD_S

    def client(k: int) -> None:
        with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60.0, connect=10.0)) as c:
            n = k
            while time.monotonic() < stop_at:
                i = n % len(texts)
                n += 3
                try:
                    code, secs, r = _post(c, texts[i])
                except httpx.TimeoutException:
                    code, secs, r = -1, 60.0, None
                retry = r.headers.get("retry-after") if r is not None else None
                with lock:
                    results.append((i, code, secs, retry))
                if code == 429:  # a well-behaved client: back off as told, within the test's window
                    time.sleep(min(float(retry), max(0.0, stop_at - time.monotonic())))

    t0 = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    elapsed = time.monotonic() - t0

    codes = [code for _, code, _, _ in results]
    accepted = [(i, secs) for i, code, secs, _ in results if code == 200]
    waits = sorted(secs - alone[i] for i, secs in accepted)
    refused = codes.count(429)
    p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else 0.0
    offered = sum(alone[i] for i, _, _, _ in results) / elapsed  # seconds of work asked per second
    print(f"\noverload: {CLIENTS} clients for {elapsed:.1f} s, offered {offered:.1f}x what the server does alone, "
          f"bound {BOUND_S:g} s: {len(accepted)} accepted, "
          f"{refused} refused (429), other {len(codes) - len(accepted) - refused}; "
          f"accepted wait (time to response - time alone) max {waits[-1]:.2f} s, p95 {p95:.2f} s, "
          f"median {waits[len(waits) // 2]:.2f} s; time alone {min(alone):.2f}-{max(alone):.2f} s")
    worst_by_text = {i: max((secs - alone[i] for j, secs in accepted if j == i), default=None) for i in range(len(texts))}
    print("per text: (chars, time alone, accepted, worst wait):",
          [(len(t), round(alone[i], 2), sum(1 for j, _ in accepted if j == i),
            None if worst_by_text[i] is None else round(worst_by_text[i], 2)) for i, t in enumerate(texts)])

    assert set(codes) <= {200, 429}, sorted(set(codes))  # no 5xx, no timeouts
    assert refused > 0 and accepted
    for _, code, _, retry in results:
        if code == 429:
            assert retry is not None and 1 <= int(retry) <= 60
    # queue wait (time to response - time alone) <= the bound + the request's own synthesis time
    # under load (the admission rule's deadline): its sentences run on one of the CPU's lanes, a
    # share of the threads, not on all of them as alone
    worst = max((secs - alone[i], i) for i, secs in accepted)
    assert worst[0] <= BOUND_S + LANES * alone[worst[1]] + TOLERANCE_S, (worst, alone)
    assert p95 <= BOUND_S + LANES * max(alone) + 1.0, (p95, alone)  # most keep the promise
    # the server is healthy afterwards
    assert server.client.get("/health").status_code == 200
    assert _post(server.client, texts[0])[0] == 200
