"""cosyvoice2.yaml is read as data: tags never import or call anything, !ref resolves, a
folder of another CosyVoice generation is refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from voxserve.errors import VoiceLoadError
from voxserve.families.cosyvoice2.config import Tagged, load_config, parse_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "cosyvoice2"))
import tiny  # noqa: E402


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cosyvoice2.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_tiny_config_reads_as_the_official_layout(tmp_path):
    c = load_config(_write(tmp_path, tiny.yaml_text()))
    assert (c.sample_rate, c.token_frame_rate, c.token_mel_ratio, c.samples_per_token) == (24000, 25, 2, 960)
    assert c.sampling == {"top_p": 0.8, "top_k": 25, "win_size": 10, "tau_r": 0.1}
    assert c.llm["speech_token_size"] == 6561 and c.llm["llm_input_size"] == tiny.DIMS["llm_size"]
    est = c.flow["decoder"]["estimator"]
    assert est["class"] == "cosyvoice.flow.decoder.CausalConditionalDecoder"
    assert est["static_chunk_size"] == 50  # !ref <token_frame_rate> * <token_mel_ratio>
    assert c.flow["decoder"]["cfm_params"]["inference_cfg_rate"] == 0.7  # an omegaconf DictConfig's content
    assert c.flow["pre_lookahead_len"] == 3 and c.flow["encoder"]["output_size"] == 512
    assert c.hift["upsample_rates"] == [8, 5, 3] and c.hift["istft_params"] == {"n_fft": 16, "hop_len": 4}


def test_tags_are_data_and_nothing_is_called(tmp_path, monkeypatch):
    called = []
    monkeypatch.setattr("os.system", lambda *a: called.append(a))
    data = parse_config("a: !apply:os.system ['echo pwned']\nb: !new:os.system {x: 1}\nc: !name:os.system\n")
    assert isinstance(data["a"], Tagged) and data["a"].target == "os.system" and data["a"].value == ["echo pwned"]
    assert data["b"] == Tagged("new", "os.system", {"x": 1})
    assert not called


def test_python_tags_of_plain_yaml_are_refused():
    with pytest.raises(VoiceLoadError):
        parse_config("a: !!python/object/apply:os.system ['echo pwned']\n")


@pytest.mark.parametrize("text, message", [
    ("a: !ref <b>\n", "no top-level key 'b'"),
    ("a: 1\nb: !ref <a> ** 99999999\n", "unsupported !ref expression"),
    ("a: !ref <b>\nb: !ref <a>\n", "nested too deeply"),
    ("- 1\n- 2\n", "top level is not a mapping"),
    ("a: [1,\n", "not valid YAML"),
])
def test_bad_yaml_is_a_load_error(text, message):
    with pytest.raises(VoiceLoadError, match=message):
        parse_config(text)


def test_another_model_generation_is_refused_by_name(tmp_path):
    text = tiny.yaml_text().replace("cosyvoice.llm.llm.Qwen2LM", "cosyvoice.llm.llm.TransformerLM")
    with pytest.raises(VoiceLoadError, match="`llm` is cosyvoice.llm.llm.TransformerLM.*not a CosyVoice 2 model"):
        load_config(_write(tmp_path, text))


def test_missing_section_and_bad_rate(tmp_path):
    text = tiny.yaml_text()
    cut = text[: text.index("hift: !new")] + text[text.index("# processor functions"):]
    with pytest.raises(VoiceLoadError, match="`hift` is missing"):
        load_config(_write(tmp_path, cut))
    with pytest.raises(VoiceLoadError, match="`sample_rate` must be a positive integer"):
        load_config(_write(tmp_path, tiny.yaml_text(sample_rate=-1)))


def test_oversized_config_is_refused(tmp_path):
    with pytest.raises(VoiceLoadError, match="over the"):
        load_config(_write(tmp_path, "a: 1\n" + "#" * (1 << 20)))
