"""Process-level CPU tuning: the OpenMP team release that lets the inference worker thread run
as fast as the main thread (see voxserve/runtime/cpu.py). Runs in a fresh interpreter: other
tests change torch's thread settings, and teams of earlier threads may still be around."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

linux_omp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "OpenMP" not in torch.__config__.parallel_info(),
    reason="needs Linux and torch built with OpenMP")

CHILD = r"""
import json, os, threading, torch
from voxserve.runtime.cpu import release_openmp_threads

def threads():
    return len(os.listdir("/proc/self/task"))

x = torch.randn(512, 4096)
result = {}

def in_a_thread():  # a thread that runs parallel work gets an OpenMP team of its own
    torch.set_num_threads(2)
    for _ in range(3):
        torch.tanh(x)
    result["with_team"] = threads()
    result["released"] = release_openmp_threads()
    result["after"] = threads()
    for _ in range(3):  # still works: the team comes back on demand
        torch.tanh(x)
    result["again"] = threads()

t = threading.Thread(target=in_a_thread)
t.start()
t.join()
print(json.dumps(result))
"""


@linux_omp
def test_release_frees_the_calling_threads_openmp_team_only():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["released"] is True
    assert result["after"] < result["with_team"]  # its helper thread is gone
    assert result["again"] == result["with_team"]


PASSING = r"""
import json, os, time, torch
from voxserve.runtime.cpu import in_passing_thread

def threads():
    return len(os.listdir("/proc/self/task"))

x = torch.randn(512, 4096)

def work():
    for _ in range(3):
        torch.tanh(x)
    return threads()

torch.set_num_threads(2)
before = threads()
during = in_passing_thread(work)
for _ in range(200):  # the helper ends a moment after its team's thread
    if threads() <= before:
        break
    time.sleep(0.01)
after_passing = threads()
work()  # on this thread: its team stays
print(json.dumps({"before": before, "during": during, "after_passing": after_passing, "after_here": threads()}))
"""


@linux_omp
def test_a_passing_thread_leaves_no_openmp_team_behind():
    # model loading runs so (voxserve.load_voice): a team the loading thread kept would make
    # an engine worker's helpers sleep at every parallel region (runtime/cpu.py)
    out = subprocess.run([sys.executable, "-c", PASSING], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["during"] > r["before"] + 1  # the passing thread and its helper
    assert r["after_passing"] == r["before"]
    assert r["after_here"] > r["before"]


def test_in_passing_thread_returns_raises_and_keeps_the_thread_count():
    import threading

    from voxserve.runtime.cpu import in_passing_thread

    me = threading.get_ident()
    assert in_passing_thread(lambda a, b=0: (a + b, threading.get_ident() != me), 2, b=3) == (5, True)
    with pytest.raises(KeyError, match="gone"):
        in_passing_thread(lambda: {}["gone"])
    n = torch.get_num_threads()
    try:
        in_passing_thread(torch.set_num_threads, 1)
        assert torch.get_num_threads() == 1  # what the voice's loader set applies here too
    finally:
        torch.set_num_threads(n)
