"""The front-end fuzz, run in a child process by test_frontend_fuzz.py (a native crash in espeak-ng,
pyopenjtalk or a tokenizer kills this process, and fails the test, not the test run).

usage: python frontend_fuzz_child.py VOICES_JSON EXAMPLES
VOICES_JSON maps a name to [spec, load_voice keyword arguments, synthesis options (its family's class)]. Each
pinned text, then EXAMPLES texts drawn by hypothesis (derandomised: the same texts every run), go
through every voice's front end (`voice.units`, consumed). A text's result is clean when it makes
units or raises one of the library's errors (VoxserveError: the server answers 4xx); anything else
is listed. Prints one JSON line: examples run, outcomes per voice, the unclean results.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import voxserve
from voxserve.errors import VoxserveError

MAX_CHARS = 4096  # the servers' input limit (serve/app.py max_input_chars)

# the texts, and espeak-ng's: each killed the process or was a 500
PINNED = [
    "https://" + "a." * 1000 + "com/" + "x/" * 500,
    "a." * 200, "a." * 150, "A." * 100, "é . " * 60, "ж." * 100, "'s" * 100, "a," * 300, "a@b." * 100,
    "[[ ]] " * 680, "1" + "0" * 51, "9" * 400, "9" * 4096, "$" + "9" * 400, "日" * 100, "\x1b[31m",
    "<speak>hi" + '<break time="10s"/>' * 10 + "bye</speak>", "<speak>", "\x00" * 10, "\u0301" * 500,
    "MMMCMXCIX " * 100, "x" * MAX_CHARS, "Hello world.",
]

UNITS = [
    "a.", "A.", "é . ", "'s", "a,", "a-", "x/", "[[ ]] ", "[[ a ]]", "[[", "]]", "...", "1", "0", "9", "12 ",
    "1,000", "3.14", "1st", "$", "$1", "£5", "%", "1/2", "10:30", "IV", "XIV ", "MMMCMXCIX", "日", "日本",
    "ア", "한", "ж", "é", "\u0301", "\u200d", "\ufeff", "🙂", "👍🏽", "\t", "\n", "\n\n", "\x1b[31m",
    "\x00", "\x07", "\u2028", "<", ">", "&", "&amp;", "http://", "www.", ".com", "@", "a@b.c", "Dr.",
    "e.g.", "U.S.", "—", "…", "½", "²", "①", "Ⅻ", "\u0660", " ", "-", "'", '"', "(", ")", "word",
    "Hello", "the", "and", "CamelCase", "iPhone15", "ß", "ﬁ", "ʃ", "שלום", "مرحبا", "नमस्ते", "ไทย",
]


@st.composite
def texts(draw) -> str:
    kind = draw(st.sampled_from(["repeat", "mix", "unicode", "url", "ssml"]))
    if kind == "repeat":  # a long run of one character or token
        unit = draw(st.sampled_from(UNITS) | st.text(min_size=1, max_size=5))
        return unit * draw(st.integers(1, MAX_CHARS // len(unit)))
    if kind == "mix":
        parts = draw(st.lists(st.sampled_from(UNITS), min_size=1, max_size=400))
        return draw(st.sampled_from(["", " ", ", ", ". ", "."])).join(parts)[:MAX_CHARS]
    if kind == "unicode":  # any code points: control, combining, surrogate-free
        return draw(st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=600))
    if kind == "url":
        host = ".".join(draw(st.lists(st.sampled_from(["a", "ab", "x1", "日本", "com", ""]), min_size=1, max_size=300)))
        path = "/".join(draw(st.lists(st.sampled_from(["x", "1", "%20", "?q=1&r=2", "#"]), max_size=300)))
        return draw(st.sampled_from(["https://", "mailto:me@", "www.", ""])) + host + "/" + path
    body = "".join(draw(st.lists(st.sampled_from(UNITS + ['<break time="1s"/>', "<p>", "</p>", "<s>"]),
                                 max_size=100)))
    return f"<speak>{body}</speak>"


def main() -> None:
    spec, n_examples = json.loads(sys.argv[1]), int(sys.argv[2])
    loaded = {name: (voxserve.load_voice(s, device="cpu", **kw), opts) for name, (s, kw, opts) in spec.items()}
    voices = {name: (v, v.synthesis_options(**opts)) for name, (v, opts) in loaded.items()}  # its family's class
    outcomes = {name: Counter() for name in voices}
    unclean: list[dict] = []
    seconds = Counter()

    def check(text: str) -> None:
        for name, (voice, opts) in voices.items():
            t0 = time.process_time()
            try:
                n = sum(1 for _ in voice.units(text, opts))
                outcomes[name]["units" if n else "no units"] += 1
            except VoxserveError as e:
                outcomes[name][type(e).__name__] += 1
            except Exception as e:  # noqa: BLE001 - the point: what is not the library's own error
                outcomes[name]["unclean"] += 1
                unclean.append({"voice": name, "text": text[:120], "len": len(text), "error": repr(e)[:300]})
            seconds[name] += time.process_time() - t0

    for text in PINNED:
        check(text)

    @settings(max_examples=n_examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(texts())
    def fuzz(text: str) -> None:
        check(text[:MAX_CHARS])

    fuzz()
    print(json.dumps({"pinned": len(PINNED), "examples": n_examples, "outcomes": outcomes,
                      "cpu_seconds": {k: round(v, 2) for k, v in seconds.items()}, "unclean": unclean}))


if __name__ == "__main__":
    main()
