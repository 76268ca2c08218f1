"""The family registry: every model family voxserve can load, each registered once.

A family is a folder, `voxserve/families/<name>/`, holding everything of one kind of model (its
modules, loader, options, text front end and runner), whose `__init__.py` calls
`register_family(Family(...))` once. Generic code (`load_voice`, the voice registry,
`voxserve voices`, the CLI and the server) finds families only through this module: it never
compares against a family's name.

The built-in families (`BUILTIN`) are imported on the first question asked of the registry,
not when `voxserve` is imported, so that a family's optional dependencies (Bark's
transformers) stay unimported until one of its voices loads. See docs/architecture.md.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import VoiceLoadError
from ..options import OptionRule, SynthesisOptions, option_rules

if TYPE_CHECKING:
    from ..contract import VoiceContract

BUILTIN = ("piper", "sbv2", "bark", "cosyvoice2")
"""Family packages under voxserve.families imported when the registry is first asked."""

RUNNER_KINDS = ("one-shot", "step")
"""Runner kinds: "one-shot" (a batch of sentences in, audio out, or a continuation for a
sentence cut into pieces: `Voice.run_pieces`) and "step" (autoregressive: sequences advance a
step at a time and join and leave between steps, `Voice.step_runner`)."""


@dataclass(frozen=True)
class VoiceSource:
    """Where a voice's files are and which family loads them (no file is read to make one)."""

    name: str
    family: str
    """The name of its family in voxserve.families."""
    path: Path
    config_path: Path | None = None

    def describe(self) -> dict:
        info: dict = {"name": self.name, "family": self.family, "path": str(self.path)}
        fam = families().get(self.family)
        if fam is not None and fam.describe is not None:
            info.update(fam.describe(self))
        return info


@dataclass(frozen=True)
class LoadOption:
    """A keyword of `load_voice` that one family takes (e.g. SBV2's `bert_dir`): the CLI offers
    it as a flag (`--bert-dir`) of `say` and `serve`, and load_voice passes it to that family."""

    name: str
    """The keyword (an identifier); the flag is `--` + name with `-` for `_`."""
    help: str
    env: str | None = None
    """An environment variable the family reads when the option is not given."""
    path: bool = True
    """The value is a filesystem path (the operator's, never a request's)."""


@dataclass(frozen=True)
class VoiceDownload:
    """How a family fetches voices by name from its public voice repository (`voxserve voices
    download NAME`)."""

    base_url: str
    """The repository's address; `--base-url` names a mirror with the same layout."""
    matches: Callable[[str], bool]
    """matches(name) -> whether `name` is written as this repository's voices are."""
    example: str
    """A voice name there, for messages (`en_US-lessac-medium`)."""
    fetch: Callable[..., tuple[Path, bool]]
    """fetch(name, folder, base_url, force=False) -> (the installed voice's path, whether it was
    fetched): downloaded into `folder`, verified (sizes, digests, the voice loads) before it is
    renamed into place; one installed there already is kept (False) unless `force`. Raises
    ValueError for a malformed name, UnknownVoiceError for a name the repository lacks,
    voxserve.voices.download.DownloadError for a network failure or a file that fails a check."""


