"""Load an SBV2 model folder onto voxserve's PyTorch synthesizer (model.py).

A folder as users have it: `config.json`, one `*.safetensors` (net_g as SBV2's
`save_safetensors` writes it: fp32, decoder weights in weight-norm `weight_g`/`weight_v` form,
an int64 `iteration`), `style_vectors.npy` (float32 [num_styles, 256], row 0 the mean).

Dims come from config.json, completed from tensor shapes where the config does not say
(`n_layers_trans_flow`, which SBV2 leaves to class defaults; the flows' count). Then every
tensor is checked against the model built from those dims: a missing key, a key the model does
not have, or a shape that does not fit raises VoiceLoadError naming it. Weight norm is folded
at load (w = g * v / ||v||, norm over all dims but 0, as torch's weight_norm dim 0).

Keys that are SBV2's but never run at inference are skipped on purpose, not silently any key:
`iteration`, the posterior encoder `enc_q.*` (full checkpoints), the stochastic duration
predictor's posterior `sdp.post_*` and its first flow `sdp.flows.1.*` (VITS skips it in reverse).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...errors import VoiceLoadError
from .folder import is_jp_extra
from .model import STYLE_DIM, Sbv2Dims, Sbv2Synthesizer

IGNORED_KEYS = re.compile(r"^(iteration$|enc_q\.|sdp\.post_|sdp\.flows\.1\.)")
# SBV2's class defaults (config.json does not set them)
FLOW_LAYERS_DEFAULT = {True: 6, False: 4}


@dataclass
class Sbv2Checkpoint:
    """What a model folder holds, loaded: the fp32 CPU model (eval) and its metadata."""

    model: Sbv2Synthesizer
    config: dict
    folder: Path
    weights_path: Path
    spk2id: dict[str, int]
    style2id: dict[str, int]
    style_vectors: np.ndarray  # float32 [num_styles, 256]
    sample_rate: int
    add_blank: bool
    version: str = ""
    ignored_keys: list[str] = field(default_factory=list)

    @property
    def dims(self) -> Sbv2Dims:
        return self.model.dims

    @property
    def jp_extra(self) -> bool:
        return self.model.dims.jp_extra

    def style_vector(self, style: int | str, weight: float = 1.0) -> np.ndarray:
        if isinstance(style, str):
            if style not in self.style2id:
                raise KeyError(f"unknown style {style!r}; styles: {', '.join(self.style2id)}")
            style = self.style2id[style]
        return style_vector(self.style_vectors, style, weight)


def style_vector(vectors: np.ndarray, style_id: int, weight: float = 1.0) -> np.ndarray:
    """SBV2's rule: mean + (v[style_id] - mean) * weight, with mean = row 0. -> float32 [256]."""
    if not 0 <= int(style_id) < len(vectors):
        raise IndexError(f"style id {style_id} out of range: {len(vectors)} styles")
    mean = vectors[0]
    return (mean + (vectors[int(style_id)] - mean) * np.float32(weight)).astype(np.float32)


# --------------------------------------------------------------------------- files


def find_weights(folder: Path) -> Path:
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise VoiceLoadError(f"{folder}: no *.safetensors file (SBV2's net_g weights)")
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise VoiceLoadError(f"{folder}: several *.safetensors files ({names}); keep one or name it")
    return found[0]


def read_config(path: Path) -> dict:
    if not path.is_file():
        raise VoiceLoadError(f"{path}: config.json not found")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VoiceLoadError(f"{path}: not a readable JSON config ({e})") from e
    for section in ("data", "model"):
        if not isinstance(cfg.get(section), dict):
            raise VoiceLoadError(f"{path}: config has no {section!r} section")
    return cfg


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (OSError, SafetensorError, ValueError) as e:
        raise VoiceLoadError(f"{path}: not a readable safetensors file ({e})") from e


def read_style_vectors(path: Path, n_styles: int | None) -> np.ndarray:
    if not path.is_file():
        raise VoiceLoadError(f"{path}: style_vectors.npy not found")
    try:
        v = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise VoiceLoadError(f"{path}: not a readable .npy file ({e})") from e
    if v.ndim != 2 or v.shape[1] != STYLE_DIM:
        raise VoiceLoadError(f"{path}: style vectors have shape {list(v.shape)}, expected [num_styles, {STYLE_DIM}]")
    if n_styles is not None and v.shape[0] != n_styles:
        raise VoiceLoadError(f"{path}: {v.shape[0]} style vectors, but config.json has {n_styles} styles (style2id)")
    return np.ascontiguousarray(v, dtype=np.float32)


# --------------------------------------------------------------------------- dims


def _cfg(section: dict, key: str, where: str):
    if key not in section:
        raise VoiceLoadError(f"{where}: config.json has no {key!r}")
    return section[key]


