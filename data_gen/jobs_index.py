"""`jobs.jsonl` (one line per job, `dataset.job_row`) and its index: the fields a reader lists, filters and
pages the jobs by. `dataset.write_outputs` writes the index beside the file as it writes the lines, so the
first `dimmem inspect` of even a 100k-window output reads only the rows it shows; the inspector builds the
same index itself for an output written without it. Kept apart from `dataset` so a reader imports no
`datasets`."""

from __future__ import annotations

from dimmem.jsonl_index import Column

JOBS = "jobs.jsonl"
INDEX = "jobs.index.sqlite"
KEY = "id"
COLUMNS = [
    Column("id", "TEXT", lambda r: r["id"]),
    Column("task", "TEXT", lambda r: r.get("task")),
    Column("conv", "TEXT", lambda r: r.get("conversation_id")),
    Column("status", "TEXT", lambda r: r.get("status")),
    Column("reason", "TEXT", lambda r: (r.get("reason") or "").split("\n")[0] or None),
    Column("split", "TEXT", lambda r: r.get("split")),
    Column("records", "INTEGER", lambda r: r.get("records")),
    Column("answers", "INTEGER", lambda r: r.get("answers")),
]
HEAD = b', "value": '  # job_row writes the columns' keys before the record itself
