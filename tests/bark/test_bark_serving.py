"""A Bark voice served next to the default VITS voice (en_US-joe-medium) through one engine,
scheduler and HTTP app: batching across presets, one voice per batch, cancellation, model
errors, every response format at 24 kHz, per-sentence streaming over a real loopback socket,
and `voxserve serve --voice bark:DIR` as a subprocess. Tiny random Bark (tests/bark_fixtures.py);
traffic to 127.0.0.1 only, every request with a timeout, every server stopped."""

from __future__ import annotations

import io
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf
from audio_compare import assert_pcm_close
from serve_fakes import RecordingSink
from server_process import ServerProcess, free_port

import voxserve
from voxserve import SynthesisOptions
from voxserve.audio import float_to_int16
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.errors import UnknownSpeakerError
from voxserve.families.bark import BarkOptions
from voxserve.families.bark.runner import BarkItem
from voxserve.families.piper import PiperOptions
from voxserve.serve.app import AppConfig, create_app
from voxserve.voice import Voice

TIMEOUT = httpx.Timeout(60.0, connect=10.0)
PRESETS = ["announcer", "v2/en_speaker_0", "v2/en_speaker_1"]


class Recorder(Voice):
    """A voice as the engine sees it, recording what its step runner runs: `batches` holds the
    payloads that joined before each step (one list per step that had joiners; for a one-shot
    voice, each batch's payloads); `hold` makes
    every step with joiners after the first wait until it is set (so a test can look at the
    stream in between); `fail_next` makes the next step raise. What the engine reads of a
    `Voice` comes from the wrapped voice."""

    def __init__(self, voice):
        self._voice = voice
        self.name, self.family, self.sample_rate = voice.name, voice.family, voice.sample_rate
        self.device, self.limits, self.word_timestamps = voice.device, voice.limits, voice.word_timestamps
        runner = voice.step_runner()
        self._runner = None if runner is None else _RecordingRunner(self, runner)
        self.batches: list[list] = []
        self.hold: threading.Event | None = None
        self.fail_next: Exception | None = None
        self.max_active = 0

    def __getattr__(self, name):
        return getattr(self._voice, name)

    def step_runner(self):
        return self._runner

    @property
    def concurrent_runs(self) -> bool:
        return self._voice.concurrent_runs

    @property
    def speakers(self):
        return self._voice.speakers

    @property
    def styles(self):
        return self._voice.styles

    @property
    def languages(self):
        return self._voice.languages

    @property
    def language_codes(self):
        return self._voice.language_codes

    def units(self, text, options=None):
        return self._voice.units(text, options)

    def silence_after(self, options):
        return self._voice.silence_after(options)

    def components(self):
        return self._voice.components()

    def with_component_output(self, unit, output):
        return self._voice.with_component_output(unit, output)

    def warmup(self) -> None:
        self._voice.warmup()

    def run_units(self, units, early=(), on_early=None):
        return self._voice.run_units(units, early, on_early)

    def run_pieces(self, units, early=(), max_cost=None, spare=False):  # a one-shot voice (VITS)
        self.batches.append([u.payload for u in units])
        return self._voice.run_pieces(units, early, max_cost, spare)


class _RecordingRunner:
    def __init__(self, rec: Recorder, runner):
        self.rec, self.runner, self.joining = rec, runner, []

    def __getattr__(self, name):
        return getattr(self.runner, name)

    @property
    def active(self):
        return self.runner.active

    def join(self, key, unit):
        self.joining.append(unit.payload)
        self.runner.join(key, unit)

    def step(self):
        rec = self.rec
        if self.joining:
            rec.batches.append(self.joining)
            self.joining = []
            if rec.hold is not None and len(rec.batches) > 1:
                assert rec.hold.wait(30), "test did not release the step"
        rec.max_active = max(rec.max_active, self.runner.active)
        if rec.fail_next is not None:
            e, rec.fail_next = rec.fail_next, None
            raise e
        return self.runner.step()


Sink = RecordingSink


def engine_for(*voices, **sched) -> Engine:
    # admission by time off (3600 s): these tests are about batching and formats, not overload
    return Engine({v.name: v for v in voices},
                  EngineConfig(scheduler=SchedulerConfig(**{"max_wait_ms": 0, **sched}), max_queue_wait_s=3600))


