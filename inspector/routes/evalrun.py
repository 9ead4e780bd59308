"""An eval run: its plots, its windows by score, one window aligned field by field, two runs compared."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse

from inspector.evalrun import ORDERS, EvalRun, comparison
from inspector.problems import Problem
from inspector.routes.home import Inspector

router = APIRouter()


@router.get("/s/{n}/plot/{name}")
def plot(n: int, name: str, s: Inspector):
    found = s.source(n, EvalRun)
    if name not in found.plots():
        raise Problem(404, "No such plot", f"{found.name} has no plot {name!r}.")
    return FileResponse(found.folder / name, media_type="image/png")


@router.get("/s/{n}/windows", response_class=HTMLResponse)
def windows(request: Request, n: int, s: Inspector, order: str = "worst"):
    found = s.source(n, EvalRun)
    if order not in ORDERS:
        raise Problem(400, "Bad order", f"order {order!r}: expected one of {', '.join(ORDERS)}.")
    return s.listing(
        request,
        "eval_windows.html",
        found.windows,
        None,
        ORDERS[order],
        n=n,
        src=found,
        order=order,
        orders=ORDERS,
    )


@router.get("/s/{n}/window", response_class=HTMLResponse)
def window(request: Request, n: int, id: str, s: Inspector):
    found = s.source(n, EvalRun)
    view = found.window(id)
    return s.page(request, "eval_window.html", n=n, src=found, id=id, view=view, datagen=s.datagen_with(id))


@router.get("/compare", response_class=HTMLResponse)
def compare(request: Request, a: int, b: int, s: Inspector):
    run_a, run_b = s.source(a, EvalRun), s.source(b, EvalRun)
    return s.page(request, "compare.html", a=a, b=b, run_a=run_a, run_b=run_b, rows=comparison(run_a, run_b))
