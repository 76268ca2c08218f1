"""POST /v1/audio/encode?response_format=FMT: audio the client already holds, sent as a WAV (16-bit
mono PCM, as the speech routes' wav and pcm carry it), answered in another format. The
playground's download of what it played: encoding the samples it received is exact for every
family, where asking for the same text again (even seeded) may not give the same samples.

Bounded: MAX_SECONDS of audio at a rate in RATES (the body limit of this route is derived from
them, `body_limit`); the API key applies as on every /v1 route.
"""

from __future__ import annotations

import asyncio
import io
import wave

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..audio import MEDIA_TYPES, OPUS_RATES, available_stream_formats, encode_audio
from ..errors import AudioTooLongError, InvalidInputError, InvalidOptionError

ROUTE = "/v1/audio/encode"
MAX_SECONDS = 600.0
"""The longest audio the route encodes (26 MB of WAV at 22.05 kHz)."""
RATES = (8000, 48000)
"""Lowest and highest sample rate taken (every voice's rate lies between)."""
_WAV_HEADER_MAX = 1024  # a RIFF header with a few extra chunks


def body_limit(path: str, default: int) -> int:
    """The request body limit for `path`: this route takes up to MAX_SECONDS of WAV at the
    highest rate; every other route keeps the server's limit."""
    if path == ROUTE:
        return max(default, int(MAX_SECONDS * RATES[1]) * 2 + _WAV_HEADER_MAX)
    return default


def int16_to_float(samples: np.ndarray) -> np.ndarray:
    """float32 samples that `voxserve.audio.float_to_int16` (x * 32767, truncated) maps back to
    exactly these int16 samples: half a step away from zero, well clear of float32 rounding.
    -32768, which no voxserve stream holds, comes back as -32767."""
    k = samples.astype(np.float64)
    return ((k + 0.5 * np.sign(k)) / 32767.0).astype(np.float32)


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """(int16 samples, rate) of a 16-bit mono PCM WAV; InvalidInputError for anything else."""
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            channels, width, rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if channels != 1 or width != 2:
                raise InvalidInputError(f"the audio must be 16-bit mono PCM WAV, not {channels} channel(s) of "
                                        f"{8 * width}-bit samples")
            if not RATES[0] <= rate <= RATES[1]:
                raise InvalidInputError(f"sample rate {rate} Hz is outside {RATES[0]}-{RATES[1]} Hz")
            if n > MAX_SECONDS * rate:
                raise AudioTooLongError("the audio", n / rate, MAX_SECONDS, option="audio")
            frames = w.readframes(n)
    except (wave.Error, EOFError) as e:
        raise InvalidInputError(f"the body is not a WAV file: {e}") from None
    if len(frames) != 2 * n:
        raise InvalidInputError(f"the WAV file is cut short: {len(frames) // 2} of {n} samples")
    return np.frombuffer(frames, "<i2"), rate


def _encode(samples: np.ndarray, rate: int, fmt: str) -> bytes:
    return encode_audio(int16_to_float(samples), rate, fmt)  # whole files: totals in the headers


router = APIRouter()


@router.post(ROUTE)
async def encode(request: Request, response_format: str):
    fmt = response_format.lower()
    if fmt not in available_stream_formats():
        raise InvalidOptionError("response_format", f"{response_format!r}; one of: {', '.join(available_stream_formats())}")
    samples, rate = read_wav(await request.body())
    data = await asyncio.to_thread(_encode, samples, rate, fmt)
    out_rate = 48000 if fmt == "opus" and rate not in OPUS_RATES else rate  # as the speech routes do
    media = f"audio/L16; rate={rate}; channels=1" if fmt == "pcm" else MEDIA_TYPES[fmt]
    return Response(data, media_type=media,
                    headers={"X-Sample-Rate": str(out_rate), "Cache-Control": "no-store"})
