"""The CUDA tests' tolerances, from the precision policy (docs/precision.md): `fp32` on CUDA is
fp32 with TF32 off (runtime/device.py), so a GPU's fp32 output differs from the CPU's only by the
order of its sums: the same durations (equal lengths, equal word times) and waves within
FP32_WAVE_ATOL. fp16/bf16 are the speed paths, checked by SNR against fp32 (HALF_SNR_DB)."""

FP32_WAVE_ATOL = 1e-3
"""max |GPU - CPU| of a wave in [-1, 1], fp32, any voice (the tiny models' differences are far
smaller; one bound keeps the tests agreeing)."""

HALF_SNR_DB = 30.0
"""fp16/bf16 policy (families' precision code) against fp32, over sentences whose length kept."""
