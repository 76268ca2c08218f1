"""`voxserve serve`: load voices, start the engine, serve HTTP (uvicorn).

Every setting comes, in order of precedence, from its flag, its environment variable
(VOXSERVE_<NAME>, e.g. VOXSERVE_API_KEY, VOXSERVE_VOICES=a,b) or the dataclass default.

Voices: `--voice NAME` loads a registered voice; `--voice bark:DIR` (or a Piper .onnx path)
loads from a path at start and serves it under the directory's (file's) name;
`--voice NAME=bark:DIR` chooses the name. Requests name voices only by these names: a request
never makes the server open a path.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import typing
from dataclasses import dataclass, fields
from pathlib import Path

from ..engine.engine import EngineConfig
from ..engine.scheduler import SchedulerConfig
from ..limits import Limits
from ..voices.registry import DEFAULT_VOICE
from .config import AppConfig

log = logging.getLogger(__name__)
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


_HELP = {
    "host": "address to bind (default 127.0.0.1: this machine only)",
    "port": "TCP port",
    "voices": "voice to load: a registry name, bark:DIR, sbv2:DIR, a Piper .onnx path, or NAME=SOURCE to name it "
              "(repeatable; the first is the default)",
    "device": "cpu, cuda, cuda:N or auto",
    "dtype": "fp32 (default); bf16 (CPU with AVX512-BF16/AMX, or CUDA); fp16 (CUDA)",
    "max_batch_size": "sentences per batch",
    "max_batch_phonemes": "phoneme ids per batch",
    "max_wait_ms": "longest a sentence waits for companions before its batch starts",
    "max_queue": "queued sentences beyond which new requests get 429",
    "max_queue_wait": "seconds a new request would wait for the work queued ahead of it (at the observed "
                      "speed) beyond which it gets 429 (0.1..3600)",
    "max_starve_ms": "a request waiting this long for its next sentence goes before any priority",
    "max_input_chars": "longest input accepted (413 beyond)",
    "max_body_bytes": "largest request body accepted (413 beyond)",
    "max_audio_seconds": "seconds of audio one request may make (413 beyond)",
    "max_sentence_audio_seconds": "seconds of audio one sentence may make (413 beyond)",
    "read_timeout": "seconds a client has to send a request's body, and at most 10 of them for its headers; "
                    "a slower client gets 408 and is disconnected",
    "max_connections": "open connections beyond which new ones get 503 (idle ones included)",
    "api_key": "require 'Authorization: Bearer KEY' on every route but /health (env VOXSERVE_API_KEY)",
    "shutdown_timeout": "seconds in-flight requests get to finish on shutdown",
    "threads": "CPU threads for the model",
    "wyoming": "also serve Home Assistant's Wyoming protocol (TTS) at this URI, e.g. tcp://127.0.0.1:10200, "
               "on the same engine (needs the wyoming extra)",
    "executor": "how a CPU runs its batches: auto (two at once where the voices allow, short work at a "
                "higher OS priority) or serial (one at a time on every thread)",
}


def _env_name(field: str) -> str:
    return "VOXSERVE_" + field.upper()


def _scalar_type(name: str) -> type:
    """int or float for a numeric setting (its annotation, None aside), else str; flags and
    environment variables both convert through it."""
    hint = typing.get_type_hints(ServeSettings)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return args[0] if args[0] in (int, float) else str


def _convert(f, raw: str):
    if f.name == "voices":
        return tuple(v.strip() for v in raw.split(",") if v.strip())
    return _scalar_type(f.name)(raw)


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
        raw = environ.get(_env_name(f.name))
        if raw:
            try:
                kw[f.name] = _convert(f, raw)
            except ValueError:
                raise ValueError(f"environment variable {_env_name(f.name)}={raw!r} is not a valid {f.name}") from None
    return ServeSettings(**kw)


def _settings_args(p: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """A flag for each ServeSettings field (those in `names`, else all)."""
    for f in fields(ServeSettings):
        if names is not None and f.name not in names:
            continue
        flag = "--voice" if f.name == "voices" else "--" + f.name.replace("_", "-")
        default_shown = ",".join(f.default) if isinstance(f.default, tuple) else f.default
        help_ = f"{_HELP.get(f.name, '')} [env {_env_name(f.name)}; default {default_shown}]"
        if f.name == "voices":
            p.add_argument(flag, dest="voices", action="append", default=None, help=help_)
        else:
            p.add_argument(flag, dest=f.name, type=_scalar_type(f.name), default=None, help=help_)


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the HTTP server (OpenAI-compatible /v1/audio/speech)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _settings_args(p)
    p.add_argument("--no-warmup", action="store_true", help="report ready without a warm-up sentence")
    from ..cli import load_option_args

    load_option_args(p)
    p.add_argument("--ray", action="store_true",
                   help="run on Ray Serve on this machine: one engine per replica (needs voxserve[ray])")
    p.add_argument("--replicas", default=None, metavar="N|MIN-MAX",
                   help="with --ray: replicas, or an autoscaling range (default 1); a CPU replica uses --threads "
                        "CPUs (default: this machine's CPUs shared out between MAX replicas), a GPU one 1 GPU")
    p.set_defaults(func=cmd_serve)
    _add_wyoming_parser(sub)
    _add_ray_config_parser(sub)


def _add_ray_config_parser(sub) -> None:
    from ..cli import load_option_args

    r = sub.add_parser("ray-config", help="write a Ray Serve config file (serve deploy) for these settings",
                       description="Prints a Serve config for `serve deploy` with the flags of `voxserve serve`.")
    _settings_args(r)
    r.add_argument("--no-warmup", action="store_true", help="replicas report ready without a warm-up sentence")
    load_option_args(r)
    r.add_argument("--replicas", default=None, metavar="N|MIN-MAX", help="replicas, or an autoscaling range")
    r.set_defaults(func=lambda ns: _ray("cmd_ray_config", ns))


def _ray(command: str, ns: argparse.Namespace) -> int:
    """A command of voxserve.ray_serve, imported only when asked for (Ray is an extra)."""
    try:
        from .. import ray_serve
    except ModuleNotFoundError as e:
        if e.name != "ray" and not (e.name or "").startswith("ray."):
            raise
        raise ValueError("Ray Serve is not installed: pip install 'voxserve[ray]'") from None
    return getattr(ray_serve, command)(ns)


# the settings of `voxserve serve` that `voxserve wyoming` has too (no HTTP, no API key)
_WYOMING_SETTINGS = ("voices", "device", "dtype", "max_batch_size", "max_batch_phonemes", "max_wait_ms",
                     "max_starve_ms", "max_queue", "max_queue_wait", "max_input_chars", "max_audio_seconds",
                     "max_sentence_audio_seconds", "read_timeout", "max_connections", "shutdown_timeout",
                     "threads", "executor")


def _add_wyoming_parser(sub) -> None:
    from ..cli import load_option_args, options_args

    p = sub.add_parser("wyoming", help="run a Wyoming server (Home Assistant text to speech)",
                       description="Serve Home Assistant's Wyoming protocol (describe, synthesize, streamed "
                                   "synthesis) over the engine. Settings as for `voxserve serve`; the synthesis "
                                   "options below apply to every request (the protocol carries only a voice, "
                                   "a speaker and a language).")
    p.add_argument("--uri", default=None,
                   help="tcp://HOST:PORT or unix://PATH to listen on [env VOXSERVE_WYOMING; default "
                        "tcp://127.0.0.1:10200: this machine only]")
    _settings_args(p, _WYOMING_SETTINGS)
    p.add_argument("--no-warmup", action="store_true", help="listen without a warm-up sentence first")
    load_option_args(p)
    options_args(p)
    p.set_defaults(func=cmd_wyoming)


def _wyoming_module():
    try:
        from . import wyoming
    except ModuleNotFoundError as e:
        if e.name != "wyoming":
            raise
        from ..errors import VoxserveError

        raise VoxserveError("the Wyoming server needs the wyoming package: pip install 'voxserve[wyoming]'") from None
    return wyoming


def wyoming_config(settings: ServeSettings, uri: str, options=None):
    """The Wyoming server's bounds from the serve settings (text, connections, read timeout)."""
    wy = _wyoming_module()
    kind, host, _ = wy.parse_uri(uri)
    if kind == "tcp" and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("Wyoming on %s: the protocol has no authentication; anyone who can reach it can use it", host)
    return wy.WyomingConfig(uri=uri, max_input_chars=settings.max_input_chars,
                            max_connections=settings.max_connections, io_timeout_s=settings.read_timeout,
                            **({"options": options} if options is not None else {})).validate()


