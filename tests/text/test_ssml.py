"""SSML input for Piper voices: the parser (safe, bounded), each element's effect on the sentences
and the audio, auto-detection, and the 400 at the HTTP edge."""

from __future__ import annotations

import re
import time
import tracemalloc

import numpy as np
import pytest

from voxserve import InvalidOptionError
from voxserve.errors import InvalidInputError
from voxserve.families.piper import PiperOptions
from voxserve.text.ssml import MAX_DEPTH, Break, Span, looks_like_ssml, parse_ssml, say_as

QUIET = PiperOptions(noise_scale=0.0, noise_w=0.0)  # durations and samples deterministic


# ---------------------------------------------------------------- parser

def test_elements_become_spans_and_breaks():
    doc = parse_ssml(
        '<speak>Hello <break time="500ms"/>world. <s>One</s><s>two</s>'
        '<p>The <sub alias="World Wide Web">WWW</sub> and <phoneme alphabet="ipa" ph="təmˈɑːtoʊ">tomato</phoneme>.</p>'
        '<prosody rate="slow">slow <prosody rate="50%">slower</prosody> back</prosody>'
        ' fish &amp; chips <emphasis>kept</emphasis> <mark name="m"/>end<break strength="x-strong"/><break/></speak>')
    assert doc == [
        Span("Hello"), Break(0.5), Span("world."), Span("One"), Span("two"),
        Span("The World Wide Web and [[ təmˈɑːtoʊ ]]."),
        Span("slow", 0.8), Span("slower", 0.4), Span("back", 0.8),
        Span("fish & chips kept end"), Break(1.0), Break(0.5),
    ]


@pytest.mark.parametrize("kind,content,fmt,words", [
    ("characters", "IBM", None, "I-B-M"),
    ("characters", "a1", None, "A-one"),
    ("cardinal", "1,234", None, "one thousand two hundred thirty-four"),
    ("cardinal", "-7", None, "minus seven"),
    ("ordinal", "22", None, "twenty-second"),
    ("ordinal", "3rd", None, "third"),
    ("date", "2026-12-01", None, "December first, twenty twenty-six"),
    ("date", "12/25/1990", "mdy", "December twenty-fifth, nineteen ninety"),
    ("date", "25/12/1990", "dmy", "December twenty-fifth, nineteen ninety"),
    ("telephone", "+1 555-0100", None, "plus one, five five five, zero one zero zero"),
    ("cardinal", "many", None, "many"),  # not a number: kept, the normaliser reads it as usual
])
def test_say_as(kind, content, fmt, words):
    assert say_as(content, kind, fmt) == words
    attr = f' format="{fmt}"' if fmt else ""
    assert parse_ssml(f'<speak><say-as interpret-as="{kind}"{attr}>{content}</say-as></speak>') == [Span(words)]


@pytest.mark.parametrize("doc,where,what", [
    ("<speak>unclosed", "line 1, column 16", "no element found"),
    ("<speak>\n  <s>one</p></speak>", "line 2, column 11", "mismatched tag"),
    ("<speak>&nbsp;</speak>", "line 1, column 8", "undefined entity"),
    ("<notspeak>x</notspeak>", "line 1", "root element must be <speak>"),
    ('<speak><break time="11s"/></speak>', "line 1", "at most 10s"),
    ('<speak><break time="soon"/></speak>', "line 1", "like 500ms or 2s"),
    ('<speak><break strength="huge"/></speak>', "line 1", "strength"),
    ('<speak><prosody rate="10%">x</prosody></speak>', "line 1", "outside 0.25..4"),
    ('<speak><prosody rate="zippy">x</prosody></speak>', "line 1", "x-slow..x-fast"),
    ('<speak><phoneme ph="a ]] b">x</phoneme></speak>', "line 1", "without [[ or ]]"),
    ("<speak><sub>x</sub></speak>", "line 1", "alias"),
    ("<speak>a</speak><speak>b</speak>", "line 1, column 17", "junk after document element"),
])
def test_malformed_ssml_names_the_position(doc, where, what):
    with pytest.raises(InvalidInputError, match=re.escape(what)) as e:
        parse_ssml(doc)
    assert where in str(e.value)


BILLION_LAUGHS = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
                  + "".join(f'<!ENTITY lol{k} "{("&lol" + str(k - 1) + ";") * 10 if k > 1 else "&lol;" * 10}">'
                            for k in range(1, 10))
                  + ']><speak>&lol9;</speak>')
