"""voxserve on Ray Serve, one cluster for the whole module: tests/ray/ray_cluster_check.py runs
`voxserve serve --ray` and its checks inside a network namespace holding only `lo` (`unshare --net`, so no Ray traffic can reach
another address), under a hard timeout, with HOME and Ray's temp dir in fresh folders (Ray
writes its token to ~/.ray). The tests assert on the JSON it writes.

Select them with `-m ray`; they need root (for unshare) and the ray extra."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'voxserve[ray]')")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HARD_TIMEOUT_S = 300
"""The whole run: references, cluster start, the checks, shutdown."""


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "--net", "--", "true"], capture_output=True, timeout=10).returncode == 0


def _processes_naming(text: str) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if text in cmd:
                out.append(f"{pid}: {cmd[:120]}")
    return out


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    if not _can_unshare():
        pytest.skip("needs `unshare --net` (root) and `ip`: the cluster must run in a namespace with only lo")
    home = tmp_path_factory.mktemp("ray-home")
    temp = tempfile.mkdtemp(prefix="vxray-", dir="/tmp")  # short: Ray's socket paths are bounded
    out = home / "result.json"
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}"}
    script = f"ip link set lo up && exec {sys.executable} tests/ray/ray_cluster_check.py --out {out} --temp {temp}"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(["unshare", "--net", "--", "sh", "-c", script], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=HARD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the Ray run passed {HARD_TIMEOUT_S} s; its output ends: {(e.stderr or '')[-3000:]}")
    elapsed = time.monotonic() - t0
    left = _processes_naming(temp)
    shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(out.read_text())
    result["elapsed_s"], result["left_processes"] = elapsed, left
    result["token_written"] = (home / ".ray" / "auth_token").exists()
    load, victim = result["load"], result["killed"]
    print(f"ray run: {elapsed:.0f} s (start {result['start_s']} s, shutdown {result['shutdown_s']} s); "
          f"burst by replica {result['burst_replicas']}; killed {victim} with "
          f"{result['streaming_on_victim_at_kill']} streaming: "
          f"{sum(r['replica'] == victim and not r['complete'] for r in load)} cut, "
          f"{sum(bool(r['retried']) for r in load)} retried, {sum(r['status'] == 503 for r in load)} answered 503, "
          f"{sum(r['equal'] for r in load)}/16 whole and equal; replaced in {result['replaced_s']} s")
    return result


def test_cluster_runs_in_a_namespace_with_only_loopback(cluster_run):
    assert cluster_run["interfaces"] == ["lo"]
    assert cluster_run["token_written"]  # Ray's token went to the test's HOME, not the user's


def test_16_concurrent_requests_equal_direct_synthesis(cluster_run):
    burst = cluster_run["burst"]
    assert len(burst) == 16
    assert [r["status"] for r in burst] == [200] * 16, burst
    assert all(r["equal"] for r in burst), [r for r in burst if not r["equal"]]


def test_both_replicas_served_requests(cluster_run):
    served = cluster_run["burst_replicas"]
    assert len(served) == 2 and sum(served.values()) == 16, served


def test_killing_a_replica_loses_no_request_on_the_other(cluster_run):
    load, victim = cluster_run["load"], cluster_run["killed"]
    on_victim = [r for r in load if r["replica"] == victim]
    others = [r for r in load if r["replica"] not in (None, victim)]
    unanswered = [r for r in load if r["replica"] is None]
    assert cluster_run["streaming_on_victim_at_kill"] >= 1, "the killed replica had no stream in flight"
    # every request answered by another replica (retries from the dead one included) is whole and right
    assert others and all(r["status"] == 200 and r["complete"] and r["equal"] for r in others), others
    # on the dead one: finished before the kill, or a stream cut off (a broken transfer, never a
    # short file that looks complete)
    for r in on_victim:
        assert (r["complete"] and r["equal"]) or (r["status"] == 200 and not r["complete"]
                                                  and "RemoteProtocolError" in (r["error"] or "")), r
    # none answered at all: the proxy's 503 in voxserve's error shape
    for r in unanswered:
        assert r["status"] == 503 and "stopped before answering" in r.get("message", ""), r


def test_serve_replaces_the_dead_replica(cluster_run):
    new = cluster_run["replacement"]
    assert new and new != cluster_run["killed"] and new not in cluster_run["burst_replicas"]
    # back to two: the survivor and the replacement both answered afterwards
    assert len(set(cluster_run["answering_after"]) - {cluster_run["killed"]}) >= 2


def test_cluster_shuts_down_within_bounded_time(cluster_run):
    assert cluster_run["elapsed_s"] < HARD_TIMEOUT_S
    assert cluster_run["server_exit"] == 0, cluster_run["server_log_tail"]  # SIGTERM: a clean exit
    assert cluster_run["ray_processes_running"] > 0  # Ray's processes name its temp dir...
    assert cluster_run["left_processes"] == []  # ...and none is left
