"""Every family imported, and a tiny voice of each (the tests' seeded fixtures, built here)
loaded and run on DEVICE: scripts/gpu-check's pre-flight, on the GPU machine and in the rehearsal.

    python scripts/gpu_check/smoke.py DEVICE WORKDIR

Prints one line per family and `families: N of N imported, N tiny voices ran`; exit 1 if any
failed. SBV2's voice runs its synthesizer on a recorded case: its Japanese front end needs
pyopenjtalk (128 MB with its dictionary), which does not travel (docs/benchmarks.md, GPU plan)."""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for d in ("tests", "tests/sbv2", "tests/cosyvoice2"):
    sys.path.insert(0, str(ROOT / d))


def piper(device, work):
    import voxserve
    from vits_fixtures import write_tiny_voice

    v = voxserve.load_voice(str(write_tiny_voice(work / "piper")), device=device)
    return len(v.synthesize("Hello world.", voxserve.DETERMINISTIC).samples)


def bark(device, work):
    import voxserve
    from bark_fixtures import write_tiny_bark

    v = voxserve.load_voice(f"bark:{write_tiny_bark(work / 'bark' / 'tiny-bark')}", device=device)
    return len(v.synthesize("hello world.", voxserve.SynthesisOptions(seed=0, speaker="announcer")).samples)


def sbv2(device, work):
    import sbv2_fixtures as fx

    import voxserve

    folder = fx.write_model_folder("jp_extra", work / "sbv2" / "tiny-jp-extra")
    v = voxserve.load_voice(f"sbv2:{folder}", device=device, bert_dir=fx.write_bert_root(work / "sbv2" / "bert"))
    c = fx.meta()["models"]["jp_extra"]["cases"][0]
    a = fx.arrays()
    case = fx.with_bert(fx.Case("jp_extra", 0, c, a["jp_extra/0/phone_ids"], a["jp_extra/0/tone_ids"],
                                a["jp_extra/0/language_ids"], None, a["jp_extra/0/style_vec"],
                                a["jp_extra/0/wave"], a["jp_extra/0/durations"]))
    args = {k: ({lang: f.to(device) for lang, f in x.items()} if k == "bert" else
                x.to(device) if hasattr(x, "to") and k != "x_lengths" else x)
            for k, x in fx.batch_inputs([case]).items()}
    model = v.model
    out = model.infer(**args, noise_scale=0.0, noise_scale_w=0.0, sdp_ratio=0.0)
    return int(out.wave_lengths[0])


def cosyvoice2(device, work):
    import cv2_fixtures as fx
    import cv2_onnx_fixtures as onnx_fx

    import voxserve

    d = fx.write_model_folder(work / "cv2" / "tiny-cosyvoice2", speakers={"spk": fx.prompt_entry()})
    onnx_fx.write_standins(d)
    v = voxserve.load_voice(f"cosyvoice2:{d}", device=device)
    # random weights never pick EOS: a sentence runs to its length bound (20x its text tokens),
    # so the shortest text
    return len(v.synthesize("Hi.", voxserve.SynthesisOptions(seed=1, speaker="spk")).samples)


def main() -> int:
    device, work = sys.argv[1], Path(sys.argv[2])
    from voxserve.families import BUILTIN

    imported = ran = 0
    for name in BUILTIN:
        t = time.perf_counter()
        try:
            importlib.import_module(f"voxserve.families.{name}")
            imported += 1
            n = globals()[name](device, work)
            ran += 1
            print(f"  {name:<11} imported; tiny voice on {device}: {n} samples ({time.perf_counter() - t:.1f} s)")
        except Exception as e:  # report every family, then fail
            print(f"  {name:<11} FAILED: {type(e).__name__}: {e}")
            traceback.print_exc(file=sys.stderr)
    print(f"families: {imported} of {len(BUILTIN)} imported, {ran} tiny voices ran on {device}")
    return 0 if ran == len(BUILTIN) else 1


if __name__ == "__main__":
    sys.exit(main())
