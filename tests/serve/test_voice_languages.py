"""One language code per voice, everywhere (issue 47): each family's tiny random voice reports the
same BCP-47 tags in its unloaded description (`voxserve voices --json` and the table), the HTTP
voices routes (which the playground reads), and Wyoming's `info`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import voxserve
from voxserve.cli import main
from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.families.sbv2 import Sbv2Options
from voxserve.langcodes import is_tag, tag
from voxserve.serve.app import AppConfig, create_app
from voxserve.voices import registry

TESTS = Path(__file__).resolve().parents[1]
for sub in ("sbv2", "cosyvoice2"):  # the families' fixture modules live beside their tests
    if str(TESTS / sub) not in sys.path:
        sys.path.insert(0, str(TESTS / sub))


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def bert_root(tmp_path_factory):
    """The fixtures' tiny JP and EN BERTs, laid out as SBV2's bert/ folder."""
    pytest.importorskip("transformers")
    import sbv2_fixtures as fx

    return fx.write_bert_root(tmp_path_factory.mktemp("bert"), names=(fx.JP_BERT, fx.EN_BERT))


@pytest.fixture
def isolated_registry(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setenv("VOXSERVE_VOICES_PATH", str(tmp_path / "no-voices"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def listings(name: str, voice, capsys) -> dict[str, list[str]]:
    """The voice's languages as every listing reports it (its source registered as `name`)."""
    out: dict[str, list[str]] = {"Voice.language_codes": list(voice.language_codes)}
    assert main(["voices", "--json"]) == 0
    out["voxserve voices --json"] = {i["name"]: i for i in json.loads(capsys.readouterr().out)}[name]["languages"]
    assert main(["voices"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line[2:].startswith(name + " "))  # "* " marks the default
    out["voxserve voices"] = row.split()[1].split(",")
    eng = Engine({name: voice}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    with TestClient(create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=10))) as c:
        out["/v1/voices"] = c.get("/v1/voices").json()["voices"][0]["languages"]
        out["/v1/audio/voices"] = c.get("/v1/audio/voices").json()["data"][0]["languages"]
    pytest.importorskip("wyoming", reason="the wyoming extra")
    from voxserve.serve.wyoming import WyomingConfig, WyomingServer

    info = WyomingServer(eng, WyomingConfig(uri="tcp://127.0.0.1:0")).info()
    out["wyoming info"] = info.tts[0].voices[0].languages
    return out


def assert_everywhere(got: dict[str, list[str]], want: list[str]) -> None:
    assert all(is_tag(code) for code in want), want
    assert got == dict.fromkeys(got, want), got


# ----------------------------------------------------------------------------- the tags
@pytest.mark.parametrize("code, want", [("en_US", "en-US"), ("en-us", "en-US"), ("JP", "jp"), ("ja", "ja"),
                                        ("zh-hans-cn", "zh-Hans-CN"), ("en-gb-x-rp", "en-GB"), ("es-419", "es-419"),
                                        ("yue", "yue")])
def test_tag_normalises_config_codes(code, want):
    assert tag(code) == want and is_tag(want)


@pytest.mark.parametrize("bad", ["", "english", "e", "1x", "multi"])
def test_tag_refuses_what_is_no_language_code(bad):
    with pytest.raises(ValueError):
        tag(bad)


@pytest.mark.parametrize("code", ["en_US", "JP", "multi", "en-us", "zh-hans"])
def test_is_tag_refuses_other_shapes(code):
    assert not is_tag(code)


# ----------------------------------------------------------------------------- families
def test_piper_voice_is_en_US_everywhere(tiny_voice_path, isolated_registry, capsys):
    registry.register_voice("tiny-multi", tiny_voice_path)
    voice = voxserve.load_voice("tiny-multi", device="cpu")
    assert_everywhere(listings("tiny-multi", voice, capsys), ["en-US"])


def test_piper_falls_back_to_the_espeak_voice(tiny_voice_path, tmp_path, isolated_registry, capsys):
    onnx = tmp_path / "old.onnx"
    onnx.write_bytes(tiny_voice_path.read_bytes())
    cfg = json.loads(tiny_voice_path.with_name(tiny_voice_path.name + ".json").read_text())
    del cfg["language"]
    cfg["espeak"]["voice"] = "en-gb-x-rp"
    (tmp_path / "old.onnx.json").write_text(json.dumps(cfg))
    registry.register_voice("old", onnx)
    voice = voxserve.load_voice("old", device="cpu")
    assert_everywhere(listings("old", voice, capsys), ["en-GB"])


