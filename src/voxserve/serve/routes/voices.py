"""The voice listings: /v1/voices (native) and /v1/audio/voices (OpenAI's shape)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..schemas import OPENAI_VOICES, AudioVoice, AudioVoicesResponse, VoiceInfo, VoicesResponse
from ..service import SpeechService, service

router = APIRouter()


def voice_infos(svc: SpeechService) -> VoicesResponse:
    out = []
    for name, v in svc.engine.voices.items():
        out.append(VoiceInfo(name=name, family=getattr(v, "family", ""), sample_rate=v.sample_rate,
                             speakers=list(v.speakers), styles=list(getattr(v, "styles", ())),
                             languages=list(v.language_codes), default=name == svc.default_voice))
    return VoicesResponse(voices=out, openai_aliases=sorted(OPENAI_VOICES))


@router.get("/v1/voices", response_model=VoicesResponse)
async def voices(svc: SpeechService = Depends(service)):
    return voice_infos(svc)


@router.get("/v1/audio/voices", response_model=AudioVoicesResponse)
async def audio_voices(svc: SpeechService = Depends(service)):
    infos = voice_infos(svc)
    data = [AudioVoice(id=v.name, **v.model_dump()) for v in infos.voices]
    return AudioVoicesResponse(data=data, voices=[v.id for v in data], openai_aliases=infos.openai_aliases)
