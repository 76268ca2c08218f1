"""SBV2's BERT feature extractor as a shared component: one per language and device, shared by
every SBV2 voice on that device, run by the engine as a stage batched across requests and voices.

What it computes is SBV2's (tests/fixtures/sbv2/README.md): the sentence's BERT text tokenised
with CLS/SEP, `hidden_states[-3]` of the model, and token i's vector repeated word2ph[i] times,
giving [1024, T_phones] for the synthesizer. Unlike SBV2, the sentences of a call are tokenised
into ONE padded batch (attention mask) and run in one forward (the encoder trimmed after the
layer whose output is hidden_states[-3]: the same numbers, two layers fewer), and the expansion
to phones runs on the device (`repeat_interleave` with its output size given, so no sync); the
features are returned as device tensors: nothing is copied to the host.

BERT_ROOT is laid out like SBV2's `bert/` folder: one Hugging Face model folder per BERT, named as
SBV2 names them (BERT_FOLDERS). Loaded as SBV2 loads them (JP and ZH with AutoModelForMaskedLM and
AutoTokenizer, EN with DebertaV2Model and DebertaV2Tokenizer); only the base model runs (the
hidden states are the base model's; the masked-LM head is never needed).
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ...errors import InvalidInputError, VoiceLoadError
from ...runtime.device import resolve_device, resolve_dtype
from ...voice import SharedComponent

BERT_FOLDERS = {
    "JP": "deberta-v2-large-japanese-char-wwm",
    "EN": "deberta-v3-large",
    "ZH": "chinese-roberta-wwm-ext-large",
}
BERT_DIM = 1024
HIDDEN_LAYER = -3  # SBV2 takes hidden_states[-3]
MAX_BATCH_LIMIT = 64
DEFAULT_MAX_BATCH = 16


def normalise_device(device: str | torch.device) -> torch.device:
    """resolve_device's, with `cuda` -> `cuda:<current>`, so "cuda" and "cuda:0" name one device
    (one shared BERT)."""
    d = resolve_device(device)
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def bert_folder(bert_root: str | Path, language: str) -> Path:
    """BERT_ROOT/<SBV2's folder name for the language>, resolved; VoiceLoadError if absent."""
    if language not in BERT_FOLDERS:
        raise VoiceLoadError(f"SBV2 BERT: unknown language {language!r} (one of {sorted(BERT_FOLDERS)})")
    folder = (Path(bert_root) / BERT_FOLDERS[language]).resolve()
    if not (folder / "config.json").is_file():
        raise VoiceLoadError(f"SBV2 {language} BERT: no model folder at {folder} (expected "
                             f"BERT_ROOT/{BERT_FOLDERS[language]}/ with config.json, weights and "
                             "tokenizer files)")
    return folder


def bert_key(language: str, folder: str | Path, device: str | torch.device) -> tuple:
    """The shared-component key: voices naming it on one device share one instance."""
    return ("sbv2-bert", language, str(Path(folder).resolve()), str(normalise_device(device)))


def _load(folder: Path, language: str):
    import transformers

    try:
        if language == "EN":
            tokenizer = transformers.DebertaV2Tokenizer.from_pretrained(str(folder))
            model = transformers.DebertaV2Model.from_pretrained(str(folder))
        else:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
            model = transformers.AutoModelForMaskedLM.from_pretrained(str(folder))
    except Exception as e:  # a missing file, a tokenizer dependency (sentencepiece for EN), ...
        raise VoiceLoadError(f"SBV2 {language} BERT: cannot load {folder}: {e}") from e
    return tokenizer, model


