"""CosyVoice 2 voices behind voxserve's Voice API.

A model folder (`cosyvoice2:DIR`, the official CosyVoice2-0.5B layout) is a voice whose
speakers are the folder's saved speakers (`spk2info.pt`); a saved zero-shot voice
(`voxserve voices add NAME --model cosyvoice2:DIR --prompt-wav F --prompt-text T`, see
store.py) is a voice of its own name on the same model. Every voice of one model folder on one
device shares the loaded model and one step runner, so the engine batches their requests
together.

    voice = voxserve.load_voice("cosyvoice2:/models/CosyVoice2-0.5B")
    voice.add_prompt("alice", wave, 16000, "the transcript of the recording")
    voice.synthesize("Hello there.", SynthesisOptions(speaker="alice", seed=1))

Per request: CosyOptions (synthesis.py): .speaker (a saved speaker or prompt), .seed (the
sampler's stream), .speed (0.25-4: the sentence's mel is stretched, so the sentence is made
whole, not in chunks), .normalize (English numbers and the like read out; default on),
.instructions, .cross_lingual.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import InvalidOptionError, UnknownSpeakerError, UnpronounceableTextError
from ...options import SynthesisOptions
from ...text.frontend import check_text
from ...text.normalize import normalize_unicode
from ...text.split import split_long, split_sentences
from ...text.spoken import normalize_text
from ...voice import Unit, Voice, limited, run_steps, sentence_seed
from .options import LANGUAGE_CODES
from .runner import CosyStepRunner
from .store import save_voice
from .synthesis import CosyOptions

CHARS_PER_SECOND = 14.0  # read English: ~150 words a minute
WIDE_CHAR_WEIGHT = 3  # a CJK character is about a syllable
COST_PER_CHAR = 2  # batching cost on the scale of a Piper voice's phoneme ids (see Bark's cost)
MAX_SENTENCE_TOKENS = 80  # upstream's paragraph split: text tokens per LM prompt at most
END_OF_PROMPT = "<|endofprompt|>"  # ends an instruction (a special token of the tokenizer)


@dataclass(frozen=True)
class CosyPrompt:
    """A speaker: what the prompt recording gives the language model and the flow."""

    name: str
    text_ids: torch.Tensor
    """[Tp] int64: the prompt's transcript as text tokens ([0] for a saved speaker without one:
    the LM then continues from the speaker alone, as upstream's cross-lingual mode)."""
    speech_tokens: torch.Tensor
    """[Ts] int64: the recording's speech tokens (25 a second)."""
    speech_feat: torch.Tensor
    """[Tm, 80] float32: its mel frames (50 a second, Tm = 2 Ts)."""
    embedding: torch.Tensor
    """[192] float32: its speaker embedding (CAM++)."""

    @property
    def n_speech_tokens(self) -> int:
        return int(self.speech_tokens.numel())


@dataclass(frozen=True)
class CosyItem:
    """One sentence for the step runner."""

    text: str
    text_ids: torch.Tensor
    """[N] int64."""
    prompt: CosyPrompt
    seed: int
    speed: float = 1.0
    min_tokens: int = 0
    max_tokens: int = 1
    """The language model's length bounds (speech tokens), from the text's token count."""
    max_audio_s: float | None = None
    """The sentence's audio limit (Limits.max_sentence_audio_seconds): a sentence whose speech
    tokens pass it is refused as soon as the language model has made one token too many."""
    lm_prompt_ids: torch.Tensor | None = None
    """[Np] int64: what the language model reads before the text instead of the speaker's
    transcript (instruct mode: the instructions and <|endofprompt|>; cross-lingual: nothing)."""
    lm_speech: bool = True
    """The language model continues the speaker's prompt speech tokens (false in the instruct
    and cross-lingual modes, as upstream's frontend_instruct2 / frontend_cross_lingual)."""


