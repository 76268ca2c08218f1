"""What the benchmark compares: configurations ("arms") built from one data table, and the
adapters that run each of them the same way.

An arm is a frozen spec (engine, device, dtype, RuntimeOptions fields, threads). The table
below is the only place configurations are listed: a new speed feature gets a row, not code.
A row whose RuntimeOptions field does not exist in this build is reported as "not available
in this build", never dropped.

Engines:
* "voxserve": `load_voice(...)`, then `Voice.run_units` (one batch) / `Voice.stream`.
* "piper": piper-tts's `PiperVoice` (ONNX Runtime session) on the same voice file and the
  same phoneme ids: the reference every figure is also given as a ratio to. Piper has no
  batch API: a batch of n sentences runs them one after another, as `PiperVoice.synthesize`
  does for an n-sentence text.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OK, UNAVAILABLE, FAILED, SKIPPED = "ok", "unavailable", "failed", "skipped"


@dataclass(frozen=True)
class ArmSpec:
    name: str
    """Stable id (JSON key, --configs)."""
    label: str
    """What the report prints."""
    engine: str = "voxserve"
    """'voxserve', 'piper', or an engine a suite registers (register_engine)."""
    device: str = "cpu"
    dtype: str | None = None
    """load_voice's dtype (None = fp32)."""
    runtime: Mapping[str, Any] = field(default_factory=dict)
    """RuntimeOptions fields (voxserve) - passed as RuntimeOptions(**runtime)."""
    threads: int | None = None
    """CPU intra-op threads while this arm runs (None = the process default)."""
    reference: bool = False
    """A reference: every other arm's figures are also given as ratios to it."""
    primary: bool = False
    """The voxserve arm of the sequential-vs-batched suite."""
    stream: bool = False
    """Also measured in the time-to-first-audio suite."""
    quick: bool = True
    """Part of --quick."""
    suite: str | None = None
    """The suite that added this arm (Suite.extra_arms; set by the runner): it runs only that
    suite's tasks. None: a row of the table, run by every suite that wants it."""
    runs: int | None = None
    """Timed rounds of this arm (None: the settings' runs), e.g. fewer for a model whose
    every call takes seconds."""

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["runtime"] = dict(self.runtime)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ArmSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _arm(name, label, **kw) -> ArmSpec:
    return ArmSpec(name, label, **kw)


# ---------------------------------------------------------------------------- the table
# CPU: the voxserve back end at all cores and at one thread, and its bf16 decoder (native on
# AVX512-BF16/AMX CPUs); Piper's ONNX Runtime session at its default threads (the reference) and
# at one thread. Each CPU speed feature switched off, one at a time, is a developer's A/B:
# benchmarks/bench_cpu_features.py (`voxserve bench --suites cpu_features` in a checkout).
CPU_ARMS: tuple[ArmSpec, ...] = (
    _arm("vox-cpu", "voxserve torch fp32, defaults", primary=True, stream=True),
    _arm("vox-cpu-bf16", "voxserve, decoder in bf16", dtype="bf16", stream=True),
    _arm("vox-cpu-t1", "voxserve torch fp32, defaults, 1 thread", threads=1, quick=False),
    _arm("piper-cpu", "Piper (onnxruntime CPU)", engine="piper", reference=True, stream=True),
    _arm("piper-cpu-t1", "Piper (onnxruntime CPU), 1 thread", engine="piper", threads=1, quick=False),
)

