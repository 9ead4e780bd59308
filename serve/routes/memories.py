"""Writing and reading a user's memories: add (extract + store), extract only, list with filters and
paging, one record, update, delete and its history. Record ids contain "/" and "#"
(`<conversation>/w0003#m2`): percent-encode them in paths."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response

from serve.deps import RecordId, Service, Tenant, check_messages, found, public, scoped
from serve.schemas import (
    NAME_PATTERN,
    AddRequest,
    AddResponse,
    ExtractRequest,
    ExtractResponse,
    HistoryEntry,
    MemoryPage,
    MemoryType,
    Status,
    StoredMemory,
    UpdateRequest,
    UserId,
)

router = APIRouter(tags=["memories"])


@contextmanager
def _known(record_id: str) -> Iterator[None]:
    """The runtime's KeyError for a record the user does not have, as a 404."""
    try:
        yield
    except KeyError:
        found(None, record_id)


@router.post(
    "/v1/memories",
    response_model=AddResponse,
    summary="extract memories from messages and store them for a user",
)
def add(body: AddRequest, state: Service, tenant_name: Tenant) -> dict:
    messages = check_messages(state, body.messages)
    # the runtime locks its own store per record: other requests go on during the model calls and
    # between this add's writes; a conversation_id already stored is appended to, never rewritten
    result = state.memory.add(
        messages, user_id=scoped(tenant_name, body.user_id), conversation_id=body.conversation_id
    )
    state.metrics.stored.inc(sum(e["action"] != "UNCHANGED" for e in result.events))
    return {
        "conversation_id": result.conversation_id,
        "windows": result.windows,
        "events": result.events,
        "rejected": result.rejected,
        "failed": result.failed,
    }


@router.post(
    "/v1/extract",
    response_model=ExtractResponse,
    summary="extract memories from messages without storing them",
)
def extract(body: ExtractRequest, state: Service, _: Tenant) -> dict:
    result = state.memory.extract(check_messages(state, body.messages))
    return {
        "conversation_id": result.conversation.id,
        "windows": result.windows,
        "memories": result.records,
        "rejected": result.rejected,
        "failed": result.failed,
    }


@router.get(
    "/v1/memories",
    response_model=MemoryPage,
    summary="a user's memories, oldest first, a page at a time (filters: type, status, conversation, time)",
)
def list_memories(
    state: Service,
    tenant_name: Tenant,
    user_id: Annotated[UserId, Query()],
    type: Annotated[MemoryType | None, Query()] = None,
    status: Annotated[Status | Literal["any"], Query(description="'any': every status")] = "active",
    conversation_id: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME_PATTERN)] = None,
    time: Annotated[
        str | None,
        Query(
            max_length=40, description="ISO date, partial date or interval: records whose time overlaps it"
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, description="page size; capped by the service's max_page_size")] = 100,
    cursor: Annotated[str | None, Query(max_length=500, description="a previous page's next_cursor")] = None,
) -> dict:
    filters = {"type": type, "status": status, "conversation_id": conversation_id, "time": time}
    page = state.memory.get_all(
        user_id=scoped(tenant_name, user_id),
        filters={k: v for k, v in filters.items() if v is not None},
        limit=min(limit, state.config.max_page_size),
        cursor=cursor,
    )
    return {"memories": [public(r, user_id) for r in page.memories], "next_cursor": page.next_cursor}


@router.get("/v1/memories/{record_id:path}", response_model=StoredMemory, summary="one memory of a user")
def get(
    record_id: RecordId, user_id: Annotated[UserId, Query()], state: Service, tenant_name: Tenant
) -> dict:
    record = state.memory.get(record_id, user_id=scoped(tenant_name, user_id))
    return public(found(record, record_id), user_id)


@router.patch(
    "/v1/memories/{record_id:path}",
    response_model=StoredMemory,
    summary="change fields of an active memory (the old version stays in its history; 409 if it is "
    "deleted, merged or superseded)",
)
def update(record_id: RecordId, body: UpdateRequest, state: Service, tenant_name: Tenant) -> dict:
    fields = body.model_dump(exclude_unset=True, exclude={"user_id"})
    if not fields:
        raise HTTPException(422, "no field to update")
    user = scoped(tenant_name, body.user_id)
    with _known(record_id):
        return public(state.memory.update(record_id, user_id=user, **fields), body.user_id)


@router.delete(
    "/v1/memories/{record_id:path}",
    status_code=204,
    response_model=None,
    summary="delete an active memory (kept in its history; 409 if it is already deleted, merged or "
    "superseded)",
)
def delete(
    record_id: RecordId, user_id: Annotated[UserId, Query()], state: Service, tenant_name: Tenant
) -> Response:
    with _known(record_id):
        state.memory.delete(record_id, user_id=scoped(tenant_name, user_id))
    return Response(status_code=204)


@router.post(
    "/v1/memories/{record_id:path}/restore",
    response_model=StoredMemory,
    summary="make a deleted, superseded or merged memory active again (409 if it is active)",
)
def restore(
    record_id: RecordId, user_id: Annotated[UserId, Query()], state: Service, tenant_name: Tenant
) -> dict:
    with _known(record_id):
        return public(state.memory.restore(record_id, user_id=scoped(tenant_name, user_id)), user_id)


@router.get(
    "/v1/history/{record_id:path}",
    response_model=list[HistoryEntry],
    summary="every version of a memory, oldest first",
)
def history(
    record_id: RecordId, user_id: Annotated[UserId, Query()], state: Service, tenant_name: Tenant
) -> list[dict]:
    user = scoped(tenant_name, user_id)
    found(state.memory.get(record_id, user_id=user), record_id)
    versions = state.memory.history(record_id, user_id=user)
    return [{**h, "record": public(h["record"], user_id)} for h in versions]
