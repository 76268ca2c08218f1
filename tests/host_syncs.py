"""Counting host reads on the CPU: the calls that turn a tensor into host values.

On CUDA each of int(t), float(t), bool(t), t.item(), t.tolist(), t.cpu(), t.numpy() on a
device tensor is a device->host read that waits for every kernel queued before it. On the
CPU nothing waits, but the code paths are the same, so counting these calls in a CPU run
counts the reads a GPU run would make. A tensor that such a call returned is on the host
already: reading it again is not counted (host_read(t).tolist() is one read).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

READS = {"__int__", "__float__", "__bool__", "__index__", "item", "tolist", "cpu", "numpy"}


class HostReads(TorchFunctionMode):
    """with HostReads() as r: ...  -> r.calls: the reading calls made, in order."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []
        self._host: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in READS and args and isinstance(args[0], torch.Tensor) \
                and not any(args[0] is t for t in self._host):
            self.calls.append(name)
            if isinstance(out, torch.Tensor):
                self._host.append(out)
        return out


def count_calls(obj, name: str, monkeypatch) -> list[list[str]]:
    """Patch obj.name (a method) to record the host reads of each call: -> one list per call."""
    per_call: list[list[str]] = []
    orig = getattr(obj, name)

    def wrapped(*a, **k):
        with HostReads() as r:
            res = orig(*a, **k)
        per_call.append(r.calls)
        return res

    monkeypatch.setattr(obj, name, wrapped)
    return per_call


def cuda_syncs(fn):
    """(fn(), the synchronisation warnings CUDA's sync-debug mode raised while it ran): the
    device run's count of what this module counts on the CPU."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return out, [w for w in caught if "synchroniz" in str(w.message)]
