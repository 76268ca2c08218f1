"""What a cached streaming chunk holds beyond the streams' caches (issue 49: a request's peak
memory grew ~190 MB a batch row on the tiny model, two to three times its caches).

A chunk batch of B streams must not copy the rows' caches into padded batched tensors (before:
every Euler step's and layer's keys and values at once, and the encoder's), nor re-run the input
layers over each stream's whole prefix: the bytes it allocates beyond what it leaves behind
(the caches' growth and its mel) stay a small part of what the caches hold. Bytes are counted
by torch's profiler (every CPU allocation and free in order), not read from the process."""

from __future__ import annotations

import pytest
import torch

import voxserve
from voxserve.families.cosyvoice2.flow import FlowCache

import cv2_fixtures as fx


@pytest.fixture(scope="module")
def voice(tmp_path_factory):
    d = fx.write_model_folder(tmp_path_factory.mktemp("cv2m") / "tiny-chunked", speakers={"spk": fx.prompt_entry()},
                              encoder_chunk=25)
    return voxserve.load_voice(f"cosyvoice2:{d}", device="cpu")


def _mark(name: str) -> None:
    """A point in the profile (an empty block: a block would be charged what is freed inside it)."""
    with torch.profiler.record_function(name):
        pass


def _allocated(prof, start: str, end: str) -> tuple[int, int, int]:
    """Bytes allocated (CPU) at mark `start`, the most between it and mark `end`, and at `end`,
    counted from the profile's start (which saw every tensor freed between the marks)."""
    (t0,) = [e.time_range.start for e in prof.events() if e.name == start]
    (t1,) = [e.time_range.start for e in prof.events() if e.name == end]
    held, at = 0, {}
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        if e.time_range.start >= t0 and "start" not in at:
            at["start"] = at["peak"] = held
        if e.time_range.start >= t1:
            break
        held += e.self_cpu_memory_usage  # an op's allocations less its frees; frees outside ops: "[memory]"
        at["peak"] = max(at.get("peak", 0), held)
    return at["start"], at["peak"], held


def _streams(model, n: int, made: int):
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(n):
        prompt = 40 + 7 * k  # prompts off the chunk grid, each its own
        out.append(dict(prompt=torch.randint(0, 6561, (prompt,), generator=g),
                        tokens=torch.randint(0, 6561, (made,), generator=g), feat=torch.randn(2 * prompt, 80, generator=g),
                        emb=torch.randn(192, generator=g), plan=model.chunk_schedule(prompt), cache=FlowCache()))
    return out


def _next_chunk(flow, streams, made: int):
    la = flow.dims.lookahead
    ends = [s["plan"].ready(made, False)[0] for s in streams]
    rows = [torch.cat([s["prompt"], s["tokens"][: e + la]]) for s, e in zip(streams, ends)]
    args = (torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), [len(r) for r in rows],
            torch.nn.utils.rnn.pad_sequence([s["feat"] for s in streams], batch_first=True),
            [len(s["feat"]) for s in streams], torch.stack([s["emb"] for s in streams]))
    return ends, lambda: flow.chunk(*args, [s["cache"] for s in streams])


def test_a_cached_chunk_allocates_a_small_part_of_the_caches_it_reads(voice):
    model, flow = voice.model, voice.model.flow
    made = 700
    streams = _streams(model, 4, made)
    profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    with torch.inference_mode(), profile as prof:
        while min(s["cache"].frames for s in streams) < 800:
            ends, run = _next_chunk(flow, streams, made)
            run()
            for s, e in zip(streams, ends):
                s["plan"].advance(e)
        held = sum(s["cache"].nbytes() for s in streams)
        assert all(s["cache"].bytes == s["cache"].nbytes() for s in streams)
        ends, run = _next_chunk(flow, streams, made)
        _mark("chunk")
        mel = run()[0]
        _mark("after")
    start, peak, end = _allocated(prof, "chunk", "after")
    grown = sum(s["cache"].nbytes() for s in streams) - held
    assert 0 < grown <= end - start  # the caches' growth and the chunk's mel stay
    assert end - start - grown - mel.nbytes < 0.05 * held  # and nothing else
    # before: the padded batched copies of the caches alone were about their size
    print(f"allocated beyond what stays: {peak - end} B, caches {held} B")
    assert peak - end < 0.25 * held, (peak - end, held)


def test_last_chunks_ending_together_run_as_passes_of_bounded_frames(voice, monkeypatch):
    """Each last chunk is a whole pass over its sentence (full attention): rows that end together
    are split into passes of at most FULL_PASS_FRAMES frames in all (a row at least); a cached
    group stays one call."""
    from types import SimpleNamespace

    from voxserve.families.cosyvoice2 import pipeline

    st = SimpleNamespace(prompt=SimpleNamespace(n_speech_tokens=50))
    jobs = [(st, None, 1500, 1600, True, True)] * 3 + [(st, None, 100, 200, False, True)] * 2  # 3,300 frames each
    groups = {(True, False, False): [0, 1, 2], (False, True, True): [3, 4]}
    monkeypatch.setattr(pipeline, "FULL_PASS_FRAMES", 8000)
    assert voice.model._passes(groups, jobs) == [((True, False, False), [0, 1]), ((True, False, False), [2]),
                                          ((False, True, True), [3, 4])]
    monkeypatch.setattr(pipeline, "FULL_PASS_FRAMES", 1)
    assert [r for _, r in voice.model._passes(groups, jobs)] == [[0], [1], [2], [3, 4]]


def test_last_chunks_split_into_passes_give_the_same_audio(voice, monkeypatch):
    import numpy as np

    from voxserve import SynthesisOptions
    from voxserve.families.cosyvoice2 import pipeline
    from voxserve.families.cosyvoice2.runner import CosyStepRunner

    model = voice.model
    units = {k: list(voice.units(f"Hello there, sentence number {k}.", SynthesisOptions(seed=k)))[0] for k in range(3)}

    def run():
        runner, out = CosyStepRunner(model), {k: [] for k in units}
        for k, u in units.items():
            runner.join(k, u)
        while runner.active:
            for r in runner.step():
                assert r.error is None, r.error
                out[r.key].append(np.asarray(r.audio))
        return out

    together = run()
    monkeypatch.setattr(pipeline, "FULL_PASS_FRAMES", 1)
    split = run()
    for k in units:
        assert [len(c) for c in split[k]] == [len(c) for c in together[k]]
        for x, y in zip(split[k], together[k]):
            fx.assert_same_audio(x, y)
