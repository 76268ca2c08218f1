"""VitsVoice: a Piper (VITS) voice behind the Voice API."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...audio import silence_samples
from ...errors import UnknownSpeakerError, UnpronounceableTextError
from ...options import SynthesisOptions
from ...runtime.allocator import release_free_memory
from ...text.aligned import Aligned
from ...text.frontend import TextFrontend, check_text
from ...text.split import split_sentences
from ...text.ssml import Break, Span
from ...voice import Piece, Unit, Voice, limited, sentence_seed
from .config import VoiceConfig
from .synthesis import PiperOptions
from .words import SourceWords, WordSpan, word_spans, word_times


@dataclass(frozen=True)
class VitsUnit(Unit):
    """A Piper sentence: a Unit with the phoneme-id span of each of its words."""

    spans: tuple[WordSpan, ...] = ()


class VitsVoice(Voice):
    """A Piper (VITS) voice running on voxserve's PyTorch model."""

    family = "piper"
    word_timestamps = True

    can_unload = True

    def __init__(self, config, runner, frontend: TextFrontend, source_path=None, config_path=None,
                 loader: Callable[..., "VitsVoice"] | None = None):
        assert isinstance(config, VoiceConfig)
        self.config = config
        self.name = config.name
        self.sample_rate = config.sample_rate
        self.runner = runner
        self.frontend = frontend
        self.source_path = source_path
        self.config_path = config_path
        self._loader = loader  # load_piper_voice, given by the loader (which imports this module)
        self._unloaded: _Unloaded | None = None  # what `reload` needs while the runner is gone

    def __repr__(self) -> str:
        return f"VitsVoice({self.name!r}, device={self.device}, sample_rate={self.sample_rate})"

    @property
    def device(self):
        return self.runner.device if self._unloaded is None else self._unloaded.device

    @property
    def concurrent_runs(self) -> bool:
        return self.runner.concurrent_runs if self._unloaded is None else self._unloaded.concurrent_runs

    # ---------------------------------------------------------------- idle unload
    @property
    def loaded(self) -> bool:
        return self._unloaded is None

    def unload(self) -> None:
        """Voice.unload: the runner (weights, stages, CUDA graphs) goes; the front end stays."""
        import torch

        if self._unloaded is not None:
            return
        if self.source_path is None or self._loader is None:
            raise NotImplementedError(f"voice {self.name!r} was not loaded from a file: it cannot reload")
        r = self.runner
        self._unloaded = _Unloaded(r.device, r.dtype, r.config, r.concurrent_runs)
        self.runner = None
        del r
        gc.collect()  # the model's modules hold reference cycles
        if self._unloaded.device.type == "cuda":
            torch.cuda.empty_cache()
        release_free_memory()

    def reload(self) -> None:
        u = self._unloaded
        if u is None:
            return
        fresh = self._loader(self.source_path, self.config_path, name=self.config.name, device=u.device,
                                 dtype=u.dtype, runtime=u.options)
        self.runner = fresh.runner
        self._unloaded = None

    @property
    def speakers(self) -> list[str]:
        return self.config.speakers

    @property
    def language_codes(self) -> list[str]:
        return self.config.language_codes

    def speaker_id(self, speaker: int | str | None) -> int:
        c = self.config
        if speaker is None:
            return c.default_speaker_id if c.num_speakers > 1 else 0
        if isinstance(speaker, str):
            if speaker in c.speaker_id_map:
                return c.speaker_id_map[speaker]
            if speaker.isdigit():
                speaker = int(speaker)
            else:
                raise UnknownSpeakerError(speaker, self.name, c.speakers or c.num_speakers)
        if not 0 <= speaker < max(c.num_speakers, 1) or (c.num_speakers <= 1 and speaker != 0):
            raise UnknownSpeakerError(speaker, self.name, c.speakers or c.num_speakers)
        return speaker

    def units(self, text: str, options: SynthesisOptions | None = None) -> Iterator[Unit]:
        check_text(text)
        opts = PiperOptions.of(options)
        self.speaker_id(opts.speaker)  # unknown speaker: fail now, not mid-stream
        spoken = opts.normalize is not False  # None (unset) reads numbers, dates, ... as words
        doc = self.frontend.document(text, opts.input_format)  # malformed SSML: fail now
        said = [span.text for span in doc if isinstance(span, Span)]  # the text without its markup
        aligned = [self.frontend.normalize_aligned(t, spoken) for t in said]
        normalized = [a.text for a in aligned]
        # word timestamps name the request's own tokens
        source = SourceWords(" ".join(said), Aligned.join(" ", aligned, said))
        id_map = self.frontend.to_ids.id_map

        silence = self.silence_after(opts)
        gap = silence_samples(silence, self.sample_rate)  # the joiner puts it before every unit but the first
        # a unit of silence alone, with the sentence gap the joiner puts before it: SILENCE_UNIT_S
        lone = silence_samples(SILENCE_UNIT_S, self.sample_rate) - gap

        def gen() -> Iterator[Unit]:
            n, said, pause = 0, 0, 0.0  # units, sentences (their seeds), pending break seconds

            def lone_units() -> Iterator[Unit]:
                # a run of breaks goes out as units of at most SILENCE_UNIT_S, each made as it is
                # sent (a 1790 s run was one 158 MB array, then copied with the next sentence)
                nonlocal n, pause
                while pause > SILENCE_UNIT_S:
                    yield Unit(n, "", 1, Paused(lone, None), lone / self.sample_rate)
                    n, pause = n + 1, pause - SILENCE_UNIT_S

            for s in self.frontend.iter_document(doc, spoken):
                if isinstance(s, Break):  # SSML <break>: silence before the next sentence's audio
                    pause += s.seconds
                    continue
                yield from lone_units()
                item = self._item(s.ids, opts, said, s.rate)
                payload = Paused(silence_samples(pause, self.sample_rate), item) if pause else item
                yield VitsUnit(n, s.text, len(s.ids), payload,
                               len(s.ids) * self._SECONDS_PER_ID * item.length_scale + pause,
                               spans=source.respan(s.text, word_spans(s.text, s.phonemes, id_map)))
                n, said, pause = n + 1, said + 1, 0.0
            if said == 0:
                raise UnpronounceableTextError(text)
            yield from lone_units()
            if pause:  # a break after the last sentence: a unit of silence alone
                yield Unit(n, "", 1, Paused(silence_samples(pause, self.sample_rate), None), pause)

        split = [p for t in normalized for p in split_sentences(t)] if silence else ()
        return limited(gen(), self.limits, split, silence)

    def predicted_audio_s(self, text: str, options: SynthesisOptions | None = None) -> float:
        """Voice.predicted_audio_s over the text without its markup, plus its SSML breaks (a
        whole answer of breaks holds their silence: issue 49's 1790 s from 3.4 KB)."""
        opts = PiperOptions.of(options)
        doc = self.frontend.document(text, opts.input_format)
        breaks = sum(b.seconds for b in doc if isinstance(b, Break))
        said = " ".join(span.text for span in doc if isinstance(span, Span))
        return super().predicted_audio_s(said, opts) + breaks

    # A low estimate of the audio per phoneme id at length scale 1, below what Piper voices make
    # over ordinary sentences (docs/benchmarks.md, "Figures behind the code's defaults"), so
    # predictions refuse only clear excess.
    _SECONDS_PER_ID = 0.02

    def run_units(self, units: Sequence[Unit], early: Sequence[int] = (),
                  on_early: Callable[[int, np.ndarray], None] | None = None) -> list[np.ndarray]:
        from .runner import FramesOverLimit

        if any(isinstance(u.payload, Paused) for u in units):
            return _run_paused_units(self, units, early, on_early)
        out = self.runner.run([u.payload for u in units], early, on_early)
        for a in out:
            if isinstance(a, FramesOverLimit):
                raise self._sentence_error(a)
        return out

    def run_pieces(self, units: Sequence[Unit], early: Sequence[int] = (),
                   max_cost: int | None = None, spare: bool = False) -> list[Piece]:
        """As Voice.run_pieces; a sentence over the sentence limit fails alone (`Piece.failed`:
        its AudioTooLongError; the batch's other sentences are not affected)."""
        if any(isinstance(u.payload, Paused) for u in units):
            return _run_paused_pieces(self, units, early, max_cost, spare)
        out = self.runner.run_pieces([u.payload for u in units], early, max_cost, spare)
        return [self._piece(u, r) for u, r in zip(units, out)]

    def _piece(self, u: Unit, r, silence: np.ndarray | None = None) -> Piece:
        """A runner result as a Piece with its words; `silence` (an SSML break) goes before the
        audio, and the words after it."""
        from .runner import FramesOverLimit

        audio, rest = r
        frame_s = self.runner.dims.hop_length / self.sample_rate  # seconds per duration frame
        # a sentence's first piece has its durations; a continuation (a Unit) has no spans
        words = () if r.durations is None else word_times(getattr(u, "spans", ()), r.durations, frame_s)
        if isinstance(audio, FramesOverLimit):
            return Piece.failed(self._sentence_error(audio))
        if silence is not None and len(silence):
            audio = np.concatenate([silence, audio])
            offset = len(silence) / self.sample_rate
            words = tuple(replace(w, start=w.start + offset, end=w.end + offset) for w in words)
        return Piece(audio, None if rest is None else Unit(u.index, u.text, rest.cost, rest), words)

    def _sentence_error(self, e):
        return self.limits.sentence_error(e.frames * self.runner.dims.hop_length / self.sample_rate)

    def warmup(self) -> None:
        """CUDA: capture the graph grid; CPU: one sentence through every stage (runner.warmup)."""
        self.runner.warmup()

    def synthesize_ids(self, ids: Sequence[Sequence[int]], options: SynthesisOptions | None = None) -> list[np.ndarray]:
        """Phoneme ids -> audio, skipping the text front end (for parity tests and tools)."""
        opts = PiperOptions.of(options)
        units = [
            Unit(i, "", len(x), self._item(x, opts, i)) for i, x in enumerate(ids)
        ]
        return self.run_units(units)

    def _item(self, ids: Sequence[int], opts: PiperOptions, index: int, rate: float = 1.0):
        from .runner import VitsItem

        c = self.config
        return VitsItem(
            tuple(ids),
            c.length_scale / ((opts.speed if opts.speed is not None else 1.0) * rate),
            c.noise_scale if opts.noise_scale is None else opts.noise_scale,
            c.noise_w if opts.noise_w is None else opts.noise_w,
            self.speaker_id(opts.speaker),
            sentence_seed(opts.seed, index),
            self.limits.max_sentence_samples(self.sample_rate) // self.runner.dims.hop_length,
        )


