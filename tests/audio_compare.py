"""One tolerance for "the same sentence, synthesised in another batch".

fp32 is not associative: the text encoder runs length groups as padded [b, T] batches and
oneDNN picks GEMM/conv kernels by shape, so a sentence in a batch may sum in another order
than alone. On an AVX-512 CPU (Zen 4) every sentence stayed within 1e-4 of its audio alone;
on an AVX2 one (Zen 3) a 29-id sentence in a 16-sentence batch differs by 1.5e-4 (encoder
output 1e-6 apart, grown by the flow and decoder), about -77 dB. Sentences mixed up between
requests or misaligned differ by ~0.1-1 (thousands of int16 steps), so these bounds still
catch every real fault.
"""

from __future__ import annotations

import numpy as np

BATCH_ATOL = 2e-4  # float samples in [-1, 1]
# int16 PCM is float * 32767 truncated: 2e-4 is 6.6 steps, plus one step of truncation.
PCM_ATOL = int(np.ceil(BATCH_ATOL * 32767)) + 1


def assert_pcm_close(got: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    """`got` and `ref` are int16 PCM of the same text: same length, within `PCM_ATOL` steps."""
    assert len(got) == len(ref), (what, len(got), len(ref))
    diff = np.abs(got.astype(np.int32) - ref.astype(np.int32))
    assert diff.max() <= PCM_ATOL, (what, int(diff.max()))
