"""Durable store of everything a run has paid for: teacher responses, job states, batch ids.

SQLite in WAL mode; every response is committed the moment it arrives, so a run killed with SIGKILL
loses nothing it was charged for and a re-run re-sends nothing stored.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY, job_id TEXT NOT NULL, model TEXT NOT NULL, text TEXT NOT NULL,
    finish_reason TEXT, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_key TEXT PRIMARY KEY, job_id TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, quarantine_reason TEXT);
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY, input_file TEXT NOT NULL, status TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS request_errors (key TEXT PRIMARY KEY, error TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    input_tokens: int = 0
    output_tokens: int = 0


def digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class Store:
    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None)  # autocommit: each write is its own transaction
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # durable across process kills; WAL keeps it fast
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # responses
    def get(self, key: str) -> Completion | None:
        row = self.db.execute("SELECT text, finish_reason, input_tokens, output_tokens FROM responses WHERE key=?", (key,)).fetchone()
        return Completion(*row) if row else None

    def put(self, key: str, job_id: str, model: str, completion: Completion) -> None:
        self.db.execute("INSERT OR REPLACE INTO responses VALUES (?,?,?,?,?,?,?,?)",
                        (key, job_id, model, completion.text, completion.finish_reason, completion.input_tokens,
                         completion.output_tokens, time.time()))

    # job states: the attempt number is part of every request key, so retrying a quarantined job re-sends
    def job_state(self, job_key: str) -> tuple[int, str | None]:
        row = self.db.execute("SELECT attempt, quarantine_reason FROM jobs WHERE job_key=?", (job_key,)).fetchone()
        return (row[0], row[1]) if row else (0, None)

    def set_job(self, job_key: str, job_id: str, attempt: int, quarantine_reason: str | None) -> None:
        self.db.execute("INSERT OR REPLACE INTO jobs VALUES (?,?,?,?)", (job_key, job_id, attempt, quarantine_reason))

    # request failures that should not be retried automatically (batch errors)
    def request_error(self, key: str) -> str | None:
        row = self.db.execute("SELECT error FROM request_errors WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_request_error(self, key: str, error: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO request_errors VALUES (?,?)", (key, error))

    # batches
    def open_batches(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT batch_id FROM batches WHERE status NOT IN ('done') ORDER BY created")]

    def set_batch(self, batch_id: str, input_file: str, status: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO batches VALUES (?,?,?,COALESCE((SELECT created FROM batches WHERE batch_id=?),?))",
                        (batch_id, input_file, status, batch_id, time.time()))
