"""The memory store on Postgres + pgvector (`base.Store`'s second backend), for everything beyond one
process: the same methods, return shapes and lifecycle rules as the embedded SQLite store
(`stores.sqlite.SQLiteStore`), over a connection pool that many threads, processes and machines share
(`serialized = False`: callers need no lock of their own).

    store = PostgresStore("postgresql://app@db/dimmem", tenant="acme")   # tenant=None: from user ids
    with store.transaction():
        store.insert("ann", record, vector)
    store.dense("ann", vector, 10), store.lexical("ann", "hiking Paris", 10)

What differs from SQLite, on purpose:
- dense search runs in the database (`dense`: pgvector HNSW, cosine), so no process keeps a copy
  of the vectors and there is no `vector_state` / `vectors_after` to keep one in step;
- the lexical path is the same in-process per-user index as SQLite's (`LexicalIndex`): each process
  re-reads the records a user changed since its last search, by the change number every write stamps
  (`user_stats.seq`), so all processes and machines search what has committed;
- SQLite's `BEGIN IMMEDIATE` (one writer per file) becomes one writer per user: the first call for a
  user inside `transaction()` locks that user's `user_stats` row until commit, so what a block reads of
  the user no other writer changes before it commits;
- every table carries `tenant`, and row-level security confines each transaction to its tenant
  (`dimmem.tenant`). A store has one tenant, or (tenant=None) takes it from each user id's namespace,
  `<tenant>/<user>` as the HTTP service names users (`default` for a bare user id). The runtime should
  connect as a login role in `dimmem_runtime` (no superuser: superusers pass RLS); migrations run as the
  schema owner (`PostgresStore(owner_url).migrate()`), and the runtime's own start applies nothing when
  the schema is current.

Transactions: `transaction()` holds one pooled connection for the calling thread until the block ends,
and every call inside it (any thread-local call of this store) runs on it; a call outside a block is a
transaction of its own. A killed writer leaves nothing of its open transaction.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources

import numpy as np
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from dimmem.contract.conversation import Turn
from dimmem.contract.timespan import parse_span
from dimmem.runtime.lexical_index import LexicalIndex
from dimmem.runtime.stores.base import RecordStateError

__all__ = ["DIMENSIONS", "PostgresStore", "RecordStateError", "SchemaError", "migrations"]

log = logging.getLogger(__name__)


@contextmanager
def _refused_values() -> Iterator[None]:
    """A value PostgreSQL cannot store (a NUL character in text, a malformed encoding) is the caller's
    input, not a server fault: a ValueError (422 over HTTP), and the transaction rolls back."""
    try:
        yield
    except psycopg.DataError as exc:
        raise ValueError(f"PostgreSQL refused a value: {str(exc).splitlines()[0]}") from None


DEFAULT_TENANT = "default"
DIMENSIONS = 384  # the embedding column (all-MiniLM-L6-v2); another embedder needs a migration
MIGRATION_LOCK = 0x64696D6D656D  # pg_advisory_lock key: two processes starting together take turns
# Every query names the transaction's tenant too (row-level security alone would also confine it, but
# not a superuser's connection, and the tenant leads every index)
_T = "tenant = current_setting('dimmem.tenant')"
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")

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
_SELECT = ", ".join(f'"{c}"' for c in _COLUMNS)


class SchemaError(RuntimeError):
    """The database schema is behind this code and this connection may not migrate it."""


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, SQL) of every migration shipped, in order."""
    folder = resources.files("dimmem.runtime.stores") / "pg_migrations"
    found = []
    for entry in folder.iterdir():
        if match := _MIGRATION.match(entry.name):
            found.append((int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort()
    if [v for v, _, _ in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(
            f"pg_migrations: versions must run 1..n without gaps, got {[v for v, _, _ in found]}"
        )
    return found


class PostgresStore:
    serialized = False  # a pool: any thread may call at any time
    concurrent_dense = True

    def __init__(
        self,
        url: str,
        *,
        tenant: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        migrate: bool = True,
    ):
        """A pool of connections to `url` (postgresql://...). `migrate`: apply pending migrations now (a
        no-op, allowed to the runtime role, when the schema is current)."""
        if tenant is not None and not tenant:
            raise ValueError("tenant: a non-empty name, or None to take it from each user id")
        self.url, self.tenant = url, tenant
        self._local = threading.local()
        if migrate:
            self.migrate()
        self.pool = ConnectionPool(
            url,
            min_size=pool_min,
            max_size=pool_max,
            kwargs={"autocommit": True, "row_factory": dict_row},
            check=ConnectionPool.check_connection,
            name="dimmem",
            open=True,
        )
        with self.pool.connection() as conn:
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
            role = conn.execute(
                "SELECT rolname AS name, rolsuper OR rolbypassrls AS bypass FROM pg_roles "
                "WHERE rolname = current_user"
            ).fetchone()
        # superusers and BYPASSRLS roles pass row-level security: the store's own tenant filter still holds,
        # but a query that forgets it would not be caught; the runtime should use a dimmem_runtime role
        self.rls_enforced = not role["bypass"]
        if not self.rls_enforced:
            log.warning(
                "dimmem: role %s bypasses row-level security; run the runtime as a login role in "
                "dimmem_runtime",
                role["name"],
            )
        version = tuple(int(p) for p in re.findall(r"\d+", row["extversion"] if row else "0")[:2])
        self._iterative_scan = version >= (0, 8)  # complete filtered HNSW results (pgvector >= 0.8)
        self.lexicon = LexicalIndex(self)

    # --- schema --------------------------------------------------------------------------------------
    def migrate(self) -> int:
        """Apply the pending migrations in order, each in its own transaction, under an advisory lock;
        returns how many were applied (0: the schema was current)."""
        shipped, done, step = migrations(), set(), "0000_schema_migrations"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            try:
                if conn.execute("SELECT to_regclass('schema_migrations')").fetchone()[0] is None:
                    conn.execute(
                        "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                        "applied_at timestamptz NOT NULL DEFAULT now())"
                    )
                done = {v for (v,) in conn.execute("SELECT version FROM schema_migrations")}
                pending = [m for m in shipped if m[0] not in done]
                for version, name, sql in pending:
                    step = f"{version:04d}_{name}"
                    with conn.transaction():
                        conn.execute(sql)
                        conn.execute(
                            "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name)
                        )
                return len(pending)
            except psycopg.errors.InsufficientPrivilege as err:
                raise SchemaError(
                    f"schema at version {max(done, default=0)} of {len(shipped)}, and this role may not "
                    f"apply {step}: run `dimmem memory migrate` as the schema owner ({err})"
                ) from err
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))

    def schema_version(self) -> int:
        with self.pool.connection() as conn:
            return conn.execute("SELECT coalesce(max(version), 0) AS v FROM schema_migrations").fetchone()[
                "v"
            ]

    def ping(self) -> bool:
        """The database answers and its schema is this code's (for readiness checks)."""
        try:
            with self.pool.connection() as conn:
                conn.execute("SELECT 1")
            return self.schema_version() == len(migrations())
        except psycopg.Error:
            return False

    # --- connections and transactions --------------------------------------------------------------
    def tenant_of(self, user_id: str) -> str:
        if self.tenant is not None:
            return self.tenant
        namespace, slash, _ = user_id.partition("/")
        return namespace if slash and namespace else DEFAULT_TENANT

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """One atomic write: all of it lands or none of it (also when the process is killed midway). The
        tenant is set by the first call inside; a block that names users of two tenants is refused."""
        tx = getattr(self._local, "tx", None)
        if tx is not None:  # nested: a savepoint on the same connection
            with tx["conn"].transaction():
                yield tx["conn"]
            return
        with _refused_values(), self.pool.connection() as conn, conn.transaction():
            self._local.tx = {"conn": conn, "tenant": None, "users": set()}
            try:
                yield conn
            finally:
                self._local.tx = None

    @contextmanager
    def _cursor(self, user_id: str) -> Iterator[psycopg.Cursor]:
        """A cursor in the current transaction (or a new one) whose tenant is the user's."""
        tenant = self.tenant_of(user_id)
        tx = getattr(self._local, "tx", None)
        if tx is not None:
            if tx["tenant"] is None:
                tx["conn"].execute("SELECT set_config('dimmem.tenant', %s, true)", (tenant,))
                tx["tenant"] = tenant
            elif tx["tenant"] != tenant:
                raise ValueError(f"one transaction, one tenant: {tx['tenant']!r}, then {tenant!r}")
            with tx["conn"].cursor() as cur:
                if user_id not in tx["users"]:  # the block's first call for the user: one writer per user
                    self._lock_user(cur, user_id)
                    tx["users"].add(user_id)
                yield cur
            return
        with _refused_values(), self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT set_config('dimmem.tenant', %s, true)", (tenant,))
            yield cur

    def close(self) -> None:
        self.pool.close()

    # --- writes (call inside `transaction()`) ------------------------------------------------------
    def put_turns(self, user_id: str, conversation_id: str, turns) -> int:
        """Append the turns not stored yet, after the stored ones; a stored turn is never rewritten: the
        same id with another role or text raises ValueError. Returns how many were added."""
        with self._cursor(user_id) as cur:
            self._lock_user(cur, user_id)
            cur.execute(
                f"SELECT turn_id, role, text FROM turns WHERE {_T} AND user_id=%s AND conversation_id=%s",
                (user_id, conversation_id),
            )
            stored = {r["turn_id"]: (r["role"], r["text"]) for r in cur.fetchall()}
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
            if rows:
                cur.executemany(
                    "INSERT INTO turns (user_id, conversation_id, turn_id, position, speaker, role, text, "
                    "session_time, session_id) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    rows,
                )
            return len(rows)

    def put_windows(self, user_id: str, windows) -> None:
        """Record a conversation's new windows as pending (`window_done` when their records are stored)."""
        rows = [
            (user_id, w.conversation_id, w.index, [t.id for t in w.context], [t.id for t in w.new])
            for w in windows
        ]
        if rows:
            with self._cursor(user_id) as cur:
                cur.executemany(
                    "INSERT INTO windows (user_id, conversation_id, idx, context, new) "
                    "VALUES (%s,%s,%s,%s,%s)",
                    rows,
                )

    def window_done(self, user_id: str, conversation_id: str, indexes: list[int]) -> None:
        if indexes:
            with self._cursor(user_id) as cur:
                cur.execute(
                    f"UPDATE windows SET done = true WHERE {_T} AND user_id=%s AND conversation_id=%s "
                    "AND idx = ANY(%s)",
                    (user_id, conversation_id, list(indexes)),
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
            "embedding": _vector(vector),
        }
        with self._cursor(user_id) as cur:
            self._lock_user(cur, user_id)
            cur.execute(
                f"INSERT INTO records ({_SELECT}, embedding) "
                f"VALUES ({', '.join(['%s'] * len(_COLUMNS))}, %s::vector)",
                [row[c] for c in (*_COLUMNS, "embedding")],
            )
            self._index(cur, user_id, record["id"], record)
            self._snapshot(cur, user_id, record["id"], 1, action, now)

    def revise(
        self, user_id: str, record_id: str, fields: dict, vector: np.ndarray | None, action: str
    ) -> int:
        """New version of an active record; the old one stays in its history. Without a `vector` the
        stored one is kept when the content is unchanged, else dropped (a stale vector would mislead)."""
        with self._cursor(user_id) as cur:
            self._lock_user(cur, user_id)
            current = self._lock_active(cur, user_id, record_id, "revised")
            merged = {**current, **fields}
            row, version, now = _row(merged), current["version"] + 1, time.time()
            if vector is not None:
                embedding, keep = _vector(vector), False
            else:
                embedding, keep = None, merged["content"] == current["content"]
            sets = ", ".join(f'"{c}"=%s' for c in row)
            cur.execute(
                f"UPDATE records SET {sets}, version=%s, updated=%s, "
                "embedding = CASE WHEN %s THEN embedding ELSE %s::vector END "
                f"WHERE {_T} AND user_id=%s AND id=%s",
                [*row.values(), version, now, keep, embedding, user_id, record_id],
            )
            self._unindex(cur, user_id, record_id)
            self._index(cur, user_id, record_id, merged)
            self._snapshot(cur, user_id, record_id, version, action, now)
        return version

    def set_status(self, user_id: str, record_id: str, status: str, action: str) -> None:
        """An active record becomes superseded, merged or deleted: out of every index."""
        if status not in ("superseded", "merged", "deleted"):
            raise ValueError(f"status {status!r}: expected superseded, merged or deleted")
        with self._cursor(user_id) as cur:
            self._lock_user(cur, user_id)
            current = self._lock_active(cur, user_id, record_id, status)
            now = time.time()
            cur.execute(
                "UPDATE records SET status=%s, version=version+1, updated=%s, embedding = NULL "
                f"WHERE {_T} AND user_id=%s AND id=%s",
                (status, now, user_id, record_id),
            )
            self._unindex(cur, user_id, record_id)  # only active records are found
            self._snapshot(cur, user_id, record_id, current["version"] + 1, action, now)

    def restore(self, user_id: str, record_id: str, vector: np.ndarray) -> int:
        """A deleted record active again, re-indexed (`vector`: its content's embedding)."""
        with self._cursor(user_id) as cur:
            self._lock_user(cur, user_id)
            current = self._lock_row(cur, user_id, record_id)
            if current["status"] != "deleted":
                raise RecordStateError(record_id, current["status"], "restored", "deleted")
            version, now = current["version"] + 1, time.time()
            cur.execute(
                "UPDATE records SET status='active', version=%s, updated=%s, embedding=%s::vector "
                f"WHERE {_T} AND user_id=%s AND id=%s",
                (version, now, _vector(vector), user_id, record_id),
            )
            self._index(cur, user_id, record_id, current)
            self._snapshot(cur, user_id, record_id, version, "RESTORE", now)
        return version

    def _lock_user(self, cur: psycopg.Cursor, user_id: str) -> None:
        """Every write of a user's records starts here: the user's stats row, locked until commit, orders
        concurrent writers of one user (no deadlock between their record locks)."""
        cur.execute(
            "INSERT INTO user_stats (user_id) VALUES (%s) "
            "ON CONFLICT (tenant, user_id) DO UPDATE SET seq = user_stats.seq",
            (user_id,),
        )

    def _lock_row(self, cur: psycopg.Cursor, user_id: str, record_id: str) -> dict:
        """The record, locked until commit, which must exist (KeyError)."""
        cur.execute(
            f"SELECT {_SELECT} FROM records WHERE {_T} AND user_id=%s AND id=%s FOR UPDATE",
            (user_id, record_id),
        )
        row = cur.fetchone()
        if row is None:
            raise KeyError(f"no record {record_id!r} for user {user_id!r}")
        return _record(row)

    def _lock_active(self, cur: psycopg.Cursor, user_id: str, record_id: str, operation: str) -> dict:
        """The record, locked, which must exist (KeyError) and be active (RecordStateError)."""
        current = self._lock_row(cur, user_id, record_id)
        if current["status"] != "active":
            raise RecordStateError(record_id, current["status"], operation)
        return current

    def _index(self, cur: psycopg.Cursor, user_id: str, record_id: str, record: dict) -> None:
        keys = sorted({k.casefold() for k in record["keywords"]})
        if keys:
            cur.executemany(
                "INSERT INTO record_keywords (user_id, type, keyword, record_id) VALUES (%s,%s,%s,%s)",
                [(user_id, record["type"], k, record_id) for k in keys],
            )
        self._stamp(cur, user_id, record_id)

    def _unindex(self, cur: psycopg.Cursor, user_id: str, record_id: str) -> None:
        cur.execute(
            f"DELETE FROM record_keywords WHERE {_T} AND user_id=%s AND record_id=%s",
            (user_id, record_id),
        )
        self._stamp(cur, user_id, record_id)

    def _stamp(self, cur: psycopg.Cursor, user_id: str, record_id: str) -> None:
        """The record gets the user's next change number: every process's lexical index re-reads it."""
        cur.execute(
            f"WITH s AS (UPDATE user_stats SET seq = seq + 1 WHERE {_T} AND user_id=%(user)s RETURNING seq) "
            f"UPDATE records SET seq = s.seq FROM s WHERE records.{_T} AND user_id=%(user)s AND id=%(id)s",
            {"user": user_id, "id": record_id},
        )

    def _snapshot(
        self, cur: psycopg.Cursor, user_id: str, record_id: str, version: int, action: str, at: float
    ) -> None:
        cur.execute(
            f"SELECT {_SELECT} FROM records WHERE {_T} AND user_id=%s AND id=%s",
            (user_id, record_id),
        )
        snapshot = json.dumps(_record(cur.fetchone()), ensure_ascii=False)
        cur.execute(
            "INSERT INTO record_history (user_id, record_id, version, action, snapshot, at) "
            "VALUES (%s,%s,%s,%s,%s::jsonb,%s)",
            (user_id, record_id, version, action, snapshot, at),
        )

    # --- reads -------------------------------------------------------------------------------------
    def get(self, user_id: str, record_id: str) -> dict | None:
        with self._cursor(user_id) as cur:
            cur.execute(
                f"SELECT {_SELECT} FROM records WHERE {_T} AND user_id=%s AND id=%s",
                (user_id, record_id),
            )
            row = cur.fetchone()
        return _record(row) if row else None

    def get_many(self, user_id: str, record_ids: list[str]) -> dict[str, dict]:
        """{id: record} for those of the ids the user has."""
        if not record_ids:
            return {}
        with self._cursor(user_id) as cur:
            cur.execute(
                f"SELECT {_SELECT} FROM records WHERE {_T} AND user_id=%s AND id = ANY(%s)",
                (user_id, list(record_ids)),
            )
            return {r["id"]: _record(r) for r in cur.fetchall()}

    def turns(self, user_id: str, conversation_id: str) -> list[Turn]:
        """The conversation's stored turns, in order."""
        with self._cursor(user_id) as cur:
            cur.execute(
                "SELECT turn_id, speaker, role, text, session_id, session_time FROM turns "
                f"WHERE {_T} AND user_id=%s AND conversation_id=%s ORDER BY position",
                (user_id, conversation_id),
            )
            rows = cur.fetchall()
        return [
            Turn(
                r["turn_id"],
                r["speaker"],
                r["role"],
                r["text"],
                r["session_id"] if r["session_id"] is not None else _session_of(r["turn_id"]),
                r["session_time"],
            )
            for r in rows
        ]

    def turn_count(self, user_id: str, conversation_id: str) -> int:
        with self._cursor(user_id) as cur:
            cur.execute(
                f"SELECT count(*) AS n FROM turns WHERE {_T} AND user_id=%s AND conversation_id=%s",
                (user_id, conversation_id),
            )
            return cur.fetchone()["n"]

    def next_window_index(self, user_id: str, conversation_id: str) -> int:
        """The index the conversation's next window gets: after every recorded window and after every
        window its records name (conversations stored before windows were recorded)."""
        with self._cursor(user_id) as cur:
            cur.execute(
                f"SELECT max(idx) AS last FROM windows WHERE {_T} AND user_id=%s AND conversation_id=%s",
                (user_id, conversation_id),
            )
            last = cur.fetchone()["last"]
            cur.execute(
                f"SELECT DISTINCT window_id FROM records WHERE {_T} AND user_id=%s AND conversation_id=%s",
                (user_id, conversation_id),
            )
            named = [r["window_id"] for r in cur.fetchall()]
        indexes = [int(m.group(1)) for w in named if w and (m := re.search(r"/w(\d+)$", w))]
        return max([-1 if last is None else last, *indexes]) + 1

    def pending_windows(self, user_id: str, conversation_id: str) -> list[tuple[int, list[str], list[str]]]:
        """(index, context turn ids, new turn ids) of the conversation's windows whose records are not all
        stored yet, in order."""
        with self._cursor(user_id) as cur:
            cur.execute(
                "SELECT idx, context, new FROM windows "
                f"WHERE {_T} AND user_id=%s AND conversation_id=%s AND NOT done ORDER BY idx",
                (user_id, conversation_id),
            )
            return [(r["idx"], list(r["context"]), list(r["new"])) for r in cur.fetchall()]

    def has_turns(self, user_id: str) -> bool:
        """Whether any conversation turns are stored for the user."""
        with self._cursor(user_id) as cur:
            cur.execute(
                f"SELECT 1 FROM turns WHERE {_T} AND user_id=%s LIMIT 1",
                (user_id,),
            )
            return cur.fetchone() is not None

    def count(self, user_id: str) -> int:
        with self._cursor(user_id) as cur:
            cur.execute(
                f"SELECT count(*) AS n FROM records WHERE {_T} AND user_id=%s AND status='active'",
                (user_id,),
            )
            return cur.fetchone()["n"]

    def records(self, user_id: str, status: str | None = "active") -> list[dict]:
        with self._cursor(user_id) as cur:
            cur.execute(
                f"SELECT {_SELECT} FROM records "
                f"WHERE {_T} AND user_id=%s AND (%s::text IS NULL OR status=%s) "
                "ORDER BY created, id",
                (user_id, status, status),
            )
            return [_record(r) for r in cur.fetchall()]

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
        where, params = ["user_id=%s"], [user_id]
        for column, value in (("type", type), ("status", status), ("conversation_id", conversation_id)):
            if value is not None:
                where.append(f"{column}=%s")
                params.append(value)
        if span is not None:
            where.append("t_start<=%s::date AND t_end>=%s::date")
            params += [span[1], span[0]]
        if after is not None:
            where.append("(created, id) > (%s::double precision, %s)")
            params += [after[0], after[1]]
        with self._cursor(user_id) as cur:
            cur.execute(
                f"SELECT {_SELECT} FROM records WHERE {' AND '.join(where)} ORDER BY created, id LIMIT %s",
                (*params, _limit(limit)),
            )
            return [_record(r) for r in cur.fetchall()]

    def history(self, user_id: str, record_id: str) -> list[dict]:
        with self._cursor(user_id) as cur:
            cur.execute(
                "SELECT version, action, snapshot, at FROM record_history "
                f"WHERE {_T} AND user_id=%s AND record_id=%s "
                "ORDER BY version",
                (user_id, record_id),
            )
            rows = cur.fetchall()
        return [
            {"version": r["version"], "action": r["action"], "at": r["at"], "record": _ordered(r["snapshot"])}
            for r in rows
        ]

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
        with self._cursor(user_id) as cur:
            cur.execute(
                "SELECT k.record_id, count(*) AS shared "
                "FROM unnest(%(types)s::text[]) AS t(type) CROSS JOIN unnest(%(keys)s::text[]) AS q(keyword) "
                "CROSS JOIN LATERAL (SELECT record_id FROM record_keywords r "
                f"WHERE r.{_T} AND r.user_id=%(user)s AND r.type = t.type AND r.keyword = q.keyword "
                "ORDER BY r.record_id LIMIT %(limit)s) k "
                "GROUP BY k.record_id ORDER BY shared DESC, k.record_id LIMIT %(limit)s",
                {"user": user_id, "types": types, "keys": keys, "limit": _limit(limit)},
            )
            return [r["record_id"] for r in cur.fetchall()]

    def lexical(self, user_id: str, query: str, k: int) -> list[tuple[str, float]]:
        """BM25 over content, keywords and dimensions of the user's active records, by the user's own
        statistics (this process's `LexicalIndex`, brought up to date first); higher is better."""
        return self.lexicon.search(user_id, query, k)

    def lexical_stamp(self, user_id: str) -> tuple[int, int]:
        """(epoch, seq): the user's last change to what the lexical index holds."""
        with self._cursor(user_id) as cur:
            cur.execute(f"SELECT epoch, seq FROM user_stats WHERE {_T} AND user_id=%s", (user_id,))
            row = cur.fetchone()
        return (row["epoch"], row["seq"]) if row else (0, 0)

    def lexical_changes(self, user_id: str, after: int) -> list[dict]:
        """The records whose index state changed after change number `after` (0: the active records), in
        change order: id, status and the indexed fields."""
        with self._cursor(user_id) as cur:
            cur.execute(
                "SELECT id, status, content, keywords, location, reason, purpose FROM records "
                f"WHERE {_T} AND user_id=%s AND seq > %s AND (status = 'active' OR %s > 0) ORDER BY seq",
                (user_id, after, after),
            )
            return cur.fetchall()

    def dense(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The `k` active records nearest by cosine (pgvector HNSW, in the database), best first:
        (id, cosine similarity)."""
        if k <= 0:
            return []
        with self._cursor(user_id) as cur:
            cur.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(min(max(40, k), 1000)),))
            if self._iterative_scan:  # keep scanning the graph until k rows pass the user filter
                cur.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
            cur.execute(
                "SELECT id, 1 - (embedding <=> %(q)s::vector) AS score FROM records "
                f"WHERE {_T} AND user_id = %(user)s AND status = 'active' AND embedding IS NOT NULL "
                "ORDER BY embedding <=> %(q)s::vector LIMIT %(k)s",
                {"q": _vector(vector), "user": user_id, "k": k},
            )
            return [(r["id"], float(r["score"])) for r in cur.fetchall()]

    def records_in_span(self, user_id: str, start: str, end: str, limit: int = -1) -> list[str]:
        """Active records whose time overlaps the day span [start, end], the latest-starting first: those
        starting inside it, then of those starting before it the `limit` latest-starting that still
        run into it (so a lookup reads at most twice `limit` index entries; -1: all)."""
        mine = f"FROM records WHERE {_T} AND user_id=%(user)s AND status='active'"
        with self._cursor(user_id) as cur:
            cur.execute(
                f"(SELECT id, t_start {mine} AND t_start BETWEEN %(start)s::date AND %(end)s::date "
                "ORDER BY t_start DESC, id LIMIT %(limit)s) UNION ALL "
                f"(SELECT id, t_start FROM (SELECT id, t_start, t_end {mine} AND t_start < %(start)s::date "
                "ORDER BY t_start DESC, id LIMIT %(limit)s) b WHERE t_end >= %(start)s::date) "
                "ORDER BY t_start DESC, id LIMIT %(limit)s",
                {"user": user_id, "start": start, "end": end, "limit": _limit(limit)},
            )
            return [r["id"] for r in cur.fetchall()]

    def vectors(self, user_id: str, record_ids: list[str]) -> tuple[list[str], np.ndarray]:
        """Vectors of the given active records of the user."""
        if not record_ids:
            return [], np.zeros((0, 0), dtype=np.float32)
        with self._cursor(user_id) as cur:
            cur.execute(
                "SELECT id, embedding::real[] AS vec FROM records "
                f"WHERE {_T} AND user_id=%s AND id = ANY(%s) "
                "AND status='active' AND embedding IS NOT NULL ORDER BY id",
                (user_id, list(record_ids)),
                binary=True,  # float4[] in binary: exact, and far faster to load than text
            )
            rows = cur.fetchall()
        if not rows:
            return [], np.zeros((0, 0), dtype=np.float32)
        return [r["id"] for r in rows], np.array([r["vec"] for r in rows], dtype=np.float32)

    def assistant_replies(self, user_id: str, conversation_id: str, turn_ids: list[str]) -> list[dict]:
        """The assistant turns answering the given turns: each up to the next user turn (the pointer's
        payoff)."""
        with self._cursor(user_id) as cur:
            cur.execute(
                "SELECT min(position) AS lo, max(position) AS hi FROM turns "
                f"WHERE {_T} AND user_id=%s AND conversation_id=%s AND turn_id = ANY(%s)",
                (user_id, conversation_id, list(turn_ids)),
            )
            bounds = cur.fetchone()
            if bounds["lo"] is None:
                return []
            cur.execute(
                "SELECT turn_id, speaker, role, text, session_time FROM turns "
                f"WHERE {_T} AND user_id=%s AND "
                "conversation_id=%s AND position BETWEEN %s AND %s ORDER BY position",
                (user_id, conversation_id, bounds["lo"], bounds["hi"] + 2),
            )
            rows = cur.fetchall()
        return [r for r in rows if r["role"] == "assistant"]

    # --- moving a store (`dimmem memory migrate --from --to`) -----------------------------------------
    def users(self) -> list[str]:
        """Every user with records, turns or windows, sorted: of the store's tenant, or (tenant=None) of
        every tenant, which needs a role that passes row-level security (the schema owner as a superuser,
        or BYPASSRLS): `dimmem memory migrate` runs as the owner."""
        query = (
            "SELECT user_id FROM records{w} UNION SELECT user_id FROM turns{w} "
            "UNION SELECT user_id FROM windows{w} ORDER BY 1"
        )
        if self.tenant is not None:
            with self._cursor("") as cur:
                cur.execute(query.format(w=f" WHERE {_T}"))
                return [r["user_id"] for r in cur.fetchall()]
        if self.rls_enforced:
            raise ValueError(
                "listing the users of every tenant needs a role that bypasses row-level security (the schema "
                "owner as a superuser, or BYPASSRLS); or open the store with one tenant"
            )
        with self.pool.connection() as conn:
            return [r["user_id"] for r in conn.execute(query.format(w=""))]

    def dump(self, user_id: str) -> dict:
        """Everything of one user as raw rows (every status, history, turns, windows, the active records'
        vectors): what `load` writes back, losslessly, into either backend."""
        with self.transaction(), self._cursor(user_id) as cur:
            cur.execute(
                "SELECT record_id, version, action, snapshot, at FROM record_history "
                f"WHERE {_T} AND user_id=%s ORDER BY record_id, version",
                (user_id,),
            )
            history = [{**r, "snapshot": _ordered(r["snapshot"])} for r in cur.fetchall()]
            cur.execute(
                "SELECT conversation_id, turn_id, position, speaker, role, text, session_time, session_id "
                f"FROM turns WHERE {_T} AND user_id=%s ORDER BY conversation_id, position",
                (user_id,),
            )
            turns = cur.fetchall()
            cur.execute(
                "SELECT conversation_id, idx, context, new, done FROM windows "
                f"WHERE {_T} AND user_id=%s ORDER BY conversation_id, idx",
                (user_id,),
            )
            windows = [{**w, "context": list(w["context"]), "new": list(w["new"])} for w in cur.fetchall()]
            cur.execute(
                "SELECT id, embedding::real[] AS vec FROM records "
                f"WHERE {_T} AND user_id=%s AND embedding IS NOT NULL",
                (user_id,),
            )
            vectors = {r["id"]: np.array(r["vec"], dtype=np.float32) for r in cur.fetchall()}
            records = self.records(user_id, status=None)
        return {
            "user_id": user_id,
            "records": records,
            "history": history,
            "turns": turns,
            "windows": windows,
            "vectors": vectors,
        }

    def load(self, user_id: str, data: dict, replace: bool = False) -> None:
        """Write a `dump` (of either backend) for `user_id` in one transaction, indexes rebuilt for the
        active records; `replace`: the user's rows here are dropped first (else a stored id conflicts)."""
        with self.transaction(), self._cursor(user_id) as cur:
            if replace:
                for table in ("records", "record_history", "record_keywords", "turns", "windows"):
                    cur.execute(f"DELETE FROM {table} WHERE {_T} AND user_id=%s", (user_id,))
                cur.execute(  # every process's lexical index starts the user over
                    f"UPDATE user_stats SET epoch = epoch + 1 WHERE {_T} AND user_id=%s", (user_id,)
                )
            self._lock_user(cur, user_id)
            for record in data["records"]:
                row = {**record, **_row(record), "user_id": user_id}
                vector = data["vectors"].get(record["id"]) if record["status"] == "active" else None
                cur.execute(
                    f"INSERT INTO records ({_SELECT}, embedding) "
                    f"VALUES ({', '.join(['%s'] * len(_COLUMNS))}, %s::vector)",
                    [*(row[c] for c in _COLUMNS), _vector(vector)],
                )
                if record["status"] == "active":
                    self._index(cur, user_id, record["id"], record)
            if data["history"]:
                cur.executemany(
                    "INSERT INTO record_history (user_id, record_id, version, action, snapshot, at) "
                    "VALUES (%s,%s,%s,%s,%s::jsonb,%s)",
                    [
                        (user_id, h["record_id"], h["version"], h["action"])
                        + (json.dumps(h["snapshot"], ensure_ascii=False), h["at"])
                        for h in data["history"]
                    ],
                )
            if data["turns"]:
                cur.executemany(
                    "INSERT INTO turns (user_id, conversation_id, turn_id, position, speaker, role, text, "
                    "session_time, session_id) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    [
                        (user_id, t["conversation_id"], t["turn_id"], t["position"], t["speaker"], t["role"])
                        + (t["text"], t["session_time"], t["session_id"])
                        for t in data["turns"]
                    ],
                )
            if data["windows"]:
                cur.executemany(
                    "INSERT INTO windows (user_id, conversation_id, idx, context, new, done) "
                    "VALUES (%s,%s,%s,%s,%s,%s)",
                    [
                        (user_id, w["conversation_id"], w["idx"], list(w["context"]), list(w["new"]))
                        + (bool(w["done"]),)
                        for w in data["windows"]
                    ],
                )


