"""`voxserve bench`, the product's: each voice's speed on this machine, beside Piper where it is
installed. (The laboratory that compares builds is benchmarks/harness, tests/bench.)"""

from __future__ import annotations

import json

import pytest

from voxserve.bench import QUICK, BenchSettings, render, settings_from
from voxserve.cli import build_parser, main


def parse(*args):
    return build_parser().parse_args(["bench", *args])


def test_flags_give_the_settings(tmp_path):
    assert settings_from(parse()) == BenchSettings()
    quick = settings_from(parse("--quick"))
    assert (quick.runs, quick.batch) == (QUICK["runs"], QUICK["batch"])
    texts = tmp_path / "t.txt"
    texts.write_text("One.\n\nTwo.\n", encoding="utf-8")
    s = settings_from(parse("--quick", "--runs", "2", "--voice", "a", "--voice", "b", "--text-file", str(texts),
                            "--no-piper"))
    assert (s.runs, s.voices, s.texts, s.piper) == (2, ("a", "b"), ("One.", "Two."), False)
    with pytest.raises(ValueError, match="runs"):
        settings_from(parse("--runs", "0"))
    assert main(["bench", "--text-file", str(tmp_path / "missing.txt")]) == 2


def test_quick_measures_the_voice_beside_piper(tiny_voice_path, tmp_path, capsys, one_torch_thread):
    pytest.importorskip("piper", reason="piper-tts is not installed")
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--runs", "1", "--voice", str(tiny_voice_path), "--device", "cpu",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (voice,) = result["voices"]
    assert voice["piper"] == "measured" and voice["family"] == "piper"
    engines = {e["engine"]: e for e in voice["engines"]}
    assert set(engines) == {"voxserve", "Piper (onnxruntime CPU)"}
    batch = f"batch_of_{QUICK['batch']}"
    for e in engines.values():
        for figure in ("one_sentence", batch, "first_audio"):
            assert e[figure]["runs"] == 1 and e[figure]["seconds"] > 0 and e[figure]["audio_s"] > 0
        # a batch says more than one of its sentences; the stream's first audio comes before its end
        assert e[batch]["audio_s"] > e["one_sentence"]["audio_s"]
    printed = capsys.readouterr().out
    assert printed == render(result)
    assert "voxserve against Piper: one sentence" in printed


def test_without_piper_the_voice_is_measured_alone(tiny_voice_path, capsys, one_torch_thread):
    assert main(["bench", "--runs", "1", "--batch", "2", "--voice", str(tiny_voice_path), "--device", "cpu",
                 "--no-piper"]) == 0
    out = capsys.readouterr().out
    assert "| voxserve |" in out and "Piper" not in out
