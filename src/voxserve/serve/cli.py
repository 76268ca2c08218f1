"""`voxserve serve`: load voices, start the engine, serve HTTP (uvicorn).

Every setting (a leaf of the settings tree, voxserve.serve.config.ServeSettings) comes, in
order of precedence, from its flag, its environment variable (VOXSERVE_<NAME>, e.g.
VOXSERVE_API_KEY, VOXSERVE_VOICES=a,b) or the dataclass default; flag and variable are the
field's name (--max-queued-sentences, VOXSERVE_MAX_QUEUED_SENTENCES).

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
import sys
from pathlib import Path

from .config import DEPRECATED, ServeSettings, Setting, env_name, settings

__all__ = ["ServeSettings", "settings_from", "load_voices", "build_engine", "add_parser"]

log = logging.getLogger(__name__)


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


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the HTTP server (OpenAI-compatible /v1/audio/speech)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from ..cli import load_option_args, settings_args

    settings_args(p)
    p.add_argument("--no-warmup", action="store_true", help="report ready without a warm-up sentence")

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
    from ..cli import load_option_args, settings_args

    r = sub.add_parser("ray-config", help="write a Ray Serve config file (serve deploy) for these settings",
                       description="Prints a Serve config for `serve deploy` with the flags of `voxserve serve`.")
    settings_args(r)
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
                     "max_starve_ms", "max_queued_sentences", "max_queue_wait_s", "max_input_chars",
                     "max_audio_seconds", "max_sentence_audio_seconds", "body_timeout_s", "max_connections",
                     "shutdown_timeout_s", "executor", "request_timeout_s")


def _add_wyoming_parser(sub) -> None:
    from ..cli import load_option_args, options_args, runtime_names, settings_args

    p = sub.add_parser("wyoming", help="run a Wyoming server (Home Assistant text to speech)",
                       description="Serve Home Assistant's Wyoming protocol (describe, synthesize, streamed "
                                   "synthesis) over the engine. Settings as for `voxserve serve`; the synthesis "
                                   "options below apply to every request (the protocol carries only a voice, "
                                   "a speaker and a language).")
    p.add_argument("--uri", default=None,
                   help="tcp://HOST:PORT or unix://PATH to listen on [env VOXSERVE_WYOMING; default "
                        "tcp://127.0.0.1:10200: this machine only]")
    settings_args(p, _WYOMING_SETTINGS + runtime_names())
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
    return wy.WyomingConfig(uri=uri, max_input_chars=settings.http.max_input_chars,
                            max_connections=settings.http.max_connections, io_timeout_s=settings.http.body_timeout_s,
                            request_timeout_s=settings.http.request_timeout_s,
                            **({"options": options} if options is not None else {})).validate()


def cmd_wyoming(ns: argparse.Namespace) -> int:
    import asyncio

    from ..cli import load_options_from, options_from
    from ..errors import VoiceLoadError

    wy = _wyoming_module()
    settings = settings_from(ns)
    config = wyoming_config(settings, ns.uri or settings.server.wyoming or wy.DEFAULT_URI, options_from(ns).validate())
    _allocator(ns)
    try:
        engine = build_engine(settings, load_options_from(ns))
    except (VoiceLoadError, FileNotFoundError) as e:
        raise ValueError(str(e)) from None

    def listening(server) -> None:
        print(f"voxserve: serving {', '.join(engine.voices)} on {server.address} (Wyoming)", flush=True)

    asyncio.run(wy.serve(engine, config, warmup=not ns.no_warmup, shutdown_timeout_s=settings.http.shutdown_timeout_s,
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
    from .. import load_voice
    from ..families import source_hint
    from ..voices.registry import check_reserved_name, register_voice, resolve_voice, voice_sources

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
    from ..engine import Engine

    return Engine(load_voices(settings, family_options), settings.engine)


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
    from .app import create_app, http_protocol

    if getattr(ns, "ray", False):
        return _ray("cmd_serve_ray", ns)
    if getattr(ns, "replicas", None) is not None:
        raise ValueError("--replicas needs --ray")
    settings = settings_from(ns)
    _allocator(ns)
    if settings.server.host not in ("127.0.0.1", "localhost", "::1") and not settings.http.api_key:
        log.warning("serving on %s without an API key: anyone who can reach it can use it", settings.server.host)
    app_config = settings.http
    wyoming = wyoming_config(settings, settings.server.wyoming) if settings.server.wyoming else None
    try:
        from ..cli import load_options_from

        engine = build_engine(settings, load_options_from(ns))
    except (VoiceLoadError, FileNotFoundError) as e:
        # a --voice that names nothing loadable is bad input (exit 2), like any other bad flag
        raise ValueError(str(e)) from None
    check_can_listen(settings.server.host, settings.server.port)  # before the announcement: a busy port is one line
    if wyoming is not None:
        kind, wy_host, wy_port = _wyoming_module().parse_uri(wyoming.uri)
        if kind == "tcp":
            check_can_listen(wy_host, wy_port)
    if ns.no_warmup:
        from dataclasses import replace

        app_config = replace(app_config, warmup=False)
    app = create_app(engine, app_config)
    _raise_fd_limit(app_config.max_connections + 256)
    config = uvicorn.Config(app, host=settings.server.host, port=settings.server.port, log_level="info" if ns.verbose else "warning",
                            timeout_graceful_shutdown=int(max(1, settings.http.shutdown_timeout_s)),
                            http=http_protocol(app), access_log=bool(ns.verbose))
    server = uvicorn.Server(config)
    lanes = ", ".join(f"{dev}: {n}{f' (+{n} urgent)' if engine.urgent_lanes[dev] else ''}"
                      for dev, n in engine.lanes.items())
    print(f"voxserve: serving {', '.join(engine.voices)} on http://{settings.server.host}:{settings.server.port} "
          f"(batches at once per device: {lanes})", flush=True)
    if wyoming is None:
        try:
            server.run()
        except SystemExit:
            if not server.started:  # bound by another process after our check (uvicorn logged why)
                raise ValueError(f"cannot listen on {settings.server.host}:{settings.server.port}") from None
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
