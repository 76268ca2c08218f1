"""Typed audio results and encoders (wav, flac, ogg/vorbis, opus, mp3, pcm)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

FORMATS = ("wav", "flac", "ogg", "opus", "mp3", "pcm")
MEDIA_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "opus": "audio/ogg; codecs=opus",
    "mp3": "audio/mpeg",
    "pcm": "audio/L16",
    "aac": "audio/aac",
}
_SF_FORMAT = {  # soundfile (libsndfile) container + subtype
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "opus": ("OGG", "OPUS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}


@dataclass
class Audio:
    """Mono float32 samples in [-1, 1] at `sample_rate` Hz."""

    samples: np.ndarray
    sample_rate: int

    def __post_init__(self) -> None:
        self.samples = np.asarray(self.samples, dtype=np.float32).reshape(-1)

    @property
    def duration(self) -> float:
        """Seconds."""
        return len(self.samples) / self.sample_rate

    def to_int16(self) -> np.ndarray:
        return float_to_int16(self.samples)

    def encode(self, fmt: str = "wav") -> bytes:
        return encode_audio(self.samples, self.sample_rate, fmt)

    def save(self, path: str | Path, fmt: str | None = None) -> None:
        path = Path(path)
        fmt = fmt or format_from_path(path)
        path.write_bytes(self.encode(fmt))


@dataclass
class AudioChunk(Audio):
    """One sentence's audio from a stream, in order."""

    index: int = 0
    """Position of the sentence in the request (0-based)."""
    text: str = ""
    """The sentence this audio says."""
    is_last: bool = field(default=False)


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")


def format_from_path(path: Path) -> str:
    ext = path.suffix.lower().lstrip(".")
    if ext == "oga":
        ext = "ogg"
    if ext not in _SF_FORMAT and ext != "pcm" and ext != "raw":
        raise ValueError(f"cannot tell the audio format of {path.name}; use one of: {', '.join(FORMATS)}")
    return "pcm" if ext == "raw" else ext


def check_format(fmt: str) -> str:
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise ValueError(f"unsupported audio format {fmt!r}; supported: {', '.join(FORMATS)}")
    return fmt


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Whole-file encoding."""
    fmt = check_format(fmt)
    if fmt == "pcm":
        return float_to_int16(samples).tobytes()
    buf = io.BytesIO()
    write_stream(buf, sample_rate, fmt, [samples])
    return buf.getvalue()


def write_stream(out: BinaryIO, sample_rate: int, fmt: str, chunks) -> None:
    """Encode an iterable of float32 chunks into `out` (a file or BytesIO), chunk by chunk.

    Memory stays bounded by one chunk: a 300-page book can be written sentence by sentence.
    """
    import soundfile as sf

    fmt = check_format(fmt)
    if fmt == "pcm":
        for c in chunks:
            out.write(float_to_int16(np.asarray(c, dtype=np.float32)).tobytes())
        return
    container, subtype = _SF_FORMAT[fmt]
    rate = sample_rate
    if fmt == "opus" and rate not in (8000, 12000, 16000, 24000, 48000):
        raise ValueError(f"opus needs a sample rate of 8/12/16/24/48 kHz, the voice has {rate} Hz")
    with sf.SoundFile(out, mode="w", samplerate=rate, channels=1, format=container, subtype=subtype) as f:
        for c in chunks:
            f.write(np.asarray(c, dtype=np.float32))
