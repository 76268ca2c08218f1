"""Device and dtype resolution, and the precision policy of fp32 on CUDA (docs/precision.md):
fp32 means fp32, TF32 off for convolutions and matrix products."""

from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger(__name__)

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """'auto' -> cuda if available else cpu; 'cuda' without CUDA is an error, not a fallback."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unsupported device {device!r}; use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but this PyTorch build sees no CUDA GPU")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}; use cpu, cuda, cuda:N or auto")
    if dev.type == "cuda":
        fp32_without_tf32()
    return dev


def fp32_without_tf32() -> None:
    """fp32 is fp32 on CUDA: PyTorch runs cuDNN convolutions in TF32 (10-bit mantissa) by default,
    which moves a VITS voice's durations (docs/precision.md); fp16/bf16 are the speed paths.
    Process-wide, as PyTorch's flags are. The legacy flags only: mixing them with the newer
    `fp32_precision` settings makes reading either an error."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


@functools.cache
def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: oneDNN runs bf16 convolutions natively, faster than fp32
    (docs/precision.md, "bf16 on CPU"). Without them bf16 is emulated and slower than fp32."""
    cpu = getattr(torch, "cpu", None)
    try:
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    except AttributeError:  # a PyTorch without these probes
        return False


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None -> float32. fp16 is a GPU feature (an error on CPU); bf16 runs on both (on a CPU
    without native bf16 it works, slowly, with a warning)."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        dt = dtype
    else:
        key = str(dtype).lower()
        if key not in _DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; use fp32, fp16 or bf16")
        dt = _DTYPES[key]
    if dt == torch.float16 and device.type != "cuda":
        raise ValueError(f"dtype {dtype} needs a CUDA device; on CPU use fp32 or bf16")
    if dt == torch.bfloat16 and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning("this CPU has no native bf16 (AVX512-BF16 or AMX): bf16 is emulated and "
                    "slower than fp32")
    return dt


def dtype_name(dt: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dt]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
