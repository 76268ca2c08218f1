"""Command-line flags made from the option dataclasses (a flag per `SynthesisOptions` field, its
help and range from the field's rule) and from the families' load options (`--bert-dir`):
shared by the parsers of `say`, `serve`, `wyoming` and `bench`, and read back from argparse.
Light on purpose: `voxserve --help` builds every parser."""

from __future__ import annotations

import argparse

from .families import load_options
from .options import SynthesisOptions, option_rules


def options_args(p: argparse.ArgumentParser, options_type: type = SynthesisOptions) -> None:
    """A flag for every option of `options_type` (default None = the voice's default), its type,
    help and range from the option's rule, which `validate()` applies."""
    for name, rule in option_rules(options_type).items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=_named(rule.parse, rule.kind.replace("_", " ")),
                       default=None, help=rule.help_text, metavar=name.upper())


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


def options_from(ns: argparse.Namespace, options_type: type = SynthesisOptions):
    return options_type(**{name: getattr(ns, name) for name in option_rules(options_type)})
