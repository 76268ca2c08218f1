"""`voxserve serve` settings: dataclass defaults, then environment, then flags."""

from __future__ import annotations

import pytest

from voxserve.cli import build_parser
from voxserve.engine import EngineConfig
from voxserve.engine.scheduler import SchedulerConfig
from voxserve.limits import Limits
from voxserve.serve.settings import ServeSettings, settings_from


def parse(*args):
    return build_parser().parse_args(["serve", *args])


def test_defaults_are_the_dataclasses():
    s = settings_from(parse(), environ={})
    assert s == ServeSettings()
    assert s.scheduler_config() == SchedulerConfig()


def test_flag_beats_environment_beats_default():
    env = {"VOXSERVE_MAX_BATCH_PHONEMES": "128", "VOXSERVE_MAX_STARVE_MS": "900", "VOXSERVE_DTYPE": "bf16"}
    s = settings_from(parse(), environ=env)
    assert (s.max_batch_phonemes, s.max_starve_ms, s.dtype) == (128, 900.0, "bf16")
    assert s.scheduler_config().max_starve_ms == 900.0
    s = settings_from(parse("--max-batch-phonemes", "512", "--dtype", "fp32"), environ=env)
    assert (s.max_batch_phonemes, s.max_starve_ms, s.dtype) == (512, 900.0, "fp32")
    assert settings_from(parse(), environ={"VOXSERVE_THREADS": "3"}).threads == 3  # an int, not "3"


def test_engine_settings_and_the_executor_choice():
    assert settings_from(parse(), environ={}).engine_config() == EngineConfig()
    assert settings_from(parse("--executor", "serial"), environ={}).engine_config().executor == "serial"
    assert settings_from(parse(), environ={"VOXSERVE_EXECUTOR": "auto"}).engine_config().executor == "auto"
    for removed in ("--urgent-order", "--spill", "--lone-team-max-cost", "--aging-per-s", "--lane-batch-size",
                    "--lanes", "--urgent-max-cost", "--lane-nice"):
        with pytest.raises(SystemExit):  # measured and not kept: no longer settings
            parse(removed, "1")

def test_bad_values_are_clear_errors():
    with pytest.raises(ValueError, match="VOXSERVE_MAX_BATCH_PHONEMES"):
        settings_from(parse(), environ={"VOXSERVE_MAX_BATCH_PHONEMES": "many"})
    with pytest.raises(SystemExit):
        parse("--max-wait-ms", "soon")
    with pytest.raises(ValueError, match="max_batch_phonemes"):
        settings_from(parse("--max-batch-phonemes", "0"), environ={}).scheduler_config()


def test_read_timeouts_connections_and_audio_limits():
    s = settings_from(parse(), environ={})
    a = s.app_config()
    assert (a.header_timeout_s, a.body_timeout_s, a.max_connections) == (10.0, 30.0, 1024)
    assert s.limits() == Limits()
    a = settings_from(parse("--read-timeout", "2"), environ={"VOXSERVE_MAX_CONNECTIONS": "64"}).app_config()
    assert (a.header_timeout_s, a.body_timeout_s, a.max_connections) == (2.0, 2.0, 64)
    a = settings_from(parse("--read-timeout", "60"), environ={}).app_config()
    assert (a.header_timeout_s, a.body_timeout_s) == (10.0, 60.0)
    with pytest.raises(ValueError, match="read_timeout"):
        settings_from(parse("--read-timeout", "0"), environ={}).app_config()
    lim = settings_from(parse("--max-audio-seconds", "90"), environ={"VOXSERVE_MAX_SENTENCE_AUDIO_SECONDS": "30"}).limits()
    assert (lim.max_audio_seconds, lim.max_sentence_audio_seconds) == (90.0, 30.0)
    with pytest.raises(ValueError, match="max_sentence_audio_seconds"):
        settings_from(parse("--max-sentence-audio-seconds", "-1"), environ={}).limits()


def test_empty_api_key_flag_is_an_error_not_auth_off():
    env = {"VOXSERVE_API_KEY": "from-env"}
    assert settings_from(parse(), environ=env).app_config().api_key == "from-env"
    assert settings_from(parse("--api-key", "k"), environ=env).app_config().api_key == "k"
    for empty in ("", "   "):
        with pytest.raises(ValueError, match="--api-key is empty"):
            settings_from(parse(f"--api-key={empty}"), environ=env)


def test_serve_bad_input_exit_codes(capsys, tmp_path, monkeypatch):
    from voxserve.cli import main

    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(tmp_path))
    assert main(["serve", "--device", "cpu", "--api-key="]) == 2
    assert main(["serve", "--device", "cpu", "--voice", str(tmp_path / "missing.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("voxserve: error:") for line in err), err


def test_executor_setting():
    assert settings_from(parse("--executor", "serial"), environ={}).engine_config().executor == "serial"
    assert settings_from(parse(), environ={"VOXSERVE_EXECUTOR": "serial"}).engine_config().executor == "serial"
    for bad in ("fast", "lanes"):  # "lanes" was what auto does
        with pytest.raises(ValueError, match="executor"):
            settings_from(parse("--executor", bad), environ={}).engine_config()
