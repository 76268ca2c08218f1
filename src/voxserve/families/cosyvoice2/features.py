"""The signal processing of the CosyVoice 2 prompt front end, in numpy (float64 inside, float32
out): a band-limited resampler, the Whisper log-mel the speech tokenizer reads, the Kaldi fbank
CAM++ reads, and the Matcha mel the flow is conditioned on. Each follows the definition the
reference calls (torchaudio Resample / kaldi.fbank, whisper, matcha) so their values match.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

# ---------------------------------------------------------------------------------------------
# resampling


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int, lowpass_width: int, rolloff: float) -> tuple[np.ndarray, int]:
    """Polyphase windowed-sinc filters for orig -> new (both already divided by their gcd):
    [new, 2 * width + orig] float32, one row per output phase, Hann-windowed over
    `lowpass_width` zero crossings of a low-pass at rolloff * min(orig, new) / 2."""
    cutoff = min(orig, new) * rolloff  # in units where the slower rate is 1 sample per step
    width = math.ceil(lowpass_width * orig / cutoff)
    taps = np.arange(-width, width + orig, dtype=np.float64) / orig  # input offsets, in input periods / orig
    phase = -np.arange(new, dtype=np.float64)[:, None] / new  # each output phase's delay
    t = np.clip((phase + taps[None, :]) * cutoff, -lowpass_width, lowpass_width)
    window = np.cos(t * math.pi / lowpass_width / 2) ** 2
    x = t * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        sinc = np.where(x == 0, 1.0, np.sin(x) / np.where(x == 0, 1.0, x))
    kernel = sinc * window * (cutoff / orig)
    return kernel.astype(np.float32), width


def resample(
    wave: np.ndarray, orig_sr: int, new_sr: int, lowpass_width: int = 6, rolloff: float = 0.99
) -> np.ndarray:
    """Band-limited resampling of a mono float wave [N] -> [ceil(N * new_sr / orig_sr)]: zero
    padded at both ends (as torchaudio's Resample, whose sinc/Hann definition it follows)."""
    if int(orig_sr) != orig_sr or int(new_sr) != new_sr or orig_sr <= 0 or new_sr <= 0:
        raise ValueError(f"sample rates must be positive integers, got {orig_sr} -> {new_sr}")
    wave = np.asarray(wave, dtype=np.float32)
    if orig_sr == new_sr:
        return wave.copy()
    g = math.gcd(int(orig_sr), int(new_sr))
    orig, new = int(orig_sr) // g, int(new_sr) // g
    kernel, width = _sinc_kernel(orig, new, int(lowpass_width), float(rolloff))
    n = wave.shape[0]
    padded = np.pad(wave, (width, width + orig)).astype(np.float64)
    taps = kernel.shape[1]
    frames = np.lib.stride_tricks.sliding_window_view(padded, taps)[::orig]  # [K, taps], stride orig
    out = (frames @ kernel.astype(np.float64).T).reshape(-1)  # [K * new], phases interleaved
    return out[: math.ceil(new * n / orig)].astype(np.float32)


# ---------------------------------------------------------------------------------------------
# mel filterbanks


def _hz_to_mel_slaney(f: np.ndarray) -> np.ndarray:
    # linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4)
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3.0)
    logstep = math.log(6.4) / 27.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / logstep, lin)


