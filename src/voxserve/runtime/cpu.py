"""CPU process tuning.

glibc returns every freed block over its mmap threshold (at most 32 MiB) to the kernel, so
each decoder activation of a long sentence ([1, 32, 10^5+] floats) is a fresh mmap whose pages
fault in on first touch: measured on a 2-core x86 VM, an element-wise add on such tensors ran
4x slower than on reused memory. Turning mmap allocation off and raising the trim threshold
makes freed activations stay in the heap and be reused, as ONNX Runtime's arena does.
The cost: the process keeps its peak heap. Disable with VOXSERVE_MALLOPT=0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_done = False


def tune_malloc() -> bool:
    """Apply once per process; True if the allocator was tuned."""
    global _done
    if _done:
        return True
    if os.environ.get("VOXSERVE_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc without mallopt
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
    _done = ok
    log.debug("glibc malloc tuned for tensor reuse: %s", ok)
    return ok
