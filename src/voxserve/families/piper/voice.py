"""VitsVoice: a Piper (VITS) voice behind the Voice API."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import UnknownSpeakerError, UnpronounceableTextError
from ...options import SynthesisOptions
from ...text.frontend import TextFrontend, check_text
from ...text.split import split_sentences
from ...voice import Piece, Unit, Voice, limited, sentence_seed
from .words import SourceWords, WordSpan, word_spans, word_times


@dataclass(frozen=True)
class VitsUnit(Unit):
    """A Piper sentence: a Unit with the phoneme-id span of each of its words."""

    spans: tuple[WordSpan, ...] = ()


class VitsVoice(Voice):
    """A Piper (VITS) voice running on voxserve's PyTorch model."""

    family = "piper"
    word_timestamps = True

    def __init__(self, config, runner, frontend: TextFrontend, source_path=None):
        from .config import VoiceConfig

        assert isinstance(config, VoiceConfig)
        self.config = config
        self.name = config.name
        self.sample_rate = config.sample_rate
        self.runner = runner
        self.frontend = frontend
        self.source_path = source_path

    def __repr__(self) -> str:
        return f"VitsVoice({self.name!r}, device={self.runner.device}, sample_rate={self.sample_rate})"

    @property
    def device(self):
        return self.runner.device

    @property
    def concurrent_runs(self) -> bool:
        return self.runner.concurrent_runs

    @property
    def speakers(self) -> list[str]:
        return self.config.speakers

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
        opts = (options or SynthesisOptions()).validate()
        self.speaker_id(opts.speaker)  # unknown speaker: fail now, not mid-stream
        spoken = opts.normalize is not False  # None (unset) reads numbers, dates, ... as words
        normalized = self.frontend.normalize(text, spoken)
        # word timestamps name the request's own tokens
        source = SourceWords(text, normalized, lambda t: self.frontend.normalize(t, spoken))

        def gen() -> Iterator[Unit]:
            n = 0
            for n, s in enumerate(self.frontend.iter_sentences(text, spoken), start=1):
                item = self._item(s.ids, opts, n - 1)
                yield VitsUnit(n - 1, s.text, len(s.ids), item, len(s.ids) * self._SECONDS_PER_ID * item.length_scale,
                               spans=source.respan(s.text, word_spans(s.text, s.phonemes, self.frontend.to_ids.id_map)))
            if n == 0:
                raise UnpronounceableTextError(text)

        silence = self.silence_after(opts)
        split = split_sentences(normalized) if silence else ()
        return limited(gen(), self.limits, split, silence)

    # A low estimate of the audio per phoneme id at length scale 1, below what Piper voices make
    # over ordinary sentences (docs/benchmarks.md, "Figures behind the code's defaults"), so
    # predictions refuse only clear excess.
    _SECONDS_PER_ID = 0.02

    def run_units(self, units: Sequence[Unit], early: Sequence[int] = (),
                  on_early: Callable[[int, np.ndarray], None] | None = None) -> list[np.ndarray]:
        from .runner import FramesOverLimit

        out = self.runner.run([u.payload for u in units], early, on_early)
        for a in out:
            if isinstance(a, FramesOverLimit):
                raise self._sentence_error(a)
        return out

    def run_pieces(self, units: Sequence[Unit], early: Sequence[int] = (),
                   max_cost: int | None = None) -> list[tuple[np.ndarray | BaseException, Unit | None]]:
        """As Voice.run_pieces; a sentence over the sentence limit gets its AudioTooLongError in
        place of audio (the batch's other sentences are not affected)."""
        from .runner import FramesOverLimit

        out = self.runner.run_pieces([u.payload for u in units], early, max_cost)
        frame_s = self.runner.dims.hop_length / self.sample_rate  # seconds per duration frame
        pieces = []
        for u, r in zip(units, out):
            audio, rest = r
            # a sentence's first piece has its durations; a continuation (a Unit) has no spans
            words = () if r.durations is None else word_times(getattr(u, "spans", ()), r.durations, frame_s)
            pieces.append(Piece(self._sentence_error(audio) if isinstance(audio, FramesOverLimit) else audio,
                                None if rest is None else Unit(u.index, u.text, rest.cost, rest), words))
        return pieces

    def _sentence_error(self, e):
        return self.limits.sentence_error(e.frames * self.runner.dims.hop_length / self.sample_rate)

    def warmup(self) -> None:
        """CUDA: capture the graph grid; CPU: one sentence through every stage (runner.warmup)."""
        self.runner.warmup()

    def synthesize_ids(self, ids: Sequence[Sequence[int]], options: SynthesisOptions | None = None) -> list[np.ndarray]:
        """Phoneme ids -> audio, skipping the text front end (for parity tests and tools)."""
        opts = (options or SynthesisOptions()).validate()
        units = [
            Unit(i, "", len(x), self._item(x, opts, i)) for i, x in enumerate(ids)
        ]
        return self.run_units(units)

    def _item(self, ids: Sequence[int], opts: SynthesisOptions, index: int):
        from .runner import VitsItem

        c = self.config
        return VitsItem(
            tuple(ids),
            c.length_scale / (opts.speed if opts.speed is not None else 1.0),
            c.noise_scale if opts.noise_scale is None else opts.noise_scale,
            c.noise_w if opts.noise_w is None else opts.noise_w,
            self.speaker_id(opts.speaker),
            sentence_seed(opts.seed, index),
            self.limits.max_sentence_samples(self.sample_rate) // self.runner.dims.hop_length,
        )
