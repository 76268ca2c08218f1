"""Piper voices by name from the public Piper voice repository (rhasspy/piper-voices), laid out
as piper-tts's own downloader (`python -m piper.download_voices`) expects:
BASE/LANG_FAMILY/LANG_CODE/NAME/QUALITY/LANG_CODE-NAME-QUALITY.onnx[.json], with BASE/voices.json
indexing every voice (its files' `size_bytes` and `md5_digest`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...errors import UnknownVoiceError
from ...voices.download import DownloadError, Expected, check_base_url, fetch, fetch_json, install, staging

BASE_URL = "https://huggingface.co/rhasspy/piper-voices/resolve/main/"
INDEX = "voices.json"
MAX_MODEL_BYTES = 1 << 30
"""The largest Piper voices are about 120 MB; a file past this is not a voice."""
MAX_CONFIG_BYTES = 8 << 20
MAX_INDEX_BYTES = 64 << 20

# LANG_REGION-NAME-QUALITY (en_US-lessac-medium, zh_CN-huayan-x_low): letters, digits and `_`
# only, so that no part can leave the repository's folders or the destination folder
NAME = re.compile(r"(?P<family>[A-Za-z]{2,3})_(?P<region>[A-Za-z0-9]{2,3})-(?P<name>[A-Za-z0-9_]+)-(?P<quality>[A-Za-z0-9_]+)")


def matches(name: str) -> bool:
    return NAME.fullmatch(name) is not None


def voice_path(name: str) -> str:
    """The voice's folder and file stem below the base URL; ValueError for a malformed name."""
    m = NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"{name!r} is not a Piper voice name: LANGUAGE_REGION-NAME-QUALITY, e.g. "
                         f"en_US-lessac-medium (letters, digits and _ in each part)")
    lang = f"{m['family']}_{m['region']}"
    return f"{m['family']}/{lang}/{m['name']}/{m['quality']}/{name}"


def _expected(entry: dict, path: str):
    info = (entry.get("files") or {}).get(path)
    if not isinstance(info, dict):
        raise DownloadError(f"the repository's index lists no file {path}")
    size = info.get("size_bytes")
    return Expected(size=size if isinstance(size, int) else None, md5=info.get("md5_digest") or None,
                    sha256=info.get("sha256_digest") or None)


def fetch_voice(name: str, folder: Path, base_url: str | None = None, *, force: bool = False,
                stall_timeout_s: float | None = None) -> tuple[Path, bool]:
    """Download the Piper voice `name` into `folder` (NAME.onnx + NAME.onnx.json), verified:
    (its .onnx path, True). One installed there already is kept unless `force`: (path, False)."""
    # here, not at the top: urllib, http.client and ssl take ~0.1 s that `voxserve voices` (which
    # imports this family) need not pay
    base = check_base_url(base_url or BASE_URL)
    rel = voice_path(name)  # before any request: a bad name is bad input
    folder = Path(folder).expanduser()
    model, config = folder / f"{name}.onnx", folder / f"{name}.onnx.json"
    if not force and model.exists() and config.exists():
        return model, False
    timeouts = {} if stall_timeout_s is None else {"stall_timeout_s": stall_timeout_s}
    index = fetch_json(base + INDEX, max_bytes=MAX_INDEX_BYTES, **timeouts)
    entry = index.get(name) if isinstance(index, dict) else None
    if not isinstance(entry, dict):
        known = sorted(index) if isinstance(index, dict) else []
        raise UnknownVoiceError(name, known, hint=f"the Piper voice repository at {base} has no such voice "
                                                  f"(its index: {base}{INDEX})", list_available=False)
    with staging(folder) as tmp:
        files = []
        for suffix, limit in ((".onnx", MAX_MODEL_BYTES), (".onnx.json", MAX_CONFIG_BYTES)):
            staged = tmp / f"{name}{suffix}"
            fetch(base + rel + suffix, staged, _expected(entry, rel + suffix), max_bytes=limit, **timeouts)
            files.append((staged, folder / staged.name))
        _check_loads(tmp / f"{name}.onnx", name)
        install(files)  # the .onnx.json last: a scan finds the voice only once both are in
    return model, True


def _check_loads(model: Path, name: str) -> None:
    """The staged voice loads through the Piper loader (config parsed, every tensor checked)."""
    from .loader import load_piper_voice

    try:
        json.loads(model.with_name(model.name + ".json").read_text(encoding="utf-8"))
        load_piper_voice(model, name=name, device="cpu")  # its converted weights cached for later
    except Exception as e:  # whatever the loader meets in a file it cannot run
        raise DownloadError(f"the downloaded voice {name!r} does not load, so it was not installed: {e}") from None
