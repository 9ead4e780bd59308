"""A datagen output folder as the inspector reads it: `report.json` for the numbers, and `jobs.jsonl`
(one line per job: its input, the teacher's answers round by round, the outcome, the split) paged through
the index datagen wrote beside it (or, for an output without one, an index built once), so the job list
pages and filters without reading the file."""

from __future__ import annotations

import json
from pathlib import Path

from data_gen.jobs_index import COLUMNS, HEAD, INDEX, JOBS, KEY
from dimmem.jsonl_index import JsonlIndex
from inspector.problems import Problem, read_json

# the list's filters: query parameter -> index column
FILTERS = {"task": "task", "status": "status", "split": "split", "reason": "reason", "conversation": "conv"}
REPORT_NUMBERS = (
    ("windows", "windows"),
    ("other_jobs", "other jobs (questions, record pairs)"),
    ("labeled", "labeled"),
    ("repaired", "repaired"),
    ("quarantined", "quarantined"),
    ("requests_sent", "requests sent"),
    ("cache_hits", "cache hits"),
    ("retries", "retries"),
    ("truncation_retries", "truncation retries"),
    ("context_clamps", "context clamps"),
    ("input_tokens", "input tokens"),
    ("output_tokens", "output tokens"),
    ("cost_usd", "cost (USD)"),
    ("elapsed_s", "elapsed (s)"),
)


class DatagenOutput:
    kind = "datagen"

    def __init__(self, folder: Path, index_dir: Path):
        self.folder, self.name = folder, folder.name
        self.report = read_json(folder / "report.json")
        if not isinstance(self.report, dict):
            raise ValueError(f"{folder / 'report.json'}: expected an object of counts")
        jobs = folder / JOBS
        # datagen's own index when it still matches jobs.jsonl, else one scan into index_dir; an output
        # written before jobs.jsonl existed still shows its report
        self.jobs = (
            JsonlIndex(jobs, COLUMNS, KEY, index_dir, HEAD, sidecar=folder / INDEX)
            if jobs.is_file()
            else None
        )
        self.facets = (
            {name: self.jobs.facet(column) for name, column in FILTERS.items() if name != "conversation"}
            if self.jobs
            else {}
        )

    def summary(self) -> str:
        r = self.report
        return (
            f"{r.get('windows', '?')} windows, {r.get('labeled', '?')} labeled, "
            f"{r.get('repaired', '?')} repaired, {r.get('quarantined', '?')} quarantined"
        )

    def numbers(self) -> list[tuple[str, object]]:
        return [(label, self.report[key]) for key, label in REPORT_NUMBERS if key in self.report]

    def require_jobs(self) -> JsonlIndex:
        if self.jobs is None:
            raise Problem(
                404,
                "No job list in this output",
                f"{self.folder} has no jobs.jsonl: it was written by an older datagen. Re-run its datagen "
                "command: the answers come from its cache, nothing is paid again.",
            )
        return self.jobs

    def job_filters(self, given: dict[str, str | None]) -> dict[str, str | None]:
        return {FILTERS[k]: v for k, v in given.items() if k in FILTERS}

    def job(self, job_id: str) -> dict:
        row = self.require_jobs().get(job_id)
        if row is None:
            raise Problem(404, "No such job", f"{self.name} has no job {job_id!r}.")
        return row


def window_turns(row: dict) -> list[dict]:
    """A window's turns in the order the teacher saw them, each with the local id records cite (t1..tn),
    whether it is context (already extracted by the previous window) or new, and where a session starts."""
    window = row["window"]
    parts = [("context", t) for t in window["context"]] + [("new", t) for t in window["new"]]
    turns, session = [], None
    for i, (part, turn) in enumerate(parts, start=1):
        starts = turn.get("session_id") != session
        session = turn.get("session_id")
        turns.append({**turn, "local": f"t{i}", "part": part, "session_start": starts})
    return turns


def pretty(text: str) -> str:
    """An answer as indented JSON when it parses, as written otherwise (what the validator saw)."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (json.JSONDecodeError, TypeError):
        return text
