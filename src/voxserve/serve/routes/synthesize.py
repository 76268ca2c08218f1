"""The native route: POST /v1/synthesize (text, voice, format, every synthesis option)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ..schemas import SynthesizeRequest
from ..service import SpeechService, service
from .speech import synthesis

router = APIRouter()


@router.post("/v1/synthesize")
async def synthesize(req: SynthesizeRequest, request: Request, svc: SpeechService = Depends(service)):
    voice, options = svc.voice_and_options(req.voice, False, req.option_values())
    return await synthesis(svc, request, req, voice, options, req.text, streaming=req.stream, chunked=req.stream)
