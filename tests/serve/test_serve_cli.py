"""`voxserve serve` settings: dataclass defaults, then environment, then flags."""

from __future__ import annotations

import pytest

from voxserve.cli import build_parser
from voxserve.engine.scheduler import SchedulerConfig
from voxserve.serve.cli import ServeSettings, settings_from


def parse(*args):
    return build_parser().parse_args(["serve", *args])


def test_defaults_are_the_dataclasses():
    s = settings_from(parse(), environ={})
    assert s == ServeSettings()
    assert s.scheduler_config() == SchedulerConfig()


def test_flag_beats_environment_beats_default():
    env = {"VOXSERVE_MAX_BATCH_PHONEMES": "128", "VOXSERVE_URGENT_ALONE": "off", "VOXSERVE_DTYPE": "bf16"}
    s = settings_from(parse(), environ=env)
    assert (s.max_batch_phonemes, s.urgent_alone, s.dtype) == (128, False, "bf16")
    assert s.scheduler_config().urgent_alone is False
    s = settings_from(parse("--max-batch-phonemes", "512", "--urgent-alone", "on"), environ=env)
    assert (s.max_batch_phonemes, s.urgent_alone) == (512, True)


def test_bad_values_are_clear_errors():
    with pytest.raises(ValueError, match="VOXSERVE_URGENT_ALONE"):
        settings_from(parse(), environ={"VOXSERVE_URGENT_ALONE": "maybe"})
    with pytest.raises(SystemExit):
        parse("--urgent-alone", "maybe")
