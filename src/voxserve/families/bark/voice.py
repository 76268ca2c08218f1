"""Bark voices: a local `transformers` Bark checkpoint behind voxserve's Voice API.

A checkpoint directory is what `BarkModel.save_pretrained` + `BarkProcessor.save_pretrained`
write, or a downloaded `suno/bark-small` / `suno/bark` snapshot: config.json,
generation_config.json, weights (model.safetensors or pytorch_model.bin, possibly sharded),
the tokenizer (tokenizer.json or vocab.txt, tokenizer_config.json) and, optionally,
speaker_embeddings_path.json + speaker_embeddings/*.npy (the speaker presets). Speaker presets
may also be `.npz` files (semantic_prompt, coarse_prompt, fine_prompt) under `DIR/presets/`
(named by their path below it, without `.npz`) or given to `load_bark_voice(presets=...)`.
Nothing is ever downloaded.

    voice = voxserve.load_voice("bark:/models/bark-small")
    voice.synthesize("Hello there.", SynthesisOptions(speaker="v2/en_speaker_6", seed=1))

`load_voice` takes `runtime=BarkRuntimeOptions(...)` for how it runs (attention, CPU offload);
`load_bark_voice(..., config=BarkVoiceConfig(...))` changes a voice's defaults (temperatures,
sentence length). Per request: BarkOptions (synthesis.py): .speaker (a preset name), .seed,
.temperature.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...errors import InvalidOptionError, UnknownSpeakerError, UnpronounceableTextError, VoiceLoadError
from ...options import SynthesisOptions
from ...runtime.allocator import release_free_memory
from ...text.frontend import check_text
from ...text.normalize import normalize_unicode
from ...text.split import split_long, split_sentences
from ...voice import Unit, Voice, limited, run_steps, sentence_seed
from .options import BarkRuntimeOptions, BarkVoiceConfig
from .synthesis import BarkOptions

log = logging.getLogger(__name__)

# Read English speech runs at about 150 words a minute, ~14 characters a second with spaces.
# Wide (CJK) characters are each about a syllable: ~3 Latin characters' worth of time.
CHARS_PER_SECOND = 14.0
WIDE_CHAR_WEIGHT = 3
COST_PER_CHAR = 2  # batching cost per character: a Piper voice's phoneme ids per character (see cost)
SONG = "\u266a"  # ♪ marks singing for Bark: kept, although normalisation drops other symbols

PRESET_KEYS = {"semantic_prompt": 1, "coarse_prompt": 2, "fine_prompt": 2}  # key -> ndim
# ---------------------------------------------------------------------- text
def speech_weight(text: str) -> int:
    """Length of `text` in Latin-character equivalents of speaking time."""
    return sum(WIDE_CHAR_WEIGHT if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def normalize_bark_text(text: str) -> str:
    """Unicode/typographic normalisation, keeping Bark's ♪ (singing) marks."""
    parts = [normalize_unicode(p) for p in text.split(SONG)]
    out = f" {SONG} ".join(parts) if len(parts) > 1 else parts[0]
    return re.sub(r"[ \t]+", " ", out).strip()


def has_speech(text: str) -> bool:
    return any(unicodedata.category(ch)[0] in "LN" or ch == SONG for ch in text)