EXTERNAL = [
    '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>',
    '<!DOCTYPE speak SYSTEM "http://127.0.0.1:9/evil.dtd"><speak>x</speak>',
    '<!DOCTYPE speak [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><speak>x</speak>',
]


@pytest.mark.parametrize("doc", [BILLION_LAUGHS, *EXTERNAL])
def test_entities_and_doctypes_are_refused_fast_in_bounded_memory(doc):
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(InvalidInputError, match="DOCTYPE"):
        parse_ssml(doc)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 0.5 and peak < 1 << 20


def test_nesting_is_bounded():
    ok = "<speak>" + "<s>" * (MAX_DEPTH - 1) + "deep" + "</s>" * (MAX_DEPTH - 1) + "</speak>"
    assert parse_ssml(ok) == [Span("deep")]
    deep = "<speak>" + "<emphasis>" * MAX_DEPTH + "x" + "</emphasis>" * MAX_DEPTH + "</speak>"
    with pytest.raises(InvalidInputError, match=f"nested deeper than {MAX_DEPTH}"):
        parse_ssml(deep)


def test_size_is_bounded():
    from voxserve.text.ssml import MAX_SSML_CHARS

    with pytest.raises(InvalidInputError, match="at most"):
        parse_ssml("<speak>" + "a" * MAX_SSML_CHARS + "</speak>")


# ---------------------------------------------------------------- selection

def test_auto_detection():
    assert looks_like_ssml("<speak>Hi</speak>")
    assert looks_like_ssml('  \n<?xml version="1.0"?>\n<speak version="1.1">Hi</speak>')
    assert not looks_like_ssml("Hi <speak>there</speak>")
    assert not looks_like_ssml("<speaker> is a word")


def test_plain_text_with_angle_brackets_is_unchanged(joe_voice):
    fe = joe_voice.frontend
    for text in ("If 3 < 5 and 7 > 2, say <b>bold</b>.", "<speakers> are loud."):
        as_text = [s.ids for s in fe.iter_document(fe.document(text, "text"))]
        assert [s.ids for s in fe.iter_document(fe.document(text))] == as_text
        assert as_text == [s.ids for s in fe.iter_sentences(text)]


def test_speak_root_is_read_as_ssml(joe_voice):
    ssml = [s.text for s in joe_voice.units('<speak>Hello <sub alias="there">here</sub>.</speak>')]
    assert ssml == ["Hello there."]
    # input_format="text" reads the tags as text; "ssml" requires a document
    assert [u.text for u in joe_voice.units("<speak>Hi.</speak>", PiperOptions(input_format="text"))] \
        == ["<speak>Hi.</speak>"]
    with pytest.raises(InvalidInputError, match="root element must be <speak>|no element found|syntax error"):
        joe_voice.units("Hello.", PiperOptions(input_format="ssml"))
    with pytest.raises(InvalidOptionError, match="input_format"):
        joe_voice.units("Hello.", PiperOptions(input_format="xml"))


def test_phoneme_is_said_as_given(joe_voice):
    fe = joe_voice.frontend
    (s,) = [x for x in fe.iter_document(fe.document('<speak>Say <phoneme ph="təmˈɑːtoʊ">tomato</phoneme> now.</speak>'))]
    assert s.ids == fe.sentences("Say [[ təmˈɑːtoʊ ]] now.")[0].ids


# ---------------------------------------------------------------- audio

def _len(voice, text, opts=QUIET) -> int:
    return len(voice.synthesize(text, opts).samples)


@pytest.mark.parametrize("attr,seconds", [('time="500ms"', 0.5), ('time="2s"', 2.0), ('strength="weak"', 0.25),
                                          ('strength="none"', 0.0)])
def test_break_is_exact_silence(joe_voice, attr, seconds):
    sr = joe_voice.sample_rate
    base = '<speak>Hello there. How are you?</speak>'
    with_break = f'<speak>Hello there. <break {attr}/>How are you?</speak>'
    a = joe_voice.synthesize(with_break, QUIET).samples
    n = _len(joe_voice, base)
    assert len(a) - n == round(seconds * sr)  # exact, so within a frame
    first = _len(joe_voice, "<speak>Hello there.</speak>")
    assert np.all(a[first:first + round(seconds * sr)] == 0)  # the silence is where the break is


