"""The embedded backend: one SQLite file (WAL), one connection, callers serialize their calls. A write
block is `BEGIN IMMEDIATE`: one writer per file, so what a block reads no other writer changes before it
commits, and the record log's checks need no row locks. Arrays and JSON are stored as JSON text, days as
ISO text (which orders as the days do); `PRAGMA user_version` counts the migrations applied.

    store = SQLiteStore("memories.sqlite")     # a RecordLog over this dialect, with its default indexes
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from dimmem.runtime.stores.base import Sql
from dimmem.runtime.stores.log import RecordLog

__all__ = ["SQLiteDialect", "SQLiteStore"]


@cache
def _translate(query: str) -> str:
    return query.replace("{user}", "user_id=?")


class SQLiteDialect:
    name = "sqlite"
    serialized = True  # one connection: callers serialize their calls (Memory holds a lock around them)
    user_key = "user_id"
    for_update = ""  # BEGIN IMMEDIATE already holds the file's one write lock

    def __init__(self, path: str | Path, timeout: float = 30.0):
        self.path = self.url = str(path)
        self.timeout = timeout
        if self.path != ":memory:":
            if Path(path).is_dir():
                raise ValueError(f"store {path}: a folder, not a SQLite file")
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = self.connect()
            self.db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as exc:  # another kind of file, or a path SQLite cannot open
            raise ValueError(f"store {path}: not a SQLite database this can open ({exc})") from None
        self.db.execute("PRAGMA synchronous=NORMAL")

    def connect(self) -> sqlite3.Connection:
        """A connection to the file (in-process indexes read through one of their own: WAL shows them what
        has committed, never another thread's open transaction)."""
        db = sqlite3.connect(self.path, isolation_level=None, timeout=self.timeout, check_same_thread=False)
        db.row_factory = sqlite3.Row
        return db

    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE" if write else "BEGIN")  # (a read block: one snapshot, no lock)
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    @contextmanager
    def cursor(self, user_id: str, write: bool = False) -> Iterator[Sql]:
        yield Sql(self.db, _translate)

    @contextmanager
    def all_users(self) -> Iterator[tuple[Sql, str]]:
        yield Sql(self.db, _translate), ""

    def limit(self, n: int) -> int:
        return n

    def to_array(self, values: list) -> str:
        return json.dumps(list(values), ensure_ascii=False)

    def from_array(self, value: str) -> list:
        return json.loads(value)

    def to_json(self, value) -> str:
        return json.dumps(value, ensure_ascii=False)

    from_json = from_array

    def to_day(self, iso: str | None) -> str | None:
        return iso

    def from_day(self, value: str | None) -> str | None:
        return value

    def to_flag(self, value: bool) -> int:
        return int(value)

    def keywords(self, sql: Sql, user_id: str, types: list[str], keys: list[str], limit: int) -> list[str]:
        # one arm per (type, keyword), each reading at most `limit` entries of the lookup index
        arm = (
            "SELECT * FROM (SELECT record_id FROM record_keywords INDEXED BY record_keywords_lookup "
            "WHERE {user} AND type=? AND keyword=? ORDER BY record_id LIMIT ?)"
        )
        pairs = [(t, key) for t in types for key in keys]
        rows = sql.rows(
            f"SELECT record_id, COUNT(*) AS shared FROM ({' UNION ALL '.join([arm] * len(pairs))}) "
            "GROUP BY record_id ORDER BY shared DESC, record_id LIMIT ?",
            (*(p for t, key in pairs for p in (user_id, t, key, limit)), limit),
        )
        return [r["record_id"] for r in rows]

    def keyword_arms(
        self, sql: Sql, user_id: str, arms: list[tuple[str, str]], limit: int
    ) -> list[tuple[str, str, str]]:
        # each arm reads at most `limit` entries of the lookup index; at most 400 arms a statement (a
        # compound SELECT has at most 500)
        arm = (
            "SELECT * FROM (SELECT ? AS type, ? AS keyword, record_id FROM record_keywords INDEXED BY "
            "record_keywords_lookup WHERE {user} AND type=? AND keyword=? ORDER BY record_id LIMIT ?)"
        )
        out = []
        for i in range(0, len(arms), 400):
            part = arms[i : i + 400]
            out += sql.tuples(
                " UNION ALL ".join([arm] * len(part)),
                tuple(p for t, key in part for p in (t, key, user_id, t, key, limit)),
            )
        return out

    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self, migrations: list[tuple[int, str, str]]) -> int:
        """Apply the pending migrations in one transaction (statement by statement: `executescript`
        would commit first)."""
        with self.transaction():
            version = self.schema_version()
            for number, _, script in migrations[version:]:
                statement = ""
                for line in script.splitlines(keepends=True):
                    statement += line
                    if sqlite3.complete_statement(statement):
                        self.db.execute(statement)
                        statement = ""
                self.db.execute(f"PRAGMA user_version = {number}")
        return len(migrations) - version

    def ping(self) -> bool:
        try:
            return self.db.execute("SELECT 1").fetchone()[0] == 1
        except sqlite3.Error:
            return False

    def close(self) -> None:
        self.db.close()


class SQLiteStore(RecordLog):
    """The record log in the SQLite file `path` (":memory:": in memory); `indexes`: the retrieval indexes
    by name (default: the in-process BM25 and dense indexes); `ann_min_records`: where the dense index
    switches from exact search to HNSW."""

    def __init__(
        self,
        path: str | Path,
        timeout: float = 30.0,
        *,
        migrate: bool = True,
        indexes: dict[str, str] | None = None,
        ann_min_records: int = 200_000,
    ):
        super().__init__(
            SQLiteDialect(path, timeout), migrate=migrate, indexes=indexes, ann_min_records=ann_min_records
        )
