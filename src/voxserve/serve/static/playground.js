// voxserve playground: streams speech from this server's API and plays it as it arrives.
// Server data only ever reaches the page as textContent or attribute values (never as markup),
// and every request goes to this page's own origin (relative URLs).
"use strict";

const $ = (id) => document.getElementById(id);
const MODEL = "voxserve";
const MAX_LINE_CHARS = 64 << 20; // one NDJSON line is one sentence's audio in base64: far below this

let voices = [];
let session = null; // the request being played: {abort, player, timer}
let blobUrls = [];

// ----------------------------------------------------------------------------- requests
function headers(type) {
  const h = {};
  if (type) h["Content-Type"] = type;
  const key = $("apikey").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// body: undefined (GET), a Blob (sent as it is, with its type) or an object (sent as JSON)
function api(path, body, signal) {
  const blob = body instanceof Blob;
  return fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: headers(body === undefined ? null : blob ? body.type : "application/json"),
    body: body === undefined || blob ? body : JSON.stringify(body),
    signal,
    cache: "no-store",
    credentials: "same-origin",
  });
}

async function errorText(r) {
  try {
    const j = await r.json();
    if (j && j.error && typeof j.error.message === "string") return j.error.message;
  } catch (e) { /* not the API's JSON error shape */ }
  return "HTTP " + r.status;
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").classList.toggle("error", !!isError);
}

// ----------------------------------------------------------------------------- voices
function fillSelect(sel, names, none) {
  sel.replaceChildren();
  const def = document.createElement("option");
  def.value = "";
  def.textContent = names.length ? "(default)" : none;
  sel.append(def);
  for (const name of names) {
    const o = document.createElement("option");
    o.value = name;
    o.textContent = name;
    sel.append(o);
  }
  sel.disabled = names.length === 0;
}

function selectedVoice() {
  return voices.find((v) => v.name === $("voice").value) || null;
}

function onVoiceChange() {
  const v = selectedVoice();
  fillSelect($("speaker"), v ? v.speakers : [], "(single speaker)");
  fillSelect($("style"), v ? v.styles : [], "(no styles)");
  const langs = v && v.languages.length ? " · languages: " + v.languages.join(", ") : "";
  $("voice-info").textContent = v ? `${v.family} · ${v.sample_rate} Hz${langs}` : "";
}

async function loadVoices() {
  let r;
  try {
    r = await api("v1/voices");
  } catch (e) {
    setStatus("Cannot reach the server: " + e.message, true);
    return;
  }
  if (r.status === 401) {
    $("key-box").open = true;
    setStatus("This server needs an API key: enter it under “API key”.", true);
    return;
  }
  if (!r.ok) {
    setStatus("Could not list voices: " + (await errorText(r)), true);
    return;
  }
  voices = (await r.json()).voices;
  const sel = $("voice");
  sel.replaceChildren();
  for (const v of voices) {
    const o = document.createElement("option");
    o.value = v.name;
    o.textContent = v.name;
    o.selected = v.default;
    sel.append(o);
  }
  onVoiceChange();
  $("speak").disabled = voices.length === 0;
  setStatus(voices.length ? "Ready." : "This server has no voices.", !voices.length);
}

// ----------------------------------------------------------------------------- audio
// Plays s16le mono chunks through Web Audio as they come, back to back, and keeps them for the
// WAV file at the end. time() is the playback position in the whole audio (seconds).
class Player {
  constructor(sampleRate) {
    this.ctx = new AudioContext();
    this.sampleRate = sampleRate;
    this.chunks = [];
    this.total = 0; // samples scheduled so far
    this.start = null; // ctx time at which sample 0 plays
  }

  push(pcm) {
    if (!pcm.length) return;
    this.chunks.push(pcm);
    const f = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) f[i] = pcm[i] / 32768;
    const buf = this.ctx.createBuffer(1, f.length, this.sampleRate);
    buf.copyToChannel(f, 0);
    const src = this.ctx.createBufferSource();
    src.buffer = buf;
    src.connect(this.ctx.destination);
    const now = this.ctx.currentTime;
    if (this.start === null) this.start = now + 0.05;
    let when = this.start + this.total / this.sampleRate;
    if (when < now) { // the stream fell behind playback: play the rest later, times included
      this.start += now + 0.02 - when;
      when = this.start + this.total / this.sampleRate;
    }
    src.start(when);
    this.total += pcm.length;
  }

  time() {
    return this.start === null ? -1 : this.ctx.currentTime - this.start;
  }

  duration() {
    return this.total / this.sampleRate;
  }

  samples() {
    const out = new Int16Array(this.total);
    let at = 0;
    for (const c of this.chunks) { out.set(c, at); at += c.length; }
    return out;
  }

  close() {
    this.ctx.close().catch(() => {});
  }
}

