"""A Bark suite for the bench harness (benchmarks/harness), over random-weight models (bark_random.py):
a developer's A/B of Bark's configurations, so it lives here, not in the product.

    python benchmarks/bench_bark.py --suites bark                          # Bark alone
    python benchmarks/bench_bark.py --suites batching,configs,stream,bark  # next to the VITS suites
    python benchmarks/bench_bark.py --suites bark --device cuda --bark-size small --bark-tokens 256

It takes every flag of benchmarks/bench.py, plus --bark-size, --bark-tokens and --bark-runs.

Configurations (one row each, at every --batches size): base = fp32 + transformers' eager
attention (the reference path), SDPA, FP16, SDPA + FP16, CPU offload + FP16 (SDPA). The FP16 and
offload rows need CUDA; on the CPU the base and SDPA rows run. Each is voxserve's Bark voice
(`Voice.run_units`, one batch) over a random-weight model built in memory with the layer sizes
of suno/bark-small (bark_random.py): speed and memory depend on the sizes, not on the
weights, and random weights never pick EOS, so every sentence generates exactly --bark-tokens
semantic tokens (1.5 coarse frames each, 320 samples a frame at 24 kHz): a fixed, known amount
of work per sentence whatever its text.

The harness does the measuring: its clocks (device synchronised around every timed call), its
warm-up and medians, its memory probes (CUDA: `torch.cuda.max_memory_allocated` after
`reset_peak_memory_stats`, one configuration loaded at a time; CPU: the peak RSS of a child
process that loads only that configuration), its --max-minutes budget, its JSON checks. Every
figure is also given as a ratio to the base row at the same batch size (and, for throughput, to
the same configuration at batch 1).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from typing import Any

from harness import BenchSettings, add_parser, cmd_bench
from harness.arms import OK, ArmSpec, VoxserveArm, _torch_cuda, default_threads, register_engine
from harness.measure import Task
from harness.report import _need, check_batch_row, fmb, fs, fx, table
from harness.suites import ConfigsSuite, Suite, mem_ratio, ratio, register_suite, timing

ENGINE = "bark"
BASE = "bark-base"
SAMPLES_PER_FRAME = 320
COARSE_FRAMES_PER_TOKEN = 1.5
SAMPLE_RATE = 24_000


@dataclasses.dataclass(frozen=True)
class BarkConfig:
    """One row of the seed's table."""

    name: str
    label: str
    dtype: str | None
    attention: str
    offload: bool = False
    cuda_only: bool = False


CONFIGS: tuple[BarkConfig, ...] = (
    BarkConfig(BASE, "Bark base (fp32, eager attention)", None, "eager"),
    BarkConfig("bark-sdpa", "Bark SDPA (fp32)", None, "sdpa"),
    BarkConfig("bark-fp16", "Bark FP16 (eager attention)", "fp16", "eager", cuda_only=True),
    BarkConfig("bark-sdpa-fp16", "Bark SDPA + FP16", "fp16", "sdpa", cuda_only=True),
    BarkConfig(
        "bark-offload-fp16", "Bark CPU offload + FP16 (SDPA)", "fp16", "sdpa", offload=True, cuda_only=True
    ),
)
"""The seed's rows, in its order; base first (every ratio is to it)."""


def model_settings(settings, device: str) -> tuple[str, int]:
    """(size, semantic tokens a sentence) of the random-weight model for this device."""
    size = getattr(settings, "bark_size", None) or ("small" if device == "cuda" else "tiny")
    tokens = getattr(settings, "bark_tokens", None) or (256 if device == "cuda" else 16)
    return size, tokens


def bark_arms(settings, device: str) -> list[ArmSpec]:
    """The table's rows for `device` ('cpu': base and SDPA), as arms of engine "bark"."""
    size, tokens = model_settings(settings, device)
    return [
        ArmSpec(
            c.name,
            c.label,
            engine=ENGINE,
            device=device,
            dtype=c.dtype,
            runtime={"attention": c.attention, "offload": c.offload, "size": size, "tokens": tokens},
            suite="bark",
            runs=getattr(settings, "bark_runs", None),
        )
        for c in CONFIGS
        if device == "cuda" or not c.cuda_only
    ]