# CUDA: precision, CUDA Graphs, torch.compile and CPU offload, each on and off. CUDA Graphs
# are on by default on CUDA (cuda_graphs=None), so the "off" rows say cuda_graphs=False; offload
# cannot be combined with graphs. "defaults" is what load_voice(device="cuda") gives a user.
_NO_GRAPHS = {"cuda_graphs": False}
CUDA_ARMS: tuple[ArmSpec, ...] = (
    _arm(
        "vox-cuda-fp32",
        "voxserve CUDA fp32, no graphs",
        device="cuda",
        runtime=_NO_GRAPHS,
        primary=True,
        stream=True,
    ),
    _arm("vox-cuda-fp16", "voxserve CUDA fp16, no graphs", device="cuda", dtype="fp16", runtime=_NO_GRAPHS),
    _arm("vox-cuda-bf16", "voxserve CUDA bf16, no graphs", device="cuda", dtype="bf16", runtime=_NO_GRAPHS),
    _arm(
        "vox-cuda-fp32-graphs",
        "voxserve CUDA fp32 + CUDA Graphs",
        device="cuda",
        runtime={"cuda_graphs": True},
    ),
    _arm(
        "vox-cuda-fp16-graphs",
        "voxserve CUDA fp16 + CUDA Graphs",
        device="cuda",
        dtype="fp16",
        runtime={"cuda_graphs": True},
        stream=True,
    ),
    _arm(
        "vox-cuda-bf16-graphs",
        "voxserve CUDA bf16 + CUDA Graphs",
        device="cuda",
        dtype="bf16",
        runtime={"cuda_graphs": True},
        quick=False,
    ),
    _arm("vox-cuda-defaults", "voxserve CUDA, load_voice defaults", device="cuda", stream=True),
    _arm(
        "vox-cuda-fp32-offload",
        "voxserve CUDA fp32 + CPU offload",
        device="cuda",
        runtime={"offload": True, "cuda_graphs": False},
        quick=False,
    ),
    _arm(
        "vox-cuda-fp16-offload",
        "voxserve CUDA fp16 + CPU offload",
        device="cuda",
        dtype="fp16",
        runtime={"offload": True, "cuda_graphs": False},
    ),
    _arm(
        "piper-cuda",
        "Piper (onnxruntime-gpu CUDA)",
        engine="piper",
        device="cuda",
        reference=True,
        stream=True,
    ),
    _arm("piper-cpu", "Piper (onnxruntime CPU)", engine="piper", reference=True, stream=True),
    # last: compilation can take minutes; under --max-minutes these are the rows that get cut
    _arm(
        "vox-cuda-fp32-compile",
        "voxserve CUDA fp32 + compile",
        device="cuda",
        runtime={"compile": True, "cuda_graphs": False},
        quick=False,
    ),
    _arm(
        "vox-cuda-fp16-compile",
        "voxserve CUDA fp16 + compile",
        device="cuda",
        dtype="fp16",
        runtime={"compile": True, "cuda_graphs": False},
        quick=False,
    ),
    _arm(
        "vox-cuda-fp16-graphs-compile",
        "voxserve CUDA fp16 + CUDA Graphs + compile",
        device="cuda",
        dtype="fp16",
        runtime={"cuda_graphs": True, "compile": True},
        quick=False,
    ),
)


def arms_for(device: str, quick: bool = False, names: Sequence[str] | None = None) -> list[ArmSpec]:
    """The table's rows for 'cpu' or 'cuda'; `names` picks rows (and keeps the references)."""
    table = CUDA_ARMS if device == "cuda" else CPU_ARMS
    if names:
        known = {a.name for a in CPU_ARMS + CUDA_ARMS}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown configuration(s) {unknown}; known: {sorted(known)}")
        by_name = {a.name: a for a in CPU_ARMS + CUDA_ARMS}
        picked = [by_name[n] for n in names]
        refs = [a for a in table if a.reference and a.name not in names]
        return picked + refs
    return [a for a in table if a.quick or not quick]


# ---------------------------------------------------------------------------- availability
def runtime_fields() -> set[str]:
    from ..families.piper.options import RuntimeOptions

    return {f.name for f in dataclasses.fields(RuntimeOptions)}


def availability(spec: ArmSpec) -> str | None:
    """None if the arm can be tried here, else why not (reported in the tables)."""
    cls = ENGINES.get(spec.engine)
    if cls is None:
        return f"unknown engine {spec.engine!r} (known: {', '.join(sorted(ENGINES))})"
    return cls.unavailable(spec)


def quick_skip(spec: ArmSpec) -> str | None:
    """Why --quick leaves `spec` out on this machine (None: it runs): an arm whose precision this
    CPU only emulates measures the emulation, minutes for a figure no user of this CPU would
    pick. The full `voxserve bench` runs it anyway."""
    if spec.device != "cpu" or spec.dtype not in ("bf16", "bfloat16"):
        return None
    from ..runtime.device import cpu_has_native_bf16

    if cpu_has_native_bf16():
        return None
    return ("this CPU has no native bf16 (AVX512-BF16 or AMX): bf16 would be emulated, several "
            "times slower than fp32; `voxserve bench` without --quick measures it anyway")


def _torch_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


# ---------------------------------------------------------------------------- work items
@dataclass(frozen=True)
class Sentence:
    """One sentence of the benchmark pool, as the model sees it."""

    text_index: int
    """Index of the corpus text it comes from."""
    unit_index: int
    """Its position among that text's units."""
    text: str
    ids: tuple[int, ...]
    speaker_id: int = 0


def build_pool(voice, texts: Sequence[str], order: Sequence[int], n: int, options) -> list[Sentence]:
    """The first n sentences of texts[order[0]], texts[order[1]], ... as the voice's front
    end makes them."""
    out: list[Sentence] = []
    for ti in order:
        for u in voice.units(texts[ti], options):
            out.append(Sentence(ti, u.index, u.text, tuple(u.payload.ids), int(u.payload.speaker_id)))
            if len(out) >= n:
                return out
    if len(out) < n:
        raise ValueError(
            f"the corpus gives only {len(out)} sentences; {n} are needed "
            "(give a longer corpus, or smaller --sizes / --batches)"
        )
    return out


