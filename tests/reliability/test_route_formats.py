"""Every format that a route returns decodes with libsndfile (`soundfile.read`), PyAV and the
format's own tool (flac, mpg123, opusdec, faad, where installed), to the right length: the
samples of the same request's pcm, within the codec's padding. Against the reliability tests'
real server (conftest.py).

Where a reader cannot: libsndfile has no AAC decoder, and it reads a FLAC of unknown length
(STREAMINFO total 0: the stream form, sent only where the client asks for a stream:
`/v1/synthesize` `stream: true`, SSE) as 2^63-1 frames, so `soundfile.read` cannot allocate it
(docs/serving.md says so); those two are read by the other decoders only.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

TEXT = "Hello there. This answer has two sentences."
OPTS = {"seed": 5, "sentence_silence": 0.3}
FORMATS = ("wav", "flac", "mp3", "opus", "aac", "pcm")
# (decoded - expected) seconds allowed: none for the lossless ones; the lossy codecs' delay and
# padding (mp3: 576 samples + up to two granules; aac: 1024 priming + a frame; opus: 80 ms of
# last-page padding at most), at the tiny voice's 16 kHz
SLACK = {"wav": (0, 0), "pcm": (0, 0), "flac": (0, 0), "mp3": (-0.08, 0.16), "aac": (-0.07, 0.2),
         "opus": (-0.01, 0.09)}


def fetch(s, route: str, fmt: str) -> tuple[bytes, bool]:
    """(the encoded file a route answers, whether it came as the stream form)."""
    c = s.client
    speech = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": fmt} | OPTS
    if route == "speech":
        r = c.post("/v1/audio/speech", json=speech)
        assert r.status_code == 200, r.text
        return r.content, fmt != "flac"
    if route == "speech_sse":
        r = c.post("/v1/audio/speech", json=speech | {"stream_format": "sse"})
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == "speech.audio.done", events[-1]
        return b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), True
    if route in ("synthesize", "synthesize_stream"):
        streamed = route == "synthesize_stream"
        r = c.post("/v1/synthesize", json={"text": TEXT, "response_format": fmt, "stream": streamed} | OPTS)
        assert r.status_code == 200, r.text
        return r.content, streamed
    assert route == "captioned"
    r = c.post("/v1/audio/captioned_speech", json=speech)
    assert r.status_code == 200, r.text
    return base64.b64decode(r.json()["audio"]), False


def by_soundfile(data: bytes, fmt: str, rate: int) -> float:
    """Seconds decoded."""
    if fmt == "pcm":
        y, r = sf.read(io.BytesIO(data), samplerate=rate, channels=1, format="RAW", subtype="PCM_16")
    else:
        y, r = sf.read(io.BytesIO(data))
    return len(y) / r


def by_pyav(data: bytes, fmt: str, rate: int) -> float:
    import av

    kw = {"format": "s16le", "options": {"sample_rate": str(rate), "channels": "1"}} if fmt == "pcm" else {}
    n, r = 0, rate
    with av.open(io.BytesIO(data), **kw) as c:
        for frame in c.decode(audio=0):
            n, r = n + frame.samples, frame.sample_rate
    return n / r


TOOLS = {  # format: (tool, command from input path to output path, output is wav)
    "flac": ("flac", lambda i, o: ["flac", "-d", "-s", "-f", "-o", o, i]),
    "mp3": ("mpg123", lambda i, o: ["mpg123", "-q", "-w", o, i]),
    "opus": ("opusdec", lambda i, o: ["opusdec", "--quiet", "--rate", "48000", i, o]),
    "aac": ("faad", lambda i, o: ["faad", "-q", "-o", o, i]),
}


def by_own_tool(data: bytes, fmt: str, rate: int, tmp_path) -> float:
    tool, cmd = TOOLS[fmt]
    src, out = tmp_path / f"in.{fmt}", tmp_path / "out.wav"
    src.write_bytes(data)
    r = subprocess.run(cmd(str(src), str(out)), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    info = sf.info(str(out))
    return info.frames / info.samplerate


@pytest.fixture(scope="module")
def rate(http_server) -> int:
    return http_server.client.get("/v1/voices").json()["voices"][0]["sample_rate"]


@pytest.fixture(scope="module")
def expected(http_server) -> dict[str, int]:
    """Samples of each route's answer, from its pcm (the same request, deterministic)."""
    return {route: len(fetch(http_server, route, "pcm")[0]) // 2
            for route in ("speech", "speech_sse", "synthesize", "synthesize_stream", "captioned")}


@pytest.mark.parametrize("route", ["speech", "speech_sse", "synthesize", "synthesize_stream", "captioned"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_of_every_route_decodes_to_its_length(http_server, rate, expected, route, fmt, tmp_path):
    data, streamed = fetch(http_server, route, fmt)
    n = expected[route]
    seconds = {"pyav": by_pyav(data, fmt, rate)}
    if fmt != "aac" and not (fmt == "flac" and streamed):  # the two libsndfile cannot (module doc)
        seconds["soundfile"] = by_soundfile(data, fmt, rate)
    if fmt in TOOLS and shutil.which(TOOLS[fmt][0]):
        seconds[TOOLS[fmt][0]] = by_own_tool(data, fmt, rate, tmp_path)
    lo, hi = SLACK[fmt]
    for reader, got in seconds.items():
        assert lo - 1e-9 <= got - n / rate <= hi + 1e-9, (reader, got, n / rate)
    if fmt == "flac" and not streamed:
        assert sf.info(io.BytesIO(data)).frames == n  # the whole file records its length


def test_flac_from_the_openai_route_is_whole_and_reads_with_soundfile(http_server, rate, expected):
    """The report's case: `soundfile.read` of a FLAC from /v1/audio/speech ("array is too big")."""
    r = http_server.client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "alloy",
                                                          "response_format": "flac"} | OPTS)
    assert r.status_code == 200 and int(r.headers["content-length"]) == len(r.content)
    y, got_rate = sf.read(io.BytesIO(r.content), dtype="int16")
    assert got_rate == rate and len(y) == expected["speech"]
    pcm = http_server.client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "voice": "alloy",
                                                            "response_format": "pcm"} | OPTS)
    np.testing.assert_array_equal(y, np.frombuffer(pcm.content, "<i2"))