# ---------------------------------------------------------------------------- the engine
MODEL_KEYS = ("size", "tokens")
"""ArmSpec.runtime keys that choose the model; the others are BarkRuntimeOptions fields."""

_BASE_MODELS: dict[tuple[str, int], Any] = {}


def _random_model(size: str, tokens: int, keep: bool):
    """A fresh random-weight (BarkModel, BarkProcessor), float32 on the CPU, the same weights
    for every configuration (seed 0). keep: build once and hand out copies (CUDA runs: five
    configurations of bark-small, one loaded at a time; the CPU copy kept is host memory,
    which the CUDA figures do not count)."""
    from bark_random import random_bark_model

    if not keep:
        return random_bark_model(size, max_semantic_tokens=tokens, seed=0)
    if (size, tokens) not in _BASE_MODELS:
        _BASE_MODELS[(size, tokens)] = random_bark_model(size, max_semantic_tokens=tokens, seed=0)
    model, processor = _BASE_MODELS[(size, tokens)]
    return copy.deepcopy(model), processor


class BarkArm(VoxserveArm):
    """voxserve's Bark voice over a random-weight model. Clocks, memory, reseeding and the
    batch / sequential calls are VoxserveArm's (`Voice.run_units`)."""

    @classmethod
    def unavailable(cls, spec: ArmSpec) -> str | None:
        try:
            import transformers  # noqa: F401
        except ImportError as e:
            return f"Bark needs transformers (pip install 'voxserve[bark]'): {e}"
        from voxserve.families.bark.voice import BarkRuntimeOptions

        options = {f.name for f in dataclasses.fields(BarkRuntimeOptions)}
        unknown = sorted(set(spec.runtime) - options - set(MODEL_KEYS))
        if unknown:
            return "not available in this build: BarkRuntimeOptions has no field " + ", ".join(
                map(repr, unknown)
            )
        if spec.device == "cuda" and not _torch_cuda():
            return "no CUDA device (torch.cuda.is_available() is False)"
        if spec.device != "cuda" and (spec.dtype not in (None, "fp32") or spec.runtime.get("offload")):
            return "fp16 and CPU offload need a CUDA device"
        return None

    def open(self) -> None:
        import torch

        from voxserve.families.bark.voice import BarkRuntimeOptions, bark_voice_from_model
        from voxserve.options import SynthesisOptions

        default_threads()
        self.activate()
        rt = dict(self.spec.runtime)
        size, tokens = str(rt.pop("size", "small")), int(rt.pop("tokens", 256))
        runtime = BarkRuntimeOptions(**rt).validate()
        before = torch.cuda.memory_allocated() if self.is_cuda else None
        model, processor = _random_model(size, tokens, keep=self.is_cuda)
        params = sum(p.numel() for p in model.parameters())
        self.voice = bark_voice_from_model(
            model,
            processor,
            f"random-bark-{size}",
            device=self.spec.device,
            dtype=self.spec.dtype,
            runtime=runtime,
        )
        self.options = SynthesisOptions(seed=self.seed)
        self.sample_rate = self.voice.sample_rate
        self.device = torch.device(self.spec.device)
        runner = self.voice.runner
        self.info = {
            "voice": self.voice.name,
            "size": size,
            "semantic_tokens": tokens,
            "parameters_m": round(params / 1e6, 1),
            "dtype": str(runner.dtype).replace("torch.", ""),
            "runtime": dataclasses.asdict(runtime),
            "offload": bool(runner.offload),
        }
        if before is not None:
            self.info["cuda_allocated_before_load_mb"] = round(before / 2**20, 1)
        self.activate()

    def prepare(self, sentences, texts):
        """The pool sentences as the Bark voice's units (one each: a pool sentence is short
        enough for one generation; its text does not change the work, the token count does)."""
        return [next(iter(self.voice.units(s.text, self.options))) for s in sentences]


register_engine(ENGINE, BarkArm)


