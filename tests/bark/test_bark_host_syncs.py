"""Bark's step runner reads back to the host once per decoder step (the tokens, for the stop
rules): counted on the CPU (tests/host_syncs.py), and on a GPU with CUDA's sync debug mode."""

from __future__ import annotations

import pytest
from host_syncs import HostReads, count_calls, cuda_syncs

from voxserve.families.bark import BarkOptions
from voxserve.families.bark.step import BarkStepRunner
from voxserve.runtime.step import Decoder

SENTENCES = ["hello world.", "i like pizza but also reading.", "the cat is on the mat.", "seven eight"]
STAGE_CHANGES = ("_start", "_to_coarse", "_next_window", "_finish")


def _units(voice):
    opts = [BarkOptions(seed=3 + k, temperature=0.0 if k == 0 else 0.8) for k in range(len(SENTENCES))]
    return [next(iter(voice.units(t, o))) for t, o in zip(SENTENCES, opts)]


def test_each_decoder_step_reads_once_and_nothing_else_reads_between_stage_changes(bark_voice, monkeypatch):
    runner = BarkStepRunner(bark_voice.runner)
    per_decoder_step = count_calls(Decoder, "step", monkeypatch)
    changed = []
    for name in STAGE_CHANGES:
        orig = getattr(runner, name)
        monkeypatch.setattr(runner, name, lambda *a, _orig=orig, **k: changed.append(1) or _orig(*a, **k))
    units = _units(bark_voice)
    quiet = 0  # runner steps without a stage change: decode steps only
    step = 0
    while step < len(units) or runner.active:
        if step < len(units):
            runner.join(step, units[step])
        changed.clear()
        before = len(per_decoder_step)
        with HostReads() as reads:
            for res in runner.step():
                assert res.error is None, res.error
        stepped = len(per_decoder_step) - before
        if not changed:
            quiet += 1
            assert 1 <= stepped <= 2 and reads.calls == ["cpu"] * stepped, (step, reads.calls)
        step += 1
    assert quiet > 20
    assert all(calls == ["cpu"] for calls in per_decoder_step), per_decoder_step


@pytest.mark.cuda
def test_cuda_decode_steps_synchronise_once_per_decoder(tiny_bark_dir):
    """On the device: a runner step without stage changes makes at most one synchronising
    call per decoder that stepped (semantic, coarse)."""
    import voxserve

    voice = voxserve.load_voice(f"bark:{tiny_bark_dir}", device="cuda")
    runner = BarkStepRunner(voice.runner)
    for k, u in enumerate(_units(voice)):
        runner.join(k, u)
    runner.step()  # the prefills
    checked = 0
    while runner.active and checked < 40:
        n_sem, n_coarse = len(runner.semantic.running), len(runner.coarse_decoder.running)
        windows = [(k, r.made) for k, r in runner._rows.items() if r.coarse is not None]
        out, found = cuda_syncs(runner.step)
        same = not out and len(runner.semantic.running) == n_sem and len(runner.coarse_decoder.running) == n_coarse \
            and windows == [(k, r.made) for k, r in runner._rows.items() if r.coarse is not None]
        if same:  # decode steps only (no row changed stage or window)
            assert len(found) <= (n_sem > 0) + (n_coarse > 0), [str(w.message) for w in found]
            checked += 1
    assert checked > 5
