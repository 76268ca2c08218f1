"""`voxserve serve` and `voxserve say` at start-up (issue 49): a busy port, a hostile voice
config and a full cache disk each give one line and the documented exit status (or, for the
cache, a warning and an uncached run), never a traceback or a crash."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import pytest
from server_process import ROOT, voxserve_command


def _run(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(voxserve_command() + args, cwd=ROOT, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def test_serve_on_a_busy_port_is_one_line_and_exit_2(tiny_voice_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _run(["serve", "--device", "cpu", "--port", str(port), "--voice", str(tiny_voice_path), "--no-warmup"])
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "serving" not in r.stdout  # nothing announced that is not so
    assert_one_error_line(r.stderr, f"127.0.0.1:{port}", "another program")


def assert_one_error_line(stderr: str, *words: str) -> None:
    """One error line holding `words`, no traceback (the tiny voice's load warnings aside)."""
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("WARNING ")]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith("voxserve: error: ") and all(w in lines[0] for w in words), stderr
