"""What every route shares, read from `app.state` (set by `serve.app.build_app`): the runtime, its
lock, the config, the tenant of the request's API key, and the mapping between a tenant's user ids and
the store's (`<tenant>/<user>`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter, Histogram

from dimmem.runtime.memory import Memory
from serve.config import ServeConfig
from serve.schemas import Message


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("dimmem_requests", "HTTP requests", ["route", "status"], registry=registry)
        self.latency = Histogram("dimmem_request_seconds", "request latency", ["route"], registry=registry)
        self.stored = Counter("dimmem_memories_stored", "records stored by add", registry=self.registry)
        self.recalls = Counter(
            "dimmem_assistant_recalls", "searches that fetched assistant replies", registry=self.registry
        )


@dataclass
class ServiceState:
    config: ServeConfig
    memory: Memory
    keys: dict[str, str]  # API key -> tenant name
    metrics: Metrics
    lock: threading.Lock  # one SQLite connection and one embedder: calls take turns


def service(request: Request) -> ServiceState:
    return request.app.state.service


Service = Annotated[ServiceState, Depends(service)]
_bearer = HTTPBearer(auto_error=False)


def tenant(state: Service, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> str:
    if credentials is None or credentials.credentials not in state.keys:
        raise HTTPException(401, "missing or unknown API key", headers={"WWW-Authenticate": "Bearer"})
    return state.keys[credentials.credentials]


Tenant = Annotated[str, Depends(tenant)]


def scoped(tenant_name: str, user_id: str) -> str:
    """The store's user id: user ids cannot contain "/", so no tenant reaches another's records."""
    return f"{tenant_name}/{user_id}"


def public(record: dict, user_id: str) -> dict:
    """A stored record as its tenant sees it: under its own user id."""
    return {**record, "user_id": user_id}


def found(record: dict | None, record_id: str) -> dict:
    if record is None:
        raise HTTPException(404, f"no memory {record_id!r} for this user")
    return record


def check_messages(state: ServiceState, messages: list[Message]) -> list[dict]:
    if len(messages) > state.config.max_messages:
        raise HTTPException(413, f"{len(messages)} messages; at most {state.config.max_messages} per request")
    return [m.model_dump(exclude_none=True) for m in messages]
