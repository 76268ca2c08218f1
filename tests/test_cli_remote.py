"""`voxserve say --server URL`: the text said by a running server, with no PyTorch in the `say`
process. A fake server (standard library, loopback) checks the request and the output; one test
runs the real `voxserve serve` and compares with a local `say`. Every request has a timeout and
every server is stopped."""

from __future__ import annotations

import http.server
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import soundfile as sf

HEAVY = ("torch", "fastapi", "starlette", "uvicorn", "pydantic", "transformers", "onnxruntime", "av")
SR = 16000


def run(*args, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "voxserve", *args], capture_output=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def streamed_wav(n_samples: int) -> list[bytes]:
    """A WAV as a server streams it: the sizes unknown (0xFFFFFFFF), the samples in pieces."""
    head = (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, SR, 2 * SR, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))
    pcm = struct.pack(f"<{n_samples}h", *((i * 37) % 2000 - 1000 for i in range(n_samples)))
    return [head + pcm[:1000], pcm[1000:5000], pcm[5000:]]


@contextmanager
def fake_server(status: int = 200, reply: dict | None = None, cut: bool = False):
    """POST /v1/synthesize on 127.0.0.1: records each request's body and headers; answers
    `status` with `reply` as JSON, or (200) a chunked streamed WAV of 4000 samples (`cut`: the
    connection closed after its first piece)."""
    seen: list[tuple[dict, dict]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((body, dict(self.headers)))
            if status != 200:
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "audio/wav")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in streamed_wav(4000)[:1 if cut else None]:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            if cut:
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def test_say_server_sends_text_voice_options_and_key_and_writes_a_whole_wav(tmp_path):
    out = tmp_path / "a.wav"
    with fake_server() as (url, seen):
        r = run("say", "Turn off the kitchen lights.", "--server", url + "/", "--voice", "v1", "--speed", "1.25",
                "--seed", "3", "-o", str(out), env={"VOXSERVE_API_KEY": "k3y"})
    assert r.returncode == 0, r.stderr.decode()
    body, headers = seen[0]
    assert body == {"text": "Turn off the kitchen lights.", "voice": "v1", "response_format": "wav", "stream": True,
                    "speed": 1.25, "seed": 3}
    assert headers["Authorization"] == "Bearer k3y"
    data = out.read_bytes()
    assert len(data) == 44 + 8000
    # the streamed header's unknown sizes are set in a file, as a local `say` writes them
    assert struct.unpack("<I", data[4:8])[0] == len(data) - 8 and struct.unpack("<I", data[40:44])[0] == 8000
    y, sr = sf.read(out, dtype="int16")
    assert sr == SR and len(y) == 4000
    assert b"said by the server at" in r.stderr


def test_say_server_from_the_environment_to_stdout_and_flac_whole():
    with fake_server() as (url, seen):
        r = run("say", "hi", "-o", "-", env={"VOXSERVE_SAY_SERVER": url})
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout == b"".join(streamed_wav(4000))  # a pipe gets the stream as it came
        r = run("say", "hi", "-o", "-", "--format", "flac", "--server", url)
    assert seen[0][0]["response_format"] == "wav" and "voice" not in seen[0][0]
    assert seen[1][0]["response_format"] == "flac" and seen[1][0]["stream"] is False


def test_say_server_imports_no_torch(tmp_path):
    """The point of --server: the `say` process loads neither PyTorch nor the web stack."""
    out = tmp_path / "x.wav"
    code = ("import json, sys\nimport voxserve.cli as c\n"
            f"sys.argv = ['voxserve', 'say', 'hi', '-o', {str(out)!r}, '--server', sys.argv[1]]\n"
            "rc = c.main()\n"
            f"print(json.dumps([rc, [m for m in {HEAVY!r} if m in sys.modules]]))")
    with fake_server() as (url, _):
        p = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [0, []]
    assert out.stat().st_size == 44 + 8000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_say_server_not_there_exits_1_and_leaves_the_output_alone(tmp_path):
    out = tmp_path / "keep.wav"
    out.write_bytes(b"old")
    r = run("say", "hi", "--server", f"http://127.0.0.1:{_free_port()}", "-o", str(out))
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "no voxserve server answers at http://127.0.0.1:" in err and "voxserve serve" in err
    assert b"Traceback" not in r.stderr
    assert out.read_bytes() == b"old"


