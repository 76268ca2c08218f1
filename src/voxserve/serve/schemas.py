"""Request and response bodies of the HTTP API (pydantic).

The schema checks types only, and strictly (a JSON number for a number, true/false for a
boolean: `"speed": true` or `"stream": "yes"` is a 422, not a silent coercion). Ranges appear in
the OpenAPI schema but are checked by the options' own rules (`OptionRule.check`, when the
request's options become its voice's: `voxserve.options.options_for`), the one place for bounds,
so that they come back as 400 with the library's message. The synthesis-option fields are every
registered family's (`voxserve.families.synthesis_rules`: each name once, with its one rule);
a request's voice takes those of its family's class and ignores the others (docs/serving.md,
"Options and families").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, create_model

from ..families import synthesis_families, synthesis_rules
from ..options import OptionRule
from ..voices.registry import OPENAI_VOICES  # noqa: F401  (the aliases; reserved as voice names there)

# Model names OpenAI clients send (the SDK's SpeechModel); all of them mean "this server's engine".
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
MODEL_ID = "voxserve"

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


def option_type(rule: OptionRule) -> Any:
    """The strict JSON type of an option, its range in the JSON schema (not enforced here)."""
    lo, hi = rule.range
    if rule.kind == "number":
        return Annotated[StrictFloat, Field(json_schema_extra={"minimum": lo, "maximum": hi})]
    if rule.kind == "integer":
        return Annotated[StrictInt, Field(json_schema_extra={"minimum": lo, "maximum": hi})]
    if rule.kind == "boolean":
        return StrictBool
    if rule.kind == "name":
        return Annotated[StrictStr, Field(json_schema_extra={"minLength": 1, "maxLength": rule.max_len})]
    return (Annotated[StrictInt, Field(json_schema_extra={"minimum": lo, "maximum": hi})]
            | Annotated[StrictStr, Field(json_schema_extra={"minLength": 1, "maxLength": rule.max_len})])


def option_fields(rules: Mapping[str, OptionRule]) -> dict[str, tuple[Any, Any]]:
    """pydantic field definitions for options by their rules (default None); the description
    names the families that take one that not every voice takes."""
    takers = synthesis_families()
    return {name: (option_type(rule) | None,
                   Field(default=None, description=rule.help_text + (f" [{', '.join(takers[name])} voices]"
                                                                     if name in takers else "")))
            for name, rule in rules.items()}


class VoiceRef(BaseModel):
    """OpenAI's voice object, `{"id": name}`: the same names as the plain string."""

    model_config = ConfigDict(extra="ignore")

    id: StrictStr = Field(min_length=1, max_length=200)


class _OptionsBody(BaseModel):
    """A request body that carries synthesis options (fields added by create_model)."""

    option_rules: ClassVar[Mapping[str, OptionRule]] = {}

    def option_values(self) -> dict[str, Any]:
        """The request's options by name (None: not set), not yet checked against their rules:
        `voxserve.options.options_for` does that, making them the voice's class."""
        return {name: getattr(self, name) for name in self.option_rules}


class _SpeechBase(_OptionsBody):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200)
    input: StrictStr
    voice: Annotated[StrictStr, Field(min_length=1, max_length=200)] | VoiceRef
    """A voice loaded on this server, an OpenAI voice name (the default voice), or `{"id": name}`."""
    response_format: ResponseFormat = "mp3"
    stream_format: Literal["audio", "sse"] = "audio"
    """'audio': the encoded bytes, chunked as sentences are made; 'sse': server-sent events,
    `speech.audio.delta` (base64 of those bytes) then `speech.audio.done` with usage."""

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


def speech_request_model(rules: Mapping[str, OptionRule] | None = None) -> type[_SpeechBase]:
    """The body of POST /v1/audio/speech: OpenAI's fields (so that its SDKs work unchanged) plus
    every synthesis option (`rules`, default every registered family's) as an optional extension
    (an OpenAI client sends them in `extra_body`); `speed` keeps OpenAI's default, 1.0,
    and out of range is a 400, as OpenAI answers."""
    rules = dict(synthesis_rules() if rules is None else rules)
    return create_model("SpeechRequest", __base__=_SpeechBase, __doc__=speech_request_model.__doc__,
                        option_rules=(ClassVar[Mapping[str, OptionRule]], rules), **_speech_option_fields(rules))


