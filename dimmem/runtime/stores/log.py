"""The record log: the memory store's one implementation of the record lifecycle, the conversation log and
moving a user between stores, written once over a SQL dialect (`base.Dialect`: SQLite or Postgres) with
the retrieval indexes (`base.Index`) it keeps in step.

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

Conversation turns are written once (`put_turns` inserts, never replaces): records point at them. A
conversation's windows are recorded with the turns (`put_windows`), pending until their records are stored
(`window_done`), so an add that was killed midway is completed by the next add of the conversation.

Writes run inside `transaction()`: all of a block lands or none of it, also when the process is killed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

import numpy as np

from dimmem.contract.conversation import Turn
from dimmem.runtime import lexical
from dimmem.runtime.stores import schema
from dimmem.runtime.stores.base import Dialect, RecordStateError, Sql
from dimmem.runtime.stores.indexes import open_indexes

STATUSES_LEFT = ("superseded", "merged", "deleted")  # what an active record can become
_SELECT = ", ".join(f'"{c}"' for c in schema.COLUMNS)  # (quoted: `time` is a keyword in Postgres)
_VALUES = ", ".join("?" * len(schema.COLUMNS))
_INSERT_RECORD = f"INSERT INTO records ({_SELECT}, seq) VALUES ({_VALUES}, ?)"
_SEQ = "(SELECT seq FROM user_stats WHERE {user})"  # the user's change number `_bump` just drew
_INSERT_NEW = f"INSERT INTO records ({_SELECT}, seq) VALUES ({_VALUES}, {_SEQ})"
_TURN_COLUMNS = (
    "conversation_id",
    "turn_id",
    "position",
    "speaker",
    "role",
    "text",
    "session_time",
    "session_id",
)
_INSERT_TURN = (
    f"INSERT INTO turns (user_id, {', '.join(_TURN_COLUMNS)}) "
    f"VALUES ({', '.join('?' * (1 + len(_TURN_COLUMNS)))})"
)
_INSERT_HISTORY = (
    "INSERT INTO record_history (user_id, record_id, version, action, snapshot, at) VALUES (?,?,?,?,?,?)"
)
_CHUNK = 500  # ids per IN (...) list: under SQLite's bound-parameter limit


class RecordLog:
    """The memory store: records, their history and the conversations they point into, in one SQL
    database, with its retrieval indexes (`indexes["lexical"]`, `indexes["dense"]`) kept in step."""

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
        """True: `dense` may run from any thread while other calls hold the caller's lock."""

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
            **self._encode(schema.row(record)),
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
            self._snapshot(sql, user_id, record["id"], 1, action, now, self._decode(row))

    def revise(
        self, user_id: str, record_id: str, fields: dict, vector: np.ndarray | None, action: str
    ) -> int:
        """A new version of an active record (KeyError, RecordStateError); the old one stays in its
        history. Returns the new version number."""
        with self.dialect.cursor(user_id, write=True) as sql:
            current = self._active(sql, user_id, record_id, "revised")
            merged = {**current, **fields}
            row, version, now = self._encode(schema.row(merged)), current["version"] + 1, time.time()
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
        """A deleted record active again, re-indexed (`vector`: its content's embedding); the new version."""
        with self.dialect.cursor(user_id, write=True) as sql:
            current = self._locked(sql, user_id, record_id)
            if current["status"] != "deleted":
                raise RecordStateError(record_id, current["status"], "restored", "deleted")
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
        return self._decode(row)

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
            "INSERT INTO user_stats (user_id, seq) VALUES (?, 1) "
            f"ON CONFLICT ({self.dialect.user_key}) DO UPDATE SET seq = user_stats.seq + 1",
            (user_id,),
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
        snapshot = row or self._decode(
            sql.row(f"SELECT {_SELECT} FROM records WHERE {{user}} AND id=?", (user_id, record_id))
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
        return self._decode(row) if row else None

    def get_many(self, user_id: str, record_ids: list[str]) -> dict[str, dict]:
        """{id: record} for those of the ids the user has."""
        out = {}
        with self.dialect.cursor(user_id) as sql:
            for start in range(0, len(record_ids), _CHUNK):
                chunk = record_ids[start : start + _CHUNK]
                rows = sql.rows(
                    f"SELECT {_SELECT} FROM records WHERE {{user}} AND id IN ({','.join('?' * len(chunk))})",
                    (user_id, *chunk),
                )
                out.update((r["id"], self._decode(r)) for r in rows)
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
        return [self._decode(r) for r in rows]

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
            {"version": r["version"], "action": r["action"], "at": r["at"], "record": self._snapshot_of(r)}
            for r in rows
        ]

    # --- the dimension and retrieval paths -----------------------------------------------------------
    def candidates(
        self, user_id: str, types: str | list[str], keywords: list[str], limit: int = -1
    ) -> list[str]:
        """Active records of the type(s) sharing a keyword, most shared first (`limit` -1: all). Each
        (type, keyword) contributes at most `limit` records, the first by id, so a keyword most records
        carry costs no more than a rare one."""
        keys = sorted({k.casefold() for k in keywords})
        types = sorted({types} if isinstance(types, str) else set(types))
        if not keys or not types:
            return []
        with self.dialect.cursor(user_id) as sql:
            return self.dialect.candidates(sql, user_id, types, keys, limit)

    def records_in_span(self, user_id: str, start: str, end: str, limit: int = -1) -> list[str]:
        """Active records whose time overlaps the day span [start, end], the latest-starting first: those
        starting inside it, then of those starting before it the `limit` latest-starting that still run
        into it (so a lookup reads at most twice `limit` index entries; -1: all)."""
        first, last, limit = self.dialect.to_day(start), self.dialect.to_day(end), self.dialect.limit(limit)
        active = "FROM records WHERE {user} AND status='active'"
        with self.dialect.cursor(user_id) as sql:
            return sql.first_column(
                f"SELECT id FROM (SELECT * FROM (SELECT id, t_start {active} AND t_start BETWEEN ? AND ? "
                "ORDER BY t_start DESC, id LIMIT ?) inside UNION ALL "
                f"SELECT id, t_start FROM (SELECT id, t_start, t_end {active} AND t_start < ? "
                "ORDER BY t_start DESC, id LIMIT ?) before WHERE t_end >= ?) found "
                "ORDER BY t_start DESC, id LIMIT ?",
                (user_id, first, last, limit, user_id, first, limit, first, limit),
            )

    def lexical(self, user_id: str, query: str, k: int) -> list[tuple[str, float]]:
        """The lexical index's k best active records for the query: (id, score), best first."""
        return self.indexes["lexical"].search(user_id, query, k)

    def dense(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k active records nearest by cosine: (id, similarity), best first."""
        if k <= 0:
            return []
        return self.indexes["dense"].search(user_id, np.asarray(vector, dtype=np.float32), k)

    def vectors(self, user_id: str, record_ids: list[str]) -> tuple[list[str], np.ndarray]:
        """(ids, float32 matrix) of the given active records' vectors, ordered by id."""
        if not record_ids:
            return [], np.zeros((0, 0), dtype=np.float32)
        with self.dialect.cursor(user_id) as sql:
            return self.indexes["dense"].vectors(sql, user_id, record_ids)

    def lexical_stamp(self, user_id: str) -> tuple[int, int]:
        """(epoch, seq): the user's last change to what the in-process indexes hold; `seq` grows with every
        index or unindex of a record, `epoch` when the user is replaced wholesale (`load(replace=True)`)."""
        with self.dialect.cursor(user_id) as sql:
            row = sql.row("SELECT epoch, seq FROM user_stats WHERE {user}", (user_id,))
        return (row["epoch"], row["seq"]) if row else (0, 0)

    def lexical_changes(self, user_id: str, after: int) -> list[dict]:
        """The records whose index state changed after change number `after` (0: the active records), in
        change order: id, status and the indexed fields (`lexical.FIELDS`)."""
        with self.dialect.cursor(user_id) as sql:
            rows = sql.rows(
                f"SELECT id, status, {', '.join(lexical.FIELDS)} FROM records "
                "WHERE {user} AND seq > ? AND (status = 'active' OR ? > 0) ORDER BY seq",
                (user_id, after, after),
            )
        return [self._decode(r) for r in rows]

    # --- the conversation log ------------------------------------------------------------------------
    def put_turns(self, user_id: str, conversation_id: str, turns: Iterable[Turn]) -> int:
        """Append the turns not stored yet, after the stored ones; a stored turn is never rewritten: the
        same id with another role or text raises ValueError. Returns how many were added."""
        with self.dialect.cursor(user_id, write=True) as sql:
            stored = {
                r["turn_id"]: (r["role"], r["text"])
                for r in sql.rows(
                    "SELECT turn_id, role, text FROM turns WHERE {user} AND conversation_id=?",
                    (user_id, conversation_id),
                )
            }
            rows, position = [], len(stored)
            for t in turns:
                if t.id in stored:
                    if stored[t.id] != (t.role, t.text):
                        raise ValueError(
                            f"conversation {conversation_id!r}: turn {t.id!r} is stored with other text; "
                            "stored turns are never rewritten (records point at them): give the new turn a "
                            "new id"
                        )
                    continue
                stored[t.id] = (t.role, t.text)
                rows.append(
                    (user_id, conversation_id, t.id, position, t.speaker, t.role, t.text)
                    + (t.session_time, t.session_id)
                )
                position += 1
            sql.many(_INSERT_TURN, rows)
        return len(rows)

    def put_windows(self, user_id: str, windows: Iterable) -> None:
        """Record a conversation's new windows (contract `Window`s) as pending (`window_done` when their
        records are stored)."""
        to_array = self.dialect.to_array
        rows = [
            (
                user_id,
                w.conversation_id,
                w.index,
                to_array([t.id for t in w.context]),
                to_array([t.id for t in w.new]),
            )
            for w in windows
        ]
        with self.dialect.cursor(user_id, write=True) as sql:
            sql.many(
                "INSERT INTO windows (user_id, conversation_id, idx, context, new) VALUES (?,?,?,?,?)", rows
            )

    def window_done(self, user_id: str, conversation_id: str, indexes: list[int]) -> None:
        """Mark windows done: their records are stored."""
        with self.dialect.cursor(user_id, write=True) as sql:
            sql.many(
                "UPDATE windows SET done=? WHERE {user} AND conversation_id=? AND idx=?",
                [(self.dialect.to_flag(True), user_id, conversation_id, i) for i in indexes],
            )

    def turns(self, user_id: str, conversation_id: str) -> list[Turn]:
        """The conversation's stored turns, in order."""
        with self.dialect.cursor(user_id) as sql:
            rows = sql.rows(
                "SELECT turn_id, speaker, role, text, session_id, session_time FROM turns "
                "WHERE {user} AND conversation_id=? ORDER BY position",
                (user_id, conversation_id),
            )
        return [
            Turn(r["turn_id"], r["speaker"], r["role"], r["text"], _session(r), r["session_time"])
            for r in rows
        ]

    def turn_count(self, user_id: str, conversation_id: str) -> int:
        """How many turns of the conversation are stored."""
        with self.dialect.cursor(user_id) as sql:
            return sql.row(
                "SELECT count(*) AS n FROM turns WHERE {user} AND conversation_id=?",
                (user_id, conversation_id),
            )["n"]

    def has_turns(self, user_id: str) -> bool:
        """Whether any turns are stored for the user."""
        with self.dialect.cursor(user_id) as sql:
            return sql.row("SELECT 1 AS found FROM turns WHERE {user} LIMIT 1", (user_id,)) is not None

    def next_window_index(self, user_id: str, conversation_id: str) -> int:
        """The index the conversation's next window gets: after every recorded window and after every
        window its records name (conversations stored before windows were recorded)."""
        with self.dialect.cursor(user_id) as sql:
            last = sql.row(
                "SELECT max(idx) AS last FROM windows WHERE {user} AND conversation_id=?",
                (user_id, conversation_id),
            )["last"]
            named = sql.rows(
                "SELECT DISTINCT window_id FROM records WHERE {user} AND conversation_id=?",
                (user_id, conversation_id),
            )
        indexes = [
            int(m.group(1)) for r in named if (w := r["window_id"]) and (m := re.search(r"/w(\d+)$", w))
        ]
        return max([-1 if last is None else last, *indexes]) + 1

    def pending_windows(self, user_id: str, conversation_id: str) -> list[tuple[int, list[str], list[str]]]:
        """(index, context turn ids, new turn ids) of the conversation's windows whose records are not all
        stored yet, in order."""
        with self.dialect.cursor(user_id) as sql:
            rows = sql.rows(
                "SELECT idx, context, new FROM windows WHERE {user} AND conversation_id=? AND done=? "
                "ORDER BY idx",
                (user_id, conversation_id, self.dialect.to_flag(False)),
            )
        return [
            (r["idx"], self.dialect.from_array(r["context"]), self.dialect.from_array(r["new"])) for r in rows
        ]

    def assistant_replies(self, user_id: str, conversation_id: str, turn_ids: list[str]) -> list[dict]:
        """The assistant turns answering the given turns: each up to the next user turn (the pointer's
        payoff)."""
        if not turn_ids:
            return []
        with self.dialect.cursor(user_id) as sql:
            bounds = sql.row(
                "SELECT min(position) AS lo, max(position) AS hi FROM turns WHERE {user} "
                f"AND conversation_id=? AND turn_id IN ({','.join('?' * len(turn_ids))})",
                (user_id, conversation_id, *turn_ids),
            )
            if bounds["lo"] is None:
                return []
            rows = sql.rows(
                "SELECT turn_id, speaker, role, text, session_time FROM turns WHERE {user} AND "
                "conversation_id=? AND position BETWEEN ? AND ? ORDER BY position",
                (user_id, conversation_id, bounds["lo"], bounds["hi"] + 2),
            )
        return [r for r in rows if r["role"] == "assistant"]

    # --- moving a store (`dimmem memory migrate --from --to`) ----------------------------------------
    def users(self) -> list[str]:
        """Every user with records, turns or windows, sorted."""
        with self.dialect.all_users() as (sql, where):
            rows = sql.rows(
                f"SELECT user_id FROM records {where} UNION SELECT user_id FROM turns {where} "
                f"UNION SELECT user_id FROM windows {where} ORDER BY 1"
            )
        return [r["user_id"] for r in rows]

    def dump(self, user_id: str) -> dict:
        """Everything of one user as raw rows (every status, history, turns, windows, the active records'
        vectors): what `load` writes back, losslessly, into either backend."""
        with self.transaction(), self.dialect.cursor(user_id) as sql:
            history = [
                {**r, "snapshot": self._snapshot_of(r)}
                for r in sql.rows(
                    "SELECT record_id, version, action, snapshot, at FROM record_history WHERE {user} "
                    "ORDER BY record_id, version",
                    (user_id,),
                )
            ]
            turns = sql.rows(
                f"SELECT {', '.join(_TURN_COLUMNS)} FROM turns WHERE {{user}} "
                "ORDER BY conversation_id, position",
                (user_id,),
            )
            windows = [
                {
                    **w,
                    "context": self.dialect.from_array(w["context"]),
                    "new": self.dialect.from_array(w["new"]),
                }
                | {"done": bool(w["done"])}
                for w in sql.rows(
                    "SELECT conversation_id, idx, context, new, done FROM windows WHERE {user} "
                    "ORDER BY conversation_id, idx",
                    (user_id,),
                )
            ]
            ids, matrix = self.indexes["dense"].vectors(sql, user_id, None)
            records = self.records(user_id, status=None)
        return {
            "user_id": user_id,
            "records": records,
            "history": history,
            "turns": turns,
            "windows": windows,
            "vectors": dict(zip(ids, matrix.copy())),
        }

    def load(self, user_id: str, data: dict, replace: bool = False) -> None:
        """Write a `dump` (of either backend) for `user_id` in one transaction, indexes rebuilt for the
        active records; `replace`: the user's rows here are dropped first (else a stored id conflicts)."""
        to_array = self.dialect.to_array
        with self.transaction(), self.dialect.cursor(user_id, write=True) as sql:
            if replace:
                for table in ("records", "record_history", "record_keywords", "turns", "windows"):
                    sql.run(f"DELETE FROM {table} WHERE {{user}}", (user_id,))
                for index in self.indexes.values():
                    index.clear(sql, user_id)
                sql.run(
                    "UPDATE user_stats SET epoch = epoch + 1 WHERE {user}", (user_id,)
                )  # indexes start over
            for record in data["records"]:
                row = {**record, **self._encode(schema.row(record)), "user_id": user_id}
                sql.run(_INSERT_RECORD, [*(row[c] for c in schema.COLUMNS), 0])  # (stamped when indexed)
                if record["status"] == "active":
                    self._index(sql, user_id, record, data["vectors"].get(record["id"]))
            sql.many(
                _INSERT_HISTORY,
                [
                    (
                        user_id,
                        h["record_id"],
                        h["version"],
                        h["action"],
                        self.dialect.to_json(h["snapshot"]),
                        h["at"],
                    )
                    for h in data["history"]
                ],
            )
            sql.many(_INSERT_TURN, [(user_id, *(t[c] for c in _TURN_COLUMNS)) for t in data["turns"]])
            sql.many(
                "INSERT INTO windows (user_id, conversation_id, idx, context, new, done) "
                "VALUES (?,?,?,?,?,?)",
                [
                    (user_id, w["conversation_id"], w["idx"], to_array(w["context"]), to_array(w["new"]))
                    + (self.dialect.to_flag(bool(w["done"])),)
                    for w in data["windows"]
                ],
            )

    # --- the record's stored shape -------------------------------------------------------------------
    def _encode(self, row: dict) -> dict:
        """Contract-shaped columns as the dialect stores them."""
        out = dict(row)
        for name in schema.LIST_FIELDS:
            out[name] = self.dialect.to_array(out[name])
        for name in schema.DAY_SPAN:
            out[name] = self.dialect.to_day(out[name])
        return out

    def _decode(self, row: dict) -> dict:
        """A row of record columns (a search reads hundreds) as records are returned, in place: lists as
        lists, days as ISO text."""
        from_array, from_day = self.dialect.from_array, self.dialect.from_day
        for name in schema.LIST_FIELDS:
            if name in row:
                row[name] = from_array(row[name])
        for name in schema.DAY_SPAN:
            if name in row:
                row[name] = from_day(row[name])
        return row

    def _snapshot_of(self, row: dict) -> dict:
        """A history snapshot in the record's column order (jsonb keeps none)."""
        snapshot = self.dialect.from_json(row["snapshot"])
        return {**{c: snapshot[c] for c in schema.COLUMNS if c in snapshot}, **snapshot}


def _keyword_rows(user_id: str, record: dict) -> list[tuple]:
    """The record's rows of the keyword lookup (its primary key): one per casefolded keyword."""
    keywords = sorted({k.casefold() for k in record["keywords"]})
    return [(user_id, record["type"], k, record["id"]) for k in keywords]


def _session(turn: dict) -> str:
    """A stored turn's session; rows written before sessions were have none: their id's prefix."""
    if turn["session_id"] is not None:
        return turn["session_id"]
    return turn["turn_id"].rsplit(":", 1)[0] if ":" in turn["turn_id"] else "S1"