def wait_queued(eng: Engine, n: int, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while eng.queued_sentences() < n:
        assert time.time() < deadline, f"front end queued {eng.queued_sentences()} of {n} sentences"
        time.sleep(0.01)


def direct(voice, text: str, options: SynthesisOptions) -> np.ndarray:
    return voice.synthesize(text, options).samples


# ----------------------------------------------------------------------------- engine
def drain(eng: Engine, limit: int = 20_000) -> list:
    """Step until nothing is left; the batches (joins) each step returned."""
    out = []
    while (b := eng.step()) is not None:
        out.append(b)
        assert len(out) < limit, "the engine never ran out of work"
    return out


def test_one_step_holds_several_presets_and_each_gets_its_own_audio(bark_voice):
    rec = Recorder(bark_voice)
    eng = engine_for(rec, max_batch_size=8).start(threads=False)
    jobs = [("Hello world.", "announcer"), ("The cat is on the mat.", "v2/en_speaker_0"),
            ("I like pizza.", "v2/en_speaker_1"), ("A dog.", None), ("One two three.", 1)]
    sinks = []
    for k, (text, speaker) in enumerate(jobs):
        sinks.append(Sink())
        eng.submit(bark_voice.name, text, SynthesisOptions(speaker=speaker, seed=10 + k), sinks[-1])
    wait_queued(eng, len(jobs))
    batch = eng.step()
    assert batch is not None and len(batch) == len(jobs)  # all five requests joined the first step
    assert {p.speaker for p in rec.batches[0]} == {"announcer", "v2/en_speaker_0", "v2/en_speaker_1", None}
    drain(eng)
    assert len(rec.batches) == 1
    for (text, speaker), k, sink in zip(jobs, range(len(jobs)), sinks):
        assert sink.done.is_set() and sink.error is None
        ref = direct(bark_voice, text, SynthesisOptions(speaker=speaker, seed=10 + k))
        np.testing.assert_array_equal(sink.joined(), ref)  # alone == among the others


def test_bark_sequences_are_bounded_by_the_runner_capacity(bark_voice):
    rec = Recorder(bark_voice)
    eng = engine_for(rec).start(threads=False)
    text = " ".join(["The cat is on the mat."] * 6 + ["Hello."] * 6)
    sink = Sink()
    eng.submit(bark_voice.name, text, SynthesisOptions(seed=1), sink)
    wait_queued(eng, 12)
    drain(eng)
    capacity = bark_voice.step_runner().capacity
    assert sink.done.is_set() and len(sink.audio) == 12
    assert rec.max_active <= capacity
    assert len(rec.batches[0]) == min(8, capacity) - 1  # a lone request leaves a slot for a newcomer
    np.testing.assert_array_equal(sink.joined(), direct(bark_voice, text, SynthesisOptions(seed=1)))


def test_a_late_request_gets_its_audio_before_an_8_request_generation_ends(bark_voice):
    assert bark_voice.step_runner().capacity > 8  # the default leaves room beside the 8
    rec = Recorder(bark_voice)
    eng = engine_for(rec, max_batch_size=16).start(threads=False)
    long_text = "Hello world. The cat is on the mat. One two three four five six."
    sinks = [Sink() for _ in range(8)]
    for k, s in enumerate(sinks):
        eng.submit(bark_voice.name, long_text, SynthesisOptions(seed=k), s)
    wait_queued(eng, 24)
    for _ in range(3):  # the 8 are generating
        eng.step()
    assert rec.max_active >= 8 - 1
    late = Sink()
    rid = eng.submit(bark_voice.name, "I like pizza.", SynthesisOptions(seed=99), late)
    sched = next(iter(eng._workers.values())).scheduler
    deadline = time.time() + 10
    while not sched.pending_items(rid):  # its front end has queued it
        assert time.time() < deadline
        time.sleep(0.005)
    joined_at = None
    n = 0
    while not late.done.is_set():
        b = eng.step()
        assert b is not None
        n += 1
        if joined_at is None and any(p.text == "I like pizza." for p in (rec.batches[-1] if rec.batches else [])):
            joined_at = n
    assert joined_at == 1  # it joined at the next step
    assert not all(s.done.is_set() for s in sinks)  # its audio came before the generation ended
    drain(eng)
    assert all(s.done.is_set() and s.error is None for s in sinks)
    np.testing.assert_array_equal(late.joined(), direct(bark_voice, "I like pizza.", SynthesisOptions(seed=99)))


def test_vits_and_bark_one_voice_per_batch(bark_voice, joe_voice):
    bark, joe = Recorder(bark_voice), Recorder(joe_voice)
    eng = engine_for(joe, bark, max_batch_size=4).start(threads=False)
    sinks = {}
    for k in range(3):
        sinks[("joe", k)] = s = Sink()
        eng.submit(joe_voice.name, f"Request {k} starts here. It has two sentences.", voxserve.DETERMINISTIC, s)
        sinks[("bark", k)] = s = Sink()
        eng.submit(bark_voice.name, "Hello world. The cat is on the mat.", SynthesisOptions(seed=k), s)
    wait_queued(eng, 12)
    voices = []
    while (b := eng.step()) is not None:
        voices.append(b.voice)
    assert set(voices) == {joe_voice.name, bark_voice.name}
    assert all(isinstance(p, BarkItem) for batch in bark.batches for p in batch)
    assert not any(isinstance(p, BarkItem) for batch in joe.batches for p in batch)
    for (family, k), s in sinks.items():
        assert s.done.is_set() and s.error is None, (family, k, s.error)


def test_cancelled_bark_request_never_runs_its_queued_sentences(bark_voice):
    rec = Recorder(bark_voice)
    eng = engine_for(rec, max_batch_size=1).start(threads=False)  # one sentence joins a step
    sink = Sink()
    rid = eng.submit(bark_voice.name, "Hello world. The cat is on the mat. I like pizza. A dog.",
                     SynthesisOptions(seed=2), sink)
    wait_queued(eng, 4)
    eng.step()
    eng.cancel(rid)  # its first sentence is running, three are queued
    drain(eng)
    assert len(rec.batches) == 1 and eng.sentences_dropped == 3
    assert rec.step_runner().active == 0  # the running one left the runner
    assert not sink.done.is_set() and not sink.audio  # no callbacks after the cancel


def test_bark_model_failure_fails_its_batch_only(bark_voice, joe_voice):
    bark = Recorder(bark_voice)
    eng = engine_for(joe_voice, bark).start(threads=False)
    bad, vits = Sink(), Sink()
    eng.submit(bark_voice.name, "Hello world.", SynthesisOptions(seed=1), bad)
    eng.submit(joe_voice.name, "Still here.", voxserve.DETERMINISTIC, vits)
    wait_queued(eng, 2)
    bark.fail_next = RuntimeError("CUDA out of memory (simulated)")
    drain(eng)
    assert isinstance(bad.error, RuntimeError)
    assert vits.done.is_set() and vits.error is None
    again = Sink()  # the worker survived: the next Bark request runs
    eng.submit(bark_voice.name, "Hello world.", SynthesisOptions(seed=1), again)
    wait_queued(eng, 1)
    drain(eng)
    assert again.done.is_set() and again.error is None


def test_unknown_preset_is_refused_at_submit(bark_voice):
    eng = engine_for(bark_voice).start(threads=False)
    with pytest.raises(UnknownSpeakerError, match="announcer, v2/en_speaker_0, v2/en_speaker_1"):
        eng.submit(bark_voice.name, "Hello.", SynthesisOptions(speaker="v2/en_speaker_9"), Sink())
    assert eng.in_flight == 0


# ----------------------------------------------------------------------------- HTTP (in-process)
@pytest.fixture(scope="module")
def app_client(bark_voice, joe_voice):
    from fastapi.testclient import TestClient

    bark = Recorder(bark_voice)
    eng = engine_for(joe_voice, bark)
    app = create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=10))
    with TestClient(app) as c:
        yield c, bark, eng


