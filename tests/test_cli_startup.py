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


def test_say_builds_no_other_subcommand_and_loads_no_number_words():
    """`say` builds only the built-in subcommands' parsers (the server's settings flags are many)
    and the text front end imports num2words only for a text with numbers (it imports every
    language)."""
    code = ("import voxserve.cli as c, argparse, contextlib, io, sys\n"
            "built = []\n"
            "real = argparse._SubParsersAction.add_parser\n"
            "def add_parser(self, name, **kw):\n    built.append(name)\n    return real(self, name, **kw)\n"
            "argparse._SubParsersAction.add_parser = add_parser\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        c.main(['say', '--help'])\n    except SystemExit:\n        pass\n"
            "import voxserve.text.frontend\n"
            "print(json.dumps([sorted(set(built) - {'say', 'voices', 'list', 'add', 'download'}), "
            "'num2words' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[], False]


def test_top_level_help_still_lists_every_subcommand(capsys):
    import pytest

    from voxserve.cli import main

    for argv in (["--help"], ["-h", "say"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert all(c in out for c in ("say", "voices", "serve", "bench", "loadtest")), argv


def test_say_in_its_own_process_lets_idle_openmp_threads_sleep(tiny_voice_path, tmp_path):
    """A command line's `say` sets OMP_WAIT_POLICY=PASSIVE before PyTorch loads its OpenMP
    runtime (spinning helpers cost a one-shot `say` several times its CPU time on a busy
    machine); a value the user set is kept, and main() called inside another program sets nothing."""
    import os

    code = ("import json, os, sys\nimport voxserve.cli as c\n"
            "own = sys.argv[2] == 'own'\n"
            "c._exit_now = lambda rc: None  # (a say in its own process ends there: see the next test)\n"
            "sys.argv = ['voxserve', 'say', 'Hello.', '--voice', 'tiny-multi', '--device', 'cpu', '-o', sys.argv[1]]\n"
            "rc = c.main(None if own else sys.argv[1:])\n"
            "print(json.dumps([rc, os.environ.get('OMP_WAIT_POLICY')]))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["VOXSERVE_VOICES_PATH"] = str(tiny_voice_path.parent)

    def policy(how: str, **extra) -> list:
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.wav"), how], capture_output=True,
                             text=True, timeout=120, env={**env, **extra})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert policy("own") == [0, "PASSIVE"]
    assert policy("own", OMP_WAIT_POLICY="ACTIVE") == [0, "ACTIVE"]
    assert policy("call") == [0, None]


def test_say_in_its_own_process_ends_without_the_interpreters_teardown(tiny_voice_path, tmp_path):
    """With PyTorch loaded, the interpreter's teardown cost a one-shot `say` ~0.3 s of CPU: its own
    process ends as soon as its output is closed (atexit handlers do not run), with its exit
    status and everything it printed; main() called inside another program returns."""
    import os

    code = ("import atexit, os, sys\nimport voxserve.cli as c\n"
            "atexit.register(lambda: print('torn down', flush=True))\n"
            "own, out, text = sys.argv[1] == 'own', sys.argv[2], sys.argv[3]\n"
            "sys.argv = ['voxserve', 'say', text, '--voice', 'tiny-multi', '--device', 'cpu', '-o', out]\n"
            "print('returned', c.main(None if own else sys.argv[1:]))")
    env = {**os.environ, "VOXSERVE_VOICES_PATH": str(tiny_voice_path.parent)}

    def run(how: str, text: str):
        return subprocess.run([sys.executable, "-c", code, how, str(tmp_path / "x.wav"), text], capture_output=True,
                              text=True, timeout=120, env=env)

    r = run("own", "Hello.")
    assert (r.returncode, r.stdout) == (0, "") and "wrote" in r.stderr
    import soundfile as sf

    assert len(sf.read(tmp_path / "x.wav")[0]) > 0
    r = run("own", "")  # an empty text: exit 2, its message printed
    assert r.returncode == 2 and "torn down" not in r.stdout and "error" in r.stderr
    r = run("call", "Hello.")
    assert r.returncode == 0 and r.stdout.split() == ["returned", "0", "torn", "down"]
