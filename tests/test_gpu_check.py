"""scripts/gpu-check's checks that need no GPU: the CUDA test files collect as one pytest run
(as the GPU machine runs them), the rehearsal's import rule hides what that machine lacks, and
the pack's wheels are built from installed distributions. The whole rehearsal
(`scripts/gpu-check --rehearse`) runs in CI (.ci/run)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ROOT / "scripts" / "gpu_check" / "offline"


def cuda_test_files() -> list[str]:
    """The files scripts/gpu-check runs: those that hold a test marked cuda."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if re.search(r"mark\.cuda", p.read_text(encoding="utf-8")))


def test_cuda_test_files_collect_together_without_errors():
    """One pytest run over every CUDA test file (tests/bark and tests/sbv2 together: a
    `from conftest import` there resolved to the other folder's conftest: 4 collection errors)."""
    files = cuda_test_files()
    assert len(files) >= 8 and any("bark" in f for f in files) and any("sbv2" in f for f in files)
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                        *files], cwd=ROOT, capture_output=True, text=True, timeout=600)
    last = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 0 and "error" not in last, r.stdout[-3000:]
    assert int(re.search(r"(\d+)(?:/\d+)? tests? collected", last).group(1)) >= 20, last


def test_the_rehearsal_hides_what_the_gpu_machine_lacks():
    probe = ("import importlib.util as u, json; "
             "print(json.dumps({n: u.find_spec(n) is not None for n in "
             "('fastapi', 'uvicorn', 'soundfile', 'num2words', 'torch', 'numpy', 'onnxruntime', 'voxserve')}))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(OFFLINE), str(ROOT / "src")]))
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120, check=True)
    import json

    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen == {"fastapi": False, "uvicorn": False, "soundfile": False, "num2words": False,
                    "torch": True, "numpy": True, "onnxruntime": True, "voxserve": True}


def test_pack_builds_pure_python_wheels_from_the_installation(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts" / "gpu_check"))
    try:
        from pack import wheel_from_installed
    finally:
        sys.path.pop(0)
    whl = wheel_from_installed("num2words", tmp_path)
    assert whl.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    assert "num2words/__init__.py" in names and any(n.endswith(".dist-info/RECORD") for n in names)
    assert not any("__pycache__" in n for n in names)
    r = subprocess.run([sys.executable, "-c", "import num2words, sys; print(num2words.__file__)"], text=True,
                       capture_output=True, env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")), check=True)
    assert r.stdout.startswith(str(tmp_path / "site"))
