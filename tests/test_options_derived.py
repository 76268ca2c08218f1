"""Synthesis options per family: SynthesisOptions holds what every voice honours, each family
registers its own class (`Family.synthesis_options`), and the registered classes' rules are the
one source of the HTTP schema's option fields and of the CLI's synthesis flags: a field a family
adds is both, with its type, help and range."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
from pydantic import ValidationError

from voxserve import DETERMINISTIC, InvalidOptionError, SynthesisOptions
from voxserve.cli import options_args, options_from
from voxserve.families import (
    Family,
    VoiceSource,
    families,
    register_family,
    synthesis_rules,
    unregister_family,
)
from voxserve.families.bark import BarkOptions
from voxserve.families.cosyvoice2 import CosyOptions
from voxserve.families.piper import PiperOptions
from voxserve.families.sbv2 import Sbv2Options
from voxserve.options import NOISE_SCALE, integer, number, option, option_range, option_rules, options_for
from voxserve.serve.schemas import SpeechRequest, SynthesizeRequest, synthesize_request_model

COMMON = ["speaker", "speed", "sentence_silence", "seed"]
OWN = {
    PiperOptions: ["noise_scale", "noise_w", "normalize", "input_format"],
    Sbv2Options: ["noise_scale", "noise_w", "style", "style_weight", "sdp_ratio", "language"],
    BarkOptions: ["temperature"],
    CosyOptions: ["normalize", "instructions", "cross_lingual"],
}


@dataclass(frozen=True)
class WithPitch(SynthesisOptions):
    pitch: float | None = number(-12.0, 12.0, "pitch shift", "semitones")
    steps: int | None = integer(1, 64, "decoder steps")


@pytest.fixture
def pitch_family():
    """A family registered with its own options class (as a plug-in family would be)."""
    families()  # the built-in ones first, as at start-up
    fam = register_family(Family(name="pitchy", load=lambda *a, **k: None, options_type=type("R", (), {}),
                                 source=lambda p, n=None: VoiceSource(n or str(p), "pitchy", p),
                                 synthesis_options=WithPitch))
    yield fam
    unregister_family("pitchy")


def _schema_range(prop: dict) -> tuple:
    branch = next(b for b in prop["anyOf"] if b.get("type") in ("number", "integer"))
    return branch["minimum"], branch["maximum"]


def test_each_family_class_has_exactly_its_fields():
    assert [f.name for f in fields(SynthesisOptions)] == COMMON
    for cls, own in OWN.items():
        assert [f.name for f in fields(cls)] == COMMON + own, cls.__name__
    assert {f.synthesis_options for f in families().values()} == set(OWN)


def test_a_field_of_another_family_is_a_type_error_in_the_library():
    with pytest.raises(TypeError, match="temperature"):
        PiperOptions(temperature=0.5)
    with pytest.raises(TypeError, match="noise_scale"):
        BarkOptions(noise_scale=0.0)
    with pytest.raises(TypeError, match="PiperOptions"):
        PiperOptions.of(BarkOptions(temperature=0.5))  # another family's class as a whole
    with pytest.raises(TypeError, match="Sbv2Options"):
        Sbv2Options.of(PiperOptions())  # the same field names, not the same family


def test_a_plain_synthesis_options_and_deterministic_become_each_family_class():
    for cls in OWN:
        opts = cls.of(SynthesisOptions(speaker=1, seed=7))
        assert type(opts) is cls and (opts.speaker, opts.seed) == (1, 7)
        assert cls.of(None) == cls()
        assert cls.of(DETERMINISTIC.merged(SynthesisOptions(speed=1.5))) == cls.deterministic().merged(
            SynthesisOptions(speed=1.5))
    assert PiperOptions.of(DETERMINISTIC) == PiperOptions(noise_scale=0.0, noise_w=0.0)
    assert BarkOptions.of(DETERMINISTIC) == BarkOptions(temperature=0.0)
    assert Sbv2Options.of(DETERMINISTIC) == Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)
    assert CosyOptions.of(DETERMINISTIC) == CosyOptions(seed=0)  # its sampler has no greedy mode: a fixed seed
    with pytest.raises(InvalidOptionError, match="noise_w"):
        PiperOptions.of(PiperOptions(noise_w=9.0))  # validated on the way in


def test_the_schema_and_the_flags_are_the_union_of_the_families_fields():
    union = synthesis_rules()
    assert list(union) == COMMON + ["noise_scale", "noise_w", "normalize", "input_format", "style", "style_weight",
                                    "sdp_ratio", "language", "temperature", "instructions", "cross_lingual"]
    for cls in OWN:  # each field once, with its class's rule
        for name, rule in option_rules(cls).items():
            assert union[name] == rule, name
    assert set(SynthesizeRequest.model_fields) >= set(union)
    assert set(SpeechRequest.model_fields) >= set(union)
    p = argparse.ArgumentParser()
    options_args(p)
    helps = {a.dest: a.help for a in p._actions}
    assert set(helps) >= set(union)
    assert helps["noise_scale"].endswith("[piper, sbv2 voices]") and helps["temperature"].endswith("[bark voices]")
    assert "voices]" not in helps["speed"]  # every voice takes it


def test_a_registered_family_field_is_an_http_field_with_its_type_and_range(pitch_family):
    model = synthesize_request_model()
    props = model.model_json_schema()["properties"]
    assert _schema_range(props["pitch"]) == (-12.0, 12.0) and "semitones" in props["pitch"]["description"]
    assert "[pitchy voices]" in props["pitch"]["description"]
    assert _schema_range(props["steps"]) == (1, 64)
    req = model(text="Hi.", pitch=3.5, steps=8)
    assert options_for(WithPitch, req.option_values(), synthesis_rules()) == WithPitch(pitch=3.5, steps=8)
    with pytest.raises(ValidationError):  # strict types, as for the built-in options
        model(text="Hi.", steps=1.0)
    with pytest.raises(ValidationError):
        model(text="Hi.", pitch=True)
    assert model(text="Hi.", pitch=99.0).option_values()["pitch"] == 99.0  # the range is the rule's to check
    with pytest.raises(InvalidOptionError, match="pitch"):
        options_for(WithPitch, model(text="Hi.", pitch=99.0).option_values(), synthesis_rules())


def test_a_registered_family_field_is_a_cli_flag_with_its_type_and_help(pitch_family):
    p = argparse.ArgumentParser()
    options_args(p)
    helps = {a.dest: a.help for a in p._actions}
    assert "-12-12 semitones" in helps["pitch"]
    ns = p.parse_args(["--pitch", "-2.5", "--steps", "4", "--speaker", "3", "--speed", "1.5"])
    assert options_from(ns, WithPitch) == WithPitch(pitch=-2.5, steps=4, speaker=3, speed=1.5)
    with pytest.raises(ValueError, match="--pitch is not an option of this voice .pitchy voices take it"):
        options_from(ns, PiperOptions)  # the CLI names one voice: another family's flag is an error
    with pytest.raises(SystemExit):
        p.parse_args(["--steps", "1.5"])
    with pytest.raises(InvalidOptionError, match="steps"):
        options_from(p.parse_args(["--steps", "65"]), WithPitch)


def test_servers_drop_the_options_a_voice_does_not_take_after_checking_them():
    rules = synthesis_rules()
    values = {"speed": 1.5, "temperature": 0.3, "noise_scale": None, "instructions": "Calmly."}
    assert options_for(PiperOptions, values, rules) == PiperOptions(speed=1.5)
    assert options_for(BarkOptions, values, rules) == BarkOptions(speed=1.5, temperature=0.3)
    assert options_for(CosyOptions, values, rules) == CosyOptions(speed=1.5, instructions="Calmly.")
    with pytest.raises(InvalidOptionError, match="temperature"):  # a bad value is a 400 whoever would take it
        options_for(PiperOptions, {"temperature": 9.0}, rules)


def test_a_field_without_a_rule_is_refused():
    @dataclass(frozen=True)
    class Bad(SynthesisOptions):
        loose: float | None = None

    with pytest.raises(TypeError, match="loose"):
        option_rules(Bad)
    with pytest.raises(TypeError, match="loose"):  # at registration
        Family(name="bad", load=lambda *a, **k: None, options_type=object, source=lambda p, n=None: None,
               synthesis_options=Bad)


def test_a_name_two_families_share_has_one_rule(pitch_family):
    @dataclass(frozen=True)
    class OtherNoise(SynthesisOptions):
        noise_scale: float | None = number(0.0, 3.0, "generator noise")

    @dataclass(frozen=True)
    class SameNoise(SynthesisOptions):
        noise_scale: float | None = option(NOISE_SCALE)

    def family(name, cls):
        return Family(name=name, load=lambda *a, **k: None, options_type=object,
                      source=lambda p, n=None: None, synthesis_options=cls)

    with pytest.raises(ValueError, match="noise_scale.*another rule"):
        register_family(family("othernoise", OtherNoise))
    assert "othernoise" not in families()
    register_family(family("samenoise", SameNoise))
    unregister_family("samenoise")


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
    for name, rule in synthesis_rules().items():
        assert name in props, name
        if rule.kind in ("number", "integer"):
            assert _schema_range(props[name]) == pytest.approx(rule.range)  # JSON: a float for 2^63-1
    speech = spec["components"]["schemas"]["SpeechRequest"]["properties"]["speed"]
    assert (speech["minimum"], speech["maximum"]) == option_range("speed")
    assert {"model", "input", "voice", "response_format", "speed"} <= set(SpeechRequest.model_fields)


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", ["README.md", "docs/configuration.md"])
def test_documented_ranges_are_the_rules(doc):
    """The option tables in the README and docs/configuration.md state each range as the rule does."""
    text = (ROOT / doc).read_text()
    for name, rule in synthesis_rules().items():
        if rule.kind != "number":
            continue
        row = re.search(rf"^\| `{name}` \| ([0-9.]+) ?(?:-|\.\.) ?([0-9.]+)", text, re.M)
        assert row, f"{doc}: no range row for {name}"
        assert (float(row[1]), float(row[2])) == rule.range, f"{doc}: {name}"


def test_say_refuses_another_familys_flag_before_the_voice_loads(tiny_voice_path, tmp_path, capsys):
    """`voxserve say` names one voice: a flag its family does not take is a usage error (exit 2)
    naming the families that take it, not an option silently ignored."""
    from voxserve.cli import main

    out = tmp_path / "x.wav"
    rc = main(["say", "Hello.", "--voice", str(tiny_voice_path), "-o", str(out), "--temperature", "0.5"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--temperature" in err and "bark" in err and len(err.splitlines()) == 1, err
    assert not out.exists()
    assert main(["say", "Hello.", "--voice", str(tiny_voice_path), "-o", str(out), "--noise-scale", "0"]) == 0
