"""The HTTP memory service: the runtime's API over FastAPI, one store, many tenants.

Every request but /healthz and the API description carries `Authorization: Bearer <key>`; the key
names the tenant, and every user id is namespaced by it inside the store (`<tenant>/<user>`; user ids
cannot contain "/"), so no call can reach another tenant's records. /metrics needs the operator's key
(`operator_key_env`; tenant keys get 403; without one configured it is off, 404). serve.guard answers
first, before a byte of the body is read: 414 for a URL over `max_url_bytes`, 401 without a known key,
413 for a body over `max_body_bytes` (counted while it streams: chunked bodies too), 408 for a body
slower than `max_body_seconds`. Then malformed bodies get 422 with pydantic's field report (inputs
clipped), unknown records 404, bad values 422 with the runtime's message, and changes to a record that
is no longer active (deleted, merged, superseded) 409. Record ids contain "/" and "#"
(`<conversation>/w0003#m2`): percent-encode them in paths.

    dimmem serve api --config configs/serve/default.yaml

`build_app` assembles the routers (serve/routes/) over shared state on `app.state.service`.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from dimmem.contract.conversation import DataFormatError
from dimmem.runtime.memory import Memory, RecordStateError
from serve.config import CONFIG_ENV, ServeConfig
from serve.deps import Metrics, ServiceState
from serve.guard import Guard, clip
from serve.routes import memories, ops, search


def build_app(config: ServeConfig, memory: Memory | None = None) -> FastAPI:
    keys, operator_key = config.keys(), config.operator_key()  # refuses shared or missing keys first
    if memory is None:
        memory = Memory.from_config(config.memory_config, config.memory_overrides(), store=config.store)
    state = ServiceState(
        config=config,
        memory=memory,
        keys=keys,
        metrics=Metrics(),
        operator_key=operator_key,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # load the embedder before this process accepts a request: under --workers N a worker joins the
        # shared socket only after this, so no search waits seconds for a model still loading
        await asyncio.to_thread(memory.embedder.encode, ["warm-up"])
        yield

    app = FastAPI(
        lifespan=lifespan,
        title="DimMem memory service",
        version="1",
        description="Add conversations, search typed memories with per-path scores, and manage "
        "them; every call is confined to the tenant of its API key.",
    )
    app.state.service = state
    routers = [module.router for module in (ops, memories, search)]
    for router in routers:
        app.include_router(router)
    # the guard labels the requests it refuses with the template they would have reached
    templates = [*app.router.routes, *(route for router in routers for route in router.routes)]
    app.add_middleware(Guard, state=state, routes=[r for r in templates if hasattr(r, "path")])

    @app.exception_handler(RecordStateError)
    async def not_active(request: Request, exc: RecordStateError):
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(DataFormatError)
    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(OverflowError)
    async def out_of_range(request: Request, exc: OverflowError):  # date arithmetic on a far-off date
        return JSONResponse({"detail": f"a value is out of range: {exc}"}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError):
        errors = [{**e, "input": _clipped(e["input"])} if "input" in e else e for e in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)

    return app


def app_from_environment() -> FastAPI:
    """The app of a worker process (`dimmem serve api --workers N`): built from the config the parent
    validated and put in `DIMMEM_SERVE_CONFIG`; keys come from the environment as in the parent."""
    import os

    from serve.server import clip_access_log

    clip_access_log()  # each worker configures its own logging
    return build_app(ServeConfig.model_validate_json(os.environ[CONFIG_ENV]))


def _clipped(value, depth: int = 0):
    """A request's value as a 422 may repeat it: strings clipped, containers cut short."""
    if isinstance(value, str):
        return clip(value)
    if isinstance(value, (bytes, bytearray)):
        return clip(value.decode("utf-8", "replace"))
    if depth >= 3:
        return "…"
    if isinstance(value, dict):
        items = list(value.items())
        return {clip(str(k)): _clipped(v, depth + 1) for k, v in items[:20]}
    if isinstance(value, (list, tuple)):
        return [_clipped(v, depth + 1) for v in value[:20]]
    return value
