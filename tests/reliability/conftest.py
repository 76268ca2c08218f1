"""Shared fixture of the reliability tests' HTTP modules (test_http_*): one real `voxserve serve`
of the tiny voice, with short read timeouts and small bounds, for all of them."""

from __future__ import annotations

import importlib.util

import pytest
from server_process import ServerProcess, free_port


@pytest.fixture(scope="session")
def http_server(tiny_voice_path, tmp_path_factory):
    """The server, with its bounds as attributes: read_timeout (s), max_connections, max_audio_s;
    also its Wyoming port (wyoming_port, None without the extra) and its log (log_path), written
    with faulthandler on so that a native crash leaves its stack there."""
    read_timeout, max_connections, max_audio_s = 1.5, 400, 60.0
    # Wyoming too where its extra is installed (test_disconnects leaves it mid-answer as well)
    wyoming_port = free_port() if importlib.util.find_spec("wyoming") else None
    log_path = tmp_path_factory.mktemp("http_server") / "server.log"
    # no warm-up: a cold first request is fine here, and warm-up is most of a start's time
    s = ServerProcess(["--voice", "tiny-multi", "--no-warmup", "--body-timeout-s", str(read_timeout),
                       "--header-timeout-s", str(read_timeout),
                       "--max-connections", str(max_connections), "--max-audio-seconds", str(max_audio_s),
                       "--max-queued-sentences", "1024", "--max-queue-wait-s", "3600",  # admission is not tested here
                       *(["--wyoming", f"tcp://127.0.0.1:{wyoming_port}"] if wyoming_port else [])],
                      env={"VOXSERVE_VOICES_PATH": str(tiny_voice_path.parent), "PYTHONFAULTHANDLER": "1"},
                      ready_timeout=120, log_path=log_path)
    s.read_timeout, s.max_connections, s.max_audio_s = read_timeout, max_connections, max_audio_s
    s.wyoming_port, s.log_path = wyoming_port, log_path
    yield s
    s.stop()
