"""The embedded memory store (`base.Store`'s SQLite backend): SQLite (WAL) holding records with every
dimension, their version history, the source turns their pointers resolve to, a keyword index for
update candidates and the dense vectors; the lexical path (`lexical`) and the dense path (`dense`) search
in-process indexes the store owns (`LexicalIndex`, `VectorIndex`), kept in step with the file by change
stamps written in the same transactions. Every read and write names one user; none crosses users.

Record lifecycle, held here for every caller: a record is `active` until it is superseded, merged into
another or deleted; only an active record is indexed (keywords, lexical, vector) and only an active record can
be revised or change status. A deleted record can be restored (`restore`, re-indexed, history "RESTORE");
superseded and merged records are history and stay as they are. Anything else raises `RecordStateError`.
The checks read the status inside the caller's write transaction (`BEGIN IMMEDIATE`), so a writer never
revises a record another writer deleted meanwhile.

Conversation turns are written once (`put_turns` inserts, never replaces): records point at them.
A conversation's windows are recorded with the turns (`put_windows`), pending until their records are
stored (`window_done`), so an add that was killed midway is completed by the next add of the conversation.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from dimmem.contract.conversation import Turn
from dimmem.contract.timespan import parse_span
from dimmem.runtime.lexical_index import LexicalIndex
from dimmem.runtime.stores.base import RecordStateError
from dimmem.runtime.vector_index import VectorIndex

__all__ = ["MIGRATIONS", "RecordStateError", "SQLiteStore"]

# Schema migrations, applied in order; PRAGMA user_version records how many have run.
MIGRATIONS = [
    """
    CREATE TABLE records (
        id TEXT NOT NULL, user_id TEXT NOT NULL, conversation_id TEXT, window_id TEXT,
        type TEXT NOT NULL, speaker TEXT NOT NULL, content TEXT NOT NULL, time TEXT, t_start TEXT, t_end TEXT,
        location TEXT, reason TEXT, purpose TEXT, keywords TEXT NOT NULL, source_turns TEXT NOT NULL,
        session_time TEXT, created REAL NOT NULL, updated REAL NOT NULL, version INTEGER NOT NULL,
        status TEXT NOT NULL DEFAULT 'active', PRIMARY KEY (user_id, id));
    CREATE INDEX records_user ON records(user_id, status, type);
    CREATE TABLE record_history (
        record_id TEXT NOT NULL, user_id TEXT NOT NULL, version INTEGER NOT NULL, action TEXT NOT NULL,
        snapshot TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (user_id, record_id, version));
    CREATE TABLE record_keywords (
        record_id TEXT NOT NULL, user_id TEXT NOT NULL, type TEXT NOT NULL, keyword TEXT NOT NULL);
    CREATE INDEX record_keywords_lookup ON record_keywords(user_id, type, keyword);
    CREATE TABLE turns (
        user_id TEXT NOT NULL, conversation_id TEXT NOT NULL, turn_id TEXT NOT NULL,
        position INTEGER NOT NULL, speaker TEXT NOT NULL, role TEXT NOT NULL, text TEXT NOT NULL,
        session_time TEXT,
        PRIMARY KEY (user_id, conversation_id, turn_id));
    CREATE INDEX turns_position ON turns(user_id, conversation_id, position);
    CREATE TABLE vectors (
        record_id TEXT NOT NULL, user_id TEXT NOT NULL, vec BLOB NOT NULL, PRIMARY KEY (user_id, record_id));
    CREATE VIRTUAL TABLE records_fts USING fts5(
        record_id UNINDEXED, user_id UNINDEXED, body, tokenize='porter unicode61');
    """,
    # Per-user change counters (index_state since migration 4), so in-memory vector indexes
    # (dimmem.runtime.vector_index) know when to refresh: appended vectors are loaded incrementally
    # (vectors_user keeps a user's rows in rowid order), any removal triggers a reload. Bumped in the same
    # transaction as the change, by every writer process.
    """
    CREATE TABLE vector_state (
        user_id TEXT PRIMARY KEY, appended INTEGER NOT NULL DEFAULT 0, removed INTEGER NOT NULL DEFAULT 0);
    CREATE INDEX vectors_user ON vectors(user_id);
    """,
    # Appending to a conversation: the session each turn belongs to, and the conversation's windows (the
    # turn ids of their context and new parts), pending until their records are stored.
    """
    ALTER TABLE turns ADD COLUMN session_id TEXT;
    CREATE TABLE windows (
        user_id TEXT NOT NULL, conversation_id TEXT NOT NULL, idx INTEGER NOT NULL, context TEXT NOT NULL,
        new TEXT NOT NULL, done INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (user_id, conversation_id, idx));
    """,
    # The lexical path moves from one FTS5 table over all users (every search read every user's postings,
    # and BM25 statistics mixed users) to the in-process `LexicalIndex`, per user. A record is stamped with
    # its user's next change number (`seq`) whenever it is indexed or unindexed, so the index re-reads only
    # what changed; `epoch` moves when a user is replaced wholesale (`load(replace=True)`). Unindexing a
    # record finds its keyword rows by key (it scanned the table: a store-sized cost per update), and the
    # dimension path's time lookup walks an index of start days instead of all the user's records.
    """
    ALTER TABLE vector_state RENAME TO index_state;
    ALTER TABLE index_state ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE index_state ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE records ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
    UPDATE records SET seq = rowid;
    INSERT INTO index_state (user_id, seq) SELECT user_id, max(rowid) FROM records WHERE true GROUP BY user_id
        ON CONFLICT (user_id) DO UPDATE SET seq = excluded.seq;
    CREATE INDEX records_seq ON records(user_id, seq);
    DROP TABLE records_fts;
    CREATE INDEX record_keywords_record ON record_keywords(user_id, record_id);
    DROP INDEX record_keywords_lookup;
    CREATE INDEX record_keywords_lookup ON record_keywords(user_id, type, keyword, record_id);
    CREATE INDEX records_time ON records(user_id, t_start DESC, id) WHERE status = 'active';
    """,
]

_COLUMNS = (
    "id",
    "user_id",
    "conversation_id",
    "window_id",
    "type",
    "speaker",
    "content",
    "time",
    "t_start",
    "t_end",
    "location",
    "reason",
    "purpose",
    "keywords",
    "source_turns",
    "session_time",
    "created",
    "updated",
    "version",
    "status",
)


class SQLiteStore:
    serialized = True  # one connection: callers serialize their calls (Memory holds a lock around them)

    def __init__(
        self, path: str | Path, timeout: float = 30.0, *, migrate: bool = True, ann_min_records: int = 200_000
    ):
        """The store in the SQLite file `path` (":memory:": in memory); `migrate`: apply pending
        migrations now; `ann_min_records`: where the dense index switches from exact search to HNSW."""
        self.path = self.url = str(path)
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None, timeout=timeout, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        if migrate:
            self.migrate()
        # the dense and lexical paths: each user's vectors and postings in memory, kept in step with the
        # file (`index_state`). The dense index reads the file through a connection of its own (WAL: what
        # is committed, never another thread's open transaction), so a search's dense path needs no
        # caller's lock; an in-memory database has one connection only
        self.concurrent_dense = str(path) != ":memory:"
        self._index_db = self.db
        if self.concurrent_dense:
            self._index_db = sqlite3.connect(
                str(path), isolation_level=None, timeout=timeout, check_same_thread=False
            )
        self.index = VectorIndex(self, ann_min_records=ann_min_records)
        self.lexicon = LexicalIndex(self)

    def migrate(self) -> int:
        """Apply the pending migrations in one transaction; how many were applied (0: the schema was
        current)."""
        with self.transaction():
            version = self.schema_version()
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in filter(str.strip, script.split(";")):
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {number}")
        return len(MIGRATIONS) - version

    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def ping(self) -> bool:
        """The file answers and its schema is this code's (for readiness checks)."""
        try:
            return self.db.execute("SELECT 1").fetchone()[0] == 1 and self.schema_version() == len(MIGRATIONS)
        except sqlite3.Error:
            return False

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: all of it lands or none of it (also when the process is killed midway)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        if self._index_db is not self.db:
            self._index_db.close()
        self.db.close()

    # --- writes (call inside `transaction()`) ------------------------------------------------------
    def put_turns(self, user_id: str, conversation_id: str, turns) -> int:
        """Append the turns not stored yet, after the stored ones; a stored turn is never rewritten: the
        same id with another role or text raises ValueError. Returns how many were added."""
        stored = {
            r[0]: (r[1], r[2])
            for r in self.db.execute(
                "SELECT turn_id, role, text FROM turns WHERE user_id=? AND conversation_id=?",
                (user_id, conversation_id),
            )
        }
        rows, position = [], self.turn_count(user_id, conversation_id)
        for t in turns:
            if t.id in stored:
                if stored[t.id] != (t.role, t.text):
                    raise ValueError(
                        f"conversation {conversation_id!r}: turn {t.id!r} is stored with other text; "
                        "stored turns are never rewritten (records point at them): give the new turn a new id"
                    )
                continue
            stored[t.id] = (t.role, t.text)
            rows.append(
                (
                    user_id,
                    conversation_id,
                    t.id,
                    position,
                    t.speaker,
                    t.role,
                    t.text,
                    t.session_time,
                    t.session_id,
                )
            )
            position += 1
        self.db.executemany(
            "INSERT INTO turns (user_id, conversation_id, turn_id, position, speaker, role, text, "
            "session_time, session_id) VALUES (?,?,?,?,?,?,?,?,?)",
            rows,
        )
        return len(rows)

    def put_windows(self, user_id: str, windows) -> None:
        """Record a conversation's new windows as pending (`window_done` when their records are stored)."""
        self.db.executemany(
            "INSERT INTO windows (user_id, conversation_id, idx, context, new) VALUES (?,?,?,?,?)",
            [
                (
                    user_id,
                    w.conversation_id,
                    w.index,
                    json.dumps([t.id for t in w.context]),
                    json.dumps([t.id for t in w.new]),
                )
                for w in windows
            ],
        )

    def window_done(self, user_id: str, conversation_id: str, indexes: list[int]) -> None:
        self.db.executemany(
            "UPDATE windows SET done=1 WHERE user_id=? AND conversation_id=? AND idx=?",
            [(user_id, conversation_id, i) for i in indexes],
        )

    def insert(self, user_id: str, record: dict, vector: np.ndarray, action: str = "ADD") -> None:
        now = time.time()
        row = {
            **_row(record),
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
        self.db.execute(
            f"INSERT INTO records ({','.join(_COLUMNS)}) VALUES ({','.join('?' * len(_COLUMNS))})",
            [row[c] for c in _COLUMNS],
        )
        self._index(user_id, record["id"], record, vector)
        self._snapshot(user_id, record["id"], 1, action, now)

    def revise(self, user_id: str, record_id: str, fields: dict, vector: np.ndarray, action: str) -> int:
        """New version of an active record; the old one stays in its history."""
        current = self._current(user_id, record_id, "revised")
        merged = {**current, **fields}
        row, version, now = _row(merged), current["version"] + 1, time.time()
        sets = ",".join(f"{c}=?" for c in row)
        self.db.execute(
            f"UPDATE records SET {sets}, version=?, updated=? WHERE id=? AND user_id=?",
            [*row.values(), version, now, record_id, user_id],
        )
        self._unindex(user_id, record_id)
        self._index(user_id, record_id, merged, vector)
        self._snapshot(user_id, record_id, version, action, now)
        return version

    def set_status(self, user_id: str, record_id: str, status: str, action: str) -> None:
        """An active record becomes superseded, merged or deleted: out of every index."""
        if status not in ("superseded", "merged", "deleted"):
            raise ValueError(f"status {status!r}: expected superseded, merged or deleted")
        current = self._current(user_id, record_id, status)
        now = time.time()
        self.db.execute(
            "UPDATE records SET status=?, version=version+1, updated=? WHERE id=? AND user_id=?",
            (status, now, record_id, user_id),
        )
        self._unindex(user_id, record_id)  # only active records are found
        self._snapshot(user_id, record_id, current["version"] + 1, action, now)

    def restore(self, user_id: str, record_id: str, vector: np.ndarray) -> int:
        """A deleted record active again, re-indexed (`vector`: its content's embedding)."""
        current = self.get(user_id, record_id)
        if current is None:
            raise KeyError(f"no record {record_id!r} for user {user_id!r}")
        if current["status"] != "deleted":
            raise RecordStateError(record_id, current["status"], "restored", "deleted")
        version, now = current["version"] + 1, time.time()
        self.db.execute(
            "UPDATE records SET status='active', version=?, updated=? WHERE id=? AND user_id=?",
            (version, now, record_id, user_id),
        )
        self._index(user_id, record_id, current, vector)
        self._snapshot(user_id, record_id, version, "RESTORE", now)
        return version

    def _current(self, user_id: str, record_id: str, operation: str) -> dict:
        """The record, which must exist (KeyError) and be active (RecordStateError)."""
        current = self.get(user_id, record_id)
        if current is None:
            raise KeyError(f"no record {record_id!r} for user {user_id!r}")
        if current["status"] != "active":
            raise RecordStateError(record_id, current["status"], operation)
        return current

    def _index(self, user_id: str, record_id: str, record: dict, vector: np.ndarray) -> None:
        self.db.executemany(
            "INSERT INTO record_keywords VALUES (?,?,?,?)",
            [(record_id, user_id, record["type"], k.casefold()) for k in set(record["keywords"])],
        )
        if vector is not None:  # (a copied record without a vector: found by the other paths only)
            self.db.execute(
                "INSERT INTO vectors VALUES (?,?,?)",
                (record_id, user_id, np.asarray(vector, dtype=np.float32).tobytes()),
            )
        self._stamp(user_id, record_id, appended=int(vector is not None), removed=0)

    def _unindex(self, user_id: str, record_id: str) -> None:
        for table in ("record_keywords", "vectors"):
            self.db.execute(f"DELETE FROM {table} WHERE record_id=? AND user_id=?", (record_id, user_id))
        self._stamp(user_id, record_id, appended=0, removed=1)

    def _stamp(self, user_id: str, record_id: str, appended: int, removed: int) -> None:
        """Count the change for the in-process indexes: vectors appended or removed, and the record's
        next change number."""
        (seq,) = self.db.execute(
            "INSERT INTO index_state (user_id, appended, removed, seq) VALUES (?,?,?,1) "
            "ON CONFLICT(user_id) DO UPDATE SET appended = appended + excluded.appended, "
            "removed = removed + excluded.removed, seq = seq + 1 RETURNING seq",
            (user_id, appended, removed),
        ).fetchone()
        self.db.execute("UPDATE records SET seq=? WHERE user_id=? AND id=?", (seq, user_id, record_id))

    def _snapshot(self, user_id: str, record_id: str, version: int, action: str, at: float) -> None:
        snapshot = json.dumps(self.get(user_id, record_id), ensure_ascii=False)
        self.db.execute(
            "INSERT INTO record_history VALUES (?,?,?,?,?,?)",
            (record_id, user_id, version, action, snapshot, at),
        )

    # --- reads -------------------------------------------------------------------------------------
    def get(self, user_id: str, record_id: str) -> dict | None:
        row = self.db.execute(
            "SELECT * FROM records WHERE id=? AND user_id=?", (record_id, user_id)
        ).fetchone()
        return _record(row) if row else None

    def get_many(self, user_id: str, record_ids: list[str]) -> dict[str, dict]:
        """{id: record} for those of the ids the user has."""
        out = {}
        for start in range(0, len(record_ids), 500):  # stay under SQLite's bound-parameter limit
            chunk = record_ids[start : start + 500]
            rows = self.db.execute(
                f"SELECT * FROM records WHERE user_id=? AND id IN ({','.join('?' * len(chunk))})",
                (user_id, *chunk),
            )
            out.update((r["id"], _record(r)) for r in rows)
        return out

    def turns(self, user_id: str, conversation_id: str) -> list[Turn]:
        """The conversation's stored turns, in order."""
        rows = self.db.execute(
            "SELECT turn_id, speaker, role, text, session_id, session_time FROM turns "
            "WHERE user_id=? AND conversation_id=? ORDER BY position",
            (user_id, conversation_id),
        )
        return [
            Turn(r[0], r[1], r[2], r[3], r[4] if r[4] is not None else _session_of(r[0]), r[5]) for r in rows
        ]

    def turn_count(self, user_id: str, conversation_id: str) -> int:
        return self.db.execute(
            "SELECT COUNT(*) FROM turns WHERE user_id=? AND conversation_id=?", (user_id, conversation_id)
        ).fetchone()[0]

    def next_window_index(self, user_id: str, conversation_id: str) -> int:
        """The index the conversation's next window gets: after every recorded window and after every
        window its records name (conversations stored before windows were recorded)."""
        (last,) = self.db.execute(
            "SELECT MAX(idx) FROM windows WHERE user_id=? AND conversation_id=?", (user_id, conversation_id)
        ).fetchone()
        named = self.db.execute(
            "SELECT DISTINCT window_id FROM records WHERE user_id=? AND conversation_id=?",
            (user_id, conversation_id),
        )
        indexes = [int(m.group(1)) for (w,) in named if w and (m := re.search(r"/w(\d+)$", w))]
        return max([-1 if last is None else last, *indexes]) + 1

    def pending_windows(self, user_id: str, conversation_id: str) -> list[tuple[int, list[str], list[str]]]:
        """(index, context turn ids, new turn ids) of the conversation's windows whose records are not all
        stored yet, in order."""
        rows = self.db.execute(
            "SELECT idx, context, new FROM windows WHERE user_id=? AND conversation_id=? AND done=0 "
            "ORDER BY idx",
            (user_id, conversation_id),
        )
        return [(i, json.loads(c), json.loads(n)) for i, c, n in rows]

    def has_turns(self, user_id: str) -> bool:
        """Whether any conversation turns are stored for the user."""
        return (
            self.db.execute("SELECT 1 FROM turns WHERE user_id=? LIMIT 1", (user_id,)).fetchone() is not None
        )

    def count(self, user_id: str) -> int:
        return self.db.execute(
            "SELECT COUNT(*) FROM records WHERE user_id=? AND status='active'", (user_id,)
        ).fetchone()[0]

    def records(self, user_id: str, status: str | None = "active") -> list[dict]:
        query = (
            "SELECT * FROM records WHERE user_id=?"
            + (" AND status=?" if status else "")
            + " ORDER BY created, id"
        )
        return [_record(r) for r in self.db.execute(query, (user_id, status) if status else (user_id,))]

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
        """The user's records ordered by (created, id), those after the keyset `after` (a previous page's
        last (created, id)), filtered by type, status (None: any), conversation and time overlapping the
        day span [start, end] (records without a time never overlap)."""
        where, params = ["user_id=?"], [user_id]
        for column, value in (("type", type), ("status", status), ("conversation_id", conversation_id)):
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if span is not None:
            where.append("t_start<=? AND t_end>=?")
            params += [span[1], span[0]]
        if after is not None:
            where.append("(created>? OR (created=? AND id>?))")
            params += [after[0], after[0], after[1]]
        rows = self.db.execute(
            f"SELECT * FROM records WHERE {' AND '.join(where)} ORDER BY created, id LIMIT ?",
            (*params, limit),
        )
        return [_record(r) for r in rows]

    def history(self, user_id: str, record_id: str) -> list[dict]:
        rows = self.db.execute(
            "SELECT version, action, snapshot, at FROM record_history WHERE record_id=? AND user_id=? "
            "ORDER BY version",
            (record_id, user_id),
        )
        return [{"version": v, "action": a, "at": at, "record": json.loads(s)} for v, a, s, at in rows]

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
        arm = (
            "SELECT * FROM (SELECT record_id FROM record_keywords INDEXED BY record_keywords_lookup "
            "WHERE user_id=? AND type=? AND keyword=? ORDER BY record_id LIMIT ?)"
        )
        pairs = [(t, key) for t in types for key in keys]
        rows = self.db.execute(
            f"SELECT record_id, COUNT(*) AS shared FROM ({' UNION ALL '.join([arm] * len(pairs))}) "
            "GROUP BY record_id ORDER BY shared DESC, record_id LIMIT ?",
            (*(p for t, key in pairs for p in (user_id, t, key, limit)), limit),
        )
        return [r[0] for r in rows]

    def lexical(self, user_id: str, query: str, k: int) -> list[tuple[str, float]]:
        """BM25 over content, keywords and dimensions of the user's active records, by the user's own
        statistics (the in-process `LexicalIndex`); higher is better."""
        return self.lexicon.search(user_id, query, k)

    def lexical_stamp(self, user_id: str) -> tuple[int, int]:
        """(epoch, seq): the user's last change to what the lexical index holds."""
        row = self.db.execute("SELECT epoch, seq FROM index_state WHERE user_id=?", (user_id,)).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    def lexical_changes(self, user_id: str, after: int) -> list[dict]:
        """The records whose index state changed after change number `after` (0: the active records), in
        change order: id, status and the indexed fields."""
        rows = self.db.execute(
            "SELECT id, status, content, keywords, location, reason, purpose FROM records "
            "WHERE user_id=? AND seq>? AND (status='active' OR ?>0) ORDER BY seq",
            (user_id, after, after),
        )
        return [{**dict(r), "keywords": json.loads(r["keywords"])} for r in rows]

    def records_in_span(self, user_id: str, start: str, end: str, limit: int = -1) -> list[str]:
        """Active records whose time overlaps the day span [start, end], the latest-starting first: those
        starting inside it, then of those starting before it the `limit` latest-starting that still
        run into it (so a lookup reads at most twice `limit` index entries; -1: all)."""
        rows = self.db.execute(
            "SELECT id FROM ("
            "SELECT * FROM (SELECT id, t_start FROM records WHERE user_id=:user AND status='active' "
            "AND t_start BETWEEN :start AND :end ORDER BY t_start DESC, id LIMIT :limit) "
            "UNION ALL SELECT id, t_start FROM (SELECT id, t_start, t_end FROM records "
            "WHERE user_id=:user AND status='active' AND t_start < :start ORDER BY t_start DESC, id "
            "LIMIT :limit) WHERE t_end >= :start"
            ") ORDER BY t_start DESC, id LIMIT :limit",
            {"user": user_id, "start": start, "end": end, "limit": limit},
        )
        return [r[0] for r in rows]

    def vectors(self, user_id: str, record_ids: list[str]) -> tuple[list[str], np.ndarray]:
        """Vectors of the given active records of the user."""
        marks = ",".join("?" * len(record_ids))
        rows = self.db.execute(
            f"SELECT record_id, vec FROM vectors WHERE user_id=? AND record_id IN ({marks}) "
            "ORDER BY record_id",
            (user_id, *record_ids),
        ).fetchall()
        return [r[0] for r in rows], _matrix(rows, 1)

    def dense(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The `k` active records nearest by cosine (the in-process index), best first."""
        if k <= 0:
            return []
        return self.index.search(user_id, np.asarray(vector, dtype=np.float32), k)

    def vector_state(self, user_id: str) -> tuple[int, int]:
        """(vectors appended, vectors removed) so far for the user: a change stamp for in-memory indexes."""
        row = self._index_db.execute(
            "SELECT appended, removed FROM index_state WHERE user_id=?", (user_id,)
        ).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    def vectors_after(self, user_id: str, rowid: int) -> tuple[list[int], list[str], np.ndarray]:
        """The user's vectors stored after `rowid` (0: all), in storage order: (rowids, record ids,
        matrix)."""
        rows = self._index_db.execute(
            "SELECT rowid, record_id, vec FROM vectors WHERE user_id=? AND rowid>? ORDER BY rowid",
            (user_id, rowid),
        ).fetchall()
        return [r[0] for r in rows], [r[1] for r in rows], _matrix(rows, 2)

    def assistant_replies(self, user_id: str, conversation_id: str, turn_ids: list[str]) -> list[dict]:
        """The assistant turns answering the given turns: each up to the next user turn (the pointer's
        payoff)."""
        marks = ",".join("?" * len(turn_ids))
        positions = [
            r[0]
            for r in self.db.execute(
                f"SELECT position FROM turns WHERE user_id=? AND conversation_id=? AND turn_id IN ({marks})",
                (user_id, conversation_id, *turn_ids),
            )
        ]
        if not positions:
            return []
        rows = self.db.execute(
            "SELECT turn_id, speaker, role, text, session_time FROM turns WHERE user_id=? AND "
            "conversation_id=? AND position BETWEEN ? AND ? ORDER BY position",
            (user_id, conversation_id, min(positions), max(positions) + 2),
        ).fetchall()
        return [dict(r) for r in rows if r["role"] == "assistant"]

    # --- moving a store (`dimmem memory migrate --from --to`) -----------------------------------------
    def users(self) -> list[str]:
        """Every user with records, turns or windows, sorted."""
        rows = self.db.execute(
            "SELECT user_id FROM records UNION SELECT user_id FROM turns UNION SELECT user_id FROM windows "
            "ORDER BY 1"
        )
        return [r[0] for r in rows]

    def dump(self, user_id: str) -> dict:
        """Everything of one user as raw rows (every status, history, turns, windows, the active records'
        vectors): what `load` writes back, losslessly, into either backend."""
        db = self.db
        history = [
            {"record_id": r[0], "version": r[1], "action": r[2], "snapshot": json.loads(r[3]), "at": r[4]}
            for r in db.execute(
                "SELECT record_id, version, action, snapshot, at FROM record_history WHERE user_id=? "
                "ORDER BY record_id, version",
                (user_id,),
            )
        ]
        turns = [
            dict(r)
            for r in db.execute(
                "SELECT conversation_id, turn_id, position, speaker, role, text, session_time, session_id "
                "FROM turns WHERE user_id=? ORDER BY conversation_id, position",
                (user_id,),
            )
        ]
        windows = [
            {"conversation_id": c, "idx": i, "context": json.loads(x), "new": json.loads(n), "done": bool(d)}
            for c, i, x, n, d in db.execute(
                "SELECT conversation_id, idx, context, new, done FROM windows WHERE user_id=? "
                "ORDER BY conversation_id, idx",
                (user_id,),
            )
        ]
        rows = db.execute("SELECT record_id, vec FROM vectors WHERE user_id=?", (user_id,)).fetchall()
        vectors = {r[0]: np.frombuffer(r[1], dtype=np.float32).copy() for r in rows}
        return {
            "user_id": user_id,
            "records": self.records(user_id, status=None),
            "history": history,
            "turns": turns,
            "windows": windows,
            "vectors": vectors,
        }

    def load(self, user_id: str, data: dict, replace: bool = False) -> None:
        """Write a `dump` (of either backend) for `user_id` in one transaction, indexes rebuilt for the
        active records; `replace`: the user's rows here are dropped first (else a stored id conflicts)."""
        with self.transaction():
            if replace:
                for table in ("records", "record_history", "record_keywords", "turns", "vectors", "windows"):
                    self.db.execute(f"DELETE FROM {table} WHERE user_id=?", (user_id,))
                self.db.execute(  # every in-process index starts the user over
                    "UPDATE index_state SET removed = removed + 1, epoch = epoch + 1 WHERE user_id=?",
                    (user_id,),
                )
            for record in data["records"]:
                row = {**record, "user_id": user_id}
                row["keywords"] = json.dumps(record["keywords"], ensure_ascii=False)
                row["source_turns"] = json.dumps(record["source_turns"], ensure_ascii=False)
                self.db.execute(
                    f"INSERT INTO records ({','.join(_COLUMNS)}) VALUES ({','.join('?' * len(_COLUMNS))})",
                    [row[c] for c in _COLUMNS],
                )
                if record["status"] == "active":
                    self._index(user_id, record["id"], record, data["vectors"].get(record["id"]))
            self.db.executemany(
                "INSERT INTO record_history VALUES (?,?,?,?,?,?)",
                [
                    (
                        h["record_id"],
                        user_id,
                        h["version"],
                        h["action"],
                        json.dumps(h["snapshot"], ensure_ascii=False),
                        h["at"],
                    )
                    for h in data["history"]
                ],
            )
            self.db.executemany(
                "INSERT INTO turns (user_id, conversation_id, turn_id, position, speaker, role, text, "
                "session_time, session_id) VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    (user_id, t["conversation_id"], t["turn_id"], t["position"], t["speaker"], t["role"])
                    + (t["text"], t["session_time"], t["session_id"])
                    for t in data["turns"]
                ],
            )
            self.db.executemany(
                "INSERT INTO windows (user_id, conversation_id, idx, context, new, done) "
                "VALUES (?,?,?,?,?,?)",
                [
                    (user_id, w["conversation_id"], w["idx"], json.dumps(w["context"]), json.dumps(w["new"]))
                    + (int(w["done"]),)
                    for w in data["windows"]
                ],
            )


