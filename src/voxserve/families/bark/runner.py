"""Runs batches of sentences through transformers' BarkModel.

`BarkModel.generate` is four calls: semantic.generate -> coarse_acoustics.generate ->
fine_acoustics.generate -> codec_decode. The runner makes those same four calls itself (the
Bark algorithms stay in transformers) because it needs the stage boundaries for four things:

1. Batch invariance. A sentence gives the same tokens alone or in any batch (greedy, or
   sampling with its own seed):
   - semantic: every prompt is padded to the same `max_input_semantic_length` with an attention
     mask (pad positions become Bark's text-pad token), and each row stops at its own EOS;
   - coarse: it is causal, and its sliding windows sit at the same offsets for every row, so
     the tokens of a row up to its own length do not depend on the longer rows;
   - fine: it is NOT causal and transformers' loop passes no attention mask, so a short row in
     a batch would see the longer rows' extra coarse frames instead of padding, and long rows
     change the loop's window offsets. The fine stage (6 non-autoregressive passes per 512
     frames, a few per cent of the time) therefore runs per sentence, on its own coarse tokens;
   - EnCodec decodes each sentence trimmed to its own frames (as transformers does).
2. Per-row sampling. transformers samples a whole batch from the global RNG, so a row's
   tokens would depend on its batch mates. Here the stages decode greedily and the runner
   samples each row itself with the Gumbel-max trick (argmax(logits / T + Gumbel noise) is an
   exact sample of softmax(logits / T)), the noise drawn from that row's own generator (one per
   row and stage, seeded from the sentence's seed). The noise goes after transformers' own
   logits processors (suppressed tokens, Bark's EOS rule, codebook alternation), where its
   temperature warper would be. Temperature 0 = greedy. Bark's global RNG is never touched.
3. CPU offload: one stage's weights on the device at a time (runtime/offload.py's
   WeightOffloader, one group per stage).
4. Different speakers: transformers takes one history prompt per batch, so the units of one
   `run` are grouped by speaker preset; each group is one batch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ...runtime.offload import ResidentWeights, WeightOffloader, module_bytes

log = logging.getLogger(__name__)

# stage -> the BarkModel submodules it runs (the offload groups)
OFFLOAD_GROUPS = {"semantic": ("semantic",), "coarse": ("coarse_acoustics",), "fine": ("fine_acoustics",),
                  "codec": ("codec_model",)}


class _ExpectedGenerationWarnings(logging.Filter):
    """Drops the warnings transformers logs on every batched Bark call about what Bark does on
    purpose: no attention mask for the prompt it builds itself (and EOS as padding), and the
    window length that BarkCoarseModel passes next to its generation config."""

    PHRASES = (
        "The attention mask and the pad token id were not set",
        "The attention mask is not set with a batched input",
        "together with generation-related arguments",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(p in msg for p in self.PHRASES)


_generation_log = logging.getLogger("transformers.generation.utils")
if not any(isinstance(f, _ExpectedGenerationWarnings) for f in _generation_log.filters):
    _generation_log.addFilter(_ExpectedGenerationWarnings())


@dataclass(frozen=True)
class BarkItem:
    """One sentence, ready for the model."""

    text: str
    speaker: str | None
    """Speaker preset name (a history prompt), or None for none."""
    temperatures: tuple[float, float, float]
    """Semantic, coarse, fine; 0 = greedy."""
    seed: int


class _RowSampler:
    """Gumbel-max sampling per row, each row from its own generator (a logits processor)."""

    def __init__(self, temperatures: Sequence[float], seeds: Sequence[int], stage: int, device: torch.device):
        self.temperatures = list(temperatures)
        self.generators: list[torch.Generator | None] = []
        for t, s in zip(temperatures, seeds):
            if t > 0:
                g = torch.Generator(device=device)
                g.manual_seed((s * 3 + stage) & ((1 << 63) - 1))  # independent streams per stage
                self.generators.append(g)
            else:
                self.generators.append(None)

    @property
    def active(self) -> bool:
        return any(g is not None for g in self.generators)

    def perturb(self, scores: torch.Tensor, n_valid: int | None = None) -> torch.Tensor:
        """scores [B, ..., V] -> float32 scores / T + Gumbel noise on the rows that sample
        (on the first n_valid entries of the last axis if given; the rest are left alone)."""
        out = scores.float().clone()
        for i, (t, g) in enumerate(zip(self.temperatures, self.generators)):
            if g is None:
                continue
            row = out[i, ..., :n_valid] if n_valid is not None else out[i]
            # Gumbel noise -log(-log U), U ~ U[0, 1): U = 0 gives -inf (never picked), U < 1 keeps
            # it finite, so -inf scores stay -inf and nothing becomes NaN. (Cheaper on CPU than
            # exponential_: docs/benchmarks.md, "Figures behind the code's defaults"; the fine
            # stage draws 1024 x 1024 of them per codebook pass.)
            u = torch.rand(row.shape, dtype=torch.float32, device=out.device, generator=g)
            row.div_(t).sub_(u.log_().neg_().log_())
        return out

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return self.perturb(scores)


class BarkRunner(ResidentWeights):
    """Owns a loaded BarkModel + BarkProcessor on one device; `run(items)` -> audio per item."""

    def __init__(self, model, processor, device: torch.device, dtype: torch.dtype,
                 presets: Callable[[str], dict[str, np.ndarray]], offload: bool = False):
        from transformers.models.bark.generation_configuration_bark import (
            BarkCoarseGenerationConfig,
            BarkFineGenerationConfig,
            BarkSemanticGenerationConfig,
        )

        self.model = model
        self.processor = processor
        self.device = device
        self.dtype = dtype
        self.presets = presets
        gc = model.generation_config
        for key in ("semantic_config", "coarse_acoustics_config", "fine_acoustics_config", "codebook_size"):
            if getattr(gc, key, None) is None:
                raise ValueError(f"the generation config has no {key!r}: not a Bark generation_config.json")
        # greedy in transformers; sampling is ours (see _RowSampler). temperature=1.0 keeps
        # transformers from warning about a temperature without sampling.
        self.semantic_config = BarkSemanticGenerationConfig(**{**gc.semantic_config, "do_sample": False, "temperature": 1.0})
        self.coarse_config = BarkCoarseGenerationConfig(**{**gc.coarse_acoustics_config, "do_sample": False, "temperature": 1.0})
        self.fine_config = BarkFineGenerationConfig(**gc.fine_acoustics_config)
        self.fine_config.temperature = None  # argmax in transformers' fine loop; noise is ours
        self.codebook_size = int(gc.codebook_size)
        self.n_coarse = int(self.coarse_config.n_coarse_codebooks)
        self.max_text_tokens = int(self.semantic_config.max_input_semantic_length)
        self.hop_length = int(np.prod(model.config.codec_config.upsampling_ratios))
        self._lock = threading.Lock()  # one generation at a time: the samplers below are shared state
        # transformers' fast tokenizers are not thread-safe (each call resets padding/truncation
        # on the shared Rust object: "RuntimeError: Already borrowed"); the engine tokenizes in
        # front-end threads while the worker runs batches. Everything that tokenizes takes this.
        self.tokenizer_lock = threading.Lock()
        self._ar_sampler: _RowSampler | None = None
        self._fine_sampler: _RowSampler | None = None
        for sub in (model.semantic, model.coarse_acoustics):
            self._append_sampler_to_logits_processors(sub)
        for head in model.fine_acoustics.lm_heads:
            head.register_forward_hook(self._fine_logits_hook)
        self.offloader: WeightOffloader | None = None
        if offload and device.type == "cuda":
            self.offloader = WeightOffloader(model, OFFLOAD_GROUPS, device)
        elif offload:
            log.warning("offload (enable_cpu_offload) has no effect on %s: the weights already live in host memory",
                        device)
        if self.offloader is None:
            model.to(device)

    def stages(self) -> dict[str, nn.Module]:
        return {stage: getattr(self.model, names[0]) for stage, names in OFFLOAD_GROUPS.items()}

    @property
    def offload(self) -> bool:
        return self.offloader is not None and self.offloader.enabled

    # ------------------------------------------------------------------ residency
    def device_bytes(self) -> int:
        """Device memory the weights take while the voice is resident (with offload: the
        largest stage, the only one ever on the device)."""
        if self.offload:
            return max(module_bytes(m) for m in self.stages().values())
        return module_bytes(self.model)

    def _stays_on_host(self) -> bool:
        return self.offload  # the offloader already keeps every stage on the host between uses

    # ------------------------------------------------------------------ hooks
    def _append_sampler_to_logits_processors(self, sub: nn.Module) -> None:
        # BarkSemanticModel/BarkCoarseModel.generate pass their own `logits_processor` list to
        # GenerationMixin.generate, so a caller cannot add one; the processor list is built by
        # _get_logits_processor, which this instance-level wrapper extends with the row sampler
        # of the stage being run. (transformers is pinned; tests/bark fails if this stops working.)
        base = sub._get_logits_processor

        def with_row_sampler(*args, **kwargs):
            processors = base(*args, **kwargs)
            if self._ar_sampler is not None:
                processors.append(self._ar_sampler)
            return processors

        sub._get_logits_processor = with_row_sampler

    def _fine_logits_hook(self, module, args, logits):
        s = self._fine_sampler
        if s is None:
            return None
        # the fine loop takes argmax over logits[..., :codebook_size]: perturb exactly those
        return s.perturb(logits, n_valid=self.codebook_size)

    @contextlib.contextmanager
    def _stage(self, stage: str) -> Iterator[None]:
        if self.offloader is None:
            yield
        else:
            with self.offloader.stage(stage):
                yield

    # ------------------------------------------------------------------ run
    def run(self, items: Sequence[BarkItem]) -> list[np.ndarray]:
        """float32 audio per item, trimmed to its own length (24 kHz for Bark's EnCodec)."""
        if not items:
            return []
        groups: dict[str | None, list[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault(it.speaker, []).append(i)
        out: list[np.ndarray | None] = [None] * len(items)
        with self._lock, torch.no_grad():
            for speaker, idx in groups.items():
                for i, a in zip(idx, self._run_group([items[i] for i in idx], speaker)):
                    out[i] = a
        return out  # type: ignore[return-value]

    def generate_tokens(self, items: Sequence[BarkItem]) -> list[dict[str, torch.Tensor]]:
        """The per-item token outputs of each stage (semantic, coarse, fine), no audio: for
        the batch-invariance tests and tools. Items must share one speaker."""
        if len({it.speaker for it in items}) > 1:
            raise ValueError("generate_tokens: items must share one speaker preset")
        with self._lock, torch.no_grad():
            return self._generate([it for it in items], items[0].speaker if items else None)

    def _history(self, speaker: str | None, texts: list[str]):
        preset = self.presets(speaker) if speaker is not None else None
        with self.tokenizer_lock:
            enc = self.processor(texts, voice_preset=preset, max_length=self.max_text_tokens, return_tensors="pt")
        history = None
        if preset is not None:
            history = {k: v.to(self.device) for k, v in enc["history_prompt"].items()}
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device), history

    def _generate(self, items: Sequence[BarkItem], speaker: str | None) -> list[dict[str, torch.Tensor]]:
        m = self.model
        ids, mask, history = self._history(speaker, [it.text for it in items])
        seeds = [it.seed for it in items]
        temps = list(zip(*(it.temperatures for it in items)))  # per stage, per row

        with self._stage("semantic"), self._sampling(temps[0], seeds, 0):
            # ids [B, max_text_tokens]; semantic [B, S] with EOS / pad after each row's end
            semantic = m.semantic.generate(ids, semantic_generation_config=self.semantic_config,
                                           history_prompt=history, attention_mask=mask)
        n_semantic = (semantic != self.semantic_config.semantic_pad_token).sum(1).tolist()

        with self._stage("coarse"), self._sampling(temps[1], seeds, 1):
            # coarse [B, n_coarse * T] (codebooks interleaved); lengths per row in that unit
            coarse, lengths = m.coarse_acoustics.generate(
                semantic, semantic_generation_config=self.semantic_config,
                coarse_generation_config=self.coarse_config, codebook_size=self.codebook_size,
                history_prompt=history, return_output_lengths=True)
        lengths = [int(x) for x in lengths.tolist()]

        results = []
        with self._stage("fine"):
            for i in range(len(items)):
                n = lengths[i]
                r = {"semantic": semantic[i, : n_semantic[i]], "coarse": coarse[i, :n]}
                r["fine"] = self.fine_tokens(coarse[i, :n], history, temps[2][i], seeds[i])
                results.append(r)
        return results

    def fine_tokens(self, coarse: torch.Tensor, history: dict[str, torch.Tensor] | None, temperature: float,
                    seed: int) -> torch.Tensor:
        """One sentence's fine stage: coarse [n] (codebooks interleaved) -> fine [n_codebooks,
        frames], sampled from the sentence's own stream (see the module docstring on why one
        sentence at a time). The caller holds the lock, no_grad and the fine stage."""
        if coarse.numel() == 0:  # the semantic model ended at once: nothing to say
            return coarse.new_zeros((self.fine_config.n_fine_codebooks, 0))
        with self._sampling([temperature], [seed], 2, fine=True):
            return self.model.fine_acoustics.generate(  # [1, n_codebooks, frames]
                coarse[None], semantic_generation_config=self.semantic_config,
                coarse_generation_config=self.coarse_config, fine_generation_config=self.fine_config,
                codebook_size=self.codebook_size, history_prompt=history)[0]

    def decode_audio(self, fine: torch.Tensor) -> np.ndarray:
        """fine [n_codebooks, frames] -> float32 audio (frames * hop samples), through EnCodec."""
        if fine.shape[-1] == 0:
            return np.zeros(0, dtype=np.float32)
        wav = self.model.codec_decode(fine[None])  # [1, frames * hop]
        return wav[0].float().cpu().numpy()

    def _run_group(self, items: Sequence[BarkItem], speaker: str | None) -> list[np.ndarray]:
        results = self._generate(items, speaker)
        with self._stage("codec"):
            return [self.decode_audio(r["fine"]) for r in results]

    @contextlib.contextmanager
    def _sampling(self, temperatures: Sequence[float], seeds: Sequence[int], stage: int, fine: bool = False):
        sampler = _RowSampler(temperatures, seeds, stage, self.device)
        if not sampler.active:
            yield
            return
        attr = "_fine_sampler" if fine else "_ar_sampler"
        setattr(self, attr, sampler)
        try:
            yield
        finally:
            setattr(self, attr, None)
