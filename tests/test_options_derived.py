"""SynthesisOptions' rules are the one source of the HTTP schema's option fields and of the
CLI's synthesis flags: a field added to the dataclass is both, with its type, help and range."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from voxserve import InvalidOptionError, SynthesisOptions
from voxserve.cli import options_args, options_from
from voxserve.options import integer, number, option_range, option_rules
from voxserve.serve.schemas import SpeechRequest, SynthesizeRequest, synthesize_request_model


@dataclass(frozen=True)
class WithPitch(SynthesisOptions):
    pitch: float | None = number(-12.0, 12.0, "pitch shift", "semitones")
    steps: int | None = integer(1, 64, "decoder steps")


def _schema_range(prop: dict) -> tuple:
    branch = next(b for b in prop["anyOf"] if b.get("type") in ("number", "integer"))
    return branch["minimum"], branch["maximum"]


def test_a_new_field_is_an_http_field_with_its_type_and_range():
    model = synthesize_request_model(WithPitch)
    props = model.model_json_schema()["properties"]
    assert _schema_range(props["pitch"]) == (-12.0, 12.0) and "semitones" in props["pitch"]["description"]
    assert _schema_range(props["steps"]) == (1, 64)
    req = model(text="Hi.", pitch=3.5, steps=8)
    assert req.options() == WithPitch(pitch=3.5, steps=8)
    with pytest.raises(ValidationError):  # strict types, as for the built-in options
        model(text="Hi.", steps=1.0)
    with pytest.raises(ValidationError):
        model(text="Hi.", pitch=True)
    assert model(text="Hi.", pitch=99.0).options().pitch == 99.0  # the range is validate()'s to check
    with pytest.raises(InvalidOptionError, match="pitch"):
        model(text="Hi.", pitch=99.0).options().validate()


def test_a_new_field_is_a_cli_flag_with_its_type_and_help():
    p = argparse.ArgumentParser()
    options_args(p, WithPitch)
    helps = {a.dest: a.help for a in p._actions}
    assert "-12-12 semitones" in helps["pitch"]
    ns = p.parse_args(["--pitch", "-2.5", "--steps", "4", "--speaker", "3", "--speed", "1.5"])
    assert options_from(ns, WithPitch) == WithPitch(pitch=-2.5, steps=4, speaker=3, speed=1.5)
    with pytest.raises(SystemExit):
        p.parse_args(["--steps", "1.5"])


def test_a_field_without_a_rule_is_refused():
    @dataclass(frozen=True)
    class Bad(SynthesisOptions):
        loose: float | None = None

    with pytest.raises(TypeError, match="loose"):
        option_rules(Bad)


def test_served_schemas_carry_every_option_and_its_range():
    from serve_fakes import FakeVoice

    from voxserve.engine import Engine
    from voxserve.serve.app import AppConfig, create_app

    engine = Engine([FakeVoice()])
    try:
        spec = create_app(engine, AppConfig(warmup=False)).openapi()
    finally:
        engine.shutdown(1.0)
    props = spec["components"]["schemas"]["SynthesizeRequest"]["properties"]
    for name, rule in option_rules().items():
        assert name in props, name
        if rule.kind in ("number", "integer"):
            assert _schema_range(props[name]) == pytest.approx(option_range(name))  # JSON: a float for 2^63-1
    speech = spec["components"]["schemas"]["SpeechRequest"]["properties"]["speed"]
    assert (speech["minimum"], speech["maximum"]) == option_range("speed")
    assert set(SynthesizeRequest.model_fields) >= set(option_rules())
    assert {"model", "input", "voice", "response_format", "speed"} <= set(SpeechRequest.model_fields)


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", ["README.md", "docs/configuration.md"])
def test_documented_ranges_are_the_rules(doc):
    """The option tables in the README and docs/configuration.md state each range as the rule does."""
    text = (ROOT / doc).read_text()
    for name, rule in option_rules().items():
        if rule.kind != "number":
            continue
        row = re.search(rf"^\| `{name}` \| ([0-9.]+) ?(?:-|\.\.) ?([0-9.]+)", text, re.M)
        assert row, f"{doc}: no range row for {name}"
        assert (float(row[1]), float(row[2])) == rule.range, f"{doc}: {name}"
