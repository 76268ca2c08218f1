"""The command line starts like one: parsing (`voxserve --help`, every subcommand's flags) and
listing voices import neither PyTorch nor the web stack; those load only when a command needs
them (docs/benchmarks.md, "Command line start-up")."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "fastapi", "starlette", "uvicorn", "pydantic", "transformers", "onnxruntime", "av")


def _loaded_after(code: str) -> list[str]:
    probe = code + f"\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_building_every_subcommand_parser_imports_no_heavy_module():
    assert _loaded_after("import voxserve.cli as c\nc.build_parser()") == []


def test_help_imports_no_heavy_module():
    code = ("import voxserve.cli as c, contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        c.main(['--help'])\n    except SystemExit:\n        pass")
    assert _loaded_after(code) == []


def test_listing_voices_imports_no_heavy_module():
    code = ("import voxserve.cli as c, contextlib, io\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    assert c.main(['voices']) == 0")
    assert _loaded_after(code) == []
