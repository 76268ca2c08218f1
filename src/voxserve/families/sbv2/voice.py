"""Sbv2Voice: a Style-Bert-VITS2 model folder behind the Voice API.

A sentence becomes a Unit whose payload (Sbv2Item) holds its symbol, tone and language ids,
speaker, style vector and noise settings, and which names its language's shared BERT
(`Unit.component`): the engine (or `resolve_components`, on the library path) runs the BERTs of
waiting sentences of every request and voice as one batch and hands the features back on the
device (`with_component_output`); `run_pieces` then pads a batch of sentences, features
included, and runs the synthesizer once.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...audio import Word
from ...errors import (
    AudioTooLongError,
    InvalidOptionError,
    UnknownSpeakerError,
    UnpronounceableTextError,
    VoiceLoadError,
)
from ...models.vits_precision import PrecisionPolicy, apply_precision
from ...options import SynthesisOptions
from ...runtime.allocator import release_free_memory
from ...runtime.device import resolve_dtype
from ...text.frontend import check_text
from ...text.split import split_long, split_sentences
from ...voice import Piece, SharedComponent, Unit, Voice, limited, sentence_seed
from .bert import BERT_DIM, BERT_FOLDERS, SbvBert, normalise_device, shared_bert
from .folder import BERT_DIR_ENV, FRONTEND_LANGUAGES, language_codes
from .loader import Sbv2Checkpoint, load_sbv2_checkpoint, style_vector
from .synthesis import Sbv2Options
from .text import UnsupportedLanguageError, check_language, english, japanese, sentence_text

# The synthesizer parts that stay fp32 under each dtype: the text encoder and both duration
# predictors (a duration that crosses an integer in half precision shifts the whole waveform),
# and under bf16 (8-bit mantissa) the flow too: the same rule as Piper's VITS (docs/precision.md).
SYNTH_FP32: dict[torch.dtype, tuple[str, ...]] = {
    torch.float32: (),
    torch.float16: ("enc_p", "dp", "sdp", "emb_g"),
    torch.bfloat16: ("enc_p", "dp", "sdp", "emb_g", "flow"),
}

DEFAULT_STYLE = "Neutral"
# SBV2's defaults (its constants.py): what a request that sets nothing gets
DEFAULT_NOISE, DEFAULT_NOISE_W, DEFAULT_SDP_RATIO, DEFAULT_STYLE_WEIGHT = 0.6, 0.8, 0.2, 1.0
# One unit's text: the synthesizer's attention is quadratic in its phones, so longer sentences
# are cut (at 、 , ; first, then anywhere).
MAX_SENTENCE_CHARS = 200
# The most frames one sentence may make, whatever its seconds: the flow's attention work grows
# with frames squared (its memory is linear: model.SCORE_BLOCK), so a model with a small hop
# would otherwise take minutes of both cores per sentence. A real model (hop 512, 44.1 kHz) makes
# 10336 frames at the 120 s sentence limit: this cap binds only models with a smaller hop.
MAX_SENTENCE_FRAMES = 10800
# A low estimate of audio per symbol id (blanks included) at speed 1: refuse only clear excess.
_SECONDS_PER_ID = 0.01
_JP_END = re.compile(r"(?<=[。！？!?．])")
_JP_CLAUSE = re.compile(r"(?<=[、，,;；])")


@dataclass(frozen=True, eq=False)
class Sbv2Item:
    """One sentence's synthesizer input (host side until the features arrive)."""

    phone_ids: tuple[int, ...]
    tone_ids: tuple[int, ...]
    language_ids: tuple[int, ...]
    language: str  # the BERT language of its features
    sid: int
    style_vec: np.ndarray  # float32 [256]
    length_scale: float
    noise_scale: float
    noise_w: float
    sdp_ratio: float
    seed: int
    max_frames: int
    bert: torch.Tensor | None = field(default=None, repr=False)  # [1024, T] on the voice's device
    words: tuple[tuple[str, int, int], ...] = ()
    """(word, first id, end id) of each spoken word of the sentence, for its timestamps."""


def split_text(text: str, language: str) -> list[str]:
    """Sentences of `text`: lines, then sentence ends (JP: 。！？!? wherever they stand), each cut
    to MAX_SENTENCE_CHARS."""
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if language == "JP":
            for s in (p.strip() for p in _JP_END.split(line)):
                if s:
                    out += _cut(s)
        else:
            for s in split_sentences(line):
                out += split_long(s, MAX_SENTENCE_CHARS, len)
    return out


