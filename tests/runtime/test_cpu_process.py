"""Process-level CPU tuning: the OpenMP team release that lets the inference worker thread run
as fast as the main thread (see voxserve/runtime/cpu.py)."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from voxserve.runtime.cpu import release_openmp_threads

linux_omp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "OpenMP" not in torch.__config__.parallel_info()
    or torch.get_num_threads() < 2,
    reason="needs Linux, torch built with OpenMP, and 2+ threads")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@linux_omp
def test_release_frees_the_calling_threads_openmp_team_only():
    x = torch.randn(512, 4096)

    def parallel_work():
        for _ in range(3):
            torch.tanh(x)

    result = {}

    def in_a_thread():  # a thread that runs parallel work gets a team of its own
        parallel_work()
        result["with_team"] = _threads()
        result["released"] = release_openmp_threads()
        result["after"] = _threads()
        parallel_work()  # still works: the team comes back on demand
        result["again"] = _threads()

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join()
    assert result["released"] is True
    assert result["after"] < result["with_team"]  # its helper threads are gone
    assert result["again"] == result["with_team"]