class SbvBert(SharedComponent):
    """One language's BERT on one device and dtype.

    `run(inputs)`: each input is `(bert_text, word2ph)` for one sentence (word2ph: phones per
    token, CLS and SEP included, so len(word2ph) is the sentence's token count); returns one
    [1024, sum(word2ph)] tensor per input, on the device, in `output_dtype`. An input that cannot
    run does not fail its batch mates (other requests, other voices): its output is the error
    instead (ValueError: a word2ph that does not fit the token count; InvalidInputError: more
    tokens than a model with absolute positions takes), which the voice's
    `with_component_output` raises, failing that request only."""

    def __init__(self, folder: str | Path, language: str, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype | None = torch.float32, *, max_batch: int = DEFAULT_MAX_BATCH,
                 output_dtype: torch.dtype = torch.float32, trim_layers: bool = True):
        if not 1 <= int(max_batch) <= MAX_BATCH_LIMIT:
            raise ValueError(f"max_batch must be 1..{MAX_BATCH_LIMIT}, not {max_batch}")
        self.language = language
        self.folder = Path(folder).resolve()
        self.device = normalise_device(device)
        self.dtype = dtype = resolve_dtype(dtype, self.device)  # fp16: CUDA only
        self.output_dtype = output_dtype
        self.max_batch = int(max_batch)
        self.key = bert_key(language, self.folder, self.device)
        self.trim_layers = trim_layers
        self.tokenizer, model = _load(self.folder, language)
        self.tokenizer.padding_side = "right"  # run() takes each row's first n positions
        self._tokenizer_lock = threading.Lock()  # library callers may share it across threads
        # idle unload: the loaded voices that use it; its weights go when the last one unloads
        # (the tokenizer stays: the voices' front ends split words with it)
        self._users: weakref.WeakSet = weakref.WeakSet()
        self._users_lock = threading.Lock()
        self.model = self._prepare(model)

    def _prepare(self, model) -> torch.nn.Module:
        """The loaded masked-LM or base model -> the base model to run, trimmed, on the device."""
        language = self.language
        hidden = model.config.hidden_size
        if hidden != BERT_DIM:
            raise VoiceLoadError(f"SBV2 {language} BERT {self.folder}: hidden_size {hidden}, the "
                                 f"synthesizer's BERT projection needs {BERT_DIM}")
        # absolute position embeddings (BERT) bound the tokens; DeBERTa's relative ones do not
        absolute = getattr(model.config, "position_biased_input", True)
        self.max_tokens = int(model.config.max_position_embeddings) if absolute else None
        base = model.base_model
        # hidden_states[-3] is the output of encoder layer n-2 (hidden_states[0] is the embeddings,
        # and neither DeBERTa-v2 nor BERT has anything between its layers and its output): so the
        # last two layers never need to run, nor be kept, and no other layer's states are stored.
        layers = getattr(getattr(base, "encoder", None), "layer", None)
        keep = len(layers) + 1 + HIDDEN_LAYER if isinstance(layers, torch.nn.ModuleList) else 0
        self.trimmed = bool(self.trim_layers and keep >= 1)
        if self.trimmed:
            base.encoder.layer = layers[:keep]
            base.config.num_hidden_layers = keep
        base = base.eval().to(device=self.device, dtype=self.dtype)
        base.requires_grad_(False)
        return base

    # ------------------------------------------------------------------ idle unload
    @property
    def loaded(self) -> bool:
        return self.model is not None

    def acquire(self, user: object) -> None:
        """`user` (a loaded voice) runs this BERT: its weights are loaded again if no loaded
        voice held them."""
        with self._users_lock:
            if self.model is None:
                self.model = self._prepare(_load(self.folder, self.language)[1])
            self._users.add(user)

    def release(self, user: object) -> None:
        """`user` unloaded: the weights go once no loaded voice uses them (the caller makes
        sure that no input of theirs is queued for it)."""
        with self._users_lock:
            self._users.discard(user)
            if self._users or self.model is None:
                return
            self.model = None
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def tokenize(self, texts: Sequence[str]) -> tuple[dict[str, list[list[int]]], list[int]]:
        """Each text's token ids (CLS/SEP included), unpadded, and their counts (host only)."""
        with self._tokenizer_lock:
            enc = self.tokenizer(list(texts))
        return dict(enc), [len(ids) for ids in enc["input_ids"]]

    def tokenize_words(self, text: str) -> list[str]:
        """The tokenizer's pieces of one text (the front end's word split), under the same lock
        as the worker's batch tokenisation."""
        with self._tokenizer_lock:
            return self.tokenizer.tokenize(text)

    def pad(self, enc: dict[str, list[list[int]]], rows: Sequence[int]) -> dict[str, torch.Tensor]:
        """Rows of `tokenize`'s output as one right-padded batch with its attention mask (host)."""
        with self._tokenizer_lock:
            return dict(self.tokenizer.pad({k: [v[r] for r in rows] for k, v in enc.items()},
                                           padding=True, return_tensors="pt"))

    def check(self, text: str, w2p: Sequence[int], n_tokens: int) -> Exception | None:
        """Why an input cannot run (None: it can)."""
        if len(w2p) != n_tokens:
            return ValueError(f"SBV2 {self.language} BERT: word2ph has {len(w2p)} entries but the "
                              f"text {text!r} has {n_tokens} tokens (CLS and SEP included)")
        if any(x < 0 for x in w2p):
            return ValueError(f"SBV2 {self.language} BERT: negative word2ph entry for {text!r}")
        if self.max_tokens is not None and n_tokens > self.max_tokens:
            return InvalidInputError(f"SBV2 {self.language} BERT: a sentence of {n_tokens} tokens; "
                                     f"its BERT takes at most {self.max_tokens}: {text[:40]!r}...")
        return None

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor | Exception]:
        if len(inputs) > self.max_batch:
            raise ValueError(f"SBV2 BERT: {len(inputs)} inputs in one call, max_batch is {self.max_batch}")
        texts = [str(t) for t, _ in inputs]
        w2ps = [[int(n) for n in w] for _, w in inputs]
        enc, lengths = self.tokenize(texts) if texts else ({}, [])
        out: list[torch.Tensor | Exception | None] = [
            self.check(t, w, n) for t, w, n in zip(texts, w2ps, lengths)]
        ok = [k for k, e in enumerate(out) if e is None]
        if not ok:
            return out
        # the good ones in one batch, padded to their longest
        batch = {k: v.to(self.device, non_blocking=True) for k, v in self.pad(enc, ok).items()}
        with torch.no_grad():
            if self.trimmed:  # [B, L, 1024] on the device
                hidden = self.model(**batch).last_hidden_state
            else:
                hidden = self.model(**batch, output_hidden_states=True).hidden_states[HIDDEN_LAYER]
            if hidden.dtype != self.output_dtype:
                hidden = hidden.to(self.output_dtype)
            for row, k in enumerate(ok):
                w2p, n = w2ps[k], lengths[k]
                reps = torch.tensor(w2p, dtype=torch.long).to(self.device, non_blocking=True)
                # output_size given: CUDA needs no sync to size the result
                x = torch.repeat_interleave(hidden[row, :n], reps, dim=0, output_size=sum(w2p))
                out[k] = x.T  # [1024, T_phones]
        return out


# ------------------------------------------------------------------ one per device, per process
_shared: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def shared_bert(bert_root: str | Path, language: str, device: str | torch.device = "cpu",
                dtype: str | torch.dtype | None = torch.float32, **kw) -> SbvBert:
    """The process's SbvBert for (BERT folder, language, device): loaded on first use, the same
    instance afterwards (thread-safe), for as long as a voice holds it. A second request for the
    same BERT on the same device in another dtype raises (one instance per key and device)."""
    folder = bert_folder(bert_root, language)
    key = bert_key(language, folder, device)
    dtype = resolve_dtype(dtype, normalise_device(device))
    with _shared_lock:
        bert = _shared.get(key)
        if bert is None:
            bert = SbvBert(folder, language, device, dtype, **kw)
            _shared[key] = bert
        elif bert.dtype != dtype:
            raise VoiceLoadError(f"SBV2 {language} BERT {folder} is already loaded on {bert.device} "
                                 f"in {bert.dtype}; load every SBV2 voice on that device in one BERT "
                                 f"dtype, not {dtype}")
        return bert