@dataclass
class Output:
    """What one timed call produced."""

    audios: list[np.ndarray]
    first_s: float | None = None
    """Stream only: seconds until the first chunk."""


# ---------------------------------------------------------------------------- adapters
class Arm:
    """A loaded configuration. open() loads; the run_* methods are what the clock times."""

    batching = True
    """False: run_batch is run_sequential (no batch API)."""

    def __init__(self, spec: ArmSpec, voice: str | None, seed: int = 1234):
        self.spec = spec
        self.voice_name = voice
        self.seed = seed
        self.sample_rate = 0
        self.info: dict[str, Any] = {}

    @classmethod
    def unavailable(cls, spec: ArmSpec) -> str | None:
        """None if `spec` can run in this build and on this machine, else the reason."""
        return None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_cuda(self) -> bool:
        return self.spec.device == "cuda"

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        gc.collect()

    def activate(self) -> None:
        """Set process-wide state this arm runs under (torch's thread count)."""
        import torch

        torch.set_num_threads(self.spec.threads or default_threads())

    def sync(self) -> None:
        pass

    def prepare(self, sentences: Sequence[Sentence], texts: Sequence[str]) -> Any:
        """Model inputs for `sentences` (done outside the clock)."""
        raise NotImplementedError

    def run_batch(self, prepared) -> list[np.ndarray]:
        raise NotImplementedError

    def run_sequential(self, prepared) -> list[np.ndarray]:
        raise NotImplementedError

    def stream(self, text: str) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def reseed(self, prepared: Any, seed: int) -> Any:
        """Inputs for one run with fresh noise `seed` (outside the clock); streams use it too.
        Engines that draw their own noise every run (Piper) return `prepared` unchanged."""
        return prepared

    # CUDA peak memory, in-process (CPU peaks are measured in child processes)
    def memory_begin(self) -> None:
        pass

    def memory_end(self) -> int | None:
        return None


_DEFAULT_THREADS: int | None = None


def default_threads() -> int:
    """torch's thread count when the benchmark started (arms set and restore it)."""
    global _DEFAULT_THREADS
    if _DEFAULT_THREADS is None:
        import torch

        _DEFAULT_THREADS = torch.get_num_threads()
    return _DEFAULT_THREADS


class VoxserveArm(Arm):
    def __init__(self, spec: ArmSpec, voice: str | None, seed: int = 1234):
        super().__init__(spec, voice, seed)
        self.voice = None

    @classmethod
    def unavailable(cls, spec: ArmSpec) -> str | None:
        missing = sorted(set(spec.runtime) - runtime_fields())
        if missing:
            return "not available in this build: RuntimeOptions has no field " + ", ".join(
                repr(m) for m in missing
            )
        if spec.device == "cuda" and not _torch_cuda():
            return "no CUDA device (torch.cuda.is_available() is False)"
        return None

    def open(self) -> None:
        import torch

        from .. import load_voice
        from ..families.piper.options import RuntimeOptions
        from ..options import SynthesisOptions

        default_threads()
        self.activate()
        before = torch.cuda.memory_allocated() if self.is_cuda else None
        runtime = RuntimeOptions(**dict(self.spec.runtime))
        self.voice = load_voice(
            self.voice_name, device=self.spec.device, dtype=self.spec.dtype, runtime=runtime
        )
        self.options = SynthesisOptions(seed=self.seed)
        self.sample_rate = self.voice.sample_rate
        self.device = torch.device(self.spec.device)
        runner = getattr(self.voice, "runner", None)
        self.info = {
            "voice": self.voice.name,
            "dtype": str(getattr(runner, "dtype", "")).replace("torch.", ""),
            "runtime": dataclasses.asdict(runtime),
        }
        if before is not None:  # not 0: an earlier configuration left memory behind (counted in peaks)
            self.info["cuda_allocated_before_load_mb"] = round(before / 2**20, 1)
        self.activate()  # load_voice may set threads itself; the arm's setting wins

    def close(self) -> None:
        self.voice = None
        if self.spec.runtime.get("compile"):
            try:  # compiled graphs hold the model's weights; the next configuration must not count them
                import torch._dynamo

                torch._dynamo.reset()
            except Exception:  # noqa: BLE001 - best effort; memory figures show what stayed
                pass
        super().close()
        if self.is_cuda:
            import torch

            torch.cuda.empty_cache()

    def sync(self) -> None:
        if self.is_cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def prepare(self, sentences, texts):
        """The voice's own units for the pool sentences; their ids must be the pool's."""
        by_text: dict[int, list] = {}
        units = []
        for s in sentences:
            if s.text_index not in by_text:
                by_text[s.text_index] = list(self.voice.units(texts[s.text_index], self.options))
            u = by_text[s.text_index][s.unit_index]
            if tuple(u.payload.ids) != s.ids:
                raise RuntimeError(f"{self.name}: the front end made other ids for {s.text!r}")
            units.append(u)
        return units

    def run_batch(self, prepared):
        return self.voice.run_units(prepared)

    def run_sequential(self, prepared):
        return [self.voice.run_units([u])[0] for u in prepared]

    def reseed(self, prepared, seed):
        # new noise -> new durations -> new frame counts: every run meets the shapes a server
        # meets (per-shape kernel creation included), not the ones the warm-up already made
        from ..options import SynthesisOptions
        from ..voice import sentence_seed

        self.options = SynthesisOptions(seed=seed)
        if prepared is None:
            return None
        return [
            dataclasses.replace(u, payload=dataclasses.replace(u.payload, seed=sentence_seed(seed, k)))
            for k, u in enumerate(prepared)
        ]

    def stream(self, text):
        for chunk in self.voice.stream(text, self.options):
            yield chunk.samples

    def memory_begin(self) -> None:
        if self.is_cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def memory_end(self) -> int | None:
        if self.is_cuda:
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        return None


