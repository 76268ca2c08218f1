"""Streaming through the flow's cache: with the encoder chunk-masked (as CosyVoice2-0.5B's is), a
chunk runs the estimator over its new frames only, after the stream's FlowCache. It must give
the mel that recomputing the chunk-masked prefix gives (what upstream does every chunk), for
streams batched at different offsets, and the voice's streamed audio must not change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import voxserve
from voxserve import SynthesisOptions
from voxserve.families.cosyvoice2.flow import FlowCache
from voxserve.families.cosyvoice2.pipeline import PREFIX_SPEAKERS
from voxserve.families.cosyvoice2.runner import CosyStepRunner
from voxserve.families.cosyvoice2.voice import CosyPrompt

import cv2_fixtures as fx


@pytest.fixture(scope="module")
def chunked_voice(tmp_path_factory):
    d = fx.write_model_folder(tmp_path_factory.mktemp("cv2c") / "tiny-chunked", speakers={"spk": fx.prompt_entry()},
                              encoder_chunk=25)
    return voxserve.load_voice(f"cosyvoice2:{d}", device="cpu")


def _stream(seed: int, prompt: int, made: int):
    g = torch.Generator().manual_seed(seed)
    return dict(prompt=torch.randint(0, 6561, (prompt,), generator=g), tokens=torch.randint(0, 6561, (made,), generator=g),
                feat=torch.randn(2 * prompt, 80, generator=g), emb=torch.randn(192, generator=g))


def _batch(jobs, la: int):
    """jobs: (stream, end) -> the flow's arguments for tokens [0, end) + look-ahead."""
    rows = [torch.cat([s["prompt"], s["tokens"][: end + la]]) for s, end in jobs]
    feats = [s["feat"] for s, _ in jobs]
    return (torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), torch.tensor([len(r) for r in rows]),
            torch.nn.utils.rnn.pad_sequence(feats, batch_first=True), torch.tensor([len(f) for f in feats]),
            torch.stack([s["emb"] for s, _ in jobs]))


def test_cached_chunks_equal_recomputing_the_prefix_for_streams_batched_at_different_offsets(chunked_voice):
    model = chunked_voice.model
    flow, la = model.flow, model.flow.dims.lookahead
    assert model.cached_streaming
    # three streams with prompts off the grid; c joins at a's third chunk
    streams = {k: _stream(s, p, 400) for k, s, p in (("a", 1, 37), ("b", 2, 60), ("c", 3, 11))}
    plans = {k: model.chunk_schedule(len(s["prompt"])) for k, s in streams.items()}
    caches = {k: FlowCache() for k in streams}
    rounds = [["a", "b"], ["a", "b"], ["a", "b", "c"], ["a", "c"], ["c"]]
    worst, per_frame = 0.0, set()
    with torch.inference_mode():
        for keys in rounds:
            ends = {k: plans[k].ready(400, False) for k in keys}
            assert all(e is not None and not e[1] for e in ends.values())
            args = _batch([(streams[k], ends[k][0]) for k in keys], la)
            before = [caches[k].frames for k in keys]
            held = [caches[k].nbytes() for k in keys]
            mel, new = flow.chunk(*args, [caches[k] for k in keys])
            full, frames = flow(*args, True, False)  # upstream: the whole prefix, chunk-masked
            for j, k in enumerate(keys):
                assert int(new[j]) == int(frames[j]) - before[j] > 0
                ref = full[j, :, before[j]:int(frames[j])]
                worst = max(worst, float((mel[j, :, : int(new[j])] - ref).abs().max()))
                assert caches[k].frames == int(frames[j])
                if held[j]:
                    per_frame.add((caches[k].nbytes() - held[j]) / (caches[k].frames - before[j]))
                plans[k].advance(ends[k][0])
    assert worst <= 1e-5, worst
    assert len(per_frame) == 1  # the cache grows by the same bytes a frame, whatever else is batched


@pytest.mark.parametrize("ends", [(30, 55, 80), (30, 80)])
def test_cached_chunks_match_the_reference_with_a_chunk_masked_encoder(chunked_voice, ends):
    """The reference's flow (encoder static_chunk_size 25, recorded by make_reference.py): its
    streaming mel of each prefix; ours from the cache, chunk after chunk, and recomputed."""
    m, a = fx.meta(), fx.arrays()
    assert m["chunked"]["encoder_chunk"] == 25
    flow, la, n_prompt = chunked_voice.model.flow, chunked_voice.model.flow.dims.lookahead, m["flow"]["prompt_tokens"]
    ptok, feat = torch.from_numpy(a["flow/prompt_token"]), torch.from_numpy(a["flow/prompt_feat"])
    emb, toks = torch.from_numpy(a["flow/embedding"]), torch.from_numpy(a["chunked/token"])

    def args(end):
        row = torch.cat([ptok, toks[: end + la]])[None]
        return row, torch.tensor([row.shape[1]]), feat[None], torch.tensor([len(feat)]), emb[None]

    cache, start = FlowCache(), 0
    with torch.inference_mode():
        for end in ends:
            ref = torch.from_numpy(a[f"chunked/mel/{end}"])  # [80, 2 end]: the frames after the prompt's
            mel, new = flow.chunk(*args(end), [cache])
            got = mel[0, :, : int(new[0])]
            lo = 0 if start == 0 else 2 * start
            skip = 2 * n_prompt if start == 0 else 0  # the first chunk's new frames begin with the prompt's
            assert int(new[0]) - skip == 2 * end - lo
            err = float((got[:, skip:] - ref[:, lo:]).abs().max())
            print(f"chunk {start}->{end}: cached {err:.1e}")
            assert err <= 1e-4
            whole, _ = flow(*args(end), True, False)
            assert float((whole[0, :, 2 * n_prompt:] - ref).abs().max()) <= 1e-4
            start = end