def cmd_wyoming(ns: argparse.Namespace) -> int:
    import asyncio

    from ..cli import load_options_from, options_from
    from ..errors import VoiceLoadError

    wy = _wyoming_module()
    settings = settings_from(ns)
    config = wyoming_config(settings, ns.uri or settings.wyoming or wy.DEFAULT_URI, options_from(ns).validate())
    _allocator(ns)
    try:
        engine = build_engine(settings, load_options_from(ns))
    except (VoiceLoadError, FileNotFoundError) as e:
        raise ValueError(str(e)) from None

    def listening(server) -> None:
        print(f"voxserve: serving {', '.join(engine.voices)} on {server.address} (Wyoming)", flush=True)

    asyncio.run(wy.serve(engine, config, warmup=not ns.no_warmup, shutdown_timeout_s=settings.shutdown_timeout,
                         on_ready=listening))
    return 0


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
    from .. import RuntimeOptions, load_voice
    from ..families import source_hint
    from ..voices.registry import check_reserved_name, register_voice, resolve_voice, voice_sources

    runtime = RuntimeOptions(threads=settings.threads) if settings.threads else None
    family_options = family_options or {}  # e.g. bert_dir (voxserve.families.load_options)
    voices: dict = {}
    origin: dict[str, str] = {}
    for spec in settings.voices:
        name, source = parse_voice_spec(spec)
        from_path = source not in voice_sources()
        if from_path and (hint := source_hint(Path(source))):  # e.g. a Bark directory without its prefix
            raise ValueError(hint)
        src = resolve_voice(source)  # the operator's command line: paths allowed here
        v = load_voice(source, device=settings.device, dtype=settings.dtype, runtime=runtime,
                       limits=settings.limits(), **family_options)
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
    from ..engine import Engine

    return Engine(load_voices(settings, family_options), settings.engine_config())


