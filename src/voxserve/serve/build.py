"""The engine a server runs, built from its settings: the voices of `--voice` loaded (by name,
path or `NAME=SOURCE`) and registered under the names requests use."""

from __future__ import annotations

import re
from pathlib import Path

from .. import load_voice
from ..engine import Engine
from ..families import source_hint
from ..voices.registry import check_reserved_name, register_voice, resolve_voice, voice_sources
from .config import ServeSettings


_VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def parse_voice_spec(spec: str) -> tuple[str | None, str]:
    """`NAME=SOURCE` -> (NAME, SOURCE); anything else -> (None, spec). NAME is letters, digits,
    '.', '_' and '-' (so a path holding '=' after a '/' or ':' stays a path)."""
    name, sep, source = spec.partition("=")
    if sep and source and _VOICE_NAME.fullmatch(name):
        return name, source
    return None, spec


def load_voices(settings: ServeSettings, family_options: dict | None = None) -> dict:
    """The voices to serve, by the name requests use. A voice loaded from a path (PREFIX:PATH
    such as bark:DIR, a Piper .onnx) is named after its directory (file) unless `NAME=` names it, and that name is
    registered in this process's registry, so the name resolves to what the server loaded.
    Two voices with one name are refused (the second would silently replace the first)."""
    family_options = family_options or {}  # e.g. bert_dir (voxserve.families.load_options)
    voices: dict = {}
    origin: dict[str, str] = {}
    for spec in settings.load.voices:
        name, source = parse_voice_spec(spec)
        from_path = source not in voice_sources()
        if from_path and (hint := source_hint(Path(source))):  # e.g. a Bark directory without its prefix
            raise ValueError(hint)
        src = resolve_voice(source)  # the operator's command line: paths allowed here
        v = load_voice(source, device=settings.load.device, dtype=settings.load.dtype, limits=settings.limits,
                       **settings.runtime, **family_options)
        if name is not None:
            v.name = name
        try:
            check_reserved_name(v.name)
        except ValueError as e:
            raise ValueError(f"--voice {spec}: {e} (--voice OTHER_NAME={source})") from None
        if v.name in voices:
            raise ValueError(f"two voices are named {v.name!r} ({origin[v.name]} and {spec}): "
                             f"name one with --voice OTHER_NAME={source}")
        if name is not None or from_path:
            register_voice(v.name, src.path, src.config_path, family=src.family)
        voices[v.name] = v
        origin[v.name] = spec
    return voices


def build_engine(settings: ServeSettings, family_options: dict | None = None):
    return Engine(load_voices(settings, family_options), settings.engine)
