"""Host reads and host-to-device uploads of the hot loops (decode steps, synthesis batches).

On CUDA a device->host read waits for every kernel queued before it, and so does a plain
host->device copy from pageable memory (PyTorch synchronises the stream after it). The hot
loops therefore read back only what the host must decide on (a step's stop decisions, a
batch's frame counts), through `host_read`, which names why; and they send small host values
(per-row lengths, flags) through `upload`, which does not wait for the device.

`count_host_reads()` records the reads of the calling thread: the tests count them per step
and per batch (docs/architecture.md, "Host syncs"). A CUDA test checks the same with
`torch.cuda.set_sync_debug_mode`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch


class _Log(threading.local):
    def __init__(self):
        self.open: list[list[str]] = []


_log = _Log()


def host_read(t: torch.Tensor, why: str) -> torch.Tensor:
    """t on the host (for a CUDA tensor: a copy that waits for the device). why: what the host
    decides with it (recorded by `count_host_reads`)."""
    for reads in _log.open:
        reads.append(why)
    return t.cpu()


@contextmanager
def count_host_reads() -> Iterator[list[str]]:
    """The `host_read` reasons of this thread while the block runs, in order."""
    reads: list[str] = []
    _log.open.append(reads)
    try:
        yield reads
    finally:
        _log.open.remove(reads)


def upload(values: Sequence | torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Host values -> a tensor on device, without waiting for the device: on CUDA through
    pinned memory, non-blocking (the caching host allocator keeps the buffer until the copy
    has run)."""
    t = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
