"""`voxserve bench`: how fast each voice is on this machine, to size its hardware.

For each voice (`--voice`, repeatable; default the default voice), loaded as `voxserve say` and
`voxserve serve` load it, after a warm-up round, the median of the timed rounds of:
- one sentence: seconds, and the real-time factor (seconds of compute per second of audio);
- a batch of sentences at once (`Voice.synthesize_batch`): seconds of audio made per second;
- a paragraph streamed (`Voice.stream`): seconds until its first audio.
Where piper-tts is installed and the voice is a Piper voice, Piper (`PiperVoice`, ONNX Runtime
on the CPU) runs the same texts on the same voice file as the reference, its rounds interleaved
with voxserve's, so that the noise of a busy machine falls on both alike.

    voxserve bench --quick                       # about half a minute for the default voice
    voxserve bench --voice a --voice b --device cuda --json bench.json

The benchmark laboratory that compares builds and settings (docs/benchmarks.md) is
`python benchmarks/bench.py` in a source checkout; it is not part of the product.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import load_voice
from .flags import load_option_args, load_options_from
from .options import SynthesisOptions
from .voices.registry import DEFAULT_VOICE, resolve_voice

TEXTS = (
    "Turn off the kitchen lights.",
    "The next train to the city centre leaves from platform four in about ten minutes.",
    "It is going to rain this afternoon, so take an umbrella if you go out.",
    "Your meeting with the design team has been moved to Thursday at half past two.",
    "The museum is open every day except Monday, from nine in the morning until six in the evening.",
    "Add two cups of flour and a pinch of salt, then stir until the dough is smooth.",
    "I could not find anything called that in your music library.",
    "The package was delivered this morning and left at the front door.",
)
"""Sentences a voice assistant or a reader says: short and medium (English voices; give others
--text-file)."""


@dataclass(frozen=True)
class BenchSettings:
    voices: tuple[str, ...] = (DEFAULT_VOICE,)
    device: str = "auto"
    dtype: str | None = None
    runs: int = 5
    """Timed rounds; every figure is their median."""
    warmup: int = 1
    """Untimed rounds first (kernels built, caches filled)."""
    batch: int = 8
    """Sentences synthesised at once in the batch figure."""
    texts: tuple[str, ...] = TEXTS
    piper: bool = True
    """Measure Piper alongside, where it is installed and the voice is a Piper voice."""

    def validate(self) -> BenchSettings:
        if not self.voices:
            raise ValueError("no voice to measure")
        if self.runs < 1 or self.warmup < 0:
            raise ValueError("runs must be at least 1 and warmup at least 0")
        if not 1 <= self.batch <= 256:
            raise ValueError(f"batch must be in 1..256, not {self.batch}")
        if not self.texts:
            raise ValueError("no texts")
        return self


QUICK = {"runs": 3, "batch": 4}
"""--quick: fewer rounds and a smaller batch; the same figures."""


class _Engine:
    """What is timed for one engine on one voice: each call returns seconds of audio made."""

    label = ""

    def one(self, text: str, seed: int) -> float:
        raise NotImplementedError

    def batch(self, texts: Sequence[str], seed: int) -> float:
        raise NotImplementedError

    def stream(self, text: str, seed: int) -> Iterator[float]:
        """Seconds of audio of each chunk, as the chunks come."""
        raise NotImplementedError


class _Voxserve(_Engine):
    label = "voxserve"

    def __init__(self, voice):
        self.voice, self.options = voice, SynthesisOptions

    def _seconds(self, audio) -> float:
        return len(audio.samples) / audio.sample_rate

    def one(self, text, seed):
        return self._seconds(self.voice.synthesize(text, self.options(seed=seed)))

    def batch(self, texts, seed):
        return sum(self._seconds(a) for a in self.voice.synthesize_batch(list(texts), self.options(seed=seed)))

    def stream(self, text, seed):
        for chunk in self.voice.stream(text, self.options(seed=seed)):
            yield self._seconds(chunk)


class _Piper(_Engine):
    label = "Piper (onnxruntime CPU)"

    def __init__(self, model: Path, config: Path):
        from piper import PiperVoice

        self.voice = PiperVoice.load(model, config_path=config)

    def _seconds(self, chunks) -> float:
        return sum(len(c.audio_float_array) / c.sample_rate for c in chunks)

    def one(self, text, seed):  # ONNX Runtime draws its own noise
        return self._seconds(self.voice.synthesize(text))

    def batch(self, texts, seed):  # Piper has no batch: one text after another
        return sum(self._seconds(self.voice.synthesize(t)) for t in texts)

    def stream(self, text, seed):
        for c in self.voice.synthesize(text):
            yield len(c.audio_float_array) / c.sample_rate


REFERENCE_RAN = "measured"  # the JSON's "piper" value when Piper ran beside the voice (else the reason it did not)

def _piper_for(name: str) -> tuple[_Engine | None, str | None]:
    """Piper on the voice's own files, or why not."""
    src = resolve_voice(name)
    config = src.config_path or src.path.with_name(src.path.name + ".json")
    if src.path.suffix != ".onnx" or not config.is_file():
        return None, f"a {src.family} voice, not an ONNX voice file with its JSON config (what Piper runs)"
    try:
        import piper  # noqa: F401
    except ImportError:
        return None, "piper-tts is not installed (pip install piper-tts)"
    return _Piper(src.path, config), None


