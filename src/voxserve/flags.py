"""Command-line flags made from the option dataclasses (a flag per synthesis option of every
registered family, its help and range from the field's rule) and from the families' load options (`--bert-dir`):
shared by the parsers of `say`, `serve`, `wyoming` and `bench`, and read back from argparse.
Light on purpose: `voxserve --help` builds every parser."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from .families import load_options, synthesis_families, synthesis_rules
from .options import OptionRule, SynthesisOptions, check_values, option_rules
from .serve.config import DEPRECATED, Setting, settings


def options_args(p: argparse.ArgumentParser, rules: Mapping[str, OptionRule] | None = None) -> None:
    """A flag for every synthesis option of every registered family (default None = the voice's
    default; `rules`: others, for tests), its type, help and range from the option's rule; the
    help names the families that take one not every voice takes."""
    takers = synthesis_families() if rules is None else {}
    for name, rule in (synthesis_rules() if rules is None else rules).items():
        who = f" [{', '.join(takers[name])} voices]" if name in takers else ""
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=_named(rule.parse, rule.kind.replace("_", " ")),
                       default=None, help=rule.help_text + who, metavar=name.upper())


def _named(parse, name: str):
    """`parse` under the name argparse's error shows ("invalid number value: 'x'")."""
    def f(text: str):
        return parse(text)
    f.__name__ = name
    return f


def load_option_args(p: argparse.ArgumentParser) -> None:
    """A flag for every family's load option (voxserve.families.load_options: `--bert-dir`)."""
    for opt in load_options().values():
        env = f" [env {opt.env}]" if opt.env else ""
        p.add_argument("--" + opt.name.replace("_", "-"), dest=opt.name, default=None,
                       metavar=("DIR" if opt.name.endswith("_dir") else "FILE") if opt.path else opt.name.upper(), help=opt.help + env)


def load_options_from(ns: argparse.Namespace) -> dict:
    """The family load options given on the command line (for load_voice)."""
    return {k: getattr(ns, k) for k in load_options() if getattr(ns, k, None) is not None}


def option_values(ns: argparse.Namespace, rules: Mapping[str, OptionRule] | None = None) -> dict[str, object]:
    """The synthesis options given on the command line, by name, each checked against its rule
    (InvalidOptionError names a bad one): for a server, whose voices take each its own."""
    rules = synthesis_rules() if rules is None else rules
    return check_values({name: getattr(ns, name) for name in rules}, rules)


def options_from(ns: argparse.Namespace, options_type: type[SynthesisOptions], rules: Mapping[str, OptionRule] | None = None):
    """The options given on the command line as `options_type` (the voice's class), validated;
    a flag of another family's option is a ValueError naming the families that take it."""
    values = option_values(ns, rules)
    mine = option_rules(options_type)
    foreign = [k for k in values if k not in mine]
    if foreign:
        takers = synthesis_families()
        name = foreign[0]
        who = f" ({', '.join(takers[name])} voices take it)" if name in takers else ""
        raise ValueError(f"--{name.replace('_', '-')} is not an option of this voice{who}")
    return options_type(**values).validate()


def _shown(s: Setting) -> str:
    if s.families:
        return f"the family's, {s.default}" if s.default is not None else "the family's"
    return ",".join(s.default) if isinstance(s.default, tuple) else str(s.default)


def settings_args(p: argparse.ArgumentParser, names: tuple[str, ...] | None = None, env: bool = True) -> None:
    """A flag for each setting of the servers' tree (voxserve.serve.config: those in `names`,
    else all), and the hidden old names of those; `env`: the command reads the environment too."""
    chosen = [s for s in settings() if names is None or s.name in names]
    for s in chosen:
        help_ = f"{s.help} [{f'env {s.env}; ' if env else ''}default {_shown(s)}]"
        if s.name == "voices":
            p.add_argument(s.flag, dest="voices", action="append", default=None, help=help_)
        elif s.type is bool:
            p.add_argument(s.flag, dest=s.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            p.add_argument(s.flag, dest=s.name, type=s.type, default=None, help=help_)
    for old, new in DEPRECATED.items():
        if any(s.name == new for s in chosen):
            typ = next(s.type for s in chosen if s.name == new)
            p.add_argument("--" + old.replace("_", "-"), dest="deprecated_" + old, type=typ, default=None,
                           help=argparse.SUPPRESS)


def runtime_names() -> tuple[str, ...]:
    """The families' runtime options (the flags `say` has of the settings)."""
    return tuple(s.name for s in settings() if s.path[0] == "runtime")


def runtime_from(ns: argparse.Namespace) -> dict:
    """The runtime options given on a command line that has runtime_names()' flags (for load_voice)."""
    return {name: v for name in runtime_names() if (v := getattr(ns, name, None)) is not None}


def runtime_args(p: argparse.ArgumentParser) -> None:
    """A flag for each family's runtime option (`--threads`, `--max-sequences`, ...)."""
    settings_args(p, runtime_names(), env=False)
