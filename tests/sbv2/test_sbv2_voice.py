"""SBV2 voices end to end (issue 20): `load_voice("sbv2:DIR", bert_dir=...)` on the reference's tiny
model folders and BERTs, rebuilt from seeds in the real formats. Text goes through our front end,
the shared BERT and the synthesizer, and must give the reference's waves; voices share one BERT;
the engine batches BERT inputs across voices; the HTTP API lists styles and takes the options."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("transformers")

import sbv2_fixtures as fx  # noqa: E402
from serve_fakes import RecordingSink  # noqa: E402

import voxserve  # noqa: E402
from voxserve import (  # noqa: E402
    AudioTooLongError,
    InvalidOptionError,
    Limits,
    SynthesisOptions,
    UnknownSpeakerError,
    VoiceLoadError,
)
from voxserve.families.sbv2 import Sbv2Options

BOUND = 1e-4  # the bound; measured <= 1.4e-6 on CPU
DET = Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)


@pytest.fixture(scope="module")
def voices(sbv2_folders, sbv2_bert_root):
    return {v: voxserve.load_voice(f"sbv2:{p}", device="cpu", bert_dir=sbv2_bert_root)
            for v, p in sbv2_folders.items()}


def case_options(c: dict) -> SynthesisOptions:
    return Sbv2Options(speaker=c["speaker"], style=c["style"], style_weight=c["style_weight"],
                            speed=1 / c["length_scale"], noise_scale=c["noise_scale"], noise_w=c["noise_scale_w"],
                            sdp_ratio=c["sdp_ratio"], language=c["language"])


def all_cases(sbv2_cases, variant):
    cs = sbv2_cases[variant]
    return cs + fx.sdp_cases(cs)


@pytest.mark.parametrize("variant", fx.VARIANTS)
def test_text_to_audio_equals_the_reference(voices, sbv2_cases, variant):
    """Every recorded case (sdp_ratio 0, 0.5 and 1), from its text, alone and all in one batch."""
    voice = voices[variant]
    cases = all_cases(sbv2_cases, variant)
    diffs = []
    for c in cases:
        got = voice.synthesize(c.meta["text"], case_options(c.meta)).samples
        assert got.shape == c.wave.shape, c.meta["text"]  # same length: same durations
        diffs.append(float(np.abs(got - c.wave).max()))
    batch = voice.synthesize_batch([c.meta["text"] for c in cases], [case_options(c.meta) for c in cases])
    for c, a in zip(cases, batch):
        assert a.samples.shape == c.wave.shape
        diffs.append(float(np.abs(a.samples - c.wave).max()))
    print(f"{variant}: {len(cases)} cases, text -> audio vs reference, solo and batched: max |diff| {max(diffs):.2e}")
    assert max(diffs) <= BOUND


def test_voices_share_one_bert_and_list_what_they_offer(voices):
    jp = {id(v.berts["JP"]) for v in voices.values()}
    assert len(jp) == 1  # two voices, one JP BERT in the process
    extra, multi = voices["jp_extra"], voices["multilingual"]
    assert extra.languages == ["JP"] and multi.languages == ["JP", "EN"]
    assert extra.speakers == ["spk_a", "spk_b", "spk_c"]
    assert extra.styles == ["Neutral", "Happy", "Sad", "Angry"]
    assert extra.sample_rate == 44100 and extra.family == "sbv2"


def test_options_resolve_and_refuse_clearly(voices):
    v = voices["jp_extra"]
    text = "今日はいい天気ですね。"
    by_name = v.synthesize(text, Sbv2Options(style="Happy", speaker="spk_b", noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0))
    by_id = v.synthesize(text, Sbv2Options(style=1, speaker=1, noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0))
    np.testing.assert_array_equal(by_name.samples, by_id.samples)
    # style_weight 0 is the mean style, whatever the style
    w0 = [v.synthesize(text, Sbv2Options(style=s, style_weight=0.0, noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)).samples
          for s in ("Happy", "Sad")]
    np.testing.assert_array_equal(w0[0], w0[1])
    assert not np.array_equal(by_name.samples, v.synthesize(text, DET).samples)
    with pytest.raises(InvalidOptionError, match="style.*Neutral, Happy"):
        v.synthesize(text, Sbv2Options(style="Joyful"))
    with pytest.raises(InvalidOptionError, match="style id 9"):
        v.synthesize(text, Sbv2Options(style=9))
    with pytest.raises(InvalidOptionError, match="JP-Extra model speaks Japanese only"):
        v.synthesize("Hello.", Sbv2Options(language="EN"))
    with pytest.raises(InvalidOptionError, match="language"):
        v.synthesize(text, Sbv2Options(language="FR"))
    with pytest.raises(UnknownSpeakerError):
        v.synthesize(text, SynthesisOptions(speaker="nobody"))
    # deterministic with the noise off; seeded noise repeats
    np.testing.assert_array_equal(v.synthesize(text, DET).samples, v.synthesize(text, DET).samples)
    seeded = SynthesisOptions(seed=7)
    np.testing.assert_array_equal(v.synthesize(text, seeded).samples, v.synthesize(text, seeded).samples)


def test_sentences_split_stream_and_stay_their_solo_selves(voices):
    v = voices["multilingual"]
    texts = ["こんにちは。", "ありがとうございます！", "今日はいい天気ですね。"]
    solo = [v.synthesize(t, DET).samples for t in texts]
    chunks = list(v.stream("".join(texts), DET))
    assert [c.index for c in chunks] == [0, 1, 2] and chunks[-1].is_last
    for c, s in zip(chunks, solo):
        np.testing.assert_allclose(c.samples, s, atol=1e-5)
    en = Sbv2Options(language="en", noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)
    joined = v.synthesize("Hello world. How are you today?", en).samples
    parts = [v.synthesize(t, en).samples for t in ("Hello world.", "How are you today?")]
    np.testing.assert_allclose(joined, np.concatenate(parts), atol=1e-5)


def test_a_sentence_over_its_limit_fails_alone(sbv2_folders, sbv2_bert_root):
    v = voxserve.load_voice(f"sbv2:{sbv2_folders['jp_extra']}", device="cpu", bert_dir=sbv2_bert_root,
                            limits=Limits(max_sentence_audio_seconds=0.35))
    short, long_ = "えっ。", "東京タワーの高さは333メートルです。"  # ~0.1 s and ~0.6 s of tiny-model audio
    units = v.resolve_components(list(v.units(short + long_, DET)))
    out = v.run_pieces(units)
    assert isinstance(out[1].error, AudioTooLongError) and "max_sentence_audio_seconds" in str(out[1].error)
    np.testing.assert_allclose(out[0][0], v.synthesize(short, DET).samples, atol=1e-5)
    with pytest.raises(AudioTooLongError):
        v.synthesize(long_, DET)


def test_engine_batches_bert_across_voices(voices, monkeypatch):
    from voxserve.engine import Engine, EngineConfig, SchedulerConfig

    bert = voices["jp_extra"].berts["JP"]
    calls = []
    real = bert.run
    monkeypatch.setattr(bert, "run", lambda inputs: calls.append(len(inputs)) or real(inputs))
    texts = {"jp_extra": "今日はいい天気ですね。えっ、本当ですか？", "multilingual": "こんにちは。ありがとうございます。"}
    want = {n: [voices[n].synthesize(s, DET).samples for s in (t[: t.index("。") + 1], t[t.index("。") + 1:])]
            for n, t in texts.items()}
    calls.clear()
    eng = Engine(dict(voices), EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0),
                                            max_queue_wait_s=3600)).start(threads=False)
    sinks = {n: RecordingSink() for n in texts}
    for n, t in texts.items():
        eng.submit(n, t, DET, sinks[n])
    deadline = time.time() + 30
    while sum(len(w.stage_queue) for w in eng._workers.values()) < 4:  # the front ends have run
        assert time.time() < deadline
        time.sleep(0.005)
    for _ in range(1000):
        if eng.step() is None:
            break
    assert calls == [4]  # one BERT forward for both requests of both voices
    for n, s in sinks.items():
        assert s.done.is_set() and s.error is None
        for k, w in enumerate(want[n]):
            np.testing.assert_allclose(s.audio[k], w, atol=1e-5)


def test_served_next_to_other_voices(voices):
    from fastapi.testclient import TestClient
    from serve_fakes import FakeVoice

    from voxserve.engine import Engine, EngineConfig, SchedulerConfig
    from voxserve.serve.app import AppConfig, create_app

    eng = Engine({"fake": FakeVoice(), "sbv2": voices["jp_extra"]},
                 EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    with TestClient(create_app(eng, AppConfig(warmup=False))) as c:
        listed = {v["name"]: v for v in c.get("/v1/voices").json()["voices"]}
        assert listed["sbv2"]["styles"] == ["Neutral", "Happy", "Sad", "Angry"]
        assert listed["sbv2"]["speakers"] == ["spk_a", "spk_b", "spk_c"] and listed["sbv2"]["languages"] == ["ja"]
        body = {"voice": "sbv2", "text": "今日はいい天気ですね。", "response_format": "pcm", "style": "Sad",
                "style_weight": 2.0, "noise_scale": 0.0, "noise_w": 0.0, "sdp_ratio": 0.0}
        r = c.post("/v1/synthesize", json=body)
        assert r.status_code == 200, r.text
        got = np.frombuffer(r.content, dtype="<i2").astype(np.float32) / 32767
        want = voices["jp_extra"].synthesize(body["text"], Sbv2Options(
            style="Sad", style_weight=2.0, noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)).samples
        assert abs(len(got) - len(want)) == 0
        r = c.post("/v1/synthesize", json={**body, "style": "Joyful"})
        assert r.status_code == 400 and "style" in r.text
        r = c.post("/v1/synthesize", json={**body, "language": "EN"})
        assert r.status_code == 400 and "language" in r.text
        r = c.post("/v1/synthesize", json={**body, "sdp_ratio": 1.5})
        assert r.status_code == 400 and "sdp_ratio" in r.text
    eng.shutdown(1.0)


def test_load_errors_say_what_is_missing(sbv2_folders, tmp_path, monkeypatch):
    from voxserve.families import source_hint

    monkeypatch.delenv("VOXSERVE_SBV2_BERT_DIR", raising=False)
    with pytest.raises(VoiceLoadError, match="VOXSERVE_SBV2_BERT_DIR"):
        voxserve.load_voice(f"sbv2:{sbv2_folders['jp_extra']}", device="cpu")
    with pytest.raises(VoiceLoadError, match="deberta-v2-large-japanese-char-wwm"):
        voxserve.load_voice(f"sbv2:{sbv2_folders['jp_extra']}", device="cpu", bert_dir=tmp_path)
    with pytest.raises(VoiceLoadError, match="not an SBV2 model folder"):
        voxserve.load_voice(f"sbv2:{tmp_path}", device="cpu", bert_dir=tmp_path)
    with pytest.raises(TypeError, match="bert_dri"):
        voxserve.load_voice(f"sbv2:{sbv2_folders['jp_extra']}", bert_dri=tmp_path)
    assert "sbv2:" in source_hint(sbv2_folders["jp_extra"])


def test_bert_dir_from_the_environment(sbv2_folders, sbv2_bert_root, monkeypatch):
    monkeypatch.setenv("VOXSERVE_SBV2_BERT_DIR", str(sbv2_bert_root))
    v = voxserve.load_voice(f"sbv2:{sbv2_folders['multilingual']}", device="cpu")
    assert v.languages == ["JP", "EN"]


def test_say_takes_the_bert_dir_and_the_style_flags(sbv2_folders, sbv2_bert_root, tmp_path, capsys):
    import soundfile as sf

    from voxserve.cli import main

    out = tmp_path / "a.wav"
    text = "今日はいい天気ですね。"
    rc = main(["say", text, "--voice", f"sbv2:{sbv2_folders['jp_extra']}", "--bert-dir", str(sbv2_bert_root),
               "--style", "Sad", "--noise-scale", "0", "--noise-w", "0", "--sdp-ratio", "0", "-o", str(out)])
    assert rc == 0
    got, sr = sf.read(out, dtype="float32")
    want = voxserve.load_voice(f"sbv2:{sbv2_folders['jp_extra']}", device="cpu", bert_dir=sbv2_bert_root).synthesize(
        text, Sbv2Options(style="Sad", noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0))
    assert sr == 44100 and len(got) == len(want.samples)
    assert main(["say", "x", "--voice", str(sbv2_folders["jp_extra"]), "-o", str(out)]) == 2
    assert "use --voice sbv2:" in capsys.readouterr().err


def test_the_padded_synthesizer_batch_equals_each_sentence_alone(voices, sbv2_cases):
    """What a GPU runs (on a CPU sentences go one by one): one padded batch of every case, with
    their features padded on the device, row by row equal to the reference."""
    v = voices["multilingual"]
    cases = all_cases(sbv2_cases, "multilingual")
    units = [u for c in cases for u in v.resolve_components(list(v.units(c.meta["text"], case_options(c.meta))))]
    assert len(units) == len(cases)
    batched = v._synthesize_batch([u.payload for u in units])
    for c, a in zip(cases, batched):
        assert a.shape == c.wave.shape
        assert float(np.abs(a - c.wave).max()) <= BOUND
