"""Liveness, readiness, Prometheus metrics and the model list."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from ...audio import available_stream_formats
from ..http_errors import error_response
from ..metrics import CONTENT_TYPE_LATEST
from ..schemas import MODEL_ID, OPENAI_MODELS, ModelInfo, ModelsResponse
from ..service import SpeechService, service

router = APIRouter()


@router.get("/health")
async def health():
    return {"status": "ok"}


@router.get("/ready")
async def ready(svc: SpeechService = Depends(service)):
    if not svc.ready.is_set():
        return error_response(503, "not ready: voices are loading or warming up", "server_error", "not_ready")
    return {"status": "ready", "voices": list(svc.engine.voices), "formats": list(available_stream_formats())}


@router.get("/metrics")
async def metrics(svc: SpeechService = Depends(service)):
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_model=ModelsResponse)
async def models():
    return ModelsResponse(data=[ModelInfo(id=m) for m in (MODEL_ID,) + OPENAI_MODELS])
