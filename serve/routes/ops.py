"""Operating the service: liveness and readiness (no key; readiness asks the store) and Prometheus
metrics (the operator's key only: they count every tenant's requests; off, 404, when no operator key
is configured)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response

from serve.deps import Operator, Service
from serve.guard import clip
from serve.schemas import Health, Readiness

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health, summary="liveness (no key needed)")
def health() -> dict:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "the store does not answer"}},
    summary="readiness: the store answers (no key needed)",
)
def ready(state: Service, response: Response) -> dict:
    try:
        problem = (
            None if state.memory.store.ping() else "the store does not answer or its schema is not current"
        )
    except Exception as exc:  # any failure to reach the store means: do not route traffic here
        problem = clip(f"{type(exc).__name__}: {exc}", 200)
    if problem:
        response.status_code = 503
        return {"status": "unavailable", "detail": problem}
    return {"status": "ready", "detail": None}


@router.get(
    "/metrics",
    response_model=str,
    response_class=PlainTextResponse,
    summary="Prometheus metrics (the operator key; 403 for tenant keys, 404 when off)",
    dependencies=[Operator],
)
def metrics(state: Service) -> Response:
    body, media_type = state.metrics.exposition()
    return Response(body, media_type=media_type)