@pytest.mark.parametrize("status,code", [(400, 2), (404, 2), (429, 1), (503, 1)])
def test_say_server_errors_are_the_servers_message(tmp_path, status, code):
    out = tmp_path / "keep.wav"
    out.write_bytes(b"old")
    reply = {"error": {"message": f"the server says no ({status})", "type": "x", "code": "x"}}
    with fake_server(status, reply) as (url, _):
        r = run("say", "hi", "--server", url, "-o", str(out))
    assert r.returncode == code
    assert f"the server says no ({status})" in r.stderr.decode()
    assert out.read_bytes() == b"old"


def test_say_server_cut_off_mid_stream_exits_1_and_leaves_the_output_alone(tmp_path):
    out = tmp_path / "keep.wav"
    out.write_bytes(b"old")
    with fake_server(cut=True) as (url, _):
        r = run("say", "hi", "--server", url, "-o", str(out))
    assert r.returncode == 1 and "stopped sending" in r.stderr.decode()
    assert b"Traceback" not in r.stderr
    assert out.read_bytes() == b"old"


def test_say_server_wants_a_key(tmp_path):
    with fake_server(401, {"error": {"message": "missing key", "type": "x", "code": "x"}}) as (url, _):
        r = run("say", "hi", "--server", url, "-o", str(tmp_path / "x.wav"))
    assert r.returncode == 1 and "VOXSERVE_API_KEY" in r.stderr.decode()


@pytest.mark.parametrize("args,message", [
    (["--device", "cpu"], "--device"),
    (["--threads", "1"], "--threads"),
    (["--max-sentence-audio-seconds", "5"], "--max-sentence-audio-seconds"),
    (["--captions", "x.srt"], "--captions"),
    (["--format", "ogg"], "no ogg audio"),
    (["--speed", "9"], "speed"),
])
def test_say_server_refuses_what_only_a_local_voice_takes(tmp_path, args, message):
    with fake_server() as (url, seen):
        r = run("say", "hi", "--server", url, "-o", str(tmp_path / "x.wav"), *args)
    assert r.returncode == 2
    assert message in r.stderr.decode()
    assert seen == []  # refused before any request


def test_say_server_url_is_checked():
    r = run("say", "hi", "--server", "127.0.0.1:8000", "-o", "-")
    assert r.returncode == 2 and "http://HOST:PORT" in r.stderr.decode()


def test_say_through_a_real_server_equals_saying_it_here(tmp_path, tiny_voice_path):
    """Same voice, seed and format: the bytes a server sends are the bytes a local `say` writes."""
    sys.path.insert(0, str(Path(__file__).parent))
    from server_process import ServerProcess

    env = {"VOXSERVE_VOICES_PATH": str(tiny_voice_path.parent)}
    text = "Turn off the kitchen lights. Then lock the door."
    local, remote = tmp_path / "local.wav", tmp_path / "remote.wav"
    r = run("say", text, "--voice", "tiny-multi", "--seed", "3", "--device", "cpu", "-o", str(local), env=env)
    assert r.returncode == 0, r.stderr.decode()
    s = ServerProcess(["--voice", "tiny-multi"], env=env)
    try:
        r = run("say", text, "--voice", "tiny-multi", "--seed", "3", "--server", s.url, "-o", str(remote), env=env)
        assert r.returncode == 0, r.stderr.decode()
        r = run("say", text, "--voice", "nope", "--server", s.url, "-o", "-", env=env)
        assert r.returncode == 2 and b"nope" in r.stderr
    finally:
        s.stop()
    assert remote.read_bytes() == local.read_bytes()
