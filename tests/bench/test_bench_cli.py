"""`voxserve bench` on the command line: options, dry run, rendering a saved result into files."""

from __future__ import annotations

import json

import pytest

from voxserve.bench import BenchSettings, settings_from
from voxserve.bench.core import QUICK
from voxserve.cli import build_parser, main


def parse(*args):
    return build_parser().parse_args(["bench", *args])


def test_bench_is_a_subcommand_with_dataclass_defaults():
    ns = parse()
    s = settings_from(ns)
    assert s == BenchSettings()  # no option given: exactly the dataclass defaults


def test_quick_and_explicit_options():
    s = settings_from(parse("--quick"))
    assert s.quick and s.sizes == QUICK["sizes"] and s.runs == BenchSettings().runs >= 5
    s = settings_from(
        parse(
            "--quick",
            "--runs",
            "7",
            "--sizes",
            "1,3",
            "--configs",
            "vox-cpu,piper-cpu-t1",
            "--no-memory",
            "--device",
            "cpu",
        )
    )
    assert (s.runs, s.sizes, s.configs, s.memory, s.device) == (
        7,
        (1, 3),
        ("vox-cpu", "piper-cpu-t1"),
        False,
        "cpu",
    )
    with pytest.raises(SystemExit):
        parse("--sizes", "a,b")
    with pytest.raises(ValueError, match="runs"):
        settings_from(parse("--runs", "0"))
    with pytest.raises(ValueError, match="unknown suite"):
        settings_from(parse("--suites", "nope"))


def test_list_configs(capsys):
    assert main(["bench", "--list-configs"]) == 0
    out = capsys.readouterr().out
    assert "vox-cpu " in out and "piper-cpu " in out and "vox-cuda-fp16-graphs" in out


def test_dry_run_on_this_machine_and_for_cuda(tiny_voice_path, capsys):
    assert main(["bench", "--dry-run", "--voice", str(tiny_voice_path), "--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "vox-cpu" in out and "would run" in out
    import torch

    if not torch.cuda.is_available():  # the CUDA plan is still printed, each row saying why not
        assert main(["bench", "--dry-run", "--voice", str(tiny_voice_path), "--device", "cuda"]) == 0
        out = capsys.readouterr().out
        assert "vox-cuda-fp32" in out and "no CUDA device" in out and "piper-cpu" in out


def test_unknown_configuration_is_a_usage_error(tiny_voice_path, capsys):
    assert main(["bench", "--dry-run", "--voice", str(tiny_voice_path), "--configs", "vox-gpu-turbo"]) == 2
    assert "unknown configuration" in capsys.readouterr().err


def test_from_json_rejects_a_broken_file(tmp_path, capsys):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"schema": "voxserve.bench/1"}))
    assert main(["bench", "--from-json", str(f)]) == 2
    assert "does not fit" in capsys.readouterr().err


@pytest.mark.parametrize("native", [False, True])
def test_quick_skips_bf16_on_a_cpu_that_emulates_it(tiny_voice_path, monkeypatch, native):
    """--quick measures what this CPU runs natively: without AVX512-BF16/AMX the bf16 arm is
    skipped with the reason (it took most of a 5-minute --quick on an AVX2 EPYC); the full run,
    and a CPU with native bf16, keep it."""
    from voxserve.bench import core
    from voxserve.runtime import device

    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: native)
    s = BenchSettings(voice=str(tiny_voice_path), device="cpu")
    quick = {a["name"]: a for a in core.plan(core.quick_settings(s), device="cpu")["arms"]}
    full = {a["name"]: a for a in core.plan(s, device="cpu")["arms"]}
    assert full["vox-cpu-bf16"]["status"] == "would run"
    assert quick["vox-cpu"]["status"] == "would run"
    if native:
        assert quick["vox-cpu-bf16"]["status"] == "would run"
    else:
        assert quick["vox-cpu-bf16"]["status"] == "skipped"
        assert "no native bf16" in quick["vox-cpu-bf16"]["reason"]