def speech_weight(text: str) -> int:
    """Length of `text` in Latin-character equivalents of speaking time."""
    return sum(WIDE_CHAR_WEIGHT if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def has_speech(text: str) -> bool:
    return any(unicodedata.category(ch)[0] in "LN" for ch in text)


def _latin(text: str) -> bool:
    letters = [ch for ch in text if ch.isalpha()]
    return bool(letters) and sum(ch.isascii() for ch in letters) >= 0.8 * len(letters)


class CosyVoice2Voice(Voice):
    """A voice of one loaded CosyVoice 2 model (see the module docstring)."""

    family = "cosyvoice2"
    word_timestamps = False

    def __init__(self, name: str, model, prompts: Mapping[str, CosyPrompt], default: str | None,
                 runner=None):
        self.name = name
        self.model = model  # a CosyModel (pipeline.py), shared by the model folder's voices
        self.sample_rate = model.sample_rate
        self._prompts = dict(prompts)
        self.default_speaker = default
        self._runner = runner
        self._loaded = True
        model.acquire(self)  # (loads the shared model again if every voice using it was unloaded)

    @property
    def device(self):
        """The model's device: the engine's worker of that device runs this voice."""
        return self.model.device

    # ---------------------------------------------------------------- idle unload
    can_unload = True

    @property
    def loaded(self) -> bool:
        return self._loaded

    def unload(self) -> None:
        """Voice.unload: this voice lets the shared model go (CosyModel.release: its weights
        are freed once no loaded voice of the folder uses them); its speakers' prompts, cloned
        ones included, and the tokenizer stay."""
        if self._loaded:
            self._loaded = False
            self.model.release(self)

    def reload(self) -> None:
        if not self._loaded:
            self.model.acquire(self)
            self._loaded = True

    # ---------------------------------------------------------------- speakers
    @property
    def speakers(self) -> list[str]:
        return sorted(self._prompts)

    @property
    def language_codes(self) -> list[str]:
        return list(LANGUAGE_CODES)

    def prompt(self, speaker: int | str | None) -> CosyPrompt:
        if speaker is None:
            speaker = self.default_speaker
            if speaker is None:
                raise UnknownSpeakerError("(none)", self.name, self.speakers or 0)
        if isinstance(speaker, str) and speaker in self._prompts:
            return self._prompts[speaker]
        if isinstance(speaker, int) and not isinstance(speaker, bool) and 0 <= speaker < len(self._prompts):
            return self._prompts[self.speakers[speaker]]
        raise UnknownSpeakerError(speaker, self.name, self.speakers or 0)

    clones = True

    def clone(self, name: str, wave: np.ndarray, sample_rate: int, text: str, folder: Path) -> Path:
        """A saved voice (store.py) of this model, and this voice's speaker `name` at once."""
        features = self.model.prompt_features(wave, sample_rate, text)
        path = save_voice(folder, name, self.model.folder, features)
        # copied, not changed in place: other threads iterate the speakers meanwhile
        self._prompts = {**self._prompts, name: self.model.prompt_from_features(name, features)}
        return path

    def forget(self, name: str) -> None:
        self._prompts = {k: p for k, p in self._prompts.items() if k != name}
        if self.default_speaker == name:
            self.default_speaker = next(iter(sorted(self._prompts)), None)

    def add_prompt(self, name: str, wave: np.ndarray, sample_rate: int, text: str) -> CosyPrompt:
        """A zero-shot speaker from a recording (0.5-30 s) and its transcript, for this voice's
        requests (`speaker=name`); computed once. store.save_voice keeps it across processes."""
        prompt = self.model.encode_prompt(name, wave, sample_rate, text)
        self._prompts[name] = prompt
        if self.default_speaker is None:
            self.default_speaker = name
        return prompt

    # ---------------------------------------------------------------- seams
    def units(self, text: str, options: SynthesisOptions | None = None) -> Iterator[Unit]:
        check_text(text)
        opts = CosyOptions.of(options)
        prompt = self.prompt(opts.speaker)
        speed = 1.0 if opts.speed is None else float(opts.speed)
        normalize = opts.normalize is not False
        if opts.instructions is not None and opts.cross_lingual:
            raise InvalidOptionError("cross_lingual", "instructions (instruct mode) and cross_lingual are two modes; "
                                     "set one of them")
        mode: dict = {}
        if opts.instructions is not None:
            mode = dict(lm_prompt_ids=torch.tensor(self.model.tokenize(opts.instructions + END_OF_PROMPT),
                                                   dtype=torch.long), lm_speech=False)
        elif opts.cross_lingual:
            mode = dict(lm_prompt_ids=torch.zeros(0, dtype=torch.long), lm_speech=False)

        def gen() -> Iterator[Unit]:
            n = 0
            for piece in self.sentences(text, normalize):
                ids = self.model.tokenize(piece)
                lo, hi = self.model.length_bounds(len(ids), len(prompt.text_ids))
                item = CosyItem(piece, torch.tensor(ids, dtype=torch.long), prompt, sentence_seed(opts.seed, n),
                                speed, lo, hi, max_audio_s=self.limits.max_sentence_audio_seconds, **mode)
                w = speech_weight(piece)
                yield Unit(n, piece, max(1, COST_PER_CHAR * w), item, w / CHARS_PER_SECOND / speed)
                n += 1
            if n == 0:
                raise UnpronounceableTextError(text)

        silence = self.silence_after(opts)
        split = split_sentences(normalize_unicode(text)) if silence else ()
        return limited(gen(), self.limits, split, silence)

    def sentences(self, text: str, normalize: bool = True) -> Iterator[str]:
        """Sentences of at most MAX_SENTENCE_TOKENS text tokens, lazily, in order. English text
        gets voxserve's spoken-form normalisation (numbers, dates, units read out) unless
        `normalize` is false; other text is passed as written (the model reads Chinese digits)."""
        text = normalize_unicode(text)
        if normalize and _latin(text):
            text = normalize_text(text)
        for sent in split_sentences(text):
            for piece in split_long(sent, MAX_SENTENCE_TOKENS, self.model.count_tokens):
                piece = piece.strip()
                if has_speech(piece):
                    yield piece

    def step_runner(self):
        """The model's CosyStepRunner, shared by every voice of this model on this device."""
        return self._runner

    def run_units(self, units: Sequence[Unit], early: Sequence[int] = (), on_early=None) -> list[np.ndarray]:
        # a runner of its own (not the engine's), all units joined at once
        runner = CosyStepRunner(self.model, capacity=max(1, len(units)),
                                streaming=self._runner.streaming if self._runner is not None else True)
        return run_steps(runner, units)

    def warmup(self) -> None:
        if self.default_speaker is not None:
            self.synthesize("Warm up.", SynthesisOptions(seed=0))
