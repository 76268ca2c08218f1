"""espeak-ng never sees text that overflows its buffers (issue 49): texts that crashed the
process are phonemised in a child process (a native crash fails the test, not the run), and
text a sentence is made of still reaches espeak-ng whole (its phonemes unchanged)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from voxserve.text.phonemize import MAX_CLAUSE_WORDS, MAX_DOTTED_LETTERS, MAX_WORD_CHARS, espeak_pieces

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "en_bench.jsonl"

# each of these wrote past a buffer of espeak-ng 1.52 under AddressSanitizer; the first three
# killed the process (SIGSEGV) without it
CRASHERS = [
    "a." * 150,
    "https://" + "a." * 1000 + "com/" + "x/" * 500,
    "A." * 100,
    "é . " * 60,  # espeak-ng's own crash vector (dotted-abbrev-stack-oob)
    "ж." * 100,
    "'s" * 100,
    "a," * 300,
    "a-" * 300,
    "a\n" * 300,
    "a(b)" * 300,
    "a@b." * 100,
    "U.S." * 50,
]


def _run_child(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                          timeout=timeout)


def test_texts_that_crashed_espeak_ng_are_phonemised():
    code = ("import json, sys\nfrom voxserve.text.phonemize import phonemize\n"
            f"for t in json.loads({json.dumps(json.dumps(CRASHERS))}):\n"
            "    print(len(phonemize(t, 'en-us')), flush=True)\n")
    r = _run_child(code)
    assert r.returncode == 0, f"died on text {len(r.stdout.split())} ({r.returncode}): {r.stderr[-800:]}"
    assert all(int(n) > 0 for n in r.stdout.split())


@pytest.mark.parametrize("voice", ["de", "fr", "es", "ru", "hu"])
def test_other_voices_survive_them_too(voice):
    code = ("import json\nfrom voxserve.text.phonemize import phonemize\n"
            f"for t in json.loads({json.dumps(json.dumps(CRASHERS[:4]))}):\n"
            f"    phonemize(t, {voice!r})\n")
    r = _run_child(code)
    assert r.returncode == 0, r.stderr[-800:]


def _sentences() -> list[str]:
    texts = [json.loads(line)["text"] for line in CORPUS.read_text().splitlines() if line.strip()]
    return texts + [
        "U.S.A. and e.g. the U.K., i.e. a.k.a. R.S.V.P. by 5 p.m.",
        "J. R. R. Tolkien met C. S. Lewis.", "Donaudampfschifffahrtsgesellschaftskapitänswitwe.",
        "https://example.com/some/path?x=1&y=2 or mail me at first.last@example.org.",
        "It's the cat's toy, isn't it? Rock'n'roll, y'all!", "CamelCaseWords and iPhone15Pro, 3.14159265358979",
        " ".join(["word"] * 190),  # a clause of 190 words, no punctuation
        "日本語のテキストです。", "Привет, мир! Γειά σου κόσμε.",
    ]


def test_sentences_reach_espeak_ng_whole():
    for text in _sentences():
        assert espeak_pieces(text) == [text], text[:60]


def test_pieces_keep_every_character_and_stay_within_the_bounds():
    for text in CRASHERS + ["x" * 4096, "a " * 2000, "1" * 4000, "日" * 1000, "aB" * 500]:
        pieces = espeak_pieces(text)
        assert "".join(pieces) == text
        assert all(len(w) <= MAX_WORD_CHARS for p in pieces for w in re.findall(r"[\w'\u2019]+", p))
    assert len(espeak_pieces("a." * (MAX_DOTTED_LETTERS + 1))) == 2
    assert len(espeak_pieces("a " * (MAX_CLAUSE_WORDS + 1))) == 2
    assert espeak_pieces("a, " * (MAX_CLAUSE_WORDS + 1)) == ["a, " * (MAX_CLAUSE_WORDS + 1)]  # clauses end at ", "

