"""CosyVoice 2 zero-shot voices: a prompt recording -> prompt speech tokens (speech tokenizer
ONNX), speaker embedding (CAM++ ONNX) and prompt mel; saving/loading a computed voice; reading
upstream's `spk2info.pt`. The prompt text's token ids come from the LM's tokenizer, not from here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from voxserve.families.cosyvoice2.features import kaldi_fbank, matcha_mel, resample, whisper_log_mel

TOKENIZER_SAMPLE_RATE = 16000  # speech tokenizer and CAM++ input rate
FEAT_SAMPLE_RATE = 24000  # prompt mel rate (the model's output rate)
TOKEN_MEL_RATIO = 2  # 25 Hz tokens, 50 Hz mel frames
MEL_BINS = 80
EMBED_DIM = 192
MIN_SECONDS = 0.5  # shorter prompts give too few tokens to carry a voice
MAX_SECONDS = 30.0  # the speech tokenizer's limit
PROMPT_FORMAT = "voxserve-cosyvoice2-prompt/1"


@dataclass
class PromptFeatures:
    """A zero-shot voice as the LM and flow consume it.

    speech_tokens: [T] int64, 25 Hz speech tokens of the prompt (vocabulary 6561).
    speech_feat: [TOKEN_MEL_RATIO * T, 80] float32, the prompt's log mel at 24 kHz, hop 480.
    embedding: [192] float32 CAM++ speaker embedding (of the 16 kHz prompt).
    prompt_text: the transcript ('' for a voice without one).
    prompt_text_tokens: [L] int64 ids of the transcript when known (spk2info entries carry them).
    """

    speech_tokens: np.ndarray
    speech_feat: np.ndarray
    embedding: np.ndarray
    prompt_text: str = ""
    prompt_text_tokens: np.ndarray | None = None
    token_sample_rate: int = TOKENIZER_SAMPLE_RATE
    feat_sample_rate: int = FEAT_SAMPLE_RATE

    def validate(self, where: str = "prompt") -> "PromptFeatures":
        """Checks dtypes and shapes (ValueError naming `where` and the field); returns self."""
        _check(self.speech_tokens, np.integer, 1, None, f"{where}: speech_tokens")
        _check(self.speech_feat, np.floating, 2, MEL_BINS, f"{where}: speech_feat")
        _check(self.embedding, np.floating, 1, EMBED_DIM, f"{where}: embedding")
        if self.speech_feat.shape[0] != TOKEN_MEL_RATIO * self.speech_tokens.shape[0]:
            raise ValueError(
                f"{where}: speech_feat has {self.speech_feat.shape[0]} frames, expected "
                f"{TOKEN_MEL_RATIO} x {self.speech_tokens.shape[0]} speech tokens"
            )
        if self.prompt_text_tokens is not None:
            _check(self.prompt_text_tokens, np.integer, 1, None, f"{where}: prompt_text_tokens")
        if not np.all(np.isfinite(self.embedding)) or not np.all(np.isfinite(self.speech_feat)):
            raise ValueError(f"{where}: embedding or speech_feat holds non-finite values")
        return self


def _check(a, kind, ndim: int, last: int | None, what: str) -> None:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{what}: expected a numpy array, got {type(a).__name__}")
    if not np.issubdtype(a.dtype, kind):
        raise ValueError(f"{what}: expected {kind.__name__} values, got dtype {a.dtype}")
    if a.ndim != ndim or (last is not None and a.shape[-1] != last):
        want = f"[..., {last}]" if last is not None else f"{ndim}-D"
        raise ValueError(f"{what}: expected shape {want} ({ndim}-D), got {list(a.shape)}")


def _mono(wave: np.ndarray, sample_rate: int) -> np.ndarray:
    wave = np.asarray(wave)
    if wave.ndim == 2:
        # [channels, N] or [N, channels]: the short axis is the channels; average as upstream's load_wav
        wave = wave.mean(axis=0 if wave.shape[0] <= wave.shape[1] else 1)
    if wave.ndim != 1:
        raise ValueError(f"prompt wave must be mono [N] (or [channels, N]), got shape {list(wave.shape)}")
    if not np.issubdtype(wave.dtype, np.floating):
        raise ValueError(f"prompt wave must hold floats in [-1, 1], got dtype {wave.dtype}")
    if int(sample_rate) != sample_rate or sample_rate < TOKENIZER_SAMPLE_RATE:
        # upstream's load_wav refuses to upsample a prompt below 16 kHz: it lacks the band
        raise ValueError(f"prompt sample rate must be an integer >= 16000 Hz, got {sample_rate}")
    seconds = wave.shape[0] / sample_rate
    if seconds < MIN_SECONDS:
        raise ValueError(f"prompt wave is {seconds:.2f} s long; at least {MIN_SECONDS} s is needed")
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"prompt wave is {seconds:.2f} s long; the speech tokenizer takes at most {MAX_SECONDS:.0f} s"
        )
    if not np.all(np.isfinite(wave)):
        raise ValueError("prompt wave holds non-finite samples")
    return wave.astype(np.float32)


class PromptEncoder:
    """Runs the two ONNX models of a CosyVoice2-0.5B folder on a prompt recording."""

    def __init__(
        self, speech_tokenizer_onnx: Path, campplus_onnx: Path, providers: Sequence[str] | None = None
    ):
        import onnxruntime

        providers = list(providers) if providers else ["CPUExecutionProvider"]
        for path in (speech_tokenizer_onnx, campplus_onnx):
            if not Path(path).is_file():
                raise FileNotFoundError(f"CosyVoice 2 ONNX model not found: {path}")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # prompts are short; leave the cores to the LM and flow
        self._tokenizer = self._session(onnxruntime, speech_tokenizer_onnx, options, providers)
        self._campplus = self._session(onnxruntime, campplus_onnx, options, providers)
        ins = self._tokenizer.get_inputs()
        if len(ins) != 2:
            raise ValueError(
                f"{speech_tokenizer_onnx}: expected 2 inputs (feats, feats_length), got {[i.name for i in ins]}"
            )
        self._feats_name, self._len_name = ins[0].name, ins[1].name
        self._campplus_in = self._campplus.get_inputs()[0].name

    @staticmethod
    def _session(ort, path, options, providers):
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as e:  # onnxruntime raises its own types; say which file
            raise ValueError(f"cannot load ONNX model {path}: {e}") from e

    def speech_tokens(self, wave_16k: np.ndarray) -> np.ndarray:
        """[N] 16 kHz -> [T] int64 speech tokens (25 Hz)."""
        feats = whisper_log_mel(wave_16k, n_mels=128)[None]  # [1, 128, T_100Hz]
        out = self._tokenizer.run(
            None, {self._feats_name: feats, self._len_name: np.array([feats.shape[2]], dtype=np.int32)}
        )[0]
        return np.asarray(out).reshape(-1).astype(np.int64)

    def embedding(self, wave_16k: np.ndarray) -> np.ndarray:
        """[N] 16 kHz -> [192] float32 CAM++ embedding of the time-centred fbank."""
        fbank = kaldi_fbank(wave_16k, 16000, 80)
        fbank = fbank - fbank.mean(axis=0, keepdims=True)
        out = self._campplus.run(None, {self._campplus_in: fbank[None].astype(np.float32)})[0]
        out = np.asarray(out, dtype=np.float32).reshape(-1)
        if out.shape[0] != EMBED_DIM:
            raise ValueError(f"campplus output has {out.shape[0]} values, expected {EMBED_DIM}")
        return out

    def encode(self, wave: np.ndarray, sample_rate: int) -> PromptFeatures:
        """A prompt recording (mono float [N] at sample_rate, 0.5-30 s) -> its PromptFeatures
        (without the text). Both rates are resampled from the input, as upstream's load_wav; mel
        and tokens are trimmed to a common length, 2 mel frames per token."""
        wave = _mono(wave, sample_rate)
        w16 = resample(wave, int(sample_rate), TOKENIZER_SAMPLE_RATE)
        w24 = resample(wave, int(sample_rate), FEAT_SAMPLE_RATE)
        tokens = self.speech_tokens(w16)
        feat = matcha_mel(w24)  # [T_50Hz, 80]
        n = min(feat.shape[0] // TOKEN_MEL_RATIO, tokens.shape[0])
        return PromptFeatures(
            speech_tokens=tokens[:n].copy(),
            speech_feat=np.ascontiguousarray(feat[: TOKEN_MEL_RATIO * n]),
            embedding=self.embedding(w16),
        ).validate()


# ---------------------------------------------------------------------------------------------
# saved voices


def save_prompt(path: Path, features: PromptFeatures) -> None:
    """Writes a voice as an npz of plain arrays (no pickles) with a json header."""
    features.validate(str(path))
    meta = {
        "format": PROMPT_FORMAT,
        "prompt_text": features.prompt_text,
        "token_sample_rate": features.token_sample_rate,
        "feat_sample_rate": features.feat_sample_rate,
    }
    arrays = {
        "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8),
        "speech_tokens": features.speech_tokens.astype(np.int64),
        "speech_feat": features.speech_feat.astype(np.float32),
        "embedding": features.embedding.astype(np.float32),
    }
    if features.prompt_text_tokens is not None:
        arrays["prompt_text_tokens"] = features.prompt_text_tokens.astype(np.int64)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:  # a file object keeps numpy from appending .npz
        np.savez(f, **arrays)
    tmp.replace(path)


def load_prompt(path: Path) -> PromptFeatures:
    """Reads a voice written by save_prompt; errors name the file and the missing/bad entry."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CosyVoice 2 voice file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:
        raise ValueError(f"{path}: not a readable voice file ({e})") from e
    for key in ("meta", "speech_tokens", "speech_feat", "embedding"):
        if key not in arrays:
            raise ValueError(f"{path}: missing entry {key!r}")
    try:
        meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: entry 'meta' is not json ({e})") from e
    if meta.get("format") != PROMPT_FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected {PROMPT_FORMAT!r}")
    return PromptFeatures(
        speech_tokens=arrays["speech_tokens"],
        speech_feat=arrays["speech_feat"],
        embedding=arrays["embedding"],
        prompt_text=str(meta.get("prompt_text", "")),
        prompt_text_tokens=arrays.get("prompt_text_tokens"),
        token_sample_rate=int(meta.get("token_sample_rate", TOKENIZER_SAMPLE_RATE)),
        feat_sample_rate=int(meta.get("feat_sample_rate", FEAT_SAMPLE_RATE)),
    ).validate(str(path))


