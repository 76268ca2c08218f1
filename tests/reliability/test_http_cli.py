"""`voxserve serve` refuses bad input before it serves: exit 2 and one line on stderr, like every
other bad flag (the real command, as a subprocess)."""

from __future__ import annotations

import os

import pytest
from server_process import serve


@pytest.mark.parametrize("args,says", [
    (["--api-key="], "--api-key is empty"),
    (["--api-key", "  "], "--api-key is empty"),
    (["--voice", "missing.onnx"], "missing.onnx"),
])
def test_bad_serve_input_exits_2_with_one_line(args, says, tmp_path):
    env = {**os.environ, "VOXSERVE_API_KEY": "from-env", "VOXSERVE_VOICES_PATH": str(tmp_path)}
    p = serve(*args, env=env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("voxserve: error:") and says in lines[0], p.stderr
