"""Bark on the step runner (families/bark/step.py): one token a step per sequence, sequences
joining and leaving between steps, each sentence's tokens and audio its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bark_fixtures import TEXTS

import voxserve
from voxserve import SynthesisOptions
from voxserve.families import families
from voxserve.families.bark import BarkOptions
from voxserve.families.bark.step import BarkStepRunner
from voxserve.families.bark.voice import load_bark_voice
from voxserve.runtime.offload import WeightOffloader
from voxserve.voice import run_steps

SPEAKERS = ["v2/en_speaker_0", "announcer", None, "v2/en_speaker_1", "v2/en_speaker_0", None, "announcer", None]


def _units(voice, opts):
    return [next(iter(voice.units(t, o))) for t, o in zip(TEXTS, opts)]


def _drive(runner, joins: dict, leaves: dict | None = None, watch=None) -> dict:
    """Step a runner: joins {step: [(key, unit)]}, leaves {step: [key]}; the final audio per key."""
    leaves = leaves or {}
    audio, step = {}, 0
    last = max([*joins, *leaves])
    while step <= last or runner.active:
        for key, unit in joins.get(step, ()):
            runner.join(key, unit)
        for key in leaves.get(step, ()):
            assert key not in audio, f"{key} ended before it could leave"
            runner.leave(key)
        for res in runner.step():
            assert res.error is None, res.error
            assert res.final and res.key not in audio
            audio[res.key] = res.audio
        if watch is not None:
            watch(runner)
        step += 1
        assert step < 10_000
    return audio


class _Capture:
    """Records the coarse tokens each sentence hands to the fine stage."""

    def __init__(self, runner):
        self.runner, self.coarse, self.orig = runner, [], runner.fine_tokens

    def __enter__(self):
        def fine_tokens(coarse, *a):
            self.coarse.append(coarse.clone())
            return self.orig(coarse, *a)

        self.runner.fine_tokens = fine_tokens
        return self

    def __exit__(self, *exc):
        del self.runner.fine_tokens


@pytest.mark.parametrize("sampled", [False, True])
def test_step_runner_equals_the_generate_runner(bark_voice, sampled):
    # temperature 0: the tokens and audio of transformers' generate path (BarkRunner), speakers
    # mixed in one step batch. Sampled: the same per-sentence streams, so the same audio too.
    if sampled:
        opts = [BarkOptions(seed=20 + k, temperature=0.9, speaker=s) for k, s in enumerate(SPEAKERS)]
    else:
        opts = [voxserve.DETERMINISTIC.merged(SynthesisOptions(speaker=s)) for s in SPEAKERS]
    units = _units(bark_voice, opts)
    runner = bark_voice.runner
    with _Capture(runner) as cap:
        stepped = run_steps(BarkStepRunner(runner, capacity=len(units)), units)
    for k, u in enumerate(units):
        ref = runner.generate_tokens([u.payload])[0]
        assert any(torch.equal(c, ref["coarse"]) for c in cap.coarse), u.text
        np.testing.assert_array_equal(stepped[k], runner.run([u.payload])[0], err_msg=u.text)
    assert len({len(a) for a in stepped}) >= 2


def test_sampled_audio_is_the_same_alone_and_among_joins_and_leaves(bark_voice):
    opts = [BarkOptions(seed=40 + k, temperature=0.9, speaker=s) for k, s in enumerate(SPEAKERS)]
    units = _units(bark_voice, opts)
    target = units[1]
    alone = _drive(BarkStepRunner(bark_voice.runner), {0: [("t", target)]})["t"]
    assert len(alone) > 0

    both = []  # steps where semantic and coarse rows ran side by side

    def watch(r):
        both.append(min(len(r.semantic), len(r.coarse_decoder)))

    joins = {0: [("a", units[0]), ("b", units[3])], 3: [("t", target)], 6: [("c", units[5])],
             11: [("d", units[6]), ("e", units[2])], 20: [("f", units[7])]}
    leaves = {9: ["b"], 22: ["f"]}  # b leaves mid-generation, f in its semantic stage
    runner = BarkStepRunner(bark_voice.runner)
    got = _drive(runner, joins, leaves, watch)
    np.testing.assert_array_equal(got["t"], alone)
    assert "b" not in got and "f" not in got  # nothing from a sequence that left
    assert {"a", "c", "d", "e"} <= set(got)
    assert max(both) > 0, "no step ran semantic and coarse rows together"
    assert runner.active == 0 and len(runner.semantic) == 0 and len(runner.coarse_decoder) == 0
    # the others too are what they are alone
    for key, u in [("c", units[5]), ("e", units[2])]:
        np.testing.assert_array_equal(got[key], _drive(BarkStepRunner(bark_voice.runner), {0: [(key, u)]})[key])


def test_one_token_a_step(bark_voice):
    # a sentence alone takes one step per semantic token (EOS included) and per coarse token, the
    # first coarse token in the step its semantic stage ends: a joiner waits one step at most
    unit = next(iter(bark_voice.units(TEXTS[3], voxserve.DETERMINISTIC)))
    ref = bark_voice.runner.generate_tokens([unit.payload])[0]
    runner = BarkStepRunner(bark_voice.runner)
    runner.join(0, unit)
    steps = 0
    while runner.active:
        runner.step()
        steps += 1
    n_semantic = ref["semantic"].numel() + 1  # + its EOS
    assert n_semantic <= bark_voice.runner.semantic_config.max_new_tokens
    assert steps == n_semantic + ref["coarse"].numel() - 1


def test_a_failing_unit_fails_alone(bark_voice):
    good = next(iter(bark_voice.units(TEXTS[0], voxserve.DETERMINISTIC)))
    bad_speaker = type(good)(0, "x", 1, type(good.payload)("hello", "no-such-preset", (0.0, 0.0, 0.0), 1))
    not_bark = type(good)(0, "x", 1, object())
    runner = BarkStepRunner(bark_voice.runner)
    runner.join("good", good)
    runner.join("bad", bad_speaker)
    runner.join("odd", not_bark)
    first = {r.key: r for r in runner.step()}
    assert isinstance(first["odd"].error, TypeError)
    assert first["bad"].error is not None and "good" not in first
    assert runner.active == 1
    with pytest.raises(ValueError, match="already active"):  # a key twice: the caller's bug
        runner.join("good", good)
    assert runner.active == 1
    runner.leave("unknown")  # ignored
    audio = []
    while runner.active:
        audio += [r.audio for r in runner.step() if r.key == "good"]
    np.testing.assert_array_equal(audio[0], bark_voice.run_units([good])[0])


def test_voice_and_family_declare_the_step_kind(bark_voice, tiny_bark_dir):
    assert families()["bark"].runner_kind == "step"
    r = bark_voice.step_runner()
    assert isinstance(r, BarkStepRunner) and r is bark_voice.step_runner()
    assert not bark_voice.concurrent_runs
    # with CPU offload the voice runs one-shot batches (stages move in one at a time)
    v = load_bark_voice(tiny_bark_dir, device="cpu")
    v.runner.offloader = WeightOffloader(v.runner.model, {"semantic": ("semantic",)}, torch.device("cpu"), force=True)
    assert v.runner.offload and v.step_runner() is None