def test_break_adds_to_sentence_silence_and_ends_a_text(joe_voice):
    sr = joe_voice.sample_rate
    opts = PiperOptions(noise_scale=0.0, noise_w=0.0, sentence_silence=0.25)
    plain = _len(joe_voice, "<speak>One. Two.</speak>", opts)
    assert _len(joe_voice, '<speak>One. <break time="1s"/>Two.</speak>', opts) - plain == sr
    assert _len(joe_voice, '<speak>One. Two.<break time="1s"/></speak>', opts) - plain == sr + round(0.25 * sr)


def test_prosody_rate_changes_duration_in_proportion(joe_voice):
    text = "This sentence is said at several speaking rates."
    normal = _len(joe_voice, f"<speak>{text}</speak>")
    slow = _len(joe_voice, f'<speak><prosody rate="50%">{text}</prosody></speak>')
    fast = _len(joe_voice, f'<speak><prosody rate="x-fast">{text}</prosody></speak>')
    assert _len(joe_voice, f'<speak><prosody rate="medium">{text}</prosody></speak>') == normal
    assert 1.6 <= slow / normal <= 2.1  # twice as slow (the voice's fixed edges make it a little less)
    assert 0.6 <= fast / normal <= 1 / 1.5 + 0.05  # x-fast: 1.5 times as fast
    # it is the length scale: as the speed option gives it
    assert slow == _len(joe_voice, text, PiperOptions(noise_scale=0.0, noise_w=0.0, speed=0.5))


def test_ssml_audio_streams(joe_voice):
    text = '<speak><s>First sentence here.</s><break time="300ms"/><s>Second one.</s><break time="1s"/></speak>'
    chunks = list(joe_voice.stream(text, QUIET))
    whole = joe_voice.synthesize(text, QUIET).samples
    # batched apart from the whole text's batch: the same audio up to float rounding
    np.testing.assert_allclose(np.concatenate([c.samples for c in chunks]), whole, atol=1e-4)
    assert chunks[-1].is_last and np.all(chunks[-1].samples == 0)


# ---------------------------------------------------------------- HTTP

@pytest.fixture(scope="module")
def http(joe_voice):
    from fastapi.testclient import TestClient

    from voxserve.engine import Engine, EngineConfig, SchedulerConfig
    from voxserve.serve.app import AppConfig, create_app

    eng = Engine([joe_voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    app = create_app(eng, AppConfig(warmup=False, shutdown_timeout_s=5))
    with TestClient(app) as c:
        yield c


def _post(c, text, **kw):
    body = {"text": text, "noise_scale": 0, "noise_w": 0, "response_format": "pcm"} | kw
    return c.post("/v1/synthesize", json=body)


def test_http_malformed_ssml_is_400(http):
    r = _post(http, "<speak>\n<s>Hello</p></speak>")
    assert r.status_code == 400, r.text
    assert "line 2, column" in r.json()["error"]["message"]
    r = _post(http, "<speak>Hi</speak>", input_format="yaml")
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_format", r.text


LONG = "this first sentence is long enough for a stream to send its head before the rest of it"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("with_break,without", [
    ('<speak>Hello there. <break time="750ms"/>How are you?</speak>', "<speak>Hello there. How are you?</speak>"),
    # a break before the first sentence: in the head of a streamed first sentence
    (f'<speak><break time="750ms"/>Well, {LONG}.</speak>', f"<speak>Well, {LONG}.</speak>"),
])
def test_http_break_is_exact(http, joe_voice, stream, with_break, without):
    a = _post(http, with_break, stream=stream)
    b = _post(http, without, stream=stream)
    assert a.status_code == b.status_code == 200, a.text
    assert (len(a.content) - len(b.content)) // 2 == round(0.75 * joe_voice.sample_rate)
    head = np.frombuffer(a.content, "<i2")[:round(0.75 * joe_voice.sample_rate)]
    if with_break.startswith("<speak><break"):
        assert not head.any()


def test_characters_are_letter_names(joe_voice):
    fe = joe_voice.frontend
    (s,) = list(fe.iter_document(fe.document('<speak><say-as interpret-as="characters">abc</say-as></speak>')))
    assert "".join(s.phonemes).startswith("ˈeɪ")  # the letter, not the article "a"
