"""The asyncio side runs none of a request's front end on the event loop: a long SSML parse or
normalisation of a whole text does not stall every other request's audio delivery."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from serve_fakes import FakeVoice

from voxserve.engine import AsyncEngine, Engine, EngineConfig, SchedulerConfig
from voxserve.errors import EmptyTextError, UnknownVoiceError

FRONT_END_S = 0.6


class SlowFrontEnd(FakeVoice):
    """A voice whose front end works a while before its first sentence (as Piper's parses and
    normalises the whole text when `units` is called)."""

    def units(self, text, options=None):
        time.sleep(FRONT_END_S)
        return super().units(text, options)


def test_a_long_front_end_does_not_block_the_event_loop():
    v = SlowFrontEnd()
    text = "one sentence. and another."

    async def main(eng):
        ae = AsyncEngine(eng)
        gaps, last, stop = [], time.monotonic(), False

        async def ticker():
            nonlocal last
            while not stop:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        stream = ae.submit("fake", text)
        submit_s = time.monotonic() - t0
        chunks = await stream.collect()
        stop = True
        await tick
        return submit_s, max(gaps), chunks

    with Engine([v], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))) as eng:
        submit_s, worst_gap, chunks = asyncio.run(main(eng))
    assert submit_s < FRONT_END_S / 3, f"submit held the loop {submit_s:.2f} s"
    assert worst_gap < FRONT_END_S / 2, f"the loop stalled {worst_gap:.2f} s"
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), FakeVoice().expected(text))


def test_bad_input_is_raised_by_the_stream():
    """Validation is part of the front end: its errors come from the stream (the HTTP app
    awaits `first()` before it answers, so they are still 4xx); an unknown voice is refused
    at once."""

    async def main(eng):
        ae = AsyncEngine(eng)
        with pytest.raises(UnknownVoiceError):
            ae.submit("nobody", "hello.")
        stream = ae.submit("fake", "   ")
        with pytest.raises(EmptyTextError):
            await stream.first()
        return await ae.submit("fake", "fine.").collect()

    with Engine([FakeVoice()], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0))) as eng:
        chunks = asyncio.run(main(eng))
        assert len(chunks) == 1 and eng.in_flight == 0
