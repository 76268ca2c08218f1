"""The HTTP server's own settings, apart from the app, so that the command line can read their
defaults without importing the web stack (`voxserve --help` starts in well under a second)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AppConfig:
    """HTTP-level settings (the engine has its own)."""

    api_key: str | None = None
    """If set, every route except /health and the playground page (`/`, its assets) needs `Authorization: Bearer <key>`
    (the /v1/audio/speech/stream WebSocket too, in its handshake)."""
    max_input_chars: int = 4096
    """Longer input is refused with 413 (OpenAI's limit for /v1/audio/speech is 4096). A
    /v1/audio/speech/stream session holds at most this much text not yet spoken."""
    max_body_bytes: int = 1 << 20
    """Request bodies over this are refused with 413 before they are parsed."""
    shutdown_timeout_s: float = 30.0
    """On shutdown, in-flight requests get this long to finish."""
    warmup: bool = True
    """Run one sentence through each voice before /ready says ready."""
    request_timeout_s: float = 600.0
    """A request still running after this long is cancelled (its queued sentences dropped)."""
    header_timeout_s: float = 10.0
    """A connection must send a complete request head (request line and headers) within this long
    of opening, or of its first byte after the previous response; else it is closed (408 if it
    had sent part of one). Needs the server's protocol class, `http_protocol(app)`."""
    body_timeout_s: float = 30.0
    """A request's whole body must arrive within this long of its headers (else 408, connection
    closed), so that a slow or stalled upload cannot hold a connection open."""
    max_connections: int | None = 1024
    """Open connections beyond this get 503 and are closed (with `http_protocol(app)`): far above
    what the engine admits, it only keeps a flood of idle connections from using up file
    descriptors. None: no bound."""
    stream_max_connections: int = 64
    """Open /v1/audio/speech/stream WebSockets beyond this are closed at once (code 1013, "try
    again later"): each holds text, audio and an encoder."""
    stream_idle_timeout_s: float = 30.0
    """A /v1/audio/speech/stream client that sends nothing while no audio is owed to it, or that
    takes longer than this to take a frame of its audio, is closed (its sentences dropped)."""
    max_upload_bytes: int = 8 << 20
    """POST /v1/audio/voices bodies (a prompt recording, up to 30 s) over this get 413; the
    other routes' bound is `max_body_bytes`."""
    voice_dir: Path | None = None
    """Where POST /v1/audio/voices saves voices (as `voxserve voices add`); None: the user voice
    folder (~/.local/share/voxserve/voices)."""