// little-endian s16 from bytes, whatever the platform's byte order
function s16le(bytes) {
  const n = bytes.length >> 1;
  const out = new Int16Array(n);
  const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
  for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true);
  return out;
}

function base64Bytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function wavBlob(samples, sampleRate) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (at, s) => { for (let i = 0; i < s.length; i++) header.setUint8(at + i, s.charCodeAt(i)); };
  const bytes = samples.length * 2;
  text(0, "RIFF"); header.setUint32(4, 36 + bytes, true); text(8, "WAVE");
  text(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
  header.setUint32(24, sampleRate, true); header.setUint32(28, sampleRate * 2, true);
  header.setUint16(32, 2, true); header.setUint16(34, 16, true);
  text(36, "data"); header.setUint32(40, bytes, true);
  return new Blob([header, pcmBytes(samples)], { type: "audio/wav" });
}

function pcmBytes(samples) {
  const view = new DataView(new ArrayBuffer(samples.length * 2));
  for (let i = 0; i < samples.length; i++) view.setInt16(2 * i, samples[i], true);
  return view.buffer;
}

function blobUrl(blob) {
  const url = URL.createObjectURL(blob);
  blobUrls.push(url);
  return url;
}

// ----------------------------------------------------------------------------- words
let wordSpans = []; // [{span, start, end}] in order of start

function addWords(words) {
  const box = $("words");
  for (const w of words) {
    if (typeof w.word !== "string" || !Number.isFinite(w.start) || !Number.isFinite(w.end)) continue;
    const span = document.createElement("span");
    span.textContent = w.word;
    if (box.childNodes.length) box.append(" ");
    box.append(span);
    wordSpans.push({ span, start: w.start, end: w.end });
  }
}

// the word whose [start, end) holds the playback time gets the "current" class: the time of the
// <audio> element once it has played (the finished file), else that of the streamed playback
function highlighter(player) {
  let lit = null;
  const audio = $("audio");
  const timer = { live: true };
  const tick = () => {
    if (!timer.live) return;
    requestAnimationFrame(tick); // each frame: a word of a few tens of ms is not skipped
    const t = audio.played.length || !audio.paused ? audio.currentTime : player.time();
    const total = player.duration();
    $("clock").textContent = total ? `${Math.min(Math.max(t, 0), total).toFixed(2)} / ${total.toFixed(2)} s` : "";
    let hit = null;
    for (const w of wordSpans) {
      if (w.start > t) break;
      if (t < w.end) { hit = w; break; }
    }
    if (hit === lit) return;
    if (lit) lit.span.classList.remove("current");
    if (hit) hit.span.classList.add("current");
    lit = hit;
  };
  requestAnimationFrame(tick);
  return timer;
}

// ----------------------------------------------------------------------------- streams
async function playCaptioned(r, player, signal) {
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  const line = (s) => {
    if (!s.trim()) return;
    const msg = JSON.parse(s);
    if (msg.format !== "pcm" || typeof msg.audio !== "string") throw new Error("unexpected stream line");
    if (Number.isFinite(msg.sample_rate) && player.total === 0) player.sampleRate = msg.sample_rate;
    player.push(s16le(base64Bytes(msg.audio)));
    addWords(Array.isArray(msg.words) ? msg.words : []);
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      line(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
    }
    if (buf.length > MAX_LINE_CHARS) throw new Error("stream line too long");
    if (signal.aborted) return;
  }
  line(buf);
}

async function playRaw(r, player, signal) {
  const reader = r.body.getReader();
  let odd = null; // a byte left over when a chunk ends mid-sample
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    let bytes = value;
    if (odd !== null) {
      bytes = new Uint8Array(value.length + 1);
      bytes[0] = odd;
      bytes.set(value, 1);
    }
    odd = bytes.length % 2 ? bytes[bytes.length - 1] : null;
    player.push(s16le(bytes));
    if (signal.aborted) return;
  }
}

