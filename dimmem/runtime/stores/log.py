"""The record log: the memory store's record lifecycle and reads, written once over a SQL dialect
(`base.Dialect`: SQLite or Postgres), with the retrieval indexes (`base.Index`) it keeps in step. The
store's other jobs are parts of their own: the conversation log (`conversations.ConversationLog`, a
store's `conversations`), the reads that find records for retrieval and updates (`lookup.Lookup`, its
`lookup`) and moving a user between stores (`transfer`).

Every read and write names one user; none crosses users. A record is `active` until it is superseded,
merged into another or deleted; only active records are indexed (keywords, lexical, dense) and only
active records can be revised or change status; a deleted record can be restored (re-indexed, history
"RESTORE"); superseded and merged records are history and stay as they are. Anything else raises
`RecordStateError`, checked inside the caller's write transaction, which holds the user's write lock
(the dialect's), so a writer never revises a record another writer deleted meanwhile.

Each version of a record is a row of `record_history` (a snapshot of every column). Whenever a record is
indexed or unindexed it gets its user's next change number (`seq`, counted in `user_stats`) in the same
transaction: in-process indexes re-read only what changed since the number they hold, so a committed write
is seen by the next search in every process, a crashed one by none.

Writes run inside `transaction()`: all of a block lands or none of it, also when the process is killed.

The store also owns what every caller in this process shares: `lock`, held around a block of calls on
a store of one connection (SQLite; a pooled store, Postgres, needs none here: its transactions lock one
user's writes in the database), and `stats`, what the runtime did with it, counted under a lock of its
own on either backend.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from dimmem.runtime.stores import schema
from dimmem.runtime.stores.base import Dialect, RecordStateError, Sql, chunks, new_epoch
from dimmem.runtime.stores.conversations import ConversationLog
from dimmem.runtime.stores.indexes import open_indexes
from dimmem.runtime.stores.lookup import Lookup

STATUSES_LEFT = ("superseded", "merged", "deleted")  # what an active record can become
STATUSES = ("active", *STATUSES_LEFT)
RESTORABLE = "deleted, superseded or merged"  # every one of them: `restore` undoes each
_SELECT = ", ".join(f'"{c}"' for c in schema.COLUMNS)  # (quoted: `time` is a keyword in Postgres)
_VALUES = ", ".join("?" * len(schema.COLUMNS))
_INSERT_RECORD = f"INSERT INTO records ({_SELECT}, seq) VALUES ({_VALUES}, ?)"
_SEQ = "(SELECT seq FROM user_stats WHERE {user})"  # the user's change number `_bump` just drew
_INSERT_NEW = f"INSERT INTO records ({_SELECT}, seq) VALUES ({_VALUES}, {_SEQ})"
_INSERT_HISTORY = (
    "INSERT INTO record_history (user_id, record_id, version, action, snapshot, at) VALUES (?,?,?,?,?,?)"
)


class Stats:
    """Counts by name (searches, windows, decisions, embedding comparisons ...), added from any thread:
    no count is lost when two add at once."""

    def __init__(self):
        self._counts: Counter = Counter()
        self._lock = threading.Lock()

    def add(self, **counts: int) -> None:
        with self._lock:
            self._counts.update(counts)

    def __getitem__(self, name: str) -> int:
        return self._counts[name]

    def get(self, name: str, default: int = 0) -> int:
        return self._counts.get(name, default)

    def items(self):
        with self._lock:
            return list(self._counts.items())

    def keys(self):
        return [name for name, _ in self.items()]


class RecordLog:
    """The memory store: records and their history in one SQL database, with its retrieval indexes
    (`indexes["lexical"]`, `indexes["dense"]`) kept in step; its conversation log (`conversations`) and
    the reads that find records (`lookup`) are parts of it, over the same database."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        migrate: bool = True,
        indexes: dict[str, str] | None = None,
        ann_min_records: int = 200_000,
    ):
        """`migrate`: apply pending migrations now; `indexes`: {"lexical": name, "dense": name} of
        `stores.indexes.INDEXES` (default: the dialect's); `ann_min_records`: where an in-process dense
        index switches from exact search to HNSW."""
        self.dialect, self.url, self.serialized = dialect, dialect.url, dialect.serialized
        try:
            if migrate:
                self.migrate()
            self.indexes = open_indexes(self, indexes, {"ann_min_records": ann_min_records})
        except BaseException:
            dialect.close()
            raise
        self.concurrent_dense = self.indexes["dense"].concurrent
        """True: `lookup.dense` may run from any thread while other calls hold the caller's lock."""
        self.conversations = ConversationLog(dialect)
        self.lookup = Lookup(self)
        # one connection (SQLite): held per block of calls, re-entrant; a pool (Postgres): nothing to hold
        self.lock: AbstractContextManager = threading.RLock() if self.serialized else nullcontext()
        self.stats = Stats()

    # --- schema and health --------------------------------------------------------------------------
    def migrate(self) -> int:
        """Apply the pending schema migrations; how many were applied (0: current)."""
        return self.dialect.migrate(schema.migrations(self.dialect.name))

    def schema_version(self) -> int:
        return self.dialect.schema_version()

    def ping(self) -> bool:
        """A trivial query answers and the schema is this code's (readiness checks)."""
        return self.dialect.ping() and self.schema_version() == len(schema.migrations(self.dialect.name))

    def transaction(self, write: bool = True):
        """One atomic write block; the writes below run inside one. `write=False`: a block of reads only,
        on one connection, without the user's write lock (several reads for one decision)."""
        return self.dialect.transaction(write)

    def close(self) -> None:
        for index in self.indexes.values():
            index.close()
        self.dialect.close()

    # --- the record lifecycle ----------------------------------------------------------------------
    def insert(self, user_id: str, record: dict, vector: np.ndarray | None, action: str = "ADD") -> None:
        """A new active record, indexed, version 1 in its history (`vector` None: no dense entry)."""
        now = time.time()
        row = {
            **schema.encode(self.dialect, schema.row(record)),
            "id": record["id"],
            "user_id": user_id,
            "conversation_id": record.get("conversation_id"),
            "window_id": record.get("window_id"),
            "session_time": record.get("session_time"),
            "created": now,
            "updated": now,
            "version": 1,
            "status": "active",
        }
        with self.dialect.cursor(user_id, write=True) as sql:  # stamped as it lands: one write fewer
            self._bump(sql, user_id)
            sql.run(_INSERT_NEW, [*(row[c] for c in schema.COLUMNS), user_id])
            self._index(sql, user_id, record, vector, stamp=False)
            self._snapshot(sql, user_id, record["id"], 1, action, now, schema.decode(self.dialect, row))

    def revise(
        self, user_id: str, record_id: str, fields: dict, vector: np.ndarray | None, action: str
    ) -> int:
        """A new version of an active record (KeyError, RecordStateError); the old one stays in its
        history. Returns the new version number."""
        with self.dialect.cursor(user_id, write=True) as sql:
            current = self._active(sql, user_id, record_id, "revised")
            merged = {**current, **fields}
            row = schema.encode(self.dialect, schema.row(merged))
            version, now = current["version"] + 1, time.time()
            sets = ", ".join(f'"{c}"=?' for c in row)
            sql.run(
                f"UPDATE records SET {sets}, version=?, updated=? WHERE {{user}} AND id=?",
                [*row.values(), version, now, user_id, record_id],
            )
            self._unindex(sql, user_id, current)
            self._index(sql, user_id, merged, vector)
            self._snapshot(sql, user_id, record_id, version, action, now)
        return version

    def set_status(self, user_id: str, record_id: str, status: str, action: str) -> None:
        """An active record becomes superseded, merged or deleted: out of every index."""
        if status not in STATUSES_LEFT:
            raise ValueError(f"status {status!r}: expected superseded, merged or deleted")
        with self.dialect.cursor(user_id, write=True) as sql:
            current, now = self._active(sql, user_id, record_id, status), time.time()
            sql.run(
                "UPDATE records SET status=?, version=version+1, updated=? WHERE {user} AND id=?",
                (status, now, user_id, record_id),
            )
            self._unindex(sql, user_id, current)
            self._snapshot(sql, user_id, record_id, current["version"] + 1, action, now)

    def restore(self, user_id: str, record_id: str, vector: np.ndarray) -> int:
        """A deleted, superseded or merged record active again, re-indexed (`vector`: its content's
        embedding): the undo of a delete or of an update path's decision. Returns the new version."""
        with self.dialect.cursor(user_id, write=True) as sql:
            current = self._locked(sql, user_id, record_id)
            if current["status"] not in STATUSES_LEFT:
                raise RecordStateError(record_id, current["status"], "restored", RESTORABLE)
            version, now = current["version"] + 1, time.time()
            sql.run(
                "UPDATE records SET status='active', version=?, updated=? WHERE {user} AND id=?",
                (version, now, user_id, record_id),
            )
            self._index(sql, user_id, current, vector)
            self._snapshot(sql, user_id, record_id, version, "RESTORE", now)
        return version

    def _locked(self, sql: Sql, user_id: str, record_id: str) -> dict:
        """The record, which must exist (KeyError), locked until commit."""
        row = sql.row(
            f"SELECT {_SELECT} FROM records WHERE {{user}} AND id=?{self.dialect.for_update}",
            (user_id, record_id),
        )
        if row is None:
            raise KeyError(f"no record {record_id!r} for user {user_id!r}")
        return schema.decode(self.dialect, row)

    def _active(self, sql: Sql, user_id: str, record_id: str, operation: str) -> dict:
        """The record, locked, which must exist (KeyError) and be active (RecordStateError)."""
        current = self._locked(sql, user_id, record_id)
        if current["status"] != "active":
            raise RecordStateError(record_id, current["status"], operation)
        return current

    def _index(
        self, sql: Sql, user_id: str, record: dict, vector: np.ndarray | None, stamp: bool = True
    ) -> None:
        sql.many(
            "INSERT INTO record_keywords (user_id, type, keyword, record_id) VALUES (?,?,?,?)",
            _keyword_rows(user_id, record),
        )
        if stamp:
            self._stamp(sql, user_id, record["id"])
        for index in self.indexes.values():
            index.upsert(sql, user_id, record, vector)

    def _unindex(self, sql: Sql, user_id: str, record: dict) -> None:
        """Out of every index: `record` is the active version, as it was indexed."""
        sql.many(
            "DELETE FROM record_keywords WHERE {user} AND type=? AND keyword=? AND record_id=?",
            _keyword_rows(user_id, record),
        )
        self._stamp(sql, user_id, record["id"])
        for index in self.indexes.values():
            index.remove(sql, user_id, record["id"])

    def _stamp(self, sql: Sql, user_id: str, record_id: str) -> None:
        """The record gets the user's next change number: every process's in-process indexes re-read it."""
        self._bump(sql, user_id)
        sql.run(f"UPDATE records SET seq={_SEQ} WHERE {{user}} AND id=?", (user_id, user_id, record_id))

    def _bump(self, sql: Sql, user_id: str) -> None:
        """Draw the user's next change number; the statement that stamps reads it back, so no statement of
        a write waits for a result (Postgres sends a write block's statements in one pipeline)."""
        sql.run(
            "INSERT INTO user_stats (user_id, seq, epoch) VALUES (?, 1, ?) "
            f"ON CONFLICT ({self.dialect.user_key}) DO UPDATE SET seq = user_stats.seq + 1",
            (user_id, new_epoch()),
        )

    def _snapshot(
        self,
        sql: Sql,
        user_id: str,
        record_id: str,
        version: int,
        action: str,
        at: float,
        row: dict | None = None,
    ) -> None:
        """The record's version in its history: `row` (as `get` returns it), else read back."""
        snapshot = row or schema.decode(
            self.dialect,
            sql.row(f"SELECT {_SELECT} FROM records WHERE {{user}} AND id=?", (user_id, record_id)),
        )
        sql.run(
            _INSERT_HISTORY,
            (user_id, record_id, version, action, self.dialect.to_json(snapshot), at),
        )

    # --- reading records ---------------------------------------------------------------------------
    def get(self, user_id: str, record_id: str) -> dict | None:
        """The record (any status), or None."""
        with self.dialect.cursor(user_id) as sql:
            row = sql.row(f"SELECT {_SELECT} FROM records WHERE {{user}} AND id=?", (user_id, record_id))
        return schema.decode(self.dialect, row) if row else None

    def get_many(self, user_id: str, record_ids: list[str]) -> dict[str, dict]:
        """{id: record} for those of the ids the user has."""
        out = {}
        with self.dialect.cursor(user_id) as sql:
            for chunk in chunks(record_ids):
                rows = sql.rows(
                    f"SELECT {_SELECT} FROM records WHERE {{user}} AND id IN ({','.join('?' * len(chunk))})",
                    (user_id, *chunk),
                )
                out.update((r["id"], schema.decode(self.dialect, r)) for r in rows)
        return out

    def records(self, user_id: str, status: str | None = "active") -> list[dict]:
        """The user's records of a status (None: any), ordered by (created, id)."""
        return self.page(user_id, status=status, limit=-1)

    def page(
        self,
        user_id: str,
        *,
        type: str | None = None,
        status: str | None = "active",
        conversation_id: str | None = None,
        span: tuple[str, str] | None = None,
        after: tuple[float, str] | None = None,
        limit: int = 100,
    ) -> list[dict]:
        """One keyset page of the user's records ordered by (created, id): those after `after` (a previous
        page's last (created, id)), filtered by type, status (None: any), conversation and time overlapping
        the day span [start, end] (records without a time never overlap)."""
        where, params = ["{user}"], [user_id]
        for column, value in (("type", type), ("status", status), ("conversation_id", conversation_id)):
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if span is not None:
            where.append("t_start<=? AND t_end>=?")
            params += [self.dialect.to_day(span[1]), self.dialect.to_day(span[0])]
        if after is not None:
            where.append("(created, id) > (?, ?)")
            params += [after[0], after[1]]
        with self.dialect.cursor(user_id) as sql:
            rows = sql.rows(
                f"SELECT {_SELECT} FROM records WHERE {' AND '.join(where)} ORDER BY created, id LIMIT ?",
                (*params, self.dialect.limit(limit)),
            )
        return [schema.decode(self.dialect, r) for r in rows]

    def count(self, user_id: str) -> int:
        """The user's active records."""
        with self.dialect.cursor(user_id) as sql:
            row = sql.row("SELECT count(*) AS n FROM records WHERE {user} AND status='active'", (user_id,))
        return row["n"]

    def history(self, user_id: str, record_id: str) -> list[dict]:
        """The record's versions: [{"version", "action", "at", "record"}], oldest first."""
        with self.dialect.cursor(user_id) as sql:
            rows = sql.rows(
                "SELECT version, action, snapshot, at FROM record_history WHERE {user} AND record_id=? "
                "ORDER BY version",
                (user_id, record_id),
            )
        return [
            {
                "version": r["version"],
                "action": r["action"],
                "at": r["at"],
                "record": schema.snapshot_of(self.dialect, r),
            }
            for r in rows
        ]


def _keyword_rows(user_id: str, record: dict) -> list[tuple]:
    """The record's rows of the keyword lookup (its primary key): one per casefolded keyword."""
    keywords = sorted({k.casefold() for k in record["keywords"]})
    return [(user_id, record["type"], k, record["id"]) for k in keywords]
