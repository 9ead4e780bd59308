"""The HTTP memory service: the runtime's API over FastAPI, one store, many tenants.

Every request but /healthz carries `Authorization: Bearer <key>`; the key names the tenant, and every
user id is namespaced by it inside the store (`<tenant>/<user>`; user ids cannot contain "/"), so no
call can reach another tenant's records. Bodies over `max_body_bytes` get 413, malformed ones 422 with
pydantic's field report, unknown records 404, bad values 422 with the runtime's message. Record ids
contain "/" and "#" (`<conversation>/w0003#m2`): percent-encode them in paths.

    dimmem serve api --config configs/serve/default.yaml
"""

import threading
import time
from datetime import date
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from dimmem.conversation import DataFormatError
from dimmem.memory import Memory
from dimmem.records import MEMORY_TYPES
from serve.config import ServeConfig

UserId = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.@:\-]+$")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Body):
    role: Literal["user", "assistant", "system", "developer", "tool"]
    content: str = Field(max_length=100_000)
    name: str | None = Field(default=None, max_length=200)
    timestamp: str | None = Field(default=None, max_length=40, description="ISO 8601; starts a session's date")
    session_id: str | None = Field(default=None, max_length=200)


class AddRequest(_Body):
    user_id: UserId
    messages: list[Message] = Field(min_length=1)
    conversation_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.@:\-]+$")


class ExtractRequest(_Body):
    messages: list[Message] = Field(min_length=1)


class SearchRequest(_Body):
    user_id: UserId
    query: str = Field(min_length=1, max_length=2_000)
    k: int = Field(default=10, ge=1)
    reference_date: date | None = None


class UpdateRequest(_Body):
    user_id: UserId
    content: str | None = Field(default=None, min_length=1, max_length=10_000)
    type: Literal[MEMORY_TYPES] | None = None  # type: ignore[valid-type]
    time: str | None = Field(default=None, max_length=40)
    location: str | None = Field(default=None, max_length=500)
    reason: str | None = Field(default=None, max_length=2_000)
    purpose: str | None = Field(default=None, max_length=2_000)
    keywords: list[Annotated[str, Field(max_length=200)]] | None = Field(default=None, max_length=50)


