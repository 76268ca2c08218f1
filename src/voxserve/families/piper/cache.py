"""Converted weights cached as safetensors, keyed by the voice file's content hash.

The first load of a Piper voice parses its ONNX graph (seconds); later loads read one
safetensors file (milliseconds, memory-mapped). An entry records the source hash, the
converter version and a digest of its own tensors; an entry that fails any check (truncated,
edited, written by another converter version) is rebuilt, never trusted.

Hashing the voice file and the entry's tensors costs more than the rest of a load (a
command line's `say` pays it each time), so a small note per voice file remembers both
files' identity (device, inode, size, mtime, ctime) as they were when last hashed and
checked: while neither file's identity changed, neither is hashed again. As git does with its
index, a file changed within RACY_NS of being noted is not noted (a filesystem's coarse
timestamps could hide a later edit), so it is checked again at the next load.

Location: $VOXSERVE_CACHE_DIR, else the platform's user cache dir (~/.cache/voxserve).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import platformdirs

from ...models.vits import VitsDims

log = logging.getLogger(__name__)
CONVERTER_VERSION = "1"
RACY_NS = 2_000_000_000  # the coarsest common file timestamp (FAT: 2 s)


def cache_dir() -> Path:
    env = os.environ.get("VOXSERVE_CACHE_DIR")
    if env:
        return Path(env)

    return Path(platformdirs.user_cache_dir("voxserve"))


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _tensor_digest(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(np.ascontiguousarray(tensors[k]).tobytes())
    return h.hexdigest()


def dims_to_json(dims: VitsDims) -> str:
    return json.dumps(dataclasses.asdict(dims), sort_keys=True)


def dims_from_json(s: str) -> VitsDims:
    d = json.loads(s)
    for k in ("resblock_kernel_sizes", "upsample_rates", "upsample_kernel_sizes"):
        d[k] = tuple(d[k])
    d["resblock_dilation_sizes"] = tuple(tuple(x) for x in d["resblock_dilation_sizes"])
    return VitsDims(**d)


def file_identity(path: str | Path) -> list[int] | None:
    """[device, inode, size, mtime_ns, ctime_ns] of a file whose timestamps are older than
    RACY_NS (None otherwise: an edit within the timestamps' resolution could go unseen)."""
    st = os.stat(path)
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _note_path(source: Path) -> Path:
    key = hashlib.blake2b(str(source.resolve()).encode(), digest_size=16).hexdigest()
    return cache_dir() / "vits" / "checked" / f"{key}.json"


def _read_note(source: Path) -> dict:
    try:
        note = json.loads(_note_path(source).read_text())
        return note if isinstance(note, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_note(source: Path, note: dict) -> None:
    path = _note_path(source)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(note, f)
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache: every load hashes, as before
        log.debug("could not write %s (%s)", path, e)


def _read_entry(path: Path, source_sha: str, verify: bool = True) -> tuple[VitsDims, dict[str, np.ndarray]] | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("source_sha256") != source_sha or meta.get("converter") != CONVERTER_VERSION:
                return None
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        if verify and _tensor_digest(tensors) != meta.get("tensors_digest"):
            return None
        return dims_from_json(meta["dims"]), tensors
    except Exception as e:  # truncated / garbage / wrong schema: rebuild
        log.warning("voice cache entry %s is unusable (%s); rebuilding it", path, e)
        return None


def _write_entry(path: Path, source_sha: str, dims: VitsDims, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "source_sha256": source_sha,
        "converter": CONVERTER_VERSION,
        "dims": dims_to_json(dims),
        "tensors_digest": _tensor_digest(tensors),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)  # atomic: readers never see a half-written entry
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_cached(
    source: str | Path,
    convert: Callable[[Path], tuple[VitsDims, dict[str, np.ndarray]]],
    use_cache: bool = True,
) -> tuple[VitsDims, dict[str, np.ndarray]]:
    """Weights of `source`, from the cache if a valid entry exists, else converted and stored."""
    source = Path(source)
    if not use_cache:
        return convert(source)
    note = _read_note(source)
    ident = file_identity(source)
    known = ident is not None and note.get("source") == ident and isinstance(note.get("sha256"), str)
    sha = note["sha256"] if known else file_sha256(source)
    entry = cache_dir() / "vits" / f"{sha[:32]}.safetensors"
    if entry.exists():
        entry_ident = file_identity(entry)
        checked = known and entry_ident is not None and note.get("entry") == entry_ident
        got = _read_entry(entry, sha, verify=not checked)
        if got is not None:
            if not checked:
                _write_note(source, {"source": ident, "sha256": sha, "entry": entry_ident})
            return got
    dims, tensors = convert(source)
    from safetensors import SafetensorError

    try:
        _write_entry(entry, sha, dims, tensors)
    except (OSError, SafetensorError) as e:
        # read-only home, full disk (safetensors reports a failed write as its own error, not
        # OSError): the voice is loaded all the same, only the next load converts it again
        log.warning("could not write the voice cache at %s (%s); going on without it", entry, e)
    return dims, tensors
