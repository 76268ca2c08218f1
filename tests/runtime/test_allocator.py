"""The servers' allocator (runtime/allocator.py): when `voxserve serve` restarts itself with
jemalloc preloaded, and that it really does."""

from __future__ import annotations

import os
import time

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


# ----------------------------------------------------------------------------- MemoryRelease
def _wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_memory_release_never_runs_before_the_first_use_nor_while_idle():
    calls = []
    r = allocator.MemoryRelease(0.1, release=lambda: calls.append(1))
    try:
        r.busy(False)
        time.sleep(0.4)
        assert calls == []  # never used: nothing to give back
        r.busy(True)
        r.busy(False)
        assert _wait_for(lambda: len(calls) == 1)
        time.sleep(0.4)
        assert calls == [1]  # idle since that release: once, not every period
    finally:
        r.stop()
    assert not r._thread.is_alive()


def test_memory_release_runs_once_a_period_under_traffic_and_once_after_it():
    calls = []
    r = allocator.MemoryRelease(0.2, release=lambda: calls.append(time.monotonic()))
    try:
        t0 = time.monotonic()
        r.busy(True)
        while time.monotonic() - t0 < 1.0:  # traffic that never goes idle for long
            r.busy(False)
            time.sleep(0.01)
            r.busy(True)
            time.sleep(0.01)
        assert 3 <= len(calls) <= 5, calls  # one per 0.2 s period, not one per lull
        assert all(b - a >= 0.19 for a, b in zip([t0, *calls], calls)), calls
        r.busy(False)
        n = len(calls)
        assert _wait_for(lambda: len(calls) == n + 1)  # the period the traffic ended in
        time.sleep(0.5)
        assert len(calls) == n + 1
        r.busy(True)  # used again: another release a period later
        assert _wait_for(lambda: len(calls) == n + 2)
        assert r.releases == n + 2
    finally:
        r.stop()


def test_memory_release_survives_a_failing_release_and_refuses_a_bad_period():
    def boom():
        raise OSError("no")

    r = allocator.MemoryRelease(0.05, release=boom)
    try:
        r.busy(True)
        time.sleep(0.3)
        assert r._thread.is_alive() and r.releases == 0
    finally:
        r.stop()
    with pytest.raises(ValueError, match="period_s"):
        allocator.MemoryRelease(0)


def test_stopping_a_memory_release_does_not_wait_for_its_period():
    r = allocator.MemoryRelease(60, release=lambda: None)
    r.busy(True)
    t = time.monotonic()
    r.stop()
    assert time.monotonic() - t < 1 and not r._thread.is_alive()


_TOUCH = """
import ctypes, sys
from voxserve.runtime import allocator, cpu
if sys.argv[1] == "glibc":
    cpu.tune_malloc()  # the server's glibc settings: freed memory is kept
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) // 1024
blocks = [libc.malloc(4 << 20) for _ in range(50)]  # 200 MB of tensor-sized blocks, touched
for b in blocks:
    ctypes.memset(b, 1, 4 << 20)
for b in blocks:
    libc.free(b)
kept = rss()
ok = allocator.release_free_memory()
print(kept, rss(), ok)
"""


@pytest.mark.parametrize("kind", ["jemalloc", "glibc"])
def test_release_free_memory_gives_freed_pages_back(kind):
    import subprocess
    import sys

    env = dict(os.environ)
    if kind == "jemalloc":
        if allocator.find_jemalloc() is None:
            pytest.skip("libjemalloc2 is not installed (.ci/run installs it)")
        env.update(LD_PRELOAD=JEMALLOC, MALLOC_CONF=JEMALLOC_CONF)
    p = subprocess.run([sys.executable, "-c", _TOUCH, kind], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    kept, after, ok = p.stdout.split()
    assert ok == "True"
    assert int(kept) - int(after) > 150, p.stdout  # MB: the 200 MB freed went back
