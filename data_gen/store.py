"""What a datagen run remembers besides the teacher's answers (those are in `dimmem.cache`): each
job's attempt and quarantine reason, and the Batch API batches it submitted. Same SQLite file as the
response cache (OUT/cache.sqlite), committed on every write, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_key TEXT PRIMARY KEY, job_id TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0,
    quarantine_reason TEXT);
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY, input_file TEXT NOT NULL, status TEXT NOT NULL, created REAL NOT NULL);
"""


class JobStore:
    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(
            str(path), isolation_level=None
        )  # autocommit: each write is its own transaction
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # the attempt number salts every request of the job, so retrying a quarantined job asks anew
    def job_state(self, job_key: str) -> tuple[int, str | None]:
        row = self.db.execute(
            "SELECT attempt, quarantine_reason FROM jobs WHERE job_key=?", (job_key,)
        ).fetchone()
        return (row[0], row[1]) if row else (0, None)

    def set_job(self, job_key: str, job_id: str, attempt: int, quarantine_reason: str | None) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?)", (job_key, job_id, attempt, quarantine_reason)
        )

    def open_batches(self) -> list[str]:
        rows = self.db.execute("SELECT batch_id FROM batches WHERE status != 'done' ORDER BY created")
        return [r[0] for r in rows]

    def set_batch(self, batch_id: str, input_file: str, status: str) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO batches VALUES "
            "(?,?,?,COALESCE((SELECT created FROM batches WHERE batch_id=?),?))",
            (batch_id, input_file, status, batch_id, time.time()),
        )
