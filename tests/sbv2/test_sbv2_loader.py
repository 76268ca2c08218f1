"""The SBV2 loader: dims from config and shapes, weight norm folded, every key accounted for,
and errors that name the offending key, tensor or file."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import sbv2_fixtures as fx
from voxserve.errors import VoiceLoadError
from voxserve.families.sbv2.loader import load_sbv2_checkpoint


@pytest.fixture
def folder(sbv2_folders, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(sbv2_folders["jp_extra"], dst)
    return dst


def rewrite(folder, edit):
    path = folder / "tiny.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def edit_config(folder, edit):
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")


def test_dims_and_metadata(sbv2_checkpoints):
    for variant, ck in sbv2_checkpoints.items():
        cfg = fx.meta()["models"][variant]["config"]
        d = ck.dims
        assert d.jp_extra == (variant == "jp_extra") == ck.jp_extra
        assert d.hidden_channels == cfg["model"]["hidden_channels"] and d.n_layers == 3
        assert d.flow_n_layers == (6 if variant == "jp_extra" else 4) and d.flow_n_flows == 4
        assert d.dp_filter_channels == 256 and d.window_size == 4 and d.n_speakers == 3
        assert d.hop_length == 32 and ck.sample_rate == 44100 and ck.add_blank
        assert ck.spk2id == {"spk_a": 0, "spk_b": 1, "spk_c": 2}
        assert list(ck.style2id) == ["Neutral", "Happy", "Sad", "Angry"]
        assert ck.style_vectors.shape == (4, 256)
        # skipped on purpose: iteration, the sdp posterior and the flow reverse never uses
        assert "iteration" in ck.ignored_keys
        assert all(k == "iteration" or k.startswith(("sdp.post_", "sdp.flows.1.")) for k in ck.ignored_keys)


def test_weight_norm_is_folded_as_torch_does(sbv2_checkpoints):
    ck = sbv2_checkpoints["jp_extra"]
    m = fx.meta()["models"]["jp_extra"]
    t = fx.weights_module().make_state_dict(m["weights_seed"], m["safetensors_keys"])
    for base in ("dec.ups.0", "dec.ups.2", "dec.resblocks.4.convs1.1", "dec.resblocks.8.convs2.2"):
        v, g = torch.from_numpy(t[base + ".weight_v"]), torch.from_numpy(t[base + ".weight_g"])
        ref = torch._weight_norm(v, g, 0)
        assert float((ck.model.state_dict()[base + ".weight"] - ref).abs().max()) <= 1e-6, base
    assert torch.equal(ck.model.dec.conv_pre.weight, torch.from_numpy(t["dec.conv_pre.weight"]))


def test_folded_weights_load_too(folder):
    """A checkpoint whose decoder weight norm was already removed (plain `weight`) loads the same."""
    before = load_sbv2_checkpoint(folder).model.state_dict()

    def fold(t):
        for k in [k for k in t if k.endswith(".weight_v")]:
            b = k[: -len("_v")]
            t[b] = torch._weight_norm(t.pop(k), t.pop(b + "_g"), 0)

    rewrite(folder, fold)
    after = load_sbv2_checkpoint(folder).model.state_dict()
    assert all(float((before[k] - after[k]).abs().max()) <= 1e-6 for k in before)


def test_missing_key_is_named(folder):
    rewrite(folder, lambda t: t.pop("flow.flows.4.enc.attn_layers.5.conv_q.weight"))
    with pytest.raises(VoiceLoadError, match=r"missing tensor flow\.flows\.4\.enc\.attn_layers\.5\.conv_q\.weight"):
        load_sbv2_checkpoint(folder)


def test_missing_weight_g_is_named(folder):
    rewrite(folder, lambda t: t.pop("dec.ups.1.weight_g"))
    with pytest.raises(VoiceLoadError, match=r"dec\.ups\.1\.weight_v has no dec\.ups\.1\.weight_g"):
        load_sbv2_checkpoint(folder)


def test_wrong_shape_is_named(folder):
    def bad(t):
        t["enc_p.style_proj.weight"] = torch.zeros(24, 128)

    rewrite(folder, bad)
    with pytest.raises(VoiceLoadError, match=r"enc_p\.style_proj\.weight has shape \[24, 128\].*\[24, 256\]"):
        load_sbv2_checkpoint(folder)


def test_config_that_does_not_fit_the_tensors_is_named(folder):
    edit_config(folder, lambda c: c["model"].update(filter_channels=48))
    with pytest.raises(VoiceLoadError, match=r"tensor enc_p\.encoder\.ffn_layers\.0\.conv_1\.\w+ has shape \[32.*expects \[48"):
        load_sbv2_checkpoint(folder)


def test_speaker_count_mismatch_is_named(folder):
    edit_config(folder, lambda c: c["data"].update(n_speakers=5))
    with pytest.raises(VoiceLoadError, match=r"emb_g\.weight has 3 speakers.*n_speakers is 5"):
        load_sbv2_checkpoint(folder)


def test_unexpected_key_is_named(folder):
    rewrite(folder, lambda t: t.update({"enc_p.ja_bert_proj.weight": torch.zeros(24, 1024, 1)}))
    with pytest.raises(VoiceLoadError, match=r"unexpected tensor enc_p\.ja_bert_proj\.weight"):
        load_sbv2_checkpoint(folder)


def test_multilingual_weights_under_a_jp_extra_config_are_refused(sbv2_folders, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(sbv2_folders["multilingual"], dst)
    edit_config(dst, lambda c: (c.update(version="2.5.0-JP-Extra"), c["data"].update(use_jp_extra=True)))
    with pytest.raises(VoiceLoadError, match=r"unexpected tensor enc_p\.(en|ja)_bert_proj"):
        load_sbv2_checkpoint(dst)


def test_iteration_and_training_only_keys_are_ignored(folder):
    rewrite(folder, lambda t: t.update({"enc_q.pre.weight": torch.zeros(16, 65, 1)}))
    ck = load_sbv2_checkpoint(folder)
    assert "enc_q.pre.weight" in ck.ignored_keys


@pytest.mark.parametrize("name", ["tiny.safetensors", "config.json", "style_vectors.npy"])
def test_missing_file_is_named(folder, name):
    (folder / name).unlink()
    with pytest.raises(VoiceLoadError, match="safetensors" if name.endswith(".safetensors") else name.replace(".", r"\.")):
        load_sbv2_checkpoint(folder)


def test_missing_folder_and_several_weight_files(folder, tmp_path):
    with pytest.raises(VoiceLoadError, match="not found"):
        load_sbv2_checkpoint(tmp_path / "nowhere")
    shutil.copy(folder / "tiny.safetensors", folder / "G_2000.safetensors")
    with pytest.raises(VoiceLoadError, match="several"):
        load_sbv2_checkpoint(folder)
    ck = load_sbv2_checkpoint(folder, weights=folder / "G_2000.safetensors")
    assert ck.weights_path.name == "G_2000.safetensors"


def test_unreadable_files_are_named(folder):
    (folder / "tiny.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(VoiceLoadError, match=r"tiny\.safetensors: not a readable safetensors"):
        load_sbv2_checkpoint(folder)


def test_style_vectors_that_do_not_fit_are_named(folder):
    np.save(folder / "style_vectors.npy", np.zeros((3, 256), np.float32))
    with pytest.raises(VoiceLoadError, match=r"style_vectors\.npy: 3 style vectors.*4 styles"):
        load_sbv2_checkpoint(folder)
    np.save(folder / "style_vectors.npy", np.zeros((4, 128), np.float32))
    with pytest.raises(VoiceLoadError, match=r"style_vectors\.npy: style vectors have shape \[4, 128\]"):
        load_sbv2_checkpoint(folder)


def test_unsupported_variants_are_refused_by_name(folder):
    edit_config(folder, lambda c: c["model"].update(use_transformer_flow=False))
    with pytest.raises(VoiceLoadError, match="use_transformer_flow"):
        load_sbv2_checkpoint(folder)
