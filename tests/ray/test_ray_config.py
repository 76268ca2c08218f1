"""What a Ray deployment reserves and admits, and `voxserve ray-config`, without starting Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'voxserve[ray]')")
yaml = pytest.importorskip("yaml")

from voxserve.serve.ray import (  # noqa: E402
    DEPLOYMENT,
    parse_replicas,
    plan_for,
    replica_settings,
    serve_config,
    settings_from_args,
)
from voxserve.serve.settings import ServeSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_replicas_are_a_count_or_a_range():
    assert parse_replicas("3") == (3, 3)
    assert parse_replicas("1-4") == (1, 4)
    for bad in ("0", "4-2", "two", "1-", "-3", "1-2000"):
        with pytest.raises(ValueError, match="--replicas"):
            parse_replicas(bad)


def test_cpu_replicas_reserve_their_threads_and_admit_the_engine_bound():
    s = ServeSettings.of(device="cpu", threads=3, max_queued_sentences=40)
    plan = plan_for(s, (2, 2))
    opts = plan.deployment_options(s)
    assert opts["ray_actor_options"] == {"num_cpus": 3}
    assert opts["num_replicas"] == 2 and "autoscaling_config" not in opts
    # back-pressure is the engine's: Ray never holds more per replica than the engine admits
    assert opts["max_ongoing_requests"] == 40 and opts["max_queued_requests"] == 40
    r = replica_settings(s, plan)
    assert (r.load.device, r.runtime["threads"]) == ("cpu", 3)


def test_gpu_replicas_take_one_gpu_each_and_a_range_autoscales():
    s = ServeSettings.of(device="cuda:1", max_batch_size=6)
    plan = plan_for(s, (1, 4))
    opts = plan.deployment_options(s)
    assert opts["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1}
    assert opts["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 6}
    assert "num_replicas" not in opts
    assert replica_settings(s, plan).load.device == "cuda"  # Ray's CUDA_VISIBLE_DEVICES: its GPU is device 0


def test_config_round_trips_the_settings_and_leaves_the_key_out():
    s = ServeSettings.of(device="cpu", threads=2, voices=("en_US-joe-medium",), api_key="secret", port=9000,
                         max_queue_wait_s=5.0, max_sequences=32)
    cfg = yaml.safe_load(yaml.safe_dump(serve_config(s, (2, 2), {}, True)))
    assert "secret" not in yaml.safe_dump(cfg)
    app = cfg["applications"][0]
    assert app["import_path"] == "voxserve.serve.ray:build_app"
    assert cfg["http_options"] == {"host": "127.0.0.1", "port": 9000}
    back, family_options, warmup = settings_from_args(app["args"])
    assert back == ServeSettings.of(device="cpu", threads=2, voices=("en_US-joe-medium",), port=9000,
                                    max_queue_wait_s=5.0, max_sequences=32)
    assert (family_options, warmup, app["args"]["replicas"]) == ({}, True, [2, 2])
    dep = app["deployments"][0]
    assert dep["name"] == DEPLOYMENT and dep["num_replicas"] == 2 and dep["ray_actor_options"] == {"num_cpus": 2}


def test_ray_config_command_prints_a_serve_config():
    r = subprocess.run([sys.executable, "-m", "voxserve", "ray-config", "--device", "cpu", "--threads", "1",
                        "--replicas", "1-3", "--max-queued-sentences", "64"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(cfg)  # what `serve deploy` checks the file against
    dep = cfg["applications"][0]["deployments"][0]
    assert dep["autoscaling_config"]["max_replicas"] == 3 and dep["max_ongoing_requests"] == 64
    assert "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=voxserve.serve.ray_proxy:proxy_middlewares" in r.stdout


def test_replicas_without_ray_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "voxserve", "serve", "--replicas", "2"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "--replicas needs --ray" in r.stderr


def test_config_files_of_earlier_versions_still_deploy():
    """A config file written before the move names `voxserve.ray_serve:build_app`."""
    import voxserve.ray_serve
    import voxserve.serve.ray

    assert voxserve.ray_serve.build_app is voxserve.serve.ray.build_app
