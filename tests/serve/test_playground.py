"""The web playground at `/`: its page and assets over HTTP (in-process, a fake voice), then the
page itself in a real headless browser (Debian's chromium driven by Playwright) against the app
served by uvicorn on a free loopback port, with the real default voice.

Without chromium or playwright the browser tests skip, except under CI (env CI set), where they
fail: CI must run them."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from serve_fakes import FakeVoice
from server_process import ROOT, free_port

from voxserve.engine import Engine, EngineConfig, SchedulerConfig
from voxserve.serve.app import AppConfig, create_app
from voxserve.serve.playground import ASSETS, CSP

STATIC = ROOT / "src" / "voxserve" / "serve" / "static"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--autoplay-policy=no-user-gesture-required"]
KEY = "pl4yground-k3y"


def fake_client(api_key=None) -> TestClient:
    eng = Engine([FakeVoice(sample_rate=16000)], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    return TestClient(create_app(eng, AppConfig(api_key=api_key, warmup=False, shutdown_timeout_s=5)))


@pytest.fixture(scope="module")
def client():
    with fake_client() as c:
        yield c


# ----------------------------------------------------------------------------- HTTP
def test_page_has_a_strict_csp_and_no_inline_code(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert csp == CSP
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'" and directives["default-src"] == "'none'"
    assert directives["connect-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in csp and "*" not in csp and "http" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"

    class Audit(HTMLParser):
        scripts, inline, handlers, styles, external = [], [], [], [], []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "script":
                self.scripts.append(a.get("src"))
            if tag == "style":
                self.inline.append(tag)
            self.handlers += [k for k in a if k.startswith("on")]
            self.styles += [k for k in a if k == "style"]
            self.external += [v for k, v in a.items() if k in ("src", "href") and v and ("//" in v or ":" in v)]

        def handle_data(self, data):
            if self.lasttag == "script" and data.strip():
                self.inline.append(data)

    audit = Audit()
    audit.feed(r.text)
    assert audit.scripts == ["static/playground.js"]
    assert not audit.inline and not audit.handlers and not audit.styles  # CSP would block them
    assert not audit.external  # everything from this origin: works offline


def test_assets_are_served_from_the_package_with_their_types(client):
    for name, media in ASSETS.items():
        r = client.get(f"/static/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"] == media and r.headers["x-content-type-options"] == "nosniff"
        assert r.content == (STATIC / name).read_bytes()
    assert client.get("/favicon.ico").content == (STATIC / "favicon.svg").read_bytes()
    for bad in ("/static/nope.js", "/static/index.html", "/static/..%2fapp.py", "/static/../app.py"):
        r = client.get(bad)
        assert r.status_code == 404, bad
        assert r.json()["error"]["code"], bad  # the API's error shape


def test_script_sets_no_html_and_calls_only_its_own_origin():
    js = (STATIC / "playground.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in js, sink
    calls = re.findall(r"""api\(\s*["']([^"']+)["']""", js)
    assert set(calls) == {"v1/voices", "v1/audio/captioned_speech", "v1/audio/speech", "v1/audio/encode?response_format="}
    assert not re.search(r"https?://", js)  # relative URLs only (fetch goes through api())
    assert js.count("fetch(") == 1


def test_page_and_assets_need_no_key_and_the_api_keeps_it():
    with fake_client(api_key=KEY) as c:
        for path in ("/", "/favicon.ico", *(f"/static/{n}" for n in ASSETS)):
            assert c.get(path).status_code == 200, path
        assert c.get("/v1/voices").status_code == 401
        assert c.get("/static/nope.js").status_code == 401  # not an asset: not public
        assert c.post("/v1/synthesize", json={"text": "Hello."}).status_code == 401
        assert c.get("/v1/voices", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


WAV = {"Content-Type": "audio/wav"}  # as the page sends it (a body with no type is taken for JSON)


def _wav(samples, rate: int) -> bytes:
    from voxserve.audio import wav_header

    return wav_header(rate, len(samples)) + samples.astype("<i2").tobytes()


def _decoded(data: bytes):
    import io

    import soundfile as sf

    return sf.read(io.BytesIO(data), dtype="int16")


def test_encode_route_encodes_exactly_the_samples_sent(client):
    """What the playground's download of a played text goes through: the samples it received,
    encoded; lossless formats give them back sample for sample, lossy ones at the same length."""
    import numpy as np

    from voxserve.audio import float_to_int16
    from voxserve.serve.encode import int16_to_float

    every = np.arange(-32767, 32768, dtype=np.int16)  # every sample value a stream can hold
    np.testing.assert_array_equal(float_to_int16(int16_to_float(every)), every)
    rng = np.random.default_rng(0)
    rate = 22050
    samples = (rng.standard_normal(int(rate * 3.3)) * 6000).clip(-32767, 32767).astype(np.int16)
    for fmt in ("wav", "flac", "pcm"):
        r = client.post(f"/v1/audio/encode?response_format={fmt}", content=_wav(samples, rate), headers=WAV)
        assert r.status_code == 200, r.text
        assert r.headers["x-sample-rate"] == str(rate)
        got = np.frombuffer(r.content, "<i2") if fmt == "pcm" else _decoded(r.content)[0]
        np.testing.assert_array_equal(got, samples, err_msg=fmt)
    r = client.post("/v1/audio/encode?response_format=mp3", content=_wav(samples, rate), headers=WAV)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    got, got_rate = _decoded(r.content)
    # the encoder's delay and last frame's padding: under two mp3 frames (1152 samples each)
    assert got_rate == rate and 0 <= len(got) - len(samples) < 2 * 1152, (len(got), len(samples))
    # opus at a rate Opus has not: resampled to 48 kHz, the same duration
    r = client.post("/v1/audio/encode?response_format=opus", content=_wav(samples, rate), headers=WAV)
    assert r.status_code == 200 and r.headers["x-sample-rate"] == "48000"
    got, got_rate = _decoded(r.content)
    assert got_rate == 48000 and abs(len(got) / 48000 - len(samples) / rate) < 0.03, len(got)


def test_encode_route_refuses_what_is_not_its_audio(client):
    import numpy as np

    from voxserve.serve.encode import MAX_SECONDS

    def post(body, fmt="mp3"):
        r = client.post(f"/v1/audio/encode?response_format={fmt}", content=body, headers=WAV)
        return r.status_code, r.json()["error"]["message"]

    one = np.zeros(1600, np.int16)
    assert post(_wav(one, 16000), "xyz")[0] == 400
    assert post(b"RIFF not really a wav file")[0] == 400
    stereo = bytearray(_wav(np.zeros(3200, np.int16), 16000))
    stereo[22] = 2  # channels
    assert post(bytes(stereo)) == (400, "the audio must be 16-bit mono PCM WAV, not 2 channel(s) of 16-bit samples")
    assert post(_wav(one, 96000))[0] == 400
    cut = _wav(one, 16000)[:-100]
    assert post(cut)[0] == 400
    # a header that claims more than MAX_SECONDS is refused before anything is encoded
    long_header = bytearray(_wav(one, 8000))
    n = int(MAX_SECONDS * 8000) + 8000
    long_header[40:44] = (2 * n).to_bytes(4, "little")
    status, message = post(bytes(long_header))
    assert status == 413 and "the limit" in message
    with fake_client(api_key=KEY) as c:  # an API route: the key applies
        assert c.post("/v1/audio/encode?response_format=mp3", content=_wav(one, 16000), headers=WAV).status_code == 401


def test_encode_route_takes_bodies_over_the_server_body_limit(client):
    """Minutes of audio are over the 1 MiB body limit of the JSON routes."""
    import numpy as np

    samples = np.zeros(16000 * 60, np.int16)  # 1 min at 16 kHz: 1.9 MB
    body = _wav(samples, 16000)
    assert len(body) > AppConfig().max_body_bytes
    r = client.post("/v1/audio/encode?response_format=flac", content=body, headers=WAV)
    assert r.status_code == 200 and len(_decoded(r.content)[0]) == len(samples)
    assert client.post("/v1/synthesize", content=body, headers={"Content-Type": "application/json"}).status_code == 413


def test_page_requests_are_counted_under_their_route(client):
    client.get("/")
    client.get("/static/playground.js")
    text = client.get("/metrics").text
    assert re.search(r'^voxserve_requests_total\{route="/",status="200"\} [1-9]', text, re.M), text[:2000]


@pytest.mark.slow
def test_wheel_carries_the_static_files(tmp_path):
    # build from a copy of the tree, so that no build output lands in the checkout
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                              "benchmarks", "corpus", "docs", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("voxserve-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("index.html", *ASSETS):
        assert f"voxserve/serve/static/{name}" in names, name


# ----------------------------------------------------------------------------- browser
def _browser_or_skip():
    why = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why = "playwright is not installed (pip install playwright)"
    if why is None and not os.access(CHROMIUM, os.X_OK):
        why = f"no {CHROMIUM} (apt-get install chromium)"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"the browser test must run in CI: {why}")
        pytest.skip(why)


class LiveServer:
    """The app around `engine` served by uvicorn in a thread on a free loopback port."""

    def __init__(self, engine, config: AppConfig):
        import uvicorn

        from voxserve.serve.app import http_protocol

        self.app = create_app(engine, config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    http=http_protocol(self.app)))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.05)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


class Browser:
    """Headless chromium (a fresh profile) and one page, with every console message and page
    error it produced."""

    def __init__(self, profile: Path):
        from playwright.sync_api import sync_playwright

        self.pw = sync_playwright().start()
        try:
            self.context = self.pw.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000)
        except BaseException:
            self.pw.stop()
            raise
        self.context.set_default_timeout(60_000)
        self.page = self.context.pages[0] if self.context.pages else self.context.new_page()
        self.console: list[tuple[str, str, str]] = []  # (type, text, url)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.console.append((m.type, m.text, m.location.get("url", ""))))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def console_errors(self, allow=lambda text, url: False) -> list:
        return [m for m in self.console if m[0] in ("error", "warning") and not allow(m[1], m[2])] + self.errors

    @contextlib.contextmanager
    def state_on_timeout(self):
        """A wait that times out says what the page showed (status, note, clock, words, the
        audio clock's state) and what it logged, not only which selector it waited for."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            yield
        except PlaywrightTimeout as e:
            state = self.page.evaluate("""() => ({status: document.getElementById('status').textContent,
                note: document.getElementById('note').textContent,
                clock: document.getElementById('clock').textContent,
                words: document.querySelectorAll('#words span').length,
                hidden: document.hidden})""")
            raise AssertionError(f"{e.message.splitlines()[0]}; page: {state}; console: {self.console_errors()}") from e

    def close(self):
        try:
            self.context.close()
        finally:
            self.pw.stop()


@pytest.fixture(scope="module")
def tiny_voice(tiny_voice_path):
    import voxserve

    return voxserve.load_voice(str(tiny_voice_path), device="cpu")


@pytest.fixture(scope="module")
def joe_server(joe_voice, tiny_voice):
    """The default voice, and a tiny one with three speakers at another rate."""
    eng = Engine({joe_voice.name: joe_voice, tiny_voice.name: tiny_voice},
                 EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0), max_queue_wait_s=3600))
    s = LiveServer(eng, AppConfig(warmup=False, shutdown_timeout_s=5))
    yield s
    s.stop()


