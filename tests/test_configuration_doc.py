"""docs/configuration.md names every setting a user can change, so that it cannot drift from
the settings tree, the families' options types and the CLI: its tables are generated
(scripts/configuration_doc.py) and must be what the generator makes of today's code."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import fields
from pathlib import Path

import pytest

from voxserve.cli import build_parser
from voxserve.engine import EngineConfig
from voxserve.engine.scheduler import SchedulerConfig
from voxserve.families import families, synthesis_rules
from voxserve.limits import Limits
from voxserve.options import SynthesisOptions
from voxserve.serve.config import AppConfig, settings

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "configuration.md").read_text()


def _generator():
    spec = importlib.util.spec_from_file_location("configuration_doc", ROOT / "scripts" / "configuration_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_the_doc_is_what_the_generator_makes():
    assert _generator().render(DOC) == DOC, "docs/configuration.md is stale: run scripts/configuration_doc.py"


def test_every_setting_has_a_when_to_change():
    when = _generator().WHEN
    assert {s.name for s in settings()} <= set(when)


@pytest.mark.parametrize("setting", settings(), ids=lambda s: s.name)
def test_every_setting_has_its_flag_and_variable(setting):
    assert f"`{setting.flag}`" in DOC
    assert f"`{setting.env}`" in DOC


@pytest.mark.parametrize("command", ["serve", "say", "wyoming"])
def test_every_flag_is_documented(command):
    options = set(synthesis_rules())  # their flags: the synthesis options' tables
    for action in _subcommand(command)._actions:
        if action.option_strings and action.dest not in ("help", *options) and action.help != argparse.SUPPRESS:
            assert any(f"`{o}" in DOC for o in action.option_strings), action.option_strings


@pytest.mark.parametrize("cls", [Limits, SynthesisOptions, EngineConfig, SchedulerConfig, AppConfig,
                                 *(f.options_type for f in families().values()),
                                 *(f.synthesis_options for f in families().values())], ids=lambda c: c.__name__)
def test_every_field_is_documented(cls):
    for f in fields(cls):
        if cls is AppConfig and f.name == "warmup":  # --no-warmup
            continue
        assert f"`{f.name}`" in DOC or f"`--{f.name.replace('_', '-')}`" in DOC, f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize("fam", families().values(), ids=lambda f: f.name)
def test_every_synthesis_option_has_its_row_in_its_familys_table(fam):
    """The generated tables: the common options once, then each family's own under its class."""
    cls = fam.synthesis_options
    section = DOC.split(f"### `{cls.__name__}`: {fam.name} voices", 1)[1].split("<!-- end generated", 1)[0].split("###", 1)[0]
    own = [f.name for f in fields(cls) if f.name not in {g.name for g in fields(SynthesisOptions)}]
    assert [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")] == own
