"""The backend for everything beyond one process: PostgreSQL + pgvector, over a connection pool that many
threads, processes and machines share (`serialized = False`: callers need no lock of their own).

    store = PostgresStore("postgresql://app@db/dimmem", tenant="acme")   # tenant=None: from user ids
    with store.transaction():
        store.insert("ann", record, vector)
    store.lookup.dense("ann", vector, 10), store.lookup.lexical("ann", "hiking Paris", 10)

What the dialect adds to the record log:
- one writer per user instead of SQLite's one per file: the first call for a user inside `transaction()`
  locks that user's `user_stats` row until commit, so what a block reads of the user no other writer
  changes before it commits, and a record the block changes is read `FOR UPDATE`;
- every table carries `tenant`, and row-level security confines each transaction to its tenant
  (`dimmem.tenant`). A store has one tenant, or (tenant=None) takes it from each user id's namespace,
  `<tenant>/<user>` as the HTTP service names users (`default` for a bare user id). The runtime should
  connect as a login role in `dimmem_runtime` (no superuser: superusers pass RLS); migrations run as the
  schema owner (`PostgresStore(owner_url).migrate()`), and the runtime's own start applies nothing when
  the schema is current;
- arrays as text[], history snapshots as jsonb, days as dates; the dense path searches pgvector's HNSW
  graph in the database (`stores.indexes.PgVectors`), so no process keeps a copy of the vectors.

Transactions: `transaction()` holds one pooled connection for the calling thread until the block ends,
and every call inside it (any thread-local call of this store) runs on it; a call outside a block is a
transaction of its own. A killed writer leaves nothing of its open transaction.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import select
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import cache

import psycopg
from pgvector.psycopg.vector import register_vector_info
from psycopg.rows import dict_row
from psycopg.types import TypeInfo
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from dimmem.runtime.stores.base import Sql, new_epoch
from dimmem.runtime.stores.log import RecordLog

__all__ = ["PostgresDialect", "PostgresStore", "SchemaError"]

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
MIGRATION_LOCK = 0x64696D6D656D  # pg_advisory_lock key: two processes starting together take turns
# Every query names the transaction's tenant too (row-level security alone would also confine it, but
# not a superuser's connection, and the tenant leads every index)
_TENANT = "tenant = current_setting('dimmem.tenant')"


# The keyword lookup (`Lookup.keywords`): each (type, keyword) reads at most `limit` entries of
# record_keywords' primary key, laterally (params: types, keywords, user, limit, limit)
KEYWORD_LOOKUP = (
    "SELECT k.record_id, count(*) AS shared "
    "FROM unnest(?::text[]) AS t(type) CROSS JOIN unnest(?::text[]) AS q(keyword) "
    "CROSS JOIN LATERAL (SELECT record_id FROM record_keywords r "
    f"WHERE r.{_TENANT} AND r.user_id=? AND r.type = t.type AND r.keyword = q.keyword "
    "ORDER BY r.record_id LIMIT ?) k "
    "GROUP BY k.record_id ORDER BY shared DESC, k.record_id LIMIT ?"
)

KEYWORD_ARMS = (  # each (type, keyword) arm reading at most `limit` entries of the lookup index
    "SELECT a.type, a.keyword, k.record_id FROM unnest(?::text[], ?::text[]) AS a(type, keyword) "
    "CROSS JOIN LATERAL (SELECT record_id FROM record_keywords r "
    f"WHERE r.{_TENANT} AND r.user_id=? AND r.type = a.type AND r.keyword = a.keyword "
    "ORDER BY r.record_id LIMIT ?) k"
)


@cache
def _translate(query: str) -> str:
    return query.replace("{user}", f"{_TENANT} AND user_id=?").replace("?", "%s")


def _binary_vectors(conn: psycopg.Connection) -> None:
    """pgvector's type on a new pooled connection, in binary: a numpy vector goes as 1.5 KB of float4,
    not 384 numbers as text that the server parses (a third of an insert's cost). Before the first migration
    installs the extension there is no such type; `migrate` renews the pool's connections."""
    info = TypeInfo.fetch(conn, "vector")
    if info is not None:
        register_vector_info(conn, info)


def _check_idle(conn: psycopg.Connection) -> None:
    """The pool's check at checkout, without a round trip while nothing is wrong: an idle connection has
    nothing to read, so a readable socket (the server ended it: a restart, an idle timeout, a terminated
    backend) gets the real check, which fails it and the pool hands out another. A round trip at every
    checkout cost a tenth of a Postgres record's write."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


class SchemaError(RuntimeError):
    """The database schema is behind this code and this connection may not migrate it."""


@contextmanager
def _refused_values() -> Iterator[None]:
    """A value PostgreSQL cannot store (a NUL character in text, a malformed encoding) is the caller's
    input, not a server fault: a ValueError (422 over HTTP), and the transaction rolls back."""
    try:
        yield
    except psycopg.DataError as exc:
        raise ValueError(f"PostgreSQL refused a value: {str(exc).splitlines()[0]}") from None


class PostgresDialect:
    name = "postgres"
    serialized = False  # a pool: any thread may call at any time
    user_key = "tenant, user_id"
    for_update = " FOR UPDATE"

    def __init__(self, url: str, *, tenant: str | None = None, pool_min: int = 1, pool_max: int = 10):
        if tenant is not None and not tenant:
            raise ValueError("tenant: a non-empty name, or None to take it from each user id")
        self.url, self.tenant = url, tenant
        self.pool_min, self.pool_max = pool_min, pool_max
        self._local = threading.local()
        self.pool: ConnectionPool | None = None  # opened by `open`

    def open(self) -> None:
        """Open the pool; warn when the role passes row-level security."""
        self.pool = ConnectionPool(
            self.url,
            min_size=self.pool_min,
            max_size=self.pool_max,
            kwargs={"autocommit": True, "row_factory": dict_row},
            check=_check_idle,
            configure=_binary_vectors,
            name="dimmem",
            open=True,
        )
        with self.pool.connection() as conn:
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

    # --- connections and transactions --------------------------------------------------------------
    def tenant_of(self, user_id: str) -> str:
        if self.tenant is not None:
            return self.tenant
        namespace, slash, _ = user_id.partition("/")
        return namespace if slash and namespace else DEFAULT_TENANT

    @contextmanager
    def transaction(self, write: bool = True) -> Iterator[psycopg.Connection]:
        """The tenant is set by the first call inside; a block that names users of two tenants is refused.
        A write block is pipelined: a statement whose result nobody reads is sent without waiting for the
        server. A read block (`write=False`) runs read only and takes no user's lock; it is not pipelined
        (each of its reads waits for its rows anyway, and a pipeline's syncs cost more than they save)."""
        tx = getattr(self._local, "tx", None)
        if tx is not None:  # nested: a savepoint on the same connection
            if write and not tx["write"]:
                raise RuntimeError("a write block inside a read block")
            with tx["conn"].transaction():
                yield tx["conn"]
            return
        with _refused_values(), self.pool.connection() as conn:
            conn.read_only = None if write else True  # BEGIN or BEGIN READ ONLY
            try:
                with conn.transaction(), conn.pipeline() if write else nullcontext():
                    self._local.tx = {"conn": conn, "tenant": None, "users": set(), "write": write}
                    yield conn
            finally:
                self._local.tx = None
                if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                    conn.read_only = None  # (a broken connection is not reused: the pool drops it)

    @contextmanager
    def cursor(self, user_id: str, write: bool = False) -> Iterator[Sql]:
        tenant = self.tenant_of(user_id)
        tx = getattr(self._local, "tx", None)
        if tx is not None:
            if tx["tenant"] is None:
                tx["conn"].execute("SELECT set_config('dimmem.tenant', %s, true)", (tenant,))
                tx["tenant"] = tenant
            elif tx["tenant"] != tenant:
                raise ValueError(f"one transaction, one tenant: {tx['tenant']!r}, then {tenant!r}")
            with tx["conn"].cursor() as cur:
                if tx["write"] and user_id not in tx["users"]:  # the first call for the user: one writer
                    self._lock_user(cur, user_id)
                    tx["users"].add(user_id)
                yield Sql(cur, _translate)
            return
        with _refused_values(), self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT set_config('dimmem.tenant', %s, true)", (tenant,))
            if write:  # a write outside a block is a block of its own
                self._lock_user(cur, user_id)
            yield Sql(cur, _translate)

    @staticmethod
    def _lock_user(cur: psycopg.Cursor, user_id: str) -> None:
        """The user's stats row, locked until commit: it orders concurrent writers of one user (no deadlock
        between their record locks)."""
        cur.execute(
            "INSERT INTO user_stats (user_id, epoch) VALUES (%s, %s) "
            "ON CONFLICT (tenant, user_id) DO UPDATE SET seq = user_stats.seq",
            (user_id, new_epoch()),
        )

    @contextmanager
    def all_users(self) -> Iterator[tuple[Sql, str]]:
        """Of the store's tenant, or (tenant=None) of every tenant, which needs a role that passes
        row-level security (the schema owner as a superuser, or BYPASSRLS): `dimmem memory migrate` runs
        as the owner."""
        if self.tenant is not None:
            with self.cursor("") as sql:
                yield sql, f"WHERE {_TENANT}"
            return
        if self.rls_enforced:
            raise ValueError(
                "listing the users of every tenant needs a role that bypasses row-level security (the schema "
                "owner as a superuser, or BYPASSRLS); or open the store with one tenant"
            )
        with self.pool.connection() as conn, conn.cursor() as cur:
            yield Sql(cur, _translate), ""

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    # --- types -------------------------------------------------------------------------------------
    def limit(self, n: int) -> int | None:
        return None if n is None or n < 0 else n  # LIMIT NULL: no limit

    def to_array(self, values: list) -> list:
        return list(values)

    def from_array(self, value: list) -> list:
        return list(value)

    def to_json(self, value) -> Jsonb:
        return Jsonb(value)

    def from_json(self, value):
        return value

    def to_day(self, iso: str | None) -> dt.date | None:
        return dt.date.fromisoformat(iso) if iso else None

    def from_day(self, value: dt.date | None) -> str | None:
        return value.isoformat() if value is not None else None

    def to_flag(self, value: bool) -> bool:
        return value

    def keywords(self, sql: Sql, user_id: str, types: list[str], keys: list[str], limit: int) -> list[str]:
        rows = sql.rows(KEYWORD_LOOKUP, (types, keys, user_id, self.limit(limit), self.limit(limit)))
        return [r["record_id"] for r in rows]

    def keyword_arms(
        self, sql: Sql, user_id: str, arms: list[tuple[str, str]], limit: int
    ) -> list[tuple[str, str, str]]:
        types, keys = [t for t, _ in arms], [k for _, k in arms]
        return sql.tuples(KEYWORD_ARMS, (types, keys, user_id, self.limit(limit)))

    # --- schema ------------------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self.pool.connection() as conn:
            if conn.execute("SELECT to_regclass('schema_migrations') AS t").fetchone()["t"] is None:
                return 0
            return conn.execute("SELECT coalesce(max(version), 0) AS v FROM schema_migrations").fetchone()[
                "v"
            ]

    def migrate(self, migrations: list[tuple[int, str, str]]) -> int:
        """Each pending migration in its own transaction, under an advisory lock (two processes starting
        together take turns); `schema_migrations` records them."""
        done, step = set(), "0000_schema_migrations"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            try:
                if conn.execute("SELECT to_regclass('schema_migrations')").fetchone()[0] is None:
                    conn.execute(
                        "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
                        "applied_at timestamptz NOT NULL DEFAULT now())"
                    )
                done = {v for (v,) in conn.execute("SELECT version FROM schema_migrations")}
                pending = [m for m in migrations if m[0] not in done]
                for version, name, script in pending:
                    step = f"{version:04d}_{name}"
                    with conn.transaction():
                        conn.execute(script)
                        conn.execute(
                            "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name)
                        )
                if pending and self.pool is not None:
                    self.pool.drain()  # new connections, configured for the types the migrations made
                return len(pending)
            except psycopg.errors.RaiseException as err:  # a migration's own refusal says what to do
                raise SchemaError(f"{step}: {err.diag.message_primary} ({err.diag.message_hint})") from None
            except psycopg.errors.InsufficientPrivilege as err:
                raise SchemaError(
                    f"schema at version {max(done, default=0)} of {len(migrations)}, and this role may not "
                    f"apply {step}: run `dimmem memory migrate` as the schema owner ({err})"
                ) from err
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))

    def ping(self) -> bool:
        try:
            with self.pool.connection() as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def pgvector_version(self) -> tuple[int, ...]:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        return tuple(int(p) for p in re.findall(r"\d+", row["extversion"] if row else "0")[:2])


class PostgresStore(RecordLog):
    """The record log in the database of `url` (postgresql://...): `tenant` (None: from each user id),
    a pool of `pool_min`..`pool_max` connections, `indexes` by name (default: the in-process BM25 and
    pgvector). `migrate`: apply pending migrations now (a no-op, allowed to the runtime role, when the
    schema is current)."""

    def __init__(
        self,
        url: str,
        *,
        tenant: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        migrate: bool = True,
        indexes: dict[str, str] | None = None,
    ):
        dialect = PostgresDialect(url, tenant=tenant, pool_min=pool_min, pool_max=pool_max)
        dialect.open()
        super().__init__(dialect, migrate=migrate, indexes=indexes)
