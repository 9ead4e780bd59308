"""The inspector's web app: server-rendered pages over the opened sources, a page of rows at a time.

Routes are per source (`/s/N/...`, N its position on the command line), a router per kind of source
(`inspector/routes/`); what they share sits on `app.state.site` (`inspector/site.py`). A bad source, id
or page number is an HTML page that says what is wrong, never a traceback. GET only: nothing is written.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from inspector.config import InspectConfig
from inspector.problems import Problem
from inspector.routes import datagen, evalrun, home, store
from inspector.site import HERE, Site


def build_app(sources: list, config: InspectConfig) -> FastAPI:
    app = FastAPI(title="dimmem inspect", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.state.site = site = Site(sources, config)
    for module in (home, datagen, evalrun, store):
        app.include_router(module.router)

    @app.exception_handler(Problem)
    async def problem(request: Request, exc: Problem):
        return site.page(request, "error.html", exc.status, title=exc.title, message=exc.message)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        message = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in exc.errors())
        return site.page(request, "error.html", 400, title="Bad request", message=message)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 405:
            message = f"{request.method} {request.url.path}: the inspector only reads (GET)"
            return site.page(request, "error.html", 405, title="Read-only", message=message)
        message = f"no page {request.url.path}"
        return site.page(request, "error.html", exc.status_code, title=exc.detail, message=message)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception):  # the server logs the traceback; the page says what
        message = f"{type(exc).__name__}: {exc}"
        return site.page(request, "error.html", 500, title="Internal error", message=message)

    return app