# upstream's keys: saved SFT speakers carry embedding/speech_feat/speech_token; add_zero_shot_spk
# stores the zero-shot model input (flow_/llm_ prefixed names, prompt_text ids)
_SPK_KEYS = {
    "embedding": ("embedding", "flow_embedding", "llm_embedding"),
    "speech_feat": ("speech_feat", "prompt_speech_feat"),
    "speech_token": ("speech_token", "flow_prompt_speech_token", "llm_prompt_speech_token"),
}


def load_spk2info(path: Path) -> dict[str, PromptFeatures]:
    """Reads upstream's spk2info.pt (torch.save of speaker -> dict of tensors) with
    torch.load(weights_only=True): tensors and plain containers only, no code runs. A speaker
    without prompt tokens/mel (an SFT speaker) gets empty ones."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spk2info file not found: {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"{path}: cannot read as a weights-only torch file ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a dict speaker -> info, got {type(data).__name__}")
    out: dict[str, PromptFeatures] = {}
    for spk, info in data.items():
        where = f"{path}: speaker {spk!r}"
        if not isinstance(info, dict):
            raise ValueError(f"{where}: expected a dict, got {type(info).__name__}")

        def pick(name):
            for key in _SPK_KEYS[name]:
                if key in info:
                    t = info[key]
                    if not isinstance(t, torch.Tensor):
                        raise ValueError(f"{where}: {key!r} is {type(t).__name__}, not a tensor")
                    return key, t.detach().cpu()
            return None, None

        key, emb = pick("embedding")
        if emb is None:
            raise ValueError(f"{where}: no speaker embedding (one of {list(_SPK_KEYS['embedding'])})")
        if tuple(emb.shape) not in ((1, EMBED_DIM), (EMBED_DIM,)):
            raise ValueError(f"{where}: {key!r} has shape {list(emb.shape)}, expected [1, {EMBED_DIM}]")
        emb = emb.reshape(EMBED_DIM)
        key_t, tok = pick("speech_token")
        key_f, feat = pick("speech_feat")
        tok = torch.zeros(0, dtype=torch.int64) if tok is None else tok
        feat = torch.zeros(0, MEL_BINS) if feat is None else feat
        if tok.dim() == 2 and tok.shape[0] == 1:
            tok = tok[0]
        if feat.dim() == 3 and feat.shape[0] == 1:
            feat = feat[0]
        if tok.dim() != 1 or tok.is_floating_point():
            raise ValueError(f"{where}: {key_t!r} must be integer [1, T], got {tok.dtype} {list(tok.shape)}")
        if feat.dim() != 2 or feat.shape[1] != MEL_BINS:
            raise ValueError(f"{where}: {key_f!r} must be [1, T_mel, {MEL_BINS}], got {list(feat.shape)}")
        text_tokens = info.get("prompt_text")
        if isinstance(text_tokens, torch.Tensor):
            text_tokens = text_tokens.reshape(-1).numpy().astype(np.int64)
        else:
            text_tokens = None
        out[str(spk)] = PromptFeatures(
            speech_tokens=tok.numpy().astype(np.int64),
            speech_feat=feat.float().numpy(),
            embedding=emb.float().numpy(),
            prompt_text_tokens=text_tokens,
        ).validate(where)
    return out