def _session_of(turn_id: str) -> str:
    """A turn's session when none was stored (rows written before sessions were): its id's prefix."""
    return turn_id.rsplit(":", 1)[0] if ":" in turn_id else "S1"


def _limit(limit: int) -> int | None:
    """SQLite's LIMIT -1 (no limit) as Postgres's LIMIT NULL."""
    return None if limit is None or limit < 0 else limit


def _vector(vector: np.ndarray | None) -> list[float] | None:
    """A vector as a float list (sent as float8[], cast to vector: exact for float32 values)."""
    if vector is None:
        return None
    values = np.asarray(vector, dtype=np.float32).ravel()
    if values.size != DIMENSIONS:
        raise ValueError(f"vector of {values.size} dimensions; the store holds {DIMENSIONS}")
    return values.tolist()


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
        "keywords": list(record["keywords"]),
        "source_turns": list(record["source_turns"]),
    }


def _record(row: dict) -> dict:
    """A stored record as the SQLite store returns it: its columns in order, days as ISO strings."""
    out = {c: row[c] for c in _COLUMNS}
    for day in ("t_start", "t_end"):
        if out[day] is not None:
            out[day] = out[day].isoformat()
    return out


def _ordered(snapshot: dict) -> dict:
    """A history snapshot (jsonb keeps no key order) in the record's column order."""
    return {**{c: snapshot[c] for c in _COLUMNS if c in snapshot}, **snapshot}
