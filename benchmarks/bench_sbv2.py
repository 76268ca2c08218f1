"""A Style-Bert-VITS2 suite for the bench harness (benchmarks/harness): HayaKoe's BERT table, whole-text
synthesis and BERT batched across concurrent requests, on random weights of the real sizes.

    python benchmarks/bench.py --suites sbv2                         # from a source checkout (CPU or CUDA)
    python benchmarks/bench.py --suites sbv2 --device cuda --runs 3  # what scripts/gpu-check runs
    python benchmarks/bench_sbv2.py --suites sbv2 --json sbv2.json

The models are built once, through the same loader a user's files go through, into the user
cache (`voxserve/bench/sbv2-<size>`): `real` is a JP-Extra synthesizer with SBV2's dims (hidden
192, 6 layers, HiFi-GAN from 512 channels, hop 512, 44.1 kHz) and a DeBERTa-v2 of the Japanese
BERT's size (24 layers, hidden 1024, FFN 4096, 16 heads) with the test fixtures' character
tokenizer; `tiny` (--quick) is the test fixtures' tiny pair, for the harness's own test. The
texts are the fixtures' Japanese sentences (the pool's English sentences only set how many).

Rows (each the harness's median of timed, interleaved rounds after its warm-up; peak memory from
its probes: CPU the peak RSS of a child process that loads only that row's model, CUDA
`max_memory_allocated`):
- BERT, sequential (one forward per sentence, as SBV2 runs it) vs one padded batch, for the
  --sizes of 2 and more: latency, speed-up, peak memory;
- whole text of N sentences (--sizes 2 to 8): sentence by sentence (BERT and synthesizer per
  sentence) vs voxserve's `synthesize` (one BERT batch);
- 4 concurrent requests of 4 sentences through the engine (one BERT stage across them) vs the
  same requests one after another.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "tests" / "sbv2", ROOT / "tests"):  # the fixtures' builders and tokenizer
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402

from harness import add_parser, cmd_bench  # noqa: E402
from harness.arms import ArmSpec, VoxserveArm, default_threads, register_engine  # noqa: E402
from harness.measure import Task  # noqa: E402
from harness.report import _need, fmb, fs, fx, table  # noqa: E402
from harness.suites import Suite, ratio, register_suite, timing  # noqa: E402

ENGINE = "sbv2"
REQUESTS, SENTENCES_EACH = 4, 4
REAL_BERT = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                 max_position_embeddings=512, relative_attention=True, position_buckets=256,
                 norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                 layer_norm_eps=1e-7, max_relative_positions=-1, position_biased_input=False, type_vocab_size=0)
"""ku-nlp/deberta-v2-large-japanese-char-wwm's shape (its vocabulary is the fixtures' tokenizer's)."""
MODES = {"bert": "BERT", "text": "whole text", "engine": "4 concurrent requests"}


# ---------------------------------------------------------------------------- models
def _build(size: str, root: Path) -> None:
    import sbv2_fixtures as fx

    bert_root = root / "bert"
    fx.write_bert_root(bert_root, names=(fx.JP_BERT,))
    if size == "tiny":
        fx.write_model_folder("jp_extra", root / "model")
        return
    import torch
    import transformers
    from test_sbv2_real_size import write_real_size_folder

    d = bert_root / fx.JP_BERT  # keep the tokenizer files, replace the model by a real-size one
    vocab = transformers.AutoConfig.from_pretrained(d).vocab_size
    torch.manual_seed(0)
    model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(vocab_size=vocab, **REAL_BERT))
    for f in d.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(d)
    write_real_size_folder(root / "model")


_BUILD_LOCK = threading.Lock()


def model_folders(size: str) -> tuple[Path, Path]:
    """(model folder, BERT root) of the `size` models, built on first use (a stamp file marks a
    complete build, so an interrupted one is redone)."""
    import platformdirs

    root = Path(platformdirs.user_cache_dir("voxserve")) / "bench" / f"sbv2-{size}-v1"
    with _BUILD_LOCK:
        if not (root / "complete").exists():
            import shutil

            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            _build(size, root)
            (root / "complete").write_text("ok\n", encoding="utf-8")
    return root / "model", root / "bert"


def japanese_texts() -> list[str]:
    import sbv2_fixtures as fx

    return [d["text"] for d in fx.frontend()["jp"] if 6 <= len(d["text"]) <= 40]


