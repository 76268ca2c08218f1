"""Converted weights cached as safetensors, keyed by the voice file's content hash.

The first load of a Piper voice parses its ONNX graph (seconds); later loads read one
safetensors file (milliseconds, memory-mapped). An entry records the source hash, the
converter version and a digest of its own tensors; an entry that fails any check (truncated,
edited, written by another converter version) is rebuilt, never trusted.

Location: $VOXSERVE_CACHE_DIR, else the platform's user cache dir (~/.cache/voxserve).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import platformdirs

from ...models.vits import VitsDims

log = logging.getLogger(__name__)
CONVERTER_VERSION = "1"


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


def _read_entry(path: Path, source_sha: str) -> tuple[VitsDims, dict[str, np.ndarray]] | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("source_sha256") != source_sha or meta.get("converter") != CONVERTER_VERSION:
                return None
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        if _tensor_digest(tensors) != meta.get("tensors_digest"):
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
    sha = file_sha256(source)
    entry = cache_dir() / "vits" / f"{sha[:32]}.safetensors"
    if entry.exists():
        got = _read_entry(entry, sha)
        if got is not None:
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
