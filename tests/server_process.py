"""`voxserve serve` as a real subprocess on a free loopback port, for the end-to-end tests.
Traffic goes to 127.0.0.1 only; every request has a timeout and every server is stopped."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = httpx.Timeout(120.0, connect=10.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def voxserve_command() -> list[str]:
    exe = Path(sys.executable).with_name("voxserve")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "voxserve.cli"]


def serve(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`voxserve serve` that is expected to exit (bad input): its exit status and output."""
    return subprocess.run(voxserve_command() + ["serve", "--device", "cpu", "--port", "1", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


class ServerProcess:
    """Starts `voxserve serve --device cpu ARGS` and waits for /ready (warm-up included).
    VOXSERVE_TEST_LOG=1 lets the server's output through to the test's; `log_path` writes it to
    that file instead."""

    def __init__(self, args: list[str], env: dict | None = None, api_key: str | None = None,
                 ready_timeout: float = 180, log_path: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = voxserve_command()
        if log_path is not None:
            self.log = open(log_path, "wb")
        else:
            self.log = open(os.devnull, "wb") if not os.environ.get("VOXSERVE_TEST_LOG") else None
        self.proc = subprocess.Popen(cmd + ["serve", "--port", str(self.port), "--device", "cpu"] + args,
                                     env={**os.environ, **(env or {})}, cwd=ROOT,
                                     stdout=self.log, stderr=self.log)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, timeout=TIMEOUT, headers=self.headers)
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if self.client.get("/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready in {ready_timeout:.0f} s")

    def metric(self, name: str) -> float:
        """A Prometheus sample without labels from /metrics (0 when absent)."""
        text = self.client.get("/metrics").text
        m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def wait_settled(self, name: str, quiet_s: float, timeout_s: float) -> tuple[float, bool]:
        """Poll the metric until it has not changed for quiet_s seconds: (its last value,
        whether it settled within timeout_s)."""
        last, since = -1.0, time.time()
        deadline = since + timeout_s
        while time.time() < deadline:
            now = self.metric(name)
            if now != last:
                last, since = now, time.time()
            elif time.time() - since > quiet_s:
                return last, True
            time.sleep(0.1)
        return last, False

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (graceful: in-flight requests finish), then kill after `timeout` seconds."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.log:
            self.log.close()
        return self.proc.returncode


@contextmanager
def serving_in_thread(app, ready_path: str = "/health"):
    """`app` served by uvicorn (with the app's connection guards) on a free loopback port in a
    thread of this process: (port, an httpx client of it); stopped on exit."""
    import threading

    import uvicorn

    from voxserve.serve.app import WS_MAX_BYTES, http_protocol

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=http_protocol(app), log_config=None,
                                        log_level="warning", access_log=False, ws_max_size=WS_MAX_BYTES,
                                        ws_per_message_deflate=False))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT, trust_env=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if client.get(ready_path).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    try:
        yield port, client
    finally:
        client.close()
        srv.should_exit = True
        thread.join(30)