def _allocator(ns: argparse.Namespace) -> None:
    """Validate VOXSERVE_ALLOCATOR, and restart with jemalloc when that applies (once the
    flags are known to be good, so a bad one fails at once)."""
    from ..runtime import allocator

    allocator.choice(os.environ)
    if getattr(ns, "own_process", False):
        allocator.restart_with_jemalloc()


def cmd_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from ..errors import VoiceLoadError
    from .app import WS_MAX_BYTES, create_app, http_protocol

    if getattr(ns, "ray", False):
        return _ray("cmd_serve_ray", ns)
    if getattr(ns, "replicas", None) is not None:
        raise ValueError("--replicas needs --ray")
    settings = settings_from(ns)
    _allocator(ns)
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_key:
        log.warning("serving on %s without an API key: anyone who can reach it can use it", settings.host)
    app_config = settings.app_config()
    wyoming = wyoming_config(settings, settings.wyoming) if settings.wyoming else None
    try:
        from ..cli import load_options_from

        engine = build_engine(settings, load_options_from(ns))
    except (VoiceLoadError, FileNotFoundError) as e:
        # a --voice that names nothing loadable is bad input (exit 2), like any other bad flag
        raise ValueError(str(e)) from None
    check_can_listen(settings.host, settings.port)  # before the announcement: a busy port is one line
    if wyoming is not None:
        kind, wy_host, wy_port = _wyoming_module().parse_uri(wyoming.uri)
        if kind == "tcp":
            check_can_listen(wy_host, wy_port)
    if ns.no_warmup:
        from dataclasses import replace

        app_config = replace(app_config, warmup=False)
    app = create_app(engine, app_config)
    _raise_fd_limit(app_config.max_connections + 256)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info" if ns.verbose else "warning",
                            timeout_graceful_shutdown=int(max(1, settings.shutdown_timeout)),
                            http=http_protocol(app), access_log=bool(ns.verbose), ws_max_size=WS_MAX_BYTES,
                            ws_per_message_deflate=False)  # audio frames barely compress: no CPU on it
    server = uvicorn.Server(config)
    lanes = ", ".join(f"{dev}: {n}{f' (+{n} urgent)' if engine.urgent_lanes[dev] else ''}"
                      for dev, n in engine.lanes.items())
    print(f"voxserve: serving {', '.join(engine.voices)} on http://{settings.host}:{settings.port} "
          f"(batches at once per device: {lanes})", flush=True)
    if wyoming is None:
        try:
            server.run()
        except SystemExit:
            if not server.started:  # bound by another process after our check (uvicorn logged why)
                raise ValueError(f"cannot listen on {settings.host}:{settings.port}") from None
            raise
        return 0
    import asyncio

    from .wyoming import serve_with_http

    def listening(wy_server) -> None:
        print(f"voxserve: Wyoming on {wy_server.address} (same engine)", flush=True)

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:  # what server.run() does
        runner.run(serve_with_http(server, app.state.ready, engine, wyoming, on_ready=listening))
    return 0


def check_can_listen(host: str, port: int) -> None:
    """Fail (bad input: exit 2) when HOST:PORT cannot be listened on (in use, not ours to bind,
    no such address), as uvicorn would bind it (SO_REUSEADDR: a port in TIME_WAIT is free)."""
    import errno
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            why = ("another program listens there: stop it or give --port N" if e.errno == errno.EADDRINUSE
                   else e.strerror or str(e))
            raise ValueError(f"cannot listen on {host}:{port}: {why}") from None


def _raise_fd_limit(needed: int) -> None:
    """Lift the soft open-files limit (often 1024) toward `needed`, within the hard limit, so that
    --max-connections, not EMFILE, is what bounds connections."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            return
    if want < needed:
        log.warning("the open-files limit (%d) is below what --max-connections needs (%d)", want, needed)