@pytest.fixture
def browser(tmp_path):
    _browser_or_skip()
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


TEXT = "The weather is lovely today. Let us go for a walk."


def test_page_speaks_plays_and_offers_the_download(joe_server, joe_voice, browser):
    import voxserve

    page = browser.page
    response = page.goto(joe_server.url, wait_until="load")
    assert response.status == 200
    assert response.headers["content-security-policy"] == CSP
    page.wait_for_function("() => document.querySelectorAll('#voice option').length > 0")
    assert page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)") == [joe_voice.name, "tiny-multi"]
    assert page.input_value("#voice") == joe_voice.name  # the server's default
    assert page.is_disabled("#speaker") and page.is_disabled("#style")  # one speaker, no styles
    assert page.text_content("#status") == "Ready."
    assert browser.console_errors() == []  # loading the page: not one error or warning

    page.fill("#text", TEXT)
    page.click("#speak")
    # streamed playback: the Web Audio clock moves (the page shows the position played)
    page.wait_for_function("() => parseFloat(document.getElementById('clock').textContent) > 0.2", timeout=120_000)
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('Done')", timeout=120_000)
    page.wait_for_function("() => document.getElementById('audio').readyState >= 2", timeout=30_000)
    duration = page.eval_on_selector("#audio", "a => a.duration")
    expected = joe_voice.synthesize(TEXT, voxserve.SynthesisOptions()).duration
    assert 0.75 * expected < duration < 1.33 * expected, (duration, expected)
    page.wait_for_function("() => !document.getElementById('download').hidden")
    href = page.get_attribute("#download", "href")
    assert href.startswith("blob:" + joe_server.url.rstrip("/"))
    assert page.get_attribute("#download", "download") == "speech.wav"
    # the download is the WAV the page played (a click, as a user downloads it)
    data = download(page)
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    assert int.from_bytes(data[24:28], "little") == joe_voice.sample_rate
    n = int.from_bytes(data[40:44], "little")
    assert len(data) == 44 + n and abs(n / 2 / joe_voice.sample_rate - duration) < 0.01
    assert browser.console_errors() == []


