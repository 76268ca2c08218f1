"""The family registry: built-in families, a family registered from outside, and no family-name
comparisons in generic code."""

from __future__ import annotations

import ast
import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import voxserve
from voxserve.families import (
    Family,
    VoiceSource,
    families,
    family_for_path,
    register_family,
    unregister_family,
)
from voxserve.voice import Unit, Voice
from voxserve.voices.registry import resolve_voice

SRC = Path(voxserve.__file__).parent


def test_builtin_families_registered():
    fams = families()
    assert {"piper", "bark"} <= set(fams)
    assert fams["piper"].options_type.__name__ == "PiperRuntimeOptions"
    assert fams["bark"].options_type.__name__ == "BarkRuntimeOptions"
    assert fams["bark"].prefix == "bark"
    assert fams["piper"].runner_kind == "one-shot" and fams["bark"].runner_kind == "step"
    assert family_for_path(Path("x/v.onnx")) is fams["piper"]
    assert family_for_path(Path("x/v.onnx.json")) is fams["piper"]
    assert family_for_path(Path("x/dir")) is None


@dataclass(frozen=True)
class FakeOptions:
    gain: float = 1.0


class FakeVoice(Voice):
    family = "fake"
    sample_rate = 8000
    device = "cpu"  # (the library's engine runs it on the CPU worker)

    def __init__(self, name, gain):
        self.name = name
        self.gain = gain

    def units(self, text, options=None):
        return iter([Unit(0, text, len(text), len(text))])

    def run_units(self, units, early=(), on_early=None):
        return [np.full(u.payload, self.gain, dtype=np.float32) for u in units]


@pytest.fixture
def fake_family():
    loaded = []

    def load(src, *, device, dtype, runtime, **kw):
        loaded.append((src, device, runtime, kw, threading.get_ident()))
        if runtime is not None and runtime.gain < 0:
            raise ValueError("bad gain")
        return FakeVoice(src.name, (runtime or FakeOptions()).gain)

    fam = register_family(Family(
        name="fake", load=load, options_type=FakeOptions,
        source=lambda path, name: VoiceSource(name or path.name, "fake", path),
        prefix="fake", frontend="characters", scan=lambda d: [VoiceSource("fake-in-dir", "fake", d / "x")],
    ))
    yield fam, loaded
    unregister_family("fake")


def test_fake_family_loads_through_load_voice(fake_family, monkeypatch, tmp_path):
    fam, loaded = fake_family
    assert families()["fake"] is fam
    v = voxserve.load_voice("fake:whatever", device="cpu", runtime=FakeOptions(gain=0.5))
    assert isinstance(v, FakeVoice) and v.name == "whatever" and v.limits is not None
    assert loaded[0][0] == VoiceSource("whatever", "fake", Path("whatever"))
    assert loaded[0][4] != threading.get_ident()  # loaded on a passing thread (runtime/cpu.py)
    with pytest.raises(ValueError, match="bad gain"):  # the loader's error reaches the caller
        voxserve.load_voice("fake:whatever", device="cpu", runtime=FakeOptions(gain=-1))
    audio = v.synthesize("abc")
    assert audio.sample_rate == 8000 and np.allclose(audio.samples[:3], 0.5)
    # listed: the family's scan finds its voices in $VOXSERVE_VOICES_PATH folders
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(tmp_path))
    assert "fake-in-dir" in voxserve.available_voices()
    assert resolve_voice("fake-in-dir").family == "fake"
    # register_voice names the family; describe works without a describe function
    src = voxserve.register_voice("my-fake", tmp_path / "y", family="fake")
    try:
        assert src.describe() == {"name": "my-fake", "family": "fake", "path": str(tmp_path / "y")}
    finally:
        from voxserve.voices import registry

        registry._registered.pop("my-fake", None)


def test_fake_family_unregisters(fake_family):
    fam, _ = fake_family
    with pytest.raises(ValueError, match="already registered"):
        register_family(Family(name="fake", load=fam.load, options_type=FakeOptions, source=fam.source))
    with pytest.raises(ValueError, match="prefix 'bark'"):
        register_family(Family(name="fake2", load=fam.load, options_type=FakeOptions, source=fam.source,
                               prefix="bark"))
    assert register_family(fam) is fam  # the same object again: a no-op
    unregister_family("fake")
    assert "fake" not in families()
    with pytest.raises(voxserve.VoiceLoadError, match="unknown voice family 'fake'"):
        voxserve.load_voice("fake:whatever", device="cpu")


