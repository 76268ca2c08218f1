"""A CosyVoice 2 suite for the bench harness (benchmarks/harness): the Triton recipe's table (streaming
first chunk and RTF at concurrency 1 / 2 / 4 / 8) and offline RTF at batch 16, voxserve side by
side with the reference runtime's own pipeline on the same random weights, in the same run.

    python benchmarks/bench.py --suites cosyvoice                          # CPU: the `small` model
    python benchmarks/bench.py --suites cosyvoice --device cuda --runs 3   # what scripts/gpu-check runs (`real`)
    python benchmarks/bench.py --suites cosyvoice --quick                  # the tests' tiny dims (harness check)
    python benchmarks/bench_cosyvoice.py --suites cosyvoice --json cv.json

No CosyVoice weights can be downloaded here, so the model folder is built once, in the official
layout and file formats, into the user cache (`voxserve/bench/cosyvoice2-<size>`): `real` has
CosyVoice2-0.5B's dims (Qwen2-0.5B: 24 layers, hidden 896; the flow's 6-block conformer and its
UNet estimator of 256 channels, 12 mid blocks; HiFT from 512 channels), `small` a CPU-sized
model, `tiny` the tests' dims. Every weight is seeded (tests/fixtures/cosyvoice2/weights.py),
except one: the language model's EOS logit is a constant (7, its decoder row zero) against
logits of about unit spread, so that EOS is about a tenth of the probability and a sentence ends
just past its minimum length (2 speech tokens per text token: with the fixtures' byte-level
tokenizer, about a speaker's pace) on both sides, instead of running to 20x its text as a random
model would.

Each request is one English sentence from the speaker saved in the folder (the fixtures'
prompt: 2.0 s). A round: for each concurrency N, N requests arrive at once (voxserve: through
one Engine, streaming; the reference: `CosyVoice2Model.tts(stream=True)`, one thread per client,
as its server does), then the offline batch (voxserve: the step runner with whole-sentence
token2wav; the reference: one `tts(stream=False)` after another: it has no batch > 1). The
reference runs in its own venv (scripts/cosyvoice-reference) as a child process answering one
command per line, so the two sides alternate round by round. Figures: medians over the timed
rounds (the warm-up discarded) of each round's per-request figures; ratios are reference /
voxserve (above 1: voxserve is faster).
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "cosyvoice2"
for _p in (FIX, ROOT / "tests" / "cosyvoice2"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


from harness import add_parser, cmd_bench  # noqa: E402
from harness.arms import default_threads  # noqa: E402
from harness.report import _need, fs, fx, table  # noqa: E402
from harness.suites import Suite, ratio, register_suite, stat  # noqa: E402
from voxserve.engine import Sink as EngineSink  # noqa: E402

CONCURRENCY = (1, 2, 4, 8)
OFFLINE_BATCH = 16
EOS_LOGIT = 7.0
TEXTS = [  # one sentence each, nothing the normaliser rewrites
    "Hello there, how are you today?",
    "The train to Boston leaves from platform nine.",
    "Please hold while I transfer your call.",
    "It was a bright cold day in April.",
    "She sells sea shells by the sea shore.",
    "Turn left at the next corner, then go straight.",
    "We will meet again tomorrow morning.",
    "The weather is lovely this afternoon.",
    "Could you say that one more time, please?",
    "A quick brown fox jumps over the lazy dog.",
    "Thank you for calling, have a nice day.",
    "The museum opens at nine and closes at five.",
    "My favourite colour has always been green.",
    "Let us take the long way home tonight.",
    "The kettle is boiling, shall I make tea?",
    "Every morning he walks his dog in the park.",
]
SIZES: dict[str, dict] = {
    "tiny": {"qwen": {}, "dims": {}},
    "small": {"qwen": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4,
                           num_key_value_heads=2),
              "dims": dict(llm_size=256, encoder_heads=8, encoder_linear_units=1024, encoder_blocks=3,
                           estimator_channels=128, estimator_head_dim=32, estimator_blocks=1,
                           estimator_mid_blocks=4, estimator_heads=4, hift_base_channels=128, f0_cond_channels=128)},
    "real": {"qwen": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768),
             "dims": dict(llm_size=896, encoder_heads=8, encoder_linear_units=2048, encoder_blocks=6,
                          estimator_channels=256, estimator_head_dim=64, estimator_blocks=4, estimator_mid_blocks=12,
                          estimator_heads=8, hift_base_channels=512, f0_cond_channels=512)},
}
SPEAKER = "spk"


# ---------------------------------------------------------------------------- the model folder
def _modules(folder: Path, qcfg):
    """Our language model (its Qwen2 backbone uninitialised), flow and HiFT, built from the
    folder's config: their state dicts give the shapes the folder's weights must have."""
    import transformers
    from transformers.initialization import no_init_weights

    from voxserve.families.cosyvoice2.config import load_config
    from voxserve.families.cosyvoice2.flow import CosyFlow, FlowDims
    from voxserve.families.cosyvoice2.hift import HiFT, HiftDims
    from voxserve.families.cosyvoice2.llm import CosyLM, CosyLMDims

    config = load_config(folder / "cosyvoice2.yaml")
    with no_init_weights():
        lm = CosyLM(CosyLMDims(hidden=qcfg.hidden_size), transformers.Qwen2ForCausalLM(qcfg))
    return lm, CosyFlow(FlowDims.from_config(config.flow)), HiFT(HiftDims.from_config(config.hift))


def _shapes(lm, flow, hift) -> dict[str, dict[str, list[int]]]:
    """Every tensor of llm.pt / flow.pt / hift.pt, by upstream's key names (HiFT's
    convolutions in weight-norm form, as upstream saves them)."""
    from cv2_fixtures import meta

    normed = {k.removesuffix("parametrizations.weight.original0") for k in meta()["shapes"]["hift"]
              if k.endswith("parametrizations.weight.original0")}
    hs: dict[str, list[int]] = {}
    for k, v in hift.state_dict().items():
        base = k.removesuffix("weight")
        if k.endswith("weight") and base in normed:
            hs[base + "parametrizations.weight.original0"] = [v.shape[0]] + [1] * (v.dim() - 1)
            hs[base + "parametrizations.weight.original1"] = list(v.shape)
        elif v.is_floating_point():
            hs[k] = list(v.shape)
    return {"llm": {k: list(v.shape) for k, v in lm.state_dict().items() if v.is_floating_point()},
            "flow": {k: list(v.shape) for k, v in flow.state_dict().items() if v.is_floating_point()},
            "hift": hs}


def build_folder(size: str, folder: Path) -> None:
    import tiny
    import torch
    import transformers
    import weights
    from cv2_fixtures import _script, prompt_entry

    folder.mkdir(parents=True, exist_ok=True)
    blank = folder / "CosyVoice-BlankEN"
    _script().write_tokenizer(blank)
    qcfg = transformers.Qwen2Config(**{**tiny.QWEN, "vocab_size": 300, **SIZES[size]["qwen"]})
    # CosyVoice2-0.5B's encoder is chunk-masked too while streaming (25 tokens)
    yaml = tiny.yaml_text(encoder_chunk=0 if size == "tiny" else 25, **SIZES[size]["dims"])
    (folder / "cosyvoice2.yaml").write_text(yaml, encoding="utf-8")
    lm, flow, hift = _modules(folder, qcfg)
    shapes = _shapes(lm, flow, hift)
    parts = {}
    for k, part in enumerate(("llm", "flow", "hift")):
        parts[part] = {key: torch.from_numpy(v) for key, v in weights.make_state_dict(tiny.SEED + 100 + k,
                                                                                     shapes[part]).items()}
    llm = parts["llm"]
    llm["llm.model.lm_head.weight"] = llm["llm.model.model.embed_tokens.weight"]  # tied, as Qwen2-0.5B
    eos = llm["speech_embedding.weight"].shape[0] - 3
    llm["llm_decoder.weight"][eos] = 0.0
    llm["llm_decoder.bias"][eos] = EOS_LOGIT
    for part, sd in parts.items():
        torch.save(sd, folder / f"{part}.pt")
    # the backbone as the folder ships it (the reference's Qwen2Encoder loads it before llm.pt)
    qwen = lm.llm.model
    qwen.load_state_dict({k.removeprefix("llm.model."): v for k, v in llm.items() if k.startswith("llm.model.")})
    qwen.save_pretrained(blank, safe_serialization=True)
    torch.save({SPEAKER: prompt_entry()}, folder / "spk2info.pt")


_BUILD_LOCK = threading.Lock()


def model_folder(size: str) -> Path:
    import platformdirs

    folder = Path(platformdirs.user_cache_dir("voxserve")) / "bench" / f"cosyvoice2-{size}-v2"
    stamp = folder / ".complete"
    with _BUILD_LOCK:
        if not stamp.is_file():
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
            build_folder(size, folder)
            stamp.write_text(json.dumps({"size": size, "eos_logit": EOS_LOGIT}))
    return folder


# ---------------------------------------------------------------------------- voxserve's side
class _Sink(EngineSink):
    def __init__(self, t0: float):
        self.t0, self.first, self.samples, self.error = t0, None, 0, None
        self.done = threading.Event()

    def on_audio(self, index, samples, text, partial=False):
        if self.first is None and len(samples):
            self.first = time.perf_counter() - self.t0
        self.samples += len(samples)

    def on_done(self, n):
        self.end = time.perf_counter() - self.t0
        self.done.set()

    def on_error(self, e):
        self.error = e
        self.done.set()


class VoxserveSide:
    def __init__(self, folder: Path, device: str, threads: int | None):
        import voxserve
        from voxserve.engine import Engine, EngineConfig
        from voxserve.families.cosyvoice2 import CosyRuntimeOptions

        t0 = time.perf_counter()
        self.voice = voxserve.load_voice(f"cosyvoice2:{folder}", device=device,
                                         runtime=CosyRuntimeOptions(threads=threads))
        self.ready_s = time.perf_counter() - t0
        self.engine = Engine({"cv": self.voice}, EngineConfig(max_queue_wait_s=3600)).start()
        self.rate = self.voice.sample_rate

    def token_ids(self) -> list[list[int]]:
        return [self.voice.model.tokenize(t) for t in TEXTS]

    def stream(self, n: int, round_: int) -> dict:
        from voxserve import SynthesisOptions

        t0 = time.perf_counter()
        sinks = []
        for k in range(n):
            sinks.append(_Sink(t0))
            self.engine.submit("cv", TEXTS[(round_ * n + k) % len(TEXTS)],
                               SynthesisOptions(seed=1000 * round_ + k), sinks[-1], streaming=True)
        for s in sinks:
            if not s.done.wait(3600) or s.error is not None:
                raise RuntimeError(f"a voxserve request failed: {s.error}")
        wall = time.perf_counter() - t0
        return _stream_row([(s.first, s.end, s.samples / self.rate) for s in sinks], wall)

    def offline(self, b: int, round_: int) -> dict:
        from voxserve.runtime.cpu import in_passing_thread

        # not on this thread: it would keep an OpenMP team the engine's worker pays for
        return in_passing_thread(self._offline, b, round_)

    def _offline(self, b: int, round_: int) -> dict:
        from voxserve import SynthesisOptions
        from voxserve.families.cosyvoice2.runner import CosyStepRunner
        from voxserve.voice import run_steps

        units = [u for k in range(b) for u in self.voice.units(TEXTS[k % len(TEXTS)],
                                                               SynthesisOptions(seed=1000 * round_ + k))]
        runner = CosyStepRunner(self.voice.model, capacity=b, streaming=False)
        t0 = time.perf_counter()
        audio = sum(len(a) for a in run_steps(runner, units)) / self.rate
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "audio_s": audio, "rtf": wall / audio}

    def close(self) -> None:
        self.engine.shutdown(30)


def _stream_row(per: list[tuple[float, float, float]], wall: float) -> dict:
    """per: (first chunk s, end s, audio s) of each request of one round."""
    return {"first_s": [p[0] for p in per], "rtf": [p[1] / p[2] for p in per],
            "audio_s": sum(p[2] for p in per), "wall_s": wall}


# ---------------------------------------------------------------------------- the reference's side
class ReferenceSide:
    """benchmarks/cosyvoice_reference.py in the reference venv, one JSON command per line."""

    def __init__(self, folder: Path, device: str, threads: int | None, token_ids: list[list[int]]):
        py = subprocess.run([str(ROOT / "scripts" / "cosyvoice-reference"), "--python"], check=True,
                            capture_output=True, text=True).stdout.strip()
        import cv2_fixtures as fx

        p = fx.prompt_entry()
        spec = {"model_dir": str(folder), "device": device, "threads": threads, "texts": token_ids,
                "prompt": {"text_ids": p["prompt_text"][0].tolist(),
                           "speech_tokens": p["flow_prompt_speech_token"][0].tolist(),
                           "speech_feat": p["prompt_speech_feat"][0].tolist(),
                           "embedding": p["flow_embedding"][0].tolist()}}
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        import tempfile

        # its warnings and logs go to a file, named in the error if it fails
        self.log = Path(tempfile.mkstemp(prefix="cosyvoice-reference-", suffix=".log")[1])
        self.proc = subprocess.Popen([py, str(ROOT / "benchmarks" / "cosyvoice_reference.py")], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.open("w"),
                                     text=True, bufsize=1)
        self.info = self._ask(spec)

    def _ask(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reference exited ({self.proc.wait()}; its log: {self.log})")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"the reference failed: {out['error']} (its log: {self.log})")
        return out

    def stream(self, n: int, round_: int) -> dict:
        return self._ask({"op": "stream", "n": n, "round": round_})

    def offline(self, b: int, round_: int) -> dict:
        return self._ask({"op": "offline", "n": b, "round": round_})

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(60)
        except Exception:
            self.proc.kill()
        else:
            self.log.unlink(missing_ok=True)


def reference_unavailable() -> str | None:
    venv = Path(os.environ.get("CV2_REF_VENV") or ROOT / ".ref" / "cosyvoice2" / "venv")  # the script's own
    if not (venv / ".cosyvoice-reference-stamp").is_file():
        return "the reference venv is absent: run scripts/cosyvoice-reference (a few minutes, needs a package index)"
    return None


# ---------------------------------------------------------------------------- the suite
def model_size(settings, device: str) -> str:
    if settings.quick:
        return "tiny"
    return "real" if device == "cuda" else "small"


def summarise(rounds: list[dict]) -> dict:
    """Timed rounds of one side and row -> medians (and per-request percentiles)."""
    if "first_s" in rounds[0]:
        firsts = sorted(x for r in rounds for x in r["first_s"])
        return {"first_chunk_s": stat([statistics.median(r["first_s"]) for r in rounds]),
                "first_chunk_p95_s": firsts[min(len(firsts) - 1, int(0.95 * len(firsts)))],
                "first_chunk_max_s": firsts[-1],
                "rtf": stat([statistics.median(r["rtf"]) for r in rounds]),
                "audio_s_per_s": stat([r["audio_s"] / r["wall_s"] for r in rounds]),
                "audio_s": statistics.median(r["audio_s"] for r in rounds)}
    return {"rtf": stat([r["rtf"] for r in rounds]), "wall_s": stat([r["wall_s"] for r in rounds]),
            "audio_s": statistics.median(r["audio_s"] for r in rounds)}


@register_suite
class CosyVoiceSuite(Suite):
    """Runs its two sides itself: the reference is a process in another venv, not an arm of
    the harness; the suite alternates the sides round by round as the harness does its arms."""

    name = "cosyvoice"
    title = "CosyVoice 2: streaming first chunk and RTF under concurrency, offline batch, vs the reference"

    def tasks(self, ctx, spec):
        return []

    def build(self, ctx, res, refs):
        settings, device = ctx.settings, ctx.device
        size = model_size(settings, device)
        threads = None if device == "cuda" else default_threads()
        conc = [n for n in CONCURRENCY if not settings.quick or n <= 2]
        batch = 4 if settings.quick else OFFLINE_BATCH
        section: dict[str, Any] = {"title": self.title, "model": size, "device": device, "threads": threads,
                                   "concurrency": conc, "offline_batch": batch, "texts": len(TEXTS),
                                   "rounds": {"warmup": settings.warmup, "timed": settings.runs}}
        t0 = time.perf_counter()
        folder = model_folder(size)
        section["build_s"] = round(time.perf_counter() - t0, 1)
        ours = VoxserveSide(folder, device, threads)
        sides: dict[str, Any] = {"voxserve": ours}
        why = reference_unavailable()
        if why is None:
            try:
                sides["reference"] = ReferenceSide(folder, device, threads, ours.token_ids())
            except Exception as e:  # the bench still reports voxserve's side
                why = f"the reference did not start: {e}"
        section["reference"] = {"status": "ok" if why is None else "skipped", "reason": why}
        section["ready_s"] = {"voxserve": round(ours.ready_s, 2)} | (
            {"reference": sides["reference"].info.get("ready_s")} if "reference" in sides else {})
        work = [("stream", n) for n in conc] + [("offline", batch)]
        got: dict[tuple[str, str, int], list[dict]] = {}
        rounds = settings.warmup + settings.runs
        try:
            for r in range(rounds):
                if r > settings.warmup and settings.max_minutes and time.perf_counter() - t0 > 60 * settings.max_minutes:
                    section["note"] = f"--max-minutes reached: {r - settings.warmup} timed rounds of {settings.runs}"
                    break
                for mode, n in work:
                    for name, side in sides.items():
                        out = getattr(side, mode)(n, r)
                        if r >= settings.warmup:
                            got.setdefault((name, mode, n), []).append(out)
        finally:
            for side in sides.values():
                side.close()
        rows = []
        for mode, n in work:
            row: dict[str, Any] = {"mode": mode, ("concurrency" if mode == "stream" else "batch"): n}
            for name in sides:
                row[name] = summarise(got[(name, mode, n)])
            if "reference" in row:
                ref, us = row["reference"], row["voxserve"]
                row["rtf_ratio"] = ratio(ref["rtf"]["median"], us["rtf"]["median"])
                if mode == "stream":
                    row["first_chunk_ratio"] = ratio(ref["first_chunk_s"]["median"], us["first_chunk_s"]["median"])
            rows.append(row)
        section["rows"] = rows
        section["measured"] = bool(rows)
        section["elapsed_s"] = round(time.perf_counter() - t0, 1)
        return section

    def markdown(self, result: dict, section: dict) -> str:
        size = section["model"]
        ref_ok = section["reference"]["status"] == "ok"
        out = [f"### {section['title']}", "",
               f"Model `{size}` ({'CosyVoice2-0.5B dims' if size == 'real' else 'a CPU-sized model' if size == 'small' else 'the tests dims: harness check only'}), "
               f"random weights, device {section['device']}, threads {section['threads']}. "
               "Each request one English sentence; N requests arrive at once. First chunk and RTF: the "
               "median over timed rounds of each round's median request; audio s/s: all audio of a "
               "round over its wall time. Ratios: reference / voxserve."]
        if not ref_ok:
            out += ["", f"Reference not run: {section['reference']['reason']}"]
        if section.get("note"):
            out += ["", f"Note: {section['note']}"]
        header = ["Workload", "voxserve first chunk (s)", "voxserve RTF", "voxserve audio s/s"]
        if ref_ok:
            header += ["reference first chunk (s)", "reference RTF", "reference audio s/s",
                       "first chunk ratio", "RTF ratio"]
        body = []
        for row in section["rows"]:
            line = [f"stream x{row['concurrency']}" if row["mode"] == "stream" else f"offline batch {row['batch']}"]
            for name in ("voxserve", "reference") if ref_ok else ("voxserve",):
                s = row[name]
                if row["mode"] == "stream":
                    line += [f"{fs(s['first_chunk_s']['median'])} (p95 {fs(s['first_chunk_p95_s'])})",
                             fs(s["rtf"]["median"]), fs(s["audio_s_per_s"]["median"])]
                else:
                    line += ["n/a", fs(s["rtf"]["median"]), fs(s["audio_s"] / s["wall_s"]["median"])]
            if ref_ok:
                line += [fx(row.get("first_chunk_ratio")), fx(row.get("rtf_ratio"))]
            body.append(line)
        out += ["", table(header, body, "l" + "r" * (len(header) - 1))]
        return "\n".join(out)

    def check(self, result: dict, section: dict, problems: list[str]) -> None:
        w0 = "suites.cosyvoice"
        rows = _need(section, "rows", list, w0, problems) or []
        if not rows:
            problems.append(f"{w0}.rows: empty")
        for i, row in enumerate(rows):
            for name in ("voxserve", "reference"):
                if name not in row:
                    continue
                rtf = (row[name].get("rtf") or {}).get("median")
                if not isinstance(rtf, (int, float)) or rtf <= 0:
                    problems.append(f"{w0}.rows[{i}].{name}.rtf.median: not a positive number")
                if row["mode"] == "stream":
                    first = (row[name].get("first_chunk_s") or {}).get("median")
                    if not isinstance(first, (int, float)) or first <= 0:
                        problems.append(f"{w0}.rows[{i}].{name}.first_chunk_s.median: not a positive number")


# ---------------------------------------------------------------------------- the command
def main(argv: list[str] | None = None) -> int:
    """The harness's flags (a leading "bench" is optional)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(prog="bench_cosyvoice.py")
    add_parser(top.add_subparsers(dest="command"))
    return cmd_bench(top.parse_args(argv if argv[:1] == ["bench"] else ["bench", *argv]))


if __name__ == "__main__":
    sys.exit(main())
