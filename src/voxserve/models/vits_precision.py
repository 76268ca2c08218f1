"""Precision policy: which parts of VITS may run in fp16 / bf16.

The model runs stage by stage in each top-level submodule's own dtype (VitsModel casts at the
stage boundaries). Inside every stage, LayerNorm statistics and attention softmax are always
computed in fp32 (models/vits.py), whatever the storage dtype.

`precision_report` (scripts/precision-report) measures each submodule in half precision
against all-fp32; its table is in docs/precision.md. Half precision in the text encoder or the
duration predictor changes durations (ceil(exp(logw)) crosses an integer: the whole waveform
shifts), so they (and the speaker embedding) always stay fp32; they are a small part of the
work. fp16 runs the flow and the decoder in half; bf16 (8-bit mantissa) loses too much in the
flow, so only the decoder runs in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

STAGES = ("enc_p", "dp", "flow", "dec")
FP32_MODULES: dict[torch.dtype, tuple[str, ...]] = {
    torch.float32: (),
    torch.float16: ("enc_p", "dp", "emb_g"),
    torch.bfloat16: ("enc_p", "dp", "flow", "emb_g"),
}


@dataclass(frozen=True)
class PrecisionPolicy:
    dtype: torch.dtype = torch.float32
    fp32_modules: tuple[str, ...] = ()

    @classmethod
    def default(cls, dtype: torch.dtype) -> "PrecisionPolicy":
        return cls(dtype, FP32_MODULES[dtype])

    def dtype_for(self, name: str) -> torch.dtype:
        return torch.float32 if name in self.fp32_modules else self.dtype

    def table(self) -> dict[str, str]:
        names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
        return {n: names[self.dtype_for(n)] for n in (*STAGES, "emb_g")}


def apply_precision(model: nn.Module, policy: PrecisionPolicy) -> nn.Module:
    """Cast each top-level submodule to its policy dtype, in place."""
    for name, child in model.named_children():
        child.to(policy.dtype_for(name))
    return model


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-noise ratio of `test` against `reference` in dB (inf when equal)."""
    reference = np.asarray(reference, dtype=np.float64)
    noise = reference - np.asarray(test, dtype=np.float64)
    p_noise = float(np.sum(noise**2))
    if p_noise == 0:
        return math.inf
    return 10.0 * math.log10(float(np.sum(reference**2)) / p_noise)


def compare_audio(reference: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> dict:
    """Aggregate SNR over items of equal length; count items whose length changed."""
    same = [(r, t) for r, t in zip(reference, test) if len(r) == len(t)]
    changed = len(reference) - len(same)
    if not same:
        return {"snr_db": float("nan"), "length_changed": changed, "items": len(reference)}
    ref = np.concatenate([r for r, _ in same])
    tst = np.concatenate([t for _, t in same])
    return {"snr_db": snr_db(ref, tst), "length_changed": changed, "items": len(reference)}


def precision_report(run, model: nn.Module, dtypes: Iterable[torch.dtype],
                     candidates: Iterable[tuple[str, ...]] | None = None) -> list[dict]:
    """Measure each candidate set of submodules in half precision against all-fp32.

    `run()` synthesises a fixed deterministic batch with `model` and returns its audio list.
    The model is restored to fp32 afterwards.
    """
    candidates = list(candidates or [(s,) for s in STAGES] + [tuple(s for s in STAGES if s != "dp")])
    model.float()
    # casting down and back up rounds the weights: restore the exact fp32 values every time
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    reference = run()
    rows = []
    try:
        for dt in dtypes:
            for names in candidates:
                for n in names:
                    getattr(model, n).to(dt)
                rows.append({"dtype": str(dt).removeprefix("torch."), "half": "+".join(names),
                             **compare_audio(reference, run())})
                model.float()
                model.load_state_dict(saved)
    finally:
        model.float()
        model.load_state_dict(saved)
    return rows
