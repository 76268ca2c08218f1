"""The Wyoming server (voxserve.serve.wyoming), driven by the wyoming package's own client over
127.0.0.1 on a free port. Every read has a timeout and every exchange a bounded event count.
The protocol's mechanics run on the fake voice (no torch); audio parity on the real voices."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from audio_compare import assert_pcm_close
from serve_fakes import FakeVoice, RecordingSink
from server_process import ROOT, ServerProcess, free_port

pytest.importorskip("wyoming", reason="the wyoming extra (pip install -e '.[wyoming]')")

from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.event import Event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import (  # noqa: E402
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

import voxserve  # noqa: E402
from voxserve.audio import float_to_int16  # noqa: E402
from voxserve.engine import Engine, EngineConfig, SchedulerConfig  # noqa: E402
from voxserve.errors import InvalidOptionError  # noqa: E402
from voxserve.families.piper import PiperOptions  # noqa: E402
from voxserve.serve.wyoming import (  # noqa: E402
    SAMPLES_PER_CHUNK,
    SentenceBuffer,
    WyomingConfig,
    WyomingServer,
)
from voxserve.text.split import split_sentences  # noqa: E402

NOISE_OFF = {"noise_scale": 0.0, "noise_w": 0.0}  # the server's options: what DETERMINISTIC is to a Piper voice
READ_S = 60.0  # one event (the real voices synthesise on a shared 2-core machine)
MAX_EVENTS = 5000  # events one exchange may take before the test calls it runaway


# --------------------------------------------------------------------------- helpers
@contextlib.asynccontextmanager
async def wyoming_server(engine: Engine, **config):
    server = WyomingServer(engine, WyomingConfig(uri="tcp://127.0.0.1:0", **config))
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def port_of(server: WyomingServer) -> int:
    return int(server.address.rsplit(":", 1)[1])


@contextlib.asynccontextmanager
async def client(server_or_port, read_timeout: float = READ_S):
    port = server_or_port if isinstance(server_or_port, int) else port_of(server_or_port)
    c = AsyncTcpClient("127.0.0.1", port, connect_timeout=10, read_timeout=read_timeout)
    await c.connect()
    try:
        yield c
    finally:
        await c.disconnect()


class Reply:
    """What a synthesis sent back: its events' types, audio format, chunks and errors."""

    def __init__(self):
        self.types: list[str] = []
        self.start: AudioStart | None = None
        self.chunks: list[AudioChunk] = []
        self.errors: list[Error] = []

    @property
    def pcm(self) -> np.ndarray:
        return np.frombuffer(b"".join(c.audio for c in self.chunks), dtype="<i2")


async def read_reply(c: AsyncTcpClient, until: str = AudioStop().event().type, reply: Reply | None = None,
                     stop_on_error: bool = True) -> Reply:
    """Events up to (and with) one of type `until`, or an error event (with stop_on_error)."""
    reply = reply or Reply()
    for _ in range(MAX_EVENTS):
        event = await c.read_event()
        assert event is not None, f"the server closed the connection after {reply.types}"
        reply.types.append(event.type)
        if AudioStart.is_type(event.type):
            reply.start = AudioStart.from_event(event)
        elif AudioChunk.is_type(event.type):
            reply.chunks.append(AudioChunk.from_event(event))
        elif Error.is_type(event.type):
            reply.errors.append(Error.from_event(event))
            if stop_on_error:
                return reply
        if event.type == until:
            return reply
    raise AssertionError(f"over {MAX_EVENTS} events without {until}")


async def synthesize(c: AsyncTcpClient, text: str, voice: SynthesizeVoice | None = None) -> Reply:
    await c.write_event(Synthesize(text=text, voice=voice).event())
    return await read_reply(c)


async def stream(c: AsyncTcpClient, pieces: list[str], voice: SynthesizeVoice | None = None) -> Reply:
    await c.write_event(SynthesizeStart(voice=voice).event())
    for p in pieces:
        await c.write_event(SynthesizeChunk(text=p).event())
    await c.write_event(SynthesizeStop().event())
    return await read_reply(c, until=SynthesizeStopped().event().type)


