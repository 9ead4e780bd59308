"""A JSONL file opened for paging: one pass records each line's byte offset and the fields pages filter
and sort by in a small SQLite table; a page is a query on that table, a line is one seek.

The table is cached under `index_dir`, keyed by the file's resolved path, size and modification time, so
a file is scanned once (100k datagen jobs: a few seconds), and every later open and request reads only
the rows it shows. The file itself is never written.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

BATCH = 5000  # rows per insert while scanning


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str  # TEXT | INTEGER | REAL
    value: Callable[[dict], object]  # the column's value from a parsed line


class JsonlIndex:
    """The lines of `path` with `columns` extracted; `key` names the column that identifies a line.

    `head`: the bytes that open the first key the columns do not need (e.g. `b', "value": '`, in files
    that write their short keys first): each line is decoded only up to it, so scanning costs the few
    fields indexed, not the whole record. Those bytes cannot occur inside a JSON string (its quotes are
    escaped); a line without them is decoded whole."""

    def __init__(self, path: Path, columns: list[Column], key: str, index_dir: Path, head: bytes = b""):
        self.path, self.columns, self.key, self.head = path, columns, key, head
        stat = path.stat()
        names = ",".join(f"{c.name}:{c.sql_type}" for c in columns) + repr(head)
        fingerprint = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{names}"
        index_dir.mkdir(parents=True, exist_ok=True)
        self.file = index_dir / f"{path.stem}-{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}.sqlite"
        self.built = not self.file.exists()  # scanned now rather than found in the cache
        if self.built:
            self._build()
        self.db = sqlite3.connect(f"file:{self.file}?mode=ro", uri=True, check_same_thread=False)
        self.db.row_factory = sqlite3.Row

    def _build(self) -> None:
        partial = self.file.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        db = sqlite3.connect(partial)
        cols = ", ".join(f"{c.name} {c.sql_type}" for c in self.columns)
        db.execute(f"CREATE TABLE lines (line INTEGER PRIMARY KEY, offset INTEGER, length INTEGER, {cols})")
        marks = ",".join("?" * (len(self.columns) + 3))
        batch = []
        for number, offset, raw in _lines(self.path):
            cut = raw.find(self.head) if self.head else -1
            try:
                row = json.loads(raw[:cut] + b"}" if cut > 0 else raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{self.path}: line {number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{self.path}: line {number}: a JSON {type(row).__name__}, not an object")
            batch.append((number, offset, len(raw), *(c.value(row) for c in self.columns)))
            if len(batch) >= BATCH:
                db.executemany(f"INSERT INTO lines VALUES ({marks})", batch)
                batch.clear()
        db.executemany(f"INSERT INTO lines VALUES ({marks})", batch)
        db.execute(f"CREATE UNIQUE INDEX lines_key ON lines({self.key})")
        for c in self.columns:
            if c.name != self.key:
                db.execute(f"CREATE INDEX lines_{c.name} ON lines({c.name})")
        db.execute("ANALYZE")  # so two filters use the selective index (a conversation, not a status)
        db.commit()
        db.close()
        partial.rename(self.file)  # a scan killed midway leaves no index that looks complete

    def count(self, where: dict[str, object] | None = None) -> int:
        clause, args = _where(where)
        return self.db.execute(f"SELECT COUNT(*) FROM lines{clause}", args).fetchone()[0]

    def page(self, where: dict[str, object] | None, order: str, limit: int, offset: int) -> list[sqlite3.Row]:
        """Rows of the index (not the lines themselves) matching `where`, sorted by `order` (SQL)."""
        clause, args = _where(where)
        return self.db.execute(
            f"SELECT * FROM lines{clause} ORDER BY {order} LIMIT ? OFFSET ?", (*args, limit, offset)
        ).fetchall()

    def facet(self, column: str) -> list[tuple[object, int]]:
        """Each value of a column with how many lines have it, most frequent first."""
        return self.db.execute(
            f"SELECT {column}, COUNT(*) AS n FROM lines GROUP BY {column} ORDER BY n DESC, {column}"
        ).fetchall()

    def get(self, key: str) -> dict | None:
        """The parsed line whose key column is `key`, or None."""
        row = self.db.execute(f"SELECT offset, length FROM lines WHERE {self.key} = ?", (key,)).fetchone()
        if row is None:
            return None
        with open(self.path, "rb") as handle:
            handle.seek(row["offset"])
            return json.loads(handle.read(row["length"]))

    def neighbours(self, key: str) -> tuple[str | None, str | None]:
        """The keys of the lines before and after `key`, in file order."""
        line = self.db.execute(f"SELECT line FROM lines WHERE {self.key} = ?", (key,)).fetchone()
        if line is None:
            return None, None
        before = self.db.execute(
            f"SELECT {self.key} FROM lines WHERE line < ? ORDER BY line DESC LIMIT 1", (line[0],)
        ).fetchone()
        after = self.db.execute(
            f"SELECT {self.key} FROM lines WHERE line > ? ORDER BY line LIMIT 1", (line[0],)
        ).fetchone()
        return (before[0] if before else None), (after[0] if after else None)

    def close(self) -> None:
        self.db.close()


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, bytes) of each non-blank line."""
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                yield number, offset, raw
            offset += len(raw)


def _where(where: dict[str, object] | None) -> tuple[str, list]:
    """` WHERE a = ? AND b = ?` for the filters that are set (None means "any")."""
    given = {k: v for k, v in (where or {}).items() if v is not None and v != ""}
    if not given:
        return "", []
    return " WHERE " + " AND ".join(f"{k} = ?" for k in given), list(given.values())
