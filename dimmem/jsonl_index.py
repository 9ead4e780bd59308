"""A JSONL file opened for paging: each line's byte offset and the fields pages filter and sort by, in a
small SQLite table; a page is a query on that table, a line is one seek.

Whoever writes a large file can write its index beside it (`write_jsonl`: the offsets are known as the
lines go out, so it costs next to nothing), and a reader then opens it without reading the file. A
reader without one (an older file, one edited since) scans the file once into `index_dir`. Either index
records the file's size and modification time and its columns, and is used only while they match; both
are written to `.partial` and renamed, so a killed write never leaves an index that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

BATCH = 5000  # rows per insert
FORMAT = 1  # the index's layout: an index of another layout is not read


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str  # TEXT | INTEGER | REAL
    value: Callable[[dict], object]  # the column's value from a parsed line


def signature(columns: list[Column], key: str) -> str:
    """What an index holds, so a reader wanting other columns does not take it for its own."""
    return f"{FORMAT}|{key}|" + ",".join(f"{c.name}:{c.sql_type}" for c in columns)


class IndexWriter:
    """An index written to `target` + `.partial` row by row in file order; `finish` stamps the file it
    describes and renames it to `target`. Leaving the `with` block without `finish` removes it."""

    def __init__(self, target: Path, columns: list[Column], key: str):
        self.target, self.columns, self.key = target, columns, key
        self.partial = target.with_name(target.name + ".partial")
        target.unlink(missing_ok=True)  # the file it described is being replaced
        self.partial.unlink(missing_ok=True)
        self.db = sqlite3.connect(self.partial)
        cols = ", ".join(f"{c.name} {c.sql_type}" for c in columns)
        self.db.execute("CREATE TABLE source (size INTEGER, mtime_ns INTEGER, columns TEXT)")
        self.db.execute(
            f"CREATE TABLE lines (line INTEGER PRIMARY KEY, offset INTEGER, length INTEGER, {cols})"
        )
        self.insert = f"INSERT INTO lines VALUES ({','.join('?' * (len(columns) + 3))})"
        self.batch: list[tuple] = []

    def __enter__(self) -> IndexWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.db.close()
        self.partial.unlink(missing_ok=True)

    def add(self, line: int, offset: int, length: int, row: dict) -> None:
        self.batch.append((line, offset, length, *(c.value(row) for c in self.columns)))
        if len(self.batch) >= BATCH:
            self.db.executemany(self.insert, self.batch)
            self.batch.clear()

    def finish(self, source: Path) -> None:
        """Stamp `source` (closed: its final size and modification time) and put the index in place."""
        self.db.executemany(self.insert, self.batch)
        self.db.execute(f"CREATE UNIQUE INDEX lines_key ON lines({self.key})")
        for c in self.columns:
            if c.name != self.key:
                self.db.execute(f"CREATE INDEX lines_{c.name} ON lines({c.name})")
        self.db.execute("ANALYZE")  # so two filters use the selective index (a conversation, not a status)
        stat = source.stat()
        self.db.execute(
            "INSERT INTO source VALUES (?, ?, ?)",
            (stat.st_size, stat.st_mtime_ns, signature(self.columns, self.key)),
        )
        self.db.commit()
        self.db.close()
        self.partial.rename(self.target)


def write_jsonl(path: Path, rows: Iterable[dict], columns: list[Column], key: str, index: Path) -> None:
    """Write `rows` to `path`, one JSON object a line, and their index to `index`."""
    with IndexWriter(index, columns, key) as writer:
        offset = 0
        with open(path, "wb") as handle:
            for number, row in enumerate(rows, start=1):
                raw = (json.dumps(row, ensure_ascii=False) + "\n").encode()
                handle.write(raw)
                writer.add(number, offset, len(raw), row)
                offset += len(raw)
        writer.finish(path)


class JsonlIndex:
    """The lines of `path` with `columns` extracted; `key` names the column that identifies a line.

    `sidecar`: the index its writer left beside it, used when it matches the file; otherwise the index is
    found in, or scanned into, `index_dir`, keyed by the file's resolved path, size and modification
    time. `head`: the bytes that open the first key the columns do not need (e.g. `b', "value": '`, in
    files that write their short keys first): a scanned line is decoded only up to them, so a scan costs
    the few fields indexed, not the whole record. Those bytes cannot occur inside a JSON string (its
    quotes are escaped); a line without them is decoded whole. The file itself is never written."""

    def __init__(
        self,
        path: Path,
        columns: list[Column],
        key: str,
        index_dir: Path,
        head: bytes = b"",
        sidecar: Path | None = None,
    ):
        self.path, self.columns, self.key, self.head = path, columns, key, head
        stat = path.stat()
        stamp = (stat.st_size, stat.st_mtime_ns, signature(columns, key))
        self.built = False  # scanned now rather than found ready
        if sidecar is not None and _stamp(sidecar) == stamp:
            self.file = sidecar
        else:
            fingerprint = f"{path.resolve()}|{'|'.join(map(str, stamp))}"
            index_dir.mkdir(parents=True, exist_ok=True)
            self.file = (
                index_dir / f"{path.stem}-{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}.sqlite"
            )
            if not self.file.exists():
                self._build()
                self.built = True
        self.db = sqlite3.connect(f"file:{self.file}?mode=ro", uri=True, check_same_thread=False)
        self.db.row_factory = sqlite3.Row

    def _build(self) -> None:
        with IndexWriter(self.file, self.columns, self.key) as writer:
            for number, offset, raw in _lines(self.path):
                cut = raw.find(self.head) if self.head else -1
                try:
                    row = json.loads(raw[:cut] + b"}" if cut > 0 else raw)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{self.path}: line {number}: not JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(
                        f"{self.path}: line {number}: a JSON {type(row).__name__}, not an object"
                    )
                writer.add(number, offset, len(raw), row)
            writer.finish(self.path)

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


def _stamp(index: Path) -> tuple | None:
    """(size, mtime_ns, columns) of the file an index describes; None for no index, or not one."""
    try:
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        return db.execute("SELECT size, mtime_ns, columns FROM source").fetchone()
    except sqlite3.Error:
        return None
    finally:
        db.close()


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
