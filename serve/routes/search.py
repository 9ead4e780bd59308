"""Searching a user's memories, narrowed by type, time, location or speaker as the runtime narrows any
search: every hit with its fused score and its rank and score on each path."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from serve.deps import Service, Tenant, public, scoped
from serve.schemas import SearchRequest, SearchResponse

router = APIRouter(tags=["search"])


@router.post(
    "/v1/search",
    response_model=SearchResponse,
    summary="search a user's memories; each hit has its rank and score per path",
)
def search(body: SearchRequest, state: Service, tenant_name: Tenant) -> dict:
    if body.k > state.config.max_k:
        raise HTTPException(422, f"k={body.k}; at most {state.config.max_k}")
    reference = body.reference_date.isoformat() if body.reference_date else None
    try:
        filters = body.filters()
    except ValueError as exc:  # a time that is no ISO date or interval
        raise HTTPException(422, f"time: {exc}") from None
    result = state.memory.search(
        body.query,
        user_id=scoped(tenant_name, body.user_id),
        k=body.k,
        reference_date=reference,
        filters=filters,
    )
    if result.assistant_context:
        state.metrics.recalls.inc()
    return {
        "query": result.query,
        "assistant_context": result.assistant_context,
        "hits": [
            {"score": h.score, "paths": h.paths, "record": public(h.record, body.user_id)}
            for h in result.hits
        ],
    }
