"""CPU offload: idle stages live in host memory. A no-op (with a log line) on CPU; the
bookkeeping is also checked on CPU with the offloader forced on."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from bark_fixtures import TEXTS

import voxserve
from voxserve.families.bark import BarkOptions
from voxserve.families.bark.runner import OFFLOAD_GROUPS
from voxserve.families.bark.voice import BarkRuntimeOptions, load_bark_voice
from voxserve.runtime.offload import WeightOffloader


def _devices(module: torch.nn.Module) -> set[str]:
    return {t.device.type for t in list(module.parameters()) + list(module.buffers())}


def _record_residency(runner, seen: dict):
    """Forward pre-hooks that note, when each stage starts computing, which stages are resident
    (offloader bookkeeping) and on which devices every stage's weights are."""
    stages = runner.stages()

    def record(name):
        def hook(module, args):
            seen.setdefault(name, ({*runner.offloader.resident}, {k: _devices(s) for k, s in stages.items()}))
        return hook

    # hooks on modules that run through __call__: the fine loop calls fine_acoustics.forward
    # directly, and BarkModel decodes through codec_model.decoder
    inner = {"semantic": stages["semantic"], "coarse": stages["coarse"], "fine": stages["fine"].layers[0],
             "codec": stages["codec"].decoder}
    handles = [m.register_forward_pre_hook(record(n)) for n, m in inner.items()]
    return handles


def test_offload_is_a_noop_on_cpu(tiny_bark_dir, bark_voice, caplog):
    with caplog.at_level(logging.WARNING, logger="voxserve.families.bark.runner"):
        v = load_bark_voice(tiny_bark_dir, device="cpu", runtime=BarkRuntimeOptions(offload=True))
    assert "offload (enable_cpu_offload) has no effect on cpu" in caplog.text
    assert not v.runner.offload and v.runner.offloader is None
    units = [u for t in TEXTS[:3] for u in v.units(t, voxserve.DETERMINISTIC)]
    for a, b in zip(v.run_units(units), bark_voice.run_units(units)):
        np.testing.assert_array_equal(a, b)
    assert _devices(v.runner.model) == {"cpu"}


def test_load_voice_takes_offload_as_a_runtime_keyword(tiny_bark_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="voxserve.families.bark.runner"):
        voxserve.load_voice(f"bark:{tiny_bark_dir}", device="cpu", offload=True)
    assert "has no effect on cpu" in caplog.text


def test_offload_bookkeeping_forced_on_cpu(tiny_bark_dir, bark_voice):
    v = load_bark_voice(tiny_bark_dir, device="cpu")
    runner = v.runner
    runner.offloader = WeightOffloader(runner.model, OFFLOAD_GROUPS, torch.device("cpu"), force=True)
    seen: dict = {}
    handles = _record_residency(runner, seen)
    try:
        units = [u for t in TEXTS[:3] for u in v.units(t, voxserve.DETERMINISTIC)]
        audio = v.run_units(units)
    finally:
        for h in handles:
            h.remove()
    assert set(seen) == set(OFFLOAD_GROUPS)
    for stage, (resident, _) in seen.items():
        assert resident == set(OFFLOAD_GROUPS[stage]), stage  # that stage alone
    assert runner.offloader.resident == set()  # all back in host memory after the batch
    assert runner.offloader.moves_in == 4  # one move in per stage per batch
    for a, b in zip(audio, bark_voice.run_units(units)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.cuda
def test_offload_keeps_idle_stages_on_the_host(tiny_bark_dir):
    v = load_bark_voice(tiny_bark_dir, device="cuda", dtype="fp16", runtime=BarkRuntimeOptions(offload=True))
    runner = v.runner
    assert runner.offload
    stages = runner.stages()
    assert all(_devices(s) == {"cpu"} for s in stages.values())
    assert all(p.is_pinned() for s in stages.values() for p in s.parameters())
    seen: dict = {}
    handles = _record_residency(runner, seen)
    try:
        units = [u for t in TEXTS[:3] for u in v.units(t, voxserve.DETERMINISTIC)]
        audio = v.run_units(units)
    finally:
        for h in handles:
            h.remove()
    assert all(len(a) > 0 and np.isfinite(a).all() for a in audio)
    assert set(seen) == set(OFFLOAD_GROUPS)
    for name, (_, devs) in seen.items():  # while a stage ran, it alone was on the GPU
        for other, d in devs.items():
            assert d == ({"cuda"} if other == name else {"cpu"}), (name, other, d)
    assert all(_devices(s) == {"cpu"} for s in stages.values())  # and all back after the batch
    plain = load_bark_voice(tiny_bark_dir, device="cuda", dtype="fp16")
    for a, b in zip(audio, plain.run_units(units)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_on_cuda(tiny_bark_dir, dtype):
    v = load_bark_voice(tiny_bark_dir, device="cuda", dtype=dtype)
    want = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    assert {p.dtype for p in v.runner.model.parameters()} == {want}
    audio = v.run_units([u for t in TEXTS for u in v.units(t, voxserve.DETERMINISTIC)])
    assert all(a.dtype == np.float32 and len(a) > 0 and np.isfinite(a).all() for a in audio)


@pytest.mark.cuda
def test_sdpa_matches_eager_and_batches_are_invariant_on_cuda(tiny_bark_dir):
    a = load_bark_voice(tiny_bark_dir, device="cuda", runtime=BarkRuntimeOptions(attention="sdpa"))
    b = load_bark_voice(tiny_bark_dir, device="cuda", runtime=BarkRuntimeOptions(attention="eager"))
    ids = torch.randint(0, 40, (3, 20), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(a.runner.model.semantic(input_ids=ids).logits,
                                   b.runner.model.semantic(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    opts = [BarkOptions(seed=k, temperature=0.8) for k in range(len(TEXTS))]
    items = [a.items([t], o)[0] for t, o in zip(TEXTS, opts)]
    batch = a.runner.generate_tokens(items)
    alone = [a.runner.generate_tokens([it])[0] for it in items]
    for x, y in zip(batch, alone):
        assert all(torch.equal(x[k], y[k]) for k in ("semantic", "coarse", "fine"))


def test_residency_interface_on_cpu(bark_voice):
    # what a device-memory budget over several voices calls; on CPU moving is a no-op
    from voxserve.runtime.offload import module_bytes

    r = bark_voice.runner
    assert r.device_bytes() == module_bytes(r.model) > 0
    r.to_host()
    r.to_device()
    assert _devices(r.model) == {"cpu"}


@pytest.mark.cuda
def test_to_host_and_back_on_cuda(tiny_bark_dir):
    v = load_bark_voice(tiny_bark_dir, device="cuda")
    units = list(v.units("Hello world.", voxserve.DETERMINISTIC))
    before = v.run_units(units)
    v.runner.to_host()
    assert _devices(v.runner.model) == {"cpu"}
    v.runner.to_device()
    assert _devices(v.runner.model) == {"cuda"}
    np.testing.assert_array_equal(v.run_units(units)[0], before[0])
    off = load_bark_voice(tiny_bark_dir, device="cuda", runtime=BarkRuntimeOptions(offload=True))
    assert off.runner.device_bytes() < v.runner.device_bytes()