def _cut(sentence: str) -> list[str]:
    if len(sentence) <= MAX_SENTENCE_CHARS:
        return [sentence]
    out, cur = [], ""
    for clause in _JP_CLAUSE.split(sentence):
        while len(clause) > MAX_SENTENCE_CHARS:
            if cur:
                out.append(cur)
                cur = ""
            out.append(clause[:MAX_SENTENCE_CHARS])
            clause = clause[MAX_SENTENCE_CHARS:]
        if len(cur) + len(clause) > MAX_SENTENCE_CHARS:
            out.append(cur)
            cur = ""
        cur += clause
    if cur:
        out.append(cur)
    return [s for s in (c.strip() for c in out) if s]


class _Words:
    """`.tokenize` for the front end: the BERT's own locked word split."""

    def __init__(self, bert: SbvBert):
        self.tokenize = bert.tokenize_words


class Sbv2Voice(Voice):
    """A Style-Bert-VITS2 voice (JP-Extra or multilingual) with shared BERTs."""

    family = "sbv2"
    word_timestamps = True

    can_unload = True

    def __init__(self, name: str, ckpt: Sbv2Checkpoint, berts: Mapping[str, SbvBert],
                 device: torch.device, dtype: torch.dtype = torch.float32):
        self.name = name
        self.checkpoint = ckpt
        self.dims = ckpt.dims  # what the front end needs of the model, kept while it is unloaded
        self.device = device
        self.dtype = dtype
        self.model: torch.nn.Module | None = self._place(ckpt.model)
        self.sample_rate = ckpt.sample_rate
        self.jp_extra = ckpt.jp_extra
        self.berts = dict(berts)
        for b in self.berts.values():
            b.acquire(self)
        self._tokenizers = {lang: _Words(b) for lang, b in self.berts.items()}
        self._spk = sorted(ckpt.spk2id.items(), key=lambda kv: kv[1])
        self._styles = sorted(ckpt.style2id.items(), key=lambda kv: kv[1])
        self.default_language = "JP" if "JP" in self.berts else next(iter(self.berts))

    def __repr__(self) -> str:
        kind = "JP-Extra" if self.jp_extra else "multilingual"
        return f"Sbv2Voice({self.name!r}, {kind}, device={self.device}, languages={self.languages})"

    def _place(self, model: torch.nn.Module) -> torch.nn.Module:
        return apply_precision(model.to(self.device), PrecisionPolicy(self.dtype, SYNTH_FP32[self.dtype]))

    # ------------------------------------------------------------------ idle unload
    @property
    def loaded(self) -> bool:
        return self.model is not None

    def unload(self) -> None:
        """Voice.unload: its synthesizer goes, and each shared BERT that no other loaded SBV2
        voice uses (SbvBert.release); the front end (tokenizers, style vectors) stays."""
        if self.model is None:
            return
        self.model = None
        self.checkpoint = replace(self.checkpoint, model=None)
        for b in self.berts.values():
            b.release(self)
        gc.collect()  # the model's modules hold reference cycles
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        release_free_memory()

    def reload(self) -> None:
        if self.model is not None:
            return
        for b in self.berts.values():
            b.acquire(self)
        ckpt = load_sbv2_checkpoint(self.checkpoint.folder, self.checkpoint.weights_path)
        self.checkpoint, self.model = ckpt, self._place(ckpt.model)

    # ------------------------------------------------------------------ what it offers
    @property
    def speakers(self) -> list[str]:
        return [n for n, _ in self._spk]

    @property
    def styles(self) -> list[str]:
        return [n for n, _ in self._styles]

    @property
    def languages(self) -> list[str]:
        return list(self.berts)

    @property
    def language_codes(self) -> list[str]:
        return language_codes(self.languages)  # check_language takes these tags as well

    def components(self) -> Mapping[Hashable, SharedComponent]:
        return {b.key: b for b in self.berts.values()}

    def speaker_id(self, speaker: int | str | None) -> int:
        n = self.dims.n_speakers
        if speaker is None:
            return self._spk[0][1] if self._spk else 0
        if isinstance(speaker, str):
            if speaker in self.checkpoint.spk2id:
                return self.checkpoint.spk2id[speaker]
            if not speaker.isdigit():
                raise UnknownSpeakerError(speaker, self.name, self.speakers or n)
            speaker = int(speaker)
        if not 0 <= speaker < n:
            raise UnknownSpeakerError(speaker, self.name, self.speakers or n)
        return speaker

    def style_id(self, style: int | str | None) -> int:
        n = len(self.checkpoint.style_vectors)
        if style is None:
            return self.checkpoint.style2id.get(DEFAULT_STYLE, 0)
        if isinstance(style, str):
            if style in self.checkpoint.style2id:
                return self.checkpoint.style2id[style]
            if not style.isdigit():
                raise InvalidOptionError("style", f"unknown style {style!r}; this voice has: "
                                                  f"{', '.join(self.styles) or f'ids 0..{n - 1}'}")
            style = int(style)
        if not 0 <= style < n:
            raise InvalidOptionError("style", f"style id {style} out of range: this voice has {n} styles")
        return style

    def language_of(self, language: str | None) -> str:
        if language is None:
            return self.default_language
        try:
            lang = check_language(language)
        except UnsupportedLanguageError as e:
            raise InvalidOptionError("language", str(e)) from None
        if lang not in self.berts:
            why = ("a JP-Extra model speaks Japanese only" if self.jp_extra else
                   f"voxserve has no {lang} front end" if lang not in FRONTEND_LANGUAGES else
                   f"its BERT ({BERT_FOLDERS[lang]}) was not found under the BERT folder")
            raise InvalidOptionError("language", f"voice {self.name!r} cannot speak {lang}: {why} "
                                                 f"(it speaks {', '.join(self.languages)})")
        return lang

    # ------------------------------------------------------------------ seams
    def units(self, text: str, options: SynthesisOptions | None = None) -> Iterator[Unit]:
        check_text(text)
        opts = Sbv2Options.of(options)
        lang = self.language_of(opts.language)
        sid = self.speaker_id(opts.speaker)
        sv = style_vector(self.checkpoint.style_vectors, self.style_id(opts.style),
                          DEFAULT_STYLE_WEIGHT if opts.style_weight is None else opts.style_weight)
        length = 1.0 / (opts.speed if opts.speed is not None else 1.0)
        noise = DEFAULT_NOISE if opts.noise_scale is None else opts.noise_scale
        noise_w = DEFAULT_NOISE_W if opts.noise_w is None else opts.noise_w
        sdp = DEFAULT_SDP_RATIO if opts.sdp_ratio is None else opts.sdp_ratio
        max_frames = min(self.limits.max_sentence_samples(self.sample_rate) // self.dims.hop_length,
                         MAX_SENTENCE_FRAMES)
        bert = self.berts[lang]
        sentences = split_text(text, lang)

        def gen() -> Iterator[Unit]:
            n = 0
            for s in sentences:
                st = sentence_text(s, lang, self._tokenizers[lang], use_jp_extra=self.jp_extra,
                                   add_blank=self.checkpoint.add_blank)
                if not any(ch.isalnum() for ch in st.bert_text):
                    continue  # punctuation only: nothing to say
                ids = st.inputs
                item = Sbv2Item(tuple(ids.phone_ids), tuple(ids.tone_ids), tuple(ids.language_ids), lang,
                                sid, sv, length, noise, noise_w, sdp, sentence_seed(opts.seed, n), max_frames,
                                words=self._word_spans(st, lang))
                yield Unit(n, s, len(ids.phone_ids), item, len(ids.phone_ids) * _SECONDS_PER_ID * length,
                           component=bert.key, component_input=(st.bert_text, tuple(ids.word2ph)))
                n += 1
            if n == 0:
                raise UnpronounceableTextError(text)

        silence = self.silence_after(opts)
        return limited(gen(), self.limits, sentences if silence else (), silence)

    def with_component_output(self, unit: Unit, output: Any) -> Unit:
        if isinstance(output, BaseException):
            raise output  # this sentence's BERT input did not fit: its request fails, alone
        item: Sbv2Item = unit.payload
        if output.shape != (BERT_DIM, len(item.phone_ids)):
            raise ValueError(f"SBV2 BERT features {tuple(output.shape)} for {len(item.phone_ids)} phones")
        return replace(unit, component=None, component_input=None, payload=replace(item, bert=output))

    def run_units(self, units: Sequence[Unit], early: Sequence[int] = (),
                  on_early: Callable[[int, np.ndarray], None] | None = None) -> list[np.ndarray]:
        out = self._synthesize([u.payload for u in units])
        for a in out:
            if isinstance(a, BaseException):
                raise a
        return out

    def run_pieces(self, units: Sequence[Unit], early: Sequence[int] = (),
                   max_cost: int | None = None, spare: bool = False) -> list[Piece]:
        """Whole sentences (SBV2 is not cut); a sentence over the sentence limit fails alone
        (`Piece.failed`: its AudioTooLongError), its batch mates are not affected."""
        items = [u.payload for u in units]
        frame_s = self.dims.hop_length / self.sample_rate
        return [Piece.failed(a) if isinstance(a, BaseException) else Piece(a, None, _word_times(it.words, d, frame_s))
                for it, (a, d) in zip(items, self._synthesize_timed(items))]

    def warmup(self) -> None:
        self.synthesize("こんにちは。" if self.default_language == "JP" else "Hello.",
                        SynthesisOptions(seed=0))

    # ------------------------------------------------------------------ the model
    def _word_spans(self, st, lang: str) -> tuple[tuple[str, int, int], ...]:
        """The sentence's words and the ids that say them. word2ph (after add_blank) counts the
        ids of each BERT token, [CLS] and [SEP] included; a word is its tokens: EN groups the
        DeBERTa pieces as the g2p does, JP takes pyopenjtalk's words (the g2p's own pass again:
        the front end returns only their concatenation)."""
        tok = self._tokenizers[lang]
        if lang == "EN":
            groups = [("".join(w), len(w)) for w in english.text_to_words(tok.tokenize(st.norm_text))]
        else:
            _, _, _, words = japanese.g2p_words(st.norm_text, tok, use_jp_extra=self.jp_extra)
            groups = [(w, 1 if w in japanese._PUNCT else len(tok.tokenize(w))) for w in words]
        w2p = st.inputs.word2ph
        if sum(n for _, n in groups) + 2 != len(w2p):
            return ()  # the tokens do not line up with word2ph: no timestamps for this sentence
        ends = np.cumsum([0, *w2p])
        out, k = [], 1  # token 0 is [CLS]
        for word, n in groups:
            if any(ch.isalnum() for ch in word):
                out.append((word, int(ends[k]), int(ends[k + n])))
            k += n
        return tuple(out)

    def _synthesize(self, items: Sequence[Sbv2Item]) -> list[np.ndarray | BaseException]:
        return [a for a, _ in self._synthesize_timed(items)]

    def _synthesize_timed(self, items: Sequence[Sbv2Item]) -> list[tuple[np.ndarray | BaseException, np.ndarray]]:
        # On a CPU a padded synthesizer batch costs more than it saves (its convolutions already
        # fill the cores at batch 1, and padding adds work): sentences run one by one there,
        # their BERT still batched (docs/sbv2.md, "Speed").
        if self.device.type == "cpu" and len(items) > 1:
            return [r for it in items for r in self._synthesize_batch_timed([it])]
        return self._synthesize_batch_timed(items)

    def _synthesize_batch(self, items: Sequence[Sbv2Item]) -> list[np.ndarray | BaseException]:
        """One padded synthesizer batch: audio per item (what a GPU runs)."""
        return [a for a, _ in self._synthesize_batch_timed(items)]

    @torch.inference_mode()
    def _synthesize_batch_timed(self, items: Sequence[Sbv2Item]) -> list[tuple[np.ndarray | BaseException, np.ndarray]]:
        """-> per item, its audio (or its over-limit error) and its ids' durations (frames, from
        the forward that made the audio)."""
        if any(it.bert is None for it in items):
            raise RuntimeError("SBV2 units reached the synthesizer without BERT features "
                               "(run them through resolve_components or the engine)")
        b, t = len(items), max(len(it.phone_ids) for it in items)
        dev = self.device
        x = torch.zeros(b, t, dtype=torch.long)  # 0 = pad (SBV2's blank)
        tone, lang = torch.zeros_like(x), torch.zeros_like(x)
        for i, it in enumerate(items):
            n = len(it.phone_ids)
            x[i, :n] = torch.tensor(it.phone_ids)
            tone[i, :n] = torch.tensor(it.tone_ids)
            lang[i, :n] = torch.tensor(it.language_ids)
        bert: dict[str, torch.Tensor] = {}
        for i, it in enumerate(items):  # the features never leave the device
            feats = bert.get(it.language)
            if feats is None:
                feats = bert[it.language] = torch.zeros(b, BERT_DIM, t, device=dev, dtype=torch.float32)
            feats[i, :, : it.bert.shape[1]] = it.bert.to(device=dev, dtype=torch.float32)
        out = self.model.infer(
            x.to(dev), torch.tensor([len(it.phone_ids) for it in items]).to(dev), tone.to(dev), lang.to(dev),
            bert, torch.from_numpy(np.stack([it.style_vec for it in items])).to(dev),
            torch.tensor([it.sid for it in items]),
            noise_scale=[it.noise_scale for it in items], length_scale=[it.length_scale for it in items],
            noise_scale_w=[it.noise_w for it in items], sdp_ratio=[it.sdp_ratio for it in items],
            seeds=[it.seed for it in items], max_frames=[it.max_frames for it in items],
        )
        wave = out.wave[:, 0].float().cpu().numpy()  # [B, S_max]: the audio, not features
        lengths = out.wave_lengths.tolist()
        durations = out.durations.float().cpu().numpy()  # [B, T], small
        return [(self._over_limit(out.predicted_frames[i]) if i in out.over_limit else wave[i, : lengths[i]].copy(),
                 durations[i, : len(items[i].phone_ids)]) for i in range(b)]

    def _over_limit(self, frames: int) -> AudioTooLongError:
        """The error of a sentence predicted at `frames`: the seconds limit's, else the frame cap's."""
        frame_s = self.dims.hop_length / self.sample_rate
        if frames * frame_s > self.limits.max_sentence_audio_seconds:
            return self.limits.sentence_error(frames * frame_s)
        return AudioTooLongError("a sentence", frames * frame_s, MAX_SENTENCE_FRAMES * frame_s,
                                 f"this model's {MAX_SENTENCE_FRAMES} frames per sentence")


