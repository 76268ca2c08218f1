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

from ..errors import VoiceLoadError, VoxserveError
from ..flags import (
    load_option_args,
    load_options_from,
    option_values,
    options_args,
    runtime_names,
    settings_args,
)
from .config import ServeSettings
from .settings import settings_from

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the HTTP server (OpenAI-compatible /v1/audio/speech)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    r = sub.add_parser("ray-config", help="write a Ray Serve config file (serve deploy) for these settings",
                       description="Prints a Serve config for `serve deploy` with the flags of `voxserve serve`.")
    settings_args(r)
    r.add_argument("--no-warmup", action="store_true", help="replicas report ready without a warm-up sentence")
    load_option_args(r)
    r.add_argument("--replicas", default=None, metavar="N|MIN-MAX", help="replicas, or an autoscaling range")
    r.set_defaults(func=lambda ns: _ray("cmd_ray_config", ns))


def _ray(command: str, ns: argparse.Namespace) -> int:
    """A command of voxserve.serve.ray, imported only when asked for (Ray is an extra)."""
    try:
        from . import ray
    except ModuleNotFoundError as e:
        if e.name != "ray" and not (e.name or "").startswith("ray."):
            raise
        raise ValueError("Ray Serve is not installed: pip install 'voxserve[ray]'") from None
    return getattr(ray, command)(ns)


# the settings of `voxserve serve` that `voxserve wyoming` has too (no HTTP, no API key)
_WYOMING_SETTINGS = ("voices", "device", "dtype", "max_batch_size", "max_batch_phonemes", "max_wait_ms",
                     "max_starve_ms", "max_queued_sentences", "max_queue_wait_s", "max_input_chars",
                     "max_audio_seconds", "max_sentence_audio_seconds", "body_timeout_s", "max_connections",
                     "shutdown_timeout_s", "executor", "request_timeout_s")


def _add_wyoming_parser(sub) -> None:
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

    from .build import build_engine

    wy = _wyoming_module()
    settings = settings_from(ns)
    config = wyoming_config(settings, ns.uri or settings.server.wyoming or wy.DEFAULT_URI, option_values(ns))
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


def _allocator(ns: argparse.Namespace) -> None:
    """Validate VOXSERVE_ALLOCATOR, and restart with jemalloc when that applies (once the
    flags are known to be good, so a bad one fails at once)."""
    from ..runtime import allocator

    allocator.choice(os.environ)
    if getattr(ns, "own_process", False):
        allocator.restart_with_jemalloc()


def cmd_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from .app import WS_MAX_BYTES, create_app, http_protocol
    from .build import build_engine

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
        engine = build_engine(settings, load_options_from(ns))
    except (VoiceLoadError, FileNotFoundError) as e:
        # a --voice that names nothing loadable is bad input (exit 2), like any other bad flag
        raise ValueError(str(e)) from None
    if settings.load.unload_after is not None:
        from ..engine.unload import IdleUnloader

        IdleUnloader(engine, settings.load.unload_after).start()
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
                            http=http_protocol(app), access_log=bool(ns.verbose), ws_max_size=WS_MAX_BYTES,
                            ws_per_message_deflate=False)  # audio frames barely compress: no CPU on it
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
