"""CosyModel: one CosyVoice 2 model folder loaded on one device (language model, flow, HiFT,
tokenizer), with what the step runner asks of it: prompts and samplers for the decoder, and
token2wav for batches of chunks from different requests.

token2wav follows upstream's CosyVoice2Model.token2wav, per request: the flow runs over the
prompt and the tokens so far (chunk-masked while streaming, full attention for the last chunk),
except that when the model's encoder is chunk-masked too (CosyVoice2-0.5B's is) a streaming
chunk runs the estimator over its new frames only, after the request's `FlowCache` (the same
mel, computed once instead of once a chunk); the chunk's new mel frames go to HiFT after the request's last 8 mel frames, its source keeps
the overlap's samples, and the first 3840 samples cross-fade (Hamming) with the previous
chunk's held-back tail. Rows of a batch are padded and cut back to their own frames (the flow
is causal and masked, so a row's mel is what it gets alone); HiFT, whose convolutions see both
sides, batches only chunks of equal length.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import VoiceLoadError
from ...runtime.allocator import release_free_memory
from ...runtime.sync import host_read, upload
from .config import CosyConfig, load_config
from .flow import CosyFlow, FlowCache, FlowDims
from .folder import load_state_dict, prompt_encoder
from .frontend import load_spk2info
from .hift import HiFT, HiftDims, fold_weight_norm
from .llm import CosyLM, CosyLMDims, length_bounds
from .sampling import RasSampler, ras_pick
from .schedule import ChunkSchedule
from .voice import CosyItem, CosyPrompt

MEL_CACHE = 8  # mel frames of context HiFT gets from the previous chunk
FULL_PASS_FRAMES = 8000  # mel frames one uncached flow pass takes in all (rows split past it: its memory is linear in them)
PREFIX_SPEAKERS = 8  # speakers whose prompt chunks stay cached: a long prompt's are large (docs/cosyvoice2.md)
SPECIALS = ['<|im_start|>', '<|im_end|>', '<|endofprompt|>', '[breath]', '<strong>', '</strong>', '[noise]',
            '[laughter]', '[cough]', '[clucking]', '[accent]', '[quick_breath]', "<laughter>", "</laughter>",
            "[hissing]", "[sigh]", "[vocalized-noise]", "[lipsmack]", "[mn]"]
"""Upstream's tokenizer additions (CosyVoice's paralinguistic marks and prompt separator)."""


@dataclass(eq=False)
class Stream:
    """One sentence's token2wav state (never on the shared model)."""

    prompt: CosyPrompt
    generator: torch.Generator
    speed: float = 1.0
    mel: torch.Tensor | None = None  # [80, 8] the last mel frames
    source: torch.Tensor | None = None  # [1, S] their source samples
    tail: torch.Tensor | None = None  # [S] the held-back samples, to cross-fade
    flow: FlowCache | None = field(default_factory=FlowCache)
    """The flow's cache (cached streaming); None: this stream recomputes its prefix every chunk."""
    calls: list = field(default_factory=list)


