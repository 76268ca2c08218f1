"""Request and response bodies of the HTTP API (pydantic). The schema checks types only, and
strictly (a JSON number for a number, true/false for a boolean: `"speed": true` or
`"stream": "yes"` is a 422, not a silent coercion); value checks (option ranges, unknown
speaker, ...) are left to the library's own validation, the one place for bounds, so that they
come back as 400 with the library's message."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

# OpenAI's voice names. They map to the server's default voice (the first --voice), since no
# Piper voice is a copy of them; a client written for OpenAI then works unchanged.
OPENAI_VOICES = frozenset({
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
    "marin", "cedar",
})
# Model names OpenAI clients send; all of them mean "this server's engine".
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
MODEL_ID = "voxserve"

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech (OpenAI)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200)
    input: StrictStr
    voice: str = Field(min_length=1, max_length=200)
    response_format: ResponseFormat = "mp3"
    speed: StrictFloat = 1.0
    """Its range is the library's (out of range is a 400, as OpenAI answers)."""
    instructions: str | None = None
    """Accepted and ignored: Piper voices take no style prompt."""
    stream_format: Literal["audio"] = "audio"
    """Only raw audio streaming ('sse' is not offered)."""


class SynthesizeRequest(BaseModel):
    """POST /v1/synthesize (native): every SynthesisOptions field, the voice and the speaker
    (for a Bark voice, a speaker preset name or its index in /v1/voices' list)."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr
    voice: str | None = Field(default=None, max_length=200)
    """A voice loaded on this server; None = the default voice."""
    speaker: StrictInt | StrictStr | None = None
    speed: StrictFloat | None = None
    noise_scale: StrictFloat | None = None
    noise_w: StrictFloat | None = None
    sentence_silence: StrictFloat | None = None
    seed: StrictInt | None = None
    temperature: StrictFloat | None = None
    """Sampling temperature of token-generating voices (Bark; 0 = greedy); VITS voices ignore it."""
    response_format: ResponseFormat = "wav"
    stream: StrictBool = False
    """True: chunked bytes as sentences are made; False: the whole file, with Content-Length."""


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    """The request field at fault (a top-level field name), or None when it is the request as a whole."""
    code: str
    """Machine-readable reason, always set (e.g. invalid_option, invalid_json, request_timeout)."""


class ErrorResponse(BaseModel):
    """OpenAI's error shape."""

    error: ErrorBody


class VoiceInfo(BaseModel):
    name: str
    family: str
    sample_rate: int
    speakers: list[str]
    default: bool


class VoicesResponse(BaseModel):
    voices: list[VoiceInfo]
    openai_aliases: list[str]
    """OpenAI voice names accepted by /v1/audio/speech; they mean the default voice."""


class ModelInfo(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "voxserve"


class ModelsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelInfo]
