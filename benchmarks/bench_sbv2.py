"""Style-Bert-VITS2 on real-size random weights: HayaKoe's BERT table and whole-text synthesis.

    python benchmarks/bench_sbv2.py [--device cpu|cuda] [--runs 3] [--out report.json]

Builds, into a temporary folder and through the same loader a user's files go through, a
real-size JP-Extra synthesizer (hidden 192, 6 layers, HiFi-GAN from 512 channels, hop 512) and a
real-size DeBERTa-v2 (24 layers, hidden 1024, FFN 4096, 16 heads; random weights, the fixtures'
character tokenizer). Rows, each the median of --runs interleaved timed runs after a warm-up:

- BERT, sequential (one forward per sentence, as SBV2 runs it) vs batched (one padded forward),
  for 2/4/8/16 sentences: latency, speed-up, peak CUDA memory (CUDA only);
- whole text of N sentences: sentence by sentence (BERT + synthesizer per sentence) vs
  voxserve's `synthesize` (one BERT batch, one synthesizer batch);
- 4 concurrent requests of 4 sentences through the engine (one BERT stage across them) vs the
  same 4 requests one after another (each batched alone).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "sbv2")]

import torch  # noqa: E402

REAL_BERT = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                 max_position_embeddings=512, relative_attention=True, position_buckets=256,
                 norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                 layer_norm_eps=1e-7, max_relative_positions=-1, position_biased_input=False, type_vocab_size=0)


def build(root: Path):
    import transformers

    import sbv2_fixtures as fx
    from test_sbv2_real_size import write_real_size_folder

    bert_root = root / "bert"
    fx.write_bert_root(bert_root, names=(fx.JP_BERT,))  # the tokenizer files; the model is replaced
    d = bert_root / fx.JP_BERT
    tiny = transformers.AutoConfig.from_pretrained(d)
    torch.manual_seed(0)
    model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(vocab_size=tiny.vocab_size, **REAL_BERT))
    for f in d.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(d)
    write_real_size_folder(root / "model")
    return root / "model", bert_root


def median_time(fn, runs: int, sync) -> float:
    out = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sizes", default="2,4,8,16")
    p.add_argument("--out", default=None)
    ns = p.parse_args(argv)
    import sbv2_fixtures as fx
    import voxserve
    from serve_fakes import RecordingSink
    from voxserve import SynthesisOptions
    from voxserve.engine import Engine, EngineConfig, SchedulerConfig

    cuda = ns.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    report = {"machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                          "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__},
              "runs": ns.runs, "bert": [], "text": [], "concurrent": {}}
    try:
        report["machine"]["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                        if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model_dir, bert_root = build(Path(tmp))
        voice = voxserve.load_voice(f"sbv2:{model_dir}", device=ns.device, bert_dir=bert_root)
        report["load_s"] = round(time.perf_counter() - t0, 1)
        bert = voice.berts["JP"]
        texts = [d["text"] for d in fx.frontend()["jp"] if 6 <= len(d["text"]) <= 40]
        det = SynthesisOptions(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)

        def inputs(n):
            return [u.component_input for t in texts[:n] for u in voice.units(t, det)][:n]

        for n in map(int, ns.sizes.split(",")):
            xs = inputs(n)
            seq = lambda: [bert.run([x]) for x in xs]  # noqa: E731
            bat = lambda: bert.run(xs)  # noqa: E731
            seq(), bat()  # warm-up
            ts, tb = [], []
            for _ in range(ns.runs):  # interleaved
                ts.append(median_time(seq, 1, sync))
                tb.append(median_time(bat, 1, sync))
            row = {"sentences": n, "sequential_s": round(statistics.median(ts), 4),
                   "batched_s": round(statistics.median(tb), 4)}
            row["speedup"] = round(row["sequential_s"] / row["batched_s"], 2)
            if cuda:
                for name, fn in (("sequential", seq), ("batched", bat)):
                    torch.cuda.reset_peak_memory_stats()
                    fn()
                    row[f"{name}_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
            report["bert"].append(row)
            print(json.dumps(row), flush=True)

        for n in (2, 4, 8):
            sents = texts[:n]
            one_by_one = lambda: [voice.synthesize(s, det) for s in sents]  # noqa: E731
            whole = lambda: voice.synthesize("".join(sents), det)  # noqa: E731
            one_by_one(), whole()
            a, b = [], []
            for _ in range(ns.runs):
                a.append(median_time(one_by_one, 1, sync))
                b.append(median_time(whole, 1, sync))
            audio_s = voice.synthesize("".join(sents), det).duration
            row = {"sentences": n, "audio_s": round(audio_s, 2), "per_sentence_s": round(statistics.median(a), 3),
                   "batched_s": round(statistics.median(b), 3)}
            row["speedup"] = round(row["per_sentence_s"] / row["batched_s"], 2)
            row["rtf_batched"] = round(row["batched_s"] / audio_s, 3)
            report["text"].append(row)
            print(json.dumps(row), flush=True)

        reqs = ["".join(texts[4 * k: 4 * k + 4]) for k in range(4)]
        calls = []
        real_run = bert.run

        def counting(xs):
            calls.append(len(xs))
            return real_run(xs)

        bert.run = counting

        def serve(together: bool) -> float:
            with Engine({"v": voice}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=5))) as eng:
                t0 = time.perf_counter()
                if together:
                    sinks = [RecordingSink() for _ in reqs]
                    for r, s in zip(reqs, sinks):
                        eng.submit("v", r, det, s)
                    for s in sinks:
                        assert s.done.wait(600) and s.error is None
                else:
                    for r in reqs:
                        s = RecordingSink()
                        eng.submit("v", r, det, s)
                        assert s.done.wait(600) and s.error is None
                return time.perf_counter() - t0

        serve(True)
        tt, ta = [], []
        for _ in range(ns.runs):
            calls.clear()
            tt.append(serve(True))
            together_calls = list(calls)
            calls.clear()
            ta.append(serve(False))
            alone_calls = list(calls)
        bert.run = real_run
        c = {"requests": 4, "sentences_each": 4, "together_s": round(statistics.median(tt), 3),
             "one_after_another_s": round(statistics.median(ta), 3), "bert_calls_together": together_calls,
             "bert_calls_one_after_another": alone_calls}
        c["speedup"] = round(c["one_after_another_s"] / c["together_s"], 2)
        report["concurrent"] = c
        print(json.dumps(c), flush=True)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    if ns.out:
        Path(ns.out).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
