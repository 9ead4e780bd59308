"""The two seams of the memory store: what a SQL backend supplies (`Dialect`) and what a retrieval index
is (`Index`). The record lifecycle itself is written once, over any dialect, in `stores.log.RecordLog`.

A dialect is the connection (or pool), transactions and the user's write lock, the few types SQL spells
differently (arrays, JSON, days, flags), the migrations folder and how the applied version is kept, and
the queries whose best plan differs between engines. Every SQL text in the store is written once, in
SQLite's spelling with `?` placeholders and `{user}` for "this user's rows" (which a dialect may widen,
e.g. with Postgres's tenant), and each dialect's `Sql` cursor translates it.

An index keeps one retrieval path in step with the log: `upsert` and `remove` run inside the log's write
transaction (an index with tables of its own writes them there; an in-process one follows the log's change
stamps instead and does nothing), `clear` drops a user (`transfer.load(replace=True)`), `search` answers
a query. Indexes are chosen by name (`stores.indexes.INDEXES`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

_CHUNK = 500  # ids per IN (...) list: under SQLite's bound-parameter limit


def new_epoch() -> int:
    """A user's `epoch` when its `user_stats` row is created: random, so a row emptied and created again
    behind a process's back (a truncated table, a restored backup) never carries the epoch that process's
    in-process indexes hold for the user, and they read the user again from scratch."""
    return secrets.randbits(62)


def chunks(ids: list[str], size: int = _CHUNK) -> list[list[str]]:
    """`ids` in lists of `size`, by default short enough for one `IN (...)` each, on every engine."""
    return [ids[i : i + size] for i in range(0, len(ids), size)]


class RecordStateError(ValueError):
    """An operation the record's status does not allow (e.g. updating a deleted record)."""

    def __init__(self, record_id: str, status: str, operation: str, allowed: str = "active"):
        self.record_id, self.status, self.operation = record_id, status, operation
        super().__init__(
            f"record {record_id!r} is {status}: only {allowed} records can be {operation}"
            + ("" if status != "deleted" or allowed != "active" else " (restore it first)")
        )


class Sql:
    """One cursor of a transaction, speaking the store's SQL spelling (`?`, `{user}`) to the engine."""

    def __init__(self, cursor: Any, translate: Callable[[str], str]):
        self.cursor, self.translate = cursor, translate

    def run(self, query: str, params: Sequence | dict = (), **options: Any) -> Any:
        return self.cursor.execute(self.translate(query), params, **options)

    def rows(self, query: str, params: Sequence | dict = (), **options: Any) -> list[dict]:
        found = self.run(query, params, **options).fetchall()
        return found if not found or isinstance(found[0], dict) else [dict(r) for r in found]

    def row(self, query: str, params: Sequence | dict = (), **options: Any) -> dict | None:
        found = self.run(query, params, **options).fetchone()
        return found if found is None or isinstance(found, dict) else dict(found)

    def tuples(self, query: str, params: Sequence | dict = ()) -> list[tuple]:
        """Every row as a tuple of its columns, in order (no dict per row: an index read returns
        thousands)."""
        found = self.run(query, params).fetchall()
        return [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in found]

    def first_column(self, query: str, params: Sequence | dict = ()) -> list:
        """The first column of every row (no row turned into a dict: a lookup returns hundreds)."""
        found = self.run(query, params).fetchall()
        return (
            [next(iter(r.values())) for r in found]
            if found and isinstance(found[0], dict)
            else [r[0] for r in found]
        )

    def many(self, query: str, rows: Iterable[Sequence]) -> None:
        rows = list(rows)
        if rows:
            self.cursor.executemany(self.translate(query), rows)


