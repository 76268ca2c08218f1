"""voxserve on Ray Serve (the `ray` extra): each replica runs one `Engine` behind the same FastAPI
app `voxserve serve` builds (`serve.app.create_app`), through Serve's FastAPI ingress, so the
routes, errors and streaming are those of the plain server.

`voxserve serve --ray --replicas N|MIN-MAX` runs it on this machine; `voxserve ray-config`
writes the Serve config file for `serve deploy` on a cluster (README, "Scale-out on Ray Serve";
docs/serving.md, "Ray Serve").

What each replica reserves comes from the device: a GPU replica 1 GPU (and 1 CPU for its front
end), a CPU replica `threads` CPUs, which its model also uses as intra-op threads.
`max_ongoing_requests` is the engine's own count bound (`--max-queued-sentences`: every admitted request
holds a queued sentence or a waiting slot), so a busy replica answers 429 from its admission
rather than Ray queueing without end; Ray's queue in front of the replicas is bounded too
(`max_queued_requests`; Ray answers 503 past it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import dataclass, replace

import ray
import yaml
from ray import serve

from ..flags import load_options_from
from .app import create_app
from .build import build_engine
from .ray_proxy import CALLBACK_ENV, PROXY_CALLBACK
from .settings import ServeSettings, settings_from

APP_NAME = "voxserve"
DEPLOYMENT = "VoxserveReplica"
REPLICA_HEADER = "x-voxserve-replica"
"""Response header naming the replica that served a request (`<replica id>/<pid>`)."""
API_KEY_ENV = "VOXSERVE_API_KEY"
"""Replicas read the API key from their environment (never from the config file)."""
WARMUP_TIMEOUT_S = 600.0
"""Longest a new replica's warm-up may take before Serve counts its start as failed."""


@dataclass(frozen=True)
class ReplicaPlan:
    """How many replicas, and what each reserves and admits (derived from ServeSettings)."""

    min_replicas: int
    max_replicas: int
    gpu: bool
    cpus: int
    """CPUs each replica reserves (a CPU replica's model runs this many threads)."""
    max_ongoing_requests: int

    def validate(self) -> "ReplicaPlan":
        if not 1 <= self.min_replicas <= self.max_replicas <= 1024:
            raise ValueError(f"replicas must be 1 <= MIN <= MAX <= 1024, not {self.min_replicas}-{self.max_replicas}")
        if not 1 <= self.cpus <= 1024:
            raise ValueError(f"CPUs per replica must be in 1..1024, not {self.cpus}")
        return self

    def deployment_options(self, settings: ServeSettings) -> dict:
        """The options of `serve.deployment` (and of the config file's deployment entry)."""
        opts: dict = {
            "ray_actor_options": {"num_cpus": 1, "num_gpus": 1} if self.gpu else {"num_cpus": self.cpus},
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_ongoing_requests,
            # a replica Serve stops (scale-down, redeploy, shutdown) drains like `voxserve serve`
            "graceful_shutdown_timeout_s": float(settings.http.shutdown_timeout_s),
        }
        if self.min_replicas == self.max_replicas:
            opts["num_replicas"] = self.min_replicas
        else:
            # scale on the requests a replica holds: a full batch's worth each keeps batching
            # effective without a replica queueing more than it can batch
            opts["autoscaling_config"] = {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                                          "target_ongoing_requests": settings.engine.scheduler.max_batch_size}
        return opts


def parse_replicas(text: str) -> tuple[int, int]:
    """"N" -> (N, N); "MIN-MAX" -> an autoscaling range."""
    lo, sep, hi = text.strip().partition("-")
    try:
        pair = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise ValueError(f"--replicas takes N or MIN-MAX (e.g. 2 or 1-4), not {text!r}") from None
    if not 1 <= pair[0] <= pair[1] <= 1024:
        raise ValueError(f"--replicas must be 1 <= MIN <= MAX <= 1024, not {text!r}")
    return pair