@dataclass(frozen=True)
class _Unloaded:
    """An unloaded voice's runner settings: where and how `reload` loads it again."""

    device: Any
    dtype: Any
    options: Any  # the runner's RuntimeOptions
    concurrent_runs: bool


# The most silence one unit holds (with the sentence silence before it): longer runs of SSML
# breaks are cut into units of this, each an array of its own as the request streams.
SILENCE_UNIT_S = 20.0  # over sentence_silence's 10 s maximum, so a lone unit is never empty


@dataclass(frozen=True)
class Paused:
    """A unit's payload with silence before its audio (SSML `<break>`): `item` is the model
    input (a VitsItem), None for a unit of silence alone (a break after the last sentence)."""

    samples: int
    item: object | None


def _split_paused(units: Sequence[Unit]) -> tuple[list[int], list]:
    """Positions of the units the model runs, and their model inputs."""
    pos = [k for k, u in enumerate(units) if not (isinstance(u.payload, Paused) and u.payload.item is None)]
    return pos, [u.payload.item if isinstance(u.payload, Paused) else u.payload for u in (units[k] for k in pos)]


def _silence(u: Unit) -> np.ndarray:
    return np.zeros(u.payload.samples if isinstance(u.payload, Paused) else 0, np.float32)


def _run_paused_units(voice: VitsVoice, units: Sequence[Unit], early, on_early) -> list[np.ndarray]:
    """run_units with the silence of Paused units before their audio (in the early head when
    there is one)."""
    from .runner import FramesOverLimit

    pos, items = _split_paused(units)
    at = {k: j for j, k in enumerate(pos)}
    headed: set[int] = set()

    def head(j: int, samples: np.ndarray) -> None:
        headed.add(pos[j])
        on_early(pos[j], np.concatenate([_silence(units[pos[j]]), samples]))

    out = voice.runner.run(items, [at[k] for k in early if k in at], head if on_early else None) if items else []
    result = []
    for k, u in enumerate(units):
        if k not in at:
            result.append(_silence(u))
            continue
        a = out[at[k]]
        if isinstance(a, FramesOverLimit):
            raise voice._sentence_error(a)
        result.append(a if k in headed else np.concatenate([_silence(u), a]))
    return result


def _run_paused_pieces(voice: VitsVoice, units: Sequence[Unit], early, max_cost, spare: bool):
    """run_pieces with the silence of Paused units before their first piece."""
    pos, items = _split_paused(units)
    at = {k: j for j, k in enumerate(pos)}
    out = voice.runner.run_pieces(items, [at[k] for k in early if k in at], max_cost, spare) if items else []
    return [voice._piece(u, out[at[k]], _silence(u)) if k in at else Piece(_silence(u)) for k, u in enumerate(units)]
