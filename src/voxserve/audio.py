"""Typed audio results and encoders (wav, flac, ogg/vorbis, opus, mp3, pcm)."""

from __future__ import annotations

import io
import math
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

FORMATS = ("wav", "flac", "ogg", "opus", "mp3", "aac", "pcm")
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


@dataclass(frozen=True)
class Word:
    """A spoken word and where it is in its audio, in seconds (start < end)."""

    word: str
    start: float
    end: float


@dataclass
class Audio:
    """Mono float32 samples in [-1, 1] at `sample_rate` Hz."""

    samples: np.ndarray
    sample_rate: int
    words: tuple[Word, ...] = ()
    """Word timestamps from the model's own durations, in seconds from the start of these
    samples (sentence silence included); empty for a voice without them
    (`Voice.word_timestamps` is False)."""

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
    """The sentence this audio says ("" on the chunk that finishes a partial one)."""
    is_last: bool = field(default=False)
    partial: bool = False
    """The head of a sentence (a served stream's first audio): the next chunk, with the same
    index, is the rest of it; no sentence silence goes between the two."""

    # `words` (inherited): on the chunk that starts a sentence, all that sentence's words, in
    # seconds from the start of this chunk (= of the sentence, silence before it excluded); a
    # word of a partial head may end after the head's samples. The chunks that continue a
    # sentence carry none.


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")


def silence_samples(silence_s: float, sample_rate: int) -> int:
    """Samples of `silence_s` seconds of sentence silence (how every join and limit counts it)."""
    return int(round(silence_s * sample_rate))


class SentenceJoiner:
    """The one rule for sentence silence: `silence_s` goes before every sentence but the first,
    never between the pieces of one sentence (a chunk with `partial` set is continued by the
    next). Works on a stream, chunk by chunk (`pieces`), or on a whole list (`join`)."""

    def __init__(self, sample_rate: int, silence_s: float = 0.0):
        self.gap = np.zeros(silence_samples(silence_s, sample_rate), dtype=np.float32)
        self._started = False
        self._in_sentence = False

    def pieces(self, samples: np.ndarray, partial: bool = False) -> list[np.ndarray]:
        """What to write for the next chunk: its samples, after the silence if a sentence starts."""
        gap = self._started and not self._in_sentence and len(self.gap)
        self._started, self._in_sentence = True, partial
        return [self.gap, samples] if gap else [samples]

    def join(self, chunks) -> np.ndarray:
        """AudioChunks (or plain arrays, one sentence each) joined into one array."""
        parts = [p for c in chunks
                 for p in (self.pieces(c.samples, c.partial) if isinstance(c, AudioChunk) else self.pieces(c))]
        return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)


def format_from_path(path: Path) -> str:
    ext = path.suffix.lower().lstrip(".")
    if ext == "oga":
        ext = "ogg"
    if ext not in FORMATS and ext != "raw":
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
    if fmt == "wav":
        return wav_header(sample_rate, len(samples)) + float_to_int16(samples).tobytes()
    buf = io.BytesIO()
    write_stream(buf, sample_rate, fmt, [samples])
    return buf.getvalue()


def write_stream(out: BinaryIO, sample_rate: int, fmt: str, chunks) -> None:
    """Encode an iterable of float32 chunks into `out` (a file, BytesIO, pipe or socket), chunk by chunk.

    Memory stays bounded by one chunk: a 300-page book can be written sentence by sentence. A
    seekable `out` gets the complete file (totals in the header); one that cannot seek gets each
    container's stream form, flushed after every chunk, so a reader hears audio as it is made.
    AAC (ADTS) and Opus at a rate Opus has not (resampled to 48 kHz) always take the server's
    stream encoders: libsndfile writes neither.
    """
    import soundfile as sf

    fmt = check_format(fmt)
    if fmt == "pcm":
        for c in chunks:
            out.write(float_to_int16(np.asarray(c, dtype=np.float32)).tobytes())
        return
    if fmt == "wav" and _seekable(out):  # the sizes patched in at the end
        start = out.tell()
        out.write(wav_header(sample_rate, 0))
        n = 0
        for c in chunks:
            data = float_to_int16(np.asarray(c, dtype=np.float32)).tobytes()
            out.write(data)
            n += len(data) // 2
        end = out.tell()
        out.seek(start)
        out.write(wav_header(sample_rate, n))
        out.seek(end)
        return
    if not _seekable(out) or fmt == "aac" or (fmt == "opus" and sample_rate not in OPUS_RATES):
        enc = _SndfileEncoder(sample_rate, "ogg") if fmt == "ogg" else open_stream_encoder(fmt, sample_rate)
        flush = getattr(out, "flush", lambda: None)
        try:
            for c in chunks:
                out.write(enc.write(c))
                flush()
            out.write(enc.close())
            flush()
        finally:
            enc.close()
        return
    container, subtype = _SF_FORMAT[fmt]
    with sf.SoundFile(out, mode="w", samplerate=sample_rate, channels=1, format=container, subtype=subtype) as f:
        for c in chunks:
            c = np.asarray(c, dtype=np.float32)
            # 16-bit containers get the samples the stream encoders send, so every path agrees
            f.write(float_to_int16(c) if subtype == "PCM_16" else c)


