"""The Style-Bert-VITS2 family: an SBV2 model folder (`sbv2:MODEL_DIR`: config.json, one
*.safetensors, style_vectors.npy) with the BERTs of a BERT folder laid out like SBV2's `bert/`
(`bert_dir=`, `--bert-dir`, $VOXSERVE_SBV2_BERT_DIR).

Modules: model (the synthesizer, both variants), loader (the model folder), bert (SbvBert, the
shared component: one per language and device), text (SBV2's JP and EN front ends), voice
(Sbv2Voice, load_sbv2_voice), folder (what a model folder's config says, read without torch),
synthesis (Sbv2Options: what a request says). transformers (the `sbv2` extra) is imported only when a voice
loads. See docs/sbv2.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import VoiceLoadError
from .. import Family, LoadOption, VoiceSource, register_family
from .folder import BERT_DIR_ENV, FRONTEND_LANGUAGES, is_jp_extra, language_codes
from .synthesis import Sbv2Options

NAME = "sbv2"


@dataclass(frozen=True)
class Sbv2RuntimeOptions:
    """How an SBV2 voice runs (not what it says)."""

    threads: int | None = field(default=None, metadata={"help": "CPU intra-op threads for the model (default: PyTorch's)"})
    """CPU intra-op threads (torch.set_num_threads); None leaves PyTorch's default."""
    bert_batch: int = field(default=16, metadata={"help": 'Style-Bert-VITS2: sentences per BERT forward (across requests and voices), 1..64'})
    """Sentences per BERT forward (across requests and voices); 1..64."""

    def validate(self) -> "Sbv2RuntimeOptions":
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be at least 1")
        if not 1 <= self.bert_batch <= 64:
            raise ValueError(f"bert_batch must be in 1..64, not {self.bert_batch!r}")
        return self


def _source(path: Path, name: str | None = None) -> VoiceSource:
    return VoiceSource(name or path.name, NAME, path)


def _is_model_folder(path: Path) -> bool:
    path = path.expanduser()
    return (path / "config.json").is_file() and (path / "style_vectors.npy").is_file()


def _hint(path: Path) -> str | None:
    if _is_model_folder(path):
        return f"{path} is a Style-Bert-VITS2 model folder: use --voice sbv2:{path}"
    return None


def _check(src: VoiceSource) -> None:
    if not _is_model_folder(src.path):
        raise VoiceLoadError(f"{src.path}: not an SBV2 model folder (config.json, *.safetensors, style_vectors.npy)")


def _describe(src: VoiceSource) -> dict:
    try:
        d = json.loads((src.path / "config.json").read_text(encoding="utf-8"))
        data = d.get("data") or {}
        # a loaded multilingual voice speaks those of these whose BERT it finds (load_sbv2_voice)
        return {"languages": language_codes(("JP",) if is_jp_extra(d) else FRONTEND_LANGUAGES),
                "sample_rate": data.get("sampling_rate"),
                "speakers": sorted(data.get("spk2id") or {}, key=lambda k: data["spk2id"][k]),
                "styles": sorted(data.get("style2id") or {}, key=lambda k: data["style2id"][k])}
    except (OSError, ValueError, AttributeError, TypeError):
        return {"error": "unreadable config"}


def _load(src: VoiceSource, *, device="auto", dtype=None, runtime=None, bert_dir=None, **_):
    """`runtime`: an Sbv2RuntimeOptions or None."""
    import torch

    from .voice import load_sbv2_voice

    runtime = (runtime or Sbv2RuntimeOptions()).validate()
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    return load_sbv2_voice(src.path, bert_dir=bert_dir, name=src.name, device=device, dtype=dtype,
                           bert_batch=runtime.bert_batch)


FAMILY = register_family(Family(
    name=NAME,
    load=_load,
    options_type=Sbv2RuntimeOptions,
    synthesis_options=Sbv2Options,
    source=_source,
    prefix="sbv2",
    check=_check,
    describe=_describe,
    hint=_hint,
    frontend="lines and sentence ends, SBV2's normalisation and g2p (JP: pyopenjtalk; EN: CMU "
             "dictionary + g2p_en), its language's shared BERT batched by the engine",
    runner_kind="one-shot",
    load_options=(LoadOption("bert_dir", "Style-Bert-VITS2: the BERT folder, laid out like SBV2's bert/",
                             env=BERT_DIR_ENV),),
))

__all__ = ["FAMILY", "Sbv2Options", "Sbv2RuntimeOptions"]
