"""The help texts and docs that say what `--voice` takes name every family's `PREFIX:` (taken
from the family registry, so that a new family's prefix must reach them), and `voices add`
states the prompt length the code accepts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from voxserve.cli import build_parser
from voxserve.families import families

DOCS = Path(__file__).resolve().parents[1] / "docs"


def prefixes() -> list[str]:
    found = [f.prefix for f in families().values() if f.prefix]
    assert len(found) >= 4  # piper, sbv2, bark, cosyvoice2 at least: the registry was read
    return found


def _subcommand(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _help(path: tuple[str, ...], flag: str) -> str:
    parser = _subcommand(build_parser(), *path)
    return next(a.help for a in parser._actions if flag in a.option_strings)


def _voice_texts() -> dict[str, str]:
    texts = {f"{' '.join(cmd)} --voice": _help(cmd, "--voice") for cmd in (("say",), ("serve",), ("wyoming",))}
    config = (DOCS / "configuration.md").read_text(encoding="utf-8")
    rows = [line for line in config.splitlines() if line.startswith(("| `--voice`", "| `--voice [", "| `name_or_path`"))]
    assert len(rows) >= 3, rows  # serve's --voice, say's --voice, load_voice's name_or_path
    texts.update({f"configuration.md row {i} ({row.split('|')[1].strip()})": row for i, row in enumerate(rows)})
    serving = (DOCS / "serving.md").read_text(encoding="utf-8")
    bullet = re.search(r"^\* `--voice` \(repeatable\).*?(?=^\* )", serving, re.M | re.S)
    assert bullet, "serving.md's --voice bullet"
    texts["serving.md --voice"] = bullet.group(0)
    return texts


@pytest.mark.parametrize("where", sorted(_voice_texts()))
def test_every_family_prefix_is_named_where_voice_sources_are_listed(where):
    text = _voice_texts()[where]
    missing = [p for p in prefixes() if f"{p}:" not in text]
    assert not missing, f"{where} leaves out {missing}: {text}"


def test_voices_add_states_the_prompt_length_the_code_accepts():
    from voxserve.families.cosyvoice2.frontend import MAX_SECONDS, MIN_SECONDS

    help_ = _help(("voices", "add"), "--prompt-wav")
    assert f"{MIN_SECONDS:g}-{MAX_SECONDS:g} s" in help_, help_
    assert f"{MIN_SECONDS:g}-{MAX_SECONDS:g} s" in (DOCS / "cosyvoice2.md").read_text(encoding="utf-8")