def test_family_fields_checked():
    with pytest.raises(ValueError, match="runner_kind"):
        Family(name="x", load=print, options_type=dict, source=print, runner_kind="streaming")
    with pytest.raises(ValueError, match="prefix"):
        Family(name="x", load=print, options_type=dict, source=print, prefix="c")  # c: is a drive


# A family's name compared (==, !=, in, startswith...), or a source spelled "NAME:..." in code
# outside its folder. loadtest.py's "piper" is Piper's HTTP server as a benchmark target, and
# bench/'s "piper" / "bark" are its benchmark engines (arms), not families: both are left out.
# Docstrings and help texts that mention "bark:DIR" in a sentence are not code and pass.
_FAMILY_NAMES = {"piper", "bark"}
_EXEMPT = ("families/", "bench/", "loadtest.py")


def _is_name(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in _FAMILY_NAMES


def family_name_uses(source: str) -> list[int]:
    """Line numbers where `source` compares against a family name or spells a NAME: source."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_name(o) for o in operands) or any(
                    isinstance(o, (ast.Tuple, ast.List, ast.Set)) and any(_is_name(e) for e in o.elts)
                    for o in operands):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "startswith", "endswith", "partition", "split", "removeprefix"):
            if any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                   and a.value.rstrip(":") in _FAMILY_NAMES for a in node.args):
                lines.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(node.value.startswith(f"{n}:") for n in _FAMILY_NAMES):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_no_family_names_compared_outside_families():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(_EXEMPT):
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        bad += [f"{rel}:{n}: {lines[n - 1].strip()}" for n in family_name_uses(text)]
    assert not bad, "family names compared outside voxserve/families:\n" + "\n".join(bad)


def test_the_check_catches_a_comparison():
    assert family_name_uses('if src.family == "bark":\n    pass')
    assert family_name_uses("x = family != 'piper'")
    assert family_name_uses("x = f in ('piper', 'other')")
    assert family_name_uses('x = key.startswith("bark:")')
    assert family_name_uses('x = "bark:" + path')
    assert not family_name_uses('"""Load "bark:DIR" voices."""\nfamily = "piper_like"')


def test_runtime_options_are_the_familys_type_or_its_fields_by_name(fake_family):
    """load_voice reads Family.options_type: runtime= is the family's own type (another
    family's is a TypeError, not silently half-applied), and its fields are keywords too."""
    fam, loaded = fake_family
    v = voxserve.load_voice("fake:k", device="cpu", gain=0.25)
    assert v.gain == 0.25 and loaded[-1][2] == FakeOptions(gain=0.25)
    v = voxserve.load_voice("fake:k", device="cpu", runtime=FakeOptions(gain=0.5), gain=0.75)
    assert v.gain == 0.75  # a keyword over runtime's field
    assert voxserve.load_voice("fake:k", device="cpu", max_sequences=4).gain == 1.0  # Bark's: not fake's
    bark_options = families()["bark"].options_type
    with pytest.raises(TypeError, match="fake voice is a .*FakeOptions"):
        voxserve.load_voice("fake:k", device="cpu", runtime=bark_options())
    with pytest.raises(TypeError, match="no_such_option"):
        voxserve.load_voice("fake:k", device="cpu", no_such_option=1)


def test_the_public_api_holds_no_familys_class_as_generic():
    assert "RuntimeOptions" not in voxserve.__all__ and not hasattr(voxserve, "RuntimeOptions")
    piper = families()["piper"].options_type
    switches = {"cpu_channels_last", "cpu_gemm_convs", "fold_average", "decode_layout", "cpu_decode_tiles",
                "shape_buckets", "graph_grid", "first_audio_frames", "first_audio_split_frames", "attention"}
    assert not switches & {f.name for f in dataclasses.fields(piper)}  # developers' switches: Transforms


def test_the_built_in_families_keep_their_order_whichever_is_imported_first():
    """Listings and docs/configuration.md follow families(); a test that imported a family
    module first once reordered them (CI failed on a stale doc)."""
    import subprocess
    import sys

    code = ("import voxserve.families.cosyvoice2, voxserve.families.bark\n"
            "from voxserve.families import BUILTIN, families\n"
            "print(list(families())[:len(BUILTIN)] == list(BUILTIN))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]
