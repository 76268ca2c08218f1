"""Request validation over the wire against a real server: strict types, one error shape for
every 4xx (code always set, param a field name or null), one range rule for both routes, and
the audio bound's 413."""

from __future__ import annotations

import pytest

SPEECH = {"model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "pcm"}
SYNTH = {"text": "Hello.", "voice": "tiny-multi", "response_format": "pcm"}


def assert_error(r, status: int, code: str, param: str | None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    err = body["error"]
    assert (err["code"], err["param"]) == (code, param), err
    assert err["type"] == "invalid_request_error" and err["message"], err


@pytest.mark.parametrize("route,body,param", [
    ("/v1/synthesize", SYNTH | {"speed": True}, "speed"),
    ("/v1/synthesize", SYNTH | {"speed": "1.5"}, "speed"),
    ("/v1/synthesize", SYNTH | {"stream": "yes"}, "stream"),
    ("/v1/synthesize", SYNTH | {"stream": 1}, "stream"),
    ("/v1/synthesize", SYNTH | {"seed": 1.0}, "seed"),
    ("/v1/synthesize", SYNTH | {"seed": True}, "seed"),
    ("/v1/synthesize", SYNTH | {"speaker": True}, "speaker"),
    ("/v1/synthesize", SYNTH | {"noise_scale": False}, "noise_scale"),
    ("/v1/synthesize", SYNTH | {"text": 12}, "text"),
    ("/v1/audio/speech", SPEECH | {"speed": True}, "speed"),
    ("/v1/audio/speech", SPEECH | {"speed": "fast"}, "speed"),
    ("/v1/audio/speech", {"input": "Hi.", "voice": "alloy"}, "model"),
])
def test_wrong_types_are_422_naming_the_field(http_server, route, body, param):
    assert_error(http_server.client.post(route, json=body), 422, "invalid_schema", param)


def test_numbers_accept_ints_and_the_defaults_still_work(http_server):
    c = http_server.client
    assert c.post("/v1/synthesize", json=SYNTH | {"speed": 1, "noise_scale": 0, "seed": 3, "speaker": 1}).status_code == 200
    assert c.post("/v1/audio/speech", json=SPEECH | {"speed": 2}).status_code == 200


@pytest.mark.parametrize("raw", [
    b'\xff\xfe{"text": "Hello."}',  # not UTF-8 (a UTF-16 byte order mark)
    b'{"text": "caf\xe9."}',  # Latin-1
    b'{"text": "Hello.", "speed": 1,, }',
    b'{"text": "Hello."',
])
def test_malformed_bodies_are_one_shape(http_server, raw):
    r = http_server.client.post("/v1/synthesize", content=raw, headers={"content-type": "application/json"})
    assert_error(r, 422, "invalid_json", None)
    assert r.json()["error"]["message"].startswith("request body is not valid JSON")


def test_other_4xx_have_a_code(http_server):
    c = http_server.client
    assert_error(c.get("/v1/nothing-here"), 404, "not_found", None)
    assert_error(c.get("/v1/synthesize"), 405, "method_not_allowed", None)
    assert_error(c.post("/v1/synthesize", json=[1, 2]), 422, "invalid_schema", None)


@pytest.mark.parametrize("option,value", [("speed", 9), ("speed", 0.1), ("noise_scale", 3), ("noise_w", -1),
                                          ("sentence_silence", 11), ("temperature", 6), ("seed", -1)])
def test_one_range_rule_for_both_routes(http_server, option, value):
    c = http_server.client
    assert_error(c.post("/v1/synthesize", json=SYNTH | {option: value}), 400, "invalid_option", option)
    if option == "speed":  # the OpenAI route's one option: the same rule, the same answer
        r = c.post("/v1/audio/speech", json=SPEECH | {option: value})
        assert_error(r, 400, "invalid_option", option)


def test_audio_over_the_limit_is_413(http_server):
    text = " ".join(f"This is sentence number {k} of a long text." for k in range(1, 61))
    r = http_server.client.post("/v1/synthesize", json=SYNTH | {"text": text, "speed": 0.25})
    assert_error(r, 413, "audio_too_long", "max_audio_seconds")
    assert f"{http_server.max_audio_s:g} s" in r.json()["error"]["message"]
    assert http_server.client.post("/v1/synthesize", json=SYNTH).status_code == 200