def assert_chunking(reply: Reply, rate: int) -> None:
    """16-bit mono at the voice's rate, every chunk 1,024 samples but the last."""
    assert reply.start is not None and (reply.start.rate, reply.start.width, reply.start.channels) == (rate, 2, 1)
    assert reply.chunks, reply.types
    for c in reply.chunks:
        assert (c.rate, c.width, c.channels) == (rate, 2, 1)
    sizes = [c.samples for c in reply.chunks]
    assert all(n == SAMPLES_PER_CHUNK for n in sizes[:-1]), sizes
    assert 0 < sizes[-1] <= SAMPLES_PER_CHUNK


def fake_engine(delay_s: float = 0.0, **sched) -> tuple[Engine, FakeVoice]:
    voice = FakeVoice(sample_rate=16000, delay_s=delay_s)
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(**{"max_wait_ms": 0, **sched})))
    return eng.start(), voice


def run(coro, timeout: float = 300.0):
    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro
    return asyncio.run(bounded())


def wait_until(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tiny_voice(tiny_voice_path):
    from voxserve.voices.registry import register_voice

    # as `voxserve serve --voice PATH` does, so the name resolves to its source (its language)
    register_voice("tiny-multi", tiny_voice_path, tiny_voice_path.with_name(tiny_voice_path.name + ".json"))
    return voxserve.load_voice("tiny-multi", device="cpu")


@pytest.fixture(scope="module")
def real_engine(joe_voice, tiny_voice):
    eng = Engine({"en_US-joe-medium": joe_voice, "tiny-multi": tiny_voice},
                 EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    eng.start()
    yield eng
    eng.shutdown(10)


@pytest.fixture
def fake():
    eng, voice = fake_engine()
    yield eng, voice
    eng.shutdown(5)


# --------------------------------------------------------------------------- sentence buffer
@pytest.mark.parametrize("text", [
    "Hello there. How are you today? Fine, thanks!",
    "Dr. Smith met Mr. Jones at 3.5 p.m. They talked... and then left. \"Stop!\" he said. Done",
    "One; two; three.\n\nA new paragraph. e.g. this one continues. The end.",
    '"Stop!" he said. 今日は。明日は\n\n(Quoted.) Then U.S.A. Next... and on. $3.50 is it',
])
@pytest.mark.parametrize("step", [1, 3, 7])
def test_sentence_buffer_gives_what_the_whole_text_splits_into(text, step):
    buf = SentenceBuffer()
    got = []
    for i in range(0, len(text), step):
        got += buf.feed(text[i:i + step])
    got += buf.finish()
    assert got == split_sentences(text)


def test_sentence_buffer_holds_the_last_piece_until_text_follows():
    buf = SentenceBuffer()
    assert buf.feed("It costs $3.") == []  # could still be "$3.50"
    assert buf.feed(" ") == []  # could still go on in lower case ("Mr. smith")
    assert buf.feed("Then") == ["It costs $3."]
    assert buf.finish() == ["Then"]


def test_sentence_buffer_splits_only_when_a_sentence_may_have_ended(monkeypatch):
    """Chunks that cannot end a sentence cost their own length, not a re-split of the held text
    (issue 49: 4 KB held, then 19,000 empty chunks, each re-split 4 KB on the event loop)."""
    from voxserve.text import split as text_split

    calls = []
    monkeypatch.setattr(text_split, "split_sentences", lambda t: calls.append(len(t)) or split_sentences(t))
    buf = SentenceBuffer()
    assert buf.feed("word " * 800) == [] and len(calls) == 0
    for piece in ["", "", " ", "more", "", "words"] * 100:
        assert buf.feed(piece) == []
    assert calls == []
    assert buf.feed(" end.") == [] and len(calls) == 1  # "end." could still be "end.5"
    assert buf.feed(" Next") == [("word " * 800 + " morewords" * 100 + " end.").strip()] and len(calls) == 2


# --------------------------------------------------------------------------- describe
def test_describe_lists_every_voice_with_languages_and_speakers(real_engine):
    async def go():
        async with wyoming_server(real_engine) as server, client(server) as c:
            await c.write_event(Describe().event())
            event = await c.read_event()
            return Info.from_event(event)

    info = run(go())
    assert len(info.tts) == 1
    program = info.tts[0]
    assert program.supports_synthesize_streaming is True
    voices = {v.name: v for v in program.voices}
    assert set(voices) == {"en_US-joe-medium", "tiny-multi"}
    assert voices["en_US-joe-medium"].languages == ["en-US"]
    assert not voices["en_US-joe-medium"].speakers  # single speaker
    assert voices["tiny-multi"].languages == ["en-US"]
    assert [s.name for s in voices["tiny-multi"].speakers] == ["spk0", "spk1", "spk2"]


# --------------------------------------------------------------------------- synthesize (real voices)
def test_synthesize_equals_library_synthesis_in_1024_sample_chunks(real_engine, joe_voice, tiny_voice):
    text = "The train to Boston leaves from platform nine. Please hold while I transfer your call."

    async def go():
        async with wyoming_server(real_engine, options=NOISE_OFF) as server, client(server) as c:
            joe = await synthesize(c, text)  # no voice: the first loaded one
            tiny = await synthesize(c, "Good morning. See you soon.",
                                    SynthesizeVoice(name="tiny-multi", speaker="spk2"))
            by_language = await synthesize(c, "Good morning.", SynthesizeVoice(language="en"))
            return joe, tiny, by_language

    joe, tiny, by_language = run(go())
    assert not joe.errors and not tiny.errors and not by_language.errors
    assert joe.types[0] == "audio-start" and joe.types[-1] == "audio-stop"
    assert_chunking(joe, 22050)
    assert_pcm_close(joe.pcm, float_to_int16(joe_voice.synthesize(text, voxserve.DETERMINISTIC).samples), "joe")
    assert_chunking(tiny, 16000)
    ref = tiny_voice.synthesize("Good morning. See you soon.",
                                PiperOptions(noise_scale=0, noise_w=0, speaker="spk2"))
    assert_pcm_close(tiny.pcm, float_to_int16(ref.samples), "tiny spk2")
    other = tiny_voice.synthesize("Good morning. See you soon.",
                                  PiperOptions(noise_scale=0, noise_w=0, speaker="spk0"))
    assert not np.array_equal(float_to_int16(other.samples), tiny.pcm)  # the speaker was used
    assert by_language.start.rate == 22050  # "en" chose the first voice speaking en_US


def test_streamed_text_split_mid_sentence_equals_one_shot(real_engine, joe_voice):
    pieces = ["The train to Bos", "ton leaves from plat", "form nine. Please ho", "ld while I transfer ",
              "your call. Thank", " you."]
    text = "".join(pieces)

    async def go():
        async with wyoming_server(real_engine, options=NOISE_OFF) as server, client(server) as c:
            streamed = await stream(c, pieces)
            one_shot = await synthesize(c, text)
            return streamed, one_shot

    streamed, one_shot = run(go())
    assert not streamed.errors, streamed.errors
    assert streamed.types[0] == "audio-start" and streamed.types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert all(c.samples <= SAMPLES_PER_CHUNK for c in streamed.chunks)
    assert_pcm_close(streamed.pcm, one_shot.pcm, "streamed vs one-shot")
    # the three sentences in order: each sentence's own audio, one after the other
    parts = [float_to_int16(joe_voice.synthesize(s, voxserve.DETERMINISTIC).samples)
             for s in ("The train to Boston leaves from platform nine.",
                       "Please hold while I transfer your call.", "Thank you.")]
    assert_pcm_close(streamed.pcm, np.concatenate(parts), "sentences in order")


# --------------------------------------------------------------------------- protocol (fake voice)
def test_streamed_first_audio_comes_before_synthesize_stop(fake):
    eng, voice = fake
    first = "This first sentence is long enough for its audio to fill more than one chunk of samples"

    async def go():
        async with wyoming_server(eng) as server, client(server, read_timeout=10) as c:
            await c.write_event(SynthesizeStart().event())
            await c.write_event(SynthesizeChunk(text=first + ". And the sec").event())
            early = Reply()
            await read_reply(c, until="audio-chunk", reply=early)  # no synthesize-stop sent yet
            assert not any("sec" in str(t) for t in voice.run_texts)  # the unfinished sentence waits
            await c.write_event(SynthesizeChunk(text="ond one").event())
            await c.write_event(SynthesizeStop().event())
            return await read_reply(c, until="synthesize-stopped", reply=early)

    reply = run(go(), timeout=60)
    assert not reply.errors
    assert [t for t in voice.run_texts if isinstance(t, str)] == [first, "And the second one"]  # (and a cut's rest)
    expected = np.concatenate([voice.audio_for(first), voice.audio_for("And the second one")])
    np.testing.assert_array_equal(reply.pcm, float_to_int16(expected))


def test_synthesize_inside_a_stream_is_not_said_twice(fake):
    eng, voice = fake

    async def go():
        async with wyoming_server(eng) as server, client(server, read_timeout=10) as c:
            await c.write_event(SynthesizeStart().event())
            await c.write_event(SynthesizeChunk(text="One two. Three").event())
            await c.write_event(Synthesize(text="One two. Three").event())  # for servers without streaming
            await c.write_event(SynthesizeStop().event())
            return await read_reply(c, until="synthesize-stopped")

    reply = run(go(), timeout=60)
    assert reply.types.count("audio-start") == 1 and not reply.errors
    assert sorted(voice.run_texts) == ["One two", "Three"]  # (two engine requests: either may run first)
    expected = np.concatenate([voice.audio_for("One two"), voice.audio_for("Three")])
    np.testing.assert_array_equal(reply.pcm, float_to_int16(expected))  # but the audio is in order


def test_two_clients_at_once_both_get_their_audio():
    eng, voice = fake_engine(delay_s=0.05, max_batch_size=2)
    texts = [" ".join(f"Client {k} sentence {i}." for i in range(12)) for k in (1, 2)]
    try:
        async def one(server, text, streamed):
            async with client(server, read_timeout=20) as c:
                return await (stream(c, [text[:17], text[17:]]) if streamed else synthesize(c, text))

        async def go():
            async with wyoming_server(eng) as server:
                return await asyncio.gather(one(server, texts[0], False), one(server, texts[1], True))

        replies = run(go(), timeout=120)
    finally:
        eng.shutdown(5)
    for text, reply in zip(texts, replies):
        assert not reply.errors
        np.testing.assert_array_equal(reply.pcm, float_to_int16(voice.expected(text)))
    # served at once, not one after the other: each started before the other ended
    where = [[i for i, t in enumerate(voice.run_texts) if t.startswith(f"Client {k}")] for k in (1, 2)]
    assert where[0][0] < where[1][-1] and where[1][0] < where[0][-1], voice.run_texts


def test_unknown_voice_or_speaker_is_an_error_event_and_the_connection_stays_usable(fake):
    eng, voice = fake

    async def go():
        async with wyoming_server(eng) as server, client(server, read_timeout=10) as c:
            no_voice = await synthesize(c, "Hello.", SynthesizeVoice(name="nobody"))
            no_speaker = await synthesize(c, "Hello.", SynthesizeVoice(name="fake", speaker="zed"))
            no_lang = await synthesize(c, "Hello.", SynthesizeVoice(language="xx"))
            stream_bad = await stream(c, ["Hello."], SynthesizeVoice(name="nobody"))
            await read_reply(c, until="synthesize-stopped", reply=stream_bad)  # its stop is answered
            ok = await synthesize(c, "Hello.", SynthesizeVoice(name="fake", speaker="b"))
            return no_voice, no_speaker, no_lang, stream_bad, ok

    no_voice, no_speaker, no_lang, stream_bad, ok = run(go(), timeout=60)
    assert no_voice.types == ["error"] and no_voice.errors[0].code == "voice_not_found"
    assert "'nobody'" in no_voice.errors[0].text and "fake" in no_voice.errors[0].text
    assert no_speaker.types == ["error"] and no_speaker.errors[0].code == "unknown_speaker"
    assert no_lang.types == ["error"] and "'xx'" in no_lang.errors[0].text
    assert stream_bad.types == ["error", "synthesize-stopped"]
    assert not ok.errors and ok.types[-1] == "audio-stop"
    np.testing.assert_array_equal(ok.pcm, float_to_int16(voice.expected("Hello.")))
    assert voice.run_texts == ["Hello"]  # the refused requests ran nothing


def test_text_over_the_limit_is_refused(fake):
    eng, voice = fake

    async def go():
        async with wyoming_server(eng, max_input_chars=50) as server, client(server, read_timeout=10) as c:
            one_shot = await synthesize(c, "x" * 51)
            # a streamed request's chunks count together; the exchange still ends with synthesize-stopped
            await c.write_event(SynthesizeStart().event())
            for _ in range(3):
                await c.write_event(SynthesizeChunk(text="Twenty characters. A").event())
            await c.write_event(SynthesizeStop().event())
            streamed = await read_reply(c, until="error")
            streamed = await read_reply(c, until="synthesize-stopped", reply=streamed)
            return one_shot, streamed

    one_shot, streamed = run(go(), timeout=60)
    assert one_shot.types == ["error"] and one_shot.errors[0].code == "text_too_long"
    assert "error" in streamed.types and streamed.types[-1] == "synthesize-stopped"
    assert streamed.errors[0].code == "text_too_long"


def test_empty_chunks_count_toward_the_text_bound(fake):
    """Each synthesize-chunk counts as one character at least: a flood of empty chunks ends the
    request with text_too_long (before: they counted nothing, for up to max_events events)."""
    eng, _ = fake

    async def go():
        async with wyoming_server(eng, max_input_chars=100) as server, client(server, read_timeout=10) as c:
            await c.write_event(SynthesizeStart().event())
            await c.write_event(SynthesizeChunk(text="Hello there").event())
            for _ in range(200):
                await c.write_event(SynthesizeChunk(text="").event())
            await c.write_event(SynthesizeStop().event())
            reply = await read_reply(c, until="error")
            return await read_reply(c, until="synthesize-stopped", reply=reply)

    reply = run(go(), timeout=60)
    assert reply.errors and reply.errors[0].code == "text_too_long" and reply.types[-1] == "synthesize-stopped"


def test_a_flood_of_chunks_without_a_sentence_end_keeps_the_event_loop_responsive(fake, monkeypatch):
    """The issue's flood, scaled down: 8 connections each hold ~3 KB without a sentence end and
    then send 1,000 one-character chunks. Each chunk re-split the whole held text on the shared
    event loop; now only a chunk that may end a sentence splits (none here), so the loop's lag
    (a 5 ms ticker's worst lateness, on the server's own loop: the clients run outside it)
    stays small."""
    import json
    import threading

    from voxserve.text import split as text_split

    eng, _ = fake
    splits = []
    monkeypatch.setattr(text_split, "split_sentences", lambda t: splits.append(len(t)) or split_sentences(t))

    def line(kind: str, **data) -> bytes:
        return json.dumps({"type": kind, "data": data}).encode() + b"\n"

    blob = b"".join([line("synthesize-start"), line("synthesize-chunk", text="word " * 600),
                     *[line("synthesize-chunk", text="x")] * 1000, line("synthesize-stop"), line("describe")])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = WyomingServer(eng, WyomingConfig(uri="tcp://127.0.0.1:0", max_input_chars=8192))
    lags: list[float] = []
    done = threading.Event()

    async def ticker():
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - t - 0.005)

    def flood(port: int, answered: list) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(blob)
            got = b""
            while b'"type": "info"' not in got and b'"type":"info"' not in got:
                more = sock.recv(1 << 16)
                if not more:
                    break
                got += more
            answered.append(b'"info"' in got)

    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
        tick = asyncio.run_coroutine_threadsafe(ticker(), loop)
        answered: list[bool] = []
        clients = [threading.Thread(target=flood, args=(port_of(server), answered)) for _ in range(8)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(120)
        done.set()
        tick.result(10)
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    worst = max(lags)
    print(f"worst event-loop lag during the flood: {worst * 1000:.0f} ms; held text re-split {len(splits)} times")
    assert answered == [True] * 8
    assert len(splits) <= 8  # one per connection, at its synthesize-stop (8,000 re-splits of ~3-4 KB before)
    assert worst < 0.5, worst


def test_a_deeply_nested_header_gets_an_error_event_and_the_server_lives_on(fake):
    eng, _ = fake

    async def go():
        async with wyoming_server(eng) as server:
            port = port_of(server)
            async with client(port, read_timeout=10) as c:
                deep = b'{"type": "synthesize", "data": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}\n"
                c._writer.write(deep)
                await c._writer.drain()
                first, then = await c.read_event(), await c.read_event()
            async with client(port, read_timeout=10) as c:
                await c.write_event(Describe().event())
                info = await c.read_event()
            return first, then, info

    first, then, info = run(go(), timeout=60)
    assert first is not None and Error.from_event(first).code == "bad_event" and then is None
    assert Info.is_type(info.type)


@pytest.mark.parametrize("streamed", [False, True])
def test_disconnect_mid_synthesis_cancels_the_request(streamed):
    eng, voice = fake_engine(delay_s=0.1, max_batch_size=1)
    n = 30
    text = " ".join(f"Sentence number {i} of a long text." for i in range(n))
    try:
        async def go():
            async with wyoming_server(eng) as server:
                async with client(server, read_timeout=20) as c:
                    if streamed:  # its sentences go to the engine as they are seen (no stop sent)
                        await c.write_event(SynthesizeStart().event())
                        await c.write_event(SynthesizeChunk(text=text).event())
                    else:
                        await c.write_event(Synthesize(text=text).event())
                    await read_reply(c, until="audio-chunk")
                # disconnected: the server sees it and cancels the engine request
                assert await asyncio.to_thread(wait_until, lambda: eng.in_flight == 0 and eng.queued_sentences() == 0)

        run(go(), timeout=60)
        time.sleep(0.3)  # a batch already on the worker when the request was cancelled ends
        ran = len(voice.run_texts)
        time.sleep(0.5)
        assert len(voice.run_texts) == ran  # nothing more runs for it
        assert ran < n and eng.sentences_dropped > 0
    finally:
        eng.shutdown(5)


def test_bounds_on_events_connections_and_idle_time(fake):
    eng, _ = fake

    async def go():
        async with wyoming_server(eng, max_event_bytes=1024, max_connections=1, idle_timeout_s=0.5,
                                  max_events=3) as server:
            port = port_of(server)
            async with client(port, read_timeout=10) as c:  # an event over the size bound
                await c.write_event(Synthesize(text="x" * 1500).event())
                too_big = await c.read_event()
                closed_after = await c.read_event()
            async with client(port, read_timeout=10) as c:  # the connection's event budget
                events = []
                for _ in range(4):
                    await c.write_event(Describe().event())
                    events.append(await c.read_event())
                closed_after_events = await c.read_event()
            async with client(port, read_timeout=10) as c:  # one connection only
                await c.write_event(Describe().event())
                assert Info.is_type((await c.read_event()).type)
                async with client(port, read_timeout=10) as c2:
                    refused = await c2.read_event()
                t0 = time.monotonic()
                idle_closed = await c.read_event()  # idle: closed by the server
                idle_s = time.monotonic() - t0
            return too_big, closed_after, events, closed_after_events, refused, idle_closed, idle_s

    too_big, closed_after, events, closed_after_events, refused, idle_closed, idle_s = run(go(), timeout=60)
    assert Error.from_event(too_big).code == "event_too_large" and closed_after is None
    assert [e.type for e in events] == ["info"] * 3 + ["error"]
    assert Error.from_event(events[-1]).code == "too_many_events" and closed_after_events is None
    assert Error.from_event(refused).code == "too_many_connections"
    assert idle_closed is None and idle_s < 5


def test_requests_queued_on_one_connection_are_bounded(fake):
    import threading

    from voxserve.serve.wyoming import MAX_QUEUED

    eng, voice = fake
    voice.gate = threading.Event()  # the first batch waits: nothing is answered meanwhile

    async def go():
        async with wyoming_server(eng) as server, client(server, read_timeout=10) as c:
            for k in range(MAX_QUEUED + 3):
                await c.write_event(Synthesize(text=f"Request {k}.").event())
            types = []
            for _ in range(10):
                event = await c.read_event()
                if event is None:
                    break
                types.append(event.type)
                if Error.is_type(event.type):
                    code = Error.from_event(event).code
            voice.gate.set()
            return types, code

    try:
        types, code = run(go(), timeout=60)
    finally:
        voice.gate.set()
    assert code == "too_many_requests" and types[-1] == "error", types
    assert eng.in_flight == 0 or wait_until(lambda: eng.in_flight == 0)  # the closed connection's requests are gone


def test_a_streamed_request_without_text_times_out(fake):
    eng, _ = fake

    async def go():
        async with wyoming_server(eng, idle_timeout_s=0.5) as server, client(server, read_timeout=10) as c:
            await c.write_event(SynthesizeStart().event())
            await c.write_event(SynthesizeChunk(text="Half a sen").event())
            events = [await c.read_event() for _ in range(3)]
            return events

    events = run(go(), timeout=60)
    assert events[0].type == "audio-start"
    assert Error.from_event(events[1]).code == "timeout" and events[2] is None


def test_malformed_events_get_an_error_and_a_close(fake):
    eng, _ = fake

    async def raw(port: int, data: bytes) -> list[Event | None]:
        async with client(port, read_timeout=10) as c:
            c._writer.write(data)
            await c._writer.drain()
            return [await c.read_event(), await c.read_event()]

    async def go():
        async with wyoming_server(eng) as server:
            port = port_of(server)
            return [await raw(port, d) for d in (b"not json\n", b'{"type": 5}\n',
                                                 b'{"type": "synthesize", "data_length": -1}\n')]

    for first, then in run(go(), timeout=60):
        assert Error.from_event(first).code == "bad_event" and then is None


def test_unix_socket_uri(fake, tmp_path):
    from wyoming.client import AsyncUnixClient

    eng, voice = fake
    path = tmp_path / "voxserve.sock"

    async def go():
        server = WyomingServer(eng, WyomingConfig(uri=f"unix://{path}"))
        await server.start()
        try:
            assert server.address == f"unix://{path}"
            c = AsyncUnixClient(str(path), read_timeout=10)
            await c.connect()
            try:
                return await synthesize(c, "Over a socket.")
            finally:
                await c.disconnect()
        finally:
            await server.close()

    reply = run(go(), timeout=60)
    np.testing.assert_array_equal(reply.pcm, float_to_int16(voice.expected("Over a socket.")))


def test_the_servers_options_become_each_voices_own_class(real_engine):
    """`voxserve wyoming`'s synthesis flags are one set for every voice it serves: each value is
    checked against its rule, then each voice takes those of its family's class (docs/serving.md,
    "Options and families")."""
    from voxserve.serve.wyoming import _Connection

    config = WyomingConfig(uri="tcp://127.0.0.1:0", options={"noise_scale": 0.0, "temperature": 0.5, "speed": 1.2})
    conn = _Connection(WyomingServer(real_engine, config), None, None)
    name, opts = conn._voice_and_options({"voice": {"name": "tiny-multi", "speaker": "spk1"}})
    assert name == "tiny-multi" and opts == PiperOptions(noise_scale=0.0, speed=1.2, speaker="spk1")
    with pytest.raises(InvalidOptionError, match="temperature"):  # Bark's, out of its range: refused at start
        WyomingConfig(uri="tcp://127.0.0.1:0", options={"temperature": 9.0}).validate()


@pytest.mark.parametrize("uri", ["http://127.0.0.1:10200", "tcp://127.0.0.1", "tcp://:10200", "unix://"])
def test_bad_uris_are_refused(uri):
    with pytest.raises(ValueError, match="Wyoming URI"):
        WyomingConfig(uri=uri).validate()


# --------------------------------------------------------------------------- HTTP and Wyoming together
def test_serve_with_http_runs_both_servers_on_one_engine_object():
    import httpx
    import uvicorn

    from voxserve.serve.app import AppConfig, create_app, http_protocol
    from voxserve.serve.wyoming import serve_with_http

    voice = FakeVoice(sample_rate=16000)
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    app = create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=5))  # its lifespan starts and stops eng
    hport, wport = free_port(), free_port()
    http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=hport, log_level="warning",
                                         http=http_protocol(app)))
    listening: list[WyomingServer] = []

    async def go():
        task = asyncio.create_task(serve_with_http(http, app.state.ready, eng,
                                                   WyomingConfig(uri=f"tcp://127.0.0.1:{wport}"),
                                                   on_ready=listening.append))
        try:
            for _ in range(500):
                if http.started:
                    break
                await asyncio.sleep(0.02)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{hport}", timeout=10) as h:
                r = await h.post("/v1/synthesize", json={"text": "From HTTP.", "response_format": "pcm"})
            async with client(wport, read_timeout=10) as c:
                reply = await synthesize(c, "From Wyoming.")
        finally:
            http.should_exit = True
            await task
        return r, reply

    r, reply = run(go(), timeout=60)
    assert r.status_code == 200 and not reply.errors
    np.testing.assert_array_equal(reply.pcm, float_to_int16(voice.expected("From Wyoming.")))
    assert listening[0].engine is eng and app.state.engine is eng
    assert voice.run_texts == ["From HTTP", "From Wyoming"]  # both ran on the one engine's voice
    from voxserve.errors import EngineClosedError

    with pytest.raises(EngineClosedError):  # the HTTP app's shutdown closed the shared engine
        eng.submit("fake", "Too late.", None, RecordingSink())