def create_app(config: ServeConfig, memory: Memory | None = None) -> FastAPI:
    keys = config.keys()
    if memory is None:
        memory = Memory.from_config(config.memory_config, store=config.store)
    lock = threading.Lock()  # one SQLite connection and one embedder: calls take turns
    registry = CollectorRegistry()
    requests = Counter("dimmem_requests", "HTTP requests", ["route", "status"], registry=registry)
    latency = Histogram("dimmem_request_seconds", "request latency", ["route"], registry=registry)
    stored = Counter("dimmem_memories_stored", "records stored by add", registry=registry)
    recalls = Counter("dimmem_assistant_recalls", "searches that fetched assistant replies", registry=registry)
    bearer = HTTPBearer(auto_error=False)

    app = FastAPI(title="DimMem memory service", version="1",
                  description="Add conversations, search typed memories with per-path scores, and manage them; "
                              "every call is confined to the tenant of its API key.")

    @app.middleware("http")
    async def limit_and_count(request: Request, call_next):
        start = time.perf_counter()
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > config.max_body_bytes):
            response = JSONResponse({"detail": f"request body over {config.max_body_bytes} bytes"}, status_code=413)
        elif declared is None and request.method in ("POST", "PATCH", "PUT") and len(await request.body()) > config.max_body_bytes:
            response = JSONResponse({"detail": f"request body over {config.max_body_bytes} bytes"}, status_code=413)
        else:
            response = await call_next(request)
        route = request.scope.get("route")
        path = route.path if route is not None else "unmatched"
        requests.labels(path, str(response.status_code)).inc()
        latency.labels(path).observe(time.perf_counter() - start)
        return response

    @app.exception_handler(DataFormatError)
    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    def tenant(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> str:
        if credentials is None or credentials.credentials not in keys:
            raise HTTPException(401, "missing or unknown API key", headers={"WWW-Authenticate": "Bearer"})
        return keys[credentials.credentials]

    Tenant = Annotated[str, Depends(tenant)]

    def scoped(tenant_name: str, user_id: str) -> str:
        return f"{tenant_name}/{user_id}"

    def public(record: dict, user_id: str) -> dict:
        return {**record, "user_id": user_id}

    def check_messages(messages: list[Message]) -> list[dict]:
        if len(messages) > config.max_messages:
            raise HTTPException(413, f"{len(messages)} messages; at most {config.max_messages} per request")
        return [m.model_dump(exclude_none=True) for m in messages]

    @app.get("/healthz", summary="liveness (no key needed)")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def metrics(_: Tenant) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/memories", summary="extract memories from messages and store them for a user")
    def add(body: AddRequest, tenant_name: Tenant) -> dict:
        messages = check_messages(body.messages)
        extraction = memory.extract(messages, body.conversation_id)  # model calls outside the lock: searches go on
        with lock:
            events = memory.add_records(extraction.records, scoped(tenant_name, body.user_id), extraction.conversation)
        stored.inc(sum(e["action"] != "UNCHANGED" for e in events))
        return {"conversation_id": extraction.conversation.id, "windows": extraction.windows, "events": events,
                "rejected": extraction.rejected, "failed": extraction.failed}

    @app.post("/v1/extract", summary="extract memories from messages without storing them")
    def extract(body: ExtractRequest, _: Tenant) -> dict:
        result = memory.extract(check_messages(body.messages))
        return {"conversation_id": result.conversation.id, "windows": result.windows, "memories": result.records,
                "rejected": result.rejected, "failed": result.failed}

    @app.post("/v1/search", summary="search a user's memories; each hit has its rank and score per path")
    def search(body: SearchRequest, tenant_name: Tenant) -> dict:
        if body.k > config.max_k:
            raise HTTPException(422, f"k={body.k}; at most {config.max_k}")
        with lock:
            result = memory.search(body.query, scoped(tenant_name, body.user_id), k=body.k,
                                   reference_date=body.reference_date.isoformat() if body.reference_date else None)
        if result.assistant_context:
            recalls.inc()
        return {"query": result.query, "assistant_context": result.assistant_context,
                "hits": [{"score": h.score, "paths": h.paths, "record": public(h.record, body.user_id)} for h in result.hits]}

    def found(record: dict | None, record_id: str) -> dict:
        if record is None:
            raise HTTPException(404, f"no memory {record_id!r} for this user")
        return record

    @app.get("/v1/memories/{record_id:path}", summary="one memory of a user")
    def get(record_id: str, user_id: Annotated[UserId, Query()], tenant_name: Tenant) -> dict:
        with lock:
            return public(found(memory.get(record_id, scoped(tenant_name, user_id)), record_id), user_id)

    @app.patch("/v1/memories/{record_id:path}", summary="change fields of a memory (the old version stays in its history)")
    def update(record_id: str, body: UpdateRequest, tenant_name: Tenant) -> dict:
        fields = body.model_dump(exclude_unset=True, exclude={"user_id"})
        if not fields:
            raise HTTPException(422, "no field to update")
        user = scoped(tenant_name, body.user_id)
        with lock:
            found(memory.get(record_id, user), record_id)
            return public(memory.update(record_id, user, **fields), body.user_id)

    @app.delete("/v1/memories/{record_id:path}", status_code=204, summary="delete a memory (kept in its history)")
    def delete(record_id: str, user_id: Annotated[UserId, Query()], tenant_name: Tenant) -> Response:
        user = scoped(tenant_name, user_id)
        with lock:
            record = found(memory.get(record_id, user), record_id)
            if record["status"] != "deleted":
                memory.delete(record_id, user)
        return Response(status_code=204)

    @app.get("/v1/history/{record_id:path}", summary="every version of a memory, oldest first")
    def history(record_id: str, user_id: Annotated[UserId, Query()], tenant_name: Tenant) -> list[dict]:
        user = scoped(tenant_name, user_id)
        with lock:
            found(memory.get(record_id, user), record_id)
            return [{**h, "record": public(h["record"], user_id)} for h in memory.history(record_id, user)]

    return app
