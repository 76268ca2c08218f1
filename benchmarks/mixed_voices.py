#!/usr/bin/env python3
"""A VITS voice and a Bark voice on one device worker: how the scheduler shares it.

VITS traffic (en_US-joe-medium): `--clients` closed-loop clients, each asking for the corpus's
medium texts (several sentences) one after the other. Bark traffic: `--bark-requests` requests
of several sentences kept queued the whole time (a backlog), on a random-weight Bark with
tiny layers and `--bark-tokens` semantic tokens a sentence - real Bark generation code, a
fraction of a second a sentence here (bark-small on this CPU takes about a minute a sentence,
which makes every effect below larger, not different).

Two policies, run alternately (round by round, so a shared machine's noise falls on both):
  turns - voices take turns batch by batch (the scheduler's order when it is told no times)
  fair  - voices share the device by time (the engine reports each batch's seconds)
For each: VITS request latency and time to first audio (median, p90), VITS sentences a second,
Bark sentences a second, and the device time each voice used.

    .venv/bin/python benchmarks/mixed_voices.py            # ~3 minutes on 2 cores
    .venv/bin/python benchmarks/mixed_voices.py --rounds 1 --vits-requests 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from voxserve.engine import BatchObserver, Sink  # noqa: E402  (after the path)

BARK_TEXT = ("Hello there, how are you today? I like pizza, but also reading. The cat is on the mat. "
             "One two three four. This is a test of batch generation. That is all for now.")


class Timed(Sink):
    """A sink that records when a request was submitted, first heard from and finished."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.first = None
        self.end = None
        self.sentences = 0
        self.times: list[float] = []
        self.done = threading.Event()
        self.error = None

    def on_audio(self, index, samples, text, partial=False):
        if self.first is None:
            self.first = time.perf_counter()
        self.sentences += not partial
        self.times.append(time.perf_counter())

    def on_done(self, n):
        self.end = time.perf_counter()
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.end = time.perf_counter()
        self.done.set()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def one_run(policy: str, joe, bark, texts, ns) -> dict:
    from voxserve import DETERMINISTIC, SynthesisOptions
    from voxserve.engine import Engine, EngineConfig, SchedulerConfig
    from voxserve.engine.scheduler import Scheduler

    class DeviceTime(BatchObserver):  # every batch's seconds, per voice, under either policy
        def __init__(self):
            self.s = {joe.name: 0.0, bark.name: 0.0}

        def on_batch(self, voice, size, cost, seconds, audio_seconds, finished):
            self.s[voice] += seconds

    dev = DeviceTime()
    eng = Engine({joe.name: joe, bark.name: bark}, EngineConfig(scheduler=SchedulerConfig()), observer=dev)
    if policy == "turns":  # the scheduler is told no batch times: voices alternate batch by batch
        w = next(iter(eng._workers.values()))
        w.scheduler.complete = lambda batch, seconds=None, _c=Scheduler.complete, _s=w.scheduler: _c(_s, batch)
    bark_sinks = []
    vits = []
    lock = threading.Lock()
    stop = threading.Event()
    with eng:
        def keep_bark_busy():
            while not stop.is_set():
                live = [s for s in bark_sinks if not s.done.is_set()]
                while len(live) < ns.bark_requests:
                    s = Timed()
                    eng.submit(bark.name, BARK_TEXT, SynthesisOptions(seed=len(bark_sinks)), s)
                    bark_sinks.append(s)
                    live.append(s)
                time.sleep(0.05)

        feeder = threading.Thread(target=keep_bark_busy, daemon=True)
        feeder.start()
        time.sleep(1.0)  # the Bark backlog is queued and running
        t_start = time.perf_counter()
        counter = iter(range(ns.vits_requests))

        def client():
            while True:
                with lock:
                    k = next(counter, None)
                if k is None:
                    return
                s = Timed()
                eng.submit(joe.name, texts[k % len(texts)], DETERMINISTIC, s)
                s.done.wait(600)
                with lock:
                    vits.append(s)

        threads = [threading.Thread(target=client) for _ in range(ns.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_end = time.perf_counter()
        stop.set()
        feeder.join()
        used = dict(dev.s)
        eng.stop_accepting()  # drop the Bark backlog
        for w in eng._workers.values():
            for rid in list(w.requests):
                eng.cancel(rid)
    window = t_end - t_start
    bark_sentences = sum(t_start <= t <= t_end for s in bark_sinks for t in s.times)
    assert all(s.error is None for s in vits), [s.error for s in vits if s.error]
    lat = [s.end - s.t0 for s in vits]
    ttfa = [s.first - s.t0 for s in vits]
    return {"policy": policy, "window_s": window, "vits_latency_median_s": statistics.median(lat),
            "vits_latency_p90_s": pct(lat, 0.9), "vits_ttfa_median_s": statistics.median(ttfa),
            "vits_ttfa_p90_s": pct(ttfa, 0.9), "vits_sentences_per_s": sum(s.sentences for s in vits) / window,
            "bark_sentences": bark_sentences, "device_s": used}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--vits-requests", type=int, default=16)
    p.add_argument("--bark-requests", type=int, default=3)
    p.add_argument("--bark-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)

    import torch

    import voxserve
    from bark_random import random_bark_voice

    torch.set_num_threads(ns.threads)
    joe = voxserve.load_voice(device="cpu")
    bark = random_bark_voice("tiny", max_semantic_tokens=ns.bark_tokens, device="cpu")
    corpus = [json.loads(line) for line in (ROOT / "corpus" / "en_bench.jsonl").read_text().splitlines() if line]
    texts = [r["text"] for r in corpus if r["category"] == "medium"]
    joe.synthesize(texts[0])  # warm-up
    bark.synthesize("Hello there.")
    runs = []
    for r in range(ns.rounds):
        for policy in ("turns", "fair") if r % 2 == 0 else ("fair", "turns"):
            res = one_run(policy, joe, bark, texts, ns)
            print(f"round {r} {policy:>5}: VITS latency median {res['vits_latency_median_s']:.2f} s, "
                  f"TTFA median {res['vits_ttfa_median_s']:.2f} s, {res['vits_sentences_per_s']:.2f} VITS sentences/s, "
                  f"device s {res['device_s']}", file=sys.stderr, flush=True)
            runs.append(res)
    print(f"\nen_US-joe-medium ({ns.clients} closed-loop clients, {ns.vits_requests} medium texts) next to a "
          f"Bark backlog ({ns.bark_requests} requests, tiny random Bark, {ns.bark_tokens} semantic tokens a "
          f"sentence), one CPU worker, torch threads {ns.threads}; medians over {ns.rounds} rounds\n")
    print("| policy | VITS latency median s | p90 s | VITS TTFA median s | p90 s | VITS sentences/s | "
          "Bark sentences in window | device time VITS : Bark |")
    print("| :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for policy in ("turns", "fair"):
        rs = [r for r in runs if r["policy"] == policy]

        def m(key):
            return statistics.median(r[key] for r in rs)

        used = [(r["device_s"][joe.name], r["device_s"][bark.name]) for r in rs]
        ratio = statistics.median(b / a if a else float("inf") for a, b in used)
        print(f"| {policy} | {m('vits_latency_median_s'):.2f} | {m('vits_latency_p90_s'):.2f} | "
              f"{m('vits_ttfa_median_s'):.2f} | {m('vits_ttfa_p90_s'):.2f} | {m('vits_sentences_per_s'):.2f} | "
              f"{m('bark_sentences'):.0f} | 1 : {ratio:.2f} |")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"args": vars(ns), "runs": runs}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