# --------------------------------------------------------------------------- the command line
def test_serve_with_wyoming_shares_one_engine():
    """One HTTP and one Wyoming request in one process: the Wyoming sentence shows in the HTTP
    server's engine counters, so both go through the same Engine."""
    wport = free_port()
    server = ServerProcess(["--voice", "en_US-joe-medium", "--wyoming", f"tcp://127.0.0.1:{wport}", "--no-warmup"])
    try:
        before = server.metric("voxserve_sentences_synthesized_total")

        async def go():
            async with client(wport) as c:
                await c.write_event(Describe().event())
                info = Info.from_event(await c.read_event())
                return info, await synthesize(c, "Hello from Home Assistant.")

        info, reply = run(go(), timeout=180)
        assert [v.name for v in info.tts[0].voices] == ["en_US-joe-medium"]
        assert not reply.errors and len(reply.pcm) > 22050 // 2
        after_wyoming = server.metric("voxserve_sentences_synthesized_total")
        assert after_wyoming > before  # the HTTP server's engine ran the Wyoming request
        r = server.client.post("/v1/synthesize", json={"text": "And from HTTP.", "response_format": "pcm"})
        assert r.status_code == 200
        assert server.metric("voxserve_sentences_synthesized_total") > after_wyoming
    finally:
        # SIGTERM: uvicorn shuts down, then re-raises the signal it caught; not killed after a timeout
        assert server.stop() == -signal.SIGTERM


def test_wyoming_command_serves_and_stops_on_sigterm(joe_voice):
    import threading

    port = free_port()
    exe = [sys.executable, "-m", "voxserve", "wyoming", "--uri", f"tcp://127.0.0.1:{port}", "--device", "cpu",
           "--no-warmup", "--noise-scale", "0", "--noise-w", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(exe, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(180)  # "voxserve: serving ... on tcp://..." once it listens
        assert lines and f"tcp://127.0.0.1:{port}" in lines[0], (lines, proc.poll())
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass

        async def go():
            async with client(port) as c:
                return await stream(c, ["Hello from the ", "command line. Bye."])

        reply = run(go(), timeout=180)
        assert not reply.errors and reply.start.rate == 22050
        ref = np.concatenate([float_to_int16(joe_voice.synthesize(s, voxserve.DETERMINISTIC).samples)
                              for s in ("Hello from the command line.", "Bye.")])
        assert_pcm_close(reply.pcm, ref, "cli")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