def synth(c, **kw):
    return c.post("/v1/synthesize", json={"voice": "tiny-bark", "text": "Hello world. The cat is on the mat.",
                                          "seed": 5, "response_format": "pcm"} | kw)


def test_voices_lists_bark_with_its_presets(app_client):
    c, *_ = app_client
    voices = {v["name"]: v for v in c.get("/v1/voices").json()["voices"]}
    assert voices["tiny-bark"] == {"name": "tiny-bark", "family": "bark", "sample_rate": 24000,
                                   "speakers": PRESETS, "styles": [], "languages": ["en"],
                                   "options": ["speaker", "speed", "sentence_silence", "seed", "temperature"],
                                   "default": False}
    assert voices["en_US-joe-medium"]["options"] == ["speaker", "speed", "sentence_silence", "seed", "noise_scale",
                                                     "noise_w", "normalize", "input_format"]
    assert voices["en_US-joe-medium"]["sample_rate"] == 22050 and voices["en_US-joe-medium"]["default"]


@pytest.mark.parametrize("route", ["synthesize", "speech"])
@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus"])
def test_every_format_at_24khz(app_client, bark_voice, route, fmt):
    c, *_ = app_client
    text = "Hello world. The cat is on the mat."
    if route == "synthesize":  # the whole file
        r = synth(c, text=text, response_format=fmt, temperature=0)
    else:  # OpenAI route: streamed (chunked)
        r = c.post("/v1/audio/speech", json={"model": "tts-1", "voice": "tiny-bark", "input": text,
                                             "response_format": fmt})
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == "24000"
    if route == "speech":  # no seed on the OpenAI route: Bark samples; check the format only
        ref = None
        n = None
    else:
        ref = direct(bark_voice, text, voxserve.DETERMINISTIC)
        n = len(ref)
    data = r.content
    if fmt == "pcm":
        assert r.headers["content-type"] == "audio/L16; rate=24000; channels=1"
        got = np.frombuffer(data, "<i2")
        if ref is not None:
            np.testing.assert_array_equal(got, float_to_int16(ref))
        return
    if fmt == "wav":
        if route == "synthesize":
            with wave.open(io.BytesIO(data)) as w:
                assert w.getframerate() == 24000
                got = np.frombuffer(w.readframes(w.getnframes()), "<i2")
            np.testing.assert_array_equal(got, float_to_int16(ref))
        else:  # streamed header: unknown length, the rate is in it
            assert data[:4] == b"RIFF" and int.from_bytes(data[24:28], "little") == 24000
        return
    if fmt == "flac" and route == "speech":  # a stream's STREAMINFO has no total length
        assert data[:4] == b"fLaC" and sf.info(io.BytesIO(data)).samplerate == 24000
        return
    y, rate = sf.read(io.BytesIO(data), dtype="float32")
    # 24 kHz is an Opus rate: no resampling (22.05 kHz VITS voices are resampled to 48 kHz)
    assert rate == 24000, (fmt, rate)
    assert len(y) > 0
    if n is not None:
        if fmt == "flac":
            assert len(y) == n
            np.testing.assert_allclose(y, ref, atol=1e-4)
        elif fmt == "opus":
            assert abs(len(y) - n) < 24000 * 0.1
        else:  # mp3: encoder delay and padding
            assert 0 <= len(y) - n < 24000 * 0.2


