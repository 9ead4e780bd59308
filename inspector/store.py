"""A memory store as the inspector reads it, through the runtime itself (`Memory`): users, a page of
records, a search with the parsed query and each hit's rank and score per path, a record's versions and
the turns its pointer resolves to. Any store the runtime opens (a SQLite file, postgresql://...).

Nothing is written: a SQLite store whose schema is behind this code is refused (the runtime would
migrate it on opening) with the command that migrates it."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from dimmem.runtime.stores import is_postgres, redacted, sqlite_path, transfer
from inspector.problems import Problem

TURNS_AROUND = 2  # turns shown before and after a record's source turns
BOOKKEEPING = {"version", "updated", "created"}  # change with every version: not what a version changed


class MemoryStore:
    kind = "store"

    def __init__(self, url: str, memory_config: str):
        self.url, self.name = url, redacted(url) if is_postgres(url) else Path(sqlite_path(url)).name
        if not is_postgres(url):
            self._check_sqlite(Path(sqlite_path(url)))
        from dimmem.runtime.memory import Memory

        self.memory = Memory.from_config(memory_config, store=url)
        self.lock = threading.Lock()  # one request at a time on the store's connection

    @staticmethod
    def _check_sqlite(path: Path) -> None:
        from dimmem.runtime.stores.schema import migrations

        current = len(migrations("sqlite"))
        if not path.is_file():
            raise ValueError(f"{path}: no such store file")
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            finally:
                db.close()
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"{path}: not a SQLite database ({exc})") from None
        if "records" not in tables:
            raise ValueError(f"{path}: a SQLite file, but not a memory store (no records table)")
        if version < current:
            raise ValueError(
                f"{path}: store schema version {version}, this code reads {current}; the inspector "
                f"does not write: run `dimmem memory migrate --store {path}` first"
            )

    def summary(self) -> str:
        return f"{len(self.users())} users"

    def users(self) -> list[str]:
        with self.lock:
            return transfer.users(self.memory.store)

    def count(self, user: str) -> int:
        with self.lock:
            return self.memory.store.count(user)

    def records(self, user: str, filters: dict, limit: int, cursor: str | None):
        try:
            with self.lock:
                return self.memory.get_all(user_id=user, filters=filters, limit=limit, cursor=cursor)
        except ValueError as exc:
            raise Problem(400, "Bad filter", str(exc)) from None

    def search(self, user: str, query: str, k: int, reference_date: str | None):
        try:
            with self.lock:
                return self.memory.search(query, user_id=user, k=k, reference_date=reference_date or None)
        except ValueError as exc:
            raise Problem(400, "Bad search", str(exc)) from None

    def record(self, user: str, record_id: str) -> tuple[dict, list[dict], list[dict]]:
        """The record, its versions oldest first, and its conversation's turns around its source turns
        (each marked `source`), [] when the store holds no turns for it (records loaded from labels)."""
        with self.lock:
            record = self.memory.get(record_id, user_id=user)
            if record is None:
                raise Problem(404, "No such record", f"user {user!r} has no record {record_id!r}.")
            history = self.memory.history(record_id, user_id=user)
            turns = (
                self.memory.store.conversations.turns(user, record["conversation_id"])
                if record.get("conversation_id")
                else []
            )
        previous: dict = {}
        for version in history:  # what each version changed, so the timeline shows the edits
            snapshot = version["record"]
            version["changed"] = [
                k
                for k in snapshot
                if previous and k not in BOOKKEEPING and snapshot.get(k) != previous.get(k)
            ]
            previous = snapshot
        sources = set(record["source_turns"])
        marked = [i for i, t in enumerate(turns) if t.id in sources]
        if not marked:
            return record, history, []
        start, end = max(marked[0] - TURNS_AROUND, 0), marked[-1] + TURNS_AROUND + 1
        return record, history, [{"turn": t, "source": t.id in sources} for t in turns[start:end]]

    def close(self) -> None:
        self.memory.close()
