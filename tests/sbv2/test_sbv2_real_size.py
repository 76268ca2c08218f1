"""A real-size SBV2 JP-Extra (hidden 192, filter 768, 6 layers, HiFi-GAN from 512 channels with
upsample 8-8-2-2-2, hop 512) with random weights, written as SBV2 writes its files (decoder in
weight-norm form), goes through the loader with the right dims, and its padded batch rows equal
their solo outputs, the last 100 ms included."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from voxserve.families.sbv2.loader import load_sbv2_checkpoint
from voxserve.families.sbv2.model import Sbv2Dims, Sbv2Synthesizer

REAL = dict(hidden_channels=192, filter_channels=768, n_heads=2, n_layers=6, kernel_size=3,
            inter_channels=192, resblock="1", resblock_kernel_sizes=[3, 7, 11],
            resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]], upsample_rates=[8, 8, 2, 2, 2],
            upsample_initial_channel=512, upsample_kernel_sizes=[16, 16, 8, 2, 2], gin_channels=512,
            use_spk_conditioned_encoder=True)


def write_real_size_folder(folder, n_speakers=2):
    torch.manual_seed(0)
    dims = Sbv2Dims(jp_extra=True, n_speakers=n_speakers, **{k: (tuple(map(tuple, v)) if k == "resblock_dilation_sizes"
                    else tuple(v) if isinstance(v, list) else v) for k, v in REAL.items() if k != "use_spk_conditioned_encoder"})
    model = Sbv2Synthesizer(dims)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state["dp.proj.bias"].fill_(1.0)  # a few frames per phone
    for k in [k for k in state if k.startswith("dec.") and k.endswith(".weight")
              and not k.startswith(("dec.conv_pre", "dec.conv_post", "dec.cond"))]:
        w = state.pop(k)  # SBV2 keeps weight norm: g = ||w|| (dim 0), v = w
        state[k + "_v"] = w
        state[k + "_g"] = torch.linalg.vector_norm(w.reshape(w.shape[0], -1), dim=1).view(-1, 1, 1)
    state["iteration"] = torch.tensor([1], dtype=torch.int64)
    folder.mkdir(parents=True)
    save_file(state, str(folder / "G_1000.safetensors"))
    cfg = {"version": "2.5.0-JP-Extra", "data": {"use_jp_extra": True, "sampling_rate": 44100, "hop_length": 512,
           "add_blank": True, "n_speakers": n_speakers, "spk2id": {f"s{i}": i for i in range(n_speakers)},
           "num_styles": 2, "style2id": {"Neutral": 0, "Happy": 1}}, "model": REAL}
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    v = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    np.save(folder / "style_vectors.npy", v)
    return dims


@pytest.mark.slow
def test_real_size_model_loads_and_batches_exactly(tmp_path):
    dims = write_real_size_folder(tmp_path / "real")
    ck = load_sbv2_checkpoint(tmp_path / "real")
    assert ck.dims == dims and ck.dims.hop_length == 512
    g = torch.Generator().manual_seed(1)
    lengths = [21, 13]
    t = max(lengths)
    x = torch.zeros(2, t, dtype=torch.long)
    for i, n in enumerate(lengths):
        x[i, :n] = torch.randint(1, 112, (n,), generator=g)
    x[:, ::2] = 0  # blanks, as add_blank gives
    bert = torch.randn(2, 1024, t, generator=g)
    style = torch.from_numpy(np.stack([ck.style_vector("Happy", 1.0), ck.style_vector(0, 1.0)]))
    kw = dict(noise_scale=0.0, noise_scale_w=0.0, sdp_ratio=0.0)
    tone = torch.zeros_like(x)
    out = ck.model.infer(x, torch.tensor(lengths), tone, torch.ones_like(x), {"JP": bert}, style,
                         torch.tensor([0, 1]), **kw)
    tail = ck.sample_rate // 10
    for i, n in enumerate(lengths):
        solo = ck.model.infer(x[i:i + 1, :n], torch.tensor([n]), tone[i:i + 1, :n], torch.ones(1, n, dtype=torch.long),
                              {"JP": bert[i:i + 1, :, :n]}, style[i:i + 1], torch.tensor([i]), **kw)
        s = int(solo.wave_lengths[0])
        assert int(out.wave_lengths[i]) == s and s > tail
        row = out.wave[i, 0, :s]
        assert float((row - solo.wave[0, 0, :s]).abs().max()) <= 1e-4
        assert float((row[-tail:] - solo.wave[0, 0, s - tail : s]).abs().max()) <= 1e-4
        assert not out.wave[i, 0, s:].any()
