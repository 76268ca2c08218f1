"""A sentence's audio from a batch equals its one-at-a-time audio."""

from __future__ import annotations

import numpy as np
import pytest
from audio_compare import BATCH_ATOL

import voxserve
from voxserve.families.piper import PiperOptions
from voxserve.families.piper.options import PiperRuntimeOptions
from voxserve.families.piper.runner import decoder_gap_frames, decoder_receptive_field_frames


@pytest.fixture(scope="module")
def sentences(joe_voice, corpus):
    texts = [d["text"] for d in corpus if d["category"] in ("short", "medium")]
    out = [s for t in texts for s in joe_voice.frontend.sentences(t)]
    # mixed lengths: interleave short and long
    out.sort(key=lambda s: len(s.ids))
    mixed = [x for pair in zip(out[: len(out) // 2], reversed(out[len(out) // 2 :])) for x in pair]
    return mixed[:16]


@pytest.fixture(scope="module")
def singles(joe_voice, sentences):
    return [joe_voice.synthesize_ids([s.ids], voxserve.DETERMINISTIC)[0] for s in sentences]


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_batch_equals_one_at_a_time(joe_voice, sentences, singles, layout, n):
    joe_voice.runner.layout = layout
    try:
        batch = joe_voice.synthesize_ids([s.ids for s in sentences[:n]], voxserve.DETERMINISTIC)
    finally:
        joe_voice.runner.layout = "packed"
    # fp32 sums in another order in a batch of another shape: see audio_compare.
    for a, ref in zip(batch, singles[:n]):
        assert len(a) == len(ref)  # trimmed to its own length: no padded tail
        assert np.abs(a - ref).max() <= BATCH_ATOL


def test_decode_groups_bound_memory(joe_voice, sentences, singles):
    """A small max_decode_frames splits the packed decode into several calls; same audio."""
    runner = joe_voice.runner
    old = runner.config
    runner.config = PiperRuntimeOptions(max_decode_frames=300)
    try:
        batch = joe_voice.synthesize_ids([s.ids for s in sentences[:7]], voxserve.DETERMINISTIC)
    finally:
        runner.config = old
    for a, ref in zip(batch, singles[:7]):
        assert np.abs(a - ref).max() <= BATCH_ATOL


def test_multispeaker_seeded_batch_equals_alone(tiny_voice_path):
    """Different speakers and seeded noise in one batch, packed decode with per-frame speaker."""
    voice = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    rng = np.random.default_rng(1)
    ids = [[1, 0] + [int(x) for x in rng.integers(3, 40, n)] + [2] for n in (5, 30, 12, 50, 3)]
    opts = [PiperOptions(speaker=k % 3, seed=100 + k) for k in range(len(ids))]
    alone = [voice.runner.run([voice._item(x, o, 0)])[0] for x, o in zip(ids, opts)]
    for layout in ("packed", "padded"):
        voice.runner.layout = layout
        together = voice.runner.run([voice._item(x, o, 0) for x, o in zip(ids, opts)])
        for a, b in zip(together, alone):
            assert len(a) == len(b)
            assert np.abs(a - b).max() <= BATCH_ATOL
    # and the seed matters
    other = voice.runner.run([voice._item(ids[3], PiperOptions(speaker=0, seed=7), 0)])[0]
    assert len(other) != len(alone[3]) or np.abs(other - alone[3]).max() > 1e-3


def test_gap_covers_every_single_convolution(joe_voice):
    dims = joe_voice.runner.dims
    # the joe voice: widest conv is a k=7, d=12 resblock conv at 8x = 4.5 frames
    assert decoder_gap_frames(dims) == 6
    assert decoder_gap_frames(dims) < decoder_receptive_field_frames(dims)


def test_two_threads_run_batches_on_one_model_at_once(joe_voice, sentences, singles):
    """The serving engine's CPU lanes: two threads, one OpenMP thread each, run batches on the
    same model at the same time (no lock between them); each gets its own sentences' audio."""
    import threading

    from voxserve.runtime.cpu import set_thread_team

    assert joe_voice.concurrent_runs  # CPU eager stages: no state between calls
    out: dict[int, list[np.ndarray]] = {}
    start = threading.Barrier(2)

    def lane(k: int) -> None:
        set_thread_team(1)
        start.wait()
        out[k] = [joe_voice.synthesize_ids([s.ids for s in sentences[j : j + 2]], voxserve.DETERMINISTIC)
                  for j in range(k * 2, 8, 4)]

    threads = [threading.Thread(target=lane, args=(k,)) for k in range(2)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    for k in range(2):
        got = [a for batch in out[k] for a in batch]
        want = [singles[j + d] for j in range(k * 2, 8, 4) for d in range(2)]
        assert len(got) == len(want) == 4
        for a, ref in zip(got, want):
            assert len(a) == len(ref) and np.abs(a - ref).max() <= BATCH_ATOL


def test_a_batch_split_on_a_busy_machine_equals_one_at_a_time(joe_voice, sentences, singles, monkeypatch):
    """Other processes hold the cores: the batch runs as groups on one-thread teams at once
    (runtime/cpu.py, contended_groups); each sentence's audio is still its own."""
    from voxserve.families.piper import runner as runner_mod

    calls = []

    def split(costs):
        calls.append(len(costs))
        return [list(range(0, len(costs), 2)), list(range(1, len(costs), 2))] if len(calls) == 1 else None

    monkeypatch.setattr(runner_mod, "contended_groups", split)
    batch = joe_voice.synthesize_ids([s.ids for s in sentences[:7]], voxserve.DETERMINISTIC)
    assert calls[0] == 7 and len(calls) == 3  # split once, then each group ran as a batch
    for a, ref in zip(batch, singles[:7]):
        assert len(a) == len(ref)
        assert np.abs(a - ref).max() <= BATCH_ATOL
