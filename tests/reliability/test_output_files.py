"""`voxserve say -o PATH` writes into what PATH is: files atomically, symlinks through to their
target, pipes and devices in place, stdout as a stream; a directory is a clear error."""

from __future__ import annotations

import io
import os
import stat
import threading

import numpy as np
import pytest
import soundfile as sf

from voxserve.cli import main
from voxserve.outfile import open_output


def _reader(path) -> tuple[threading.Thread, bytearray]:
    got = bytearray()

    def read():
        with open(path, "rb") as f:
            got.extend(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


def _no_temp_files(folder) -> bool:
    return not [p for p in os.listdir(folder) if p.endswith(".part")]


# ------------------------------------------------------------------------------------ open_output


def test_new_and_existing_regular_files_are_replaced_atomically(tmp_path):
    path = tmp_path / "a.wav"
    with open_output(str(path)) as f:
        f.write(b"one")
        assert not path.exists()  # nothing at the final name until the body finishes
    assert path.read_bytes() == b"one"
    path.chmod(0o640)
    with open_output(str(path)) as f:
        assert f.seekable()  # a file: writers may seek back to complete their headers
        f.write(b"two")
    assert path.read_bytes() == b"two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert _no_temp_files(tmp_path)


def test_failure_mid_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "a.wav"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"):
        with open_output(str(path)) as f:
            f.write(b"half of the new")
            raise RuntimeError("boom")
    assert path.read_bytes() == b"old"
    assert _no_temp_files(tmp_path)


def test_symlink_is_written_through_and_stays_a_symlink(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "t.wav"
    target.write_bytes(b"old")
    link = tmp_path / "link.wav"
    link.symlink_to(target)
    with open_output(str(link)) as f:
        f.write(b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"
    assert _no_temp_files(tmp_path) and _no_temp_files(tmp_path / "real")  # temp beside the target


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.wav"
    link.symlink_to(tmp_path / "missing.wav")
    with open_output(str(link)) as f:
        f.write(b"new")
    assert link.is_symlink() and (tmp_path / "missing.wav").read_bytes() == b"new"


def test_fifo_is_streamed_into_not_replaced(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    t, got = _reader(fifo)
    with open_output(str(fifo)) as f:
        assert not f.seekable()
        f.write(b"a" * 100_000)
        f.flush()
    t.join(10)
    assert bytes(got) == b"a" * 100_000
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_dev_null_stays_a_device():
    with open_output("/dev/null") as f:
        assert not f.seekable()
        f.write(b"x" * 10_000)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_dev_full_is_a_clear_error():
    with pytest.raises(OSError, match="No space left on device") as e:
        with open_output("/dev/full") as f:
            f.write(b"x" * 100_000)
    assert e.value.filename == "/dev/full"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_directory_is_a_clear_error(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        with open_output(str(tmp_path)):
            pass
    with pytest.raises(FileNotFoundError, match="does not exist"):
        with open_output(str(tmp_path / "no" / "a.wav")):
            pass


# ------------------------------------------------------------------------------------ voxserve say


@pytest.fixture
def say(tiny_voice_path, capsysbinary):
    def run(*args) -> tuple[int, bytes, str]:
        code = main(["say", "Hello there. A second one.", "--voice", str(tiny_voice_path),
                     "--device", "cpu", "--noise-scale", "0", "--noise-w", "0", *args])
        out, err = capsysbinary.readouterr()
        return code, out, err.decode()

    return run


def test_say_to_a_file_a_symlink_and_stdout_give_the_same_audio(say, tmp_path):
    code, _, err = say("-o", str(tmp_path / "a.flac"))
    assert code == 0, err
    y, rate = sf.read(tmp_path / "a.flac", dtype="int16")
    assert len(y) > 500
    target = tmp_path / "t.flac"
    (tmp_path / "link.flac").symlink_to(target)
    code, _, err = say("-o", str(tmp_path / "link.flac"))
    assert code == 0, err
    assert (tmp_path / "link.flac").is_symlink()
    np.testing.assert_array_equal(sf.read(target, dtype="int16")[0], y)
    code, out, err = say("-o", "-", "--format", "wav")
    assert code == 0, err
    np.testing.assert_array_equal(sf.read(io.BytesIO(out), dtype="int16")[0], y)
    assert _no_temp_files(tmp_path)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "ogg"])
def test_say_into_a_fifo_streams(say, tmp_path, fmt):
    fifo = tmp_path / f"p.{fmt}"  # the extension gives the format
    os.mkfifo(fifo)
    t, got = _reader(fifo)
    code, _, err = say("-o", str(fifo))
    t.join(10)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    data = bytes(got)
    if fmt == "flac":  # length unknown to a stream: read what libsndfile can (see test_formats)
        with sf.SoundFile(io.BytesIO(data)) as f:
            assert f.format == "FLAC" and len(f.read(500)) == 500
    else:
        assert len(sf.read(io.BytesIO(data))[0]) > 500


def test_say_to_dev_full_is_one_line_and_exit_1(say):
    code, _, err = say("-o", "/dev/full", "--format", "wav")
    assert code == 1
    assert "No space left on device" in err and "/dev/full" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_say_to_dev_null_keeps_it_a_device(say):
    code, _, err = say("-o", "/dev/null", "--format", "mp3")
    assert code == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_say_to_a_directory_is_a_clear_error(say, tmp_path):
    code, _, err = say("-o", str(tmp_path))
    assert code != 0 and "is a directory" in err and "Traceback" not in err
    assert os.listdir(tmp_path) == []