def change_stamp(sql: Sql, user_id: str) -> tuple[int, int]:
    """(epoch, seq): the user's last change to what the indexes hold, as `sql`'s transaction sees it;
    `seq` grows with every index or unindex of a record, `epoch` when the store replaced the user wholesale
    (`transfer.load(replace=True)`) or emptied and created the row again. (0, 0): no such user yet."""
    row = sql.row("SELECT epoch, seq FROM user_stats WHERE {user}", (user_id,))
    return (row["epoch"], row["seq"]) if row else (0, 0)


class Dialect(Protocol):
    """A SQL engine under `RecordLog`."""

    name: str
    """"sqlite" or "postgres": the migrations folder and the default indexes."""
    url: str
    serialized: bool
    """True: one connection, callers serialize their calls (SQLite); False: a pool, call from any thread."""
    user_key: str
    """The columns a per-user row is unique on (an ON CONFLICT target)."""
    for_update: str
    """What locks a read row until commit ("" where the transaction already holds the writer's lock)."""

    def transaction(self, write: bool = True) -> AbstractContextManager[Any]:
        """One atomic write block: all of it lands or none of it, also when the process is killed.
        `write=False`: reads only (a write inside is refused), and no user's write lock is taken."""

    def cursor(self, user_id: str, write: bool = False) -> AbstractContextManager[Sql]:
        """A cursor on the block's connection (or a transaction of its own outside one) confined to the
        user's rows. Inside a block the first one for a user takes the user's write lock, as does a
        `write` one outside a block."""

    def all_users(self) -> AbstractContextManager[tuple[Sql, str]]:
        """A cursor that may read every user (of the store's tenant), and the WHERE clause that says so."""

    def limit(self, n: int) -> Any:
        """A LIMIT value; n < 0: none."""

    def to_array(self, values: list) -> Any: ...
    def from_array(self, value: Any) -> list: ...
    def to_json(self, value: Any) -> Any: ...
    def from_json(self, value: Any) -> Any: ...
    def to_day(self, iso: str | None) -> Any: ...
    def from_day(self, value: Any) -> str | None: ...
    def to_flag(self, value: bool) -> Any: ...

    def keywords(self, sql: Sql, user_id: str, types: list[str], keys: list[str], limit: int) -> list[str]:
        """`Lookup.keywords`' query, planned for the engine."""

    def schema_version(self) -> int:
        """The number of the last migration applied."""

    def migrate(self, migrations: list[tuple[int, str, str]]) -> int:
        """Apply the migrations above `schema_version`, each atomically; how many were applied."""

    def ping(self) -> bool:
        """A trivial query answers (readiness checks)."""

    def close(self) -> None: ...


class Index(Protocol):
    """One retrieval path over a user's active records."""

    name: str
    kind: str
    """"lexical" (a query string) or "dense" (a query vector): which path it serves."""
    concurrent: bool
    """True: `search` may run while other calls hold the caller's store lock."""

    def upsert(self, sql: Sql, user_id: str, record: dict, vector: np.ndarray | None) -> None:
        """Index an active record (inside the log's write transaction)."""

    def remove(self, sql: Sql, user_id: str, record_id: str) -> None:
        """Forget a record that left `active`, or is about to be indexed again."""

    def clear(self, sql: Sql, user_id: str) -> None:
        """Forget every record of the user (the user is being replaced)."""

    def search(self, user_id: str, query: Any, k: int) -> list[tuple[str, float]]:
        """The k best active records: (id, score), best first."""

    def close(self) -> None:
        """Release what the index holds (a connection of its own)."""


class DenseIndex(Index, Protocol):
    def vectors(self, sql: Sql, user_id: str, record_ids: list[str] | None) -> tuple[list[str], np.ndarray]:
        """(ids, float32 matrix) of the given (None: all) active records' vectors, ordered by id."""

    def closest(
        self, sql: Sql, user_id: str, query: np.ndarray, record_ids: list[str], k: int
    ) -> list[tuple[str, float]]:
        """The k of the given active records nearest the query by cosine, scored exactly in the caller's
        transaction: (id, similarity), best first, ties by id."""
