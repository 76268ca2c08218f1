"""docs/configuration.md names every setting a user can change, so that it cannot drift from
the dataclasses and the CLI."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from voxserve.cli import build_parser
from voxserve.engine import EngineConfig
from voxserve.engine.scheduler import SchedulerConfig
from voxserve.families.bark.voice import BarkRuntimeOptions
from voxserve.families.piper.options import RuntimeOptions
from voxserve.limits import Limits
from voxserve.options import SynthesisOptions
from voxserve.serve.settings import ServeSettings, env_name

DOC = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()


def _subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("field", [f.name for f in fields(ServeSettings)])
def test_every_serve_setting_has_its_flag_and_variable(field):
    flag = "--voice" if field == "voices" else "--" + field.replace("_", "-")
    assert f"`{flag}" in DOC
    assert f"`{env_name(field)}`" in DOC


@pytest.mark.parametrize("command", ["serve", "say"])
def test_every_flag_is_documented(command):
    options = {f.name for f in fields(SynthesisOptions)}  # their flags: the options' table
    for action in _subcommand(command)._actions:
        if action.option_strings and action.dest not in ("help", *options):
            assert any(f"`{o}" in DOC for o in action.option_strings), action.option_strings


@pytest.mark.parametrize("cls", [RuntimeOptions, BarkRuntimeOptions, Limits, SynthesisOptions,
                                 EngineConfig, SchedulerConfig])
def test_every_field_is_documented(cls):
    for f in fields(cls):
        assert f"`{f.name}`" in DOC, f"{cls.__name__}.{f.name}"
