"""Shape buckets for the CPU path.

oneDNN (PyTorch's CPU convolution library) JIT-generates a kernel for every new input shape.
Sentence lengths are all different, so without care every batch pays kernel generation for
each of its distinct convolution layers, a large share of the flow and decoder time (see
docs/benchmarks.md, "Figures behind the code's defaults"). Rounding lengths up
to a geometric series makes shapes repeat: the padded tail is masked (exact), costs at most
`ratio - 1` extra work, and the primitive cache (raised to 4096 entries) then holds them all.
"""

from __future__ import annotations

import math
import os

# read by oneDNN when it first creates a primitive; only a default
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "4096")


def geometric_bucket(n: int, ratio: float = 1.0625, align: int = 8, start: int = 16) -> int:
    """Smallest value >= n in the series start * ratio**k, each rounded up to `align`."""
    if n <= start:
        return start
    k = math.ceil(math.log(n / start) / math.log(ratio) - 1e-9)
    while True:
        v = math.ceil(start * ratio**k / align) * align
        if v >= n:
            return v
        k += 1


# Decoder-only calls (windows of a long sentence, cut pieces) take widths set by how batches
# happen to pack, not by sentence lengths: rounded to a multiple of this many frames, they take
# few widths, so their kernels are all created early instead of one new shape now and then.
DECODE_ALIGN = 32


def decode_bucket(n: int) -> int:
    return max(DECODE_ALIGN, -(-n // DECODE_ALIGN) * DECODE_ALIGN)