# ---------------------------------------------------------------------- checkpoint
def _weights_files(d: Path) -> list[str]:
    """The weight files the directory needs, or [] if it names none."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (d / index).exists():
            try:
                return sorted(set(json.loads((d / index).read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as e:
                raise VoiceLoadError(f"{d / index}: unreadable weight index ({e})") from e
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (d / single).exists():
            return [single]
    return []


def check_checkpoint(d: Path) -> dict:
    """Fail with a message naming what is missing; returns config.json's content."""
    if not d.exists():
        raise VoiceLoadError(f"Bark checkpoint directory not found: {d}")
    if not d.is_dir():
        raise VoiceLoadError(f"a Bark voice is a checkpoint directory, and {d} is not a directory")
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise VoiceLoadError(f"{d} is not a Bark checkpoint: config.json is missing "
                             "(expected what BarkModel.save_pretrained writes, or a suno/bark snapshot)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise VoiceLoadError(f"{cfg_path}: unreadable ({e})") from e
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    if model_type != "bark":
        raise VoiceLoadError(f"{d} is not a Bark checkpoint: config.json describes a "
                             f"{model_type!r} model, not 'bark'")
    missing = []
    weights = _weights_files(d)
    if not weights:
        missing.append("model weights (model.safetensors or pytorch_model.bin)")
    missing += [w for w in weights if not (d / w).exists()]
    if not (d / "generation_config.json").exists():
        missing.append("generation_config.json (Bark's semantic/coarse/fine generation settings)")
    if not (d / "tokenizer.json").exists() and not (d / "vocab.txt").exists():
        missing.append("the tokenizer (tokenizer.json or vocab.txt)")
    if not (d / "tokenizer_config.json").exists():
        missing.append("tokenizer_config.json")
    if missing:
        raise VoiceLoadError(f"incomplete Bark checkpoint {d}: missing " + "; ".join(missing))
    return cfg


def _inside(base: Path, rel: str) -> Path:
    p = (base / rel)
    if os.path.commonpath([os.path.abspath(base), os.path.abspath(p)]) != os.path.abspath(base):
        raise VoiceLoadError(f"speaker preset path {rel!r} points outside {base}")
    return p


def _check_preset(name: str, arrays: Mapping[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    out = {}
    for key, ndim in PRESET_KEYS.items():
        if key not in arrays:
            raise VoiceLoadError(f"speaker preset {name!r} ({where}): no {key}")
        a = np.asarray(arrays[key])
        if a.ndim != ndim or not np.issubdtype(a.dtype, np.integer):
            raise VoiceLoadError(f"speaker preset {name!r} ({where}): {key} must be a {ndim}-D integer array, "
                                 f"got shape {a.shape} {a.dtype}")
        out[key] = a.astype(np.int64)
    return out


def check_preset_fits(name: str, arrays: Mapping[str, np.ndarray], runner) -> None:
    """A preset's token ranges and codebook counts must be the model's (a preset made for
    another model would fail deep inside generation otherwise)."""
    limits = {
        "semantic_prompt": (None, runner.semantic_config.semantic_vocab_size),
        "coarse_prompt": (runner.n_coarse, runner.codebook_size),
        "fine_prompt": (runner.fine_config.n_fine_codebooks, runner.codebook_size),
    }
    for key, (rows, vocab) in limits.items():
        a = arrays[key]
        if rows is not None and a.shape[0] != rows:
            raise VoiceLoadError(f"speaker preset {name!r}: {key} has {a.shape[0]} codebooks, the model {rows}")
        if a.size and (a.min() < 0 or a.max() >= vocab):
            raise VoiceLoadError(f"speaker preset {name!r}: {key} has tokens outside 0..{vocab - 1} "
                                 f"(min {a.min()}, max {a.max()}): made for another model?")


def _index_entries(d: Path) -> tuple[dict[str, dict[str, Path]], list[str]]:
    """speaker_embeddings_path.json of a checkpoint: {name: {key: file}} of the presets whose
    files are all there, and the names of those listed without them."""
    index = d / "speaker_embeddings_path.json"
    if not index.exists():
        return {}, []
    try:
        entries = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise VoiceLoadError(f"{index}: unreadable ({e})") from e
    found, unavailable = {}, []
    for name, files in entries.items():
        if name == "repo_or_path":  # where transformers downloaded from; paths are relative to d
            continue
        if not isinstance(files, dict):
            raise VoiceLoadError(f"{index}: entry {name!r} is not a mapping of prompt files")
        paths = {k: _inside(d, str(files.get(k, ""))) for k in PRESET_KEYS}
        if all(k in files and p.is_file() for k, p in paths.items()):
            found[name] = paths
        else:
            unavailable.append(name)
    return found, unavailable


def _npz_presets(d: Path) -> list[tuple[str, Path]]:
    npz_dir = d / "presets"
    sources = sorted(npz_dir.rglob("*.npz")) if npz_dir.is_dir() else []
    return [(p.relative_to(npz_dir).with_suffix("").as_posix(), p) for p in sources]


def preset_names(d: Path) -> list[str]:
    """The names of the speaker presets `load_presets(d)` loads, without reading them, sorted."""
    return sorted(set(_index_entries(d)[0]) | {n for n, _ in _npz_presets(d)})


BARK_LANGUAGES = ("en", "de", "es", "fr", "hi", "it", "ja", "ko", "pl", "pt", "ru", "tr", "zh")
"""The languages Bark speaks (suno-ai/bark's README; its presets are named after them)."""
_PRESET_LANGUAGE = re.compile(r"(?:^|/)([a-z]{2,3})_speaker_\d+$")  # "v2/en_speaker_6" -> en


def language_codes(presets: Sequence[str]) -> list[str]:
    """A Bark voice's BCP-47 tags: the languages of its speaker presets ("v2/en_speaker_6" ->
    "en"), or Bark's languages if no preset is named after one (a checkpoint without presets
    speaks whatever language the text is in)."""
    found = [m.group(1) for n in presets if (m := _PRESET_LANGUAGE.search(n))]
    return list(dict.fromkeys(found)) or list(BARK_LANGUAGES)


def load_presets(d: Path, extra: Mapping[str, str | os.PathLike] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Speaker presets of a checkpoint directory: speaker_embeddings_path.json entries,
    DIR/presets/**/*.npz, then `extra` ({name: .npz path}); later sources win."""
    presets: dict[str, dict[str, np.ndarray]] = {}
    index = d / "speaker_embeddings_path.json"
    found, unavailable = _index_entries(d)
    for name, paths in found.items():
        presets[name] = _check_preset(name, {k: np.load(p, allow_pickle=False) for k, p in paths.items()}, str(index))
    if unavailable:
        shown = ", ".join(unavailable[:5]) + (" ..." if len(unavailable) > 5 else "")
        log.warning("%s: %d speaker presets listed without their files, left out: %s",
                    d, len(unavailable), shown)
    named = _npz_presets(d) + [(n, Path(p)) for n, p in (extra or {}).items()]
    for name, p in named:
        if not p.is_file():
            raise VoiceLoadError(f"speaker preset {name!r}: file not found: {p}")
        try:
            with np.load(p, allow_pickle=False) as z:
                presets[name] = _check_preset(name, {k: z[k] for k in z.files}, str(p))
        except (OSError, ValueError) as e:
            raise VoiceLoadError(f"speaker preset {name!r}: unreadable {p} ({e})") from e
    return presets


# ---------------------------------------------------------------------- voice
class BarkVoice(Voice):
    """A Bark checkpoint (transformers' BarkModel) behind the Voice API. 24 kHz."""

    family = "bark"

    def __init__(self, name: str, runner, config: BarkVoiceConfig, presets: Mapping[str, dict], source_path=None,
                 max_sequences: int = BarkRuntimeOptions.max_sequences, runtime: BarkRuntimeOptions | None = None):
        self.name = name
        self.max_sequences = max_sequences
        self.runner = runner
        self.config = config
        self._presets = dict(presets)
        self.source_path = source_path
        self.runtime = runtime  # how `reload` builds the runner again (None: not loaded from a folder)
        self._step_runner = None
        self._device, self._dtype = runner.device, runner.dtype
        self.sample_rate = int(runner.model.config.codec_config.sampling_rate)
        self.max_text_tokens = runner.max_text_tokens
        self._set_tokenizer(runner)
        if config.default_speaker is not None and config.default_speaker not in self._presets:
            raise UnknownSpeakerError(config.default_speaker, name, self.speakers or 0)

    def _set_tokenizer(self, runner) -> None:
        # the front end's tokenizer and its lock, kept while the runner is unloaded: the
        # runner's, so that the front end and the runner's batches never use it at once
        self.tokenizer, self._tokenizer_lock = runner.processor.tokenizer, runner.tokenizer_lock

    def __repr__(self) -> str:
        return f"BarkVoice({self.name!r}, device={self.device}, sample_rate={self.sample_rate})"

    @property
    def device(self):
        return self._device

    # ---------------------------------------------------------------- idle unload
    @property
    def can_unload(self) -> bool:  # type: ignore[override]
        return self.source_path is not None and self.runtime is not None

    @property
    def loaded(self) -> bool:
        return self.runner is not None

    def unload(self) -> None:
        """Voice.unload: the runner (BarkModel, the step runner's decoders) goes; the
        tokenizer and the speaker presets stay."""
        import torch  # (torch only once a voice loads: the CLI reads this module at start-up)

        if self.runner is None:
            return
        if not self.can_unload:
            raise NotImplementedError(f"voice {self.name!r} was not loaded from a folder: it cannot reload")
        if self._step_runner is not None:
            self._step_runner.bind(None)
        self.runner = None
        gc.collect()  # the model's modules hold reference cycles
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
        release_free_memory()

    def reload(self) -> None:
        if self.runner is not None:
            return
        model, processor = _read_checkpoint(self.source_path, self._dtype, self.runtime)
        fresh = bark_voice_from_model(model, processor, self.name, device=self._device, dtype=self._dtype,
                                      runtime=self.runtime, config=self.config, presets=self._presets,
                                      source_path=self.source_path)
        self._set_tokenizer(fresh.runner)
        self.runner = fresh.runner
        if self._step_runner is not None:  # the engine's worker keeps this instance
            self._step_runner.bind(self.runner)

    @property
    def speakers(self) -> list[str]:
        return sorted(self._presets)

    @property
    def language_codes(self) -> list[str]:
        return language_codes(self.speakers)

    def preset(self, name: str) -> dict[str, np.ndarray]:
        return self._presets[name]

    def resolve_speaker(self, speaker: int | str | None) -> str | None:
        """A preset name, an index into `speakers`, or None (the voice's default)."""
        if speaker is None:
            return self.config.default_speaker
        if isinstance(speaker, str) and speaker in self._presets:
            return speaker
        if isinstance(speaker, int) and 0 <= speaker < len(self._presets):
            return self.speakers[speaker]
        raise UnknownSpeakerError(speaker, self.name, self.speakers or 0)

    # ---------------------------------------------------------------- seams
    def units(self, text: str, options: SynthesisOptions | None = None) -> Iterator[Unit]:
        check_text(text)
        opts = BarkOptions.of(options)
        if opts.speed is not None and opts.speed != 1.0:
            raise InvalidOptionError("speed", "Bark voices speak at their own rate; only 1.0 is supported")
        speaker = self.resolve_speaker(opts.speaker)
        c = self.config
        if opts.temperature is None:
            temps = (c.semantic_temperature, c.coarse_temperature, c.fine_temperature)
        else:
            t = float(opts.temperature)
            temps = (t, t, c.fine_temperature if t > 0 else 0.0)

        def gen() -> Iterator[Unit]:
            n = 0
            for piece in self.sentences(text):
                item = self._item(piece, speaker, temps, sentence_seed(opts.seed, n))
                # Bark's audio per sentence is bounded by its generation window (about 14 s)
                yield Unit(n, piece, self.cost(piece), item, speech_weight(piece) / CHARS_PER_SECOND)
                n += 1
            if n == 0:
                raise UnpronounceableTextError(text)

        silence = self.silence_after(opts)
        split = split_sentences(normalize_bark_text(text)) if silence else ()
        return limited(gen(), self.limits, split, silence)

    def step_runner(self):
        """The voice's BarkStepRunner (step.py; one per voice, for the engine's worker); None
        with CPU offload on, whose one-stage-at-a-time weights fit one-shot batches only."""
        if self.runner.offload:
            return None
        if self._step_runner is None:
            from .step import BarkStepRunner

            self._step_runner = BarkStepRunner(self.runner, capacity=self.max_sequences)
        return self._step_runner

    def run_units(self, units: Sequence[Unit], early: Sequence[int] = (), on_early=None) -> list[np.ndarray]:
        # no early heads: a Bark sentence's audio comes out of three generation stages at once
        if self.runner.offload:
            return self.runner.run([u.payload for u in units])
        from .step import BarkStepRunner

        # a runner of its own (not the engine's), all units joined at once
        return run_steps(BarkStepRunner(self.runner, capacity=max(1, len(units))), units)

    # ---------------------------------------------------------------- text
    def sentences(self, text: str) -> Iterator[str]:
        """Sentences short enough for one generation, lazily, in order (pieces with nothing to
        say are skipped). Split at sentence ends, then (split_long) at clauses and words so that
        no piece is estimated over max_sentence_seconds nor over the prompt's token limit."""
        limit = max(1, int(self.config.max_sentence_seconds * CHARS_PER_SECOND))
        max_tokens = self.max_text_tokens
        for sent in split_sentences(normalize_bark_text(text)):
            for piece in split_long(sent, limit, speech_weight):
                for p in split_long(piece, max_tokens, self.count_tokens):
                    if has_speech(p):
                        yield p

    def count_tokens(self, text: str) -> int:
        with self._tokenizer_lock:  # see BarkRunner.tokenizer_lock
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def cost(self, text: str) -> int:
        """Batching cost, on the scale of a VITS voice's phoneme ids: COST_PER_CHAR per
        Latin-character equivalent. Bark's work grows with the speech it generates (about 3.6
        semantic tokens per character); a Piper voice's units cost about 2 ids per character
        (docs/serving.md, "Figures behind the engine's defaults"), so with 2 per character the
        engine's per-batch limit (`max_batch_phonemes`) holds about the same amount of text for
        either family (256: about 128 characters, two or three sentences)."""
        return max(1, COST_PER_CHAR * speech_weight(text))

    def _item(self, text: str, speaker: str | None, temps: tuple[float, float, float], seed: int):
        from .runner import BarkItem

        return BarkItem(text, speaker, temps, seed)

    def items(self, texts: Sequence[str], options: SynthesisOptions | None = None):
        """One BarkItem per text, as given (no splitting): for tests and tools."""
        units = [next(iter(self.units(t, options))) for t in texts]
        return [replace(u.payload, text=t) for u, t in zip(units, texts)]


# ---------------------------------------------------------------------- loading
def load_bark_voice(
    path: str | os.PathLike,
    name: str | None = None,
    device: str | None = "auto",
    dtype: str | None = None,
    runtime: BarkRuntimeOptions | None = None,
    config: BarkVoiceConfig | None = None,
    presets: Mapping[str, str | os.PathLike] | None = None,
) -> BarkVoice:
    """Load a local Bark checkpoint directory (never downloads).

    device: "auto", "cpu", "cuda", "cuda:N". dtype: None/"fp32"; "bf16" (CUDA or CPU); "fp16" needs CUDA.
    presets: extra speaker presets, {name: .npz path}.
    """
    d = Path(path).expanduser()
    runtime = (runtime or BarkRuntimeOptions()).validate()
    config = (config or BarkVoiceConfig()).validate()
    check_checkpoint(d)
    dev, dt = _device_and_dtype(device, dtype, runtime)
    voice_presets = load_presets(d, presets)
    model, processor = _read_checkpoint(d, dt, runtime)
    # named after the directory ("bark:." too; a symlink keeps its own name)
    vname = name if name and Path(name).expanduser() != d else Path(os.path.abspath(d)).name
    return bark_voice_from_model(model, processor, vname, device=dev, dtype=dt, runtime=runtime, config=config,
                                 presets=voice_presets, source_path=d)


def _read_checkpoint(d: Path, dt, runtime: BarkRuntimeOptions):
    """(BarkModel, BarkProcessor) of a checked checkpoint directory, in dtype `dt`."""
    BarkModel, BarkProcessor = _transformers_bark()
    attn = "flash_attention_2" if runtime.attention == "flash_attention_2" else "eager"
    try:
        model = BarkModel.from_pretrained(d, dtype=dt, attn_implementation=attn, local_files_only=True)
        # speaker presets are read by load_presets (paths checked, no hub look-ups)
        processor = BarkProcessor.from_pretrained(d, speaker_embeddings_dict_path=None, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise VoiceLoadError(f"{d}: cannot load the Bark checkpoint: {e}") from e
    return model, processor


def bark_voice_from_model(
    model,
    processor,
    name: str,
    device: str | None = "auto",
    dtype: str | None = None,
    runtime: BarkRuntimeOptions | None = None,
    config: BarkVoiceConfig | None = None,
    presets: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    source_path: Path | None = None,
) -> BarkVoice:
    """A BarkVoice around a BarkModel + BarkProcessor already built (load_bark_voice's second
    half; benchmarks use it for random-weight models built in memory). Applies the runtime
    options (attention, dtype, offload) and the voice defaults."""
    import torch

    from .model import set_bark_attention
    from .runner import BarkRunner

    runtime = (runtime or BarkRuntimeOptions()).validate()
    config = (config or BarkVoiceConfig()).validate()
    dev, dt = _device_and_dtype(device, dtype, runtime)
    if runtime.attention == "flash_attention_2" and model.config._attn_implementation != "flash_attention_2":
        raise ValueError("flash_attention_2 is chosen when the model is built (attn_implementation=...)")
    if dev.type == "cpu" and runtime.threads:
        torch.set_num_threads(runtime.threads)
    model.eval().requires_grad_(False)
    if next(model.parameters()).dtype != dt:
        model.to(dtype=dt)
    if runtime.attention in ("sdpa", "eager"):
        set_bark_attention(model, runtime.attention)
    # the voice's sentence-end rule goes into the semantic generation settings
    gc = model.generation_config
    if getattr(gc, "semantic_config", None) is not None:
        gc.semantic_config = {**gc.semantic_config, "min_eos_p": config.min_eos_p}
    voice_presets = dict(presets or {})
    try:
        runner = BarkRunner(model, processor, dev, dt, presets=lambda n: voice_presets[n],
                            offload=runtime.offload)
    except ValueError as e:
        raise VoiceLoadError(f"{source_path or name}: {e}") from e
    for preset_name, arrays in voice_presets.items():
        check_preset_fits(preset_name, arrays, runner)
    log.info("loaded Bark voice %s on %s (%s, attention %s%s)", name, dev, dt, runtime.attention,
             ", cpu offload" if runner.offload else "")
    return BarkVoice(name, runner, config, voice_presets, source_path=source_path,
                     max_sequences=runtime.max_sequences, runtime=runtime if source_path is not None else None)


def _device_and_dtype(device, dtype, runtime: BarkRuntimeOptions):
    import torch

    from ...runtime.device import resolve_device, resolve_dtype

    dev = resolve_device(device)  # on CUDA also fp32 without TF32 (docs/precision.md)
    dt = resolve_dtype(dtype, dev)
    if runtime.attention == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if dev.type != "cuda" or dt == torch.float32 or not is_flash_attn_2_available():
            raise ValueError("attention 'flash_attention_2' needs the flash-attn package, a CUDA device "
                             "and dtype fp16 or bf16")
    return dev, dt


def _transformers_bark():
    try:
        from transformers import BarkModel, BarkProcessor
    except ImportError as e:
        raise VoiceLoadError("Bark voices need transformers: pip install 'voxserve[bark]'") from e
    return BarkModel, BarkProcessor
