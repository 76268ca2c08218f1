"""The random-weight Bark models the benchmarks time go through the same voice code."""

from __future__ import annotations

import pytest

import voxserve
from bark_random import BARK_SIZES, random_bark_model, random_bark_voice


def test_small_sizes_are_bark_small():
    assert BARK_SIZES["small"] == {"hidden_size": 768, "num_layers": 12, "num_heads": 12}


def test_tiny_random_voice_runs_to_its_token_budget():
    v = random_bark_voice("tiny", max_semantic_tokens=12, device="cpu")
    assert v.family == "bark" and v.sample_rate == 24000
    [a] = v.run_units(list(v.units("Hello, my name is Suno.", voxserve.DETERMINISTIC)))
    # random weights never pick EOS: 12 semantic tokens -> 18 frames of 320 samples
    assert len(a) == 18 * 320


def test_unknown_size():
    with pytest.raises(ValueError, match="size"):
        random_bark_model("huge")
