"""Per-request synthesis options. None means "the voice's default".

`SynthesisOptions` holds what every voice honours; each family declares its own knobs in a
subclass in its folder (PiperOptions, Sbv2Options, BarkOptions, CosyOptions) and registers it
(`Family.synthesis_options`). Every option has one rule (an `OptionRule` in its field's
metadata), checked by `validate()`; a name that several families share has one rule
(register_family checks it). The CLI flags (voxserve.flags) and the HTTP request schema
(voxserve.serve.schemas) are built from the registered classes' rules
(`voxserve.families.synthesis_rules`), so a field added to a family's class is a flag and an
HTTP field with its type, help and range, and nothing else needs an edit.
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


def option(rule: OptionRule):
    """A field (default None) that takes `rule`: for a knob several families share, whose rule
    is declared once (below) so that theirs agree."""
    return field(default=None, metadata={"rule": rule})


# Knobs that several families have: one rule each, which each of those families' classes uses
# (register_family refuses two families whose field of one name has two rules).
NOISE_SCALE = OptionRule("number", (0.0, 2.0), "generator noise (0, with noise_w 0, is deterministic)")
NOISE_W = OptionRule("number", (0.0, 1.5), "phoneme-duration noise")
"""It enters the durations through an exponential, hence the narrow range: voices are trained
at 0.8, and at 2 a sentence can come out several times its length."""
NORMALIZE = OptionRule("boolean", (0, 0), "read numbers, dates, units, abbreviations, URLs as words (English); "
                                          "false: the text as written")


@dataclass(frozen=True)
class SynthesisOptions:
    """What every voice honours, per request. A family adds its own knobs in a subclass, its
    `Family.synthesis_options` (`voice.synthesis_options`: e.g. PiperOptions with noise_scale);
    a voice takes an instance of its family's class or of this one (`of`)."""

    speaker: int | str | None = id_or_name(MAX_SPEAKER_ID, MAX_SPEAKER_NAME, "speaker id or name (multi-speaker voices)")
    """None = the voice's default speaker (Bark: a preset; CosyVoice 2: a saved voice or prompt)."""
    speed: float | None = number(0.25, 4.0, "speaking rate multiplier, e.g. 1.25")
    """2.0 is twice as fast. The range is OpenAI's; a voice that cannot change its rate (Bark)
    refuses any other value than 1."""
    sentence_silence: float | None = number(0.0, 10.0, "silence after each sentence", "s")
    """Seconds between sentences in joined output; default 0."""
    seed: int | None = integer(0, MAX_SEED, "noise seed for reproducible output")
    """The same seed gives the same audio, alone or in any batch."""

    def validate(self) -> "SynthesisOptions":
        """Check every set field against its rule; InvalidOptionError names the first bad one."""
        rules = option_rules(type(self))
        for name, rule in rules.items():
            v = getattr(self, name)
            if v is not None:
                rule.check(name, v)
        return self

    def merged(self, other: "SynthesisOptions | None") -> "SynthesisOptions":
        """Fields set in `other` override ours (a field ours lacks is a TypeError)."""
        if other is None:
            return self
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(other) if getattr(other, f.name) is not None})

    @classmethod
    def deterministic(cls) -> "SynthesisOptions":
        """Options whose audio is the same for the same text, every time: noise off and greedy
        decoding where the family has them (its class overrides this), else a fixed seed."""
        return cls(seed=0)

    @classmethod
    def of(cls, options: "SynthesisOptions | None") -> "SynthesisOptions":
        """`options` as this class, validated: None -> the defaults; an instance of this class
        as it is; one of a class this one derives from (SynthesisOptions) with our other fields
        unset; DETERMINISTIC -> `cls.deterministic()` with its fields over it. Another family's
        class is a TypeError (its fields mean nothing to this voice)."""
        if options is None:
            return cls()
        if isinstance(options, Deterministic):
            return cls.deterministic().merged(options).validate()
        if isinstance(options, cls):
            return options.validate()
        if isinstance(options, SynthesisOptions) and issubclass(cls, type(options)):
            return cls(**{f.name: getattr(options, f.name) for f in fields(options)}).validate()
        raise TypeError(f"these options are a {cls.__name__} (or a SynthesisOptions), not a {type(options).__name__}")


@dataclass(frozen=True)
class Deterministic(SynthesisOptions):
    """DETERMINISTIC's class: each voice reads it as its family's `deterministic()`."""


DETERMINISTIC = Deterministic()
"""Noise off (VITS, SBV2), greedy decoding (Bark), a fixed seed (CosyVoice 2): the same text
always gives the same samples, on a voice of any family (`SynthesisOptions.of`)."""


def check_values(values: Mapping[str, object], rules: Mapping[str, OptionRule]) -> dict[str, object]:
    """The options set in `values` (name -> value; None: unset), each checked against its rule
    in `rules` (InvalidOptionError names a bad one; a name `rules` lacks is a TypeError)."""
    out = {}
    for name, v in values.items():
        if name not in rules:
            raise TypeError(f"unknown option {name!r}")
        if v is not None:
            rules[name].check(name, v)
            out[name] = v
    return out


def options_for(cls: type[SynthesisOptions], values: Mapping[str, object], rules: Mapping[str, OptionRule]) -> SynthesisOptions:
    """A request's option values as `cls`, a voice's class: every value set is checked against
    its rule in `rules` (every family's, `voxserve.families.synthesis_rules()`), and those of
    fields `cls` lacks (another family's knobs) are dropped: the servers' rule, as one request
    schema serves voices of every family (docs/serving.md, "Options and families")."""
    mine = option_rules(cls)
    return cls(**{k: v for k, v in check_values(values, rules).items() if k in mine})


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


