"""The home page and each source's overview."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from inspector.site import Site, pager, site

router = APIRouter()
Inspector = Annotated[Site, Depends(site)]


@router.get("/", response_class=HTMLResponse)
def home(request: Request, s: Inspector):
    runs = [(i, found) for i, found in enumerate(s.sources) if found.kind == "eval"]
    return s.page(request, "home.html", runs=runs)


@router.get("/s/{n}", response_class=HTMLResponse)
def overview(request: Request, n: int, s: Inspector):
    found = s.source(n, object)
    name = {"datagen": "datagen_report.html", "eval": "eval_run.html", "store": "store_users.html"}
    context = {}
    if found.kind == "store":
        users = found.users()
        number, offset, pages = pager(len(users), request.query_params.get("page"), s.size)
        context = {
            "users": users[offset : offset + s.size],
            "page_no": number,
            "pages": pages,
            "total": len(users),
        }
    return s.page(request, name[found.kind], n=n, src=found, **context)
