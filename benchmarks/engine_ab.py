"""Two checkouts' engines side by side on the engine-level rows of the CosyVoice 2 and SBV2 suites,
rounds interleaved in one run: each `src` folder serves from a child process of its own (its
PYTHONPATH), and the parent asks the two for one measurement after the other, alternating which
goes first. Only voxserve's public API is used in the children, so the commit before a redesign
runs the same code as the one after it.

  cv2   CosyVoice 2 (bench_cosyvoice.py's model and texts): N streaming requests arriving at once
        through one Engine, per --concurrency; per request its first chunk and RTF (medians).
  sbv2  SBV2 (bench_sbv2.py's models and Japanese sentences): 4 requests of --sentences (4) through one
        Engine submitted together (the shared BERT batched across them) and one after another;
        seconds of each and the ratio (above 1: together is faster).
  bark  Bark's late arrival (bark_step_late_arrival.py's random bark-small, every sentence run to
        --semantic-tokens): 8 one-sentence requests through one Engine, a ninth submitted
        --late-after seconds later; the ninth's first audio from its arrival, and the eight's end.

    PY=.venv/bin/python
    PYTHONPATH=src $PY benchmarks/engine_ab.py BEFORE_SRC AFTER_SRC cv2 --size small --concurrency 1,4 --rounds 3
    PYTHONPATH=src $PY benchmarks/engine_ab.py BEFORE_SRC AFTER_SRC sbv2 --size tiny --rounds 3
    PYTHONPATH=src $PY benchmarks/engine_ab.py BEFORE_SRC AFTER_SRC bark --rounds 2

The models are built by this checkout's suites (into the user cache) before the children start.
Prints each round and the medians of the timed rounds (round 0 is a warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------- the children
class _Sink:
    """A request's end and the time of its first audio (a subclass of the tree's Sink)."""

    def __init__(self, t0: float):
        self.t0, self.first, self.end, self.samples, self.error = t0, None, None, 0, None
        self.done = threading.Event()

    def on_words(self, index, words):
        pass

    def on_audio(self, index, samples, text, partial=False):
        if self.first is None and len(samples):
            self.first = time.perf_counter() - self.t0
        self.samples += len(samples)

    def on_done(self, n):
        self.end = time.perf_counter() - self.t0
        self.done.set()

    def on_error(self, e):
        self.error = repr(e)
        self.done.set()


def _sink_type():
    from voxserve.engine import engine as eng  # both trees define (or import) Sink there

    return type("Sink", (_Sink, eng.Sink), {})


def _wait(sinks, limit: float = 1800.0) -> None:
    for s in sinks:
        if not s.done.wait(limit) or s.error is not None:
            raise RuntimeError(f"a request failed: {s.error}")


def child_cv2(cfg: dict) -> None:
    import voxserve
    from voxserve import SynthesisOptions
    from voxserve.engine import Engine, EngineConfig
    from voxserve.families.cosyvoice2 import CosyRuntimeOptions

    voice = voxserve.load_voice(f"cosyvoice2:{cfg['folder']}", device="cpu",
                                runtime=CosyRuntimeOptions(threads=cfg["threads"]))
    engine = Engine({"cv": voice}, EngineConfig(max_queue_wait_s=3600)).start()
    sink, texts, rate = _sink_type(), cfg["texts"], voice.sample_rate

    def run(n: int, r: int) -> dict:
        t0 = time.perf_counter()
        sinks = []
        for k in range(n):
            sinks.append(sink(t0))
            engine.submit("cv", texts[(r * n + k) % len(texts)], SynthesisOptions(seed=1000 * r + k), sinks[-1],
                          streaming=True)
        _wait(sinks)
        return {"first_s": [s.first for s in sinks], "rtf": [s.end / (s.samples / rate) for s in sinks],
                "wall_s": time.perf_counter() - t0}

    _serve(run, engine)


def child_sbv2(cfg: dict) -> None:
    import voxserve
    from voxserve.engine import Engine, EngineConfig, SchedulerConfig
    from voxserve.options import SynthesisOptions

    voice = voxserve.load_voice(f"sbv2:{cfg['model']}", device="cpu", bert_dir=cfg["bert"])
    # the same work every round; a tree with options per family (after issue 44) takes SBV2's own class
    cls = getattr(voice, "synthesis_options", SynthesisOptions)
    opts = cls(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)
    each = cfg["sentences"]
    texts = [t for t in cfg["texts"] if sum(1 for _ in voice.units(t, opts)) == 1][:4 * each]
    if len(texts) < 4 * each:
        raise RuntimeError(f"{len(texts)} one-sentence texts; {4 * each} needed")
    requests = ["".join(texts[k:k + each]) for k in range(0, 4 * each, each)]
    # admission off (3600 s): on a loaded machine a slow round must not be refused (429)
    engine = Engine({"v": voice}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=5), max_queue_wait_s=3600)).start()
    sink = _sink_type()

    def run(together: int, r: int) -> dict:
        t0 = time.perf_counter()
        sinks = []
        for text in requests:
            sinks.append(sink(t0))
            engine.submit("v", text, opts, sinks[-1])
            if not together:
                _wait(sinks[-1:])
        _wait(sinks)
        return {"wall_s": time.perf_counter() - t0}

    _serve(run, engine)


def child_bark(cfg: dict) -> None:
    import torch
    from bark_random import random_bark_model  # benchmarks/, on the path the parent gives

    from voxserve import SynthesisOptions
    from voxserve.engine import Engine, EngineConfig
    from voxserve.families.bark.voice import bark_voice_from_model

    torch.set_num_threads(2)
    model, processor = random_bark_model("small", max_semantic_tokens=cfg["semantic_tokens"])
    gc = model.generation_config  # a short fine window (as bark_step_late_arrival.py: minutes, not hours)
    gc.fine_acoustics_config = {**gc.fine_acoustics_config, "max_fine_input_length": 128, "max_fine_history_length": 64}
    voice = bark_voice_from_model(model, processor, "random-bark-small", device="cpu")
    engine = Engine({"bark": voice}, EngineConfig(max_queue_wait_s=3600)).start()
    sink = _sink_type()
    texts = ["hello my name is suno.", "i like pizza.", "the cat is on the mat.", "this one two three.",
             "a dog on a mat.", "i like reading.", "hello the cat.", "but also pizza."]

    def run(_n: int, r: int) -> dict:
        t0 = time.perf_counter()
        eight = [sink(t0) for _ in texts]
        for k, (t, s) in enumerate(zip(texts, eight)):
            engine.submit("bark", t, SynthesisOptions(seed=100 * r + k), s, streaming=True)
        time.sleep(cfg["late_after"])
        late = sink(time.perf_counter())
        engine.submit("bark", "hello i like the dog.", SynthesisOptions(seed=100 * r + 99), late, streaming=True)
        _wait(eight + [late])
        return {"late_first_s": late.first, "eight_end_s": max(s.end for s in eight)}

    _serve(run, engine)


def _serve(run, engine) -> None:
    """One JSON command a line on stdin ({"n", "round"}), one JSON answer a line."""
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            try:
                out = run(cmd["n"], cmd["round"])
            except Exception as e:  # the parent reports it
                out = {"error": repr(e)}
            print(json.dumps(out), flush=True)
    finally:
        engine.shutdown(30)


# ---------------------------------------------------------------------------- the parent
class Child:
    def __init__(self, name: str, src: Path, what: str, cfg: dict):
        env = dict(os.environ, PYTHONPATH=str(src))
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", what, json.dumps(cfg)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        if self._read().get("ready") is not True:
            raise RuntimeError(f"{name}: did not start")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the child exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, n: int, r: int) -> dict:
        self.proc.stdin.write(json.dumps({"n": n, "round": r}) + "\n")
        out = self._read()
        if "error" in out:
            raise RuntimeError(f"{self.name}: {out['error']}")
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, str(HERE))
        {"cv2": child_cv2, "sbv2": child_sbv2, "bark": child_bark}[sys.argv[2]](json.loads(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the first checkout's src folder")
    ap.add_argument("after", type=Path, help="the second checkout's src folder")
    ap.add_argument("what", choices=("cv2", "sbv2", "bark"))
    ap.add_argument("--size", default="tiny", help="the suite's model size (cv2: tiny, small, real; sbv2: tiny, real)")
    ap.add_argument("--concurrency", type=_ints, default=[1, 4], help="cv2: requests at once, per row")
    ap.add_argument("--rounds", type=int, default=3, help="rounds after the warm-up round")
    ap.add_argument("--threads", type=int, default=None, help="cv2: the voice's intra-op threads")
    ap.add_argument("--sentences", type=int, default=4, help="sbv2: sentences in each of the 4 requests")
    ap.add_argument("--semantic-tokens", type=int, default=32, help="bark: semantic tokens a sentence")
    ap.add_argument("--late-after", type=float, default=3.0, help="bark: seconds before the ninth request")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    if args.what == "cv2":
        import bench_cosyvoice as suite

        cfg = {"folder": str(suite.model_folder(args.size)), "texts": suite.TEXTS, "threads": args.threads}
        work = list(args.concurrency)
    elif args.what == "bark":
        cfg = {"semantic_tokens": args.semantic_tokens, "late_after": args.late_after}
        work = [1]
    else:
        import bench_sbv2 as suite

        model, bert = suite.model_folders(args.size)
        cfg = {"model": str(model), "bert": str(bert), "texts": suite.japanese_texts(), "sentences": args.sentences}
        work = [1, 0]  # together, then one after another
    children = [Child("before", args.before, args.what, cfg), Child("after", args.after, args.what, cfg)]
    got: dict[tuple[str, int], list[dict]] = {}
    try:
        for r in range(args.rounds + 1):
            for n in work:
                order = children if (r + n) % 2 == 0 else children[::-1]
                for c in order:
                    out = c.ask(n, r)
                    if r > 0:
                        got.setdefault((c.name, n), []).append(out)
                    print(f"round {r} {c.name:6} n={n} {json.dumps(out)} load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        for c in children:
            c.close()
    med = statistics.median
    print(f"medians of {args.rounds} timed rounds ({os.cpu_count()} CPUs):")
    if args.what == "bark":
        for name in ("before", "after"):
            rs = got[(name, 1)]
            print(f"{name:6}: the late request's first audio {med(x['late_first_s'] for x in rs):.2f} s after its "
                  f"arrival, the eight done at {med(x['eight_end_s'] for x in rs):.2f} s")
        per = [a["late_first_s"] / b["late_first_s"] for b, a in zip(got[("before", 1)], got[("after", 1)])]
        print(f"late first audio, after/before per round {[round(x, 2) for x in per]}")
    elif args.what == "cv2":
        for n in work:
            row = {}
            for name in ("before", "after"):
                rs = got[(name, n)]
                row[name] = (med(med(x["first_s"]) for x in rs), med(med(x["rtf"]) for x in rs))
            (bf, br), (af, ar) = row["before"], row["after"]
            print(f"concurrency {n}: first chunk before {bf:.3f} s, after {af:.3f} s (after/before {af / bf:.2f}); "
                  f"RTF before {br:.3f}, after {ar:.3f} (after/before {ar / br:.2f})")
    else:
        for name in ("before", "after"):
            t, s = med(x["wall_s"] for x in got[(name, 1)]), med(x["wall_s"] for x in got[(name, 0)])
            print(f"{name:6}: 4 requests x {args.sentences} sentences together {t:.3f} s, one after another {s:.3f} s, "
                  f"together speed-up {s / t:.2f}x")
        per = [(b["wall_s"] / a["wall_s"]) for b, a in zip(got[("before", 1)], got[("after", 1)])]
        print(f"together, before/after per round {[round(x, 2) for x in per]}")


if __name__ == "__main__":
    main()
