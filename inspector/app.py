"""The inspector's web app: server-rendered pages over the opened sources, a page of rows at a time.

Routes are per source (`/s/N/...`, N its position on the command line); a bad source, id or page
number is an HTML page that says what is wrong, never a traceback. GET only: nothing is written.
"""

from __future__ import annotations

from datetime import UTC, datetime
from math import ceil
from pathlib import Path
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException

from dimmem.contract.records import DIMENSIONS, MEMORY_TYPES
from dimmem.runtime.memory import STATUSES
from inspector.config import InspectConfig
from inspector.datagen import DatagenOutput, pretty, window_turns
from inspector.evalrun import ORDERS, EvalRun, comparison
from inspector.problems import Problem
from inspector.store import MemoryStore

HERE = Path(__file__).parent


def build_app(sources: list, config: InspectConfig) -> FastAPI:
    app = FastAPI(title="dimmem inspect", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters["pretty"] = pretty
    templates.env.globals["dimensions"] = DIMENSIONS  # the contract's free-text dimensions, in its order
    templates.env.filters["timestamp"] = lambda t: datetime.fromtimestamp(t, UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    size = config.page_size

    def page(request: Request, name: str, status: int = 200, **context) -> HTMLResponse:
        return templates.TemplateResponse(
            request, name, {"sources": sources, "url": _url(request), **context}, status_code=status
        )

    def listing(request: Request, name: str, index, where, order: str, /, **context) -> HTMLResponse:
        """One page of an indexed JSONL's rows (`?page=`), with the pager's numbers."""
        total = index.count(where)
        number, offset, pages = _pager(total, request.query_params.get("page"), size)
        rows = index.page(where, order, size, offset)
        return page(request, name, rows=rows, total=total, page_no=number, pages=pages, **context)

    def source(n: int, kind: type):
        if not 0 <= n < len(sources):
            raise Problem(404, "No such source", f"source {n} is not open; the inspector has {len(sources)}.")
        found = sources[n]
        if found.kind == "broken":
            raise Problem(422, f"Cannot read {found.spec}", found.problem)
        if not isinstance(found, kind):
            raise Problem(404, "Wrong kind of source", f"source {n} ({found.name}) is a {found.kind} source.")
        return found

    @app.exception_handler(Problem)
    async def problem(request: Request, exc: Problem):
        return page(request, "error.html", exc.status, title=exc.title, message=exc.message)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        message = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in exc.errors())
        return page(request, "error.html", 400, title="Bad request", message=message)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 405:
            message = f"{request.method} {request.url.path}: the inspector only reads (GET)"
            return page(request, "error.html", 405, title="Read-only", message=message)
        message = f"no page {request.url.path}"
        return page(request, "error.html", exc.status_code, title=exc.detail, message=message)

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception):  # the server logs the traceback; the page says what
        return page(
            request, "error.html", 500, title="Internal error", message=f"{type(exc).__name__}: {exc}"
        )

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request):
        runs = [(i, s) for i, s in enumerate(sources) if s.kind == "eval"]
        return page(request, "home.html", runs=runs)

    @app.get("/s/{n}", response_class=HTMLResponse)
    def overview(request: Request, n: int):
        found = source(n, object)
        name = {"datagen": "datagen_report.html", "eval": "eval_run.html", "store": "store_users.html"}
        context = {}
        if found.kind == "store":
            users = found.users()
            number, offset, pages = _pager(len(users), request.query_params.get("page"), size)
            context = {
                "users": users[offset : offset + size],
                "page_no": number,
                "pages": pages,
                "total": len(users),
            }
        return page(request, name[found.kind], n=n, src=found, **context)

    # --- datagen outputs ------------------------------------------------------------------------
    @app.get("/s/{n}/jobs", response_class=HTMLResponse)
    def jobs(
        request: Request,
        n: int,
        task: str | None = None,
        status: str | None = None,
        split: str | None = None,
        reason: str | None = None,
        conversation: str | None = None,
    ):
        found = source(n, DatagenOutput)
        index = found.require_jobs()
        given = {
            "task": task,
            "status": status,
            "split": split,
            "reason": reason,
            "conversation": conversation,
        }
        where = found.job_filters(given)
        return listing(request, "datagen_jobs.html", index, where, "line", n=n, src=found, given=given)

    @app.get("/s/{n}/job", response_class=HTMLResponse)
    def job(request: Request, n: int, id: str):
        found = source(n, DatagenOutput)
        row = found.job(id)
        before, after = found.jobs.neighbours(id)
        turns = window_turns(row) if "window" in row else []
        return page(
            request, "datagen_job.html", n=n, src=found, job=row, turns=turns, before=before, after=after
        )

    # --- eval runs ------------------------------------------------------------------------------
    @app.get("/s/{n}/plot/{name}")
    def plot(n: int, name: str):
        found = source(n, EvalRun)
        if name not in found.plots():
            raise Problem(404, "No such plot", f"{found.name} has no plot {name!r}.")
        return FileResponse(found.folder / name, media_type="image/png")

    @app.get("/s/{n}/windows", response_class=HTMLResponse)
    def windows(request: Request, n: int, order: str = "worst"):
        found = source(n, EvalRun)
        if order not in ORDERS:
            raise Problem(400, "Bad order", f"order {order!r}: expected one of {', '.join(ORDERS)}.")
        return listing(
            request, "eval_windows.html", found.windows, None, ORDERS[order], n=n, src=found, order=order,
            orders=ORDERS,
        )  # fmt: skip

    @app.get("/s/{n}/window", response_class=HTMLResponse)
    def window(request: Request, n: int, id: str):
        found = source(n, EvalRun)
        view = found.window(id)
        datagen = _datagen_with(sources, id)
        return page(request, "eval_window.html", n=n, src=found, id=id, view=view, datagen=datagen)

    @app.get("/compare", response_class=HTMLResponse)
    def compare(request: Request, a: int, b: int):
        run_a, run_b = source(a, EvalRun), source(b, EvalRun)
        return page(
            request, "compare.html", a=a, b=b, run_a=run_a, run_b=run_b, rows=comparison(run_a, run_b)
        )

    # --- memory stores --------------------------------------------------------------------------
    @app.get("/s/{n}/user", response_class=HTMLResponse)
    def user(
        request: Request,
        n: int,
        u: str,
        type: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
    ):
        found = source(n, MemoryStore)
        filters = {k: v for k, v in {"type": type, "status": status}.items() if v}
        result = found.records(u, filters, size, cursor)
        return page(
            request, "store_user.html", n=n, src=found, u=u, records=result.memories,
            next_cursor=result.next_cursor, cursor=cursor, filters=filters, active=found.count(u),
            types=MEMORY_TYPES, statuses=(*STATUSES, "any"),
        )  # fmt: skip

    @app.get("/s/{n}/search", response_class=HTMLResponse)
    def search(request: Request, n: int, u: str, q: str = "", date: str | None = None):
        found = source(n, MemoryStore)
        result = found.search(u, q, config.search_k, date) if q.strip() else None
        return page(request, "store_search.html", n=n, src=found, u=u, q=q, date=date or "", result=result)

    @app.get("/s/{n}/record", response_class=HTMLResponse)
    def record(request: Request, n: int, u: str, id: str):
        found = source(n, MemoryStore)
        rec, history, turns = found.record(u, id)
        datagen = _datagen_with(sources, rec.get("window_id") or "")
        return page(
            request, "store_record.html", n=n, src=found, u=u, rec=rec, history=history, turns=turns,
            datagen=datagen,
        )  # fmt: skip

    return app


def _pager(total: int, given: str | None, size: int) -> tuple[int, int, int]:
    """(page number, row offset, pages) for the `page` query parameter; a clear page when out of range."""
    pages = max(ceil(total / size), 1)
    try:
        number = int(given) if given not in (None, "") else 1
    except ValueError:
        raise Problem(
            400, "Bad page number", f"page {given!r}: expected a whole number from 1 to {pages}."
        ) from None
    if not 1 <= number <= pages:
        raise Problem(
            404, "No such page", f"page {number}: there are {pages} page(s) of {size} rows ({total} rows)."
        )
    return number, (number - 1) * size, pages


def _datagen_with(sources: list, job_id: str) -> int | None:
    """The first open datagen output that holds this job (a record's or eval window's source window)."""
    for i, s in enumerate(sources):
        if isinstance(s, DatagenOutput) and s.jobs is not None and s.jobs.count({"id": job_id}):
            return i
    return None


def _url(request: Request):
    """`url(page=3)`: this page's URL with some query parameters replaced (None drops one)."""

    def url(**changes) -> str:
        params = {**request.query_params, **{k: v for k, v in changes.items()}}
        query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
        return f"{request.url.path}?{query}" if query else request.url.path

    return url
