"""Tiny random VITS voices built with Piper's own training code and exported the way
`piper.train.export_onnx` exports (generator weight norm removed, flow weight norm folded by
the exporter, opset 15, inputs input/input_lengths/scales/sid)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

PHONEMES = list("_^$ ,.!?'abcdefhijklmnopqrstuvwxyzæðŋɐɑɔəɛɪʊʌ") + ["ˈ", "ˌ", "ː"]


def tiny_id_map() -> dict[str, list[int]]:
    return {p: [i] for i, p in enumerate(PHONEMES)}


def build_tiny_piper_model(n_speakers: int = 3, resblock: str = "1", seed: int = 0, use_sdp: bool = True):
    from piper.train.vits.models import SynthesizerTrn

    torch.manual_seed(seed)
    rk = (3, 5) if resblock == "1" else (3, 5, 7)
    rd = ((1, 3, 5), (1, 3, 5)) if resblock == "1" else ((1, 2), (2, 6), (3, 12))
    m = SynthesizerTrn(
        n_vocab=len(PHONEMES), spec_channels=33, segment_size=32, inter_channels=16,
        hidden_channels=16, filter_channels=32, n_heads=2, n_layers=2, kernel_size=3,
        p_dropout=0.0, resblock=resblock, resblock_kernel_sizes=rk, resblock_dilation_sizes=rd,
        upsample_rates=(4, 4), upsample_initial_channel=32, upsample_kernel_sizes=(8, 8),
        n_speakers=n_speakers, gin_channels=8 if n_speakers > 1 else 0, use_sdp=use_sdp,
    )
    # Training init zeroes several projections; randomise everything so every path matters.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("weight_g"):
                p.uniform_(0.5, 1.5)
            elif "emb" in name:
                p.normal_(0, 0.5)
            else:
                p.normal_(0, 0.15)
        if use_sdp:  # keep predicted durations in a sensible range (a few frames per id)
            m.dp.flows[0].m.fill_(1.0)
    return m.eval()


def export_piper_onnx(model, path: Path) -> None:
    """Mirror of piper.train.export_onnx's export (same forward, names and axes)."""
    with torch.no_grad():
        model.dec.remove_weight_norm()

    def infer_forward(text, text_lengths, scales, sid=None):
        return model.infer(text, text_lengths, noise_scale=scales[0], length_scale=scales[1],
                           noise_scale_w=scales[2], sid=sid)[0].unsqueeze(1)

    model.forward = infer_forward
    seq = torch.randint(low=0, high=model.n_vocab, size=(1, 50), dtype=torch.long)
    lengths = torch.LongTensor([seq.size(1)])
    sid = torch.LongTensor([0]) if model.n_speakers > 1 else None
    scales = torch.FloatTensor([0.667, 1.0, 0.8])
    torch.onnx.export(
        model=model, args=(seq, lengths, scales, sid), f=str(path), verbose=False, opset_version=15,
        input_names=["input", "input_lengths", "scales", "sid"], output_names=["output"],
        dynamic_axes={"input": {0: "batch_size", 1: "phonemes"}, "input_lengths": {0: "batch_size"},
                      "output": {0: "batch_size", 2: "time"}},
        dynamo=False,
    )


def write_tiny_voice(folder: Path, name: str = "tiny-multi", n_speakers: int = 3, resblock: str = "1",
                     use_sdp: bool = True) -> Path:
    """Build, export and write NAME.onnx + NAME.onnx.json. Returns the .onnx path."""
    import warnings

    folder.mkdir(parents=True, exist_ok=True)
    onnx_path = folder / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_tiny_piper_model(n_speakers, resblock, use_sdp=use_sdp)
        export_piper_onnx(model, onnx_path)
    speakers = {f"spk{i}": i for i in range(n_speakers)} if n_speakers > 1 else {}
    config = {
        "audio": {"sample_rate": 16000, "quality": "tiny"},
        "espeak": {"voice": "en-us"},
        "inference": {"noise_scale": 0.667, "length_scale": 1.0, "noise_w": 0.8},
        "phoneme_type": "espeak",
        "phoneme_map": {},
        "phoneme_id_map": tiny_id_map(),
        "num_symbols": len(PHONEMES),
        "num_speakers": n_speakers,
        "speaker_id_map": speakers,
        "piper_version": "1.0.0",
        "language": {"code": "en_US"},
    }
    (folder / f"{name}.onnx.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return onnx_path


def load_piper(name_or_path=None, device: str = "cpu", transforms=None, **runtime):
    """A Piper voice with the speed features' switches (`Transforms`), which load_voice does not
    take (they are no user setting): for the tests that check a transform against the plain path."""
    from voxserve.families.piper.loader import load_piper_voice
    from voxserve.families.piper.options import PiperRuntimeOptions
    from voxserve.voices.registry import resolve_voice

    src = resolve_voice(None if name_or_path is None else str(name_or_path))
    return load_piper_voice(src.path, src.config_path, name=src.name, device=device,
                            runtime=PiperRuntimeOptions(**runtime), transforms=transforms)