# ---------------------------------------------------------------------------- the suite
@register_suite
class BarkSuite(Suite):
    """The seed's Bark table: every configuration at every --batches size (one batch each)."""

    name = "bark"
    title = "Bark: attention, precision, offload, batching"

    def pool_size(self, settings) -> int:
        return max(settings.batches)

    def extra_arms(self, ctx):
        return bark_arms(ctx.settings, ctx.device)

    def key(self, batch: int) -> str:
        return f"{self.name}/{batch}"

    def tasks(self, ctx, spec):
        if spec.engine != ENGINE:
            return []
        workload = ConfigsSuite().workload  # the configs suite's sentences: batch 1 = the median one
        return [
            Task(self.name, self.key(b), "batch", workload(ctx, b), memory=True) for b in ctx.settings.batches
        ]

    def build(self, ctx, res, refs):
        size, tokens = model_settings(ctx.settings, ctx.device)
        from bark_random import BARK_SIZES

        specs = [s for s in ctx.specs if s.engine == ENGINE]
        base = BASE if any(s.name == BASE for s in specs) else None
        rows: list[dict[str, Any]] = []
        for spec in specs:
            status, reason = res.status.get(spec.name, ("skipped", "not run"))
            for b in ctx.settings.batches:
                row: dict[str, Any] = {"arm": spec.name, "label": spec.label, "batch": b, "status": status}
                samples = res.get(spec.name, self.key(b))
                if not samples:
                    row["reason"] = reason or "no samples"
                    rows.append(row)
                    continue
                row.update(timing(samples))
                row["sentences_per_s"] = b / row["latency_s"]["median"]
                row["memory"] = res.mem(spec.name, self.key(b))
                rows.append(row)
        measured = {(r["arm"], r["batch"]): r for r in rows if "latency_s" in r}
        for r in measured.values():
            ref = measured.get((base, r["batch"]))
            r["vs_base"] = (
                {
                    "latency_speedup": ratio(ref["latency_s"]["median"], r["latency_s"]["median"]),
                    "throughput_ratio": ratio(r["throughput"], ref["throughput"]),
                    "memory_ratio": mem_ratio(r["memory"], ref["memory"]),
                }
                if ref
                else None
            )
            one = measured.get((r["arm"], 1))
            r["throughput_vs_batch1"] = ratio(r["throughput"], one["throughput"]) if one else None
        frames = round(tokens * COARSE_FRAMES_PER_TOKEN)
        return {
            "title": self.title,
            "model": {
                "size": size,
                **BARK_SIZES[size],
                "semantic_tokens": tokens,
                "coarse_frames": frames,
                "audio_s_per_sentence": frames * SAMPLES_PER_FRAME / SAMPLE_RATE,
            },
            "base": base,
            "batches": list(ctx.settings.batches),
            "workloads": {str(b): list(ConfigsSuite().workload(ctx, b)) for b in ctx.settings.batches},
            "rows": rows,
        }

    def markdown(self, result: dict, section: dict) -> str:
        m = section["model"]
        kinds = {(r.get("memory") or {}).get("kind") for r in section["rows"]} - {None}
        mh = {frozenset({"cuda"}): "Peak GPU memory (MB)", frozenset({"rss"}): "Peak RSS (MB)"}.get(
            frozenset(kinds), "Peak memory (MB)"
        )
        sizes = (
            "suno/bark-small"
            if m["size"] == "small"
            else "suno/bark"
            if m["size"] == "large"
            else "a tiny Bark"
        )
        out = [
            f"### {section['title']}",
            "",
            f"voxserve's Bark voice (`Voice.run_units`, one batch) over random weights with the layer sizes of "
            f"{sizes} ({m['hidden_size']} hidden, {m['num_layers']} layers, {m['num_heads']} heads per stage), "
            f"{m['semantic_tokens']} semantic tokens a sentence: random weights never pick EOS, so every sentence "
            f"is {m['coarse_frames']} coarse frames, {fs(m['audio_s_per_sentence'])} s of audio, whatever its "
            "text. *base* is fp32 with transformers' eager attention (the reference path); **× base** columns "
            "are ratios to the base row at the same batch (speed: base time / this time; memory: this peak / "
            "base peak); **× batch 1**: throughput against the same configuration at batch 1. Peak memory: "
            + (
                "`torch.cuda.max_memory_allocated()` (weights on the GPU + activations)."
                if kinds == {"cuda"}
                else "the peak RSS of a child process that loads only that configuration (the whole process: "
                "PyTorch, transformers, the model)."
                if kinds == {"rss"}
                else "not measured."
            ),
        ]
        if m["size"] == "tiny":
            out[-1] += (
                " A tiny model: these figures show the harness and the per-call overheads, not Bark's speed "
                "(`--bark-size small` for that; about a minute a sentence on a CPU)."
            )
        header = [
            "Configuration",
            "Batch",
            "Latency (s), median (fastest)",
            "× base speed",
            "Throughput (audio s/s)",
            "Sentences/s",
            "× batch 1",
            mh,
            "× base memory",
        ]
        rows = []
        for r in section["rows"]:
            if r["status"] != OK or "latency_s" not in r:
                rows.append([f"{r['label']} — *{r.get('reason') or r['status']}*", r["batch"]] + ["n/a"] * 7)
                continue
            vs = r.get("vs_base") or {}
            rows.append(
                [
                    r["label"],
                    r["batch"],
                    f"{fs(r['latency_s']['median'])} ({fs(r['latency_s']['min'])})",
                    fx(vs.get("latency_speedup")),
                    fs(r["throughput"]),
                    fs(r["sentences_per_s"]),
                    fx(r.get("throughput_vs_batch1")),
                    fmb(r.get("memory")),
                    fx(vs.get("memory_ratio")),
                ]
            )
        out += ["", table(header, rows, "lr" + "r" * 7)]
        return "\n".join(out)

    def check(self, result: dict, section: dict, problems: list[str]) -> None:
        """The JSON shape of this section (report.validate_result calls it)."""
        w0 = "suites.bark"
        arms = {a.get("name") for a in result.get("arms", []) if isinstance(a, dict)}
        model = _need(section, "model", dict, w0, problems)
        if model is not None:
            _need(model, "semantic_tokens", int, f"{w0}.model", problems)
        rows = _need(section, "rows", list, w0, problems) or []
        for i, row in enumerate(rows):
            w = f"{w0}.rows[{i}]"
            if check_batch_row(row, w, arms, ("audio_s", "rtf", "throughput", "sentences_per_s"), problems):
                vs = row.get("vs_base")
                if vs is not None and not isinstance(vs, dict):
                    problems.append(f"{w}.vs_base: not an object")


