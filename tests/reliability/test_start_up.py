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


def _hostile_voice(tiny_voice_path, folder, edit) -> str:
    folder.mkdir(exist_ok=True)
    shutil.copy(tiny_voice_path, folder / "hostile.onnx")
    config = json.loads(tiny_voice_path.with_suffix(".onnx.json").read_text())
    edit(config)
    (folder / "hostile.onnx.json").write_text(json.dumps(config))
    return str(folder / "hostile.onnx")


def _set(*keys_value):
    *keys, value = keys_value

    def edit(config):
        d = config
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return edit


HOSTILE = [("audio.sample_rate", _set("audio", "sample_rate", 0)),
           ("audio.sample_rate", _set("audio", "sample_rate", 2 ** 40)),
           ("audio.sample_rate", _set("audio", "sample_rate", 22050.5)),
           ("num_speakers", _set("num_speakers", 0)),
           ("hop_length", _set("hop_length", -256)),
           ("num_symbols", _set("num_symbols", 2 ** 40))]


@pytest.mark.parametrize("key,edit", HOSTILE)
def test_the_loader_refuses_a_hostile_voice_config_naming_the_key(tiny_voice_path, tmp_path, key, edit):
    import voxserve
    from voxserve.errors import VoiceLoadError

    path = _hostile_voice(tiny_voice_path, tmp_path, edit)
    with pytest.raises(VoiceLoadError, match=f"hostile.onnx.json: {key} must be an integer in"):
        voxserve.load_voice(path, device="cpu")


@pytest.mark.parametrize("value", [0, 2 ** 40])
def test_say_with_a_hostile_voice_config_is_one_line_and_exit_2(tiny_voice_path, tmp_path, capsys, value):
    from voxserve.cli import main

    path = _hostile_voice(tiny_voice_path, tmp_path, _set("audio", "sample_rate", value))
    assert main(["say", "Hello.", "-o", str(tmp_path / "a.wav"), "--voice", path, "--device", "cpu"]) == 2
    assert_one_error_line(capsys.readouterr().err, "audio.sample_rate", str(value))
    assert not (tmp_path / "a.wav").exists()


@pytest.mark.parametrize("value", [0, 2 ** 40])
def test_serve_with_a_hostile_voice_config_is_one_line_and_exit_2(tiny_voice_path, tmp_path, value):
    from server_process import free_port

    path = _hostile_voice(tiny_voice_path, tmp_path, _set("audio", "sample_rate", value))
    # a subprocess with a deadline: a server that starts anyway fails the test instead of hanging it
    r = _run(["serve", "--port", str(free_port()), "--no-warmup", "--voice", path, "--device", "cpu"], timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert_one_error_line(r.stderr, "audio.sample_rate", str(value))


def _small_file_limit():  # in the child: files may not grow past 200 kB (a full disk, as far as writes go)
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


def test_say_with_a_full_cache_disk_runs_uncached_with_a_warning(tiny_voice_path, tmp_path):
    """The converted weights (~1 MB for the tiny voice) cannot be written to the cache: safetensors
    raises its own SafetensorError (not OSError), which killed say and serve; now the voice loads
    uncached, with a warning. (Python ignores SIGXFSZ, so the write fails with EFBIG.)"""
    import io

    import soundfile as sf

    cache = tmp_path / "cache"
    r = subprocess.run(voxserve_command() + ["say", "Hello there.", "--voice", str(tiny_voice_path), "--device",
                                             "cpu", "-o", "-"], cwd=ROOT, capture_output=True, timeout=300,
                       env={**os.environ, "VOXSERVE_CACHE_DIR": str(cache)}, preexec_fn=_small_file_limit)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "Traceback" not in err and "could not write the voice cache" in err
    y, _ = sf.read(io.BytesIO(r.stdout))
    assert len(y) > 100
    assert not [p for p in cache.rglob("*") if p.is_file()]  # no partial entry left behind
