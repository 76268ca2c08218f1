"""Bounded HTTP downloads for `voxserve voices download`: one file at a time into a temporary
folder inside the destination, checked against the size and digests its repository's index
gives, so that a voice is renamed into place only once every file of it is whole and verified.

Only http and https are fetched (redirects included); every file has a size bound, every read a
stall timeout and every file a total time bound. The family builds each URL from its base URL and
a validated voice name (voxserve.families.VoiceDownload); nothing here takes a path from a server.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import VoxserveError

STALL_TIMEOUT_S = 30.0
"""A connection or read that waits this long for a byte fails."""
TOTAL_TIMEOUT_S = 3600.0
"""One file's download may take this long at most (a 100 MB voice at 28 kB/s)."""
_READ = 1 << 16


class DownloadError(VoxserveError):
    """A download failed: the network, the server (an HTTP error), or a file that fails its
    size or digest check. Nothing of the voice is installed."""


@dataclass(frozen=True)
class Expected:
    """What a repository's index says of one file; None = not given (not checked)."""

    size: int | None = None
    md5: str | None = None
    sha256: str | None = None


def check_base_url(url: str) -> str:
    """An http(s) URL with a host, ending in `/` (file paths are joined below it); ValueError
    otherwise (bad input)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the base URL must be an http:// or https:// URL with a host, not {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"the base URL takes no query or fragment: {url!r}")
    return url if url.endswith("/") else url + "/"


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to http(s) (urllib's default also allows ftp)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise DownloadError(f"{req.full_url}: redirected to a non-HTTP URL {newurl!r}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(_HttpOnlyRedirects())


def fetch(url: str, dest: Path, expected: Expected = Expected(), *, max_bytes: int,
          stall_timeout_s: float = STALL_TIMEOUT_S, total_timeout_s: float = TOTAL_TIMEOUT_S) -> None:
    """Download `url` to `dest` (a new file), checking `expected` and the bounds as it reads.
    DownloadError on any failure (`dest` may then hold part of the file: the caller's
    temporary folder goes)."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise DownloadError(f"not an http(s) URL: {url!r}")
    limit = max_bytes if expected.size is None else min(max_bytes, expected.size)
    if expected.size is not None and expected.size > max_bytes:
        raise DownloadError(f"{url}: the index gives {expected.size} bytes, over the limit of {max_bytes}")
    md5, sha256 = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    got = 0
    deadline = time.monotonic() + total_timeout_s
    try:
        with _opener().open(urllib.request.Request(url, headers={"User-Agent": "voxserve"}),
                            timeout=stall_timeout_s) as r, open(dest, "xb") as out:
            while block := r.read(_READ):
                got += len(block)
                if got > limit:
                    raise DownloadError(f"{url}: more than {limit} bytes "
                                        f"({'the size the index gives' if limit == expected.size else 'the limit'})")
                if time.monotonic() > deadline:
                    raise DownloadError(f"{url}: not downloaded within {total_timeout_s:g} s")
                md5.update(block)
                sha256.update(block)
                out.write(block)
    except urllib.error.HTTPError as e:
        raise DownloadError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise DownloadError(f"cannot download {url}: {e.reason}") from None
    except (TimeoutError, ConnectionError, http.client.HTTPException) as e:  # a stall, a reset, a bad reply
        raise DownloadError(f"cannot download {url}: {e or type(e).__name__}") from None
    if expected.size is not None and got != expected.size:
        raise DownloadError(f"{url}: {got} bytes, the index gives {expected.size}: refused")
    for name, h, want in (("md5", md5, expected.md5), ("sha256", sha256, expected.sha256)):
        if want is not None and h.hexdigest() != want.lower():
            raise DownloadError(f"{url}: {name} {h.hexdigest()}, the index gives {want}: refused")


def fetch_json(url: str, *, max_bytes: int, stall_timeout_s: float = STALL_TIMEOUT_S) -> object:
    """A JSON document (a repository's index), bounded like `fetch`."""
    with tempfile.TemporaryDirectory(prefix="voxserve-index-") as d:
        path = Path(d) / "index.json"
        fetch(url, path, max_bytes=max_bytes, stall_timeout_s=stall_timeout_s,
              total_timeout_s=max(60.0, stall_timeout_s))
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise DownloadError(f"{url}: not a JSON document ({e})") from None


@contextmanager
def staging(folder: Path) -> Iterator[Path]:
    """A temporary folder inside `folder` (so that the rename into place is atomic, on one file
    system) that no voice scan looks into (scans are not recursive); removed at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def install(files: list[tuple[Path, Path]]) -> None:
    """Rename each (staged, final) into place, the last one last: a scan that needs every file
    of a voice (Piper: NAME.onnx beside NAME.onnx.json) finds it only once the others are in."""
    for staged, final in files:
        os.replace(staged, final)
