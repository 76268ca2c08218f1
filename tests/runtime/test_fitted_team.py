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


def test_a_batch_is_split_only_when_other_processes_hold_a_core(cores, monkeypatch):
    monkeypatch.setattr(cpu, "thread_teams", lambda: True)
    monkeypatch.setattr(cpu, "thread_team", lambda: 2)
    assert cpu.contended_groups([5, 1, 3]) is None  # idle: one batch on the whole team
    cores["cores"] = 1.5
    cpu._decided.clear()
    groups = cpu.contended_groups([5, 1, 3, 4])
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    assert [sorted(g) for g in groups] == groups and len(groups) == 2
    assert sorted(sum([5, 1, 3, 4][i] for i in g) for g in groups) == [6, 7]  # balanced by cost
    assert cpu.contended_groups([5]) is None  # one item: nothing to split
    monkeypatch.setattr(cpu, "thread_team", lambda: 1)
    assert cpu.contended_groups([5, 1]) is None  # a team of one already


def test_run_groups_runs_each_call_on_a_team_of_one_and_keeps_order():
    if not cpu.thread_teams():
        pytest.skip("no OpenMP runtime to set a team on")
    import threading

    cpu.set_thread_team(2)
    seen = []

    def call(k):
        seen.append((threading.get_ident(), cpu.thread_team()))
        return k

    assert cpu.run_groups([lambda k=k: call(k) for k in range(3)]) == [0, 1, 2]
    assert all(team == 1 for _, team in seen)
    assert cpu.thread_team() == 2  # the caller's team is back

    def boom():
        raise ValueError("x")

    with pytest.raises(ValueError):
        cpu.run_groups([lambda: 1, boom])
