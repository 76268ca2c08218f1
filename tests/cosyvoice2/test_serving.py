"""CosyVoice 2 through the engine and the HTTP app (tiny random model): seeded requests give
the library's audio, streamed in chunks before the sentence ends, and the OpenAI route serves
24 kHz audio. Traffic is in-process (TestClient) only."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import soundfile as sf

from cv2_fixtures import assert_same_audio

from voxserve import SynthesisOptions
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.engine import Sink as EngineSink
from voxserve.serve.app import AppConfig, create_app


class ChunkSink(EngineSink):
    """Every audio call of a request, in order: (sentence index, samples, partial)."""

    def __init__(self):
        self.calls: list[tuple[int, np.ndarray, bool]] = []
        self.done = threading.Event()
        self.error: BaseException | None = None

    def on_audio(self, index, samples, text, partial=False):
        self.calls.append((index, np.asarray(samples), partial))

    def on_done(self, n):
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.done.set()

    def joined(self) -> np.ndarray:
        return np.concatenate([a for _, a, _ in self.calls])


def engine_for(voice) -> Engine:
    return Engine({voice.name: voice},
                  EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), max_queue_wait_s=3600))


def test_seeded_requests_through_the_engine_equal_the_library_and_stream_in_chunks(cv2_voice):
    eng = engine_for(cv2_voice).start(threads=False)
    texts = [("Hello there, this is a longer sentence to say.", 3), ("Short one. And a second.", 4)]
    sinks = []
    for text, seed in texts:
        sinks.append(ChunkSink())
        eng.submit(cv2_voice.name, text, SynthesisOptions(seed=seed), sinks[-1])
    for _ in range(20_000):
        if all(s.done.is_set() for s in sinks):
            break
        eng.step()
    for (text, seed), sink in zip(texts, sinks):
        assert sink.done.is_set() and sink.error is None
        ref = cv2_voice.synthesize(text, SynthesisOptions(seed=seed)).samples
        assert_same_audio(sink.joined(), ref)
    assert sum(p for _, _, p in sinks[0].calls) >= 2  # the long sentence came in several chunks


@pytest.fixture(scope="module")
def client(cv2_voice):
    from fastapi.testclient import TestClient

    app = create_app(engine_for(cv2_voice), AppConfig(warmup=False, shutdown_timeout_s=10))
    with TestClient(app) as c:
        yield c


def test_http_synthesize_pcm_equals_the_library(client, cv2_voice):
    text = "Hello there."
    r = client.post("/v1/synthesize", json={"voice": cv2_voice.name, "text": text, "seed": 5,
                                            "response_format": "pcm"}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == "24000"
    got = np.frombuffer(r.content, "<i2").astype(np.float32) / 32767
    ref = cv2_voice.synthesize(text, SynthesisOptions(seed=5)).samples
    assert_same_audio(got, np.clip(ref, -1, 1))


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_openai_route_streams_24khz_audio(client, cv2_voice, fmt):
    r = client.post("/v1/audio/speech", json={"model": "tts-1", "voice": cv2_voice.name, "input": "Hello there.",
                                              "response_format": fmt}, timeout=120)
    assert r.status_code == 200, r.text
    data, rate = sf.read(io.BytesIO(r.content))
    assert rate == 24000 and len(data) > 24000 * 0.5


def test_an_unknown_speaker_is_a_400(client, cv2_voice):
    r = client.post("/v1/synthesize", json={"voice": cv2_voice.name, "text": "Hello.", "speaker": "nobody"},
                    timeout=30)
    assert r.status_code == 400 and "nobody" in r.text


# ----------------------------------------------------------------------------- voxserve serve
@pytest.fixture(scope="module")
def served(cv2_dir, prompt_wav, tmp_path_factory):
    from server_process import ServerProcess

    from voxserve.cli import main

    folder = tmp_path_factory.mktemp("voices")
    assert main(["voices", "add", "me", "--model", f"cosyvoice2:{cv2_dir}", "--prompt-wav", str(prompt_wav),
                 "--prompt-text", "Hello, this is my voice.", "--dir", str(folder)]) == 0
    s = ServerProcess(["--threads", "1", "--voice", f"cosyvoice2:{cv2_dir}", "--voice", "me"],
                      env={"VOXSERVE_VOICES_PATH": str(folder)})
    yield s, folder
    s.stop()


def test_serve_lists_the_model_folder_and_the_saved_voice(served):
    s, _ = served
    voices = {v["name"]: v for v in s.client.get("/v1/voices").json()["voices"]}
    assert set(voices) == {"tiny-cosyvoice2", "me"}
    assert voices["tiny-cosyvoice2"]["family"] == voices["me"]["family"] == "cosyvoice2"
    assert voices["tiny-cosyvoice2"]["speakers"] == ["spk"] and voices["me"]["speakers"] == ["me"]


def test_serve_streams_the_saved_voice_as_the_library_says_it(served, monkeypatch):
    import voxserve

    s, folder = served
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(folder))
    text = "Hello there, this is a longer sentence to say."
    body = {"voice": "me", "text": text, "seed": 7, "response_format": "pcm", "stream": True}
    pieces = []
    with s.client.stream("POST", "/v1/synthesize", json=body) as r:
        assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
        pieces = [p for p in r.iter_raw() if p]
    assert len(pieces) >= 2  # chunks arrive before the sentence is done
    got = np.frombuffer(b"".join(pieces), "<i2").astype(np.float32) / 32767
    ref = voxserve.load_voice("me", device="cpu").synthesize(text, SynthesisOptions(seed=7)).samples
    assert_same_audio(got, np.clip(ref, -1, 1))
    r = s.client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "me", "input": "Hi.",
                                                "response_format": "wav"})
    assert r.status_code == 200 and sf.info(io.BytesIO(r.content)).samplerate == 24000


def test_client_disconnect_stops_cosyvoice_work(served):
    s, _ = served
    n = 60
    before = s.metric("voxserve_sentences_synthesized_total")
    text = " ".join(["The cat is on the mat."] * n)
    with s.client.stream("POST", "/v1/synthesize", json={"voice": "tiny-cosyvoice2", "text": text, "seed": 1,
                                                         "response_format": "pcm", "stream": True}) as r:
        assert r.status_code == 200
        next(r.iter_raw())
    _, settled = s.wait_settled("voxserve_step_sequences_count", quiet_s=2, timeout_s=90)
    assert settled, "the worker kept stepping after the client left"
    # the sentences decoding side by side when the client left (up to the runner's capacity),
    # and those that end before the cancel reaches the worker; never the rest
    assert s.metric("voxserve_sentences_synthesized_total") - before < n // 2
    assert s.metric("voxserve_sentences_dropped") > 0
    assert s.metric("voxserve_in_flight_requests") == 0
