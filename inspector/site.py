"""What every inspector page shares: the opened sources, the templates, the page size, and the helpers
that render a page, a page of rows, or a source by number (a bad number or kind is a `Problem`, shown as a
page that says what is wrong). It lives on `app.state.site`; routes get it with `Depends(site)`."""

from __future__ import annotations

from datetime import UTC, datetime
from math import ceil
from pathlib import Path
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from dimmem.contract.records import DIMENSIONS
from inspector.config import InspectConfig
from inspector.datagen import DatagenOutput, pretty
from inspector.problems import Problem

HERE = Path(__file__).parent


class Site:
    def __init__(self, sources: list, config: InspectConfig):
        self.sources, self.config, self.size = sources, config, config.page_size
        self.templates = Jinja2Templates(directory=HERE / "templates")
        self.templates.env.filters["pretty"] = pretty
        self.templates.env.globals["dimensions"] = DIMENSIONS  # the contract's free-text dimensions, in order
        self.templates.env.filters["timestamp"] = lambda t: datetime.fromtimestamp(t, UTC).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )

    def page(self, request: Request, name: str, status: int = 200, **context) -> HTMLResponse:
        return self.templates.TemplateResponse(
            request, name, {"sources": self.sources, "url": _url(request), **context}, status_code=status
        )

    def listing(self, request: Request, name: str, index, where, order: str, /, **context) -> HTMLResponse:
        """One page of an indexed JSONL's rows (`?page=`), with the pager's numbers."""
        total = index.count(where)
        number, offset, pages = pager(total, request.query_params.get("page"), self.size)
        rows = index.page(where, order, self.size, offset)
        return self.page(request, name, rows=rows, total=total, page_no=number, pages=pages, **context)

    def source(self, n: int, kind: type):
        sources = self.sources
        if not 0 <= n < len(sources):
            raise Problem(404, "No such source", f"source {n} is not open; the inspector has {len(sources)}.")
        found = sources[n]
        if found.kind == "broken":
            raise Problem(422, f"Cannot read {found.spec}", found.problem)
        if not isinstance(found, kind):
            raise Problem(404, "Wrong kind of source", f"source {n} ({found.name}) is a {found.kind} source.")
        return found

    def datagen_with(self, job_id: str) -> int | None:
        """The first open datagen output that holds this job (a record's or eval window's source window)."""
        for i, s in enumerate(self.sources):
            if isinstance(s, DatagenOutput) and s.jobs is not None and s.jobs.count({"id": job_id}):
                return i
        return None


def site(request: Request) -> Site:
    return request.app.state.site


def pager(total: int, given: str | None, size: int) -> tuple[int, int, int]:
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


def _url(request: Request):
    """`url(page=3)`: this page's URL with some query parameters replaced (None drops one)."""

    def url(**changes) -> str:
        params = {**request.query_params, **{k: v for k, v in changes.items()}}
        query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
        return f"{request.url.path}?{query}" if query else request.url.path

    return url