# ---------------------------------------------------------------------------- the engine
class Sbv2Arm(VoxserveArm):
    """An SBV2 voice; `runtime["mode"]` picks what run_batch / run_sequential time:
    bert: one padded BERT forward / one forward per sentence;
    text: `synthesize` of the sentences as one text / one `synthesize` per sentence;
    engine: 4 requests of 4 sentences submitted together / one after another (an engine kept
    running between rounds)."""

    @classmethod
    def unavailable(cls, spec: ArmSpec) -> str | None:
        try:
            import pyopenjtalk  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            return f"SBV2 needs its extra (pip install 'voxserve[sbv2]'): {e}"
        if spec.runtime.get("mode") not in MODES:
            return f"unknown mode {spec.runtime.get('mode')!r}"
        return super().unavailable(dataclasses.replace(spec, runtime={}))

    def open(self) -> None:
        import torch

        import voxserve

        default_threads()
        self.activate()
        self.mode, size = self.spec.runtime["mode"], self.spec.runtime["size"]
        model_dir, bert_root = model_folders(size)
        before = torch.cuda.memory_allocated() if self.is_cuda else None
        self.voice = voxserve.load_voice(f"sbv2:{model_dir}", device=self.spec.device, bert_dir=bert_root)
        self.bert = self.voice.berts["JP"]
        self.options = self.voice.synthesis_options.deterministic()  # noise off: the same work every round
        self.sample_rate = self.voice.sample_rate
        self.device = torch.device(self.spec.device)
        # one sentence each, so that N texts are N sentences (and a request of 4 is 4 units)
        self.texts = [t for t in japanese_texts() if sum(1 for _ in self.voice.units(t, self.options)) == 1]
        self.engine = None
        if self.mode == "engine":
            from voxserve.engine import Engine, EngineConfig, SchedulerConfig

            self.engine = Engine({"v": self.voice}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=5)))
            self.engine.start()
        self.info = {"voice": f"sbv2-{size}", "size": size, "mode": self.mode,
                     "bert_parameters_m": round(sum(p.numel() for p in self.bert.model.parameters()) / 1e6, 1)}
        if before is not None:
            self.info["cuda_allocated_before_load_mb"] = round(before / 2**20, 1)
        self.activate()

    def close(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.shutdown(30)
            self.engine = None
        self.bert = None
        super().close()

    def _sentences(self, n: int) -> list[str]:
        if n > len(self.texts):
            raise ValueError(f"the SBV2 suite has {len(self.texts)} Japanese sentences; {n} were asked for")
        return self.texts[:n]

    def prepare(self, sentences, texts):
        sents = self._sentences(len(sentences))
        if self.mode == "bert":
            return [u.component_input for s in sents for u in self.voice.units(s, self.options)]
        if self.mode == "text":
            return sents
        return ["".join(sents[k:k + SENTENCES_EACH]) for k in range(0, len(sents), SENTENCES_EACH)]

    def reseed(self, prepared, seed):
        return prepared  # noise 0: every round does the same work

    def run_batch(self, prepared):
        if self.mode == "bert":
            self.bert.run(prepared)
            return [np.zeros(0, np.float32)]  # no audio: its rows report latency only
        if self.mode == "text":
            return [self.voice.synthesize("".join(prepared), self.options).samples]
        return self._serve(prepared, together=True)

    def run_sequential(self, prepared):
        if self.mode == "bert":
            for x in prepared:
                self.bert.run([x])
            return [np.zeros(0, np.float32)]
        if self.mode == "text":
            return [self.voice.synthesize(s, self.options).samples for s in prepared]
        return self._serve(prepared, together=False)

    def _serve(self, requests: list[str], together: bool) -> list[np.ndarray]:
        from serve_fakes import RecordingSink

        sinks = []
        for r in requests:
            sink = RecordingSink()
            self.engine.submit("v", r, self.options, sink)
            sinks.append(sink)
            if not together and not (sink.done.wait(600) and sink.error is None):
                raise RuntimeError(f"request failed: {sink.error}")
        for sink in sinks:
            if not (sink.done.wait(600) and sink.error is None):
                raise RuntimeError(f"request failed: {sink.error}")
        return [s.joined() for s in sinks]

    def stream(self, text):
        raise NotImplementedError("the SBV2 suite has no stream task")


register_engine(ENGINE, Sbv2Arm)


# ---------------------------------------------------------------------------- the suite
def model_size(settings) -> str:
    return "tiny" if settings.quick else "real"


def bert_sizes(settings) -> list[int]:
    return [n for n in settings.sizes if n >= 2]


def text_sizes(settings) -> list[int]:
    return [n for n in settings.sizes if 2 <= n <= 8]


@register_suite
class Sbv2Suite(Suite):
    name = "sbv2"
    title = "Style-Bert-VITS2: BERT batched across sentences and requests"

    def pool_size(self, settings) -> int:
        return max(bert_sizes(settings) + [REQUESTS * SENTENCES_EACH])

    def extra_arms(self, ctx):
        size = model_size(ctx.settings)
        return [ArmSpec(f"sbv2-{mode}", f"SBV2 {label}", engine=ENGINE, device=ctx.device,
                        runtime={"mode": mode, "size": size}, suite=self.name)
                for mode, label in MODES.items()]

    def _keys(self, settings, mode: str) -> list[tuple[int, str, str]]:
        """(sentences, sequential key, batched key) of an arm's rows."""
        if mode == "engine":
            n = REQUESTS * SENTENCES_EACH
            return [(n, f"sbv2/engine/{n}/one_after_another", f"sbv2/engine/{n}/together")]
        sizes = bert_sizes(settings) if mode == "bert" else text_sizes(settings)
        return [(n, f"sbv2/{mode}/{n}/sequential", f"sbv2/{mode}/{n}/batched") for n in sizes]

    def tasks(self, ctx, spec):
        if spec.engine != ENGINE:
            return []
        out = []
        for n, seq, bat in self._keys(ctx.settings, spec.runtime["mode"]):
            idx = tuple(range(n))
            out += [Task(self.name, seq, "sequential", idx, memory=True), Task(self.name, bat, "batch", idx, memory=True)]
        return out

    def build(self, ctx, res, refs):
        tables: dict[str, list[dict]] = {}
        for spec in ctx.specs:
            if spec.engine != ENGINE:
                continue
            mode = spec.runtime["mode"]
            status, reason = res.status.get(spec.name, ("skipped", "not run"))
            rows = tables.setdefault(mode, [])
            for n, seq_key, bat_key in self._keys(ctx.settings, mode):
                row: dict[str, Any] = {"arm": spec.name, "sentences": n, "status": status}
                seq, bat = res.get(spec.name, seq_key), res.get(spec.name, bat_key)
                if not seq or not bat:
                    row["reason"] = reason or "no samples"
                    rows.append(row)
                    continue
                row["sequential"] = {**timing(seq), "memory": res.mem(spec.name, seq_key)}
                row["batched"] = {**timing(bat), "memory": res.mem(spec.name, bat_key)}
                row["speedup"] = ratio(row["sequential"]["latency_s"]["median"], row["batched"]["latency_s"]["median"])
                rows.append(row)
        return {"title": self.title, "model": model_size(ctx.settings), "tables": tables,
                "requests": REQUESTS, "sentences_each": SENTENCES_EACH}

    def markdown(self, result: dict, section: dict) -> str:
        size = section["model"]
        out = [f"### {section['title']}", "",
               ("Random weights of the real sizes (a 24-layer, 1024-d DeBERTa-v2; the JP-Extra synthesizer's dims)"
                if size == "real" else "The test fixtures' tiny models (harness check only, not SBV2's speed)")
               + ", the fixtures' Japanese sentences, noise 0. Latency: median (fastest) of the timed rounds; "
                 "peak memory: CPU, the peak RSS of a child process that loads only that row's model and runs "
                 "only that workload; CUDA, `max_memory_allocated`."]
        names = {"bert": ("Sentences", "BERT sequential (s)", "BERT batched (s)"),
                 "text": ("Sentences", "one by one (s)", "`synthesize` (s)"),
                 "engine": ("Sentences", "one request after another (s)", "4 requests together (s)")}
        for mode, rows in section["tables"].items():
            h = names.get(mode, ("Sentences", "sequential (s)", "batched (s)"))
            header = [h[0], h[1], h[2], "Speed-up", "Peak memory seq. (MB)", "Peak memory batched (MB)"]
            if mode != "bert":
                header.append("RTF batched")
            body = []
            for r in rows:
                if "batched" not in r:
                    body.append([r["sentences"], f"*{r.get('reason') or r['status']}*"] + ["n/a"] * (len(header) - 2))
                    continue
                s, b = r["sequential"], r["batched"]
                line = [r["sentences"], f"{fs(s['latency_s']['median'])} ({fs(s['latency_s']['min'])})",
                        f"{fs(b['latency_s']['median'])} ({fs(b['latency_s']['min'])})", fx(r["speedup"]),
                        fmb(s.get("memory")), fmb(b.get("memory"))]
                if mode != "bert":
                    line.append(fs(b["rtf"]))
                body.append(line)
            out += ["", f"**{MODES.get(mode, mode)}**", "", table(header, body, "r" * len(header))]
        return "\n".join(out)

    def check(self, result: dict, section: dict, problems: list[str]) -> None:
        w0 = "suites.sbv2"
        tables = _need(section, "tables", dict, w0, problems) or {}
        for mode, rows in tables.items():
            for i, row in enumerate(rows if isinstance(rows, list) else []):
                w = f"{w0}.tables.{mode}[{i}]"
                if "batched" not in row:
                    if row.get("status") == "ok":
                        problems.append(f"{w}: status ok without figures")
                    continue
                for part in ("sequential", "batched"):
                    lat = (row.get(part) or {}).get("latency_s") or {}
                    if not isinstance(lat.get("median"), (int, float)) or lat["median"] <= 0:
                        problems.append(f"{w}.{part}.latency_s.median: not a positive number")
                sp = row.get("speedup")
                if not isinstance(sp, (int, float)) or sp <= 0:
                    problems.append(f"{w}.speedup: not a positive number")


# ---------------------------------------------------------------------------- the command
def main(argv: list[str] | None = None) -> int:
    """The harness's flags (a leading "bench" is optional)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(prog="bench_sbv2.py")
    add_parser(top.add_subparsers(dest="command"))
    return cmd_bench(top.parse_args(argv if argv[:1] == ["bench"] else ["bench", *argv]))


if __name__ == "__main__":
    import bench_sbv2  # registered under its module name, which the memory probe's child imports

    sys.exit(bench_sbv2.main())
