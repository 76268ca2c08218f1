"""`voxserve say` and `voxserve voices` as a user runs them."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import soundfile as sf


def run(*args, stdin: bytes | None = None, timeout=120):
    return subprocess.run([sys.executable, "-m", "voxserve", *args], input=stdin, capture_output=True, timeout=timeout)


def test_say_writes_wav(tmp_path):
    out = tmp_path / "hello.wav"
    r = run("say", "Hello there. This is a test.", "-o", str(out), "--noise-scale", "0", "--noise-w", "0")
    assert r.returncode == 0, r.stderr.decode()
    y, sr = sf.read(out)
    assert sr == 22050 and len(y) > sr  # more than a second of speech
    assert not (tmp_path / "hello.wav.part").exists()


def test_say_from_stdin_to_stdout_and_file_input(tmp_path):
    r = run("say", "-o", "-", stdin=b"Reading from standard input.")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout[:4] == b"RIFF"
    pcm = r.stdout[44:]
    assert len(pcm) > 2 * 22050 * 0.5
    f = tmp_path / "in.txt"
    f.write_text("From a file. Two sentences.", encoding="utf-8")
    r = run("say", "-f", str(f), "-o", str(tmp_path / "x.flac"))
    assert r.returncode == 0, r.stderr.decode()
    y, sr = sf.read(tmp_path / "x.flac")
    assert sr == 22050 and len(y) > 22050


@pytest.mark.parametrize("fmt", ["ogg", "mp3"])
def test_say_formats_to_stdout(fmt):
    r = run("say", "Short.", "-o", "-", "--format", fmt)
    assert r.returncode == 0, r.stderr.decode()
    y, sr = sf.read(io.BytesIO(r.stdout))
    assert sr == 22050 and len(y) > 1000


@pytest.mark.parametrize("args,message", [
    (["say", "", "-o", "-"], "empty"),
    (["say", "🎉🎉", "-o", "-"], "pronounceable"),
    (["say", "hi", "--voice", "nope", "-o", "-"], "available voices: en_US-joe-medium"),
    (["say", "hi", "--speed", "0", "-o", "-"], "speed"),
    (["say", "hi", "--speaker", "3", "-o", "-"], "speaker"),
    (["say", "hi", "--max-decode-frames", "10", "-o", "-"], "max_decode_frames"),  # the family's validate()
])
def test_say_bad_input_exits_2(args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr.decode()
    assert b"Traceback" not in r.stderr


def test_voices_lists_default():
    r = run("voices")
    assert r.returncode == 0 and "en_US-joe-medium" in r.stdout.decode()
    r = run("voices", "--json")
    assert '"family": "piper"' in r.stdout.decode()


def test_say_takes_the_families_runtime_options():
    """`say` has a flag for each field of each family's options type (Family.options_type), and
    gives load_voice those set; a voice of another family ignores the rest."""
    from voxserve.cli import build_parser, runtime_from

    ns = build_parser().parse_args(["say", "hi", "--threads", "1", "--max-sequences", "4", "--no-cuda-graphs"])
    assert runtime_from(ns) == {"threads": 1, "max_sequences": 4, "cuda_graphs": False}
    assert runtime_from(build_parser().parse_args(["say", "hi"])) == {}
    for internal in ("--cpu-channels-last", "--decode-layout", "--shape-buckets"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["say", "hi", internal, "1"])
