"""The servers' allocator (runtime/allocator.py): when `voxserve serve` restarts itself with
jemalloc preloaded, and that it really does."""

from __future__ import annotations

import os

import pytest
from server_process import ServerProcess, serve

from voxserve.runtime import allocator
from voxserve.runtime.allocator import JEMALLOC, JEMALLOC_CONF, restart_env

LIB = JEMALLOC


def test_restart_env_preloads_jemalloc_once():
    env = restart_env({"PATH": "/bin"}, loaded=False, library=LIB)
    assert env["LD_PRELOAD"] == LIB and env["MALLOC_CONF"] == JEMALLOC_CONF and env["PATH"] == "/bin"
    assert restart_env(env, loaded=False, library=LIB) is None  # the preload failed: no loop


@pytest.mark.parametrize("env,loaded,library", [
    ({"VOXSERVE_ALLOCATOR": "system"}, False, LIB),
    ({"VOXSERVE_ALLOCATOR": " System "}, False, LIB),
    ({}, True, LIB),  # already preloaded (by the user, or a container's environment)
    ({}, False, None),  # not installed
])
def test_no_restart(env, loaded, library):
    assert restart_env(env, loaded=loaded, library=library) is None


def test_a_users_preload_and_tuning_are_kept():
    env = restart_env({"LD_PRELOAD": "libfoo.so", "MALLOC_CONF": "narenas:2"}, loaded=False, library=LIB)
    assert env["LD_PRELOAD"] == f"{LIB} libfoo.so" and env["MALLOC_CONF"] == "narenas:2"


def test_a_bad_choice_is_an_error_naming_the_variable():
    with pytest.raises(ValueError, match="VOXSERVE_ALLOCATOR='tcmalloc'"):
        allocator.choice({"VOXSERVE_ALLOCATOR": "tcmalloc"})
    assert allocator.choice({}) == "auto"


def test_jemalloc_loaded_reads_the_maps():
    assert allocator.jemalloc_loaded("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert not allocator.jemalloc_loaded("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")


def test_main_called_in_process_never_restarts(monkeypatch, tmp_path):
    """main(argv) runs inside another program (tests, embedders): replacing that process would
    end it. Only the command line itself restarts."""
    from voxserve.cli import main

    calls = []
    monkeypatch.setattr(allocator, "restart_with_jemalloc", lambda: calls.append(1))
    assert main(["serve", "--device", "cpu", "--voice", str(tmp_path / "missing.onnx")]) == 2
    assert calls == []


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


@pytest.mark.skipif(allocator.find_jemalloc() is None, reason="libjemalloc2 is not installed (.ci/run installs it)")
@pytest.mark.parametrize("choice", ["auto", "system"])
def test_the_server_runs_on_jemalloc_unless_told_not_to(choice):
    s = ServerProcess(["--no-warmup"], env={"VOXSERVE_ALLOCATOR": choice})
    try:
        pid = s.proc.pid  # exec keeps the pid a supervisor watches
        assert s.client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "en_US-joe-medium",
                                                       "response_format": "pcm"}).status_code == 200
        assert allocator.jemalloc_loaded(_maps(pid)) == (choice == "auto")
        assert s.proc.poll() is None
    finally:
        s.stop()


def test_the_allocator_variable_is_checked_before_serving(tmp_path):
    p = serve(env={**os.environ, "VOXSERVE_ALLOCATOR": "tcmalloc"})
    assert p.returncode == 2 and "VOXSERVE_ALLOCATOR" in p.stderr, p.stderr