@dataclass(frozen=True)
class Family:
    """What a family tells generic code about itself."""

    name: str
    """The family's name, as `VoiceSource.family` and `Voice.family` carry it."""
    load: Callable[..., VoiceContract]
    """load(source: VoiceSource, *, device, dtype, runtime, **kw) -> Voice. `runtime` is None or
    an `options_type` (load_voice checks it); kw holds family options of load_voice (today
    `max_phonemes`) that a family may ignore."""
    options_type: type
    """The family's runtime-options dataclass (how a voice runs, not what it says): frozen, every
    field with a default, a `validate()` that returns it. `load_voice(runtime=)` takes one, or
    its fields as keywords (`threads=2`); `voxserve serve` and `say` offer each field as a flag
    (`--threads`): a name that several families' types share is one setting for all of them."""
    source: Callable[[Path, str | None], VoiceSource]
    """source(path, name) -> the VoiceSource of a voice at `path` (no file is read)."""
    prefix: str | None = None
    """`PREFIX:PATH` names a voice of this family by path (e.g. "bark:/models/bark-small")."""
    recognise: Callable[[Path], bool] | None = None
    """recognise(path) -> True if a bare path (no prefix) is this family's (e.g. a `.onnx`)."""
    check: Callable[[VoiceSource], None] | None = None
    """check(source) raises VoiceLoadError if a source given by path cannot load (files missing)."""
    describe: Callable[[VoiceSource], dict] | None = None
    """describe(source) -> extra fields for `voxserve voices` (sample_rate, ...); `languages`: the
    BCP-47 tags the voice speaks, the same list as its loaded `Voice.language_codes`."""
    scan: Callable[[Path], Iterable[VoiceSource]] | None = None
    """scan(folder) -> this family's voices in a folder of $VOXSERVE_VOICES_PATH."""
    packaged: Callable[[], Iterable[VoiceSource]] | None = None
    """packaged() -> voices installed as Python packages (the default voice is one)."""
    hint: Callable[[Path], str | None] | None = None
    """hint(path) -> a message if `path` looks like this family's but lacks the prefix."""
    frontend: str = ""
    """Its text front end, in words (text -> sentences -> model input)."""
    runner_kind: str = "one-shot"
    """One of RUNNER_KINDS: how the engine runs its batches."""
    load_options: tuple[LoadOption, ...] = ()
    """Keywords of load_voice that only this family takes (passed to `load` when given)."""
    add_voice: Callable[..., Path] | None = None
    """add_voice(model: VoiceSource, name, prompt_wav: Path, prompt_text: str, folder: Path) ->
    the saved voice's path: a voice made from a recording and its transcript (zero-shot
    families), which `scan` then finds in `folder` (`voxserve voices add`)."""
    download: VoiceDownload | None = None
    """Where its voices can be fetched by name (`voxserve voices download`), if anywhere."""
    synthesis_options: type[SynthesisOptions] = SynthesisOptions
    """What its voices take per request (what they say, not how they run): SynthesisOptions or
    a subclass with the family's own knobs, each with its rule (voxserve.options). Its voices'
    `synthesis_options`; the servers' request schema and the CLI's flags hold every registered
    family's fields, a name several families share with one rule (checked at registration)."""

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"a family name is an identifier, not {self.name!r}")
        if self.prefix is not None and not is_prefix(self.prefix):
            raise ValueError(f"a family prefix is a letter and one or more letters or digits, not {self.prefix!r}")
        if self.runner_kind not in RUNNER_KINDS:
            raise ValueError(f"runner_kind must be one of {RUNNER_KINDS}, not {self.runner_kind!r}")
        if not (isinstance(self.synthesis_options, type) and issubclass(self.synthesis_options, SynthesisOptions)):
            raise ValueError(f"synthesis_options is SynthesisOptions or a subclass, not {self.synthesis_options!r}")
        option_rules(self.synthesis_options)  # every field has its rule (a TypeError names one that has none)


def is_prefix(text: str) -> bool:
    """Whether `text` can be a family prefix: a letter, then letters or digits, two characters
    at least (so a Windows drive, "C:", never is one)."""
    return text.isascii() and text.isalnum() and text[:1].isalpha() and len(text) > 1


_families: dict[str, Family] = {}
_lock = threading.RLock()
_builtin_loaded = False


def register_family(family: Family) -> Family:
    """Make `family` known. Registering a second family under a taken name or prefix fails;
    registering the same object again is a no-op."""
    with _lock:
        old = _families.get(family.name)
        if old is family:
            return family
        if old is not None:
            raise ValueError(f"a family named {family.name!r} is already registered")
        if family.prefix is not None:
            for f in _families.values():
                if f.prefix == family.prefix:
                    raise ValueError(f"prefix {family.prefix!r} is already family {f.name!r}'s")
        mine = option_rules(family.synthesis_options)
        for f in _families.values():
            for name, rule in option_rules(f.synthesis_options).items():
                if name in mine and mine[name] != rule:
                    raise ValueError(f"synthesis option {name!r} of family {family.name!r} has another rule than "
                                     f"family {f.name!r}'s: a name that two families share has one rule "
                                     f"(declare it once, voxserve.options.option())")
        _families[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Forget a family (tests; a built-in one comes back only with a new process)."""
    with _lock:
        _families.pop(name, None)


def _load_builtin() -> None:
    global _builtin_loaded
    if _builtin_loaded:
        return
    with _lock:
        if _builtin_loaded:
            return
        for name in BUILTIN:
            importlib.import_module(f"{__name__}.{name}")  # registers itself
        _builtin_loaded = True


def families() -> dict[str, Family]:
    """Every registered family, by name: the built-in ones in BUILTIN's order (whichever was
    imported first), then the others in registration order."""
    _load_builtin()
    with _lock:
        order = {name: i for i, name in enumerate(BUILTIN)}
        names = sorted(_families, key=lambda n: order.get(n, len(order)))  # stable: others keep their order
        return {n: _families[n] for n in names}


def synthesis_options_of(voice: VoiceContract) -> type[SynthesisOptions]:
    """The options class a loaded voice takes per request: its family's
    (`Family.synthesis_options`, e.g. PiperOptions), or SynthesisOptions for a voice of no
    registered family."""
    fam = families().get(voice.family)
    return SynthesisOptions if fam is None else fam.synthesis_options


def load_options() -> dict[str, LoadOption]:
    """Every family's load options, by keyword (two families may share a keyword)."""
    return {o.name: o for f in families().values() for o in f.load_options}


