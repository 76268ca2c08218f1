"""GPU-path features: the CPU-testable logic here, the CUDA checks marked `cuda`.

On CPU: precision policy, fp16 policy quality (CPU emulation), graph bucketing/padding/
trimming (emulated capture), fallback outside the grid, offload bookkeeping, device budget LRU,
out-of-memory batch splitting."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gpu_tolerances import FP32_WAVE_ATOL, HALF_SNR_DB
from vits_fixtures import load_piper

import voxserve
from voxserve.families.piper import PiperOptions
from voxserve.families.piper.cuda_graphs import GraphedStages, GraphGrid, pick_bucket
from voxserve.families.piper.options import PiperRuntimeOptions, Transforms
from voxserve.models.vits_precision import PrecisionPolicy, apply_precision, compare_audio, snr_db
from voxserve.runtime.offload import DeviceBudget, WeightOffloader, module_bytes

DET = PiperOptions.deterministic()  # noise off (also given to VitsVoice._item directly)


def _ids(rng, n):
    return [1, 0] + [int(x) for x in rng.integers(3, 40, n)] + [2]


@pytest.fixture(scope="module")
def tiny(tiny_voice_path):
    return voxserve.load_voice(str(tiny_voice_path), device="cpu")


# ---------------------------------------------------------------- precision

def test_precision_policy_table():
    assert PrecisionPolicy.default(torch.float16).table() == {
        "enc_p": "fp32", "dp": "fp32", "flow": "fp16", "dec": "fp16", "emb_g": "fp32"}
    assert PrecisionPolicy.default(torch.bfloat16).table() == {
        "enc_p": "fp32", "dp": "fp32", "flow": "fp32", "dec": "bf16", "emb_g": "fp32"}
    assert set(PrecisionPolicy.default(torch.float32).table().values()) == {"fp32"}


def test_apply_precision_sets_stage_dtypes(tiny):
    import copy

    model = copy.deepcopy(tiny.runner.model)
    apply_precision(model, PrecisionPolicy.default(torch.float16))
    assert model.dec.conv_pre.weight.dtype == torch.float16
    assert model.dp.pre.weight.dtype == torch.float32
    assert model.emb_g.weight.dtype == torch.float32


def test_snr_helpers():
    x = np.sin(np.arange(1000) / 10).astype(np.float32)
    assert snr_db(x, x) == float("inf")
    assert abs(snr_db(x, x * 1.01) - 40.0) < 0.01
    assert compare_audio([x, x], [x, x[:-1]])["length_changed"] == 1


def test_fp16_policy_quality_on_default_voice(joe_voice):
    """CPU emulation of the fp16 policy on two sentences: lengths kept, SNR >= 30 dB.
    (The full-corpus check runs on CUDA: test_cuda_fp16_snr_corpus.)"""
    sents = joe_voice.frontend.sentences("The train to Boston leaves from platform nine. Thanks.")
    ids = [s.ids for s in sents]
    ref = joe_voice.synthesize_ids(ids, DET)
    model = joe_voice.runner.model
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        apply_precision(model, PrecisionPolicy.default(torch.float16))
        half = joe_voice.synthesize_ids(ids, DET)
    finally:
        model.float()
        model.load_state_dict(saved)
    r = compare_audio(ref, half)
    assert r["length_changed"] == 0 and r["snr_db"] >= 30


def test_a_cuda_device_turns_tf32_off(monkeypatch):
    """fp32 on CUDA is fp32 (docs/precision.md): choosing a CUDA device turns off TF32, which
    PyTorch leaves on for cuDNN convolutions. Here without a GPU: CUDA is said to be there."""
    from voxserve.runtime.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        assert resolve_device("cuda").type == "cuda"
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_half_precision_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        voxserve.load_voice(device="cpu", dtype="fp16")


# ---------------------------------------------------------------- CUDA graphs (logic)

def test_pick_bucket():
    assert pick_bucket(1, (1, 2, 4)) == 1
    assert pick_bucket(3, (1, 2, 4)) == 4
    assert pick_bucket(4, (1, 2, 4)) == 4
    assert pick_bucket(5, (1, 2, 4)) is None
    assert len(GraphGrid().encode_buckets()) == 25


def test_emulated_graphs_equal_eager(tiny_voice_path):
    """Bucketed, padded, replayed-and-sliced stages give the eager audio."""
    grid = GraphGrid(batch=(1, 2, 4, 8), tokens=(32, 64, 128), frames=(64, 128, 256, 512))
    eager = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    graphed = load_piper(tiny_voice_path, cuda_graphs=True, transforms=Transforms(graph_grid=grid))
    assert isinstance(graphed.runner.stages, GraphedStages) and graphed.runner.stages.emulate
    rng = np.random.default_rng(3)
    batch = [_ids(rng, n) for n in (3, 20, 45, 9, 30)]
    opts = PiperOptions(speaker=2, noise_scale=0, noise_w=0)
    a = eager.synthesize_ids(batch, opts)
    b = graphed.synthesize_ids(batch, opts)
    for x, y in zip(a, b):
        assert len(x) == len(y) and np.abs(x - y).max() <= 1e-4
    st = graphed.runner.stages.stats
    assert st["replays"] >= 2 and st["fallbacks"] == 0 and st["captures"] >= 2


def test_emulated_graphs_fall_back_outside_grid(tiny_voice_path):
    grid = GraphGrid(batch=(1,), tokens=(16,), frames=(32,))
    graphed = load_piper(tiny_voice_path, cuda_graphs=True, transforms=Transforms(graph_grid=grid))
    eager = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    rng = np.random.default_rng(4)
    long_ids = _ids(rng, 60)  # 63 tokens > 16: encoder falls back; frames > 32: synth too
    x = graphed.synthesize_ids([long_ids], DET)[0]
    y = eager.synthesize_ids([long_ids], DET)[0]
    assert np.abs(x - y).max() <= 1e-4
    assert graphed.runner.stages.stats["fallbacks"] == 2


def test_graphs_and_offload_exclusive():
    with pytest.raises(ValueError, match="cannot be combined"):
        PiperRuntimeOptions(cuda_graphs=True, offload=True).validate()


# ---------------------------------------------------------------- offload

def test_offload_is_a_logged_noop_on_cpu(tiny_voice_path, caplog):
    with caplog.at_level(logging.INFO):
        v = voxserve.load_voice(str(tiny_voice_path), device="cpu", offload=True)
    assert v.runner.offloader is not None and not v.runner.offloader.enabled
    assert any("already in host memory" in r.message for r in caplog.records)
    assert len(v.synthesize("hello").samples) > 0


def test_offloader_bookkeeping(tiny):
    import copy

    model = copy.deepcopy(tiny.runner.model)
    off = WeightOffloader(model, {"encode": ("enc_p", "dp"), "synth": ("flow", "dec")}, torch.device("cpu"), force=True)
    host_ptr = off._host["dec"]["conv_pre.weight"].data_ptr()
    assert model.dec.conv_pre.weight.data_ptr() == host_ptr  # idle weights are the host copies
    with off.stage("synth"):
        assert off.resident == {"flow", "dec"}
    assert off.resident == set() and off.moves_in == 2
    with off.stage("encode"):
        assert off.resident == {"enc_p", "dp"}
    assert off.moves_in == 4
    assert model.dec.conv_pre.weight.data_ptr() == host_ptr


def test_device_budget_lru():
    events = []
    b = DeviceBudget(100)
    for k, n in (("a", 40), ("b", 40), ("c", 40)):
        b.register(k, n, lambda k=k: events.append(("in", k)), lambda k=k: events.append(("out", k)))
    b.acquire("a")
    b.acquire("b")
    b.acquire("a")  # a is now most recent
    b.acquire("c")  # evicts b (least recently used), not a
    assert b.resident() == ["a", "c"] and ("out", "b") in events and ("out", "a") not in events
    assert b.used == 80 and b.evictions == 1
    with pytest.raises(ValueError):
        b.register("huge", 101, lambda: None, lambda: None)


def test_module_bytes(tiny):
    assert module_bytes(tiny.runner.model.dec) > 0


# ---------------------------------------------------------------- OOM split

def test_out_of_memory_splits_the_batch(tiny, monkeypatch):
    runner = tiny.runner
    rng = np.random.default_rng(5)
    items = [tiny._item(_ids(rng, n), DET, 0) for n in (5, 12, 7, 30, 3)]
    ref = [runner.run([it])[0] for it in items]
    real = runner._submit

    def fake(batch, *rest):
        if len(batch) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(batch, *rest)

    monkeypatch.setattr(runner, "_submit", fake)
    before = runner.oom_splits
    got = runner.run(items)
    assert runner.oom_splits > before
    for a, b in zip(got, ref):
        assert np.abs(a - b).max() <= 1e-4


# ---------------------------------------------------------------- CUDA (skipped without a GPU)

def _corpus_ids(voice, corpus, n=24):
    texts = [d["text"] for d in corpus if d["category"] in ("short", "medium", "long")]
    return [s.ids for t in texts for s in voice.frontend.sentences(t)][:n]


@pytest.mark.cuda
def test_cuda_graphs_equal_eager_corpus(corpus):
    eager = voxserve.load_voice(device="cuda", cuda_graphs=False)
    graphed = voxserve.load_voice(device="cuda", cuda_graphs=True)
    ids = _corpus_ids(eager, corpus)
    for batch in (ids[:1], ids[:8], ids):
        for x, y in zip(eager.synthesize_ids(batch, DET), graphed.synthesize_ids(batch, DET)):
            assert len(x) == len(y) and np.abs(x - y).max() <= FP32_WAVE_ATOL
    assert graphed.runner.stages.stats["replays"] > 0


@pytest.mark.cuda
def test_cuda_matches_cpu_and_piper(corpus, joe_voice):
    gpu = voxserve.load_voice(device="cuda")
    ids = _corpus_ids(gpu, corpus, 8)
    for x, y in zip(gpu.synthesize_ids(ids, DET), joe_voice.synthesize_ids(ids, DET)):
        assert len(x) == len(y) and np.abs(x - y).max() <= FP32_WAVE_ATOL


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cuda_half_snr_corpus(corpus, dtype):
    ref_voice = voxserve.load_voice(device="cuda")
    half = voxserve.load_voice(device="cuda", dtype=dtype)
    ids = _corpus_ids(ref_voice, corpus)
    r = compare_audio(ref_voice.synthesize_ids(ids, DET), half.synthesize_ids(ids, DET))
    assert r["length_changed"] == 0 and r["snr_db"] >= HALF_SNR_DB, r


@pytest.mark.cuda
def test_cuda_one_host_read_per_batch(corpus):
    """Inside the stages no implicit device->host sync: sync debug mode raises on any."""
    voice = voxserve.load_voice(device="cuda", cuda_graphs=False)
    ids = _corpus_ids(voice, corpus, 8)
    voice.synthesize_ids(ids, DET)
    runner = voice.runner
    items = [voice._item(x, DET, i) for i, x in enumerate(ids)]
    from voxserve.families.piper.stages import EagerStages

    stages = runner.stages
    assert isinstance(stages, EagerStages)
    torch.cuda.set_sync_debug_mode("error")
    try:
        x = runner._encode(items[:4], [runner._generator(0)] * 4)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert x.frame_lengths.shape == (4,)


@pytest.mark.cuda
def test_cuda_offload_moves_stages(tiny_voice_path):
    v = voxserve.load_voice(str(tiny_voice_path), device="cuda", offload=True)
    v.synthesize("hello")
    assert v.runner.offloader.enabled and v.runner.offloader.resident == set()
    assert not v.runner.model.dec.conv_pre.weight.is_cuda  # idle weights live on the host
    assert v.runner.offloader.moves_in >= 4


@pytest.mark.cuda
def test_cuda_compile_equals_eager(tiny_voice_path):
    eager = voxserve.load_voice(str(tiny_voice_path), device="cuda", cuda_graphs=False)
    # compile turns graphs on, and loading captures (and so compiles, max-autotune) the whole grid
    # (30 buckets by default): one bucket per stage here, so the test takes seconds, not minutes
    small = GraphGrid(batch=(1,), tokens=(64,), frames=(1024,))
    comp = load_piper(tiny_voice_path, device="cuda", compile=True, transforms=Transforms(graph_grid=small))
    ids = [[1, 0] + list(range(3, 40)) + [2]]
    o = PiperOptions(speaker=1, noise_scale=0, noise_w=0)
    assert np.abs(eager.synthesize_ids(ids, o)[0] - comp.synthesize_ids(ids, o)[0]).max() <= FP32_WAVE_ATOL
    assert comp.runner.stages.stats["captures"] == 2