def download(page) -> bytes:
    with page.expect_download(timeout=30_000) as d:
        page.click("#download")
    return Path(d.value.path()).read_bytes()


def played(page):
    """The samples the page played (its Player: what went to Web Audio) and their rate (the
    page's CSP keeps even its own blob: URLs from fetch)."""
    import base64

    import numpy as np

    b64, rate = page.evaluate("""() => {
        const bytes = new Uint8Array(session.player.samples().buffer);
        let s = '';
        for (let i = 0; i < bytes.length; i += 8192) s += String.fromCharCode(...bytes.subarray(i, i + 8192));
        return [btoa(s), session.player.sampleRate];
    }""")
    return np.frombuffer(base64.b64decode(b64), np.int16), rate


@pytest.mark.parametrize("fmt", ["flac", "mp3"])
def test_page_downloads_exactly_the_audio_it_played(fmt, joe_server, browser):
    """The download in another format is the samples played, encoded (not the text synthesised
    again, which gave 7.05 s of mp3 for 6.88 s heard): flac sample for sample, mp3 at the same
    length but for the codec's padding."""
    import numpy as np

    page = browser.page
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(joe_server.url, wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('#voice option').length > 0")
    page.fill("#text", "Short and sweet. Then a second sentence, a little longer than the first.")
    page.select_option("#format", fmt)
    page.click("#speak")
    page.wait_for_function("() => !document.getElementById('download').hidden", timeout=120_000)
    assert page.get_attribute("#download", "download") == f"speech.{fmt}"
    assert page.get_attribute("#download", "href").startswith("blob:")
    heard, rate = played(page)
    assert len(heard) > rate  # over a second
    data = download(page)
    got, got_rate = _decoded(data)
    assert got_rate == rate
    if fmt == "flac":
        assert data[:4] == b"fLaC"
        np.testing.assert_array_equal(got, heard)
    else:
        assert 0 <= len(got) - len(heard) < 2 * 1152, (len(got), len(heard))
    # one synthesis: the download encoded what was played
    assert sum(u.endswith(("/v1/audio/speech", "/v1/audio/captioned_speech")) for u in requests) == 1, requests
    assert any(f"/v1/audio/encode?response_format={fmt}" in u for u in requests), requests
    assert browser.console_errors() == []


def test_page_asks_for_the_key_and_then_uses_it(browser):
    eng = Engine([FakeVoice(sample_rate=16000)], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    server = LiveServer(eng, AppConfig(api_key=KEY, warmup=False, shutdown_timeout_s=5))
    try:
        page = browser.page
        assert page.goto(server.url, wait_until="load").status == 200
        page.wait_for_function("() => document.getElementById('status').textContent.includes('API key')")
        assert page.eval_on_selector("#key-box", "d => d.open") is True
        assert page.eval_on_selector_all("#voice option", "os => os.length") == 0
        page.fill("#apikey", KEY)
        page.click("#key-apply")
        page.wait_for_function("() => document.querySelectorAll('#voice option').length > 0")
        assert page.text_content("#status") == "Ready."
        # the one error is the browser's note of the 401 that made the page ask for the key
        errors = browser.console_errors()
        assert len(errors) == 1 and "401" in errors[0][1] and errors[0][2].endswith("/v1/voices"), errors
    finally:
        server.stop()


def test_chosen_voice_speaker_and_speed_are_what_the_page_asks_for(joe_server, browser):
    page = browser.page
    bodies = []
    page.on("request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("/v1/audio/speech")
            or r.url.endswith("/v1/audio/captioned_speech") else None)
    page.goto(joe_server.url, wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('#voice option').length > 0")
    page.select_option("#voice", "tiny-multi")
    assert page.eval_on_selector_all("#speaker option", "os => os.map(o => o.value)") == ["", "spk0", "spk1", "spk2"]
    assert "16000 Hz" in page.text_content("#voice-info")
    page.select_option("#speaker", "spk2")
    page.fill("#speed", "1.5")  # a range input: fill sets its value and fires input
    assert page.text_content("#speed-value") == "1.50"
    page.fill("#text", "One two three. Four five six.")
    page.click("#speak")
    page.wait_for_function("() => !document.getElementById('download').hidden", timeout=120_000)
    assert bodies and all(b["voice"] == "tiny-multi" and b["speaker"] == "spk2" and b["speed"] == 1.5
                          and b["response_format"] == "pcm" and "style" not in b for b in bodies), bodies
    data = download(page)
    assert int.from_bytes(data[24:28], "little") == 16000  # the WAV at the voice's own rate
    assert page.eval_on_selector_all("#words span", "s => s.length") == 6  # its words, highlighted
    assert browser.console_errors() == []


def _captions_refused(text: str, url: str) -> bool:
    """The browser's note of the captioned route's 400 for a voice without timestamps, which
    sends the page to /v1/audio/speech."""
    return url.endswith("/v1/audio/captioned_speech") and "400" in text


def test_voice_without_timestamps_plays_the_plain_stream_exactly(browser):
    import numpy as np

    from voxserve.audio import float_to_int16

    voice = FakeVoice(sample_rate=16000)
    eng = Engine([voice], EngineConfig(scheduler=SchedulerConfig(max_wait_ms=0)))
    server = LiveServer(eng, AppConfig(warmup=False, shutdown_timeout_s=5))
    try:
        page = browser.page
        page.goto(server.url, wait_until="load")
        page.wait_for_function("() => document.querySelectorAll('#voice option').length > 0")
        text = "Hello there. General Kenobi. You are a bold one."
        page.fill("#text", text)
        page.click("#speak")
        page.wait_for_function("() => !document.getElementById('download').hidden", timeout=60_000)
        assert page.text_content("#note").startswith("No word highlighting for this voice")
        assert page.eval_on_selector_all("#words span", "s => s.length") == 0
        data = download(page)
        # the stream as the network cut it, put back together sample for sample
        np.testing.assert_array_equal(np.frombuffer(data[44:], "<i2"), float_to_int16(voice.expected(text)))
        assert browser.console_errors(allow=_captions_refused) == []
    finally:
        server.stop()


def test_stop_ends_the_stream_quietly(joe_server, browser):
    page = browser.page
    page.goto(joe_server.url, wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('#voice option').length > 0")
    page.fill("#text", " ".join(f"This is sentence number {k} of a text long enough to stop." for k in range(12)))
    page.click("#speak")
    page.wait_for_function("() => parseFloat(document.getElementById('clock').textContent) > 0.2", timeout=120_000)
    page.click("#stop")
    assert page.text_content("#status") == "Stopped." and page.is_disabled("#stop")
    clock = page.text_content("#clock")
    page.wait_for_timeout(500)
    assert page.text_content("#clock") == clock  # the position no longer moves
    assert page.is_hidden("#download") and not page.get_attribute("#audio", "src")
    assert browser.console_errors() == []


def test_word_being_spoken_is_highlighted(joe_server, browser):
    page = browser.page
    page.goto(joe_server.url, wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('#voice option').length > 0")
    # every change of the highlighted word, in order (recorded by the test, not the page)
    page.evaluate("""() => { window.__lit = []; new MutationObserver(() => {
        const s = document.querySelector('#words span.current');
        const i = s ? [...s.parentNode.children].indexOf(s) : -1;
        if (i >= 0 && window.__lit[window.__lit.length - 1] !== i) window.__lit.push(i);
      }).observe(document.getElementById('words'), {subtree: true, attributes: true, attributeFilter: ['class']}); }""")
    page.fill("#text", TEXT)
    page.click("#speak")
    with browser.state_on_timeout():
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('Done')",
                               timeout=120_000)
        # the clock reads "t / total s" from the streamed audio; the <audio> element may not
        # have loaded its metadata yet when Done shows, so its duration is not used
        page.wait_for_function("""() => { const m = document.getElementById('clock').textContent
            .match(/^([0-9.]+) \\/ ([0-9.]+) s$/); return m && parseFloat(m[1]) >= parseFloat(m[2]) - 0.05; }""",
                               timeout=60_000)
    words = page.eval_on_selector_all("#words span", "s => s.map(x => x.textContent)")
    lit = page.evaluate("() => window.__lit")
    assert page.text_content("#note") == ""  # no fallback
    assert [w.strip(".,") for w in words] == TEXT.replace(".", "").split()
    assert lit == sorted(lit) and len(set(lit)) == len(lit)  # forward only, each word once
    assert len(lit) >= len(words) - 2, (lit, words)  # a frame or two may miss the shortest word
    assert browser.console_errors() == []