def test_unknown_preset_is_400_listing_the_presets(app_client):
    c, *_ = app_client
    r = synth(c, speaker="v2/en_speaker_9")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid_input" and err["param"] == "speaker"
    for p in PRESETS:
        assert p in err["message"]
    assert synth(c, speaker=7).status_code == 400  # index out of range
    assert synth(c, speaker=1).status_code == 200  # an index into the listed presets
    assert synth(c, speed=1.5).status_code == 400  # Bark speaks at its own rate
    r = synth(c, text="!!! ... ???")  # nothing to say: found by the front end, still a 400
    assert r.status_code == 400 and "pronounceable" in r.json()["error"]["message"]


def test_a_request_cannot_make_the_server_open_a_path(app_client, tiny_bark_dir):
    c, _, eng = app_client
    before = set(eng.voices)
    for name in (f"bark:{tiny_bark_dir}", str(tiny_bark_dir), "../tiny-bark", f"{tiny_bark_dir}/config.json"):
        r = c.post("/v1/synthesize", json={"voice": name, "text": "Hello."})
        assert r.status_code == 404 and r.json()["error"]["code"] == "voice_not_found", name
    assert set(eng.voices) == before


def test_temperature_and_seed_pass_through(app_client, bark_voice):
    c, *_ = app_client
    text = "I like pizza. A dog is on the mat!"
    for opts, body in [(BarkOptions(temperature=0), {"temperature": 0}),
                       (SynthesisOptions(seed=9, speaker="announcer"), {"seed": 9, "speaker": "announcer"})]:
        r = synth(c, text=text, **body)
        assert r.status_code == 200
        np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"), float_to_int16(direct(bark_voice, text, opts)))
    assert synth(c, temperature=-1).status_code == 400