class PiperArm(Arm):
    batching = False

    def __init__(self, spec: ArmSpec, voice: str | None, seed: int = 0):
        super().__init__(spec, voice, seed)  # ONNX Runtime draws its own noise: seed unused
        self.voice = None

    @classmethod
    def unavailable(cls, spec: ArmSpec) -> str | None:
        try:
            import onnxruntime
            import piper  # noqa: F401
        except ImportError as e:
            return f"piper-tts / onnxruntime not importable: {e}"
        if spec.device == "cuda" and "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return (
                "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu); "
                f"providers: {', '.join(onnxruntime.get_available_providers())}"
            )
        return None

    def open(self) -> None:
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        from ..voices.registry import resolve_voice

        src = resolve_voice(self.voice_name)
        config_path = src.config_path or src.path.with_name(src.path.name + ".json")
        if self.spec.threads is None and self.spec.device == "cpu":
            # stock Piper: exactly what PiperVoice.load builds
            self.voice = PiperVoice.load(src.path, config_path=config_path)
        else:
            import json

            opts = onnxruntime.SessionOptions()
            if self.spec.threads:
                opts.intra_op_num_threads = self.spec.threads
            providers: list = (
                [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})]
                if self.spec.device == "cuda"
                else ["CPUExecutionProvider"]
            )
            with open(config_path, encoding="utf-8") as f:
                config = PiperConfig.from_dict(json.load(f))
            session = onnxruntime.InferenceSession(str(src.path), sess_options=opts, providers=providers)
            self.voice = PiperVoice(config=config, session=session)
        used = self.voice.session.get_providers()
        if self.spec.device == "cuda" and used[0] != "CUDAExecutionProvider":
            raise RuntimeError(f"onnxruntime fell back to {used[0]}")
        self.sample_rate = self.voice.config.sample_rate
        self.info = {
            "providers": used,
            "onnxruntime": onnxruntime.__version__,
            "intra_op_threads": self.spec.threads or "default",
        }
        if self.spec.device == "cpu" or self.spec.threads:
            self.activate()

    def close(self) -> None:
        self.voice = None
        super().close()

    def _syn(self, speaker_id: int):
        from piper.config import SynthesisConfig

        return SynthesisConfig(speaker_id=speaker_id if self.voice.config.num_speakers > 1 else None)

    def prepare(self, sentences, texts):
        return [(list(s.ids), self._syn(s.speaker_id)) for s in sentences]

    def run_batch(self, prepared):
        return self.run_sequential(prepared)

    def run_sequential(self, prepared):
        return [
            np.asarray(self.voice.phoneme_ids_to_audio(ids, syn), dtype=np.float32).reshape(-1)
            for ids, syn in prepared
        ]

    def stream(self, text):
        for chunk in self.voice.synthesize(text):  # the voice's default speaker, as voxserve's
            yield chunk.audio_float_array


ENGINES: dict[str, type[Arm]] = {"voxserve": VoxserveArm, "piper": PiperArm}
"""Engine name -> adapter. Another model family (e.g. Bark) registers its adapter here."""


def register_engine(name: str, cls: type[Arm]) -> None:
    ENGINES[name] = cls


def make_arm(spec: ArmSpec, voice: str | None, seed: int = 1234) -> Arm:
    cls = ENGINES.get(spec.engine)
    if cls is None:
        raise ValueError(f"unknown engine {spec.engine!r}")
    return cls(spec, voice, seed)