def runtime_fields() -> dict[str, list[tuple[Family, Any]]]:
    """Every family's runtime option, by field name: the (family, dataclass field) pairs that
    have it (a name such as `threads` is shared; its type must be the same in each)."""
    out: dict[str, list] = {}
    for fam in families().values():
        for f in fields(fam.options_type):
            out.setdefault(f.name, []).append((fam, f))
    return out


def synthesis_rules() -> Mapping[str, OptionRule]:
    """Every registered family's synthesis options, by name, each once with its rule: the
    common ones (SynthesisOptions) first, then each family's own in family order. What the
    servers' request schema and the CLI's flags offer."""
    out = dict(option_rules(SynthesisOptions))
    for fam in families().values():
        for name, rule in option_rules(fam.synthesis_options).items():
            out.setdefault(name, rule)
    return out


def synthesis_families() -> dict[str, list[str]]:
    """The names of the families that take each synthesis option that not every voice takes
    (for help texts: "noise_scale": ["piper", "sbv2"])."""
    common = set(option_rules(SynthesisOptions))
    out: dict[str, list[str]] = {}
    for fam in families().values():
        for name in option_rules(fam.synthesis_options):
            if name not in common:
                out.setdefault(name, []).append(fam.name)
    return out


def runtime_options(family: Family, runtime: Any = None, **values: Any) -> Any:
    """The family's options: `runtime` (its `options_type`, or None for the defaults) with
    `values` of its fields replaced (None if neither sets anything); keywords of other families'
    fields are ignored (one set of settings serves voices of every family), a keyword no family
    has is a TypeError. Not validated here: the family's loader validates what it gets."""
    cls = family.options_type
    if runtime is not None and not isinstance(runtime, cls):
        raise TypeError(f"runtime= for a {family.name} voice is a {cls.__module__}.{cls.__name__}, "
                        f"not a {type(runtime).__name__}")
    known = runtime_fields()
    for key in values:
        if key not in known:
            raise TypeError(f"unknown runtime option {key!r} (runtime options: {', '.join(sorted(known))})")
    mine = {f.name for f in fields(cls)}
    given = {k: v for k, v in values.items() if k in mine and v is not None}
    if not given:
        return runtime  # None: the family's defaults
    return replace(runtime if runtime is not None else cls(), **given)


def get_family(name: str) -> Family:
    """The family called `name`; VoiceLoadError if none is."""
    fam = families().get(name)
    if fam is None:
        raise VoiceLoadError(f"unknown voice family {name!r} (known: {', '.join(families())})")
    return fam


def family_for_prefix(prefix: str) -> Family | None:
    return next((f for f in families().values() if f.prefix == prefix), None)


def family_for_path(path: Path) -> Family | None:
    """The first family that recognises a bare path, or None."""
    return next((f for f in families().values() if f.recognise is not None and f.recognise(path)), None)


def family_for_source(source: VoiceSource | Any) -> Family:
    """The family of a VoiceSource (or of anything with a `.family` name); VoiceLoadError if
    that family is not registered."""
    return get_family(source.family)


def family_for_download(name: str) -> Family | None:
    """The first family whose voice repository names voices as `name` is written, or None."""
    return next((f for f in families().values() if f.download is not None and f.download.matches(name)), None)


def source_hint(path: Path) -> str | None:
    """A family's message for a bare path that looks like its voice but needs its prefix."""
    for f in families().values():
        if f.hint is not None and (msg := f.hint(path)):
            return msg
    return None
