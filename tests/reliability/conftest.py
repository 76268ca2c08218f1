"""Shared fixture of the reliability tests' HTTP modules (test_http_*): one real `voxserve serve`
of the tiny voice, with short read timeouts and small bounds, for all of them."""

from __future__ import annotations

import pytest
from server_process import ServerProcess


@pytest.fixture(scope="session")
def http_server(tiny_voice_path):
    """The server, with its bounds as attributes: read_timeout (s), max_connections, max_audio_s."""
    read_timeout, max_connections, max_audio_s = 1.5, 400, 60.0
    # no warm-up: a cold first request is fine here, and warm-up is most of a start's time
    s = ServerProcess(["--voice", "tiny-multi", "--no-warmup", "--read-timeout", str(read_timeout),
                       "--max-connections", str(max_connections), "--max-audio-seconds", str(max_audio_s),
                       "--max-queue", "1024", "--max-queue-wait", "3600"],  # admission is not tested here
                      env={"VOXSERVE_VOICES_PATH": str(tiny_voice_path.parent)}, ready_timeout=120)
    s.read_timeout, s.max_connections, s.max_audio_s = read_timeout, max_connections, max_audio_s
    yield s
    s.stop()
