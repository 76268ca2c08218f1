"""Where `voxserve say -o PATH` writes: files atomically; pipes, devices and stdout as they are."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
import tempfile
from contextlib import contextmanager
from typing import BinaryIO, Iterator


class _Stream:
    """A binary stream that says it cannot seek, so that writers use their stream form and never
    seek in something they did not create (a device, a pipe, our stdout)."""

    def __init__(self, f: BinaryIO):
        self._f = f

    def write(self, b) -> int:
        return self._f.write(b)

    def flush(self) -> None:
        self._f.flush()

    def seekable(self) -> bool:
        return False


def check_output(path: str) -> None:
    """Fail before any work for outputs that cannot be written: a directory, a missing folder."""
    if path == "-":
        return
    target = os.path.realpath(path)
    if os.path.isdir(target):
        raise IsADirectoryError(f"{path} is a directory; give a file name, e.g. {os.path.join(path, 'out.wav')}")
    parent = os.path.dirname(target) or "."
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot write {path}: the folder {parent} does not exist")


@contextmanager
def open_output(path: str) -> Iterator[BinaryIO]:
    """A binary file object for PATH ('-' = stdout), written as the kind of thing PATH is.

    Symlinks are followed (their target is written; a dangling one's target is created). A
    regular or new file is written to a temporary file beside the target and renamed over it
    when the body finishes, so readers never see half a file and a failure leaves the old one;
    pipes and devices are written into directly; stdout streams, or is spooled when it is a file.
    The object yielded for a pipe, a device or stdout cannot seek.
    """
    check_output(path)
    if path == "-":
        with _stdout() as f:
            yield f
        return
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        # a FIFO or a device: replacing it would break whoever reads it, and /dev/null must stay
        with _named(path), open(target, "wb") as f:
            yield _Stream(f)
        return
    with _named(path), _atomic(target, st) as f:
        yield f


@contextmanager
def _named(path: str) -> Iterator[None]:
    """Errors from writing (ENOSPC, EPIPE, EIO carry no file name) name the output."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror, path) from None
        raise


@contextmanager
def _atomic(target: str, st: os.stat_result | None) -> Iterator[BinaryIO]:
    directory, name = os.path.split(target)
    while True:
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.part")
        try:
            # 0o666 with O_EXCL: the umask applies as for any new file (mkstemp would give 0600)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        if st is not None:  # the replacement keeps the permissions of the file it replaces
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


@contextmanager
def _stdout() -> Iterator[BinaryIO]:
    out = sys.stdout.buffer
    try:
        is_file = stat.S_ISREG(os.fstat(out.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's captured stdout)
        is_file = False
    with _named("<stdout>"):
        if is_file:
            # `> file.flac`: spool, so that the file gets the complete form (totals in the
            # header) without seeking in a descriptor whose offset and O_APPEND are not ours
            with tempfile.TemporaryFile() as tmp:
                yield tmp
                tmp.seek(0)
                shutil.copyfileobj(tmp, out)
        else:
            yield _Stream(out)
        out.flush()
