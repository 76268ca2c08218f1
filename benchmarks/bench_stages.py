"""Per-stage timing of the VITS model for the benchmark scripts (benchmarks/stages_vs_piper.py,
benchmarks/runtime_ab.py): the model's stage methods wrapped class-wide, in place."""

from __future__ import annotations

import time
from collections.abc import Iterable

from harness.corpus import load_corpus
from voxserve.models import vits as vits

STAGE_METHODS = {"encode": "encode", "flow": "flow_reverse", "decode": "decode"}
"""Stage name -> VitsModel method (encode = text encoder + durations)."""


def time_stages() -> dict[str, float]:
    """Wrap VitsModel's stage methods, for every model of this process from now on, so that
    each call adds its wall time (seconds) to the returned dict, keyed by stage. Reset it by
    setting its values to 0 between measurements."""
    spent = dict.fromkeys(STAGE_METHODS, 0.0)
    for stage, method in STAGE_METHODS.items():
        fn = getattr(vits.VitsModel, method)

        def timed(*a, _fn=fn, _stage=stage, **k):
            t = time.perf_counter()
            out = _fn(*a, **k)
            spent[_stage] += time.perf_counter() - t
            return out

        setattr(vits.VitsModel, method, timed)
    return spent


def corpus_units(voice, categories: Iterable[str], options) -> list:
    """Every sentence unit of the default corpus's texts in `categories`, in corpus order."""
    cats = set(categories)
    return [u for d in load_corpus() if d["category"] in cats for u in voice.units(d["text"], options)]
