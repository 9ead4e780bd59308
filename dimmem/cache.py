"""The one response cache: every model answer the pipeline paid for, committed the moment it arrives.

SQLite in WAL mode, one row per request key (what exactly was asked: see `ModelClient.request_key`), so
a run killed with SIGKILL loses nothing it was charged for and a re-run re-sends nothing stored. Also
holds the requests that failed for good (a batch that refused one), so they are not re-sent by
accident. Used by data_gen (teacher labels) and eval (predictions, answers, judgments); safe to share
between threads.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS completions (
    key TEXT PRIMARY KEY, label TEXT NOT NULL, model TEXT NOT NULL, text TEXT NOT NULL, finish_reason TEXT,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, seconds REAL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS request_errors (key TEXT PRIMARY KEY, error TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Completion:
    """One answer as the endpoint gave it."""

    text: str
    finish_reason: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float | None = None  # generation time, when measured
    cached: bool = False  # read from the cache, not generated now
    max_tokens: int | None = None  # the budget it was asked with (set by ModelClient.complete)


def digest(payload) -> str:
    """A stable key for any JSON-able payload."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class ResponseCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit: each answer is its own transaction; NORMAL sync in WAL survives a killed process
        self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()

    def get(self, key: str) -> Completion | None:
        with self.lock:
            row = self.db.execute(
                "SELECT text, finish_reason, input_tokens, output_tokens, seconds "
                "FROM completions WHERE key=?",
                (key,),
            ).fetchone()
        return Completion(*row, cached=True) if row else None

    def put(self, key: str, completion: Completion, label: str = "", model: str = "") -> None:
        with self.lock:
            self.db.execute(
                "INSERT OR REPLACE INTO completions VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    key,
                    label,
                    model,
                    completion.text,
                    completion.finish_reason,
                    completion.input_tokens,
                    completion.output_tokens,
                    completion.seconds,
                    time.time(),
                ),
            )

    def error(self, key: str) -> str | None:
        """Why this request failed for good, if it did."""
        with self.lock:
            row = self.db.execute("SELECT error FROM request_errors WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def put_error(self, key: str, error: str) -> None:
        with self.lock:
            self.db.execute("INSERT OR REPLACE INTO request_errors VALUES (?,?)", (key, error))

    def close(self) -> None:
        with self.lock:
            self.db.close()
