"""Per-request synthesis options. None means "the voice's default".

Every option has one rule (an `OptionRule` in its field's metadata), checked once by
`validate()`. The CLI flags (voxserve.cli) and the HTTP request schema (voxserve.serve.schemas)
are built from the same rules, so a field added here (or in a subclass) is a flag and an HTTP
field with its type, help and range, and nothing else needs an edit.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Mapping

from .errors import InvalidOptionError

MAX_SEED = (1 << 63) - 1
MAX_SPEAKER_ID = (1 << 31) - 1
MAX_SPEAKER_NAME = 200
MAX_STYLE_ID = 1023
MAX_INSTRUCTIONS_CHARS = 4096  # OpenAI's bound on `instructions`

KINDS = ("number", "integer", "id_or_name", "name", "boolean")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@dataclass(frozen=True)
class OptionRule:
    """What values an option takes, and how the CLI and the HTTP schema present it."""

    kind: str
    """"number" (a finite int or float), "integer" (an int, not a bool), "id_or_name" (an
    integer id in `range` or a name of 1 to `max_len` characters), "name" (a string of 1 to
    `max_len` characters) or "boolean" (True or False)."""
    range: tuple[float, float]
    """(lo, hi), both inclusive (for id_or_name: of the id; unused by name and boolean)."""
    help: str
    unit: str = ""
    max_len: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"an option's kind is one of {KINDS}, not {self.kind!r}")

    def check(self, name: str, value: object) -> None:
        """Raises InvalidOptionError unless `value` obeys the rule."""
        lo, hi = self.range
        if self.kind == "boolean":
            if not isinstance(value, bool):
                raise InvalidOptionError(name, f"must be true or false, got {value!r}")
            return
        if self.kind == "name":
            if not isinstance(value, str) or not 0 < len(value) <= self.max_len:
                raise InvalidOptionError(name, f"must be a name of 1 to {self.max_len} characters, got {value!r}")
            return
        if self.kind == "id_or_name":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise InvalidOptionError(name, f"must be an id or a name, got {value!r}")
            if isinstance(value, int) and not lo <= value <= hi:
                raise InvalidOptionError(name, f"an id must be between {lo} and {hi}, got {value}")
            if isinstance(value, str) and not 0 < len(value) <= self.max_len:
                raise InvalidOptionError(name, f"a name must have 1 to {self.max_len} characters")
            return
        if self.kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidOptionError(name, f"must be an integer, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidOptionError(name, f"must be a finite number, got {value!r}")
        if not lo <= value <= hi:
            unit = f" {self.unit}" if self.unit else ""
            raise InvalidOptionError(name, f"must be between {lo:g} and {hi:g}{unit}, got {value!r}")

    def parse(self, text: str) -> int | float | str:
        """A command-line string as the option's value (the rule is checked later, by validate())."""
        if self.kind == "number":
            return float(text)
        if self.kind == "integer":
            return int(text)
        if self.kind == "boolean":
            low = text.strip().lower()
            if low not in _TRUE + _FALSE:
                raise ValueError(text)
            return low in _TRUE
        if self.kind == "name":
            return text
        return int(text) if text.isdigit() else text

    @property
    def help_text(self) -> str:
        """The help, with the range where it tells a user something."""
        if self.kind != "number":
            return self.help
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.help} ({self.range[0]:g}-{self.range[1]:g}{unit})"


def number(lo: float, hi: float, help: str, unit: str = ""):
    """A float option in [lo, hi], default None."""
    return field(default=None, metadata={"rule": OptionRule("number", (lo, hi), help, unit)})


def integer(lo: int, hi: int, help: str):
    return field(default=None, metadata={"rule": OptionRule("integer", (lo, hi), help)})


def id_or_name(max_id: int, max_len: int, help: str):
    return field(default=None, metadata={"rule": OptionRule("id_or_name", (0, max_id), help, max_len=max_len)})


def name_field(max_len: int, help: str):
    """A string option of 1 to max_len characters (what values a voice takes, it checks)."""
    return field(default=None, metadata={"rule": OptionRule("name", (0, 0), help, max_len=max_len)})


def boolean_field(help: str):
    return field(default=None, metadata={"rule": OptionRule("boolean", (0, 0), help)})