def _count(tensors: dict, pattern: str) -> int:
    rx = re.compile(pattern)
    return len({m.group(1) for k in tensors if (m := rx.match(k))})


def _shape(tensors: dict, key: str, where: str) -> list[int]:
    if key not in tensors:
        raise VoiceLoadError(f"{where}: missing tensor {key}")
    return list(tensors[key].shape)


def dims_from(cfg: dict, tensors: dict[str, torch.Tensor], where: str) -> Sbv2Dims:
    data, m = cfg["data"], cfg["model"]
    jp_extra = is_jp_extra(cfg)
    if m.get("use_transformer_flow", True) is False:  # SBV2's default and every released model: True
        raise VoiceLoadError(f"{where}: config.json model.use_transformer_flow is false (a WaveNet flow): not supported")
    if int(m.get("n_speakers", data.get("n_speakers", 1)) or 0) < 1:
        raise VoiceLoadError(f"{where}: config.json data.n_speakers < 1 (a reference-encoder model): not supported")
    emb = _shape(tensors, "enc_p.emb.weight", where)
    tone = _shape(tensors, "enc_p.tone_emb.weight", where)
    lang = _shape(tensors, "enc_p.language_emb.weight", where)
    emb_g = _shape(tensors, "emb_g.weight", where)
    dp1 = _shape(tensors, "dp.conv_1.weight", where)
    hidden = int(_cfg(m, "hidden_channels", where))
    n_heads = int(_cfg(m, "n_heads", where))
    rel = _shape(tensors, "enc_p.encoder.attn_layers.0.emb_rel_k", where)
    flow_layers = _count(tensors, r"^flow\.flows\.0\.enc\.attn_layers\.(\d+)\.")
    flow_ffn = _shape(tensors, "flow.flows.0.enc.ffn_layers.0.conv_1.weight", where)
    n_flows = _count(tensors, r"^flow\.flows\.(\d+)\.")
    n_speakers = int(_cfg(data, "n_speakers", where))
    if n_speakers != emb_g[0]:
        raise VoiceLoadError(
            f"{where}: tensor emb_g.weight has {emb_g[0]} speakers, config.json data.n_speakers is {n_speakers}"
        )
    try:
        dims = Sbv2Dims(
            jp_extra=jp_extra,
            n_vocab=emb[0], n_tones=tone[0], n_languages=lang[0],
            hidden_channels=hidden,
            filter_channels=int(_cfg(m, "filter_channels", where)),
            n_heads=n_heads,
            n_layers=int(_cfg(m, "n_layers", where)),
            kernel_size=int(_cfg(m, "kernel_size", where)),
            window_size=(rel[1] - 1) // 2,
            inter_channels=int(_cfg(m, "inter_channels", where)),
            dp_filter_channels=dp1[0],
            dp_kernel_size=dp1[2],
            flow_n_flows=n_flows or 4,
            flow_n_layers=int(m.get("n_layers_trans_flow", flow_layers or FLOW_LAYERS_DEFAULT[jp_extra])),
            flow_kernel_size=flow_ffn[2],  # 5 in SBV2 (hard-coded there)
            resblock=str(_cfg(m, "resblock", where)),
            resblock_kernel_sizes=tuple(int(k) for k in _cfg(m, "resblock_kernel_sizes", where)),
            resblock_dilation_sizes=tuple(tuple(int(d) for d in ds) for ds in _cfg(m, "resblock_dilation_sizes", where)),
            upsample_rates=tuple(int(u) for u in _cfg(m, "upsample_rates", where)),
            upsample_initial_channel=int(_cfg(m, "upsample_initial_channel", where)),
            upsample_kernel_sizes=tuple(int(k) for k in _cfg(m, "upsample_kernel_sizes", where)),
            n_speakers=n_speakers,
            gin_channels=int(_cfg(m, "gin_channels", where)),
            spk_conditioned_encoder=bool(m.get("use_spk_conditioned_encoder", True)),
        )
    except (TypeError, ValueError) as e:
        raise VoiceLoadError(f"{where}: config.json model section does not describe a model ({e})") from e
    if dims.hidden_channels % dims.n_heads:
        raise VoiceLoadError(f"{where}: hidden_channels {hidden} is not a multiple of n_heads {n_heads}")
    hop = data.get("hop_length")
    if hop is not None and int(hop) != dims.hop_length:
        raise VoiceLoadError(
            f"{where}: config.json data.hop_length {hop} != prod(model.upsample_rates) {dims.hop_length}"
        )
    if dims.resblock not in ("1", "2"):
        raise VoiceLoadError(f"{where}: config.json model.resblock {dims.resblock!r} is not '1' or '2'")
    return dims


# --------------------------------------------------------------------------- weights


