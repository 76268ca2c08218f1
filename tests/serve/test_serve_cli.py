"""`voxserve serve` settings: dataclass defaults, then environment, then flags."""

from __future__ import annotations

import pytest

from voxserve.cli import build_parser
from voxserve.engine import EngineConfig
from voxserve.engine.scheduler import SchedulerConfig
from voxserve.limits import Limits
from voxserve.serve.config import settings
from voxserve.serve.settings import ServeSettings, settings_from


def parse(*args):
    return build_parser().parse_args(["serve", *args])


def test_defaults_are_the_dataclasses():
    s = settings_from(parse(), environ={})
    assert s == ServeSettings()
    assert s.engine.scheduler == SchedulerConfig()


def test_flag_beats_environment_beats_default():
    env = {"VOXSERVE_MAX_BATCH_PHONEMES": "128", "VOXSERVE_MAX_STARVE_MS": "900", "VOXSERVE_DTYPE": "bf16"}
    s = settings_from(parse(), environ=env)
    sched = s.engine.scheduler
    assert (sched.max_batch_phonemes, sched.max_starve_ms, s.load.dtype) == (128, 900.0, "bf16")
    s = settings_from(parse("--max-batch-phonemes", "512", "--dtype", "fp32"), environ=env)
    sched = s.engine.scheduler
    assert (sched.max_batch_phonemes, sched.max_starve_ms, s.load.dtype) == (512, 900.0, "fp32")
    assert settings_from(parse(), environ={"VOXSERVE_THREADS": "3"}).runtime["threads"] == 3  # an int, not "3"


def test_engine_settings_and_the_executor_choice():
    assert settings_from(parse(), environ={}).engine == EngineConfig()
    assert settings_from(parse("--executor", "serial"), environ={}).engine.executor == "serial"
    assert settings_from(parse(), environ={"VOXSERVE_EXECUTOR": "auto"}).engine.executor == "auto"
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
        settings_from(parse("--max-batch-phonemes", "0"), environ={})


def test_read_timeouts_connections_and_audio_limits():
    s = settings_from(parse(), environ={})
    a = s.http
    assert (a.header_timeout_s, a.body_timeout_s, a.max_connections) == (10.0, 30.0, 1024)
    assert s.limits == Limits()
    a = settings_from(parse("--body-timeout-s", "2", "--header-timeout-s", "1"),
                      environ={"VOXSERVE_MAX_CONNECTIONS": "64"}).http
    assert (a.header_timeout_s, a.body_timeout_s, a.max_connections) == (1.0, 2.0, 64)
    with pytest.raises(ValueError, match="body_timeout_s"):
        settings_from(parse("--body-timeout-s", "0"), environ={})
    lim = settings_from(parse("--max-audio-seconds", "90"), environ={"VOXSERVE_MAX_SENTENCE_AUDIO_SECONDS": "30"}).limits
    assert (lim.max_audio_seconds, lim.max_sentence_audio_seconds) == (90.0, 30.0)
    with pytest.raises(ValueError, match="max_sentence_audio_seconds"):
        settings_from(parse("--max-sentence-audio-seconds", "-1"), environ={})


def test_empty_api_key_flag_is_an_error_not_auth_off():
    env = {"VOXSERVE_API_KEY": "from-env"}
    assert settings_from(parse(), environ=env).http.api_key == "from-env"
    assert settings_from(parse("--api-key", "k"), environ=env).http.api_key == "k"
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
    assert settings_from(parse("--executor", "serial"), environ={}).engine.executor == "serial"
    assert settings_from(parse(), environ={"VOXSERVE_EXECUTOR": "serial"}).engine.executor == "serial"
    for bad in ("fast", "lanes"):  # "lanes" was what auto does
        with pytest.raises(ValueError, match="executor"):
            settings_from(parse("--executor", bad), environ={})


def test_every_setting_has_one_name_at_every_layer():
    """The flag is the field's name, the environment variable too, at whatever depth of the tree
    the field sits: --max-queued-sentences sets SchedulerConfig.max_queued_sentences."""
    s = settings_from(parse("--max-queued-sentences", "40", "--max-queue-wait-s", "5", "--shutdown-timeout-s", "3"),
                      environ={"VOXSERVE_BODY_TIMEOUT_S": "7"})
    assert s.engine.scheduler.max_queued_sentences == 40 and s.engine.max_queue_wait_s == 5.0
    assert (s.http.shutdown_timeout_s, s.http.body_timeout_s) == (3.0, 7.0)
    for setting in settings():
        node = ServeSettings()
        for part in setting.path[:-1]:
            node = getattr(node, part)
        assert setting.path[-1] == setting.name, setting
        assert setting.env == "VOXSERVE_" + setting.name.upper()


@pytest.mark.parametrize("old,new,value,read", [
    ("--max-queue", "max_queued_sentences", "40", lambda s: s.engine.scheduler.max_queued_sentences),
    ("--max-queue-wait", "max_queue_wait_s", "5", lambda s: s.engine.max_queue_wait_s),
    ("--read-timeout", "body_timeout_s", "60", lambda s: s.http.body_timeout_s),
    ("--shutdown-timeout", "shutdown_timeout_s", "3", lambda s: s.http.shutdown_timeout_s),
])
def test_old_flag_names_still_work_with_a_warning(capsys, old, new, value, read):
    assert read(settings_from(parse(old, value), environ={})) == float(value)
    err = capsys.readouterr().err
    assert f"{old} is deprecated" in err and "--" + new.replace("_", "-") in err
    serve_help = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert f"{old} " not in serve_help and f"{old}\n" not in serve_help  # hidden
    assert read(settings_from(parse(), environ={"VOXSERVE_" + old[2:].replace("-", "_").upper(): value})) == float(value)
    assert "VOXSERVE_" + new.upper() in capsys.readouterr().err
    # the new name wins over the old one
    new_flag = "--" + new.replace("_", "-")
    assert read(settings_from(parse(old, value, new_flag, "9"), environ={})) == 9.0


def test_read_timeout_alias_still_bounds_the_head():
    a = settings_from(parse("--read-timeout", "2"), environ={}).http
    assert (a.header_timeout_s, a.body_timeout_s) == (2.0, 2.0)
    a = settings_from(parse("--read-timeout", "60"), environ={}).http
    assert (a.header_timeout_s, a.body_timeout_s) == (10.0, 60.0)


def test_family_runtime_options_reach_serve():
    """Each family's options type (Family.options_type) is a setting: --max-sequences for Bark and
    CosyVoice 2, --bert-batch for Style-Bert-VITS2, each checked by the family's validate()."""
    from voxserve.families import get_family

    s = settings_from(parse("--max-sequences", "32", "--bert-batch", "8", "--threads", "2"), environ={})
    assert s.runtime_options(get_family("bark")).max_sequences == 32
    assert s.runtime_options(get_family("cosyvoice2")).max_sequences == 32
    assert s.runtime_options(get_family("sbv2")).bert_batch == 8
    assert s.runtime_options(get_family("piper")).threads == 2
    assert settings_from(parse("--no-streaming"), environ={}).runtime_options(get_family("cosyvoice2")).streaming is False
    assert settings_from(parse(), environ={"VOXSERVE_STREAMING": "off"}).runtime["streaming"] is False
    with pytest.raises(ValueError, match="bert_batch"):
        settings_from(parse("--bert-batch", "0"), environ={})
    for internal in ("--cpu-channels-last", "--decode-layout", "--fold-average", "--frontend-threads"):
        with pytest.raises(SystemExit):
            parse(internal, "1")