def test_a_chunk_off_the_grid_is_refused(chunked_voice):
    flow = chunked_voice.model.flow
    s = _stream(4, 50, 200)
    with torch.inference_mode(), pytest.raises(ValueError, match="whole chunks of 50 frames"):
        flow.chunk(*_batch([(s, 30)], flow.dims.lookahead), [FlowCache()])  # 80 tokens: 160 frames


def test_the_reference_tiny_model_recomputes_its_prefix(cv2_voice):
    # its encoder attends everywhere while streaming: earlier frames change with later tokens
    assert not cv2_voice.model.cached_streaming


def _run(runner, units):
    out = {k: [] for k in units}
    for k, u in units.items():
        runner.join(k, u)
    while runner.active:
        for r in runner.step():
            assert r.error is None, r.error
            out[r.key].append(np.asarray(r.audio))
    return out


def _counted(model, monkeypatch):
    calls = []
    real = model.flow.chunk

    def chunk(*args):
        calls.append(len(args[-1]))
        return real(*args)

    monkeypatch.setattr(model.flow, "chunk", chunk)
    return calls


def test_streamed_audio_through_the_cache_equals_recomputing_the_prefix(chunked_voice, monkeypatch):
    model = chunked_voice.model
    text = "Hello there, this is a sentence."  # 520 tokens each: 7 chunks
    units = {k: list(chunked_voice.units(text, SynthesisOptions(seed=s)))[0] for k, s in (("a", 7), ("b", 8))}
    calls = _counted(model, monkeypatch)
    cached = _run(CosyStepRunner(model), units)
    n_cached = len(calls)
    # over the cache budget the largest caches go: those streams recompute, with the same audio
    monkeypatch.setattr(model, "flow_cache_budget", 0)
    tight = _run(CosyStepRunner(model), units)
    n_tight = len(calls) - n_cached
    monkeypatch.setattr(model, "cached_streaming", False)
    plain = _run(CosyStepRunner(model), units)
    assert len(calls) == n_cached + n_tight and 0 < n_tight < n_cached
    for k in units:
        assert len(cached[k]) >= 3 and [len(c) for c in cached[k]] == [len(c) for c in plain[k]]
        for x, y, z in zip(cached[k], plain[k], tight[k]):
            fx.assert_same_audio(x, y)
            fx.assert_same_audio(z, y)


def test_the_prompts_whole_chunks_are_computed_once_per_speaker(chunked_voice):
    model = chunked_voice.model
    s = _stream(5, 81, 0)
    prompt = CosyPrompt("long", torch.tensor([1, 2]), s["prompt"], s["feat"], s["emb"])
    a, b = model._prompt_prefix(prompt), model._prompt_prefix(prompt)
    whole = (prompt.n_speech_tokens - model.flow.dims.lookahead) // 25 * 25
    assert whole > 0 and a.frames == b.frames == 2 * whole
    assert whole == 75 and a.steps is not b.steps and a.steps[0][0] is b.steps[0][0]  # own lists, shared tensors
    # the prefix is what the stream's own first pass over those chunks gives
    with torch.inference_mode():
        fresh = FlowCache()
        n = whole + model.flow.dims.lookahead
        model.flow.chunk(prompt.speech_tokens[None, :n], torch.tensor([n]), prompt.speech_feat[None],
                         torch.tensor([len(prompt.speech_feat)]), prompt.embedding[None], [fresh])
    assert all(torch.equal(x, y) for sa, sb in zip(a.steps, fresh.steps) for x, y in zip(sa, sb))
    # only the most recent speakers' prefixes are kept
    others = [CosyPrompt(f"p{k}", torch.tensor([1]), s["prompt"], s["feat"], s["emb"]) for k in range(PREFIX_SPEAKERS)]
    for p in others:
        model._prompt_prefix(p)
    assert len(model._prefixes) == PREFIX_SPEAKERS and id(prompt) not in model._prefixes
