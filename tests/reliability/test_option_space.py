"""The option space, property-tested: no value of any option makes the library raise anything but
the documented errors, nor make more audio than the request's limit; the same values over HTTP
never give a 5xx. The repros of the reliability issue are pinned as explicit examples."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import voxserve
from voxserve import AudioTooLongError, InvalidOptionError, Limits, SynthesisOptions, UnknownSpeakerError
from voxserve.audio import silence_samples
from voxserve.families import families, synthesis_rules
from voxserve.families.piper import PiperOptions
from voxserve.options import option_range

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
LIMITS = Limits(max_sentence_audio_seconds=4.0, max_audio_seconds=6.0)
TEXT = "Hello there. How are you today? Fine."


RULES = synthesis_rules()  # every family's options, each with its rule


def edges(name: str) -> list:
    lo, hi = RULES[name].range
    return [lo, hi, lo - 1e-9, hi + 1e-9, (lo + hi) / 2, -hi, hi * 10, 1e-9]


ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4), st.lists(st.integers(), max_size=2),
)


def values(name: str):
    kind = RULES[name].kind
    if kind == "id_or_name":
        return st.one_of(ANY, st.integers(-2, 4), st.sampled_from(["0", "1", "2", "7", "a", ""]))
    if kind in ("name", "boolean"):
        return st.one_of(ANY, st.sampled_from(["JP", "en", "x" * 9, True, False]))
    return st.one_of(ANY, st.sampled_from(edges(name)))


OPTIONS = st.fixed_dictionaries({}, optional={f.name: values(f.name) for f in fields(PiperOptions)})  # the tiny voice's


@pytest.fixture(scope="module")
def tiny_limited(tiny_voice_path):
    return voxserve.load_voice(str(tiny_voice_path), device="cpu", limits=LIMITS)


@SETTINGS
@given(kw=OPTIONS)
@example(kw={"noise_w": 5})
@example(kw={"noise_w": 10})
@example(kw={"speed": 1e-9})
@example(kw={"speed": 0.02})
@example(kw={"speed": True})
@example(kw={"sentence_silence": 10.0})
@example(kw={"speed": 0.25, "noise_w": 1.5, "noise_scale": 2.0})
def test_library_options_raise_only_documented_errors_and_respect_the_cap(tiny_limited, kw):
    try:
        opts = PiperOptions(**kw)
        audio = tiny_limited.synthesize(TEXT, opts)
        chunks = list(tiny_limited.stream(TEXT, opts))
    except (InvalidOptionError, UnknownSpeakerError, AudioTooLongError):
        return
    assert audio.duration <= LIMITS.max_audio_seconds
    # (the stream holds the sentence silence, as synthesize's audio does)
    assert sum(len(c.samples) for c in chunks) / tiny_limited.sample_rate <= LIMITS.max_audio_seconds + 1e-9
    gap = silence_samples(opts.sentence_silence or 0.0, tiny_limited.sample_rate)
    assert all(len(c.samples) - (0 if c.is_last or c.partial else gap) <= LIMITS.max_sentence_audio_seconds
               * c.sample_rate for c in chunks)


@pytest.mark.parametrize("cls", sorted({f.synthesis_options for f in families().values()}, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_every_numeric_option_has_an_inclusive_range(cls):
    for f in fields(cls):
        if option_range(f.name, cls) is None:
            continue
        lo, hi = option_range(f.name, cls)
        cls(**{f.name: lo}).validate()
        cls(**{f.name: hi}).validate()
        for bad in (hi + 1, lo - 1, math.nan, math.inf, True, "1"):
            with pytest.raises(InvalidOptionError, match=f.name):
                cls(**{f.name: bad}).validate()


def test_sentence_over_its_limit_fails_alone_in_its_batch(tiny_voice_path):
    """A sentence over the limit fails with AudioTooLongError; the batch's other sentences still
    come back (the engine fails only that request)."""
    voice = voxserve.load_voice(str(tiny_voice_path), device="cpu",
                                limits=Limits(max_sentence_audio_seconds=0.05))
    units = [next(iter(voice.units(t, voxserve.DETERMINISTIC))) for t in ("A.", "This one is a much longer sentence.")]
    out = voice.run_pieces(units)
    assert not isinstance(out[0][0], BaseException) and len(out[0][0]) <= 0.05 * voice.sample_rate
    assert isinstance(out[1].error, AudioTooLongError) and out[1].error.option == "max_sentence_audio_seconds"
    with pytest.raises(AudioTooLongError, match="max_sentence_audio_seconds"):
        voice.synthesize("This one is a much longer sentence.")


def test_request_limit_counts_sentence_silence(tiny_voice_path):
    voice = voxserve.load_voice(str(tiny_voice_path), device="cpu", limits=Limits(max_audio_seconds=15.0))
    text = "One. Two. Three."
    voice.synthesize(text, SynthesisOptions(sentence_silence=5.0))  # 2 gaps: 10 s + speech
    with pytest.raises(AudioTooLongError, match="max_audio_seconds"):
        voice.synthesize(text + " Four.", SynthesisOptions(sentence_silence=5.0))
    with pytest.raises(AudioTooLongError, match="max_audio_seconds"):
        list(voice.stream(text + " Four.", SynthesisOptions(sentence_silence=5.0)))


def test_joe_voice_at_the_edges_of_every_range_stays_bounded(joe_voice):
    """The real voice at the slowest, noisiest corner of the option space, on the longest
    sentence the front end makes: the audio stays far below the sentence limit."""
    text = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
            "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light")
    worst = 0.0
    for seed in range(3):
        opts = PiperOptions(speed=0.25, noise_w=1.5, noise_scale=2.0, seed=seed)
        worst = max(worst, max(len(c.samples) / c.sample_rate for c in joe_voice.stream(text, opts)))
    assert worst < joe_voice.limits.max_sentence_audio_seconds


# ----------------------------------------------------------------------------------- HTTP
JSON_ANY = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4),
                     st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


def json_values(name: str):
    kind = RULES[name].kind
    if kind == "id_or_name":
        return st.one_of(JSON_ANY, st.integers(-2, 4))
    if kind in ("name", "boolean"):
        return st.one_of(JSON_ANY, st.sampled_from(["JP", "x" * 9, True, False]))
    return st.one_of(JSON_ANY, st.sampled_from([v for v in edges(name) if math.isfinite(v)]))


SYNTH_BODY = st.fixed_dictionaries(
    {"text": st.one_of(st.just(TEXT), st.just(""), st.just("..."), JSON_ANY)},
    optional={**{name: json_values(name) for name in RULES},
              "stream": JSON_ANY, "response_format": st.sampled_from(["wav", "pcm", "flac", "mp3", "aac", "x", 3])})
SPEECH_BODY = st.fixed_dictionaries(
    {"model": st.sampled_from(["tts-1", "voxserve", "nope", 1]), "input": st.one_of(st.just(TEXT), JSON_ANY),
     "voice": st.sampled_from(["alloy", "tiny-multi", "missing", 3])},
    optional={"speed": json_values("speed"), "response_format": st.sampled_from(["wav", "pcm", "flac", "aac", None]),
              "stream_format": st.sampled_from(["audio", "sse", 1])})


@pytest.fixture(scope="module")
def http(tiny_voice_path):
    from fastapi.testclient import TestClient

    from voxserve.engine import Engine, EngineConfig, SchedulerConfig
    from voxserve.serve.app import AppConfig, create_app

    voice = voxserve.load_voice(str(tiny_voice_path), device="cpu", limits=LIMITS)
    voice.name = "tiny-multi"
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    statuses: list[int] = []
    with TestClient(create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=5))) as c:
        yield c, statuses
    print(f"\nHTTP option property test: {len(statuses)} requests, "
          f"{sum(s >= 500 for s in statuses)} 5xx, statuses {sorted(set(statuses))}")


def check_response(r, statuses: list[int]) -> None:
    statuses.append(r.status_code)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["message"] and err["code"], err


@SETTINGS
@given(body=SYNTH_BODY)
@example(body={"text": "Hello there.", "noise_w": 5})
@example(body={"text": "Hello there.", "noise_w": 10})
@example(body={"text": "Hello there.", "speed": 1e-9})
@example(body={"text": "Hello there.", "speed": 0.02})
@example(body={"text": "Hello there.", "speed": True})
@example(body={"text": "Hello there.", "stream": "yes"})
def test_synthesize_route_never_answers_5xx(http, body):
    c, statuses = http
    check_response(c.post("/v1/synthesize", json=body), statuses)


@SETTINGS
@given(body=SPEECH_BODY)
@example(body={"model": "tts-1", "input": "Hello there.", "voice": "alloy", "speed": 1e-9})
@example(body={"model": "tts-1", "input": "Hello there.", "voice": "alloy", "speed": 4.5})
def test_speech_route_never_answers_5xx(http, body):
    c, statuses = http
    check_response(c.post("/v1/audio/speech", json=body), statuses)


def test_both_routes_apply_the_same_speed_rule(http):
    c, _ = http
    for speed, ok in ((0.25, True), (4.0, True), (0.2, False), (4.01, False)):
        a = c.post("/v1/synthesize", json={"text": "Hi.", "speed": speed, "response_format": "pcm"})
        b = c.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "alloy", "speed": speed,
                                              "response_format": "pcm"})
        assert (a.status_code, b.status_code) == ((200, 200) if ok else (400, 400)), (speed, a.text, b.text)
        if not ok:
            assert a.json()["error"]["param"] == b.json()["error"]["param"] == "speed"


def test_audio_over_the_request_limit_is_a_413_naming_it(http):
    c, _ = http
    r = c.post("/v1/synthesize", json={"text": "One. Two. Three.", "sentence_silence": 4.0})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["param"] == "max_audio_seconds" and "6 s" in r.json()["error"]["message"]


# ----------------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("args, word", [
    (["--noise-w", "10"], "noise_w"), (["--speed", "1e-9"], "speed"), (["--speed", "0.02"], "speed"),
    (["--device", "tpu"], "device"), (["--sentence-silence", "11"], "sentence_silence"),
])
def test_cli_bad_options_are_one_line_errors(tiny_voice_path, tmp_path, capsys, args, word):
    from voxserve.cli import main

    rc = main(["say", "Hello.", "--voice", str(tiny_voice_path), "-o", str(tmp_path / "x.wav"), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and word in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_cli_missing_voice_file_exits_2(tmp_path, capsys):
    from voxserve.cli import main

    rc = main(["say", "Hello.", "--voice", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "x.wav")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "missing.onnx" in err and len(err.splitlines()) == 1, err


def test_silence_over_the_request_limit_is_refused_before_any_synthesis(tiny_voice_path):
    voice = voxserve.load_voice(str(tiny_voice_path), device="cpu", limits=Limits(max_audio_seconds=60.0))
    voice.runner.run_pieces = None  # any synthesis would fail with a TypeError
    with pytest.raises(AudioTooLongError, match="max_audio_seconds"):
        voice.units("Go. " * 8, SynthesisOptions(sentence_silence=10.0))
    assert len(list(voice.units("Go. ... ... ...", SynthesisOptions(sentence_silence=10.0)))) == 1
