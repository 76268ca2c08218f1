"""Start-up of a server holding one voice of every family (issue 49): the warm-up runs for each
voice (its own `Voice.warmup`, then one sentence through the engine) and logs no error and no
traceback. Tiny random models from the fixture builders; in-process (TestClient) only."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
for sub in ("cosyvoice2", "sbv2"):  # the family fixture builders live beside their own tests
    if str(TESTS / sub) not in sys.path:
        sys.path.append(str(TESTS / sub))


@pytest.fixture(scope="module")
def family_voices(tmp_path_factory, tiny_voice_path):
    """One loaded voice per family: piper (tiny VITS), sbv2, cosyvoice2, bark."""
    import cv2_fixtures
    import cv2_onnx_fixtures
    import sbv2_fixtures
    from bark_fixtures import write_tiny_bark

    import voxserve

    root = tmp_path_factory.mktemp("families")
    cv2 = cv2_fixtures.write_model_folder(root / "tiny-cv2", speakers={"spk": cv2_fixtures.prompt_entry()})
    cv2_onnx_fixtures.write_standins(cv2)
    sbv2 = sbv2_fixtures.write_model_folder("jp_extra", root / "tiny-sbv2")
    bert = sbv2_fixtures.write_bert_root(root / "bert", names=(sbv2_fixtures.JP_BERT,))
    bark = write_tiny_bark(root / "tiny-bark")
    return [voxserve.load_voice(str(tiny_voice_path), device="cpu"),
            voxserve.load_voice(f"sbv2:{sbv2}", device="cpu", bert_dir=bert),
            voxserve.load_voice(f"cosyvoice2:{cv2}", device="cpu"),
            voxserve.load_voice(f"bark:{bark}", device="cpu")]


def test_a_server_with_every_family_warms_each_voice_up_without_an_error(family_voices, caplog, one_torch_thread):
    from fastapi.testclient import TestClient

    from voxserve.engine import Engine, EngineConfig
    from voxserve.serve.app import AppConfig, create_app

    own_warmups: dict[str, int] = {}
    for v in family_voices:  # count each voice's own warm-up (the engine calls voice.warmup)
        def counted(name=v.name, warm=v.warmup):
            own_warmups[name] = own_warmups.get(name, 0) + 1
            warm()
        v.warmup = counted
    assert len({v.family for v in family_voices}) == 4
    engine = Engine({v.name: v for v in family_voices}, EngineConfig(max_queue_wait_s=3600))
    app = create_app(engine, AppConfig(shutdown_timeout_s=10))
    caplog.set_level(logging.INFO)
    with TestClient(app) as client:
        deadline = time.time() + 600
        while client.get("/ready").status_code != 200:
            assert time.time() < deadline, "not ready in 600 s"
            time.sleep(0.1)
        bad = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records
               if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()]
        assert bad == []
        # every voice warmed: its own warm-up ran, and its warm-up sentence went through the engine
        assert sorted(own_warmups) == sorted(engine.voices) and all(n >= 1 for n in own_warmups.values())
        assert app.state.warmed_up == list(engine.voices)
        for name in engine.voices:  # and the server answers for each
            r = client.post("/v1/synthesize", json={"voice": name, "text": "Hello.", "response_format": "wav"})
            assert r.status_code == 200, (name, r.text)