def _mel_to_hz_slaney(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    logstep = math.log(6.4) / 27.0
    return np.where(m >= 15.0, 1000.0 * np.exp(logstep * (m - 15.0)), m * (200.0 / 3.0))


@lru_cache(maxsize=8)
def slaney_mel_filters(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters [n_mels, n_fft // 2 + 1] float32 (the
    librosa default whisper's mel_filters.npz and matcha's mel basis are made with)."""
    fmax = sample_rate / 2.0 if fmax is None else float(fmax)
    fft_freqs = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges = _mel_to_hz_slaney(np.linspace(_hz_to_mel_slaney(fmin), _hz_to_mel_slaney(fmax), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_freqs[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]  # equal area per filter
    return weights.astype(np.float32)


def _kaldi_mel(f):
    return 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


@lru_cache(maxsize=4)
def kaldi_mel_banks(
    n_bins: int, padded_window: int, sample_rate: float, low_freq: float, high_freq: float
) -> np.ndarray:
    """Kaldi's triangular mel banks (no normalisation) [n_bins, padded_window // 2 + 1]; the
    Nyquist column is zero as in Kaldi."""
    n_fft_bins = padded_window // 2
    nyquist = sample_rate / 2.0
    if high_freq <= 0.0:
        high_freq += nyquist
    lo, hi = _kaldi_mel(low_freq), _kaldi_mel(high_freq)
    delta = (hi - lo) / (n_bins + 1)
    b = np.arange(n_bins, dtype=np.float64)[:, None]
    left, center, right = lo + b * delta, lo + (b + 1) * delta, lo + (b + 2) * delta
    mel = _kaldi_mel(sample_rate / padded_window * np.arange(n_fft_bins))[None, :]
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = np.maximum(0.0, np.minimum(up, down))
    return np.pad(banks, ((0, 0), (0, 1)))


# ---------------------------------------------------------------------------------------------
# features


def _periodic_hann(n: int) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2.0 * math.pi * np.arange(n) / n)


def _frames(x: np.ndarray, length: int, hop: int) -> np.ndarray:
    return np.lib.stride_tricks.sliding_window_view(x, length)[::hop]  # [n_frames, length]


WHISPER_N_FFT = 400
WHISPER_HOP = 160


def whisper_log_mel(wave_16k: np.ndarray, n_mels: int = 128) -> np.ndarray:
    """Whisper's log-mel of a 16 kHz wave [N] -> [n_mels, N // 160] float32: centred STFT
    (reflect), power, Slaney mel, log10 floored at 8 below the maximum, then (x + 4) / 4."""
    x = np.asarray(wave_16k, dtype=np.float64)
    if x.shape[0] <= WHISPER_N_FFT // 2:
        raise ValueError(f"wave of {x.shape[0]} samples is too short for the 400-point STFT")
    x = np.pad(x, (WHISPER_N_FFT // 2, WHISPER_N_FFT // 2), mode="reflect")
    spec = np.fft.rfft(_frames(x, WHISPER_N_FFT, WHISPER_HOP) * _periodic_hann(WHISPER_N_FFT), axis=-1)
    power = (spec.real**2 + spec.imag**2)[:-1].T  # [201, T]; whisper drops the last frame
    mel = slaney_mel_filters(16000, WHISPER_N_FFT, n_mels).astype(np.float64) @ power
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)


def kaldi_fbank(wave: np.ndarray, sample_rate: int = 16000, num_mel_bins: int = 80) -> np.ndarray:
    """Kaldi fbank as torchaudio.compliance.kaldi.fbank with dither 0 and its other defaults:
    25 ms frames every 10 ms (snip edges), DC removed, pre-emphasis 0.97, Povey window, FFT of
    the next power of two, power spectrum, mel banks from 20 Hz to Nyquist, natural log floored
    at float32 eps. The wave is used as given (no int16 scaling). [N] -> [T, num_mel_bins]."""
    x = np.asarray(wave, dtype=np.float64)
    length = int(sample_rate * 0.025)
    shift = int(sample_rate * 0.010)
    if x.shape[0] < length:
        raise ValueError(f"wave of {x.shape[0]} samples is shorter than one {length}-sample fbank frame")
    frames = _frames(x, length, shift)
    frames = frames - frames.mean(axis=1, keepdims=True)
    previous = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)  # first sample repeats itself
    frames = frames - 0.97 * previous
    povey = (0.5 - 0.5 * np.cos(2.0 * math.pi * np.arange(length) / (length - 1))) ** 0.85
    padded = 1 << (length - 1).bit_length()
    spec = np.fft.rfft(frames * povey, n=padded, axis=-1)
    power = spec.real**2 + spec.imag**2  # [T, padded // 2 + 1]
    banks = kaldi_mel_banks(num_mel_bins, padded, float(sample_rate), 20.0, 0.0)
    energies = power @ banks.T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps)).astype(np.float32)


def matcha_mel(
    wave: np.ndarray,
    n_fft: int = 1920,
    num_mels: int = 80,
    sampling_rate: int = 24000,
    hop_size: int = 480,
    win_size: int = 1920,
    fmin: float = 0.0,
    fmax: float = 8000.0,
) -> np.ndarray:
    """Matcha's mel (CosyVoice 2's `feat_extractor`): reflect-pad (n_fft - hop) / 2 each side,
    uncentred Hann STFT, magnitude sqrt(power + 1e-9), Slaney mel, natural log floored at 1e-5.
    [N] -> [N // hop, num_mels] float32 (frames first)."""
    if win_size != n_fft:
        raise ValueError("matcha_mel supports win_size == n_fft only (CosyVoice 2's setting)")
    x = np.asarray(wave, dtype=np.float64)
    pad = (n_fft - hop_size) // 2
    if x.shape[0] <= pad:
        raise ValueError(f"wave of {x.shape[0]} samples is too short for reflect padding of {pad}")
    x = np.pad(x, (pad, pad), mode="reflect")
    spec = np.fft.rfft(_frames(x, n_fft, hop_size) * _periodic_hann(win_size), axis=-1)
    magnitude = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)  # [T, n_fft // 2 + 1]
    basis = slaney_mel_filters(sampling_rate, n_fft, num_mels, fmin, fmax).astype(np.float64)
    return np.log(np.maximum(magnitude @ basis.T, 1e-5)).astype(np.float32)
