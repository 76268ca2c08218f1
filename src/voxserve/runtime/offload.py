"""CPU offload: idle weights in pinned host memory, on the device only while they run.

* `WeightOffloader` keeps named submodules of a model on the host (pinned, so the copy in is
  a fast DMA) and brings a group onto the device for the duration of a stage. Host copies are
  kept: moving out is free (weights never change at inference), moving in is one H2D copy.
* `DeviceBudget` holds several offloadable voices under a byte budget and evicts the least
  recently used ones to host memory when a newly used voice does not fit.

On a CPU device everything is already in host memory: offload is a no-op (logged once).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn

log = logging.getLogger(__name__)


def module_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


class ResidentWeights:
    """`to_host` / `to_device` for a runner's weights, what a `DeviceBudget` calls to evict an
    idle voice and bring it back. The runner has `model`, `device` and `_lock` (held while a
    batch runs, so weights never move under one); `_after_move` and `_stays_on_host` adapt it."""

    model: nn.Module
    device: torch.device

    def device_bytes(self) -> int:
        """Device memory the weights take while the voice is resident."""
        return module_bytes(self.model)

    def to_host(self) -> None:
        """Weights to pinned host memory (so moving them back is an asynchronous copy)."""
        with self._lock:
            self._move(torch.device("cpu"))

    def to_device(self) -> None:
        with self._lock:
            self._move(self.device)

    def _stays_on_host(self) -> bool:
        """True where the weights are not the runner's to move (e.g. offloaded per stage)."""
        return False

    def _after_move(self) -> None:
        """What depends on the weights' addresses (captured graphs) is rebuilt here."""

    def _move(self, dev: torch.device) -> None:
        if self.device.type != "cuda" or self._stays_on_host():  # nothing to move on CPU
            return
        for t in [*self.model.parameters(), *self.model.buffers()]:
            t.data = t.data.to(dev, non_blocking=True) if dev.type == "cuda" else t.data.to(dev).pin_memory()
        self._after_move()


class WeightOffloader:
    def __init__(self, model: nn.Module, groups: Mapping[str, Sequence[str]], device: torch.device,
                 force: bool = False):
        """groups: stage name -> names of `model`'s submodules that the stage needs.
        force: do the bookkeeping even on a CPU device (tests; host copies are not pinned)."""
        self.model = model
        self.groups = {k: tuple(v) for k, v in groups.items()}
        self.device = device
        self.enabled = device.type == "cuda" or force
        self.resident: set[str] = set()  # submodules currently on the device
        self.moves_in = 0
        if not self.enabled:
            log.info("offload requested on %s: weights are already in host memory, nothing to do", device)
            return
        self._host: dict[str, dict[str, torch.Tensor]] = {}
        for names in self.groups.values():
            for name in names:
                if name in self._host or not hasattr(model, name):
                    continue
                sub = getattr(model, name)
                self._host[name] = {k: _host_copy(t) for k, t in _tensors(sub)}
                self._point(sub, self._host[name])

    @staticmethod
    def _point(sub: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
        for k, t in _tensors(sub):
            t.data = tensors[k]

    def _bring_in(self, name: str) -> None:
        if name in self.resident or name not in self._host:
            return
        sub = getattr(self.model, name)
        self._point(sub, {k: t.to(self.device, non_blocking=True) for k, t in self._host[name].items()})
        self.resident.add(name)
        self.moves_in += 1

    def _send_out(self, name: str) -> None:
        if name in self.resident:
            self._point(getattr(self.model, name), self._host[name])  # the host copy is current
            self.resident.discard(name)

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """The stage's submodules are on the device inside the block, on the host after it."""
        if not self.enabled:
            yield
            return
        names = self.groups[stage]
        for n in names:
            self._bring_in(n)
        try:
            yield
        finally:
            for n in names:
                self._send_out(n)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to("cpu", copy=True)
    return t.pin_memory() if torch.cuda.is_available() else t


def _tensors(sub: nn.Module):
    yield from sub.named_parameters()
    yield from sub.named_buffers()


class DeviceBudget:
    """LRU residency of whole voices under a device-memory budget (bytes)."""

    def __init__(self, budget_bytes: int):
        if budget_bytes <= 0:
            raise ValueError("budget must be positive")
        self.budget = budget_bytes
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[int, Callable[[], None], Callable[[], None]]] = {}
        self._resident: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self.evictions = 0

    def register(self, key: str, nbytes: int, load: Callable[[], None], unload: Callable[[], None],
                 resident: bool = False) -> None:
        if nbytes > self.budget:
            raise ValueError(f"{key} needs {nbytes} bytes, more than the whole budget ({self.budget})")
        with self._lock:
            self._entries[key] = (nbytes, load, unload)
            if resident:
                self._make_room(nbytes)
                self._resident[key] = nbytes

    @property
    def used(self) -> int:
        return sum(self._resident.values())

    def resident(self) -> list[str]:
        return list(self._resident)

    def _make_room(self, nbytes: int) -> None:
        while self._resident and self.used + nbytes > self.budget:
            victim, _ = self._resident.popitem(last=False)
            self._entries[victim][2]()
            self.evictions += 1
            log.info("evicted voice %s from the device (budget %d bytes)", victim, self.budget)

    def acquire(self, key: str) -> None:
        """Make `key` resident (loading it, evicting others if needed) and most recently used."""
        with self._lock:
            if key in self._resident:
                self._resident.move_to_end(key)
                return
            nbytes, load, _ = self._entries[key]
            self._make_room(nbytes)
            load()
            self._resident[key] = nbytes
