"""The server's settings as one tree, apart from the app, so that the command line can read
their defaults without importing the web stack (`voxserve --help` starts in well under a second).

`ServeSettings` is the tree: the HTTP app's `AppConfig`, the engine's `EngineConfig` (with its
`SchedulerConfig`), the voices to load, their `Limits`, and the families' runtime options (each
family's `Family.options_type`). Every leaf a user sets has one name at every layer: the field's
name is the flag (`max_queued_sentences`: `--max-queued-sentences`), the environment variable
(`VOXSERVE_MAX_QUEUED_SENTENCES`) and the key of `ServeSettings.of()` and of Ray's config
(`settings()` lists them). docs/configuration.md is generated from it (`python -m
voxserve.serve.config > docs/configuration.md`... see `render_doc`).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from ..engine.engine import EngineConfig
from ..families import runtime_fields, runtime_options
from ..limits import Limits
from ..voices.registry import DEFAULT_VOICE


@dataclass(frozen=True)
class AppConfig:
    """HTTP-level settings (the engine has its own)."""

    api_key: str | None = None
    """If set, every route except /health and the playground page (`/`, its assets) needs `Authorization: Bearer <key>`
    (the /v1/audio/speech/stream WebSocket too, in its handshake)."""
    max_input_chars: int = 4096
    """Longer input is refused with 413 (OpenAI's limit for /v1/audio/speech is 4096). A
    /v1/audio/speech/stream session holds at most this much text not yet spoken."""
    max_body_bytes: int = 1 << 20
    """Request bodies over this are refused with 413 before they are parsed."""
    shutdown_timeout_s: float = 30.0
    """On shutdown, in-flight requests get this long to finish."""
    warmup: bool = True
    """Run one sentence through each voice before /ready says ready."""
    request_timeout_s: float = 600.0
    """A request still running after this long is cancelled (its queued sentences dropped)."""
    header_timeout_s: float = 10.0
    """A connection must send a complete request head (request line and headers) within this long
    of opening, or of its first byte after the previous response; else it is closed (408 if it
    had sent part of one). Needs the server's protocol class, `http_protocol(app)`."""
    body_timeout_s: float = 30.0
    """A request's whole body must arrive within this long of its headers (else 408, connection
    closed), so that a slow or stalled upload cannot hold a connection open."""
    max_held_audio_mb: float = 1024.0
    """Whole (not streamed) answers in flight may hold this much audio together (MiB, at 10 bytes a
    sample: engine/held_audio.py); one that would pass it gets 429 with Retry-After, one that alone
    passes it 413. 1024: a 30-minute answer at 48 kHz fits; streamed answers are not counted."""
    max_connections: int | None = 1024
    """Open connections beyond this get 503 and are closed (with `http_protocol(app)`): far above
    what the engine admits, it only keeps a flood of idle connections from using up file
    descriptors. None: no bound."""
    stream_max_connections: int = 64
    """Open /v1/audio/speech/stream WebSockets beyond this are closed at once (code 1013, "try
    again later"): each holds text, audio and an encoder."""
    stream_idle_timeout_s: float = 30.0
    """A /v1/audio/speech/stream client that sends nothing while no audio is owed to it, or that
    takes longer than this to take a frame of its audio, is closed (its sentences dropped)."""
    max_upload_bytes: int = 8 << 20
    """POST /v1/audio/voices bodies (a prompt recording, up to 30 s) over this get 413; the
    other routes' bound is `max_body_bytes`."""
    voice_dir: Path | None = None
    """Where POST /v1/audio/voices saves voices (as `voxserve voices add`); None: the user voice
    folder (~/.local/share/voxserve/voices)."""

    def validate(self) -> "AppConfig":
        for name in ("shutdown_timeout_s", "request_timeout_s", "header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be over 0 s, not {getattr(self, name)!r}")
        if self.max_input_chars < 1 or self.max_body_bytes < 1:
            raise ValueError("max_input_chars and max_body_bytes must be at least 1")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if not 1 <= self.stream_max_connections <= 100_000:
            raise ValueError(f"stream_max_connections must be in 1..100000, not {self.stream_max_connections!r}")
        if not self.stream_idle_timeout_s > 0:
            raise ValueError(f"stream_idle_timeout_s must be over 0 s, not {self.stream_idle_timeout_s!r}")
        if not 1 <= self.max_upload_bytes <= 1 << 30:
            raise ValueError(f"max_upload_bytes must be in 1..{1 << 30}, not {self.max_upload_bytes!r}")
        if not self.max_held_audio_mb > 0:
            raise ValueError(f"max_held_audio_mb must be over 0, not {self.max_held_audio_mb!r}")
        return self


@dataclass(frozen=True)
class ServerSettings:
    """Where the servers listen."""

    host: str = "127.0.0.1"
    """Loopback only unless told otherwise."""
    port: int = 8000
    wyoming: str | None = None
    """Also serve Home Assistant's Wyoming protocol at this URI (tcp://127.0.0.1:10200), same engine."""


@dataclass(frozen=True)
class LoadSettings:
    """What loads at start, and where."""

    voices: tuple[str, ...] = (DEFAULT_VOICE,)
    """Voices loaded at start (the first is the default); requests may use only these."""
    device: str = "auto"
    dtype: str | None = None
    unload_after: float | None = None
    """A voice unused for this many seconds releases its weights, and loads again on its next
    request (None: never)."""

    def validate(self) -> "LoadSettings":
        if self.unload_after is not None and not 0 < self.unload_after <= 7 * 86400:
            raise ValueError(f"unload_after must be in (0, 604800] s, not {self.unload_after!r}")
        return self


@dataclass(frozen=True)
class ServeSettings:
    """Everything `voxserve serve` (and `wyoming`, `ray-config`) is configured by: one tree whose
    leaves a user sets by name (`of()`, the flags, the environment; see `settings()`)."""

    server: ServerSettings = field(default_factory=ServerSettings)
    http: AppConfig = field(default_factory=AppConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    load: LoadSettings = field(default_factory=LoadSettings)
    limits: Limits = field(default_factory=Limits)
    runtime: Mapping[str, Any] = field(default_factory=dict)
    """The families' runtime options by field name (`voxserve.families.runtime_fields()`), e.g.
    {"threads": 4, "max_sequences": 32}; a name several families have applies to each of them,
    one that is not here is the family's default."""

    def validate(self) -> "ServeSettings":
        self.http.validate()
        self.engine.validate()
        self.load.validate()
        self.limits.validate()
        known = runtime_fields()
        for name in self.runtime:
            if name not in known:
                raise ValueError(f"unknown runtime option {name!r} (known: {', '.join(sorted(known))})")
        for fam in {f.name: f for pairs in known.values() for f, _ in pairs}.values():
            if (options := self.runtime_options(fam)) is not None:
                options.validate()  # a bad --bert-batch fails at start, not when a voice loads
        return self

    def runtime_options(self, family):
        """A family's runtime options (its `options_type`) from `runtime`."""
        return runtime_options(family, **{k: v for k, v in self.runtime.items() if v is not None})

    @classmethod
    def of(cls, **leaves: Any) -> "ServeSettings":
        """The settings with these leaves (by name, as `settings()` lists them) set, the rest the defaults."""
        return cls().with_(**leaves)

    def with_(self, **leaves: Any) -> "ServeSettings":
        """A copy with these leaves (by name) replaced."""
        by_name = {s.name: s for s in settings()}
        for name in leaves:
            if name not in by_name:
                raise TypeError(f"no setting named {name!r}")
        out = self
        runtime = dict(self.runtime)
        for name, value in leaves.items():
            s = by_name[name]
            if s.path[0] == "runtime":
                if value is None:
                    runtime.pop(name, None)  # the families' default
                else:
                    runtime[name] = value
            else:
                out = _replace_at(out, s.path, tuple(value) if name == "voices" else value)
        return replace(out, runtime=runtime)

    def leaves(self) -> dict[str, Any]:
        """Every leaf's value by name (plain data: Ray's config file carries it)."""
        out: dict[str, Any] = {}
        for s in settings():
            if s.path[0] == "runtime":
                out[s.name] = self.runtime.get(s.name)
            else:
                node: Any = self
                for part in s.path:
                    node = getattr(node, part)
                out[s.name] = list(node) if s.name == "voices" else node
        return out


def _replace_at(node, path: tuple[str, ...], value):
    if len(path) == 1:
        return replace(node, **{path[0]: value})
    return replace(node, **{path[0]: _replace_at(getattr(node, path[0]), path[1:], value)})


@dataclass(frozen=True)
class Setting:
    """A leaf of the tree a user sets: its name is the flag (`--` + name, `-` for `_`), the
    environment variable (VOXSERVE_ + NAME) and the key everywhere else."""

    name: str
    path: tuple[str, ...]
    """Where it sits in ServeSettings, e.g. ("engine", "scheduler", "max_queued_sentences");
    ("runtime", name) for a family option."""
    type: type
    """int, float, str or bool (the annotation, None aside); voices: str, comma-separated."""
    default: Any
    help: str
    owner: type
    """The dataclass that declares it."""
    families: tuple[str, ...] = ()
    """A runtime option's families."""

    @property
    def flag(self) -> str:
        return "--voice" if self.name == "voices" else "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return env_name(self.name)

    def parse(self, raw: str):
        """A flag's or an environment variable's text as the value (ValueError if it is not one)."""
        if self.name == "voices":
            return tuple(v.strip() for v in raw.split(",") if v.strip())
        if self.type is bool:
            low = raw.strip().lower()
            if low not in ("true", "yes", "on", "1", "false", "no", "off", "0"):
                raise ValueError(raw)
            return low in ("true", "yes", "on", "1")
        return self.type(raw)


def env_name(name: str) -> str:
    return "VOXSERVE_" + name.upper()


INTERNAL = frozenset({"warmup", "frontend_lookahead", "frontend_threads", "max_length_ratio"})
"""Leaves of the tree that are no setting of the servers: `warmup` has `--no-warmup`; the front
end's lookahead and threads and the batches' length ratio are the engine's own tuning (a
program that embeds the engine may still set them in EngineConfig / SchedulerConfig)."""

DEPRECATED = {"max_queue": "max_queued_sentences", "read_timeout": "body_timeout_s",
              "max_queue_wait": "max_queue_wait_s", "shutdown_timeout": "shutdown_timeout_s"}
"""Old names (flags `--max-queue`, ..., and VOXSERVE_MAX_QUEUE, ...) still accepted, with a
warning, for one release (0.2 removes them): the setting each now is."""

HELP = {
    "stream_max_connections": "open /v1/audio/speech/stream WebSockets beyond which new ones are closed (code 1013)",
    "stream_idle_timeout_s": "seconds a /v1/audio/speech/stream client may send nothing while no audio is owed, "
                             "or take to read a frame, before it is closed",
    "max_upload_bytes": "largest POST /v1/audio/voices body (a prompt recording; 413 beyond)",
    "voice_dir": "folder where POST /v1/audio/voices saves cloned voices (default: the user voice folder)",
    "host": "address to bind (default 127.0.0.1: this machine only)",
    "port": "TCP port",
    "wyoming": "also serve Home Assistant's Wyoming protocol (TTS) at this URI, e.g. tcp://127.0.0.1:10200, "
               "on the same engine (needs the wyoming extra)",
    "voices": "voice to load: a registry name, bark:DIR, sbv2:DIR, cosyvoice2:DIR, a Piper .onnx path (or piper:PATH), "
              "or NAME=SOURCE to name it "
              "(repeatable; the first is the default)",
    "device": "cpu, cuda, cuda:N or auto",
    "unload_after": "seconds after which a voice no request has used releases its weights (and GPU memory); "
                    "its next request waits for it to load again (off by default)",
    "max_held_audio_mb": "MiB of audio whole (not streamed) answers in flight may hold together: a request "
                         "that would pass it gets 429, one that alone passes it 413",
    "dtype": "fp32 (default); bf16 (CPU with AVX512-BF16/AMX, or CUDA); fp16 (CUDA)",
    "api_key": "require 'Authorization: Bearer KEY' on every route but /health (env VOXSERVE_API_KEY)",
    "max_input_chars": "longest input accepted (413 beyond)",
    "max_body_bytes": "largest request body accepted (413 beyond)",
    "shutdown_timeout_s": "seconds in-flight requests get to finish on shutdown",
    "request_timeout_s": "seconds a request may run before it is cancelled (504)",
    "header_timeout_s": "seconds a client has to send a request's head (408 and disconnected beyond)",
    "body_timeout_s": "seconds a client has to send a request's body after its head (408 and disconnected "
                      "beyond); Wyoming: to send the rest of an event it has begun",
    "max_connections": "open connections beyond which new ones get 503 (idle ones included)",
    "executor": "how a CPU runs its batches: auto (two at once where the voices allow, short work at a "
                "higher OS priority) or serial (one at a time on every thread)",
    "max_queue_wait_s": "seconds a new request would wait for the work queued ahead of it (at the observed "
                        "speed) beyond which it gets 429 (0.1..3600)",
    "max_batch_size": "sentences per batch",
    "max_batch_phonemes": "phoneme ids per batch",
    "max_wait_ms": "longest a sentence waits for companions before its batch starts",
    "max_queued_sentences": "queued sentences beyond which new requests get 429",
    "max_starve_ms": "a request waiting this long for its next sentence goes before any priority",
    "max_audio_seconds": "seconds of audio one request may make (413 beyond)",
    "max_sentence_audio_seconds": "seconds of audio one sentence may make (413 beyond)",
}
"""Each server setting's help (a family's runtime option has its own, in its field's metadata)."""


def _scalar(hint) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return args[0] if args[0] in (int, float, bool) else str


def _walk(cls: type, path: tuple[str, ...]):
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name == "runtime" and cls is ServeSettings:
            continue
        if is_dataclass(hints[f.name]):
            yield from _walk(hints[f.name], (*path, f.name))
        elif f.name not in INTERNAL:
            default = f.default if f.default is not MISSING else f.default_factory()
            yield Setting(f.name, (*path, f.name), _scalar(hints[f.name]), default, HELP[f.name], cls)


def settings() -> list[Setting]:
    """Every leaf a user sets, in tree order: the server's, then each family's runtime options
    (a name that several families share is one setting)."""
    out = list(_walk(ServeSettings, ()))
    for name, pairs in runtime_fields().items():
        fam, f = pairs[0]
        hint = typing.get_type_hints(fam.options_type)[name]
        helps = {p.metadata.get("help", "") for _, p in pairs}
        help_ = " / ".join(sorted(h for h in helps if h))
        default = f.default if f.default is not MISSING else None
        out.append(Setting(name, ("runtime", name), _scalar(hint), default, help_, fam.options_type,
                           tuple(fm.name for fm, _ in pairs)))
    names = [s.name for s in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:  # a flag can set only one thing
        raise TypeError(f"settings named twice in the tree: {sorted(dup)}")
    return out
