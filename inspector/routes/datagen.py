"""A datagen output: its jobs, filtered and paged, and one job (its window, answers and verdicts)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from inspector.datagen import DatagenOutput, window_turns
from inspector.routes.home import Inspector

router = APIRouter()


@router.get("/s/{n}/jobs", response_class=HTMLResponse)
def jobs(
    request: Request,
    n: int,
    s: Inspector,
    task: str | None = None,
    status: str | None = None,
    split: str | None = None,
    reason: str | None = None,
    conversation: str | None = None,
):
    found = s.source(n, DatagenOutput)
    index = found.require_jobs()
    given = {"task": task, "status": status, "split": split, "reason": reason, "conversation": conversation}
    where = found.job_filters(given)
    return s.listing(request, "datagen_jobs.html", index, where, "line", n=n, src=found, given=given)


@router.get("/s/{n}/job", response_class=HTMLResponse)
def job(request: Request, n: int, id: str, s: Inspector):
    found = s.source(n, DatagenOutput)
    row = found.job(id)
    before, after = found.jobs.neighbours(id)
    turns = window_turns(row) if "window" in row else []
    return s.page(
        request, "datagen_job.html", n=n, src=found, job=row, turns=turns, before=before, after=after
    )
