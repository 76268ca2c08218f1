"""The benchmark result as Markdown, its JSON shape check, and docs-section writing."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .arms import FAILED, OK, SKIPPED, UNAVAILABLE
from .suites import SUITES, find_suite

STATUSES = (OK, UNAVAILABLE, FAILED, SKIPPED)


# ---------------------------------------------------------------------------- formatting
def fs(x: float | None) -> str:
    """Seconds (or any positive figure) at a readable precision."""
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def fx(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}×"


def fmb(m: dict | None, with_kind: bool = False) -> str:
    if not m:
        return "—"
    mb = m["peak_mb"]
    s = f"{mb:,.0f}" if mb >= 100 else f"{mb:.1f}"
    return f"{s} ({'GPU' if m['kind'] == 'cuda' else 'RSS'})" if with_kind else s


def frun(m: dict | None) -> str:
    if not m or m.get("run_mb") is None:
        return "—"
    v = m["run_mb"]
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    align = align or ("l" + "r" * (len(header) - 1))
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _arms(result: dict) -> dict[str, dict]:
    return {a["name"]: a for a in result["arms"]}


def _mem_header(result: dict, names: Sequence[str]) -> tuple[str, bool]:
    """'Peak RSS (MB)' / 'Peak GPU memory (MB)', or a mixed header with per-cell kinds."""
    arms = _arms(result)
    kinds = {
        ("cuda" if arms[n]["device"] == "cuda" and arms[n]["engine"] == "voxserve" else "rss") for n in names
    }
    if kinds == {"rss"}:
        return "Peak RSS (MB)", False
    if kinds == {"cuda"}:
        return "Peak GPU memory (MB)", False
    return "Peak memory (MB)", True


# ---------------------------------------------------------------------------- sections
def _header(result: dict) -> str:
    m = result["machine"]
    s = result["settings"]
    v = result.get("voice", {})
    dev = result["device"].upper() if result["device"] == "cuda" else "CPU"
    gpu = m.get("gpu")
    gpu_s = (
        f"{gpu['name']} ({gpu['memory_gb']} GB, compute {gpu['capability']}, "
        f"driver {gpu.get('driver') or '?'})"
        if gpu
        else "none"
    )
    sw = (
        f"Python {m['python']}, torch {m['torch']} ({m['torch_threads']} threads"
        + (f", CUDA {m['torch_cuda']}" if m.get("torch_cuda") else "")
        + f"), onnxruntime {m.get('onnxruntime')} "
        f"({', '.join(p.replace('ExecutionProvider', '') for p in m.get('onnxruntime_providers', []))}), "
        f"piper-tts {m.get('piper_tts')}, voxserve {m.get('voxserve')}"
        + (f" (git {m['git_commit']})" if m.get("git_commit") else "")
    )
    voice = (
        f"{v.get('name')} ({v.get('sample_rate')} Hz, {v.get('quality') or '?'} quality, "
        f"{v.get('speakers', 1)} speaker(s), {v.get('size_mb', '?')} MB ONNX"
        + (f", sha256 {v['sha256']}…" if v.get("sha256") else "")
        + ")"
    )
    dtypes = sorted({a.get("dtype") or "fp32" for a in result["arms"] if a["engine"] != "piper"})
    rows = [
        ["Date (UTC)", result["created"]],
        ["Command", f"`{result['command']}`" if result.get("command") else "(library call)"],
        [
            "CPU",
            f"{m['cpu']} ({m['cpus_usable']} of {m['cpu_count']} logical CPUs usable), "
            f"{m.get('memory_gb')} GB RAM",
        ],
        ["GPU", gpu_s],
        ["OS", m["os"]],
        ["Software", sw],
        ["Voice", voice],
        ["voxserve dtypes", ", ".join(dtypes)],
    ]
    if m.get("load_average"):
        rows.append(
            [
                "Load average (1/5/15 min)",
                f"{' / '.join(map(str, m['load_average']))} at the start, "
                f"{' / '.join(map(str, m.get('load_average_end') or []))} at the end"
                + (
                    " (a shared machine: other processes competed for the CPUs)"
                    if max(m["load_average"][:1] + (m.get("load_average_end") or [0])[:1])
                    > 0.5 * m["cpus_usable"]
                    else ""
                ),
            ]
        )
    if result.get("spread"):
        rows.append(
            [
                "Run-to-run spread",
                f"{result['spread']:.2f} (median over all figures of the slowest / fastest "
                "timed run; about 1.1 on a quiet machine)",
            ]
        )
    done = result.get("timed_runs") or [s["runs"]]
    n_runs = str(done[0]) if len(set(done)) == 1 else f"{min(done)}-{max(done)}"
    rounds = f"median of {n_runs} timed runs after {s['warmup']} warm-up run(s)"
    method = [
        f"Every figure is the {rounds}, all configurations measured in this one run "
        + (
            "and interleaved round by round (so the noise of a shared machine falls on all alike)"
            if result["device"] == "cpu"
            else "one configuration loaded at a time, device synchronised before every time stamp"
        )
        + ". Every run draws new noise (voxserve: a new seed per run, reproducible from --seed; Piper "
        "draws its own), so durations and frame counts change from run to run as in real use, and "
        "per-shape kernel creation is in the figures as it is for a server.",
        "RTF = compute seconds / audio seconds (lower is better); throughput = audio seconds per second "
        "(higher is better). *(fastest)*: the quickest timed run, what the machine does when nothing "
        "else competes for it; the median is the figure.",
        "**× Piper** columns compare with the Piper reference (`piper-tts`'s `PiperVoice`, same voice file, "
        "same phoneme ids) measured in the same run: for time, Piper's time / this time (above 1: faster "
        "than Piper); for throughput, this / Piper; for memory, this peak / Piper's peak (below 1: smaller).",
        "Peak memory: "
        + (
            "CPU rows: peak resident set (VmHWM) of a fresh child process that loads only that configuration "
            "and runs only that workload (twice); RSS after loading is subtracted for the *synthesis* "
            "columns. One process cannot attribute RSS per configuration: voxserve keeps freed heap for "
            "reuse, so RSS never comes back down. "
            if s.get("memory")
            else "not measured (--no-memory). "
        )
        + (
            "CUDA rows: `torch.cuda.max_memory_allocated()` after `reset_peak_memory_stats()` "
            "(weights + activations; the CUDA context is not included)."
            if result["device"] == "cuda"
            else ""
        ),
    ]
    out = [f"## voxserve benchmark: {dev}, {v.get('name')}", "", table(["Machine", ""], rows, "ll"), ""]
    out += ["- " + x for x in method]
    return "\n".join(out)


def _ref_labels(result: dict, refs: Sequence[str]) -> dict[str, str]:
    arms = _arms(result)
    return {r: arms[r]["label"] for r in refs}


def _batching(result: dict, sec: dict) -> str:
    refs = sec["references"]
    labels = _ref_labels(result, refs)
    arms = _arms(result)
    primary = sec.get("arm")
    out = [f"### 1. {sec['title']}", ""]
    if not primary or arms.get(primary, {}).get("status") != OK:
        why = arms.get(primary, {}).get("reason") if primary else "no voxserve arm"
        return "\n".join(out + [f"Not measured: {why}."])
    out.append(
        f"`{arms[primary]['label']}`: n sentences (the first n of the corpus's short then medium texts) "
        "synthesised with one `Voice.run_units` call per sentence (*sequential*) vs one call for all n "
        "(*batched*). Piper has no batch API: it runs the same phoneme ids one `phoneme_ids_to_audio` call "
        "per sentence, as `PiperVoice.synthesize` does. Front end excluded (phoneme ids are made before the "
        "clock starts)."
    )
    out.append("")
    header = ["Sentences", "Phoneme ids", "Audio (s)", "Sequential (s)", "Batched (s)", "Speed-up"]
    for r in refs:
        header += [f"{labels[r]} (s)", f"Batched × {labels[r]}"]
    rows = []
    for row in sec["rows"]:
        if "batched" not in row:
            continue
        cells = [
            row["sentences"],
            row["phoneme_ids"],
            fs(row["audio_s"]),
            fs(row["sequential"]["latency_s"]["median"]),
            fs(row["batched"]["latency_s"]["median"]),
            fx(row["speedup"]),
        ]
        for r in refs:
            e = row["vs"].get(r)
            cells += [
                fs(e["sequential"]["latency_s"]["median"]) if e else "—",
                fx(e.get("batched_speedup")) if e else "—",
            ]
        rows.append(cells)
    out.append(table(header, rows))
    mem_names = [primary] + list(refs)
    mh, mixed = _mem_header(result, mem_names)
    if any((row.get("memory") or {}).get("batched") for row in sec["rows"]):
        out += ["", f"{mh}:", ""]
        header = ["Sentences", "Sequential peak", "Batched peak", "Difference"]
        rss = not mixed and mh.startswith("Peak RSS")
        if rss:
            header += ["Synthesis part, seq / batched"]
        for r in refs:
            header += [f"{labels[r]} peak", f"Batched / {labels[r]}"]
        rows = []
        for row in sec["rows"]:
            mem = row.get("memory") or {}
            ms, mb = mem.get("sequential"), mem.get("batched")
            if not ms and not mb:
                continue  # not measured at this size (--quick measures the largest only)
            diff = f"{mb['peak_mb'] - ms['peak_mb']:+.1f}" if ms and mb else "—"
            cells = [row["sentences"], fmb(ms, mixed), fmb(mb, mixed), diff]
            if rss:
                cells.append(f"{frun(ms)} / {frun(mb)}")
            for r in refs:
                e = row["vs"].get(r) or {}
                cells += [fmb(e.get("memory"), mixed), fx(e.get("batched_memory_ratio"))]
            rows.append(cells)
        out.append(table(header, rows))
    return "\n".join(out)


def _configs(result: dict, sec: dict) -> str:
    refs = sec["references"]
    labels = _ref_labels(result, refs)
    arms = _arms(result)
    pool = result.get("pool", [])
    out = [
        f"### 2. {sec['title']}",
        "",
        "Each configuration runs the same sentences as one `run_units` batch (Piper: one call per sentence). "
        "Batch 1 is the sentence of median length among the batch's sentences.",
    ]
    names = list(dict.fromkeys(r["arm"] for r in sec["rows"]))
    mh, mixed = _mem_header(result, names)
    for b in sec["batches"]:
        wl = sec.get("workloads", {}).get(str(b), [])
        ids = sum(pool[i]["phoneme_ids"] for i in wl if i < len(pool)) if pool else None
        out += [
            "",
            f"**Batch {b}** ({len(wl)} sentence{'s' if len(wl) != 1 else ''}"
            + (f", {ids} phoneme ids" if ids else "")
            + "):",
            "",
        ]
        header = [
            "Configuration",
            "Latency (s), median (fastest)",
            "RTF",
            "Throughput (audio s/s)",
            "Sentences/s",
            mh,
        ]
        for r in refs:
            header += [f"× {labels[r]} speed", f"× {labels[r]} memory"]
        rows = []
        for row in sec["rows"]:
            if row["batch"] != b:
                continue
            a = arms[row["arm"]]
            if row["status"] != OK or "latency_s" not in row:
                why = row.get("reason") or row["status"]
                rows.append([f"{a['label']} — *{why}*"] + ["n/a"] * (len(header) - 1))
                continue
            cells = [
                a["label"] + (" (reference)" if row["arm"] in refs else ""),
                f"{fs(row['latency_s']['median'])} ({fs(row['latency_s']['min'])})",
                fs(row["rtf"]),
                fs(row["throughput"]),
                fs(row["sentences_per_s"]),
                fmb(row.get("memory"), mixed),
            ]
            for r in refs:
                e = row["vs"].get(r) or {}
                cells += [fx(e.get("latency_speedup")), fx(e.get("memory_ratio"))]
            rows.append(cells)
        out.append(table(header, rows))
    return "\n".join(out)


def _stream(result: dict, sec: dict) -> str:
    refs = sec["references"]
    labels = _ref_labels(result, refs)
    arms = _arms(result)
    out = [
        f"### 3. {sec['title']}",
        "",
        "Text in, audio out, front end included: seconds until the first chunk and until the last, "
        "`Voice.stream` (the first sentence runs alone, later ones in growing batches) vs "
        "`PiperVoice.synthesize` (phonemises the whole text, then one chunk per sentence).",
        "",
    ]
    header = ["Text", "Chars", "Configuration", "First audio (s)", "Total (s)", "Audio (s)", "RTF"]
    for r in refs:
        header += [f"First audio × {labels[r]}", f"Total × {labels[r]}"]
    rows = []
    for row in sec["rows"]:
        a = arms[row["arm"]]
        label = a["label"] + (" (reference)" if row["arm"] in refs else "")
        if row.get("status") != OK:
            rows.append(
                [f"{row['text_id']} ({row['category']})", row["chars"], f"{label} — *{row.get('reason')}*"]
                + ["n/a"] * (len(header) - 3)
            )
            continue
        cells = [
            f"{row['text_id']} ({row['category']})",
            row["chars"],
            label,
            fs(row["first_audio_s"]["median"]),
            fs(row["total_s"]["median"]),
            fs(row["audio_s"]),
            fs(row["rtf"]),
        ]
        for r in refs:
            e = row["vs"].get(r) or {}
            cells += [fx(e.get("first_audio_speedup")), fx(e.get("total_speedup"))]
        rows.append(cells)
    out.append(table(header, rows, "lrl" + "r" * (len(header) - 3)))
    summary = sec.get("first_audio_by_category") or {}
    if summary:
        names = list(dict.fromkeys(a for c in summary.values() for a in c))
        out += ["", "Median time to first audio by category (s):", ""]
        out.append(
            table(
                ["Category"] + [arms[n]["label"] for n in names],
                [[c] + [fs(summary[c].get(n)) for n in names] for c in summary],
            )
        )
    return "\n".join(out)


RENDERERS = {"batching": _batching, "configs": _configs, "stream": _stream}
"""Suite name -> Markdown renderer; a suite without one is shown as its JSON keys only."""


def render_markdown(result: dict, plots: Sequence[tuple[str, str]] = ()) -> str:
    """The whole report. `plots`: (title, link) pairs to embed."""
    parts = [_header(result)]
    for name, sec in result["suites"].items():
        render = RENDERERS.get(name) or getattr(find_suite(name), "markdown", None)
        if render is None:
            parts.append(f"### {sec.get('title', name)}\n\n(no renderer for this suite; see the JSON)")
        elif name in RENDERERS:
            parts.append(render(result, sec))
        else:
            parts.append(render(SUITES[name](), result, sec))
    not_run = [a for a in result["arms"] if a["status"] in (UNAVAILABLE, FAILED, SKIPPED)]
    if not_run:
        parts.append(
            "### Configurations not measured\n\n"
            + "\n".join(f"- `{a['name']}` ({a['label']}): **{a['status']}** — {a['reason']}" for a in not_run)
        )
    if plots:
        parts.append("### Plots\n\n" + "\n\n".join(f"![{t}]({p})" for t, p in plots))
    tail = [f"Measured in {result.get('elapsed_s', 0) / 60:.1f} min."]
    tail += [f"Note: {n}" for n in result.get("notes", [])]
    parts.append("\n".join(tail))
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------- docs section
def section_markers(name: str) -> tuple[str, str]:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"section name must be letters, digits, '_', '.', '-': {name!r}")
    return f"<!-- voxserve-bench:{name}:begin -->", f"<!-- voxserve-bench:{name}:end -->"


def write_markdown_section(path: str | Path, report: str, section: str) -> None:
    """Put `report` between the section's markers in `path` (replacing what was there);
    a file without them gets the section appended, a missing file is created."""
    path = Path(path)
    begin, end = section_markers(section)
    block = f"{begin}\n{report.rstrip()}\n{end}"
    if path.exists():
        text = path.read_text(encoding="utf-8")
        i, j = text.find(begin), text.find(end)
        if i >= 0 and j > i:
            text = text[:i] + block + text[j + len(end) :]
        else:
            text = text.rstrip() + "\n\n" + block + "\n"
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = block + "\n"
    path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------- JSON shape
class SchemaError(ValueError):
    pass


def _need(d: Any, key: str, types, where: str, problems: list[str]):
    if not isinstance(d, dict) or key not in d:
        problems.append(f"{where}: missing {key!r}")
        return None
    v = d[key]
    if types is not None and not isinstance(v, types):
        problems.append(f"{where}.{key}: expected {types}, got {type(v).__name__}")
        return None
    return v


def check_batch_row(row: Any, w: str, arms, numbers: Sequence[str], problems: list[str]) -> bool:
    """The checks every per-arm, per-batch row shares (configs, and suites like Bark's): a known
    arm, an int batch; measured: a latency stat and these numbers; else a reason. True if the
    row was measured (the caller checks what else it holds)."""
    name = _need(row, "arm", str, w, problems)
    if name is not None and name not in arms:
        problems.append(f"{w}.arm: {name!r} not among arms")
    _need(row, "batch", int, w, problems)
    if row.get("status") == OK and "latency_s" in row:
        _check_stat(row["latency_s"], f"{w}.latency_s", problems)
        for key in numbers:
            _need(row, key, (int, float), w, problems)
        return True
    if not row.get("reason"):
        problems.append(f"{w}: not measured and no reason")
    return False


def _check_stat(s: Any, where: str, problems: list[str]) -> None:
    if not isinstance(s, dict):
        problems.append(f"{where}: not a stat")
        return
    runs = _need(s, "runs", list, where, problems)
    med = _need(s, "median", (int, float), where, problems)
    lo = _need(s, "min", (int, float), where, problems)
    hi = _need(s, "max", (int, float), where, problems)
    n = _need(s, "n", int, where, problems)
    if None in (runs, med, lo, hi, n):
        return
    if n != len(runs) or n < 1:
        problems.append(f"{where}: n={n} but {len(runs)} runs")
    elif not (lo <= med <= hi) or min(runs) != lo or max(runs) != hi:
        problems.append(f"{where}: min/median/max do not fit the runs")


def _check_vs(vs: Any, refs: list[str], where: str, problems: list[str]) -> None:
    if not isinstance(vs, dict):
        problems.append(f"{where}.vs: not an object")
        return
    for k in vs:
        if k not in refs:
            problems.append(f"{where}.vs: {k!r} is not a reference")


def validate_result(result: Any) -> dict:
    """Raise SchemaError listing every problem; return the result unchanged when it fits."""
    p: list[str] = []
    if not isinstance(result, dict):
        raise SchemaError("result: not an object")
    if result.get("schema") != "voxserve.bench/1":
        p.append(f"schema: expected 'voxserve.bench/1', got {result.get('schema')!r}")
    for key, t in (
        ("created", str),
        ("device", str),
        ("settings", dict),
        ("machine", dict),
        ("voice", dict),
        ("arms", list),
        ("references", list),
        ("suites", dict),
        ("notes", list),
    ):
        _need(result, key, t, "result", p)
    arms = {}
    for i, a in enumerate(result.get("arms") or []):
        w = f"arms[{i}]"
        for key, t in (("name", str), ("label", str), ("engine", str), ("device", str), ("status", str)):
            _need(a, key, t, w, p)
        if isinstance(a, dict):
            if a.get("status") not in STATUSES:
                p.append(f"{w}.status: {a.get('status')!r} not in {STATUSES}")
            if a.get("status") != OK and not a.get("reason"):
                p.append(f"{w}: status {a.get('status')} without a reason")
            arms[a.get("name")] = a
    refs = result.get("references") or []
    for r in refs:
        if arms.get(r, {}).get("status") != OK:
            p.append(f"references: {r!r} is not a measured arm")
    suites = result.get("suites") or {}
    for i, row in enumerate((suites.get("batching") or {}).get("rows", [])):
        w = f"suites.batching.rows[{i}]"
        _need(row, "sentences", int, w, p)
        if "batched" in row:
            for mode in ("sequential", "batched"):
                _check_stat((row.get(mode) or {}).get("latency_s"), f"{w}.{mode}.latency_s", p)
            _need(row, "speedup", (int, float), w, p)
        _check_vs(row.get("vs", {}), refs, w, p)
    for i, row in enumerate((suites.get("configs") or {}).get("rows", [])):
        w = f"suites.configs.rows[{i}]"
        if check_batch_row(row, w, arms, ("audio_s", "rtf", "throughput"), p):
            _check_vs(row.get("vs"), refs, w, p)
    for i, row in enumerate((suites.get("stream") or {}).get("rows", [])):
        w = f"suites.stream.rows[{i}]"
        for key, t in (("text_id", str), ("category", str), ("arm", str)):
            _need(row, key, t, w, p)
        if row.get("status") == OK:
            _check_stat(row.get("first_audio_s"), f"{w}.first_audio_s", p)
            _check_stat(row.get("total_s"), f"{w}.total_s", p)
            _check_vs(row.get("vs"), refs, w, p)
    for name, sec in suites.items():  # suites that check their own sections
        check = getattr(find_suite(name), "check", None) if name not in RENDERERS else None
        if check is not None:
            check(SUITES[name](), result, sec, p)
    if p:
        raise SchemaError("benchmark result does not fit voxserve.bench/1:\n  " + "\n  ".join(p))
    return result
