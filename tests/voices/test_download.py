"""`voxserve voices download NAME`: Piper voices fetched from a repository in the layout of the
public Piper voice repository (and piper-tts's downloader), here a threaded http.server on
127.0.0.1 serving a tiny voice and its voices.json. Nothing here reaches past loopback."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from voxserve.cli import EXIT_ERROR, EXIT_USAGE, main
from voxserve.errors import UnknownVoiceError
from voxserve.families.piper import download as piper_download
from voxserve.voices.download import DownloadError

NAME = "en_US-tiny-x_low"
REL = "en/en_US/tiny/x_low/" + NAME  # the repository's layout: family/code/name/quality/NAME


@pytest.fixture(scope="module")
def tiny_files(tiny_voice_path) -> dict[str, bytes]:
    return {".onnx": tiny_voice_path.read_bytes(),
            ".onnx.json": tiny_voice_path.with_name(tiny_voice_path.name + ".json").read_bytes()}


def write_repo(root: Path, files: dict[str, bytes], index_files: dict[str, bytes] | None = None) -> Path:
    """A repository tree holding `files` as the voice NAME; voices.json describes `index_files`
    (default: the same files), so that a test can make the index disagree with the files."""
    index_files = files if index_files is None else index_files
    for suffix, data in files.items():
        path = root / (REL + suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    entry = {"key": NAME, "name": "tiny", "quality": "x_low", "num_speakers": 3,
             "language": {"code": "en_US", "family": "en", "region": "US"},
             "files": {REL + suffix: {"size_bytes": len(data), "md5_digest": hashlib.md5(data).hexdigest()}
                       for suffix, data in index_files.items()},
             "aliases": []}
    (root / "voices.json").write_text(json.dumps({NAME: entry}), encoding="utf-8")
    return root


class Repo:
    """A threaded http.server on a free loopback port serving `root`; it counts the requests."""

    def __init__(self, root: Path):
        requests = self.requests = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(root), **kw)

            def log_message(self, *a):
                pass

            def do_GET(self):
                requests.append(self.path)
                super().do_GET()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@contextlib.contextmanager
def serving(root: Path):
    repo = Repo(root)
    try:
        yield repo
    finally:
        repo.close()


def download(repo_url: str, dest: Path, *names: str, extra=()) -> int:
    return main(["voices", "download", *names, "--dir", str(dest), "--base-url", repo_url, *extra])


def installed(dest: Path) -> list[str]:
    """Everything in the destination folder, temporary folders included."""
    return sorted(p.name for p in dest.iterdir()) if dest.exists() else []


def test_download_installs_a_verified_voice_that_loads_by_name(tiny_files, tmp_path, monkeypatch, capsys):
    import voxserve

    dest = tmp_path / "voices"
    with serving(write_repo(tmp_path / "repo", tiny_files)) as repo:
        assert download(repo.url, dest, NAME) == 0
        # the URLs of piper-tts's downloader below the base URL: the index, then the two files
        assert repo.requests == ["/voices.json", f"/{REL}.onnx", f"/{REL}.onnx.json"]
        assert download(repo.url, dest, NAME) == 0  # installed already: kept, nothing fetched
        assert len(repo.requests) == 3
        assert "installed already" in capsys.readouterr().err
    assert installed(dest) == [f"{NAME}.onnx", f"{NAME}.onnx.json"]  # no temporary folder left
    assert (dest / f"{NAME}.onnx").read_bytes() == tiny_files[".onnx"]
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(dest))
    voice = voxserve.load_voice(NAME, device="cpu")
    assert voice.name == NAME and voice.sample_rate == 16000
    assert main(["voices"]) == 0
    out = capsys.readouterr().out
    assert NAME in out and str(dest) in out


@pytest.mark.parametrize("bad", ["md5", "size", "unloadable"])
def test_a_file_that_fails_a_check_is_refused_and_nothing_is_installed(bad, tiny_files, tmp_path, capsys):
    files = dict(tiny_files)
    index_files = None
    if bad == "md5":  # same size, one byte changed in transit
        data = bytearray(files[".onnx"])
        data[len(data) // 2] ^= 0xFF
        files, index_files = {**files, ".onnx": bytes(data)}, tiny_files
    elif bad == "size":
        files, index_files = {**files, ".onnx": files[".onnx"] + b"\0" * 10}, tiny_files
    else:  # the index agrees with the files, but the model is not a voice
        files = {**files, ".onnx": b"not an onnx model" * 100}
    dest = tmp_path / "voices"
    dest.mkdir()
    with serving(write_repo(tmp_path / "repo", files, index_files)) as repo:
        assert download(repo.url, dest, NAME) == EXIT_ERROR
    err = capsys.readouterr().err
    assert {"md5": "md5", "size": "bytes", "unloadable": "does not load"}[bad] in err, err
    assert installed(dest) == []  # not the file, nor its staging folder


def test_unknown_name_says_so_and_installs_nothing(tiny_files, tmp_path, capsys):
    dest = tmp_path / "voices"
    with serving(write_repo(tmp_path / "repo", tiny_files)) as repo:
        assert download(repo.url, dest, "en_US-nobody-medium") == EXIT_USAGE
        assert repo.requests == ["/voices.json"]
    err = capsys.readouterr().err
    assert "unknown voice 'en_US-nobody-medium'" in err and "voices.json" in err
    assert installed(dest) == []


@pytest.mark.parametrize("name", ["../../etc/passwd", "en_US-../../x-low", "en_US-a/b-low", "en_US-..-low",
                                  "en_US-lessac-medium/../../x", "/etc/x-y-z", "en_US-lessac-medium?x=1",
                                  "en_US-a%2f..-low", "C:\\x-y-z"])
def test_a_name_that_could_leave_the_folders_is_refused_before_any_request(name, tiny_files, tmp_path, capsys):
    dest = tmp_path / "voices"
    with serving(write_repo(tmp_path / "repo", tiny_files)) as repo:
        # a good name beside it: nothing at all is fetched when one name is bad
        assert download(repo.url, dest, NAME, name) == EXIT_USAGE
        assert repo.requests == []
    assert "not written as any voice repository names its voices" in capsys.readouterr().err
    assert installed(dest) == []
    with pytest.raises(ValueError):
        piper_download.voice_path(name)


def test_server_down_is_a_clear_failure(tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/"
    assert download(url, tmp_path / "voices", NAME) == EXIT_ERROR
    err = capsys.readouterr().err
    assert f"cannot download {url}voices.json" in err and "refused" in err.lower(), err
    assert installed(tmp_path / "voices") == []


def test_missing_file_on_the_server_is_a_failure(tiny_files, tmp_path, capsys):
    root = write_repo(tmp_path / "repo", tiny_files)
    (root / (REL + ".onnx.json")).unlink()
    dest = tmp_path / "voices"
    with serving(root) as repo:
        assert download(repo.url, dest, NAME) == EXIT_ERROR
    assert "HTTP 404" in capsys.readouterr().err
    assert installed(dest) == []


def test_a_server_that_stops_sending_times_out(tmp_path):
    with socket.socket() as listener:  # accepts, then never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
        began = time.monotonic()
        with pytest.raises(DownloadError, match="timed out"):
            piper_download.fetch_voice(NAME, tmp_path / "voices", url, stall_timeout_s=0.5)
        assert time.monotonic() - began < 10


@pytest.mark.parametrize("url", ["file:///etc/", "ftp://127.0.0.1/", "127.0.0.1:8000/", "http:///x"])
def test_base_url_must_be_http(url, tmp_path, capsys):
    assert download(url, tmp_path / "voices", NAME) == EXIT_USAGE
    assert "base URL" in capsys.readouterr().err


def test_unknown_voice_error_says_how_to_fetch_it(tmp_path, monkeypatch, capsys):
    import voxserve

    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(tmp_path))
    with pytest.raises(UnknownVoiceError, match="voxserve voices download en_US-lessac-medium"):
        voxserve.load_voice("en_US-lessac-medium", device="cpu")
    assert main(["say", "--voice", "en_US-lessac-medium", "-o", str(tmp_path / "x.wav"), "Hi."]) == EXIT_USAGE
    assert "voxserve voices download en_US-lessac-medium" in capsys.readouterr().err


def test_voices_marks_the_default_and_shows_the_folders(tmp_path, monkeypatch, capsys):
    from voxserve.voices.registry import DEFAULT_VOICE, user_voice_dir

    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(tmp_path / "mine"))
    assert main(["voices"]) == 0
    out = capsys.readouterr().out
    assert f"* {DEFAULT_VOICE} " in out
    folders = out[out.index("Voice folders searched"):]
    assert folders.index(str(tmp_path / "mine")) < folders.index(str(user_voice_dir()))
    assert main(["voices", "--json"]) == 0
    infos = json.loads(capsys.readouterr().out)
    assert [i["name"] for i in infos if i["default"]] == [DEFAULT_VOICE]


def test_install_dir_outside_the_search_path_is_pointed_out(tiny_files, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(tmp_path / "elsewhere"))
    dest = tmp_path / "voices"
    with serving(write_repo(tmp_path / "repo", tiny_files)) as repo:
        assert download(repo.url, dest, NAME) == 0
    assert "VOXSERVE_VOICES_PATH" in capsys.readouterr().err
    shutil.rmtree(dest)


def test_server_refuses_an_unknown_voice_saying_how_to_fetch_it(tmp_path, monkeypatch, capsys):
    from fastapi.testclient import TestClient
    from serve_fakes import FakeVoice

    from voxserve.engine import Engine, EngineConfig, SchedulerConfig
    from voxserve.serve.app import AppConfig, create_app

    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(tmp_path))
    # at startup: the voice named on the command line
    assert main(["serve", "--voice", "en_US-nobody-low", "--host", "127.0.0.1", "--port", "0"]) == EXIT_USAGE
    assert "voxserve voices download en_US-nobody-low" in capsys.readouterr().err
    # per request: the 404's message
    eng = Engine([FakeVoice(sample_rate=16000)], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    with TestClient(create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=5))) as c:
        r = c.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "en_US-nobody-low"})
    assert r.status_code == 404
    assert "voxserve voices download en_US-nobody-low" in r.json()["error"]["message"]
