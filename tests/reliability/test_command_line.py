"""The library and the command line as a user expects them (issue 49): `Voice.stream` holds the
sentence silence that `synthesize` puts in; `voxserve say` writes opus for any voice and aac;
every kind of bad input exits 2 with one line; the default output is never overwritten."""

from __future__ import annotations

import numpy as np
import pytest

import voxserve
from voxserve.families.piper import PiperOptions


@pytest.fixture(scope="module")
def tiny(tiny_voice_path):
    return voxserve.load_voice(str(tiny_voice_path), device="cpu")


@pytest.mark.parametrize("silence", [0.0, 0.35])
def test_stream_holds_the_sentence_silence_of_synthesize(tiny, silence):
    text = "Hello there. How are you today? Fine, thanks. And you?"
    opts = PiperOptions(seed=1, noise_scale=0, noise_w=0, sentence_silence=silence)
    whole = tiny.synthesize(text, opts)
    chunks = list(tiny.stream(text, opts))
    assert len(chunks) == 4
    assert sum(len(c.samples) for c in chunks) == len(whole.samples)  # the same duration
    joined = np.concatenate([c.samples for c in chunks])
    np.testing.assert_allclose(joined, whole.samples, atol=1e-4)
    gap = int(round(silence * tiny.sample_rate))
    for c in chunks[:-1]:  # each sentence's silence at the end of its chunk; none after the last
        assert not np.any(c.samples[len(c.samples) - gap:])


@pytest.fixture(scope="module")
def tiny_22k(tiny_voice_path, tmp_path_factory):
    """The tiny voice said to be at 22050 Hz (Piper's medium voices' rate, which Opus has not)."""
    import json
    import shutil

    d = tmp_path_factory.mktemp("v22k")
    shutil.copy(tiny_voice_path, d / "tiny-22k.onnx")
    config = json.loads(tiny_voice_path.with_suffix(".onnx.json").read_text())
    config["audio"]["sample_rate"] = 22050
    (d / "tiny-22k.onnx.json").write_text(json.dumps(config))
    return d / "tiny-22k.onnx"


@pytest.fixture
def say(tiny_22k, capsysbinary):
    """`voxserve say ARGS` in-process with the tiny voice at 22050 Hz: (exit status, stdout, stderr)."""
    from voxserve.cli import main

    def run(*args, text="Hello there. A second one.") -> tuple[int, bytes, str]:
        code = main(["say", *([text] if text is not None else []), "--voice", str(tiny_22k),
                     "--device", "cpu", "--noise-scale", "0", "--noise-w", "0", *args])
        out, err = capsysbinary.readouterr()
        return code, out, err.decode()

    return run


def _wav_seconds(say, tmp_path) -> float:
    import soundfile as sf

    code, _, err = say("-o", str(tmp_path / "ref.wav"))
    assert code == 0, err
    return sf.info(str(tmp_path / "ref.wav")).duration


def test_say_writes_opus_for_a_voice_at_a_rate_opus_has_not(say, tmp_path):
    import io

    import soundfile as sf

    seconds = _wav_seconds(say, tmp_path)
    code, _, err = say("-o", str(tmp_path / "a.opus"))  # the tiny voice speaks at 22050 Hz
    assert code == 0, err
    assert "resampled to 48000 Hz" in err
    y, rate = sf.read(tmp_path / "a.opus")
    assert rate == 48000 and abs(len(y) / rate - seconds) < 0.05
    assert np.abs(y).max() > 0.01  # sound, not silence
    code, out, err = say("--format", "opus", "-o", "-")  # a stream, to stdout
    assert code == 0, err
    y, rate = sf.read(io.BytesIO(out))
    assert rate == 48000 and abs(len(y) / rate - seconds) < 0.05


@pytest.mark.parametrize("how", ["extension", "flag"])
def test_say_writes_aac(say, tmp_path, how):
    import av

    seconds = _wav_seconds(say, tmp_path)
    path = tmp_path / ("a.aac" if how == "extension" else "a.adts")
    code, _, err = say("-o", str(path), *(["--format", "aac"] if how == "flag" else []))
    assert code == 0, err
    with av.open(str(path)) as c:
        s = c.streams.audio[0]
        assert s.codec_context.name == "aac"
        n = sum(f.samples for f in c.decode(s))
    assert abs(n / s.rate - seconds) < 0.1  # (AAC adds its priming frame)


def test_every_kind_of_bad_say_input_exits_2_with_one_line(say, tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "c.srt").mkdir()
    cases = [
        (("-o", str(tmp_path / "sub")), "is a directory"),
        (("-o", str(tmp_path / "no" / "a.wav")), "does not exist"),
        (("-o", str(tmp_path / "a.xyz")), "cannot tell the audio format"),
        (("-o", str(tmp_path / "a.wav"), "--captions", str(tmp_path / "c.srt")), "is a directory"),
        (("-f", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "a.wav")), "cannot read"),
    ]
    for args, message in cases:
        code, _, err = say(*args, text=None if "-f" in args else "Hello.")
        assert code == 2, (args, err)
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.srt", "sub"]  # nothing written


def test_say_without_o_never_replaces_an_existing_out_wav(say, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = say()
    assert code == 0 and "wrote out.wav" in err
    first = (tmp_path / "out.wav").read_bytes()
    (tmp_path / "out.wav").write_bytes(b"the user's own recording")
    code, _, err = say(text="Something else.")
    assert code == 2 and "out.wav exists" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "out.wav").read_bytes() == b"the user's own recording"
    code, _, err = say("-o", "out.wav")  # named: replaced, as the user asked
    assert code == 0, err
    assert (tmp_path / "out.wav").read_bytes() == first


@pytest.mark.parametrize("spec", ["alloy={path}", "Shimmer={path}"])
def test_serve_refuses_a_voice_named_like_an_openai_alias(tiny_voice_path, spec):
    from voxserve.serve.build import load_voices
    from voxserve.serve.settings import ServeSettings

    with pytest.raises(ValueError, match="OpenAI's voice names"):
        load_voices(ServeSettings.of(voices=(spec.format(path=tiny_voice_path),), device="cpu"))
