"""What the stores keep of a record, derived from the contract (`dimmem.contract.records.MemoryRecord`),
how its columns are written and read back in a dialect's types (`encode`, `decode`, `snapshot_of`: one
way for the log, the lexical index and `transfer`), and the numbered `.sql` migrations each backend ships
(`migrations/<dialect>/NNNN_name.sql`).

A stored record is the contract's fields plus what the pipeline adds: where it came from (user,
conversation, window, session time), its time as a day span for interval queries (`t_start`, `t_end`)
and its lifecycle (created, updated, version, status). A field added to the contract is a column here
without an edit; the migration that adds it to each backend's table is the one thing to write
(tests/test_store_schema.py checks every backend's DDL against `COLUMNS`).
"""

from __future__ import annotations

import re
import typing
from importlib import resources

from dimmem.contract.records import MEMORY_FIELDS, MemoryRecord
from dimmem.contract.timespan import parse_span
from dimmem.runtime.stores.base import Dialect

ORIGIN = ("id", "user_id", "conversation_id", "window_id")
LIFECYCLE = ("session_time", "created", "updated", "version", "status")
DAY_SPAN = ("t_start", "t_end")


def _after_time(fields: tuple[str, ...]) -> tuple[str, ...]:
    """The contract's fields, `time` followed by its day span."""
    out: list[str] = []
    for name in fields:
        out += [name, *DAY_SPAN] if name == "time" else [name]
    return tuple(out)


# The contract's order, as records are returned and shown: what a model writes, then the bookkeeping
COLUMNS: tuple[str, ...] = ORIGIN + _after_time(MEMORY_FIELDS) + LIFECYCLE
LIST_FIELDS: tuple[str, ...] = tuple(
    name for name, info in MemoryRecord.model_fields.items() if typing.get_origin(info.annotation) is list
)
"""Contract fields holding lists (keywords, source turns): arrays or JSON text, by dialect."""

_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


def row(record: dict) -> dict:
    """The stored columns of a record's contract fields (its time also as a day span)."""
    span = parse_span(record["time"]) if record.get("time") else None
    out = {name: record.get(name) for name in MEMORY_FIELDS}
    out["t_start"], out["t_end"] = (span[0].isoformat(), span[1].isoformat()) if span else (None, None)
    return out


def encode(dialect: Dialect, row: dict) -> dict:
    """Contract-shaped columns as the dialect stores them."""
    out = dict(row)
    for name in LIST_FIELDS:
        out[name] = dialect.to_array(out[name])
    for name in DAY_SPAN:
        out[name] = dialect.to_day(out[name])
    return out


def decode(dialect: Dialect, row: dict) -> dict:
    """A row of record columns (a search reads hundreds) as records are returned, in place: lists as
    lists, days as ISO text."""
    from_array, from_day = dialect.from_array, dialect.from_day
    for name in LIST_FIELDS:
        if name in row:
            row[name] = from_array(row[name])
    for name in DAY_SPAN:
        if name in row:
            row[name] = from_day(row[name])
    return row


def snapshot_of(dialect: Dialect, row: dict) -> dict:
    """A history row's snapshot in the record's column order (jsonb keeps none)."""
    snapshot = dialect.from_json(row["snapshot"])
    return {**{c: snapshot[c] for c in COLUMNS if c in snapshot}, **snapshot}


def migrations(dialect: str) -> list[tuple[int, str, str]]:
    """(version, name, SQL) of every migration shipped for the dialect, in order, numbered 1..n."""
    folder = resources.files("dimmem.runtime.stores") / "migrations" / dialect
    found = sorted(
        (int(match[1]), match[2], entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if (match := _MIGRATION.match(entry.name))
    )
    if [v for v, _, _ in found] != list(range(1, len(found) + 1)):
        numbers = [v for v, _, _ in found]
        raise RuntimeError(f"migrations/{dialect}: versions must run 1..n without gaps, got {numbers}")
    return found
