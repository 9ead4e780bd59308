"""What every route shares, read from `app.state` (set by `serve.app.build_app`): the runtime (which
locks its own store), the config, the caller of the request's API key (a tenant, or the operator who
reads /metrics), and the mapping between a tenant's user ids and the store's (`<tenant>/<user>`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from dimmem.runtime.memory import Memory
from serve.config import METRICS_DIR_ENV, ServeConfig
from serve.guard import caller, clip
from serve.schemas import MAX_RECORD_ID, Message

OPERATOR = "\0operator"  # the operator key's caller: tenant names cannot hold NUL (serve.config)


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (one per app). Under `--workers N` the
    server sets PROMETHEUS_MULTIPROC_DIR before the workers start: each worker's counts then live in
    files there and /metrics, whichever worker answers it, sums them over all workers (a worker killed
    and restarted keeps what it counted)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("dimmem_requests", "HTTP requests", ["route", "status"], registry=registry)
        self.latency = Histogram("dimmem_request_seconds", "request latency", ["route"], registry=registry)
        self.stored = Counter("dimmem_memories_stored", "records stored by add", registry=self.registry)
        self.recalls = Counter(
            "dimmem_assistant_recalls", "searches that fetched assistant replies", registry=self.registry
        )

    def exposition(self) -> tuple[bytes, str]:
        """The text format /metrics serves, and its content type."""
        registry = self.registry
        if os.environ.get(METRICS_DIR_ENV):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST


@dataclass
class ServiceState:
    config: ServeConfig
    memory: Memory
    keys: dict[str, str]  # API key -> tenant name
    metrics: Metrics
    operator_key: str | None = None  # the only key that reads /metrics; None: /metrics is off

    @property
    def callers(self) -> dict[str, str]:
        """API key -> tenant name, or OPERATOR."""
        return {**self.keys, **({self.operator_key: OPERATOR} if self.operator_key else {})}


def service(request: Request) -> ServiceState:
    return request.app.state.service


Service = Annotated[ServiceState, Depends(service)]
_bearer = HTTPBearer(auto_error=False)


def _caller(state: ServiceState, credentials: HTTPAuthorizationCredentials | None) -> str:
    who = None if credentials is None else caller(f"Bearer {credentials.credentials}", state.callers)
    if who is None:  # serve.guard has said 401 already; this holds for an app without it
        raise HTTPException(401, "missing or unknown API key", headers={"WWW-Authenticate": "Bearer"})
    return who


def tenant(state: Service, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> str:
    who = _caller(state, credentials)
    if who == OPERATOR:
        raise HTTPException(403, "the operator key reads /metrics only; memories need a tenant's key")
    return who


def operator(state: Service, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    who = _caller(state, credentials)
    if state.operator_key is None:
        raise HTTPException(404, "metrics are off: set operator_key_env in the service config")
    if who != OPERATOR:
        raise HTTPException(403, "/metrics needs the operator key (operator_key_env), not a tenant's")


Tenant = Annotated[str, Depends(tenant)]
Operator = Depends(operator)
RecordId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_RECORD_ID,
        description='percent-encoded ("/" and "#" in ids); longer ones are 422 without a lookup',
    ),
]


def scoped(tenant_name: str, user_id: str) -> str:
    """The store's user id: user ids cannot contain "/", so no tenant reaches another's records."""
    return f"{tenant_name}/{user_id}"


def public(record: dict, user_id: str) -> dict:
    """A stored record as its tenant sees it: under its own user id."""
    return {**record, "user_id": user_id}


def found(record: dict | None, record_id: str) -> dict:
    if record is None:
        raise HTTPException(404, f"no memory {clip(record_id)!r} for this user")
    return record


def check_messages(state: ServiceState, messages: list[Message]) -> list[dict]:
    if len(messages) > state.config.max_messages:
        raise HTTPException(413, f"{len(messages)} messages; at most {state.config.max_messages} per request")
    return [m.model_dump(exclude_none=True) for m in messages]