def _seekable(out) -> bool:
    try:
        return bool(out.seekable())
    except (AttributeError, OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# Resampling and streaming encoders (used by the HTTP server; additive helpers)
# ---------------------------------------------------------------------------------------------


class StreamingResampler:
    """Band-limited rational resampler (Kaiser-windowed sinc, polyphase), usable chunk by chunk.

    Feeding a signal in any chunking gives the same samples as feeding it whole (the state is
    the last few input samples and the output position), so a server can resample sentence by
    sentence. The output is aligned with the input (no group delay) and after `flush()` has
    exactly round(n_in * out_rate / in_rate) samples.
    """

    def __init__(self, in_rate: int, out_rate: int, half_width: int = 16, rolloff: float = 0.94,
                 beta: float = 8.6):
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError("sample rates must be positive")
        g = math.gcd(in_rate, out_rate)
        self.in_rate, self.out_rate = in_rate, out_rate
        self.up, self.down = out_rate // g, in_rate // g  # output n sits at input time n*down/up
        # cutoff as a fraction of the input Nyquist: below the lower of the two Nyquists
        cutoff = rolloff * min(1.0, out_rate / in_rate)
        H = int(math.ceil(half_width / min(1.0, out_rate / in_rate)))  # taps each side, input samples
        self.H = H
        # h_poly[p, j]: weight of x[i0 + j - H + 1] for an output at phase p/up past input i0
        j = np.arange(2 * H) - H + 1  # -H+1 .. H
        t = np.arange(self.up)[:, None] / self.up - j[None, :]  # time from each tap, in input samples
        win = np.i0(beta * np.sqrt(np.clip(1 - (t / (H + 1)) ** 2, 0, None))) / np.i0(beta)
        self.h = (cutoff * np.sinc(cutoff * t) * win).astype(np.float64)
        self._buf = np.zeros(H - 1, dtype=np.float64)  # zeros before the signal start
        self._buf_start = -(H - 1)  # absolute input index of _buf[0]
        self._n_in = 0
        self._n_out = 0  # next output index

    def _produce(self, n_stop: int) -> np.ndarray:
        count = n_stop - self._n_out
        if count <= 0:
            return np.zeros(0, dtype=np.float32)
        y = np.empty(count, dtype=np.float64)
        windows = np.lib.stride_tricks.sliding_window_view(self._buf, 2 * self.H)
        # outputs n = n0 + k with the same n mod up share a phase and step `down` inputs apart:
        # one strided matrix-vector product per residue instead of a gather per output
        for r in range(min(self.up, count)):
            n_first = self._n_out + r
            i0 = (n_first * self.down) // self.up
            p = (n_first * self.down) % self.up
            start = i0 - self.H + 1 - self._buf_start
            m = (count - r + self.up - 1) // self.up
            y[r::self.up] = windows[start : start + (m - 1) * self.down + 1 : self.down] @ self.h[p]
        self._n_out = n_stop
        keep_from = ((n_stop * self.down) // self.up) - self.H + 1  # oldest sample still needed
        drop = max(0, keep_from - self._buf_start)
        self._buf = self._buf[drop:]
        self._buf_start += drop
        return y.astype(np.float32)

    def process(self, samples: np.ndarray) -> np.ndarray:
        """Feed samples; returns every output sample that they complete."""
        x = np.asarray(samples, dtype=np.float64).reshape(-1)
        self._buf = np.concatenate([self._buf, x])
        self._n_in += len(x)
        # output n needs input up to i0(n) + H, which must be < n_in
        avail = self._n_in - self.H  # largest usable i0 is avail - 1
        n_stop = max(self._n_out, -(-avail * self.up // self.down)) if avail > 0 else self._n_out
        return self._produce(n_stop)

    def flush(self) -> np.ndarray:
        """The remaining output (the signal is taken to be zero after its end)."""
        total = int(round(self._n_in * self.up / self.down))
        self._buf = np.concatenate([self._buf, np.zeros(self.H + 1)])
        return self._produce(max(total, self._n_out))


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Whole-signal resampling (see StreamingResampler)."""
    if in_rate == out_rate:
        return np.asarray(samples, dtype=np.float32).reshape(-1)
    r = StreamingResampler(in_rate, out_rate)
    return np.concatenate([r.process(samples), r.flush()])


OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
STREAM_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")


def wav_header(sample_rate: int, n_samples: int | None = None, channels: int = 1, bits: int = 16) -> bytes:
    """The 44-byte header of a PCM WAV file of `n_samples` frames; None = a stream of unknown
    length (sizes set to the maximum, as ffmpeg does). Every WAV voxserve writes starts with it."""
    block = channels * bits // 8
    if n_samples is None:
        riff = data = 0xFFFFFFFF
    else:
        data = n_samples * block
        riff = 36 + data
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", data))


def streaming_wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A WAV header for a stream of unknown length."""
    return wav_header(sample_rate, None, channels, bits)


class StreamEncoder:
    """float32 chunks in, encoded bytes out as soon as the codec has them.

    `write(samples) -> bytes` and `close() -> bytes`; `sample_rate` is the rate of the encoded
    audio (opus resamples to 48 kHz). Not thread safe: one encoder per response.
    """

    media_type: str = "application/octet-stream"

    def __init__(self, sample_rate: int):
        self.in_rate = sample_rate
        self.sample_rate = sample_rate

    def write(self, samples: np.ndarray) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> bytes:
        return b""


class _PcmEncoder(StreamEncoder):
    media_type = MEDIA_TYPES["pcm"]

    def write(self, samples: np.ndarray) -> bytes:
        return float_to_int16(np.asarray(samples, dtype=np.float32)).tobytes()


class _WavEncoder(_PcmEncoder):
    media_type = MEDIA_TYPES["wav"]

    def __init__(self, sample_rate: int):
        super().__init__(sample_rate)
        self._header: bytes | None = streaming_wav_header(sample_rate)

    def write(self, samples: np.ndarray) -> bytes:
        head, self._header = self._header or b"", None
        return head + super().write(samples)

    def close(self) -> bytes:
        head, self._header = self._header or b"", None
        return head


class _SndfileEncoder(StreamEncoder):
    """libsndfile writing into a pipe (mp3, ogg/opus, ogg/vorbis): libsndfile sees a pipe, so it
    writes the stream form of the container (no MP3 Xing/LAME tag to patch at the end), and we
    read what it wrote after every slice.

    Not FLAC: on a pipe libsndfile's seek reports success without moving, so libFLAC's rewrite of
    STREAMINFO at close (MD5, total samples, frame sizes: 27 bytes) lands after the last frame.
    """

    _SLICE = 4096  # samples per libsndfile write: keeps each write's bytes far below the pipe size

    def __init__(self, sample_rate: int, fmt: str):
        import fcntl

        import soundfile as sf

        super().__init__(sample_rate)
        self.media_type = MEDIA_TYPES[fmt]
        self._resampler = None
        if fmt == "opus" and sample_rate not in OPUS_RATES:
            self.sample_rate = 48000
            self._resampler = StreamingResampler(sample_rate, 48000)
        container, subtype = _SF_FORMAT[fmt]
        # CBR (libsndfile applies the mode only together with a level; 0.5 = 80 kbit/s at 22 kHz):
        # with no Xing header, readers estimate a stream's length from the first frame's bitrate
        extra = {"bitrate_mode": "CONSTANT", "compression_level": 0.5} if fmt == "mp3" else {}
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        try:
            fcntl.fcntl(self._wfd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except OSError:  # keep the default 64 KiB; slices stay far below it
            pass
        try:
            self._f = sf.SoundFile(self._wfd, mode="w", samplerate=self.sample_rate, channels=1,
                                   format=container, subtype=subtype, closefd=False, **extra)
        except Exception:
            os.close(self._rfd)
            os.close(self._wfd)
            raise
        self._closed = False

    def _drain(self) -> bytes:
        out = bytearray()
        while True:
            try:
                b = os.read(self._rfd, 1 << 16)
            except BlockingIOError:
                break
            if not b:
                break
            out += b
        return bytes(out)

    def write(self, samples: np.ndarray) -> bytes:
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self._resampler is not None:
            x = self._resampler.process(x)
        out = bytearray()
        for k in range(0, len(x), self._SLICE):
            self._f.write(x[k : k + self._SLICE])
            out += self._drain()
        return bytes(out)

    def close(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        out = bytearray()
        try:
            if self._resampler is not None:
                tail = self._resampler.flush()
                for k in range(0, len(tail), self._SLICE):
                    self._f.write(tail[k : k + self._SLICE])
                    out += self._drain()
            self._f.close()
            out += self._drain()
        finally:
            os.close(self._wfd)
            out += self._drain()
            os.close(self._rfd)
        return bytes(out)

    def __del__(self):  # an abandoned response must not leak two file descriptors
        if not getattr(self, "_closed", True):
            self._closed = True
            for fd in (self._wfd, self._rfd):
                try:
                    os.close(fd)
                except OSError:
                    pass


class _AvEncoder(StreamEncoder):
    """ffmpeg's encoder and muxer (PyAV) writing into a sink that cannot seek (flac, aac/ADTS):
    the muxer then writes the stream form and never goes back (a FLAC stream's STREAMINFO says
    total samples 0 = unknown, and has no MD5), and each packet's bytes leave as it is muxed."""

    _CODECS = {"flac": ("flac", "flac", "s16"), "aac": ("adts", "aac", "fltp")}

    class _Sink:
        def __init__(self):
            self.data = bytearray()

        def write(self, b) -> int:
            self.data += b
            return len(b)

        def take(self) -> bytes:
            out = bytes(self.data)
            self.data.clear()
            return out

    def __init__(self, sample_rate: int, fmt: str):
        import av

        super().__init__(sample_rate)
        self.media_type = MEDIA_TYPES[fmt]
        container, codec, self._sample_fmt = self._CODECS[fmt]
        self._sink = self._Sink()
        self._out = av.open(self._sink, "w", format=container)
        self._stream = self._out.add_stream(codec, rate=sample_rate, layout="mono")
        self._pts = 0
        self._closed = False

    def _mux(self, frame) -> bytes:
        for packet in self._stream.encode(frame):
            self._out.mux(packet)
        return self._sink.take()

    def write(self, samples: np.ndarray) -> bytes:
        import av

        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if not len(x):
            return b""
        # FLAC gets the int16 samples every other 16-bit path sends; AAC codes the floats
        data = float_to_int16(x) if self._sample_fmt == "s16" else np.clip(x, -1.0, 1.0)
        frame = av.AudioFrame.from_ndarray(data.reshape(1, -1), format=self._sample_fmt, layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += len(x)
        return self._mux(frame)

    def close(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        try:
            out = self._mux(None)
        finally:
            self._out.close()
        return out + self._sink.take()


class EncoderOwner:
    """The one owner of a response's StreamEncoder, shared by the event loop and worker threads:
    its writes and its close run one at a time, and the encoder is closed only after its last
    write has returned. A client that leaves cancels the coroutine awaiting a write, not the
    thread running it (libsndfile/LAME/libopus/ffmpeg cannot be stopped mid-call), so `abandon`
    closes at once if no write runs, else the running write closes it as it returns; closing a
    codec under a running write crashed the process (SIGSEGV, or LAME's SIGABRT)."""

    def __init__(self, encoder: StreamEncoder):
        self.encoder = encoder
        self._lock = threading.Lock()  # held by each write and the close
        self._closing = False  # no write starts once set
        self._closed = False

    @property
    def sample_rate(self) -> int:
        return self.encoder.sample_rate

    @property
    def media_type(self) -> str:
        return self.encoder.media_type

    def write(self, samples: np.ndarray) -> bytes:
        """The encoded bytes of `samples` (b"" once abandoned); any thread, one at a time."""
        with self._lock:
            out = b"" if self._closing else self.encoder.write(samples)
        if self._closing:  # abandoned during the write: the close waited for it
            self._close_if_idle()
            return b""
        return out

    def finish(self) -> bytes:
        """The encoder's last bytes, after any write still running; b"" once abandoned."""
        with self._lock:
            if self._closing:
                return b""
            self._closing = self._closed = True
            return self.encoder.close()

    def abandon(self) -> None:
        """No more bytes are wanted: close now, or when the running write returns (never waits for it)."""
        self._closing = True
        # A write that holds the lock now sees _closing after it releases the lock (it set
        # nothing since) and closes then: one of the two always gets the lock after the flag.
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if not self._lock.acquire(blocking=False):
            return
        try:
            if not self._closed:
                self._closed = True
                try:
                    self.encoder.close()
                except Exception:  # the bytes go nowhere; a failing flush must not fail the caller
                    pass
        finally:
            self._lock.release()


def available_stream_formats() -> tuple[str, ...]:
    """Formats `open_stream_encoder` can produce."""
    return STREAM_FORMATS


def open_stream_encoder(fmt: str, sample_rate: int) -> StreamEncoder:
    """A streaming encoder for one response: mp3, opus (Ogg, resampled to 48 kHz unless the
    voice rate is an Opus rate), aac (ADTS), flac (length unknown in STREAMINFO), wav (header
    with unknown length), pcm (s16le)."""
    fmt = fmt.lower()
    if fmt == "pcm":
        return _PcmEncoder(sample_rate)
    if fmt == "wav":
        return _WavEncoder(sample_rate)
    if fmt in ("mp3", "opus"):
        return _SndfileEncoder(sample_rate, fmt)
    if fmt in ("flac", "aac"):
        return _AvEncoder(sample_rate, fmt)
    raise ValueError(f"unsupported audio format {fmt!r}; supported: {', '.join(available_stream_formats())}")
