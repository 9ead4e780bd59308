"""The runtime's memory store: one record log (`log.RecordLog`, the lifecycle written once) over a SQL
dialect, SQLite (`sqlite.SQLiteStore`, the embedded default) or Postgres + pgvector
(`postgres.PostgresStore`, the `postgres` extra), chosen by URL, with its retrieval indexes (`indexes`),
chosen by name. A store's other jobs are parts of their own over the same database: its conversation
log (`store.conversations`, `conversations.py`), the reads that find records (`store.lookup`,
`lookup.py`) and moving a user between stores (`transfer.py`).

    open_store("memories.sqlite")           # a path, sqlite:///PATH or :memory: -> SQLite
    open_store("postgresql://app@db/mem")   # postgresql://... or postgres://... -> Postgres
    open_store(url, indexes={"dense": "pgvector"})
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from dimmem.runtime.stores.base import RecordStateError
from dimmem.runtime.stores.log import RecordLog

__all__ = ["RecordLog", "RecordStateError", "is_postgres", "open_store", "redacted", "sqlite_path"]

SQLITE_URL = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(url: str) -> bool:
    return url.startswith(POSTGRES_SCHEMES)


def sqlite_path(url: str) -> str:
    """The SQLite file (or ":memory:") a path or sqlite:/// URL names."""
    return url[len(SQLITE_URL) :] if url.startswith(SQLITE_URL) else url


def open_store(
    url: str,
    *,
    migrate: bool = True,
    indexes: dict[str, str] | None = None,
    ann_min_records: int = 200_000,
    **options,
) -> RecordLog:
    """The store `url` names: a path, `sqlite:///PATH` or `:memory:` (SQLite), `postgresql://...` or
    `postgres://...` (Postgres; `options` go to PostgresStore: tenant, pool_min, pool_max). `migrate`:
    apply pending migrations on opening. `indexes`: {"lexical": name, "dense": name} (`indexes.INDEXES`;
    default: the backend's). `ann_min_records`: where an in-process dense index switches from exact search
    to HNSW (pgvector searches by HNSW in the database)."""
    if is_postgres(url):
        try:
            from dimmem.runtime.stores.postgres import PostgresStore
        except ImportError as err:  # psycopg and pgvector are the `postgres` extra
            raise ValueError(
                "a Postgres store needs psycopg, psycopg_pool and pgvector: "
                f"pip install 'dimmem[postgres]' ({err})"
            ) from None
        return PostgresStore(url, migrate=migrate, indexes=indexes, **options)
    if "://" in url and not url.startswith(SQLITE_URL):
        raise ValueError(
            f"store {redacted(url)!r}: expected a SQLite path, {SQLITE_URL}PATH, :memory: or postgresql://..."
        )
    if options:
        raise TypeError(f"SQLite store: unexpected options {sorted(options)}")
    from dimmem.runtime.stores.sqlite import SQLiteStore

    path = sqlite_path(url)
    if not path:
        raise ValueError("empty store path")
    return SQLiteStore(path, migrate=migrate, indexes=indexes, ann_min_records=ann_min_records)


def redacted(url: str) -> str:
    """The URL without its password, for messages and logs."""
    if not is_postgres(url):
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{host}"))
