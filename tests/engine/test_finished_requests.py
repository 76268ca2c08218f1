"""Nothing of a finished request stays reachable from the engine: its state, its output path,
its sink, its stream, its audio (issue 44: a server holding more memory after concurrent load
than after the same requests one at a time was suspected of keeping per-request state)."""

from __future__ import annotations

import asyncio
import gc
import threading
import types
from collections import Counter

import numpy as np
from serve_fakes import FakeVoice, RecordingSink

from voxserve.engine import AsyncEngine, Engine, EngineConfig, SchedulerConfig
from voxserve.engine.executors import CpuLanes
from voxserve.engine.held_audio import HeldAudio

PER_REQUEST = ("RequestState", "RequestOutput", "RecordingSink", "_QueueSink", "SpeechStream", "_Sequence", "Item")


def reachable(*roots) -> tuple[Counter, int]:
    """Objects reachable from roots by reference (functions' globals and modules not followed:
    they reach everything): their count by type name, and the bytes of the arrays among them."""
    seen, stack, names, nbytes = set(), list(roots), Counter(), 0
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(o))
        names[type(o).__name__] += 1
        if isinstance(o, np.ndarray):
            nbytes += o.nbytes
        stack.extend(gc.get_referents(o))
    return names, nbytes


def lanes() -> CpuLanes:
    """The CPU executor (lanes, spill: early pieces held by the output path) on 2 threads."""
    return CpuLanes(threads=2, teams=True, fitted_team=lambda n: n, set_team=lambda n: True,
                    lower_priority=lambda d: None)


def texts(n: int) -> list[str]:
    return [". ".join(f"request {i} sentence {k}" for k in range(1 + (i * 5) % 7)) + "." for i in range(n)]


def test_nothing_of_finished_requests_stays_reachable_from_the_engine():
    v = FakeVoice(delay_s=0.001, concurrent_runs=True)
    eng = Engine([v], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), frontend_lookahead=2), cpu=lanes())
    ae = AsyncEngine(eng, HeldAudio(2**30))
    with eng:
        base, base_bytes = reachable(eng, ae)
        sinks = [RecordingSink() for _ in range(12)]  # kept alive here: found if the engine keeps them

        async def traffic():
            async def one(t, streaming):
                return await ae.submit("fake", t, streaming=streaming).collect()
            ts = texts(16)
            for k, (t, s) in enumerate(zip(ts, sinks)):
                eng.accept("fake", t, None, s, streaming=k % 2 == 0)
            got = await asyncio.gather(*[one(t, k % 2 == 0) for k, t in enumerate(ts)])
            ae.submit("fake", " ".join(ts), streaming=False)  # dropped unread: cancelled
            bad = ae.submit("fake", "   ")  # fails in its front end
            try:
                await bad.collect()
            except Exception:
                pass
            return got

        chunks = asyncio.run(traffic())
        for s in sinks:
            assert s.done.wait(30) and s.error is None
        assert all(chunks)
        gc.collect()  # the unread stream's __del__ cancels it
        for _ in range(300):
            if not eng.in_flight:
                break
            threading.Event().wait(0.01)
        assert eng.in_flight == 0 and eng.queued_sentences() == 0
        after, after_bytes = reachable(eng, ae)
    kept = {k: after[k] - base[k] for k in PER_REQUEST if after[k] > base[k]}
    assert not kept, f"reachable from the engine after every request finished: {kept}"
    assert after_bytes == base_bytes, f"arrays reachable: {base_bytes} bytes before the traffic, {after_bytes} after"
    # whole answers read to the end or dropped unread, none released by hand: their charges
    # went with their streams (a charge kept would refuse whole answers for ever)
    assert len(ae.held) == 0 and ae.held.charged == 0
