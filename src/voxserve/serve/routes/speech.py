"""OpenAI's speech routes: /v1/audio/speech (raw audio or server-sent events) and
/v1/audio/captioned_speech (JSON with word timestamps, or NDJSON per sentence); the native
/v1/synthesize shares their response path (`synthesis`)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...audio import EncoderOwner, SentenceJoiner, encode_audio
from ...engine import SpeechStream
from ...voice import joined_words
from ..http_errors import CLIENT_CLOSED, BadRequest, CutShort
from ..schemas import CaptionedSpeechRequest, SpeechRequest
from ..service import SpeechService, service

router = APIRouter()

CAPTION_STREAM_FORMATS = ("pcm", "wav")
"""Audio of a streamed captioned response's lines: each line's audio is a whole file."""


async def respond(svc: SpeechService, request: Request, stream: SpeechStream, encoder: EncoderOwner, fmt: str,
                  silence_s: float, chunked: bool) -> Response:
    media, headers = svc.headers_for(encoder, fmt)
    if chunked:
        return StreamingResponse(svc.body(request, stream, encoder, fmt, silence_s), media_type=media,
                                 headers=headers)
    try:
        chunks = await svc.collect(request, stream, encoder)
        if chunks is None:
            return Response(status_code=CLIENT_CLOSED)  # no one reads it; counted as a disconnect
        samples = SentenceJoiner(stream.sample_rate, silence_s).join(chunks)
        data = await svc.encode_whole(samples, stream.sample_rate, fmt)
    finally:
        stream.release_held()  # the whole answer's charge against the held-audio budget
    return Response(data, media_type=media, headers=headers)


async def synthesis(svc: SpeechService, request: Request, req, voice: str, options, text: str, streaming: bool,
                    chunked: bool) -> Response:
    stream, encoder = await svc.start(voice, text, options, req.response_format, streaming=streaming)
    silence = svc.engine.voice(voice).silence_after(options)
    return await respond(svc, request, stream, encoder, req.response_format, silence, chunked=chunked)


def _event(payload: dict) -> bytes:
    """One server-sent event holding a JSON object."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _sse(svc: SpeechService, request: Request, stream: SpeechStream, encoder: EncoderOwner, fmt: str,
               silence_s: float, input_chars: int) -> AsyncIterator[bytes]:
    """OpenAI's speech events: one `speech.audio.delta` per encoded chunk, then
    `speech.audio.done`. A failure after the first event is an `error` event, since the
    event framing (unlike raw bytes) can say so."""
    sent = [0]
    try:
        async for data in svc.body(request, stream, encoder, fmt, silence_s, sent):
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
    except CutShort as e:  # logged and counted: the event framing can say so
        yield _event({"type": "error", **e.error})
        return
    # voxserve has no tokens: usage counts input characters and output audio samples
    yield _event({"type": "speech.audio.done",
                  "usage": {"input_tokens": input_chars, "output_tokens": sent[0],
                            "total_tokens": input_chars + sent[0]}})


@router.post("/v1/audio/speech")
async def speech(req: SpeechRequest, request: Request, svc: SpeechService = Depends(service)):
    svc.check_model(req.model)
    voice, options = svc.voice_and_options(req.voice_name, True, req.option_values())
    if req.stream_format == "audio":
        # FLAC records its length (STREAMINFO total samples) only if known before its first
        # byte; libsndfile (soundfile.read) cannot read one without it: sent whole
        streamed = req.response_format != "flac"
        return await synthesis(svc, request, req, voice, options, req.input, streaming=streamed, chunked=streamed)
    stream, encoder = await svc.start(voice, req.input, options, req.response_format, streaming=True)
    media, headers = svc.headers_for(encoder, req.response_format)
    headers |= {"X-Audio-Media-Type": media, "X-Accel-Buffering": "no"}
    silence = svc.engine.voice(voice).silence_after(options)
    return StreamingResponse(_sse(svc, request, stream, encoder, req.response_format, silence, len(req.input)),
                             media_type="text/event-stream", headers=headers)


def words_json(words, offset: float = 0.0) -> list[dict]:
    return [{"word": w.word, "start": round(w.start + offset, 3), "end": round(w.end + offset, 3)}
            for w in words]


@router.post("/v1/audio/captioned_speech")
async def captioned_speech(req: CaptionedSpeechRequest, request: Request, svc: SpeechService = Depends(service)):
    """The speech body, answered as JSON: the whole file (base64) and its words, or with
    `stream`, NDJSON lines of one sentence each (pcm or wav), words in whole-audio time."""
    svc.check_model(req.model)
    voice, options = svc.voice_and_options(req.voice_name, True, req.option_values())
    if not getattr(svc.engine.voice(voice), "word_timestamps", False):  # (fakes lack it)
        raise BadRequest(f"voice {voice!r} gives no word timestamps; use /v1/audio/speech", "voice",
                         "unsupported_voice")
    fmt = req.response_format
    if req.stream and fmt not in CAPTION_STREAM_FORMATS:
        raise BadRequest(f"a streamed captioned response carries {' or '.join(CAPTION_STREAM_FORMATS)} "
                         f"audio, not {fmt!r}", "response_format", "unsupported_format")
    silence = svc.engine.voice(voice).silence_after(options)
    stream, encoder = await svc.start(voice, req.input, options, fmt, streaming=req.stream)
    if not req.stream:
        try:
            chunks = await svc.collect(request, stream, encoder)
            if chunks is None:
                return Response(status_code=CLIENT_CLOSED)
            sr = stream.sample_rate
            samples = SentenceJoiner(sr, silence).join(chunks)
            words = joined_words([(len(c.samples), c.words, c.partial) for c in chunks], sr, silence)
            data = await svc.encode_whole(samples, sr, fmt)
        finally:
            stream.release_held()
        return JSONResponse({"audio": base64.b64encode(data).decode("ascii"), "format": fmt,
                             "sample_rate": encoder.sample_rate, "words": words_json(words)},
                            headers={"Cache-Control": "no-store"})
    encoder.abandon()  # each line is encoded on its own
    return StreamingResponse(_caption_lines(svc, request, stream, fmt, silence), media_type="application/x-ndjson",
                             headers={"Cache-Control": "no-store", "X-Sample-Rate": str(stream.sample_rate)})


async def _caption_lines(svc: SpeechService, request: Request, stream: SpeechStream, fmt: str,
                         silence_s: float) -> AsyncIterator[bytes]:
    sr = stream.sample_rate
    joiner = SentenceJoiner(sr, silence_s)
    pos = 0  # samples of the whole sent so far
    parts: list[np.ndarray] = []  # this sentence's audio, its silence first
    words, lead = (), 0
    try:
        async for chunk in svc.timed_chunks(stream):
            got = joiner.pieces(chunk.samples, chunk.partial)
            if not parts:  # the chunk that starts a sentence: its words, after its silence
                lead, words = sum(len(p) for p in got[:-1]), chunk.words
            parts.extend(got)
            if chunk.partial:
                continue  # one line per sentence: wait for its rest
            samples = np.concatenate(parts)
            data = encode_audio(samples, sr, fmt)
            line = {"index": chunk.index, "audio": base64.b64encode(data).decode("ascii"), "format": fmt,
                    "sample_rate": sr, "offset": round(pos / sr, 6),
                    "words": words_json(words, (pos + lead) / sr)}
            yield (json.dumps(line) + "\n").encode()
            pos += len(samples)
            parts, words = [], ()
    except Exception as e:  # the status is sent: abort the connection, as `body` does
        raise svc.cut_short(request, stream, e) from e
    finally:
        stream.cancel()