def _speech_option_fields(rules: Mapping[str, OptionRule]) -> dict[str, tuple[Any, Any]]:
    """The options of the speech route: every option, `speed` with OpenAI's default."""
    fields = option_fields(rules)
    fields["speed"] = (option_type(rules["speed"]), Field(1.0, description=rules["speed"].help_text))
    return fields


SpeechRequest = speech_request_model()


StreamFormat = Literal["mp3", "opus", "aac", "wav", "pcm"]
"""The formats /v1/audio/speech streams (flac is sent whole there, so not here)."""


class _StreamStartBase(_OptionsBody):
    model_config = ConfigDict(extra="forbid")

    type: Literal["start"]
    model: str = Field(MODEL_ID, min_length=1, max_length=200)
    voice: Annotated[StrictStr, Field(min_length=1, max_length=200)] | VoiceRef | None = None
    """As /v1/audio/speech's (an OpenAI name means the default voice); None: the default voice."""
    response_format: StreamFormat = "pcm"

    @property
    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


def stream_start_model(rules: Mapping[str, OptionRule] | None = None) -> type[_StreamStartBase]:
    """The first message of the /v1/audio/speech/stream WebSocket: {"type": "start"}, the voice,
    the format (default pcm) and the options of /v1/audio/speech (the same fields and defaults)."""
    rules = dict(synthesis_rules() if rules is None else rules)
    return create_model("SpeechStreamStart", __base__=_StreamStartBase, __doc__=stream_start_model.__doc__,
                        option_rules=(ClassVar[Mapping[str, OptionRule]], rules), **_speech_option_fields(rules))


SpeechStreamStart = stream_start_model()


class StreamText(BaseModel):
    """A piece of the text of a /v1/audio/speech/stream session (any size, split anywhere)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: StrictStr


class StreamEnd(BaseModel):
    """The end of a session's text: the rest is spoken, then `done` and the socket closes."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["end"]


class _SynthesizeBase(_OptionsBody):
    model_config = ConfigDict(extra="forbid")

    text: StrictStr
    voice: str | None = Field(default=None, max_length=200)
    """A voice loaded on this server; None = the default voice."""
    response_format: ResponseFormat = "wav"
    stream: StrictBool = False
    """True: chunked bytes as sentences are made; False: the whole file, with Content-Length."""


def synthesize_request_model(rules: Mapping[str, OptionRule] | None = None) -> type[_SynthesizeBase]:
    """The body of POST /v1/synthesize: text, voice, format, stream and every synthesis option
    (`rules`, default every registered family's; for a Bark voice, `speaker` is a preset name
    or its index in /v1/voices)."""
    rules = dict(synthesis_rules() if rules is None else rules)
    return create_model("SynthesizeRequest", __base__=_SynthesizeBase, __doc__=synthesize_request_model.__doc__,
                        option_rules=(ClassVar[Mapping[str, OptionRule]], rules), **option_fields(rules))


SynthesizeRequest = synthesize_request_model()


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
    styles: list[str] = []
    languages: list[str] = []
    """The languages it speaks, BCP-47 ("en-US", "ja": `Voice.language_codes`); where it
    speaks several, the `language` option takes each."""
    options: list[str] = []
    """The synthesis options it takes (its family's class: `Voice.synthesis_options`); a
    request's others are ignored."""
    default: bool


class AudioVoice(VoiceInfo):
    """One entry of GET /v1/audio/voices: OpenAI's voice object (id, name, object, created_at)
    with what a voxserve voice offers."""

    id: str
    object: Literal["audio.voice"] = "audio.voice"
    created_at: int = 0


class AudioVoicesResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[AudioVoice]
    voices: list[str]
    """The ids alone (the shape Kokoro-FastAPI clients read)."""
    openai_aliases: list[str]


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


class CaptionedSpeechRequest(SpeechRequest):
    """POST /v1/audio/captioned_speech: the /v1/audio/speech body, answered as JSON with the
    audio (base64) and its word timestamps; `stream` true: one NDJSON line per sentence."""

    stream: StrictBool = False
