"""Bark on a CUDA GPU next to the default VITS voice (skipped without one). Apart from
test_bark_serving.py so that collecting it needs no serving package (fastapi, soundfile): the GPU
machine of scripts/gpu-check has none."""

from __future__ import annotations

import numpy as np
import pytest
from serve_fakes import RecordingSink as Sink

import voxserve
from voxserve import SynthesisOptions
from voxserve.engine import Engine, EngineConfig, SchedulerConfig

PRESETS = ["announcer", "v2/en_speaker_0", "v2/en_speaker_1"]


def engine_for(*voices) -> Engine:
    return Engine({v.name: v for v in voices},
                  EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), max_queue_wait_s=3600))


@pytest.mark.cuda
def test_cuda_vits_and_bark_share_one_worker(tiny_bark_dir):
    # unmeasured here (no GPU in the session that wrote it): both voices on one GPU, fp16, one
    # worker thread (a second thread issuing work would break VITS's CUDA graph capture)
    joe = voxserve.load_voice(device="cuda", dtype="fp16")
    bark = voxserve.load_voice(f"bark:{tiny_bark_dir}", device="cuda", dtype="fp16")
    eng = engine_for(joe, bark).start()
    try:
        assert len(eng._workers) == 1
        sinks = []
        for k in range(4):
            for voice, opts in ((joe, voxserve.DETERMINISTIC), (bark, SynthesisOptions(seed=k, speaker=PRESETS[k % 3]))):
                sinks.append((voice, Sink()))
                eng.submit(voice.name, "Hello world. The cat is on the mat.", opts, sinks[-1][1])
        for voice, s in sinks:
            assert s.done.wait(120) and s.error is None, s.error
            audio = s.joined()
            assert audio.dtype == np.float32 and len(audio) > 0 and np.isfinite(audio).all()
    finally:
        eng.shutdown(10)
