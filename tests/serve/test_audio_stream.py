"""Streaming resampler and streaming encoders (audio.py helpers used by the server)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from voxserve.audio import StreamingResampler, float_to_int16, open_stream_encoder, resample


def tone(freq: float, rate: int, seconds: float) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


@pytest.mark.parametrize("src,dst", [(22050, 48000), (22050, 24000), (22050, 16000), (16000, 48000)])
def test_resampler_length_and_accuracy(src, dst):
    x = tone(440, src, 1.0)
    y = resample(x, src, dst)
    assert len(y) == round(len(x) * dst / src)
    ref = 0.5 * np.sin(2 * np.pi * 440 * np.arange(len(y)) / dst)
    edge = dst // 20  # the first and last 50 ms see the signal's hard start and end
    assert np.abs(y[edge:-edge] - ref[edge:-edge]).max() < 1e-3


def test_resampler_chunked_equals_whole():
    x = np.random.default_rng(0).standard_normal(30000).astype(np.float32) * 0.1
    whole = resample(x, 22050, 48000)
    r = StreamingResampler(22050, 48000)
    parts, k, rng = [], 0, np.random.default_rng(1)
    while k < len(x):
        n = int(rng.integers(1, 4000))
        parts.append(r.process(x[k:k + n]))
        k += n
    parts.append(r.flush())
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-6)


def test_resampler_removes_what_the_lower_rate_cannot_hold():
    x = tone(10000, 22050, 1.0)  # above 16 kHz's Nyquist: must not alias to 6 kHz
    y = resample(x, 22050, 16000)
    assert np.sqrt(np.mean(y[800:-800] ** 2)) < 1e-3


def _streamed(fmt: str, rate: int, chunks) -> tuple[bytes, list[bytes], object]:
    enc = open_stream_encoder(fmt, rate)
    pieces = [enc.write(c) for c in chunks]
    pieces.append(enc.close())
    return b"".join(pieces), pieces, enc


def test_wav_and_pcm_stream_are_exact():
    chunks = [tone(300, 22050, 0.3), tone(500, 22050, 0.2)]
    data, pieces, enc = _streamed("pcm", 22050, chunks)
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), float_to_int16(np.concatenate(chunks)))
    data, pieces, enc = _streamed("wav", 22050, chunks)
    assert data[:4] == b"RIFF" and pieces[0][:4] == b"RIFF"
    np.testing.assert_array_equal(np.frombuffer(data[44:], "<i2"), float_to_int16(np.concatenate(chunks)))


def test_opus_at_22050_is_resampled_to_48k_and_streams():
    chunks = [tone(300, 22050, 1.0) for _ in range(3)]
    data, pieces, enc = _streamed("opus", 22050, chunks)
    assert enc.sample_rate == 48000
    assert sum(map(len, pieces[:-1])) > 0  # bytes came out before the end
    y, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 48000 and abs(len(y) - 3 * 48000) < 48000 * 0.05


def test_mp3_streams_and_decodes():
    chunks = [tone(300, 22050, 1.0) for _ in range(3)]
    data, pieces, enc = _streamed("mp3", 22050, chunks)
    assert len(pieces[0]) > 0  # the first sentence's bytes leave at once
    y, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 22050 and 0 <= len(y) - 3 * 22050 < 22050 * 0.2


def test_flac_streams_and_decodes_exactly():
    import av

    chunks = [tone(300, 22050, 1.0), tone(500, 22050, 0.7), tone(200, 22050, 0.05)]
    data, pieces, enc = _streamed("flac", 22050, chunks)
    assert data[:4] == b"fLaC" and sum(map(len, pieces[:-1])) > 0
    with av.open(io.BytesIO(data)) as c:  # strict libFLAC checks: tests/reliability/test_formats.py
        y = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)])
    np.testing.assert_array_equal(y, float_to_int16(np.concatenate(chunks)))


def test_aac_is_available():
    from voxserve.audio import available_stream_formats

    assert "aac" in available_stream_formats()
    data, pieces, enc = _streamed("aac", 22050, [tone(300, 22050, 1.0)])
    assert enc.media_type == "audio/aac" and data[:2] in (b"\xff\xf1", b"\xff\xf9")


def test_unknown_formats_are_clear_errors():
    with pytest.raises(ValueError, match="unsupported"):
        open_stream_encoder("xyz", 22050)
