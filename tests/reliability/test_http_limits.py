"""Slow and vanishing clients against a real server (raw sockets to 127.0.0.1, every wait
bounded): read timeouts close slow connections, the connection bound answers 503, and clients
that disconnect are counted as such (499), never as server errors (500)."""

from __future__ import annotations

import json
import re
import selectors
import socket
import threading
import time

import httpx

SLACK_S = 5.0  # a shared 2-core machine may run the server's event loop late


def request_counts(server) -> dict[tuple[str, str], float]:
    """voxserve_requests_total by (route, status)."""
    text = server.client.get("/metrics").text
    return {(m.group(1), m.group(2)): float(m.group(3)) for m in re.finditer(
        r'^voxserve_requests_total\{route="([^"]*)",status="(\d+)"\} ([0-9.e+-]+)$', text, re.M)}


def by_status(counts: dict, status: str) -> float:
    return sum(v for (_, s), v in counts.items() if s == status)


def dropped(server, reason: str) -> float:
    text = server.client.get("/metrics").text
    m = re.search(rf'^voxserve_connections_dropped_total\{{reason="{reason}"\}} ([0-9.e+-]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def read_until_closed(socks: list[socket.socket], deadline: float) -> list[tuple[bytes, float | None]]:
    """For each socket, what the server sent until it closed the connection, and when
    (monotonic; None: still open at `deadline`). All are watched at once."""
    data = {k: b"" for k in socks}
    closed: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as sel:
        for k in socks:
            k.setblocking(False)
            sel.register(k, selectors.EVENT_READ)
        while len(closed) < len(socks) and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                k = key.fileobj
                try:
                    chunk = k.recv(65536)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    data[k] += chunk
                else:
                    closed[k] = time.monotonic()
                    sel.unregister(k)
    return [(data[k], closed.get(k)) for k in socks]


def post_head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


def synth_body(text: str, **kw) -> bytes:
    return json.dumps({"text": text, "voice": "tiny-multi", "response_format": "pcm", **kw}).encode()


def long_text(n: int) -> str:
    return " ".join(f"This is sentence number {k} of a long text that streams." for k in range(1, n + 1))


def status_of(data: bytes) -> int | None:
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", data)
    return int(m.group(1)) if m else None


def test_slow_and_stalled_clients_are_dropped_in_bounded_time(http_server):
    s = http_server
    body = synth_body("Hello.")
    kinds: list[tuple[str, socket.socket]] = []
    opened = time.monotonic()
    for _ in range(100):  # a request line and some headers, never the blank line
        k = connect(s)
        k.sendall(b"POST /v1/synthesize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
        kinds.append(("partial headers", k))
    for _ in range(100):  # whole headers, a third of the body
        k = connect(s)
        k.sendall(post_head("/v1/synthesize", len(body)) + body[: len(body) // 3])
        kinds.append(("partial body", k))
    for _ in range(50):  # a whole body, but a Content-Length that promises more
        k = connect(s)
        k.sendall(post_head("/v1/synthesize", len(body) + 40) + body)
        kinds.append(("overstated length", k))
    for _ in range(40):  # connected, nothing sent
        kinds.append(("idle", connect(s)))
    for _ in range(10):  # one whole request, then half of the next one's headers (keep-alive)
        k = connect(s)
        k.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b'"ok"' not in first:
            first += k.recv(4096)
        k.sendall(b"GET /health HTTP/1.1\r\nHost: 12")
        kinds.append(("keep-alive partial headers", k))
    assert len(kinds) == 300
    all_open = time.monotonic()

    normal = {}

    def normal_client():  # meanwhile a normal client is served
        with httpx.Client(base_url=s.url, timeout=30) as c:
            normal["r"] = c.post("/v1/synthesize", content=body, headers={"content-type": "application/json"})

    t = threading.Thread(target=normal_client)
    t.start()
    # the body's clock starts at its headers, so every kind is due read_timeout after it was opened
    bound = all_open + s.read_timeout + SLACK_S
    results = [(kind, *got) for (kind, _), got in zip(kinds, read_until_closed([k for _, k in kinds], bound))]
    for _, k in kinds:
        k.close()
    t.join(30)
    assert normal["r"].status_code == 200 and len(normal["r"].content) > 0
    still_open = [kind for kind, _, closed in results if closed is None]
    assert not still_open, f"{len(still_open)} connections still open after {s.read_timeout + SLACK_S:g} s: " \
                           f"{sorted(set(still_open))}"
    last = max(closed for _, _, closed in results) - all_open
    print(f"\n300 slow connections opened in {all_open - opened:.2f} s; the server had closed them all "
          f"{last:.2f} s after the last was opened (read timeout {s.read_timeout:g} s)")
    for kind, data, _ in results:
        if kind == "idle":
            assert data == b"", data  # nothing asked, nothing answered
        elif kind == "keep-alive partial headers":
            assert status_of(data) == 408, data
        else:
            assert status_of(data) == 408, (kind, data)
            err = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
            assert err["code"] == "request_timeout" and err["type"] == "invalid_request_error", err
    assert s.client.get("/health").status_code == 200


def test_connections_past_the_bound_get_503_then_service_resumes(http_server):
    s = http_server
    before = dropped(s, "too_many_connections")
    idle = [connect(s) for _ in range(s.max_connections)]
    try:
        time.sleep(0.3)  # let the server accept them all: the next connection is over the bound
        r = httpx.get(s.url + "/v1/voices", timeout=10)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "too_many_connections"
        assert r.headers["connection"] == "close"
    finally:
        for k in idle:
            k.close()
    deadline = time.monotonic() + 10
    while True:  # the server sees the closes asynchronously
        r = httpx.get(s.url + "/v1/voices", timeout=10)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200, r.text
    assert dropped(s, "too_many_connections") >= before + 1


def test_client_disconnects_are_counted_as_499_never_500(http_server):
    s = http_server
    before = request_counts(s)
    body = synth_body(long_text(60), stream=True)
    n_uploads, n_streams, n_whole = 20, 5, 5
    for _ in range(n_uploads):  # the upload aborts part-way through the body
        k = connect(s)
        k.sendall(post_head("/v1/synthesize", len(body)) + body[:100])
        k.close()
    for _ in range(n_streams):  # the download aborts after its first bytes
        k = connect(s)
        k.sendall(post_head("/v1/synthesize", len(body)) + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = k.recv(65536)
            assert chunk, data
            data += chunk
        assert status_of(data) == 200, data
        k.close()
    whole = synth_body(long_text(60))  # long enough that the server sees the client leave
    for _ in range(n_whole):  # a whole-file request whose client leaves before the answer
        k = connect(s)
        k.sendall(post_head("/v1/synthesize", len(whole)) + whole)
        k.close()
    expected = n_uploads + n_streams + n_whole
    deadline = time.monotonic() + 30
    while True:  # the server notices each disconnect on its own time
        after = request_counts(s)
        gone = after.get(("/v1/synthesize", "499"), 0) - before.get(("/v1/synthesize", "499"), 0)
        if gone >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert gone == expected, (gone, after)
    assert by_status(after, "500") == by_status(before, "500"), after
    text = s.client.get("/metrics").text
    assert "499" in re.search(r"^# HELP voxserve_requests_total (.*)$", text, re.M).group(1)
    assert s.metric("voxserve_in_flight_requests") == 0
