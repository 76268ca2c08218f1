"""A Piper batch reads back to the host once in the middle (its frame counts, which set the
shapes of what follows) and copies its audio out once; its noise is drawn on the device, from
each item's own generator (counted on the CPU with tests/host_syncs.py; on a GPU with CUDA's
sync debug mode)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from host_syncs import HostReads
from torch.overrides import TorchFunctionMode

import voxserve
from voxserve.families.piper.runner import VitsItem


def _items(n: int = 4):
    return [VitsItem(tuple(range(1, 5 + 3 * i)), speaker_id=i % 3, noise_scale=0.667, noise_w=0.8, seed=10 + i)
            for i in range(n)]


class RandomDraws(TorchFunctionMode):
    """Records (device asked for, generator's device) of every torch.randn call."""

    def __init__(self):
        super().__init__()
        self.draws: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.randn:
            g = kwargs.get("generator")
            self.draws.append((kwargs.get("device"), None if g is None else g.device))
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def runner(tiny_voice_path):
    return voxserve.load_voice(str(tiny_voice_path), device="cpu").runner


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_a_batch_reads_its_frame_counts_once_and_copies_its_audio_once(runner, layout, monkeypatch):
    from voxserve.runtime.sync import count_host_reads

    monkeypatch.setattr(runner, "layout", layout)
    with count_host_reads() as reasons, HostReads() as reads:
        audio = runner.submit(_items()).result()
    assert len(audio) == 4 and all(a.size for a in audio)
    assert reads.calls == ["cpu", "cpu"]
    assert reasons == ["piper batch: frame counts and durations", "piper batch: the audio"]


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_noise_is_drawn_on_the_device_per_item(runner, layout, monkeypatch):
    monkeypatch.setattr(runner, "layout", layout)
    items = _items(3)
    with RandomDraws() as rec:  # submit: this thread (run may split a batch over threads)
        batch = runner.submit(items).result()
    dev = torch.device(runner.device)
    # per item: its duration noise, then its prior's noise, each from its own generator
    assert len(rec.draws) == 2 * len(items)
    assert all(torch.device(d) == dev and g == dev for d, g in rec.draws), rec.draws
    for it, a in zip(items, batch):  # the seeded noise is the item's own: alone == in the batch
        np.testing.assert_allclose(runner.submit([it]).result()[0], a, atol=2e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_cuda_batch_synchronises_for_its_frame_counts_only(tiny_voice_path, layout):
    """On the device, eager stages: submitting a batch makes one synchronising call (the read
    of its frame counts); the noise and the small inputs go up without waiting, and the audio
    comes back on a side stream (result() waits for that copy alone)."""
    import warnings

    voice = voxserve.load_voice(str(tiny_voice_path), device="cuda", cuda_graphs=False)
    r = voice.runner
    r.layout = layout
    r.submit(_items()).result()  # warm-up (allocator, kernels)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pending = r.submit(_items())
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= 1, [str(w.message) for w in syncs]
    assert len(pending.result()) == 4