def fold_weight_norm(tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """X.weight_g + X.weight_v -> X.weight = v * (g / ||v||), norm over all dims but 0."""
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        if k.endswith(".weight_g"):
            continue
        if k.endswith(".weight_v"):
            base = k[: -len("_v")]
            gk = base + "_g"
            if gk not in tensors:
                raise VoiceLoadError(f"{where}: tensor {k} has no {gk} (weight norm needs both)")
            g = tensors[gk].float()
            vv = v.float()
            if g.numel() != vv.shape[0] or g.dim() != vv.dim():
                raise VoiceLoadError(
                    f"{where}: tensor {gk} has shape {list(g.shape)}, does not fit {k} {list(vv.shape)}"
                )
            norm = torch.linalg.vector_norm(vv.reshape(vv.shape[0], -1), dim=1).view(g.shape)
            out[base] = vv * (g / norm)
            continue
        out[k] = v
    for k in tensors:
        if k.endswith(".weight_g") and k[: -len("_g")] + "_v" not in tensors:
            raise VoiceLoadError(f"{where}: tensor {k} has no {k[: -len('_g')]}_v (weight norm needs both)")
    return out


def load_state(model: Sbv2Synthesizer, tensors: dict[str, torch.Tensor], where: str) -> list[str]:
    """Check every tensor against the model (names and shapes), then load. -> ignored keys."""
    ignored = sorted(k for k in tensors if IGNORED_KEYS.match(k))
    state = fold_weight_norm({k: v for k, v in tensors.items() if not IGNORED_KEYS.match(k)}, where)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise VoiceLoadError(f"{where}: unexpected tensor {unexpected[0]}{more}: this model has no such parameter")
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise VoiceLoadError(f"{where}: missing tensor {missing[0]}{more}")
    for k, t in state.items():
        if tuple(t.shape) != tuple(expected[k].shape):
            raise VoiceLoadError(
                f"{where}: tensor {k} has shape {list(t.shape)}, the model built from config.json "
                f"expects {list(expected[k].shape)}"
            )
        if not t.is_floating_point():
            raise VoiceLoadError(f"{where}: tensor {k} is {t.dtype}, expected a float tensor")
        if not bool(torch.isfinite(t).all()):
            raise VoiceLoadError(f"{where}: tensor {k} holds non-finite values")
    model.load_state_dict({k: t.float() for k, t in state.items()}, strict=True)
    return ignored


def load_sbv2_checkpoint(folder: str | Path, weights: str | Path | None = None) -> Sbv2Checkpoint:
    """An SBV2 model folder -> Sbv2Checkpoint (fp32 CPU model in eval mode, no grad)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise VoiceLoadError(f"{folder}: SBV2 model folder not found")
    cfg_path = folder / "config.json"
    cfg = read_config(cfg_path)
    weights_path = Path(weights) if weights is not None else find_weights(folder)
    if not weights_path.is_file():
        raise VoiceLoadError(f"{weights_path}: weights file not found")
    where = str(weights_path)
    tensors = read_safetensors(weights_path)
    dims = dims_from(cfg, tensors, where)
    try:
        model = Sbv2Synthesizer(dims)
    except ValueError as e:
        raise VoiceLoadError(f"{where}: {e}") from e
    ignored = load_state(model, tensors, where)
    model.eval().requires_grad_(False)

    data = cfg["data"]
    spk2id = {str(k): int(v) for k, v in (data.get("spk2id") or {}).items()}
    style2id = {str(k): int(v) for k, v in (data.get("style2id") or {}).items()}
    for name, sid in spk2id.items():
        if not 0 <= sid < dims.n_speakers:
            raise VoiceLoadError(f"{cfg_path}: spk2id {name!r} -> {sid}, but the model has {dims.n_speakers} speakers")
    n_styles = data.get("num_styles", len(style2id) or None)
    style_vectors = read_style_vectors(folder / "style_vectors.npy", None if n_styles is None else int(n_styles))
    for name, st in style2id.items():
        if not 0 <= st < len(style_vectors):
            raise VoiceLoadError(f"{cfg_path}: style2id {name!r} -> {st}, but there are {len(style_vectors)} style vectors")
    sr = data.get("sampling_rate")
    if not isinstance(sr, int) or sr <= 0 or not math.isfinite(sr):
        raise VoiceLoadError(f"{cfg_path}: data.sampling_rate {sr!r} is not a positive integer")
    return Sbv2Checkpoint(
        model=model, config=cfg, folder=folder, weights_path=weights_path, spk2id=spk2id,
        style2id=style2id, style_vectors=style_vectors, sample_rate=sr,
        add_blank=bool(data.get("add_blank", True)), version=str(cfg.get("version", "")),
        ignored_keys=ignored,
    )