@dataclass(frozen=True)
class SynthesisOptions:
    speaker: int | str | None = id_or_name(MAX_SPEAKER_ID, MAX_SPEAKER_NAME, "speaker id or name (multi-speaker voices)")
    """None = the voice's default speaker."""
    speed: float | None = number(0.25, 4.0, "speaking rate multiplier, e.g. 1.25")
    """2.0 is twice as fast; divides the voice's length scale. The range is OpenAI's."""
    noise_scale: float | None = number(0.0, 2.0, "generator noise (0, with noise_w 0, is deterministic)")
    noise_w: float | None = number(0.0, 1.5, "phoneme-duration noise")
    """It enters the durations through an exponential, hence the narrow range: voices are
    trained at 0.8, and at 2 a sentence can come out several times its length."""
    sentence_silence: float | None = number(0.0, 10.0, "silence after each sentence", "s")
    """Seconds between sentences in joined output; default 0."""
    seed: int | None = integer(0, MAX_SEED, "noise seed for reproducible output")
    """The same seed gives the same audio, alone or in any batch."""
    temperature: float | None = number(0.0, 5.0, "sampling temperature of token-generating voices (Bark); 0 = greedy")
    """Bark's semantic and coarse stages (0 also makes the fine stage greedy: deterministic).
    VITS voices ignore it: their randomness is noise_scale / noise_w."""
    style: int | str | None = id_or_name(MAX_STYLE_ID, MAX_SPEAKER_NAME, "style id or name (Style-Bert-VITS2 voices)")
    """None = the voice's default style ("Neutral" where the voice has it)."""
    style_weight: float | None = number(0.0, 20.0, "strength of the style (Style-Bert-VITS2); 1 = as trained")
    """The style vector is mean + (vector[style] - mean) * style_weight; SBV2's own range."""
    sdp_ratio: float | None = number(0.0, 1.0, "share of the stochastic duration predictor (Style-Bert-VITS2)")
    """Durations mix the stochastic (sdp_ratio) and the deterministic predictor (1 - sdp_ratio)."""
    language: str | None = name_field(8, "language of the text, for voices that speak several (Style-Bert-VITS2: JP, EN)")
    """None = the voice's own language; a voice refuses one it cannot speak (400)."""
    normalize: bool | None = boolean_field("read numbers, dates, units, abbreviations, URLs as words (English voices); false: text as written")
    """None = true: Piper voices speak `voxserve.text.normalize_text`'s form of the text;
    other families, and voices of other languages, read the text as they always do."""
    input_format: str | None = name_field(8, "what the input is: text, or ssml (Piper voices); default: ssml if it starts with <speak")
    """None = auto: SSML (`voxserve.text.ssml`) when the input starts with a `<speak>` element,
    else plain text. Other families read every input as plain text."""

    instructions: str | None = name_field(MAX_INSTRUCTIONS_CHARS, "how to speak, for voices that follow a spoken-style prompt (CosyVoice 2's instruct mode), e.g. 'Speak slowly and calmly.'")
    """CosyVoice 2: its language model reads these instead of the speaker's prompt transcript
    and speech tokens (the flow still takes the speaker's voice). Other families ignore it, so
    that the OpenAI route's `instructions` can reach every voice."""
    cross_lingual: bool | None = boolean_field("speak the text without the speaker prompt's transcript, for text in another language than the prompt (CosyVoice 2)")
    """CosyVoice 2's cross-lingual mode: the language model gets neither the prompt's
    transcript nor its speech tokens, only the text; the flow keeps the speaker's voice."""

    def validate(self) -> "SynthesisOptions":
        """Check every set field against its rule; InvalidOptionError names the first bad one."""
        rules = option_rules(type(self))
        for name, rule in rules.items():
            v = getattr(self, name)
            if v is not None:
                rule.check(name, v)
        return self

    def merged(self, other: "SynthesisOptions | None") -> "SynthesisOptions":
        """Fields set in `other` override ours."""
        if other is None:
            return self
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(other) if getattr(other, f.name) is not None})


@functools.cache
def option_rules(cls: type = SynthesisOptions) -> Mapping[str, OptionRule]:
    """Every option of an options dataclass (SynthesisOptions or a subclass), by field name, in
    field order. A field without a rule is a programming error, caught here."""
    out = {}
    for f in fields(cls):
        rule = f.metadata.get("rule")
        if not isinstance(rule, OptionRule):
            raise TypeError(f"{cls.__name__}.{f.name} has no OptionRule (declare it with number(), integer() or id_or_name())")
        out[f.name] = rule
    return MappingProxyType(out)


def option_range(name: str, cls: type = SynthesisOptions) -> tuple[float, float] | None:
    """(lo, hi), both inclusive, of a numeric option; None for an id-or-name, name or boolean one."""
    rule = option_rules(cls)[name]
    return rule.range if rule.kind in ("number", "integer") else None


def option_help(name: str, cls: type = SynthesisOptions) -> str:
    """A flag's help text, with its range."""
    return option_rules(cls)[name].help_text


def check_option(name: str, value: object, cls: type = SynthesisOptions) -> None:
    """The one rule of option `name`; raises InvalidOptionError."""
    option_rules(cls)[name].check(name, value)


DETERMINISTIC = SynthesisOptions(noise_scale=0.0, noise_w=0.0, temperature=0.0, sdp_ratio=0.0)
"""Noise off (VITS, SBV2) and greedy decoding (Bark): the same text always gives the same samples."""
