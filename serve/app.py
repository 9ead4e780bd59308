"""The HTTP memory service: the runtime's API over FastAPI, one store, many tenants.

Every request but /healthz carries `Authorization: Bearer <key>`; the key names the tenant, and every
user id is namespaced by it inside the store (`<tenant>/<user>`; user ids cannot contain "/"), so no
call can reach another tenant's records. Bodies over `max_body_bytes` get 413, malformed ones 422 with
pydantic's field report, unknown records 404, bad values 422 with the runtime's message. Record ids
contain "/" and "#" (`<conversation>/w0003#m2`): percent-encode them in paths.

    dimmem serve api --config configs/serve/default.yaml

`build_app` assembles the routers (serve/routes/) over shared state on `app.state.service`.
"""

from __future__ import annotations

import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dimmem.contract.conversation import DataFormatError
from dimmem.runtime.memory import Memory
from serve.config import ServeConfig
from serve.deps import Metrics, ServiceState
from serve.routes import memories, ops, search


def build_app(config: ServeConfig, memory: Memory | None = None) -> FastAPI:
    keys = config.keys()
    if memory is None:
        memory = Memory.from_config(config.memory_config, store=config.store)
    state = ServiceState(config=config, memory=memory, keys=keys, metrics=Metrics(), lock=threading.Lock())
    app = FastAPI(
        title="DimMem memory service",
        version="1",
        description="Add conversations, search typed memories with per-path scores, and manage "
        "them; every call is confined to the tenant of its API key.",
    )
    app.state.service = state
    for module in (ops, memories, search):
        app.include_router(module.router)

    too_big = f"request body over {config.max_body_bytes} bytes"

    @app.middleware("http")
    async def limit_and_count(request: Request, call_next):
        start = time.perf_counter()
        declared = request.headers.get("content-length")
        if declared is not None:
            over = not declared.isdigit() or int(declared) > config.max_body_bytes
        else:
            over = (
                request.method in ("POST", "PATCH", "PUT")
                and len(await request.body()) > config.max_body_bytes
            )
        response = JSONResponse({"detail": too_big}, status_code=413) if over else await call_next(request)
        route = request.scope.get("route")
        path = route.path if route is not None else "unmatched"
        state.metrics.requests.labels(path, str(response.status_code)).inc()
        state.metrics.latency.labels(path).observe(time.perf_counter() - start)
        return response

    @app.exception_handler(DataFormatError)
    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    return app