// the /v1/audio/speech body: OpenAI's fields, speaker and style as voxserve's extensions
function speechBody(text, format) {
  const body = { model: MODEL, input: text, voice: $("voice").value, response_format: format,
    speed: Number($("speed").value) };
  if ($("speaker").value) body.speaker = $("speaker").value;
  if ($("style").value) body.style = $("style").value;
  return body;
}

function stop(ev) {
  if (!session) return;
  if (ev) setStatus("Stopped.");
  session.abort.abort();
  if (session.timer) session.timer.live = false;
  session.player && session.player.close();
  session = null;
  $("stop").disabled = true;
}

async function speak(ev) {
  ev.preventDefault();
  stop(null);
  const text = $("text").value.trim();
  if (!text) { setStatus("Type some text first.", true); return; }
  const v = selectedVoice();
  if (!v) { setStatus("No voice selected.", true); return; }
  for (const url of blobUrls) URL.revokeObjectURL(url);
  blobUrls = [];
  wordSpans = [];
  $("words").replaceChildren();
  $("clock").textContent = "";
  $("note").textContent = "";
  $("download").hidden = true;
  $("audio").removeAttribute("src");

  const format = $("format").value;
  const abort = new AbortController();
  const player = new Player(v.sample_rate);
  session = { abort, player, timer: null };
  $("stop").disabled = false;
  const began = performance.now();
  setStatus("Synthesising…");
  try {
    // word timestamps where the voice has them; else (a 400, or a server without the route)
    // the plain speech stream, without highlighting
    const body = speechBody(text, "pcm"); // the selectors as they were when Speak was pressed
    let r = await api("v1/audio/captioned_speech", { ...body, stream: true }, abort.signal);
    const captioned = r.ok;
    if (!captioned) {
      if (r.status !== 400 && r.status !== 404 && r.status !== 405) throw new Error(await errorText(r));
      $("note").textContent = "No word highlighting for this voice (" + (await errorText(r)) + ").";
      r = await api("v1/audio/speech", body, abort.signal);
      if (!r.ok) throw new Error(await errorText(r));
      player.sampleRate = Number(r.headers.get("X-Sample-Rate")) || player.sampleRate;
    }
    setStatus("Playing as it streams…");
    session.timer = highlighter(player);
    const play = captioned ? playCaptioned : playRaw;
    await play(r, player, abort.signal);
    if (abort.signal.aborted) return;
    const secs = player.duration();
    const latency = ((performance.now() - began) / 1000).toFixed(2);
    setStatus(`Done: ${secs.toFixed(2)} s of audio${captioned ? `, ${wordSpans.length} words` : ""} (stream took ${latency} s).`);
    await finish(player, format, abort.signal);
  } catch (e) {
    if (abort.signal.aborted) return;
    setStatus("Failed: " + e.message, true);
  }
}

// the whole audio for the player and the download link, once the stream has ended
async function finish(player, format, signal) {
  const samples = player.samples();
  const wav = wavBlob(samples, player.sampleRate);
  let url = blobUrl(wav);
  $("audio").src = url;
  if (format === "pcm") {
    url = blobUrl(new Blob([pcmBytes(samples)], { type: "application/octet-stream" }));
  } else if (format !== "wav") {
    // the samples played, encoded by the server: asking for the text again would not give the
    // same audio (sampling noise; a seed only where every family and batch agrees)
    const r = await api("v1/audio/encode?response_format=" + encodeURIComponent(format), wav, signal);
    if (!r.ok) throw new Error("download as " + format + ": " + (await errorText(r)));
    url = blobUrl(await r.blob());
  }
  const a = $("download");
  a.href = url;
  a.download = "speech." + format;
  a.textContent = "Download (" + format + ")";
  a.hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", speak);
  $("stop").addEventListener("click", stop);
  $("voice").addEventListener("change", onVoiceChange);
  // the finished file played from its controls: the streamed playback stops, not both at once
  $("audio").addEventListener("play", () => { if (session) session.player.ctx.suspend().catch(() => {}); });
  $("speed").addEventListener("input", () => { $("speed-value").textContent = Number($("speed").value).toFixed(2); });
  $("key-apply").addEventListener("click", loadVoices);
  $("speak").disabled = true;
  loadVoices();
});
