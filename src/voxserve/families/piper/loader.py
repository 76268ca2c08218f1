"""Load a Piper voice (.onnx + .onnx.json) onto voxserve's PyTorch VITS."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ...errors import VoiceLoadError
from ...models.vits import VitsModel, attention_modules
from ...models.vits_precision import PrecisionPolicy, apply_precision
from ...runtime.cpu import tune_malloc
from ...runtime.device import resolve_device, resolve_dtype
from ...runtime.layout import convert_convs_channels_last, convert_convs_gemm
from ...text.frontend import DEFAULT_MAX_PHONEMES, TextFrontend
from .cache import load_cached
from .config import VoiceConfig
from .onnx_import import read_piper_onnx
from .options import PiperRuntimeOptions, Transforms
from .runner import VitsRunner
from .transforms import fold_resblock_average, tile_decoder
from .voice import VitsVoice

log = logging.getLogger(__name__)


class _NoInit(TorchFunctionMode):
    """Module constructors without their random initialisation: every parameter is then
    replaced by the voice's weights, and drawing them cost a `say` more than a tenth of a
    second. (The meta device would skip it too, but its Embedding init imports torch._dynamo.)"""

    SKIPPED = frozenset({torch.nn.init.uniform_, torch.nn.init.normal_, torch.nn.init.kaiming_uniform_,
                         torch.nn.init.constant_, torch.Tensor.uniform_, torch.Tensor.normal_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.SKIPPED:
            return args[0] if args else kwargs["tensor"]  # left as allocated: uninitialised
        return func(*args, **(kwargs or {}))


def build_vits(onnx_path: str | Path, use_cache: bool = True) -> VitsModel:
    """The voice's weights in a float32 CPU VitsModel (eval mode, no transforms)."""
    dims, tensors = load_cached(onnx_path, read_piper_onnx, use_cache=use_cache)
    with _NoInit():
        model = VitsModel(dims)
    bad = [k for k, v in tensors.items() if v.dtype != np.float32]
    if bad:  # assigned below as they are: a parameter in another dtype would run in it
        raise VoiceLoadError(f"{onnx_path}: tensor {bad[0]} is {tensors[bad[0]].dtype}, not float32")
    # assign: the parameters become the loaded arrays (no copy into the uninitialised ones)
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(np.require(v, requirements='W')) for k, v in tensors.items()}, strict=False,
        assign=True)
    if missing or unexpected:  # the converter checked this; a stale cache entry would not
        # (and a parameter left out would hold uninitialised memory)
        raise VoiceLoadError(f"{onnx_path}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.eval().requires_grad_(False)


def load_piper_voice(
    model_path: str | Path,
    config_path: str | Path | None = None,
    name: str | None = None,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = None,
    runtime: PiperRuntimeOptions | None = None,
    max_phonemes: int = DEFAULT_MAX_PHONEMES,
    use_cache: bool = True,
    transforms: Transforms | None = None,
) -> VitsVoice:
    """`transforms`: the speed features' switches (tests and benchmarks; default all on)."""
    model_path = Path(model_path)
    config_path = Path(config_path) if config_path else model_path.with_name(model_path.name + ".json")
    if not model_path.exists():
        raise VoiceLoadError(f"voice model not found: {model_path}")
    config = VoiceConfig.from_json(config_path, name=name)
    runtime = (runtime or PiperRuntimeOptions()).validate()
    tf = (transforms or Transforms()).validate()
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)

    model = build_vits(model_path, use_cache=use_cache)
    dims = model.dims
    if dims.n_vocab < config.num_symbols:
        raise VoiceLoadError(f"{model_path}: the model has {dims.n_vocab} symbols, the config {config.num_symbols}")
    if config.num_speakers > 1 and dims.n_speakers != config.num_speakers:
        raise VoiceLoadError(f"{model_path}: the model has {dims.n_speakers} speakers, the config {config.num_speakers}")
    if dims.hop_length != config.hop_length:
        log.warning("%s: decoder hop %d differs from the config's hop_length %d; using the model's",
                    model_path.name, dims.hop_length, config.hop_length)

    for attn in attention_modules(model):
        attn.impl = tf.attention
    if tf.fold_average:
        fold_resblock_average(model.dec)
    if dev.type == "cpu":
        tune_malloc()
        if runtime.threads:
            torch.set_num_threads(runtime.threads)
        if tf.cpu_gemm_convs:  # first: the flow's convolutions it takes are not converted twice
            for stage in (model.enc_p, model.dp, model.flow):
                convert_convs_gemm(stage)
        if tf.cpu_decode_tiles and not runtime.compile:
            tile_decoder(model.dec)
        if tf.cpu_channels_last:
            convert_convs_channels_last(model.flow)
            convert_convs_channels_last(model.dec)
    if dev.type == "cuda" and runtime.memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(runtime.memory_fraction, dev)
    model = apply_precision(model.to(dev), PrecisionPolicy.default(dt))
    runner = VitsRunner(model, dev, dt, runtime, tf)
    if dev.type == "cuda":
        runner.warmup()  # capture the CUDA graph grid (or compile) now, not on a user's request
    frontend = TextFrontend(config.espeak_voice, config.phoneme_id_map, config.phoneme_map,
                            config.vowel_clusters, max_phonemes=max_phonemes)
    return VitsVoice(config, runner, frontend, source_path=model_path, config_path=config_path,
                     loader=load_piper_voice)
