"""A memory store: a user's records (filtered, paged by cursor), a search with each hit's rank per path,
and one record with its history and source turns."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from dimmem.contract.records import MEMORY_TYPES
from dimmem.runtime.stores.log import STATUSES
from inspector.routes.home import Inspector
from inspector.store import MemoryStore

router = APIRouter()


@router.get("/s/{n}/user", response_class=HTMLResponse)
def user(
    request: Request,
    n: int,
    u: str,
    s: Inspector,
    type: str | None = None,
    status: str | None = None,
    cursor: str | None = None,
):
    found = s.source(n, MemoryStore)
    filters = {k: v for k, v in {"type": type, "status": status}.items() if v}
    result = found.records(u, filters, s.size, cursor)
    return s.page(
        request, "store_user.html", n=n, src=found, u=u, records=result.memories,
        next_cursor=result.next_cursor, cursor=cursor, filters=filters, active=found.count(u),
        types=MEMORY_TYPES, statuses=(*STATUSES, "any"),
    )  # fmt: skip


@router.get("/s/{n}/search", response_class=HTMLResponse)
def search(request: Request, n: int, u: str, s: Inspector, q: str = "", date: str | None = None):
    found = s.source(n, MemoryStore)
    result = found.search(u, q, s.config.search_k, date) if q.strip() else None
    return s.page(request, "store_search.html", n=n, src=found, u=u, q=q, date=date or "", result=result)


@router.get("/s/{n}/record", response_class=HTMLResponse)
def record(request: Request, n: int, u: str, id: str, s: Inspector):
    found = s.source(n, MemoryStore)
    rec, history, turns = found.record(u, id)
    return s.page(
        request, "store_record.html", n=n, src=found, u=u, rec=rec, history=history, turns=turns,
        datagen=s.datagen_with(rec.get("window_id") or ""),
    )  # fmt: skip
