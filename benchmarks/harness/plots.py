"""PNG plots of a benchmark result (matplotlib, headless). Piper references are dashed."""

from __future__ import annotations

from pathlib import Path

REF_STYLE = {"linestyle": "--", "linewidth": 2.0, "color": "black"}
REF_STYLES = [REF_STYLE, {"linestyle": ":", "linewidth": 2.0, "color": "dimgray"}]


def _plt():
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib, or the [dev] extra)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _labels(result: dict) -> dict[str, str]:
    return {a["name"]: a["label"] for a in result["arms"]}


def _title(result: dict, what: str) -> str:
    m = result["machine"]
    where = (
        m["gpu"]["name"]
        if result["device"] == "cuda" and m.get("gpu")
        else f"{m['cpu']}, {m['cpus_usable']} CPUs"
    )
    return f"{what}\n{result['voice'].get('name')} on {where} ({result['created'][:10]})"


def _ref_style(i: int) -> dict:
    return {**REF_STYLES[i % len(REF_STYLES)], "marker": "x"}


def _plain_log_ticks(axis) -> None:
    """'0.5', '2' instead of '5x10^-1', '2x10^0' on a log axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(fmt)
    axis.set_minor_locator(LogLocator(subs=(2, 5)))
    axis.set_minor_formatter(fmt)


def plot_batching(result: dict, out: Path, plt) -> list[Path]:
    sec = result["suites"].get("batching")
    if not sec:
        return []
    rows = [r for r in sec["rows"] if "batched" in r]
    if not rows:
        return []
    labels = _labels(result)
    n = [r["sentences"] for r in rows]
    paths = []
    for metric, ylabel, fname, what in (
        (
            "latency",
            "latency (s), median",
            "latency_vs_batch.png",
            "Latency vs number of sentences (batch size)",
        ),
        (
            "throughput",
            "throughput (audio seconds per second)",
            "throughput_vs_batch.png",
            "Throughput vs batch size",
        ),
    ):
        if metric == "throughput" and result["suites"].get("configs"):
            fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1, 1.3]})
        else:
            fig, ax = plt.subplots(figsize=(7.5, 5))
            ax2 = None

        def val(t, metric=metric):
            return t["latency_s"]["median"] if metric == "latency" else t["throughput"]

        ax.plot(n, [val(r["sequential"]) for r in rows], "o-", label=f"{labels[sec['arm']]}: sequential")
        ax.plot(n, [val(r["batched"]) for r in rows], "s-", label=f"{labels[sec['arm']]}: batched")
        for i, ref in enumerate(sec["references"]):
            pts = [(r["sentences"], val(r["vs"][ref]["sequential"])) for r in rows if ref in r["vs"]]
            if pts:
                ax.plot(*zip(*pts), label=f"{labels[ref]} (reference, sequential)", **_ref_style(i))
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(x) for x in n])
        ax.set_xlabel("sentences (batch size)")
        ax.set_ylabel(ylabel)
        if metric == "latency":
            ax.set_yscale("log")
            _plain_log_ticks(ax.yaxis)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("sequential vs batched", fontsize=10)
        if ax2 is not None:
            _configs_panel(result, ax2, labels)
        fig.suptitle(_title(result, what), fontsize=11)
        fig.tight_layout()
        p = out / fname
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths


def _configs_panel(result: dict, ax, labels) -> None:
    sec = result["suites"]["configs"]
    by_arm: dict[str, list[tuple[int, float]]] = {}
    for r in sec["rows"]:
        if r.get("status") == "ok" and r.get("throughput"):
            by_arm.setdefault(r["arm"], []).append((r["batch"], r["throughput"]))
    refs = sec["references"]
    for name, pts in by_arm.items():
        pts.sort()
        if name in refs:
            ax.plot(*zip(*pts), label=f"{labels[name]} (reference)", **_ref_style(refs.index(name)))
        else:
            ax.plot(*zip(*pts), "o-", label=labels[name])
    ax.set_xscale("log", base=2)
    ax.set_xticks(sec["batches"], [str(b) for b in sec["batches"]])
    ax.set_xlabel("batch size")
    ax.set_ylabel("throughput (audio seconds per second)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("configurations", fontsize=10)


def plot_stream(result: dict, out: Path, plt) -> list[Path]:
    sec = result["suites"].get("stream")
    if not sec:
        return []
    labels = _labels(result)
    by_arm: dict[str, list[tuple[int, float, float]]] = {}
    for r in sec["rows"]:
        if r.get("status") == "ok":
            by_arm.setdefault(r["arm"], []).append(
                (r["chars"], r["first_audio_s"]["median"], r["total_s"]["median"])
            )
    if not by_arm:
        return []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    refs = sec["references"]
    for name, pts in by_arm.items():
        pts.sort()
        chars = [p[0] for p in pts]
        style = _ref_style(refs.index(name)) if name in refs else {}
        fmt = () if name in refs else ("o-",)
        lab = labels[name] + (" (reference)" if name in refs else "")
        ax1.plot(chars, [p[1] for p in pts], *fmt, label=lab, **style)
        ax2.plot(chars, [p[2] for p in pts], *fmt, label=lab, **style)
    for ax, what in ((ax1, "time to first audio (s)"), (ax2, "total time (s)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax.xaxis)
        _plain_log_ticks(ax.yaxis)
        ax.set_xlabel("text length (characters)")
        ax.set_ylabel(what + ", median")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_title("first audio", fontsize=10)
    ax2.set_title("whole text", fontsize=10)
    fig.suptitle(_title(result, "Time to first audio by text length"), fontsize=11)
    fig.tight_layout()
    p = out / "first_audio_by_length.png"
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return [p]


PLOTTERS = [plot_batching, plot_stream]


def write_plots(result: dict, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    paths: list[Path] = []
    for f in PLOTTERS:
        paths += f(result, out, plt)
    from .suites import SUITES

    for name, sec in result["suites"].items():  # suites that draw their own
        plot = getattr(SUITES.get(name), "plot", None)
        if plot is not None:
            paths += plot(SUITES[name](), result, sec, out, plt)
    return paths
