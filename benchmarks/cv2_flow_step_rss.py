"""Peak RSS of one CosyVoice 2 flow-estimator step at the largest shape a request can give
(issue 49), on the tiny model the tests build:

    PYTHONPATH=src MALLOC_MMAP_THRESHOLD_=131072 prlimit --as=6000000000 -- \\
        python benchmarks/cv2_flow_step_rss.py ROWS FRAMES STREAMING(0|1)

ROWS: the estimator's batch (token2wav's rows, 8 at most, doubled for guidance: 16); FRAMES:
mel frames per row (a sentence of 80 text tokens run to the LM's 20x bound makes 1,600 speech
tokens, 3,200 frames, plus the prompt's: 3,300 with the test prompt, 4,700 with a 30 s one).
One estimator call holds what each of the flow's 10 Euler steps holds. Prints RSS before and
the peak (ru_maxrss), in MB.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(rows: int, frames: int, streaming: bool) -> None:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "cosyvoice2")]
    import cv2_fixtures as fx
    import cv2_onnx_fixtures as onnx_fx
    import torch

    import voxserve

    torch.set_num_threads(1)
    d = fx.write_model_folder(Path(tempfile.mkdtemp()) / "tiny", speakers={"spk": fx.prompt_entry()})
    onnx_fx.write_standins(d)
    flow = voxserve.load_voice(f"cosyvoice2:{d}", device="cpu").model.flow
    g = torch.Generator().manual_seed(0)
    x, mu, cond = (torch.randn(rows, flow.dims.mel, frames, generator=g) for _ in range(3))
    mask = torch.ones(rows, 1, frames)
    spks, t = torch.randn(rows, flow.dims.mel, generator=g), torch.rand(rows, generator=g)
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * 4096 / 1e6
    t0 = time.perf_counter()
    with torch.inference_mode():
        flow.decoder.estimator(x, mask, mu, t, spks, cond, streaming)
    print(json.dumps({"rows": rows, "frames": frames, "streaming": streaming, "rss_before_mb": round(before),
                      "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