def bert_root(bert_dir: str | os.PathLike | None) -> Path:
    """The BERT folder: `bert_dir`, else $VOXSERVE_SBV2_BERT_DIR; VoiceLoadError if neither."""
    root = bert_dir if bert_dir is not None else os.environ.get(BERT_DIR_ENV) or None
    if root is None:
        raise VoiceLoadError(
            "an SBV2 voice needs its BERT folder (laid out like SBV2's bert/: one Hugging Face folder "
            f"per BERT, e.g. {BERT_FOLDERS['JP']}/): load_voice(..., bert_dir=DIR), --bert-dir DIR, "
            f"or {BERT_DIR_ENV}=DIR")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise VoiceLoadError(f"SBV2 BERT folder not found: {root}")
    return root


def load_sbv2_voice(model_dir: str | os.PathLike, *, bert_dir: str | os.PathLike | None = None,
                    name: str | None = None, device: str = "auto", dtype: str | None = None,
                    bert_batch: int | None = None) -> Sbv2Voice:
    """An SBV2 model folder (config.json, one *.safetensors, style_vectors.npy) and the BERT
    folder -> Sbv2Voice. JP-Extra needs the JP BERT; a multilingual model loads each BERT of
    JP and EN found under the folder (at least one). `dtype` (fp32; bf16; fp16 on CUDA) is the
    BERTs' and, under SYNTH_FP32, the synthesizer's. BERTs are shared with every SBV2 voice on
    the device."""
    folder = Path(model_dir).expanduser()
    dev = normalise_device(device)
    synth_dtype = resolve_dtype(dtype, dev)
    root = bert_root(bert_dir)
    ckpt = load_sbv2_checkpoint(folder)
    kw = {} if bert_batch is None else {"max_batch": bert_batch}
    berts: dict[str, SbvBert] = {}
    if ckpt.jp_extra:
        berts["JP"] = shared_bert(root, "JP", dev, dtype, **kw)
    else:
        for lang in FRONTEND_LANGUAGES:
            if (root / BERT_FOLDERS[lang] / "config.json").is_file():
                berts[lang] = shared_bert(root, lang, dev, dtype, **kw)
        if not berts:
            raise VoiceLoadError(f"{root}: no BERT for a language voxserve speaks (a folder "
                                 f"{BERT_FOLDERS['JP']}/ or {BERT_FOLDERS['EN']}/ with config.json)")
    return Sbv2Voice(name or folder.name, ckpt, berts, dev, synth_dtype)


def _word_times(spans: Sequence[tuple[str, int, int]], durations: np.ndarray, frame_s: float) -> tuple[Word, ...]:
    """(word, first id, end id) spans timed by the ids' durations -> seconds from the start."""
    ends = np.concatenate([[0], np.cumsum(durations.astype(np.int64))])
    return tuple(Word(w, float(ends[lo]) * frame_s, float(ends[hi]) * frame_s)
                 for w, lo, hi in spans if ends[hi] > ends[lo])