def test_another_familys_options_are_checked_then_ignored(app_client):
    """One request shape serves every voice (docs/serving.md, "Options and families"): Piper's
    and CosyVoice 2's knobs change nothing on a Bark voice, but a value out of its rule is still
    a 400 naming it."""
    c, *_ = app_client
    plain = synth(c, temperature=0)
    other = synth(c, temperature=0, noise_scale=2.0, noise_w=0.0, input_format="ssml", instructions="Calmly.")
    assert plain.status_code == other.status_code == 200, other.text
    assert plain.content == other.content
    bad = synth(c, noise_scale=9.0)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "noise_scale", bad.text


def test_the_library_takes_bark_options_or_plain_ones_not_another_familys(bark_voice):
    assert bark_voice.synthesis_options is BarkOptions
    with pytest.raises(TypeError, match="BarkOptions"):
        bark_voice.units("Hello.", PiperOptions(noise_scale=0.0))
    with pytest.raises(TypeError, match="noise_scale"):
        BarkOptions(noise_scale=0.0)
    [u] = bark_voice.units("Hello.", voxserve.DETERMINISTIC)  # Bark's deterministic(): greedy
    assert u.payload.temperatures == (0.0, 0.0, 0.0)
    [u] = bark_voice.units("Hello.", bark_voice.synthesis_options(temperature=0.5, seed=3))
    assert u.payload.temperatures[:2] == (0.5, 0.5)


def test_model_failure_is_a_500_and_the_server_carries_on(app_client):
    c, bark, _ = app_client
    bark.fail_next = RuntimeError("simulated device failure")
    r = synth(c)
    assert r.status_code == 500 and r.json()["error"]["message"] == "internal error"
    assert "simulated" not in r.text
    assert synth(c).status_code == 200


# ----------------------------------------------------------------------------- HTTP (real socket)
def test_streaming_bark_request_sends_each_sentence_as_it_is_made(bark_voice, joe_voice):
    import uvicorn

    bark = Recorder(bark_voice)
    eng = engine_for(joe_voice, bark, max_batch_size=1)  # one sentence a batch
    app = create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=5))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while not server.started:
            assert time.time() < deadline and thread.is_alive(), "server did not start"
            time.sleep(0.05)
        text = "Hello world. The cat is on the mat. One two three four five six."
        opts = SynthesisOptions(seed=3, speaker="v2/en_speaker_1")
        units = list(bark_voice.units(text, opts))
        sentences = [float_to_int16(a) for a in (bark_voice.run_units([u])[0] for u in units)]
        assert len(sentences) == 3
        bark.hold = threading.Event()  # batch 2 (sentence 2) waits until we have sentence 1
        body = {"voice": "tiny-bark", "text": text, "seed": 3, "speaker": "v2/en_speaker_1",
                "response_format": "pcm", "stream": True}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            with client.stream("POST", "/v1/synthesize", json=body) as r:
                assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
                it = r.iter_raw()
                got = b""
                while len(got) < 2 * len(sentences[0]):
                    got += next(it)
                # sentence 1 is here, and sentence 2 cannot be done: it is held in the model
                # (the worker starts it on its own thread; give it a moment to get there)
                deadline = time.time() + 10
                while len(bark.batches) < 2 and time.time() < deadline:
                    time.sleep(0.01)
                assert len(bark.batches) == 2
                assert got == sentences[0].tobytes()
                bark.hold.set()
                got += b"".join(it)
        assert got == b"".join(s.tobytes() for s in sentences)
        assert len(bark.batches) == 3
    finally:
        if bark.hold is not None:
            bark.hold.set()
        server.should_exit = True
        thread.join(30)


# ----------------------------------------------------------------------------- voxserve serve
@pytest.fixture(scope="module")
def served(tiny_bark_dir, joe_voice):  # joe_voice first: its converted weights are then cached
    s = ServerProcess(["--threads", "1", "--max-batch-size", "4", "--voice", "en_US-joe-medium",
                       "--voice", f"bark:{tiny_bark_dir}", "--voice", f"narrator=bark:{tiny_bark_dir}"])
    yield s
    s.stop()


def test_serve_names_bark_voices_by_directory_or_given_name(served):
    voices = {v["name"]: v for v in served.client.get("/v1/voices").json()["voices"]}
    assert list(voices) == ["en_US-joe-medium", "tiny-bark", "narrator"]
    assert voices["narrator"]["family"] == "bark" and voices["narrator"]["speakers"] == PRESETS


