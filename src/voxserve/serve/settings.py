"""The servers' settings read from a parsed command line and the environment: each leaf of the
settings tree (voxserve.serve.config.ServeSettings) from its flag, else its environment variable
(VOXSERVE_<NAME>), else its default; old names warned about and mapped to the new ones."""

from __future__ import annotations

import argparse
import os
import sys

from .config import DEPRECATED, ServeSettings, Setting, env_name, settings

__all__ = ["ServeSettings", "settings_from", "env_name"]


def _given(ns: argparse.Namespace, s: Setting):
    v = getattr(ns, s.name, None)
    if s.name == "api_key" and v is not None and not v.strip():
        # an empty flag would otherwise switch authentication off, over VOXSERVE_API_KEY too
        raise ValueError("--api-key is empty: give a key, or leave the flag out (VOXSERVE_API_KEY applies)")
    if v is None or v == []:
        return None
    return tuple(v) if s.name == "voices" else v


def _from_env(s: Setting, environ, name: str | None = None):
    var = env_name(name or s.name)
    raw = environ.get(var)
    if not raw:
        return None
    try:
        return s.parse(raw)
    except ValueError:
        raise ValueError(f"environment variable {var}={raw!r} is not a valid {s.name}") from None


def _deprecated(new: Setting, how: str) -> None:
    """Warn that `how` (an old flag or variable) is deprecated, naming the setting that replaces it."""
    print(f"voxserve: warning: {how} is deprecated (it goes in 0.2): use "
          f"{new.flag if how.startswith('--') else new.env}", file=sys.stderr)


def settings_from(ns: argparse.Namespace, environ=os.environ) -> ServeSettings:
    """The settings of a parsed command line: each leaf from its flag, else its environment
    variable, else the default (an old name, DEPRECATED, just below the new one's flag or
    variable, with a warning); validated."""
    by_name = {s.name: s for s in settings()}
    flags = {s.name: v for s in by_name.values() if (v := _given(ns, s)) is not None}
    envs = {s.name: v for s in by_name.values() if (v := _from_env(s, environ)) is not None}
    for old, new in DEPRECATED.items():
        s = by_name[new]
        if (v := getattr(ns, "deprecated_" + old, None)) is not None:
            _deprecated(s, "--" + old.replace("_", "-"))
            flags.setdefault(new, v)
            if old == "read_timeout":  # it also bounded the head's time, to at most 10 s
                flags.setdefault("header_timeout_s", min(by_name["header_timeout_s"].default, v))
        if environ.get(env_name(old)):
            v = _from_env(s, environ, old)
            _deprecated(s, env_name(old))
            envs.setdefault(new, v)
            if old == "read_timeout":
                envs.setdefault("header_timeout_s", min(by_name["header_timeout_s"].default, v))
    return ServeSettings.of(**{**envs, **flags}).validate()
