"""The benchmark harness: speed and memory of configurations ("arms") side by side with Piper,
in one run, and the report of docs/benchmarks.md. A developer's laboratory, outside the product
(`voxserve bench` sizes a user's hardware; this compares builds and settings).

Three suites (suites.py), each over arms from one configuration table (arms.py):
1. batching: n = 1, 2, 4, 8, 16 sentences, sequential vs one batch (latency, speed-up, memory);
2. configs: every configuration at batch 1 and 8 (latency, RTF, throughput, memory);
3. stream: time to first audio and total time for short, medium and long texts.
Every figure is also a ratio to the Piper reference measured in the same run. Other families'
suites are benchmarks/bench_<name>.py (`--suites sbv2`).

    python benchmarks/bench.py --quick                      # the main rows only
    python benchmarks/bench.py --json out.json --plot plots/
    python benchmarks/bench.py --markdown docs/benchmarks.md --plot docs/benchmarks   # refresh the docs
    python benchmarks/bench.py --device cuda --out $OUT     # report.md + bench.json + PNGs

Library: `run_bench(BenchSettings(...)) -> dict`, `render_markdown(result)`, `write_plots(result, dir)`.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import fields, replace
from pathlib import Path

from .arms import CPU_ARMS, CUDA_ARMS, ArmSpec, availability, register_engine
from .core import QUICK, BenchSettings, plan, quick_settings, run_bench
from .report import SchemaError, render_markdown, validate_result, write_markdown_section
from .suites import SUITES, Suite, checkout_suites, register_suite

__all__ = [
    "CPU_ARMS",
    "CUDA_ARMS",
    "SUITES",
    "ArmSpec",
    "BenchSettings",
    "SchemaError",
    "Suite",
    "add_parser",
    "build_parser",
    "cmd_bench",
    "main",
    "plan",
    "register_engine",
    "register_suite",
    "render_markdown",
    "run_bench",
    "validate_result",
    "write_markdown_section",
    "write_plots",
]


def write_plots(result: dict, out):
    from .plots import write_plots as _w

    return _w(result, out)


def _ints(s: str) -> tuple[int, ...]:
    try:
        v = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not v:
        raise argparse.ArgumentTypeError("empty list")
    return v


def _names(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def add_parser(sub) -> argparse.ArgumentParser:
    d = {f.name: f.default for f in fields(BenchSettings)}
    p = sub.add_parser(
        "bench",
        help="measure speed and memory side by side with Piper; print a Markdown report",
        description=__doc__.split("\n\n")[0]
        + " Defaults: "
        + ", ".join(
            f"{k}={v}"
            for k, v in d.items()
            if k in ("runs", "warmup", "sizes", "batches", "texts_per_category")
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the quick subset: the table's quick rows, "
        + ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in QUICK.items()),
    )
    p.add_argument(
        "--voice", default=d["voice"], help="voice name or Piper .onnx path (default en_US-joe-medium)"
    )
    p.add_argument(
        "--device",
        default=d["device"],
        choices=["auto", "cpu", "cuda"],
        help="cpu, cuda, or auto = CUDA when present (default auto)",
    )
    p.add_argument(
        "--corpus",
        metavar="FILE",
        default=d["corpus"],
        help="JSON lines {id, category, text} or plain text, one text a line (default corpus/en_bench.jsonl)",
    )
    p.add_argument(
        "--runs", type=int, metavar="N", help=f"timed runs per figure, median reported (default {d['runs']})"
    )
    p.add_argument("--warmup", type=int, metavar="N", help=f"untimed runs first (default {d['warmup']})")
    p.add_argument("--sizes", type=_ints, help="sentence counts of the batching suite (default 1,2,4,8,16)")
    p.add_argument("--batches", type=_ints, help="batch sizes of the configurations suite (default 1,8)")
    p.add_argument(
        "--texts-per-category",
        type=int,
        metavar="N",
        help="texts per category in the stream suite, spread over their lengths "
        f"(default {d['texts_per_category']}: the median-length one)",
    )
    p.add_argument(
        "--categories", type=_names, help="corpus categories of the stream suite (default short,medium,long)"
    )
    p.add_argument(
        "--suites",
        type=_names,
        help=f"which suites (default {','.join(d['suites'])}; known: {','.join(sorted(set(SUITES) | set(checkout_suites())))})",
    )
    p.add_argument(
        "--configs",
        type=_names,
        metavar="NAMES",
        help="only these configurations (+ the Piper references); see --list-configs",
    )
    p.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        default=None,
        help="skip peak-memory measurement (CPU: the child processes)",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        metavar="M",
        help="stop measuring after M minutes; what was measured is kept and the cut is reported",
    )
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="memory-probe child processes at once (default: half the CPUs, 2 to 4)",
    )
    p.add_argument("--seed", type=int, help=f"voxserve noise seed (default {d['seed']})")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots to DIR")
    p.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write the report into FILE, between <!-- voxserve-bench:SECTION:begin/end --> markers",
    )
    p.add_argument("--section", help="section name for --markdown (default: the device, cpu or cuda)")
    p.add_argument("--out", metavar="DIR", help="write DIR/report.md, DIR/bench.json and the plots into DIR")
    p.add_argument("--from-json", metavar="FILE", help="render a saved result (no measuring)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (configurations, availability, tasks); run nothing",
    )
    p.add_argument("--list-configs", action="store_true", help="print the configuration table and exit")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when stderr is a terminal; else one line per phase)",
    )
    p.set_defaults(func=cmd_bench)
    return p


def settings_from(ns: argparse.Namespace, settings_type: type = BenchSettings) -> BenchSettings:
    """The settings the flags give (a field left unset keeps its default, or --quick's).
    settings_type: BenchSettings or a subclass with more fields (benchmarks/bench_bark.py)."""
    s = settings_type(voice=ns.voice, device=ns.device, corpus=ns.corpus)
    if ns.quick:
        s = quick_settings(s)
    over = {f.name: getattr(ns, f.name) for f in fields(settings_type)
            if f.name not in ("voice", "device", "corpus", "quick") and getattr(ns, f.name, None) is not None}
    return replace(s, **over).validate()


def _list_configs(settings: BenchSettings) -> str:
    from .suites import Context

    lines = []
    tables = [("CPU", CPU_ARMS), ("CUDA", CUDA_ARMS)]
    for name, cls in SUITES.items():  # the suites' own configurations (other model families)
        if cls.extra_arms is Suite.extra_arms:
            continue
        if name not in settings.suites:
            tables.append((f"suite {name} (not selected; --suites ...,{name} lists its configurations)", ()))
            continue
        for device in ("cpu", "cuda"):
            arms = cls().extra_arms(Context(settings, [], [], [], [], device))
            tables.append((f"suite {name}, {device.upper()}", tuple(arms)))
    for title, table in tables:
        lines.append(f"{title}:")
        for a in table:
            why = availability(a)
            flags = ",".join(
                f
                for f, on in (
                    ("reference", a.reference),
                    ("primary", a.primary),
                    ("stream", a.stream),
                    ("quick", a.quick),
                )
                if on
            )
            lines.append(f"  {a.name:<30} {a.label:<48} [{flags}] {'ok' if why is None else why}")
    return "\n".join(lines)


def _print_plan(pl: dict) -> str:
    lines = [
        f"device: {pl['device']}; {pl['rounds']} rounds per task (warm-up included); "
        f"{pl['pool_sentences']} pool sentences; stream texts: {', '.join(pl['stream_texts'])}"
    ]
    for a in pl["arms"]:
        lines.append(
            f"  {a['name']:<30} {a['status']:<12} tasks={a['tasks']:<3} memory_probes={a['memory_probes']:<3}"
            + (f" rounds={a['rounds']}" if a.get("rounds", pl["rounds"]) != pl["rounds"] else "")
            + (f" [suite {a['suite']}]" if a.get("suite") else "")
            + (f" {a['reason']}" if a["reason"] else "")
        )
    return "\n".join(lines)


def cmd_bench(ns: argparse.Namespace) -> int:
    settings_type = getattr(ns, "settings_type", BenchSettings)
    if ns.list_configs:
        print(_list_configs(settings_from(ns, settings_type)))
        return 0
    if ns.from_json:
        result = validate_result(json.loads(Path(ns.from_json).read_text(encoding="utf-8")))
    else:
        settings = settings_from(ns, settings_type)
        if ns.dry_run:
            print(_print_plan(plan(settings)))
            return 0
        command = "python " + " ".join(shlex.quote(a) for a in sys.argv) if sys.argv[1:] else None
        result = run_bench(settings, progress=ns.progress, command=command)
        validate_result(result)
    out = Path(ns.out) if ns.out else None
    plot_dir = Path(ns.plot) if ns.plot else out
    plots = write_plots(result, plot_dir) if plot_dir else []
    titles = {
        "latency_vs_batch.png": "Latency vs batch size",
        "throughput_vs_batch.png": "Throughput vs batch size",
        "first_audio_by_length.png": "Time to first audio by text length",
    }

    def links(base: Path) -> list[tuple[str, str]]:
        return [(titles.get(p.name, p.stem), os.path.relpath(p, base)) for p in plots]

    print(render_markdown(result, links(Path.cwd())))
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if ns.markdown:
        md = Path(ns.markdown)
        write_markdown_section(
            md, render_markdown(result, links(md.resolve().parent)), ns.section or result["device"]
        )
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        (out / "report.md").write_text(render_markdown(result, links(out.resolve())), encoding="utf-8")
    # success: something besides the Piper reference was measured (voxserve's VITS or Bark rows,
    # or a suite that measures on its own and says so)
    measured = [a for a in result["arms"] if a["engine"] != "piper" and a["status"] == "ok"]
    measured += [s for s in result["suites"].values() if isinstance(s, dict) and s.get("measured")]
    return 0 if measured else 1


def build_parser() -> argparse.ArgumentParser:
    """The harness's flags, under a "bench" subcommand (as benchmarks/bench_bark.py extends them)."""
    top = argparse.ArgumentParser(prog="bench.py")
    add_parser(top.add_subparsers(dest="command"))
    return top


def main(argv: list[str] | None = None) -> int:
    """argv: the harness's flags (a leading "bench" is optional): `python benchmarks/bench.py`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return cmd_bench(build_parser().parse_args(argv if argv[:1] == ["bench"] else ["bench", *argv]))
    except (ValueError, OSError) as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 2
