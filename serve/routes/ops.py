"""Operating the service: liveness (no key) and Prometheus metrics (the operator's key only: they count
every tenant's requests; off, 404, when no operator key is configured)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serve.deps import Operator, Service
from serve.schemas import Health

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health, summary="liveness (no key needed)")
def health() -> dict:
    return {"status": "ok"}


@router.get(
    "/metrics",
    response_model=str,
    response_class=PlainTextResponse,
    summary="Prometheus metrics (the operator key; 403 for tenant keys, 404 when off)",
    dependencies=[Operator],
)
def metrics(state: Service) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