def test_vits_and_bark_requests_at_once_all_succeed_with_their_rates(served, bark_voice, joe_voice):
    joe_texts = ["The train to Boston leaves from platform nine.", "Hello there. How are you today?",
                 "Please hold while I transfer your call.", "One more sentence. And another one."]
    bark_jobs = [("Hello world. The cat is on the mat.", "announcer", 1),
                 ("I like pizza.", "v2/en_speaker_0", 2), ("A dog is on the mat!", "v2/en_speaker_1", 3),
                 ("One two three four five six.", None, 4)]
    jobs = ([("en_US-joe-medium", t, None, None, k % 2 == 0) for k, t in enumerate(joe_texts)]
            + [(v, t, sp, seed, seed % 2 == 0) for (t, sp, seed), v in
               zip(bark_jobs, ["tiny-bark", "narrator", "tiny-bark", "narrator"])])

    def call(job):
        voice, text, speaker, seed, stream = job
        body = {"voice": voice, "text": text, "response_format": "pcm", "stream": stream}
        if voice == "en_US-joe-medium":
            body |= {"noise_scale": 0, "noise_w": 0}
        else:
            body |= {"speaker": speaker, "seed": seed}
        return served.client.post("/v1/synthesize", json=body)

    with ThreadPoolExecutor(len(jobs)) as pool:
        responses = list(pool.map(call, jobs))
    assert [r.status_code for r in responses] == [200] * len(jobs), [r.text[:200] for r in responses]
    for (voice, text, speaker, seed, _), r in zip(jobs, responses):
        got = np.frombuffer(r.content, "<i2")
        if voice == "en_US-joe-medium":
            assert r.headers["x-sample-rate"] == "22050"
            ref = float_to_int16(direct(joe_voice, text, voxserve.DETERMINISTIC))
        else:
            assert r.headers["x-sample-rate"] == "24000"
            ref = float_to_int16(direct(bark_voice, text, SynthesisOptions(speaker=speaker, seed=seed)))
        assert_pcm_close(got, ref, f"{voice}: {text}")


def test_client_disconnect_stops_bark_work(served, bark_voice):
    n = 80
    before = served.metric("voxserve_sentences_synthesized_total")
    text = " ".join(["The cat is on the mat."] * n)
    with served.client.stream("POST", "/v1/audio/speech", json={"model": "tts-1", "voice": "tiny-bark",
                                                                "input": text, "response_format": "pcm"}) as r:
        assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
        next(r.iter_bytes())
    # wait until nothing more is being generated
    last, _ = served.wait_settled("voxserve_sentences_synthesized_total", quiet_s=1.5, timeout_s=60)
    # the sequences running when the client left (a lone request's sentences run side by side,
    # up to the runner's capacity) and those that end before the cancel reaches the worker: never the rest
    assert last - before <= 2 * bark_voice.step_runner().capacity < n, last - before
    assert served.metric("voxserve_sentences_dropped") > 0
    assert served.metric("voxserve_in_flight_requests") == 0


def test_serve_refuses_two_voices_with_one_name(tiny_bark_dir, monkeypatch):
    from voxserve.serve.build import load_voices, parse_voice_spec
    from voxserve.serve.settings import ServeSettings
    from voxserve.voices import registry

    monkeypatch.setattr(registry, "_registered", {})  # load_voices registers names process-wide

    assert parse_voice_spec("narrator=bark:/m/b") == ("narrator", "bark:/m/b")
    assert parse_voice_spec("bark:/m/a=b") == (None, "bark:/m/a=b")
    assert parse_voice_spec("/m/x=y.onnx") == (None, "/m/x=y.onnx")
    with pytest.raises(ValueError, match="two voices are named 'tiny-bark'"):
        load_voices(ServeSettings.of(device="cpu", voices=(f"bark:{tiny_bark_dir}", f"bark:{tiny_bark_dir}/")))
    with pytest.raises(ValueError, match="use --voice bark:"):
        load_voices(ServeSettings.of(device="cpu", voices=(str(tiny_bark_dir),)))
    monkeypatch.chdir(tiny_bark_dir)
    assert list(load_voices(ServeSettings.of(device="cpu", voices=("bark:.",)))) == ["tiny-bark"]
    assert registry.resolve_voice("tiny-bark", allow_paths=False).family == "bark"  # the name resolves