class CosyModel:
    def __init__(self, config: CosyConfig, lm: CosyLM, flow: CosyFlow, hift: HiFT, tokenizer, device, dtype,
                 folder: Path):
        self.config, self.lm, self.flow, self.hift = config, lm, flow, hift
        self.tokenizer = tokenizer
        self._tok_lock = threading.Lock()  # HF fast tokenizers are not safe across threads
        self.device = torch.device(device)
        self.dtype = dtype
        self.folder = folder
        self.sample_rate = config.sample_rate
        self.eos = frozenset({lm.dims.eos})
        s = config.sampling
        self._sampling = dict(top_p=float(s.get("top_p", 0.8)), top_k=int(s.get("top_k", 25)),
                              win_size=int(s.get("win_size", 10)), tau_r=float(s.get("tau_r", 0.1)))
        self.samples_per_frame = hift.dims.samples_per_frame
        self.source_cache = MEL_CACHE * self.samples_per_frame
        self.window = torch.from_numpy(np.hamming(2 * self.source_cache).astype(np.float32)).to(self.device)
        self._encoder = None
        # exact only if no encoded frame depends on later tokens: the encoder chunk-masked as well
        fd = flow.dims
        self.cached_streaming = fd.encoder_chunk > 0 and fd.est_chunk == fd.encoder_chunk * fd.token_mel_ratio
        self.flow_cache_budget = _cache_budget(self.device)
        self._prefixes: dict[int, tuple[weakref.ref, FlowCache]] = {}  # id(prompt) -> its whole chunks
        # idle unload: the loaded voices that use it; the three models go when the last one
        # unloads (the tokenizer stays: the voices' front ends and prompts use it)
        self._users: weakref.WeakSet = weakref.WeakSet()
        self._users_lock = threading.Lock()

    # ---------------------------------------------------------------- idle unload
    @property
    def loaded(self) -> bool:
        return self.lm is not None

    def acquire(self, user: object) -> None:
        """`user` (a loaded voice) runs this model: its weights are read again from the folder
        (same device and dtype) if no loaded voice held them."""
        with self._users_lock:
            if self.lm is None:
                _, self.lm, self.flow, self.hift = _load_parts(self.folder, str(self.device), self.dtype)
            self._users.add(user)

    def release(self, user: object) -> None:
        """`user` unloaded: the language model, flow, HiFT, the prompt encoder and the cached
        prompt chunks go once no loaded voice uses them (the caller makes sure that nothing
        runs them meanwhile). Prompts (CosyPrompt) are the voices': they stay."""
        with self._users_lock:
            self._users.discard(user)
            if self._users or self.lm is None:
                return
            self.lm = self.flow = self.hift = self._encoder = None
            self._prefixes = {}
            gc.collect()  # the modules hold reference cycles
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            release_free_memory()

    # ---------------------------------------------------------------- text
    def tokenize(self, text: str) -> list[int]:
        with self._tok_lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

    @staticmethod
    def length_bounds(n_text: int, n_prompt_text: int = 0) -> tuple[int, int]:
        return length_bounds(n_text)

    def audio_tokens(self, seconds: float, speed: float = 1.0) -> int:
        """Speech tokens whose audio lasts at most `seconds` at `speed` (the final chunk's mel
        is stretched by 1/speed)."""
        return int(seconds * speed * self.sample_rate // self.config.samples_per_token)

    def audio_seconds(self, tokens: int, speed: float = 1.0) -> float:
        return tokens * self.config.samples_per_token / self.sample_rate / speed

    # ---------------------------------------------------------------- prompts
    def prompt_from_features(self, name: str, f) -> CosyPrompt:
        """A CosyPrompt from frontend.PromptFeatures (its transcript tokenised here unless the
        features carry the tokens, as saved speakers do)."""
        ids = f.prompt_text_tokens
        if ids is None:
            ids = self.tokenize(f.prompt_text) if f.prompt_text else []
        dev = self.device
        return CosyPrompt(name, torch.as_tensor(np.asarray(ids), dtype=torch.long).to(dev),
                          torch.as_tensor(f.speech_tokens, dtype=torch.long).to(dev),
                          torch.as_tensor(f.speech_feat, dtype=torch.float32).to(dev),
                          torch.as_tensor(f.embedding, dtype=torch.float32).to(dev))

    def saved_speakers(self) -> dict[str, CosyPrompt]:
        path = self.folder / "spk2info.pt"
        if not path.is_file():
            return {}
        return {name: self.prompt_from_features(name, f) for name, f in load_spk2info(path).items()}

    def encode_prompt(self, name: str, wave: np.ndarray, sample_rate: int, text: str) -> CosyPrompt:
        return self.prompt_from_features(name, self.prompt_features(wave, sample_rate, text))

    def prompt_features(self, wave: np.ndarray, sample_rate: int, text: str):
        """frontend.PromptFeatures of a prompt recording and its transcript (the folder's ONNX models)."""
        enc = self._encoder  # (read once: an unload may drop it meanwhile)
        if enc is None:
            enc = self._encoder = prompt_encoder(self.folder)
        return replace(enc.encode(wave, sample_rate), prompt_text=text)

    # ---------------------------------------------------------------- the language model
    def prompt(self, item: CosyItem) -> torch.Tensor:
        p = item.prompt
        text = p.text_ids if item.lm_prompt_ids is None else item.lm_prompt_ids.to(self.device)
        speech = p.speech_tokens if item.lm_speech else p.speech_tokens[:0]
        return self.lm.prompt_embeddings(item.text_ids.to(self.device), text, speech)

    def sampler(self, item: CosyItem) -> RasSampler:
        return RasSampler(item.seed, self.lm.dims.eos, item.min_tokens, device=self.device, **self._sampling)

    def lm_forward(self, input_ids, inputs_embeds, attention_mask, position_ids, cache):
        return self.lm(input_ids, inputs_embeds, attention_mask, position_ids, cache)

    def next_input(self, seq, token: int) -> torch.Tensor:
        return self.lm.speech_embedding.weight[token]

    def pick(self, seqs, scores: torch.Tensor) -> torch.Tensor:
        return ras_pick(scores.log_softmax(-1), [s.sampler for s in seqs], [s.tokens for s in seqs])

    # ---------------------------------------------------------------- token2wav
    def start_stream(self, item: CosyItem) -> Stream:
        g = torch.Generator(device=self.device)
        g.manual_seed((item.seed * 7 + 1) & ((1 << 63) - 1))
        return Stream(item.prompt, g, item.speed)

    def _prompt_prefix(self, prompt: CosyPrompt) -> FlowCache:
        """A new stream's flow cache: the prompt's whole chunks, computed once per speaker (they
        are the same for every sentence: same tokens, mel, embedding and noise), shared."""
        hit = self._prefixes.pop(id(prompt), None)
        if hit is not None and hit[0]() is prompt:
            self._prefixes[id(prompt)] = hit  # the most recent last
            return hit[1].copy()
        chunk = self.flow.dims.est_chunk // self.flow.dims.token_mel_ratio
        whole = (prompt.n_speech_tokens - self.flow.dims.lookahead) // chunk * chunk  # look-ahead inside the prompt
        cache = FlowCache()
        if whole > 0:
            self.flow.chunk(prompt.speech_tokens[None, : whole + self.flow.dims.lookahead],
                            [whole + self.flow.dims.lookahead], prompt.speech_feat[None], [len(prompt.speech_feat)],
                            prompt.embedding[None], [cache])
        live = [(k, v) for k, v in self._prefixes.items() if v[0]() is not None]
        self._prefixes = dict(live[-(PREFIX_SPEAKERS - 1):])
        self._prefixes[id(prompt)] = (weakref.ref(prompt), cache)
        return cache.copy()

    def chunk_schedule(self, prompt_tokens: int) -> ChunkSchedule:
        """A request's chunk grid: the estimator's chunk in tokens, and the encoder's look-ahead."""
        d = self.flow.dims
        return ChunkSchedule(prompt_tokens, chunk=d.est_chunk // d.token_mel_ratio, lookahead=d.lookahead)

    def token2wav(self, jobs: Sequence[tuple]) -> list[np.ndarray]:
        """jobs: (stream, tokens (list), offset, end, final, streaming) -> each job's new audio.
        Non-final: tokens [offset, end) become audio, reading `lookahead` tokens past end."""
        la = self.flow.dims.lookahead
        mels: list[torch.Tensor | None] = [None] * len(jobs)
        groups: dict[tuple, list[int]] = {}
        for k, (st, _, _, _, final, streaming) in enumerate(jobs):
            masked = streaming and not final
            cached = masked and self.cached_streaming and st.flow is not None
            if cached and st.flow.frames == 0:
                st.flow = self._prompt_prefix(st.prompt)
            groups.setdefault((final, masked, cached), []).append(k)
        for (final, masked, cached), idx in self._passes(groups, jobs):
            rows = []
            for k in idx:
                st, toks, off, end, _, _ = jobs[k]
                have = end if final else end + la
                rows.append(torch.cat([st.prompt.speech_tokens, upload(toks[:have], torch.long, self.device)]))
            # lengths stay on the host (the flow slices by them), as do the frame counts it returns
            lengths = [len(r) for r in rows]
            tokens = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
            feats = [jobs[k][0].prompt.speech_feat for k in idx]
            pf = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
            pframes = [len(f) for f in feats]
            emb = torch.stack([jobs[k][0].prompt.embedding for k in idx])
            if cached:
                caches = [jobs[k][0].flow for k in idx]
                starts = [c.frames for c in caches]
                mel, new = self.flow.chunk(tokens, lengths, pf, pframes, emb, caches)
                for j, k in enumerate(idx):
                    # the first chunk's new frames begin with the prompt's
                    skip = pframes[j] + jobs[k][2] * self.config.token_mel_ratio - starts[j]
                    mels[k] = mel[j, :, skip:new[j]].float()
                continue
            mel, frames = self.flow(tokens, lengths, pf, pframes, emb, masked, final)
            for j, k in enumerate(idx):
                off = jobs[k][2]
                start = pframes[j] + off * self.config.token_mel_ratio
                mels[k] = mel[j, :, start:frames[j]].float()
        return self._vocode(jobs, mels)

    def _passes(self, groups: dict[tuple, list[int]], jobs) -> list[tuple[tuple, list[int]]]:
        """The flow calls of a batch: a cached group in one; an uncached one (last chunks, and
        streams past the cache budget: each a whole pass over its sentence) in runs of at most
        FULL_PASS_FRAMES frames (at least one row each), so that rows ending together do not
        make one pass of all their frames."""
        out = []
        for key, idx in groups.items():
            if key[2]:
                out.append((key, idx))
                continue
            run, frames = [], 0
            for k in idx:
                st, toks, _, end, final, _ = jobs[k]
                n = (st.prompt.n_speech_tokens + end + (0 if final else self.flow.dims.lookahead)) * self.config.token_mel_ratio
                if run and frames + n > FULL_PASS_FRAMES:
                    out.append((key, run))
                    run, frames = [], 0
                run.append(k)
                frames += n
            out.append((key, run))
        return out

    def _vocode(self, jobs, mels) -> list[np.ndarray]:
        inputs = []
        for (st, _, _, _, final, _), mel in zip(jobs, mels):
            if final and st.speed != 1.0:
                mel = F.interpolate(mel[None], size=int(mel.shape[-1] / st.speed), mode="linear")[0]
            if st.mel is not None:
                mel = torch.cat([st.mel, mel], dim=1)
            inputs.append(mel)
        out: list[torch.Tensor | None] = [None] * len(jobs)
        by_len: dict[int, list[int]] = {}
        for k, m in enumerate(inputs):
            by_len.setdefault(m.shape[-1], []).append(k)
        for _, idx in by_len.items():
            mel = torch.stack([inputs[k] for k in idx])
            cache = [jobs[k][0].source for k in idx]
            n = 0 if cache[0] is None else cache[0].shape[-1]
            if any((c is None) != (cache[0] is None) or (c is not None and c.shape[-1] != n) for c in cache):
                parts = [self._hift_rows([inputs[k]], [jobs[k][0]]) for k in idx]
                waves = [p[0] for p in parts]
            else:
                waves = self._hift_rows([inputs[k] for k in idx], [jobs[k][0] for k in idx])
            for k, (wave, source) in zip(idx, waves):
                st, final = jobs[k][0], jobs[k][4]
                if st.tail is not None:
                    s = self.source_cache
                    wave = wave.clone()
                    wave[:s] = wave[:s] * self.window[:s] + st.tail * self.window[s:]
                if not final:
                    st.mel, st.source = inputs[k][:, -MEL_CACHE:], source[:, -self.source_cache:]
                    st.tail = wave[-self.source_cache:]
                    wave = wave[: -self.source_cache]
                out[k] = wave
        # the batch's one device->host copy: every chunk's audio, concatenated on the device
        host = host_read(torch.cat(out), "token2wav batch: the chunks' audio").numpy()
        ends = np.cumsum([len(w) for w in out])
        return [host[e - len(w):e] for w, e in zip(out, ends)]

    def _hift_rows(self, mels: list[torch.Tensor], streams: list[Stream]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """HiFT on equal-length mels, each row's source from its own generator."""
        sources = []
        for mel, st in zip(mels, streams):
            s = self.hift.source(mel[None], st.generator)  # [1, 1, L]
            if st.source is not None:
                s[:, :, : st.source.shape[-1]] = st.source
            sources.append(s)
        wave = self.hift.decode(torch.stack(mels), torch.cat(sources))
        return [(wave[j], sources[j][0]) for j in range(len(mels))]


def _cache_budget(device: torch.device) -> int:
    """Bytes the streams' flow caches may hold together: a quarter of the GPU's memory, an
    eighth of the host's. Past it the largest caches are dropped (those streams recompute
    their prefix each chunk, as upstream; the audio is the same)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 4
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 8
    except (ValueError, OSError, AttributeError):
        return 1 << 30


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise VoiceLoadError(f"{folder}: cannot load the text tokenizer: {e}") from None
    tok.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                            "additional_special_tokens": SPECIALS})
    return tok


def _load_part(module, sd: dict, path: Path, ignore: tuple[str, ...] = ()) -> None:
    own = module.state_dict()
    missing = [k for k in own if k not in sd and not k.endswith(ignore)]
    unexpected = [k for k in sd if k not in own and not k.endswith(ignore)]
    if missing or unexpected:
        raise VoiceLoadError(f"{path}: not this model's weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for k, v in sd.items():
        if k in own and tuple(v.shape) != tuple(own[k].shape):
            raise VoiceLoadError(f"{path}: tensor {k} has shape {tuple(v.shape)}; the config gives {tuple(own[k].shape)}")
    module.load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False)


def load_model(folder: Path, device: str = "cpu", dtype: str | None = None) -> CosyModel:
    """Build the three models from the folder's config and weights (no download, no pickle)."""
    config, lm, flow, hift = _load_parts(folder, device, dtype)
    return CosyModel(config, lm, flow, hift, _tokenizer(folder / "CosyVoice-BlankEN"), device, dtype, folder)


def _load_parts(folder: Path, device: str, dtype: str | None) -> tuple[CosyConfig, CosyLM, CosyFlow, HiFT]:
    import transformers

    if dtype not in (None, "fp32"):
        raise VoiceLoadError(f"CosyVoice 2 voices run in fp32 here; dtype {dtype!r} is not supported yet")
    config = load_config(folder / "cosyvoice2.yaml")
    blank = folder / "CosyVoice-BlankEN"
    try:
        qcfg = transformers.Qwen2Config.from_pretrained(blank, local_files_only=True)
    except (OSError, ValueError) as e:
        raise VoiceLoadError(f"{blank}/config.json: {e}") from None
    sd = load_state_dict(folder / "llm.pt")
    try:
        dims = CosyLMDims.from_state_dict(sd)
    except (KeyError, ValueError) as e:
        raise VoiceLoadError(f"{folder / 'llm.pt'}: {e}") from None
    if dims.hidden != qcfg.hidden_size:
        raise VoiceLoadError(f"{folder / 'llm.pt'}: hidden size {dims.hidden}, but {blank}/config.json says {qcfg.hidden_size}")
    from transformers.initialization import no_init_weights

    qcfg._attn_implementation = "sdpa"
    with no_init_weights():  # every weight comes from llm.pt
        qwen = transformers.Qwen2ForCausalLM(qcfg)
    lm = CosyLM(dims, qwen)
    _load_part(lm, sd, folder / "llm.pt", ignore=("lm_head.weight",))
    try:
        flow = CosyFlow(FlowDims.from_config(config.flow))
        hift = HiFT(HiftDims.from_config(config.hift))
    except (KeyError, ValueError, TypeError) as e:
        raise VoiceLoadError(f"{folder / 'cosyvoice2.yaml'}: {e}") from None
    _load_part(flow, load_state_dict(folder / "flow.pt"), folder / "flow.pt")
    try:
        hsd = fold_weight_norm({k.removeprefix("generator."): v for k, v in load_state_dict(folder / "hift.pt").items()})
    except KeyError as e:
        raise VoiceLoadError(f"{folder / 'hift.pt'}: {e}") from None
    _load_part(hift, hsd, folder / "hift.pt")
    for m in (lm, flow, hift):
        m.to(device).eval().requires_grad_(False)
    return config, lm, flow, hift