def _timed(fn: Callable[[], float]) -> tuple[float, float]:
    t0 = time.perf_counter()
    audio = fn()
    return time.perf_counter() - t0, audio


def _first_audio(engine: _Engine, text: str, seed: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    first, audio = None, 0.0
    for seconds in engine.stream(text, seed):
        if first is None:
            first = time.perf_counter() - t0
        audio += seconds
    return first if first is not None else time.perf_counter() - t0, audio


def _median(rows: list[tuple[float, float]]) -> dict:
    seconds = statistics.median(s for s, _ in rows)
    audio = statistics.median(a for _, a in rows)
    return {"seconds": seconds, "audio_s": audio, "rtf": seconds / audio if audio else None,
            "audio_per_s": audio / seconds if seconds else None, "runs": len(rows)}


def _measure(engines: list[_Engine], settings: BenchSettings, log: Callable[[str], None]) -> list[dict]:
    texts = settings.texts
    one = sorted(texts, key=len)[(len(texts) - 1) // 2]  # the median-length sentence
    batch = [texts[i % len(texts)] for i in range(settings.batch)]
    paragraph = " ".join(texts[:4])
    got: dict[int, dict[str, list]] = {i: {"one": [], "batch": [], "first": []} for i in range(len(engines))}
    for r in range(settings.warmup + settings.runs):
        timed = r >= settings.warmup
        log(f"round {r + 1}/{settings.warmup + settings.runs}{'' if timed else ' (warm-up)'}")
        for i, e in enumerate(engines):  # interleaved: engine after engine, round after round
            seed = 1000 + r
            rows = (_timed(lambda: e.one(one, seed)), _timed(lambda: e.batch(batch, seed)),
                    _first_audio(e, paragraph, seed))
            if timed:
                for key, row in zip(("one", "batch", "first"), rows):
                    got[i][key].append(row)
    return [{"engine": e.label, "one_sentence": _median(got[i]["one"]),
             f"batch_of_{settings.batch}": _median(got[i]["batch"]),
             "first_audio": _median(got[i]["first"])} for i, e in enumerate(engines)]


def machine() -> dict:
    import torch

    info = {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.lower().startswith("model name")),
                               info["cpu"])
    except OSError:
        pass
    return info


def run_bench(settings: BenchSettings, load_options: dict | None = None,
              log: Callable[[str], None] = lambda _: None) -> dict:
    """Measure every voice of `settings`; the JSON-able result."""
    settings = settings.validate()
    result: dict = {"settings": {**asdict(settings), "texts": list(settings.texts)}, "machine": machine(), "voices": []}
    for name in settings.voices:
        log(f"loading {name}")
        t0 = time.perf_counter()
        voice = load_voice(name, device=settings.device, dtype=settings.dtype, **(load_options or {}))
        entry = {"voice": voice.name, "family": voice.family, "load_s": time.perf_counter() - t0,
                 "sample_rate": voice.sample_rate}
        engines: list[_Engine] = [_Voxserve(voice)]
        if settings.piper:
            piper, why = _piper_for(name)
            if piper is not None:
                engines.append(piper)
            entry["piper"] = why or REFERENCE_RAN
        entry["engines"] = _measure(engines, settings, log)
        result["voices"].append(entry)
        del voice, engines
    return result


def _f(x: float | None, unit: str = "") -> str:
    return "—" if x is None else f"{x:.3g}{unit}"


def render(result: dict) -> str:
    """The result as a Markdown table, with voxserve / Piper ratios where Piper ran."""
    m, s = result["machine"], result["settings"]
    batch = f"batch_of_{s['batch']}"
    lines = [f"voxserve bench: {m['cpu']}, {m['cpus']} CPUs, torch {m['torch']} ({m['torch_threads']} threads)"
             + (f", GPU {m['gpu']}" if m["gpu"] else "") + f"; device {s['device']}; medians of {s['runs']} runs",
             "", f"| voice | engine | load s | one sentence s (RTF) | {s['batch']} at once: audio s per s | first audio s |",
             "| :--- | :--- | ---: | ---: | ---: | ---: |"]
    notes = []
    for v in result["voices"]:
        for e in v["engines"]:
            load = _f(v["load_s"]) if e["engine"] == "voxserve" else ""
            lines.append(f"| {v['voice']} | {e['engine']} | {load} | {_f(e['one_sentence']['seconds'])} "
                         f"({_f(e['one_sentence']['rtf'])}) | {_f(e[batch]['audio_per_s'])} | "
                         f"{_f(e['first_audio']['seconds'])} |")
        if len(v["engines"]) == 2:
            vox, ref = v["engines"]
            notes.append(f"{v['voice']}, voxserve against Piper: one sentence "
                         f"{ref['one_sentence']['seconds'] / vox['one_sentence']['seconds']:.2f}x as fast, "
                         f"{s['batch']} at once {vox[batch]['audio_per_s'] / ref[batch]['audio_per_s']:.2f}x the audio "
                         f"per second, first audio {ref['first_audio']['seconds'] / vox['first_audio']['seconds']:.2f}x "
                         f"as soon")
        elif v.get("piper") and v["piper"] != REFERENCE_RAN:
            notes.append(f"{v['voice']}: no Piper reference: {v['piper']}")
    return "\n".join(lines + [""] + notes) + "\n"


def add_parser(sub) -> argparse.ArgumentParser:
    d = BenchSettings()
    p = sub.add_parser("bench", help="how fast each voice is on this machine (beside Piper where installed)",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--voice", dest="voices", action="append", default=None,
                   help=f"a voice to measure (repeatable; default {DEFAULT_VOICE})")
    p.add_argument("--device", default=d.device, help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default=None, help="fp32 (default); bf16 (CPU with AVX512-BF16/AMX, or CUDA); fp16 (CUDA)")
    p.add_argument("--quick", action="store_true",
                   help="fewer rounds and a smaller batch: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    p.add_argument("--runs", type=int, default=None, metavar="N", help=f"timed rounds (default {d.runs})")
    p.add_argument("--batch", type=int, default=None, metavar="N", help=f"sentences at once (default {d.batch})")
    p.add_argument("--text-file", default=None, metavar="FILE",
                   help="the sentences to say, one a line (default: built-in English ones)")
    p.add_argument("--no-piper", dest="piper", action="store_false", help="do not measure Piper alongside")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the result as JSON")
    load_option_args(p)
    p.set_defaults(func=cmd_bench)
    return p


def settings_from(ns: argparse.Namespace) -> BenchSettings:
    s = BenchSettings(device=ns.device, dtype=ns.dtype, piper=ns.piper)
    if ns.voices:
        s = replace(s, voices=tuple(ns.voices))
    if ns.quick:
        s = replace(s, **QUICK)
    if ns.runs is not None:
        s = replace(s, runs=ns.runs)
    if ns.batch is not None:
        s = replace(s, batch=ns.batch)
    if ns.text_file:
        try:
            lines = Path(ns.text_file).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ValueError(f"cannot read {ns.text_file}: {e.strerror or e}") from None
        s = replace(s, texts=tuple(t.strip() for t in lines if t.strip()))
    return s.validate()


def cmd_bench(ns: argparse.Namespace) -> int:
    settings = settings_from(ns)
    result = run_bench(settings, load_options_from(ns), log=lambda msg: print(f"[bench] {msg}", file=sys.stderr))
    print(render(result), end="")
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0
