"""The voices: /v1/voices (native) and /v1/audio/voices (OpenAI's shape) list them;
POST /v1/audio/voices makes one from a prompt recording and DELETE /v1/audio/voices/{name}
removes one so made (`ClonedVoices`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from ...families import synthesis_options_of
from ...options import option_rules
from ..clones import parse_form
from ..http_errors import BadRequest
from ..schemas import OPENAI_VOICES, AudioVoice, AudioVoicesResponse, VoiceInfo, VoicesResponse
from ..service import SpeechService, service

router = APIRouter()


def voice_infos(svc: SpeechService) -> VoicesResponse:
    out = []
    for name, v in svc.engine.voices.items():
        out.append(VoiceInfo(name=name, family=v.family, sample_rate=v.sample_rate,
                             speakers=list(v.speakers), styles=list(v.styles),
                             languages=list(v.language_codes), options=list(option_rules(synthesis_options_of(v))),
                             default=name == svc.default_voice))
    for name, base in svc.clones.made.items():
        out.append(clone_info(svc, name, base))
    return VoicesResponse(voices=out, openai_aliases=sorted(OPENAI_VOICES))


def clone_info(svc: SpeechService, name: str, base: str) -> VoiceInfo:
    v = svc.engine.voice(base)
    return VoiceInfo(name=name, family=v.family, sample_rate=v.sample_rate, speakers=[name],
                     languages=list(v.language_codes), options=list(option_rules(synthesis_options_of(v))), default=False)


@router.get("/v1/voices", response_model=VoicesResponse)
async def voices(svc: SpeechService = Depends(service)):
    return voice_infos(svc)


@router.get("/v1/audio/voices", response_model=AudioVoicesResponse)
async def audio_voices(svc: SpeechService = Depends(service)):
    infos = voice_infos(svc)
    data = [AudioVoice(id=v.name, **v.model_dump()) for v in infos.voices]
    return AudioVoicesResponse(data=data, voices=[v.id for v in data], openai_aliases=infos.openai_aliases)


def _text(form: dict, field: str, required: bool = True) -> str | None:
    if field not in form:
        if required:
            raise BadRequest(f"the form field {field!r} is missing", field, "invalid_input")
        return None
    data, _ = form[field]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"the form field {field!r} is not UTF-8 text", field, "invalid_input") from None


@router.post("/v1/audio/voices", status_code=201)
async def create_voice(request: Request, svc: SpeechService = Depends(service)):
    """multipart/form-data: `name`, `prompt_audio` (a recording: WAV, FLAC or OGG, up to 30 s),
    `prompt_text` (its words) and optionally `model` (the loaded voice that speaks it; default
    the first that makes voices from recordings)."""
    svc.check_ready()
    form = parse_form(request.headers.get("content-type", ""), await request.body())
    if "prompt_audio" not in form:
        raise BadRequest("the form field 'prompt_audio' (the recording) is missing", "prompt_audio", "invalid_input")
    name, text = _text(form, "name"), _text(form, "prompt_text")
    base = await svc.clones.add(name, form["prompt_audio"][0], text, _text(form, "model", required=False))
    info = clone_info(svc, name, base)
    body = AudioVoice(id=name, **info.model_dump()).model_dump()
    return JSONResponse({**body, "model": base}, status_code=201)


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(name: str, svc: SpeechService = Depends(service)):
    await svc.clones.delete(name)
    return {"id": name, "object": "audio.voice", "deleted": True}
