"""Word timestamps through the real default voice: library (synthesize, synthesize_batch,
stream), the engine, POST /v1/audio/captioned_speech and `voxserve say --captions`."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re

import numpy as np
import pytest
from serve_fakes import FakeVoice
from vits_fixtures import load_piper

import voxserve
from voxserve.families.piper.options import Transforms
from voxserve.audio import Word, float_to_int16
from voxserve.captions import cues, format_captions
from voxserve.engine import AsyncEngine, Engine, EngineConfig, SchedulerConfig
from voxserve.families.piper import PiperOptions
from voxserve.families.piper.words import text_words, word_spans

DET = PiperOptions.deterministic()  # the joe voice's: noise off
TEXT = "Hello, world! How are you today? I'm fine; thanks (mostly) for asking."
WORDS = ["Hello", "world", "How", "are", "you", "today", "I'm", "fine", "thanks", "mostly", "for", "asking"]
EPS = 1e-6


def opts(**kw) -> PiperOptions:
    return dataclasses.replace(DET, **kw)


def times(words) -> list[float]:
    """Start and end of every word, flat (pytest.approx compares flat lists)."""
    return [t for w in words for t in ((w.start, w.end) if isinstance(w, Word) else (w["start"], w["end"]))]


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def check_words(audio, expected: list[str]) -> None:
    """Every word once, in order; start < end, monotonic, inside the audio, over speech."""
    ws = audio.words
    assert [w.word for w in ws] == expected
    prev = 0.0
    for w in ws:
        assert isinstance(w, Word)
        assert prev - EPS <= w.start < w.end <= audio.duration + EPS, (w, prev, audio.duration)
        prev = w.end
    speech = rms(audio.samples)
    sr = audio.sample_rate
    for w in ws:
        span = audio.samples[int(w.start * sr):int(w.end * sr)]
        assert rms(span) > 0.1 * speech, (w, rms(span), speech)


def test_words_of_a_sentence_are_every_word_in_order_over_speech(joe_voice):
    a = joe_voice.synthesize("The quick brown fox jumps over the lazy dog.", DET)
    check_words(a, ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"])
    assert a.words[0].start > 0  # BOS and its pad come first
    assert a.words[-1].end < a.duration  # the final period and EOS after the last word


def test_multi_sentence_silence_is_counted_in_whole_audio_times(joe_voice):
    silence = 0.4
    a = joe_voice.synthesize(TEXT, opts(sentence_silence=silence))
    check_words(a, WORDS)
    chunks = list(joe_voice.stream(TEXT, opts(sentence_silence=silence)))
    # "!", "?" and ";" end sentences; a lone stream's first may come as a head (partial, with
    # the sentence's words) and its rest
    assert [c.index for c in chunks if not c.partial] == [0, 1, 2, 3]
    sentences: dict[int, tuple[list, list]] = {}
    for c in chunks:
        samples, words = sentences.setdefault(c.index, ([], []))
        samples.append(c.samples)
        words.extend(c.words)
    start = 0
    for samples, words in sentences.values():  # each sentence's words lie inside its samples (its silence at its end)
        n = sum(len(s) for s in samples)
        lo, hi = start / a.sample_rate, (start + n) / a.sample_rate
        mine = [w for w in a.words if lo - EPS <= w.start and w.end <= hi + EPS]
        assert [w.word for w in mine] == [w.word for w in words]
        # the words are relative to the sentence's first chunk
        assert times(mine) == pytest.approx([t + lo for t in times(words)])
        start += n
    assert start == len(a.samples)
    # silence between sentences holds no word
    for w0, w1 in zip(a.words, a.words[1:]):
        assert w1.start >= w0.end - EPS


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_words_follow_the_length_scale(joe_voice, speed):
    base = joe_voice.synthesize(TEXT, DET)
    a = joe_voice.synthesize(TEXT, opts(speed=speed))
    check_words(a, WORDS)
    # the durations scale with 1/speed; each id is rounded up to whole frames, which adds up to
    # a frame per id, so a faster voice shrinks by a little less
    ratio = (a.words[-1].end - a.words[0].start) / (base.words[-1].end - base.words[0].start)
    assert 0.8 / speed <= ratio <= 1.3 / speed


def test_batch_words_equal_solo_words(joe_voice):
    texts = [TEXT, "A second, shorter text.", "Three: one two three four five six seven."]
    solo = [joe_voice.synthesize(t, DET).words for t in texts]
    together = joe_voice.synthesize_batch(texts, DET)
    assert [a.words for a in together] == solo


def test_stream_chunks_are_consistent_with_the_whole(joe_voice, corpus):
    text = next(d["text"] for d in corpus if d["category"] == "long")
    whole = joe_voice.synthesize(text, opts(sentence_silence=0.2))
    chunks = list(joe_voice.stream(text, opts(sentence_silence=0.2)))
    assert chunks[0].partial  # the long first sentence comes as a head and its rest
    assert chunks[0].words and not chunks[1].words  # a sentence's words ride on its first chunk
    from voxserve.voice import joined_words

    # each sentence's chunks hold its silence at their end: joined with none, as they come
    got = joined_words([(len(c.samples), c.words, c.partial) for c in chunks], whole.sample_rate, 0.0)
    assert [w.word for w in got] == [w.word for w in whole.words]
    assert times(got) == pytest.approx(times(whole.words), abs=1e-9)


def test_normalised_text_reports_the_users_own_tokens(joe_voice):
    # "$5" is spoken as "five dollars": the word reported is "$5", over both spoken words
    a = joe_voice.synthesize("It costs $5 at 10:30. Dr. Smith has 1,234 cats!", DET)
    check_words(a, ["It", "costs", "$5", "at", "10:30", "Dr", "Smith", "has", "1,234", "cats"])
    spoken = joe_voice.synthesize("It costs five dollars at ten thirty.", DET)
    w = {x.word: x for x in a.words}
    assert w["$5"].end - w["$5"].start == pytest.approx(spoken.words[3].end - spoken.words[2].start, abs=0.03)
    raw = joe_voice.synthesize("Room 42 now.", opts(normalize=False))
    assert [w.word for w in raw.words] == ["Room", "42", "now"]


def test_source_words_pair_rewrites_with_their_spoken_words():
    from voxserve.families.piper.words import SourceWords, WordSpan
    from voxserve.text.aligned import Aligned
    from voxserve.text.spoken import normalize_text, normalize_text_aligned

    text = 'See you at 5pm, OK? He said "yes" -- twice... in the U.S.A. in 1999.'
    sw = SourceWords(text, normalize_text_aligned(Aligned.of(text), "en-us"))
    pairs = [(said, g and g[0]) for said, g in zip(sw.said, sw.cluster)]
    assert ("five", "5pm") in pairs and ("twice", "twice") in pairs and ("U.S.A", "U.S.A.") in pairs
    assert [g for s, g in pairs if s in ("nineteen", "ninety-nine")] == ["1999", "1999"]
    # respan joins a source word's spoken words into one span, in order
    first = text_words(normalize_text("See you at 5pm, OK?", "en-us"))
    spans = [WordSpan(w, 2 * k, 2 * k + 2) for k, w in enumerate(first)]
    got = sw.respan(" ".join(first), spans)
    assert [s.word for s in got] == ["See", "you", "at", "5pm", "OK"]
    assert [(s.lo, s.hi) for s in got][3] == (6, 10)


def test_espeak_joins_and_splits_align_to_text_words(joe_voice):
    # espeak says "of the" as one word and "5pm" as two: the alignment still gives each text word
    a = joe_voice.synthesize("Government of the people, by the people.", DET)
    check_words(a, ["Government", "of", "the", "people", "by", "the", "people"])
    ids = joe_voice.frontend.to_ids.id_map
    spans = word_spans("See you at 5pm", joe_voice.frontend.phonemize("See you at 5pm"), ids)
    assert [s.word for s in spans] == ["See", "you", "at", "5pm"]
    assert all(s.lo < s.hi for s in spans) and all(a.hi <= b.lo for a, b in zip(spans, spans[1:]))
    assert text_words('He said "yes" -- twice...') == ["He", "said", "yes", "twice"]


class _BeepVoice(voxserve.Voice):
    """A voice whose model predicts no durations: a beep per sentence."""

    name, family, sample_rate, device = "beep", "beep", 16000, "cpu"  # (the engine runs it on the CPU worker)

    def units(self, text, options=None):
        from voxserve.text.split import split_sentences
        from voxserve.voice import Unit

        return iter([Unit(k, s, len(s), s) for k, s in enumerate(split_sentences(text))])

    def run_units(self, units, early=(), on_early=None):
        return [np.full(100 * len(u.payload), 0.1, np.float32) for u in units]


def test_voice_without_durations_has_no_words():
    v = _BeepVoice()
    assert not v.word_timestamps
    a = v.synthesize("One sentence. And another.", voxserve.SynthesisOptions(sentence_silence=0.1))
    assert a.duration > 0 and a.words == ()
    assert all(c.words == () for c in v.stream("One sentence. And another."))


def test_padded_layout_gives_the_same_words(joe_voice):
    padded = load_piper(transforms=Transforms(decode_layout="padded"))
    texts = [TEXT, "A second text."]
    got = padded.synthesize_batch(texts, DET)
    ref = joe_voice.synthesize_batch(texts, DET)
    assert [a.words for a in got] == [a.words for a in ref]


@pytest.mark.cuda
def test_cuda_graph_words_equal_cpu_words(joe_voice):
    """Durations read back from the graphed encoder (its outputs are copied out of the graph's
    buffers): the same words at the same times, as fp32 on CUDA is fp32 without TF32 and keeps
    every duration (gpu_tolerances.py, docs/precision.md)."""
    gpu = voxserve.load_voice(device="cuda")
    gpu.warmup()
    texts = [TEXT, "A second text.", "Three: one two three four five six seven."]
    for a, b in zip(gpu.synthesize_batch(texts, DET), joe_voice.synthesize_batch(texts, DET)):
        assert [w.word for w in a.words] == [w.word for w in b.words]
        assert times(a.words) == pytest.approx(times(b.words), abs=1e-6)


# ----------------------------------------------------------------------------- engine
def test_engine_concurrent_requests_words_equal_solo(joe_voice):
    texts = [TEXT, "Short one.", "Another text, with a comma. And a second sentence."]
    solo = [joe_voice.synthesize(t, DET) for t in texts]

    async def run(ae):
        async def one(t):
            return await ae.submit(joe_voice.name, t, DET, streaming=False).collect()
        return await asyncio.wait_for(asyncio.gather(*[one(t) for t in texts]), 120)

    cfg = EngineConfig(scheduler=SchedulerConfig(max_wait_ms=5, max_batch_size=8))
    with Engine([joe_voice], cfg) as eng:
        outs = asyncio.run(run(AsyncEngine(eng)))
    from voxserve.voice import joined_words

    for chunks, ref in zip(outs, solo):
        got = joined_words([(len(c.samples), c.words, c.partial) for c in chunks], ref.sample_rate, 0.0)
        assert [w.word for w in got] == [w.word for w in ref.words]
        assert times(got) == pytest.approx(times(ref.words), abs=1e-9)


# ----------------------------------------------------------------------------- HTTP
@pytest.fixture(scope="module")
def det_voice(joe_voice):
    """The default voice (its model shared) with noise off by default: the speech body has no
    noise options, and the two response forms must give the same samples."""
    from voxserve.families.piper.voice import VitsVoice

    config = dataclasses.replace(joe_voice.config, noise_scale=0.0, noise_w=0.0)
    return VitsVoice(config, joe_voice.runner, joe_voice.frontend)


@pytest.fixture(scope="module")
def http(det_voice):
    # imported here: this module's CUDA test runs where no serving package is (scripts/gpu-check)
    from fastapi.testclient import TestClient

    from voxserve.serve.app import AppConfig, create_app

    fake = FakeVoice(name="fake", sample_rate=det_voice.sample_rate)
    # one sentence a batch: both forms then run the same shapes, so the samples can be compared exactly
    eng = Engine([det_voice, fake], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0, max_batch_size=1)))
    app = create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=5, request_timeout_s=120))
    with TestClient(app) as c:
        yield c


def captioned(c, **kw):
    body = {"model": "tts-1", "input": TEXT, "voice": "en_US-joe-medium", "response_format": "pcm"} | kw
    return c.post("/v1/audio/captioned_speech", json=body)


def test_captioned_speech_whole_and_streamed_agree(http, det_voice):
    ref = det_voice.synthesize(TEXT)
    r = captioned(http)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"audio", "format", "sample_rate", "words"}
    assert body["format"] == "pcm" and body["sample_rate"] == 22050
    whole = np.frombuffer(base64.b64decode(body["audio"]), dtype="<i2")
    # the library batches differently: the same samples within float rounding
    assert len(whole) == len(ref.samples)
    assert np.abs(whole.astype(np.int32) - float_to_int16(ref.samples)).max() <= 2
    assert [w["word"] for w in body["words"]] == WORDS
    assert times(body["words"]) == pytest.approx(times(ref.words), abs=1e-3)
    assert all(w["start"] < w["end"] <= len(whole) / 22050 + 1e-3 for w in body["words"])

    r = captioned(http, stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    assert [ln["index"] for ln in lines] == [0, 1, 2, 3]
    parts = [np.frombuffer(base64.b64decode(ln["audio"]), dtype="<i2") for ln in lines]
    streamed = np.concatenate(parts)  # a lone stream's first sentence is cut for first audio:
    assert len(streamed) == len(whole) and np.abs(streamed.astype(np.int32) - whole).max() <= 1  # joined within rounding
    pos = 0
    for ln, p in zip(lines, parts):
        assert ln["offset"] == pytest.approx(pos / 22050, abs=1e-6)
        assert all(ln["offset"] - 1e-3 <= w["start"] < w["end"] <= ln["offset"] + len(p) / 22050 + 1e-3
                   for w in ln["words"])
        pos += len(p)
    flat = [w for ln in lines for w in ln["words"]]
    assert flat == body["words"]


def test_captioned_speech_wav_lines_and_every_whole_format(http):
    r = captioned(http, stream=True, response_format="wav", input="One two. Three four.")
    assert r.status_code == 200, r.text
    lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    assert len(lines) == 2 and all(base64.b64decode(ln["audio"])[:4] == b"RIFF" for ln in lines)
    for fmt in ("mp3", "opus", "flac", "wav"):
        r = captioned(http, response_format=fmt, input="One two.")
        assert r.status_code == 200, (fmt, r.text)
        assert r.json()["format"] == fmt and len(base64.b64decode(r.json()["audio"])) > 100
        assert [w["word"] for w in r.json()["words"]] == ["One", "two"]


def test_captioned_speech_refusals(http):
    r = captioned(http, voice="fake")
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice", r.text
    assert "word timestamps" in r.json()["error"]["message"]
    r = captioned(http, stream=True, response_format="mp3")
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_format", r.text
    r = captioned(http, speed=9.0)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_option", r.text
    r = captioned(http, stream="yes")
    assert r.status_code == 422


# ----------------------------------------------------------------------------- captions
_SRT_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)$")


def parse_cues(text: str, fmt: str) -> list[tuple[float, float, str]]:
    if fmt == "vtt":
        assert text.startswith("WEBVTT\n\n")
        text = text[len("WEBVTT\n\n"):]
    out = []
    for k, block in enumerate(text.strip("\n").split("\n\n"), start=1):
        rows = block.split("\n")
        if fmt == "srt":
            assert rows[0] == str(k)
            rows = rows[1:]
        m = _SRT_TIME.match(rows[0])
        assert m, rows[0]
        g = [int(x) for x in m.groups()]
        t0 = g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 1000
        t1 = g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 1000
        assert len(rows) == 2 and rows[1]
        out.append((t0, t1, rows[1]))
    return out


def test_cues_are_short_balanced_lines_within_sentences():
    ws = [Word(f"w{k:02d}", k * 0.3, k * 0.3 + 0.25) for k in range(30)]
    cs = cues(ws, sentence_ends=[1.17])  # between w03 (ends 1.15) and w04 (starts 1.2)
    assert all(len(c.text) <= 42 for c in cs)
    assert " ".join(c.text for c in cs) == " ".join(w.word for w in ws)
    assert cs[0].text == "w00 w01 w02 w03"  # a sentence end ends a cue
    # the other 26 words (103 characters) as three lines of 8-9 words, not 10 + 10 + 6
    assert [len(c.text.split()) for c in cs[1:]] == [9, 9, 8]
    for fmt in ("srt", "vtt"):
        parsed = parse_cues(format_captions(cs, fmt), fmt)
        assert [p[2] for p in parsed] == [c.text for c in cs]
        assert [p[:2] for p in parsed] == [(round(c.start, 3), round(c.end, 3)) for c in cs]


def test_cues_show_the_texts_punctuation():
    text = 'Well, "yes" -- it costs $5 (mostly)! Then: go.'
    ws = [Word(w, k * 0.3, k * 0.3 + 0.25) for k, w in enumerate(["Well", "yes", "it", "costs", "$5", "mostly",
                                                                   "Then", "go"])]
    cs = cues(ws, sentence_ends=[1.77], text=text)
    assert [c.text for c in cs] == ['Well, "yes" it costs $5 (mostly)!', "Then: go."]
    assert [c.text for c in cues(ws[:2], text="nothing alike")] == ["Well yes"]


@pytest.mark.parametrize("ext", ["srt", "vtt"])
def test_say_captions_writes_well_formed_increasing_cues(tmp_path, ext, capsys):
    from voxserve.cli import main

    out, cap = tmp_path / "out.wav", tmp_path / f"out.{ext}"
    text = TEXT + " " + "This last sentence is long enough to need more than one subtitle line on screen."
    rc = main(["say", text, "-o", str(out), "--captions", str(cap), "--noise-scale", "0", "--noise-w", "0",
               "--sentence-silence", "0.3", "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    import soundfile as sf

    duration = sf.info(str(out)).duration
    parsed = parse_cues(cap.read_text(encoding="utf-8"), ext)
    assert len(parsed) >= 4
    assert text_words(" ".join(p[2] for p in parsed)) == text_words(text)
    assert parsed[0][2] == "Hello, world!"  # the text's punctuation
    prev = 0.0
    for t0, t1, line in parsed:
        assert prev <= t0 < t1 <= duration + 1e-3 and len(line) <= 42
        prev = t1


def test_say_captions_refuses_a_bad_extension_before_any_work(tmp_path, capsys):
    from voxserve.cli import main

    rc = main(["say", "Hi.", "-o", str(tmp_path / "o.wav"), "--captions", str(tmp_path / "c.txt")])
    assert rc == 2 and "srt" in capsys.readouterr().err
    assert not (tmp_path / "o.wav").exists()


def test_ssml_break_moves_the_words_after_it(joe_voice):
    """A <break> is silence before the next sentence: its words move by the break, exactly as
    with the same silence given as sentence_silence (durations are the same forward's)."""
    ssml = joe_voice.synthesize('<speak>Hello there.<break time="1s"/>General Kenobi.</speak>', DET)
    plain = joe_voice.synthesize("Hello there. General Kenobi.", opts(sentence_silence=1.0))
    assert [w.word for w in ssml.words] == ["Hello", "there", "General", "Kenobi"]
    assert len(ssml.samples) == len(plain.samples)
    np.testing.assert_allclose(times(ssml.words), times(plain.words), atol=1e-6)
    assert ssml.words[2].start - ssml.words[1].end >= 1.0
    stream = list(joe_voice.stream('<speak>Hi.<break time="500ms"/>Bye.</speak>', DET))
    assert [w.word for c in stream for w in c.words] == ["Hi", "Bye"]
    second = next(c for c in stream if c.words and c.words[0].word == "Bye")
    assert second.words[0].start >= 0.5  # relative to its chunk, which starts with the break