def _wants_gpu(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device == "auto":  # decided where the command runs: the config's nodes should match it
        import torch

        return torch.cuda.is_available()
    return False


def plan_for(settings: ServeSettings, replicas: tuple[int, int]) -> ReplicaPlan:
    gpu = _wants_gpu(settings.load.device)
    # without --threads, this machine's CPUs are shared out between the most replicas asked for
    cpus = settings.runtime.get("threads") or max(1, (os.cpu_count() or 1) // replicas[1])
    return ReplicaPlan(replicas[0], replicas[1], gpu, 1 if gpu else cpus,
                       settings.engine.scheduler.max_queued_sentences).validate()


def replica_settings(settings: ServeSettings, plan: ReplicaPlan) -> ServeSettings:
    """What a replica runs: Ray gives a GPU replica its GPU as device 0 (CUDA_VISIBLE_DEVICES),
    and a CPU replica exactly the CPUs it reserved as model threads."""
    if plan.gpu:
        return settings.with_(device="cuda")
    return settings.with_(device="cpu", threads=plan.cpus)


def settings_args(settings: ServeSettings, family_options: dict, warmup: bool) -> dict:
    """The builder's args (plain data: they go through the Serve config file)."""
    d = settings.leaves()
    return {"settings": d, "family_options": dict(family_options), "warmup": warmup}


def settings_from_args(args: dict) -> tuple[ServeSettings, dict, bool]:
    d = dict(args.get("settings") or {})
    return ServeSettings.of(**d).validate(), dict(args.get("family_options") or {}), bool(args.get("warmup", True))


# ----------------------------------------------------------------------------- the deployment


@serve.ingress()
class VoxserveReplica:
    """One engine and its HTTP app. The app (created in `__serve_build_asgi_app__`, after the
    engine) starts the engine and warms its voices in its lifespan, as under uvicorn."""

    def __init__(self, args: dict):
        self.settings, family_options, self.warmup = settings_from_args(args)
        if self.settings.http.api_key is None and os.environ.get(API_KEY_ENV):
            self.settings = self.settings.with_(api_key=os.environ[API_KEY_ENV])
        self.engine = build_engine(self.settings, family_options)
        ctx = serve.get_replica_context()
        self.name = f"{ctx.replica_id.unique_id}/{os.getpid()}"
        self.ready = None
        self.checked = False

    def __serve_build_asgi_app__(self):
        config = self.settings.http
        if not self.warmup:
            config = replace(config, warmup=False)
        app = create_app(self.engine, config)
        self.ready = app.state.ready  # what /ready reports
        app.add_middleware(_NameReplica, name=self.name.encode())
        return app

    async def check_health(self):
        """/ready's state. Serve's first check waits for the warm-up, so a replica gets no
        traffic before it; a later one fails once the app stopped being ready (its engine is
        shutting down), and Serve replaces the replica."""
        if self.checked:
            if not self.ready.is_set():
                raise RuntimeError(f"replica {self.name} is not ready (its engine is shutting down)")
            return
        if not await asyncio.to_thread(self.ready.wait, WARMUP_TIMEOUT_S):
            raise RuntimeError(f"replica {self.name} not ready after {WARMUP_TIMEOUT_S:g} s")
        self.checked = True


class _NameReplica:
    """Adds the replica's name to every response's headers (which replica served what)."""

    def __init__(self, app, name: bytes):
        self.app, self.name = app, name

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (REPLICA_HEADER.encode(), self.name)]}
            await send(message)

        return await self.app(scope, receive, named)


def build_app(args: dict):
    """The Serve application (the config file's `import_path` names this builder)."""
    settings, family_options, warmup = settings_from_args(args)
    replicas = tuple(args.get("replicas") or (1, 1))
    plan = plan_for(settings, replicas)
    deployment = serve.deployment(VoxserveReplica, name=DEPLOYMENT, **plan.deployment_options(settings))
    return deployment.bind(settings_args(replica_settings(settings, plan), family_options, warmup))


# ----------------------------------------------------------------------------- commands
def _from_cli(ns) -> tuple[ServeSettings, tuple[int, int], dict, bool]:
    settings = settings_from(ns)
    if settings.server.wyoming:
        raise ValueError("--wyoming is not served on Ray: run `voxserve wyoming` beside it")
    return settings, parse_replicas(ns.replicas or "1"), load_options_from(ns), not ns.no_warmup


def app_args(settings: ServeSettings, replicas: tuple[int, int], family_options: dict, warmup: bool) -> dict:
    return {**settings_args(settings, family_options, warmup), "replicas": list(replicas)}


def serve_config(settings: ServeSettings, replicas: tuple[int, int], family_options: dict, warmup: bool) -> dict:
    """The Serve config file (`serve deploy`) for these settings. The API key is left out (a
    file is no place for it): replicas read VOXSERVE_API_KEY from their environment."""
    plan = plan_for(settings, replicas)
    settings = replica_settings(settings, plan).with_(api_key=None)
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": settings.server.host, "port": settings.server.port},
        "applications": [{
            "name": APP_NAME,
            "route_prefix": "/",
            "import_path": "voxserve.serve.ray:build_app",
            "args": app_args(settings, replicas, family_options, warmup),
            "deployments": [{"name": DEPLOYMENT, **plan.deployment_options(settings)}],
        }],
    }


def cmd_ray_config(ns) -> int:
    settings, replicas, family_options, warmup = _from_cli(ns)
    print(f"# voxserve on Ray Serve: `serve deploy` this file. Start every node's Ray with\n"
          f"# {CALLBACK_ENV}={PROXY_CALLBACK} in its environment (a request whose\n"
          f"# replica dies before answering is retried, else a 503), and VOXSERVE_API_KEY if the server needs a key.")
    print(yaml.safe_dump(serve_config(settings, replicas, family_options, warmup), sort_keys=False), end="")
    return 0


def cmd_serve_ray(ns) -> int:
    settings, replicas, family_options, warmup = _from_cli(ns)
    if settings.http.api_key:  # the replicas Ray starts inherit it, as on a cluster
        os.environ[API_KEY_ENV] = settings.http.api_key
        settings = settings.with_(api_key=None)
    os.environ.setdefault(CALLBACK_ENV, PROXY_CALLBACK)  # the proxy Ray starts inherits it
    ray.init(include_dashboard=False, log_to_driver=bool(ns.verbose))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": settings.server.host, "port": settings.server.port})
        serve.run(build_app(app_args(settings, replicas, family_options, warmup)), name=APP_NAME,
                  route_prefix="/", blocking=False)
        n = f"{replicas[0]}" if replicas[0] == replicas[1] else f"{replicas[0]}-{replicas[1]}"
        print(f"voxserve: serving {', '.join(settings.load.voices)} on http://{settings.server.host}:{settings.server.port} "
              f"(Ray Serve, {n} replicas)", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
