"""`voxserve say --server URL`: the text said by a running `voxserve serve`, over HTTP.

A `say` that loads a voice pays PyTorch's import and the voice's load in every process (seconds
on a small CPU, docs/benchmarks.md); one that hands its text to a server that holds the voice
already costs a short Python process and the synthesis. Standard library only: this path
imports neither PyTorch nor numpy nor the web stack (tests/test_cli_remote.py checks it).
"""

from __future__ import annotations

import http.client
import json
import os
import struct
import urllib.error
import urllib.parse
import urllib.request
from typing import BinaryIO

from .errors import VoxserveError

SERVER_ENV = "VOXSERVE_SAY_SERVER"
"""Where `say` sends its text when --server is not given (empty: say it here)."""
API_KEY_ENV = "VOXSERVE_API_KEY"
"""The server's key (`serve --api-key` reads the same variable)."""
SERVER_FORMATS = ("wav", "flac", "mp3", "opus", "aac", "pcm")
"""POST /v1/synthesize's response formats (say's `ogg`, Vorbis, is not among them)."""
READ_TIMEOUT_S = 300.0
"""Longest wait for the server's next bytes: a queued request on a busy server, or a long sentence."""


class ServerUnavailable(VoxserveError):
    """No voxserve server answered at the URL (refused, unreachable, timed out, cut off)."""


class ServerRefused(ValueError):
    """The server refused the request as bad input (HTTP 4xx): its own message."""


def check_server_url(url: str) -> str:
    """http(s)://HOST[:PORT][/PREFIX], without a trailing slash; ValueError otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"--server {url!r}: give the server's address as http://HOST:PORT (e.g. http://127.0.0.1:8000)")
    return url.rstrip("/")


def request_body(text: str, voice: str | None, options: dict, fmt: str) -> dict:
    """The JSON body of POST /v1/synthesize. FLAC comes whole: it records its length before its
    first byte only when that is known (the speech route sends it whole for the same reason)."""
    if fmt not in SERVER_FORMATS:
        raise ValueError(f"a server sends no {fmt} audio: give --format (or an -o extension) of "
                         f"{', '.join(SERVER_FORMATS)}, or say it here (without --server)")
    body = {"text": text, "response_format": fmt, "stream": fmt != "flac", **options}
    if voice is not None:
        body["voice"] = voice
    return body


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read())["error"]["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return e.reason or f"HTTP {e.code}"


def _open(url: str, body: dict):
    headers = {"Content-Type": "application/json", "Accept": "*/*"}
    key = os.environ.get(API_KEY_ENV)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + "/v1/synthesize", data=json.dumps(body).encode(), headers=headers,
                                 method="POST")
    try:
        return urllib.request.urlopen(req, timeout=READ_TIMEOUT_S)
    except urllib.error.HTTPError as e:
        msg = _error_message(e)
        if e.code == 401:
            raise ServerUnavailable(f"the server at {url} wants an API key ({msg}): set {API_KEY_ENV}") from None
        if 400 <= e.code < 500 and e.code != 429:
            raise ServerRefused(msg) from None
        raise ServerUnavailable(f"the server at {url} answered {e.code}: {msg}") from None
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", e)
        raise ServerUnavailable(f"no voxserve server answers at {url} ({why}): start one with `voxserve serve`, "
                                f"or say it here without --server (and without {SERVER_ENV})") from None


def say_remote(url: str, body: dict, open_out) -> int:
    """POST the body; once the server has accepted it, open the output (`open_out()`, a context
    manager as `voxserve.outfile.open_output`) and copy the audio into it as it comes. The
    number of bytes written."""
    resp = _open(url, body)
    n, head = 0, b""
    with resp, open_out() as out:
        while True:
            try:
                chunk = resp.read1(1 << 16)
            except (OSError, http.client.HTTPException) as e:  # the output file is left as it was (outfile)
                raise ServerUnavailable(f"the server at {url} stopped sending ({e!r})") from None
            if not chunk:
                break
            out.write(chunk)
            n += len(chunk)
            if len(head) < 44:
                head += chunk[:44 - len(head)]
            if not _seekable(out):
                out.flush()  # a pipe's reader hears each sentence as it comes
        if body["response_format"] == "wav" and _seekable(out):
            _patch_wav_sizes(out, head, n)
    return n


def _seekable(out: BinaryIO) -> bool:
    try:
        return bool(out.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _patch_wav_sizes(out: BinaryIO, head: bytes, n: int) -> None:
    """A streamed WAV's header gives unknown sizes (0xFFFFFFFF, voxserve.audio.wav_header); in a
    file the true ones are set, as a local `say` writes them. head: the file's first 44 bytes;
    n: its size."""
    end = out.tell()
    if len(head) == 44 and head[:4] == b"RIFF" and head[8:16] == b"WAVEfmt " and head[36:40] == b"data":
        out.seek(end - n + 4)
        out.write(struct.pack("<I", n - 8))
        out.seek(end - n + 40)
        out.write(struct.pack("<I", n - 44))
    out.seek(end)
