"""No text crashes the process (issue 49): every family's front end over long and pathological
texts, in a child process (frontend_fuzz_child.py) so that a native crash (espeak-ng segfaulted
on "a." x 150) fails this test instead of the run; and a real server that survives the issue's
texts on its HTTP routes and over Wyoming."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from server_process import ROOT, ServerProcess, free_port

HERE = Path(__file__).resolve().parent
EXAMPLES = 60  # hypothesis examples, each through all five voices (~30 s of CPU here)

for sub in ("sbv2", "cosyvoice2"):  # the families' fixture builders
    if str(ROOT / "tests" / sub) not in sys.path:
        sys.path.append(str(ROOT / "tests" / sub))


@pytest.fixture(scope="module")
def voices_spec(tmp_path_factory, tiny_voice_path) -> dict:
    """name -> [load_voice spec, its keyword arguments, its family's synthesis options]: a tiny random
    voice of each family, and the multilingual SBV2 voice read in English."""
    pytest.importorskip("transformers")
    pytest.importorskip("pyopenjtalk")
    import cv2_fixtures
    import cv2_onnx_fixtures
    import sbv2_fixtures
    from bark_fixtures import write_tiny_bark

    root = tmp_path_factory.mktemp("fuzz-voices")
    bert = sbv2_fixtures.write_bert_root(root / "bert", names=(sbv2_fixtures.JP_BERT, sbv2_fixtures.EN_BERT))
    sbv2 = {v: sbv2_fixtures.write_model_folder(v, root / f"sbv2-{v}") for v in ("jp_extra", "multilingual")}
    cv2 = cv2_fixtures.write_model_folder(root / "cv2", speakers={"spk": cv2_fixtures.prompt_entry()})
    cv2_onnx_fixtures.write_standins(cv2)
    bark = write_tiny_bark(root / "bark")
    return {
        "piper": [str(tiny_voice_path), {}, {}],
        "sbv2-jp": [f"sbv2:{sbv2['jp_extra']}", {"bert_dir": str(bert)}, {}],
        "sbv2-en": [f"sbv2:{sbv2['multilingual']}", {"bert_dir": str(bert)}, {"language": "EN"}],
        "cosyvoice2": [f"cosyvoice2:{cv2}", {}, {}],
        "bark": [f"bark:{bark}", {}, {}],
    }


def test_no_text_crashes_a_front_end_or_escapes_the_library_errors(voices_spec):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-X", "faulthandler", str(HERE / "frontend_fuzz_child.py"),
                        json.dumps(voices_spec), str(EXAMPLES)], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, f"the front end died ({r.returncode}):\n{r.stderr[-3000:]}"
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["unclean"] == [], report["unclean"]
    for name, outcomes in report["outcomes"].items():
        assert sum(outcomes.values()) == report["pinned"] + report["examples"], name
        assert outcomes.get("units", 0) > report["examples"] // 2, (name, outcomes)  # most texts are said


# the issue's texts that took the server down
URL_TEXT = "https://" + "a." * 1000 + "com/" + "x/" * 500
DOTS = "a." * 200


def _wyoming_says(port: int, text: str) -> list[str]:
    """The event types a Wyoming `synthesize` of text answers with, until its audio-stop or error."""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    async def go() -> list[str]:
        c = AsyncTcpClient("127.0.0.1", port, connect_timeout=10, read_timeout=120)
        await c.connect()
        try:
            await c.write_event(Synthesize(text=text).event())
            types: list[str] = []
            while (event := await c.read_event()) is not None:
                types.append(event.type)
                if event.type in ("audio-stop", "error"):
                    break
            return types
        finally:
            await c.disconnect()

    async def bounded() -> list[str]:
        async with asyncio.timeout(300):
            return await go()

    return asyncio.run(bounded())


def test_the_server_survives_the_issues_texts(tiny_voice_path):
    pytest.importorskip("wyoming")
    wport = free_port()
    s = ServerProcess(["--voice", "tiny-multi", "--no-warmup", "--wyoming", f"tcp://127.0.0.1:{wport}"],
                      env={"VOXSERVE_VOICES_PATH": str(tiny_voice_path.parent)}, ready_timeout=120)
    try:
        r = s.client.post("/v1/synthesize", json={"text": URL_TEXT, "response_format": "pcm"})
        assert r.status_code == 200 or 400 <= r.status_code < 500, r.text[:300]
        r = s.client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "tiny-multi", "input": DOTS,
                                                    "response_format": "pcm"})
        assert r.status_code == 200 or 400 <= r.status_code < 500, r.text[:300]
        types = _wyoming_says(wport, DOTS)
        assert types and types[-1] in ("audio-stop", "error"), types
        assert s.proc.poll() is None, "the server died"
        assert s.client.get("/health").status_code == 200
        r = s.client.post("/v1/synthesize", json={"text": "Hello world.", "response_format": "pcm"})
        assert r.status_code == 200 and len(r.content) > 0
    finally:
        s.stop()
