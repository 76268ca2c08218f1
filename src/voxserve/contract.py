"""The contract between a voice and the engine: what the engine calls and reads.

A voice turns text into `Unit`s (one per sentence: front end done, options resolved) and runs
lists of units through its model as batches (`run_pieces`), or as sequences of a `StepRunner`.
`VoiceContract` declares those seams; the engine (engine/) types voices as it and imports this
module only. The library API on top (`synthesize`, `stream`, `synthesize_batch`) is
`voxserve.voice.Voice`, which every family subclasses and which drives the engine: so this
module is the one both import, and neither imports the other's dependents.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .audio import SentenceJoiner, Word, silence_samples
from .limits import DEFAULT_LIMITS, Limits
from .options import SynthesisOptions
from .text.split import split_sentences

# Speech per character of text, a low estimate (about twice a normal reading rate): what a request's
# audio is predicted from before its front end runs (`Voice.predicted_audio_s`).
LOW_SECONDS_PER_CHAR = 0.03


@dataclass(frozen=True)
class Unit:
    """One sentence of a request, ready for the model."""

    index: int
    """Position in its request."""
    text: str
    cost: int
    """Batching cost (phoneme ids for VITS)."""
    payload: Any
    """Family-specific model input (a VitsItem for Piper voices)."""
    seconds: float = 0.0
    """Predicted audio, a low estimate: what the request's limit is checked against before
    the model runs (the audio made is checked too)."""
    component: Hashable | None = None
    """The key of a shared component (`SharedComponent.key`) whose output this unit needs
    before its voice can run it; None: none, or already attached."""
    component_input: Any = None
    """What that component takes for this unit (e.g. the sentence's text for a BERT)."""


class Piece(tuple):
    """(audio, rest) of `Voice.run_pieces` for one unit, and `words`: the words of the unit's
    sentence, in seconds from the start of this piece's audio, on the piece that starts the
    sentence (a voice with `word_timestamps`); () on the pieces that continue one and for
    voices without them. Unpacks as the pair. `error`: this unit alone failed (a sentence
    over its limit: AudioTooLongError); its audio is then empty and its batch mates are not
    affected (`Piece.failed`)."""

    words: tuple[Word, ...]
    error: BaseException | None

    def __new__(cls, audio, rest=None, words: Sequence[Word] = (), error: BaseException | None = None):
        self = super().__new__(cls, (audio, rest))
        self.words = tuple(words)
        self.error = error
        return self

    @classmethod
    def failed(cls, error: BaseException) -> "Piece":
        return cls(np.zeros(0, dtype=np.float32), None, (), error)


def piece_words(result) -> tuple[Word, ...]:
    """The words of a run_pieces result (a plain (audio, rest) pair has none)."""
    return result.words if isinstance(result, Piece) else ()


def piece_error(result) -> BaseException | None:
    """The error of a run_pieces result that failed alone (a plain (audio, rest) pair has none)."""
    return result.error if isinstance(result, Piece) else None


def shift_words(words: Sequence[Word], offset: float) -> tuple[Word, ...]:
    return tuple(Word(w.word, w.start + offset, w.end + offset) for w in words)


def joined_words(sentences: Sequence[tuple[int, Sequence[Word], bool]], sample_rate: int,
                 silence_s: float) -> tuple[Word, ...]:
    """Whole-audio words of sentences joined by `SentenceJoiner`: (sample count, words relative to
    that chunk, partial) per chunk in order; each chunk's words move by where the joiner puts
    the chunk (the silence before it included)."""
    joiner = SentenceJoiner(sample_rate, silence_s)
    out: list[Word] = []
    pos = 0  # samples written so far
    for n, words, partial in sentences:
        parts = joiner.pieces(np.zeros(0, np.float32), partial)
        pos += sum(len(p) for p in parts)  # the silence before this chunk, if any
        out.extend(shift_words(words, pos / sample_rate))
        pos += n
    return tuple(out)


@dataclass(frozen=True)
class StepResult:
    """What one step of a step runner gave for one sequence."""

    key: Hashable
    audio: np.ndarray | None = None
    """float32 samples made since this sequence's previous result (None or empty: none)."""
    final: bool = True
    """The sequence is finished and has left the runner (its last audio is this result's)."""
    error: BaseException | None = None
    """The sequence failed and has left the runner; the others go on."""


class StepRunner(ABC):
    """Sequences (one per unit) that advance one step at a time: continuous batching.

    The engine's worker, the only thread that calls it, lets new sequences `join` between
    steps, calls `step()` while any is active, and removes cancelled ones with `leave`. A
    sequence's output must not depend on what runs beside it (per-sequence seeded sampling, no
    cross-row leakage through padding)."""

    capacity: int = 8
    """Sequences that may be active at once (the engine joins no more)."""

    @abstractmethod
    def join(self, key: Hashable, unit: Unit) -> None:
        """Add a sequence for `unit`; its prompt is processed in the next `step()`. A unit it
        cannot run fails through that step's StepResult(error=...), not by raising here."""

    @abstractmethod
    def step(self) -> list[StepResult]:
        """One decode iteration (or a small fixed number) of every active sequence; returns
        results for the sequences that made audio, finished or failed in it."""

    @abstractmethod
    def leave(self, key: Hashable) -> None:
        """Drop a sequence (its request was cancelled); unknown keys are ignored."""

    @property
    @abstractmethod
    def active(self) -> int:
        """Sequences joined and not yet finished."""


def run_steps(runner: StepRunner, units: Sequence[Unit]) -> list[np.ndarray]:
    """Run units through a step runner of their own to their end, all joined as capacity
    allows (a step voice's `run_units`, for tools and tests; the engine joins sequences by its
    scheduler's rules): the audio of each, in order. Raises the first sequence's error."""
    parts: dict[int, list[np.ndarray]] = {k: [] for k in range(len(units))}
    pending = list(enumerate(units))
    done: set[int] = set()
    error: BaseException | None = None
    while len(done) < len(units):
        while pending and runner.active < runner.capacity:
            k, u = pending.pop(0)
            runner.join(k, u)
        for res in runner.step():
            if res.error is not None and error is None:
                error = res.error
            if res.audio is not None and len(res.audio):
                parts[res.key].append(res.audio)
            if res.final or res.error is not None:
                done.add(res.key)
        if error is not None:
            for k in range(len(units)):
                if k not in done:
                    runner.leave(k)
            raise error
    return [np.concatenate(p) if p else np.zeros(0, dtype=np.float32) for _, p in sorted(parts.items())]


class SharedComponent(ABC):
    """A model part several voices use (a BERT text encoder): loaded once per device, run by
    the device's worker as a stage of its own, batched across requests and voices."""

    key: Hashable
    """Identity: voices whose units name the same key on one device share one instance."""
    max_batch: int = 16
    """Inputs per call."""

    @abstractmethod
    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """One output per input, in order; outputs stay on the component's device."""


def sentence_seed(seed: int | None, index: int) -> int:
    """Per-sentence seed: a request's seed spread over its sentences; random if None."""
    if seed is None:
        return secrets.randbits(63)
    return (seed * 1_000_003 + index) & ((1 << 63) - 1)


def limited(units: Iterator[Unit], limits: Limits, sentences: Sequence[str] = (),
            silence_s: float = 0.0) -> Iterator[Unit]:
    """`units`, refusing the request (AudioTooLongError) once their predicted audio, with the
    silence between sentences, passes the request's limit: before the model runs on the
    sentence that passes it. The silence alone is checked now, from `sentences` (the text split,
    before phonemes), counting those with a letter or digit."""
    if silence_s:
        spoken = sum(1 for s in sentences if any(ch.isalnum() for ch in s))
        limits.check_request((spoken - 1) * silence_s, predicted=True)

    def gen() -> Iterator[Unit]:
        total = 0.0
        for u in units:
            total += u.seconds + (silence_s if u.index else 0.0)
            limits.check_request(total, predicted=True)
            yield u

    return gen()


class AudioBudget:
    """The audio a request has made so far (sentence silence included), against its limit."""

    def __init__(self, limits: Limits, sample_rate: int, silence_s: float = 0.0):
        self.limits, self.sample_rate, self.samples = limits, sample_rate, 0
        self.gap = silence_samples(silence_s, sample_rate)
        self.sentences = 0

    def add(self, n_samples: int, sentence_start: bool = True) -> None:
        """One sentence's audio (or a piece of one: sentence_start=False for its rest)."""
        if sentence_start:
            self.samples += self.gap if self.sentences else 0
            self.sentences += 1
        self.samples += n_samples
        self.limits.check_request(self.samples / self.sample_rate)


class VoiceContract(ABC):
    """A loaded voice on one device, as the engine sees it (families subclass
    `voxserve.voice.Voice`, which adds the library API). The engine takes only these and uses
    nothing else:

    reads    `name`, `family`, `sample_rate`, `device` (which device's worker runs it),
             `limits`, `concurrent_runs` (may the CPU executor run two of its batches at
             once), `silence_after(options)`; and `Unit.cost` (its scheduling unit: work
             predicted in phoneme ids or their equivalent) of what `units` yields;
    calls    `units(text, options)` on the front-end pool; `step_runner()` (continuous
             batching: its `StepRunner`, or None for a one-shot voice, whose batches go
             through `run_pieces`); `components()` and `with_component_output` (shared
             components); `warmup()` before traffic (`Engine.warm_up`).
    """

    name: str
    family: str
    sample_rate: int
    device: Any
    """Where its model runs (a torch.device, or its name): the engine runs the voice on that
    device's worker, so every family must say it."""
    limits: Limits = DEFAULT_LIMITS
    """The work bound of every request to this voice (set by load_voice(limits=...))."""

    @property
    def speakers(self) -> list[str]:
        return []

    @property
    def styles(self) -> list[str]:
        """Named styles (`SynthesisOptions.style`) of voices that have them."""
        return []

    @property
    def languages(self) -> list[str]:
        """Values `SynthesisOptions.language` takes, for voices that speak several (SBV2's
        "JP", "EN"); empty for a voice that has no such option. What listings show is
        `language_codes`."""
        return []

    @property
    def language_codes(self) -> list[str]:
        """The languages the voice speaks as BCP-47 tags (`voxserve.langcodes.tag`: "en-US",
        "ja"), from its family's config: the one source of every listing (HTTP voices routes,
        Wyoming's info, the playground); each family's `describe` gives the same list for the
        voice unloaded. Where `languages` is not empty, `SynthesisOptions.language` accepts each
        of these tags too. Empty = not known."""
        return []

    clones: bool = False
    """Makes speakers from recordings (`clone`, `forget`): the zero-shot families (CosyVoice 2)."""

    def clone(self, name: str, wave: np.ndarray, sample_rate: int, text: str, folder: Path) -> Path:
        """A voice `name` made from a recording (mono float32 [N] at `sample_rate`) and its
        transcript: a speaker of this voice at once (`speaker=name`), and saved in `folder` as
        `voxserve voices add` saves one (its path returned). Only where `clones`; a recording
        the family cannot use is a ValueError."""
        raise NotImplementedError(f"{self.family} voices make no voices from recordings")

    def forget(self, name: str) -> None:
        """Drop the speaker `clone` made (its saved copy is the caller's to delete)."""
        raise NotImplementedError(f"{self.family} voices make no voices from recordings")

    def step_runner(self) -> StepRunner | None:
        """The voice's step runner if it runs as one (autoregressive families; the same
        instance at every call); None for a one-shot voice, whose batches go through
        `run_pieces`."""
        return None

    def components(self) -> Mapping[Hashable, SharedComponent]:
        """The shared components its units name (`Unit.component`), by key."""
        return {}

    def with_component_output(self, unit: Unit, output: Any) -> Unit:
        """`unit` with its component's output attached, ready for `run_units` (a family with
        components overrides this to put the output into its payload)."""
        return replace(unit, component=None, component_input=None, payload=(unit.payload, output))

    def resolve_components(self, units: Sequence[Unit]) -> list[Unit]:
        """Run the shared components that units still need (batched per component) and attach
        their outputs, for tools and tests that call `run_units` themselves; the engine runs
        them as its own stage."""
        out = list(units)
        need: dict[Hashable, list[int]] = {}
        for k, u in enumerate(out):
            if u.component is not None:
                need.setdefault(u.component, []).append(k)
        comps = self.components() if need else {}
        for key, idx in need.items():
            comp = comps[key]
            for s in range(0, len(idx), comp.max_batch):
                part = idx[s:s + comp.max_batch]
                for k, o in zip(part, comp.run([out[k].component_input for k in part])):
                    out[k] = self.with_component_output(out[k], o)
        return out

    @property
    def concurrent_runs(self) -> bool:
        """Whether two threads may run batches of this voice at once (the engine's CPU lanes)."""
        return False

    word_timestamps: bool = False
    """Whether its audio comes with word timestamps (`Audio.words`; `run_pieces` returns
    `Piece`s with words). Voices whose model predicts no durations (autoregressive) leave it
    False, and their audio's words are empty."""

    # ---------------------------------------------------------------- seams
    @abstractmethod
    def units(self, text: str, options: SynthesisOptions | None = None) -> Iterator[Unit]:
        """Validate now; then lazily yield the text's units in order.

        Raises EmptyTextError (now), InvalidOptionError / UnknownSpeakerError (now), and
        UnpronounceableTextError (when iteration ends without a single unit)."""

    @abstractmethod
    def run_units(self, units: Sequence[Unit], early: Sequence[int] = (),
                  on_early: Callable[[int, np.ndarray], None] | None = None) -> list[np.ndarray]:
        """Run one batch through the model. float32 audio per unit, trimmed.

        early: positions of units whose client waits for its first audio (a stream's first
        sentence). A voice may deliver the head of such a unit's audio at once through
        on_early(k, samples), while the batch goes on; the list returned then holds only the
        rest of that unit's audio (head + rest = the unit's audio). Voices that cannot (Bark)
        ignore it."""

    def run_pieces(self, units: Sequence[Unit], early: Sequence[int] = (),
                   max_cost: int | None = None, spare: bool = False) -> list[tuple[np.ndarray, Unit | None]]:
        """Run one batch, cutting long units: (audio, rest) per unit, where rest is None or a
        Unit (same index) for the rest of that unit's audio, to run in a later batch. `early`
        units (a stream's first sentence) may be cut after a short head (first audio sooner):
        long ones always, short ones too when `spare` (the engine has nothing else to run, so
        the cut's extra work delays no one);
        with max_cost, no piece costs much more than max_cost (a batch's time stays bounded).
        The pieces of a unit join exactly. Voices that cannot cut (Bark) run units whole.
        A voice with `word_timestamps` returns `Piece`s carrying the words."""
        return [(a, None) for a in self.run_units(units)]

    @abstractmethod
    def warmup(self) -> None:
        """Get ready for traffic (servers call this before reporting ready), on the calling
        thread (`Engine.warm_voice`)."""

    def silence_after(self, options: SynthesisOptions | None) -> float:
        return float(options.sentence_silence or 0.0) if options else 0.0

    def predicted_audio_s(self, text: str, options: SynthesisOptions | None = None) -> float:
        """A low estimate of the audio (seconds) a request makes, known before its front end
        runs, silence included: what the server charges a whole answer against the audio it may
        hold at once (engine/held_audio.py). Speech at LOW_SECONDS_PER_CHAR (faster at a higher
        `speed`), plus the sentence silence between sentences; a voice with more silence of its
        own (SSML breaks) adds it."""
        speed = float(options.speed) if options is not None and options.speed else 1.0
        speech = len(text) * LOW_SECONDS_PER_CHAR / speed
        gap = self.silence_after(options)
        if not gap:
            return speech
        spoken = sum(1 for s in split_sentences(text) if any(ch.isalnum() for ch in s))
        return speech + gap * max(0, spoken - 1)

    # ---------------------------------------------------------------- idle unload
    can_unload: bool = False
    """Whether `unload` / `reload` work for this voice (a family that implements them sets it);
    the server's `--unload-after` leaves the others loaded."""

    @property
    def loaded(self) -> bool:
        """Whether its weights are in memory: False between `unload` and `reload`."""
        return True

    def unload(self) -> None:
        """Release its weights and their memory (device memory on a GPU), keeping what a
        request's front end needs (`units` still works): `reload` brings them back, as loaded.
        The caller makes sure that nothing runs the voice meanwhile (engine/unload.py)."""
        raise NotImplementedError(f"voices of family {self.family!r} cannot unload their weights")

    def reload(self) -> None:
        """Load the weights again after `unload` (from the voice's source, with the same device,
        precision and runtime options); a loaded voice is left as it is."""
        raise NotImplementedError(f"voices of family {self.family!r} cannot unload their weights")
