"""CPU offload: idle stages live in host memory. A no-op (with a log line) on CPU."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from conftest import TEXTS

import voxserve
from voxserve.voices.bark import BarkRuntimeOptions, load_bark_voice


def _devices(module: torch.nn.Module) -> set[str]:
    return {t.device.type for t in list(module.parameters()) + list(module.buffers())}


def test_offload_is_a_noop_on_cpu(tiny_bark_dir, bark_voice, caplog):
    with caplog.at_level(logging.WARNING, logger="voxserve.runtime.bark_runner"):
        v = load_bark_voice(tiny_bark_dir, device="cpu", runtime=BarkRuntimeOptions(cpu_offload=True))
    assert "enable_cpu_offload has no effect on cpu" in caplog.text
    assert not v.runner.cpu_offload
    units = [u for t in TEXTS[:3] for u in v.units(t, voxserve.DETERMINISTIC)]
    for a, b in zip(v.run_units(units), bark_voice.run_units(units)):
        np.testing.assert_array_equal(a, b)
    assert _devices(v.runner.model) == {"cpu"}


@pytest.mark.cuda
def test_offload_keeps_idle_stages_on_the_host(tiny_bark_dir):
    v = load_bark_voice(tiny_bark_dir, device="cuda", dtype="fp16", runtime=BarkRuntimeOptions(cpu_offload=True))
    runner = v.runner
    assert runner.cpu_offload
    stages = dict(zip(("semantic", "coarse", "fine", "codec"), runner.stages()))
    assert all(_devices(s) == {"cpu"} for s in stages.values())
    assert all(p.is_pinned() for s in stages.values() for p in s.parameters())

    seen: dict[str, dict[str, set[str]]] = {}

    def record(name):
        def hook(module, args):
            seen.setdefault(name, {k: _devices(s) for k, s in stages.items()})
        return hook

    handles = [s.register_forward_pre_hook(record(n)) for n, s in stages.items() if n != "codec"]
    handles.append(stages["codec"].decoder.register_forward_pre_hook(record("codec")))
    try:
        units = [u for t in TEXTS[:3] for u in v.units(t, voxserve.DETERMINISTIC)]
        audio = v.run_units(units)
    finally:
        for h in handles:
            h.remove()
    assert all(len(a) > 0 and np.isfinite(a).all() for a in audio)
    # while a stage ran, it alone was on the GPU
    for name, devs in seen.items():
        for other, d in devs.items():
            assert d == ({"cuda"} if other == name else {"cpu"}), (name, other, d)
    # after the generation, every stage is back in host memory
    assert all(_devices(s) == {"cpu"} for s in stages.values())
    # and the output is the same as without offload
    plain = load_bark_voice(tiny_bark_dir, device="cuda", dtype="fp16")
    for a, b in zip(audio, plain.run_units(units)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_on_cuda(tiny_bark_dir, dtype):
    v = load_bark_voice(tiny_bark_dir, device="cuda", dtype=dtype)
    assert {p.dtype for p in v.runner.model.parameters()} == {getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[dtype])}
    items = v.items(TEXTS, voxserve.DETERMINISTIC)
    batch = v.runner.generate_tokens(items)
    assert len({r["semantic"].numel() for r in batch}) >= 1
    audio = v.run_units([u for t in TEXTS for u in v.units(t, voxserve.DETERMINISTIC)])
    assert all(a.dtype == np.float32 and np.isfinite(a).all() for a in audio)


@pytest.mark.cuda
def test_sdpa_matches_eager_on_cuda(tiny_bark_dir):
    a = load_bark_voice(tiny_bark_dir, device="cuda", runtime=BarkRuntimeOptions(attention="sdpa"))
    b = load_bark_voice(tiny_bark_dir, device="cuda", runtime=BarkRuntimeOptions(attention="eager"))
    ids = torch.randint(0, 40, (3, 20), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(a.runner.model.semantic(input_ids=ids).logits,
                                   b.runner.model.semantic(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    items = a.items(TEXTS, voxserve.DETERMINISTIC)
    batch = a.runner.generate_tokens(items)
    alone = [a.runner.generate_tokens([it])[0] for it in items]
    for x, y in zip(batch, alone):
        assert all(torch.equal(x[k], y[k]) for k in ("semantic", "coarse", "fine"))