# ---------------------------------------------------------------------------- the command
@dataclasses.dataclass(frozen=True)
class BarkBenchSettings(BenchSettings):
    bark_size: str | None = None
    """Layer sizes of the random-weight model, 'small' (suno/bark-small), 'large' (suno/bark) or
    'tiny' (None: small on CUDA, tiny on CPU, where bark-small takes about a minute a sentence)."""
    bark_tokens: int | None = None
    """Semantic tokens a sentence (random weights never stop early; None: 256 on CUDA, 16 on CPU)."""
    bark_runs: int | None = None
    """Timed rounds of its configurations (None: runs)."""

    def validate(self) -> "BarkBenchSettings":
        super().validate()
        from bark_random import BARK_SIZES

        if self.bark_size is not None and self.bark_size not in BARK_SIZES:
            raise ValueError(f"bark_size must be one of {', '.join(BARK_SIZES)}, not {self.bark_size!r}")
        if (self.bark_tokens is not None and self.bark_tokens < 1) or (self.bark_runs is not None and self.bark_runs < 1):
            raise ValueError("bark_tokens and bark_runs must be >= 1")
        return self


def build_parser() -> argparse.ArgumentParser:
    """The harness's flags (under its "bench" subcommand), the Bark ones added."""
    top = argparse.ArgumentParser(prog="bench_bark.py")
    sub = top.add_subparsers(dest="command")
    p = add_parser(sub)
    p.add_argument("--bark-size", choices=["tiny", "small", "large"],
                   help="layer sizes of the random-weight Bark, small = suno/bark-small, large = suno/bark "
                        "(default: small on CUDA, tiny on CPU)")
    p.add_argument("--bark-tokens", type=int, metavar="N",
                   help="semantic tokens a sentence (default: 256 on CUDA, 16 on CPU)")
    p.add_argument("--bark-runs", type=int, metavar="N", help="timed runs of its configurations (default --runs)")
    p.set_defaults(settings_type=BarkBenchSettings)
    return top


def main(argv: list[str] | None = None) -> int:
    """argv: the harness's flags (a leading "bench" is optional)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv if argv[:1] == ["bench"] else ["bench", *argv])
    return cmd_bench(ns)


if __name__ == "__main__":
    import sys

    import bench_bark  # registered under its module name, which the memory probe's child imports

    sys.exit(bench_bark.main())
