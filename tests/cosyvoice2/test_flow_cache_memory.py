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
def flow(tmp_path_factory):
    d = fx.write_model_folder(tmp_path_factory.mktemp("cv2m") / "tiny-chunked", speakers={"spk": fx.prompt_entry()},
                              encoder_chunk=25)
    return voxserve.load_voice(f"cosyvoice2:{d}", device="cpu").model


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


def test_a_cached_chunk_allocates_a_small_part_of_the_caches_it_reads(flow):
    model, flow = flow, flow.flow
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
