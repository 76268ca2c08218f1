"""Peak RSS of the worst request per family, on the tiny models the tests build (issue 49).

Each family runs in its own child process under an address-space cap (`prlimit --as`), so a
request that grew without bound fails in the child instead of taking the machine:

    PYTHONPATH=src python benchmarks/bounds_rss.py [--as-bytes 4000000000] [--timeout 1800] [piper sbv2 cosyvoice2 bark]

A child builds its family's tiny model as the tests do (tests/*fixtures.py), loads it, says one
short sentence (the baseline: model, allocator and kernels in place), then streams the worst
request the family admits (4096 characters, the server's input bound; chunks are dropped, so
the figure is the model's working memory, not a whole answer held) and prints the peak RSS. The
children run under the server's allocator (jemalloc with purging off, where the system has it).
While it streams, a child writes a progress line to stderr at most every 30 s (audio made,
peak RSS so far; passed through as it comes): a run stopped by its timeout or cap still tells
how far it got.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_CHARS = 4096


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _words(chars: int) -> str:
    unit = "the quick brown fox jumps over the lazy dog while the band plays on "
    return (unit * (chars // len(unit) + 1))[:chars].rsplit(" ", 1)[0]


def child(family: str) -> dict:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "sbv2"), str(ROOT / "tests" / "cosyvoice2")]
    import torch

    torch.set_num_threads(1)
    import voxserve
    from voxserve import SynthesisOptions

    tmp = Path(tempfile.mkdtemp())
    opts = SynthesisOptions(seed=0)
    if family == "piper":
        from vits_fixtures import write_tiny_voice

        voice = voxserve.load_voice(str(write_tiny_voice(tmp)), device="cpu")
        short, worst = "Hello there.", _words(MAX_CHARS)  # one unbroken run of words (cut by the voice)
        opts = SynthesisOptions(seed=0, speed=0.25)  # the slowest rate: the most frames per phoneme
    elif family == "sbv2":
        import sbv2_fixtures as fx

        folder = fx.write_model_folder("jp_extra", tmp / "tiny-jp-extra")
        voice = voxserve.load_voice(f"sbv2:{folder}", device="cpu", bert_dir=fx.write_bert_root(tmp / "bert"))
        # the longest sentence under the frame cap, and again: "日" x 100 is refused (~12k frames)
        short, worst = "日本。", "日" * 64 + "。"  # one sentence: a request's run one at a time
        opts = voice.synthesis_options.deterministic()  # noise off
    elif family == "cosyvoice2":
        import cv2_fixtures as fx
        import cv2_onnx_fixtures as onnx_fx

        # the encoder chunk-masked as CosyVoice2-0.5B's (25 tokens): streams take the flow cache path
        d = fx.write_model_folder(tmp / "tiny-cosyvoice2", speakers={"spk": fx.prompt_entry()}, encoder_chunk=25)
        onnx_fx.write_standins(d)
        voice = voxserve.load_voice(f"cosyvoice2:{d}", device="cpu")
        short, worst = "Hello there.", _words(MAX_CHARS)
    elif family == "bark":
        from bark_fixtures import write_tiny_bark

        voice = voxserve.load_voice(f"bark:{write_tiny_bark(tmp / 'tiny-bark')}", device="cpu")
        short, worst = "Hello there.", _words(MAX_CHARS)
    else:
        raise SystemExit(f"unknown family {family!r}")
    voice.synthesize(short, opts)
    base = _peak_mb()
    t0, samples, error = time.perf_counter(), 0, None
    told = t0
    try:
        for chunk in voice.stream(worst, opts):
            samples += len(chunk.samples)
            if time.perf_counter() - told > 30:
                told = time.perf_counter()
                print(f"progress: {samples / voice.sample_rate:.1f} s of audio, peak RSS {_peak_mb():.0f} MB, "
                      f"{told - t0:.0f} s", file=sys.stderr, flush=True)
    except voxserve.VoxserveError as e:  # a refusal is an answer too
        error = f"{type(e).__name__}: {e}"
    return {"family": family, "baseline_mb": round(base), "peak_mb": round(_peak_mb()),
            "audio_s": round(samples / voice.sample_rate, 1), "seconds": round(time.perf_counter() - t0, 1),
            "error": error}


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--child":
        print(json.dumps(child(argv[1])))
        return
    cap, timeout = "4000000000", 1800.0
    while argv and argv[0] in ("--as-bytes", "--timeout"):
        if argv[0] == "--as-bytes":
            cap = argv[1]
        else:
            timeout = float(argv[1])
        argv = argv[2:]
    # the server's allocator (runtime/allocator.py): jemalloc, purging off, where the system has it
    from voxserve.runtime.allocator import JEMALLOC_CONF, find_jemalloc

    env = dict(os.environ)
    if find_jemalloc():
        env.update(LD_PRELOAD=find_jemalloc(), MALLOC_CONF=JEMALLOC_CONF)
    print("| family | worst request | baseline RSS (MB) | peak RSS (MB) | audio (s) | time (s) | note |")
    print("|---|---|---|---|---|---|---|")
    for fam in argv or ["piper", "sbv2", "cosyvoice2", "bark"]:
        try:  # the child's stderr (progress, errors) goes straight to ours
            p = subprocess.run(["prlimit", f"--as={cap}", "--", sys.executable, __file__, "--child", fam],
                               stdout=subprocess.PIPE, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            print(f"| {fam} | | | timed out after {timeout:.0f} s (its last progress line above) | | | |", flush=True)
            continue
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode or not lines:
            print(f"| {fam} | | | failed (exit {p.returncode}; its stderr above) | | | |", flush=True)
            continue
        r = json.loads(lines[-1])
        print(f"| {fam} | | {r['baseline_mb']} | {r['peak_mb']} | {r['audio_s']} | {r['seconds']} | {r['error'] or ''} |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
