"""The OpenMP team of a CPU batch fits the cores other processes leave free."""

from __future__ import annotations

import os

import pytest

from voxserve.runtime import cpu


@pytest.fixture
def cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cpu, "_decided", {})
    busy = {"cores": 0.0}
    monkeypatch.setattr(cpu._other, "other_cores", lambda: busy["cores"])
    return busy


def test_the_team_shrinks_when_other_processes_hold_a_core(cores):
    assert cpu.fitted_team(2) == 2
    cpu._decided.clear()
    cores["cores"] = 1.2  # two busy loops on a 2-core machine read about 1-2 cores
    assert cpu.fitted_team(2) == 1
    cpu._decided.clear()
    cores["cores"] = 0.3  # a little outside work: the team keeps both cores
    assert cpu.fitted_team(2) == 2
    assert cpu.fitted_team(1) == 1


def test_a_decision_is_held_for_a_few_seconds(cores):
    assert cpu.fitted_team(2) == 2
    cores["cores"] = 2.0
    assert cpu.fitted_team(2) == 2  # no switch within the hold: each costs cold kernels


def test_cpu_team_sets_and_restores_the_threads_team(cores):
    if not cpu.thread_teams():
        pytest.skip("no OpenMP runtime to set a team on")
    cpu.set_thread_team(2)
    cores["cores"] = 1.5
    with cpu.cpu_team():
        assert cpu.thread_team() == 1
    assert cpu.thread_team() == 2


def test_other_load_reads_proc():
    load = cpu.OtherLoad(every_s=0.0)
    load.other_cores()
    x = sum(i * i for i in range(200_000))  # our own work is not counted as others'
    assert x > 0 and 0.0 <= load.other_cores() <= (os.cpu_count() or 1) + 0.5