@pytest.mark.parametrize("variant, want", [("jp_extra", ["ja"]), ("multilingual", ["ja", "en"])])
def test_sbv2_voice_says_ja_and_en_and_its_option_takes_them(variant, want, bert_root, tmp_path, isolated_registry,
                                                             capsys):
    import sbv2_fixtures as fx

    folder = fx.write_model_folder(variant, tmp_path / f"tiny-{variant}")
    registry.register_voice("tiny-sbv2", folder, family="sbv2")
    voice = voxserve.load_voice("tiny-sbv2", device="cpu", bert_dir=bert_root)
    assert_everywhere(listings("tiny-sbv2", voice, capsys), want)
    # the `language` option (JP, EN) takes each tag the listings show
    assert len(voice.languages) == len(want)
    for code in want:
        assert voice.language_of(code) == voice.language_of(voice.languages[want.index(code)])


def test_sbv2_multilingual_voice_without_an_english_bert_says_ja_only(tmp_path, isolated_registry):
    pytest.importorskip("transformers")
    import sbv2_fixtures as fx

    folder = fx.write_model_folder("multilingual", tmp_path / "tiny")
    voice = voxserve.load_voice(f"sbv2:{folder}", device="cpu", bert_dir=fx.write_bert_root(tmp_path / "b", names=(fx.JP_BERT,)))
    assert voice.language_codes == ["ja"]  # loaded, it says what it can speak here


def test_cosyvoice2_voice_lists_each_language_it_speaks(tmp_path, isolated_registry, capsys):
    import cv2_fixtures as fx
    import cv2_onnx_fixtures as onnx_fx

    d = fx.write_model_folder(tmp_path / "tiny-cosyvoice2", speakers={"spk": fx.prompt_entry()})
    onnx_fx.write_standins(d)
    registry.register_voice("tiny-cv2", d, family="cosyvoice2")
    voice = voxserve.load_voice("tiny-cv2", device="cpu")
    assert_everywhere(listings("tiny-cv2", voice, capsys), ["zh", "en", "ja", "ko", "yue"])


def test_bark_voice_says_its_presets_languages(tmp_path, isolated_registry, capsys):
    pytest.importorskip("transformers")
    from bark_fixtures import write_tiny_bark

    d = write_tiny_bark(tmp_path / "tiny-bark")  # presets v2/en_speaker_0, v2/en_speaker_1, announcer
    registry.register_voice("tiny-bark", d, family="bark")
    voice = voxserve.load_voice("tiny-bark", device="cpu")
    assert_everywhere(listings("tiny-bark", voice, capsys), ["en"])


def test_bark_without_language_presets_lists_barks_languages(tmp_path):
    from voxserve.families.bark.voice import BARK_LANGUAGES, language_codes

    assert language_codes(["announcer", "presets/me"]) == list(BARK_LANGUAGES)
    assert language_codes(["v2/de_speaker_3", "announcer", "v2/en_speaker_1", "de_speaker_0"]) == ["de", "en"]
    assert all(is_tag(c) for c in BARK_LANGUAGES)


# ----------------------------------------------------------------------------- Wyoming and the playground
def test_wyoming_picks_a_voice_by_tag_and_passes_the_option_only_where_the_voice_has_one(bert_root, tmp_path,
                                                                                         tiny_voice_path):
    pytest.importorskip("wyoming", reason="the wyoming extra")
    import sbv2_fixtures as fx

    from voxserve.serve.wyoming import WyomingConfig, WyomingServer

    folder = fx.write_model_folder("multilingual", tmp_path / "tiny")
    sbv2 = voxserve.load_voice(f"sbv2:{folder}", device="cpu", bert_dir=bert_root)
    piper = voxserve.load_voice(str(tiny_voice_path), device="cpu")
    eng = Engine({"jp": sbv2, "us": piper}, EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    server = WyomingServer(eng, WyomingConfig(uri="tcp://127.0.0.1:0"))
    assert server.voice_for_language("ja") == ("jp", "ja")
    assert server.voice_for_language("en") == ("jp", "en")  # the first voice speaking it
    assert server.voice_for_language("en_US") == ("us", None)
    assert server.voice_for_language("en-us") == ("us", None)
    # the option the server passes is one the voice takes
    assert list(sbv2.units("こんにちは。", Sbv2Options(language="ja")))


def test_the_playground_shows_the_languages_of_v1_voices():
    js = (Path(voxserve.__file__).parent / "serve" / "static" / "playground.js").read_text(encoding="utf-8")
    assert 'api("v1/voices")' in js and "v.languages" in js