def _session_of(turn_id: str) -> str:
    """A turn's session when none was stored (rows written before sessions were): its id's prefix."""
    return turn_id.rsplit(":", 1)[0] if ":" in turn_id else "S1"


def _matrix(rows: list, column: int) -> np.ndarray:
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    return np.frombuffer(b"".join(r[column] for r in rows), dtype=np.float32).reshape(len(rows), -1)


def _row(record: dict) -> dict:
    """The stored columns of a record's DimMem fields (time also as a day span for interval queries)."""
    span = parse_span(record["time"]) if record.get("time") else None
    return {
        "type": record["type"],
        "speaker": record["speaker"],
        "content": record["content"],
        "time": record.get("time"),
        "t_start": span[0].isoformat() if span else None,
        "t_end": span[1].isoformat() if span else None,
        "location": record.get("location"),
        "reason": record.get("reason"),
        "purpose": record.get("purpose"),
        "keywords": json.dumps(record["keywords"], ensure_ascii=False),
        "source_turns": json.dumps(record["source_turns"], ensure_ascii=False),
    }


def _record(row: sqlite3.Row) -> dict:
    out = {c: row[c] for c in _COLUMNS}  # (not `seq`, the index's bookkeeping)
    out["keywords"], out["source_turns"] = json.loads(out["keywords"]), json.loads(out["source_turns"])
    return out
