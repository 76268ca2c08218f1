"""The settings of `voxserve serve` (and of `voxserve wyoming` and the Ray replicas): one
dataclass, read from flags, then environment variables (VOXSERVE_<NAME>), then its defaults;
the engine's, the app's and the work bounds' configurations derived from it. No argparse
parser here (serve/cli.py builds the flags) and nothing heavy: the CLI reads the defaults.
"""

from __future__ import annotations

import argparse
import os
import typing
from dataclasses import dataclass, fields

from ..engine.engine import EngineConfig
from ..engine.scheduler import SchedulerConfig
from ..limits import Limits
from ..voices.registry import DEFAULT_VOICE
from .config import AppConfig

_SCHED = SchedulerConfig()
_APP = AppConfig()
_ENG = EngineConfig()
_LIM = Limits()


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    """Loopback only unless told otherwise."""
    port: int = 8000
    voices: tuple[str, ...] = (DEFAULT_VOICE,)
    """Voices loaded at start (the first is the default); requests may use only these."""
    device: str = "auto"
    dtype: str | None = None
    max_batch_size: int = _SCHED.max_batch_size
    max_batch_phonemes: int = _SCHED.max_batch_phonemes
    max_wait_ms: float = _SCHED.max_wait_ms
    max_starve_ms: float = _SCHED.max_starve_ms
    """A request waiting this long for its next sentence is served before any priority."""
    max_queue: int = _SCHED.max_queued_sentences
    """Sentences queued before new requests get 429."""
    max_input_chars: int = _APP.max_input_chars
    max_body_bytes: int = _APP.max_body_bytes
    max_audio_seconds: float = _LIM.max_audio_seconds
    """Audio one request may make; a request that would make more is refused (413)."""
    max_sentence_audio_seconds: float = _LIM.max_sentence_audio_seconds
    """Audio one sentence may make (413 beyond)."""
    read_timeout: float = _APP.body_timeout_s
    """Seconds a client has to send a request's body; its headers get at most 10 s of it."""
    max_connections: int = _APP.max_connections
    """Open connections beyond this get 503."""
    api_key: str | None = None
    shutdown_timeout: float = _APP.shutdown_timeout_s
    threads: int | None = None
    """CPU intra-op threads for the model (None: PyTorch's default)."""
    executor: str = _ENG.executor
    """How a CPU runs its batches: auto or serial (EngineConfig.executor)."""
    max_queue_wait: float = _ENG.max_queue_wait_s
    """Seconds of work queued ahead of a new request (at the device's observed speed) beyond which it gets 429."""
    wyoming: str | None = None
    """Also serve Home Assistant's Wyoming protocol at this URI (tcp://127.0.0.1:10200), same engine."""

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(max_batch_size=self.max_batch_size, max_batch_phonemes=self.max_batch_phonemes,
                               max_wait_ms=self.max_wait_ms, max_starve_ms=self.max_starve_ms,
                               max_queued_sentences=self.max_queue).validate()

    def engine_config(self) -> EngineConfig:
        return EngineConfig(scheduler=self.scheduler_config(), executor=self.executor,
                            max_queue_wait_s=self.max_queue_wait).validate()

    def app_config(self) -> AppConfig:
        if self.read_timeout <= 0 or self.max_connections < 1:
            raise ValueError("read_timeout must be over 0 s and max_connections at least 1")
        return AppConfig(api_key=self.api_key or None, max_input_chars=self.max_input_chars,
                         max_body_bytes=self.max_body_bytes, shutdown_timeout_s=self.shutdown_timeout,
                         header_timeout_s=min(_APP.header_timeout_s, self.read_timeout),
                         body_timeout_s=self.read_timeout, max_connections=self.max_connections)

    def limits(self) -> Limits:
        """The work bound every loaded voice applies."""
        return Limits(max_audio_seconds=self.max_audio_seconds,
                      max_sentence_audio_seconds=self.max_sentence_audio_seconds).validate()


def env_name(field: str) -> str:
    return "VOXSERVE_" + field.upper()


def scalar_type(name: str) -> type:
    """int or float for a numeric setting (its annotation, None aside), else str; flags and
    environment variables both convert through it."""
    hint = typing.get_type_hints(ServeSettings)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return args[0] if args[0] in (int, float) else str


def _convert(f, raw: str):
    if f.name == "voices":
        return tuple(v.strip() for v in raw.split(",") if v.strip())
    return scalar_type(f.name)(raw)


def settings_from(ns: argparse.Namespace, environ=os.environ) -> ServeSettings:
    kw = {}
    for f in fields(ServeSettings):
        v = getattr(ns, f.name, None)
        if f.name == "api_key" and v is not None and not v.strip():
            # an empty flag would otherwise switch authentication off, over VOXSERVE_API_KEY too
            raise ValueError("--api-key is empty: give a key, or leave the flag out (VOXSERVE_API_KEY applies)")
        if v is not None and v != []:
            kw[f.name] = tuple(v) if f.name == "voices" else v
            continue
        raw = environ.get(env_name(f.name))
        if raw:
            try:
                kw[f.name] = _convert(f, raw)
            except ValueError:
                raise ValueError(f"environment variable {env_name(f.name)}={raw!r} is not a valid {f.name}") from None
    return ServeSettings(**kw)


