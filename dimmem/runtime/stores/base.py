"""The one store interface of the memory runtime, kept by both backends: SQLite (`stores.sqlite`, the
embedded default, one file) and Postgres + pgvector (`stores.postgres`, many processes and machines).

Every read and write names one user; none crosses users. A record is `active` until it is superseded,
merged into another or deleted; only active records are indexed (keywords, lexical, dense) and only
active records can be revised or change status; a deleted record can be restored. Anything else raises
`RecordStateError`, checked inside the caller's write transaction. Turns are insert-only; a
conversation's windows are recorded pending until their records are stored.

Writes run inside `transaction()`: all of a block lands or none of it, also when the process is killed.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dimmem.contract.conversation import Turn


class RecordStateError(ValueError):
    """An operation the record's status does not allow (e.g. updating a deleted record)."""

    def __init__(self, record_id: str, status: str, operation: str, allowed: str = "active"):
        self.record_id, self.status, self.operation = record_id, status, operation
        super().__init__(
            f"record {record_id!r} is {status}: only {allowed} records can be {operation}"
            + ("" if status != "deleted" or allowed != "active" else " (restore it first)")
        )


@runtime_checkable
class Store(Protocol):
    """What `Memory`, retrieval, the labels loader, the CLIs and `dimmem memory migrate` use of a store."""

    serialized: bool
    """True: one connection, callers serialize their calls (SQLite); False: a pool, call from any thread."""
    concurrent_dense: bool
    """True: `dense` may run from any thread while other calls hold the caller's lock (it reads through
    a connection of its own); False: serialize it like every other call."""
    url: str
    """Where the store lives: a SQLite path or a postgresql:// URL (show it through `redacted`)."""

    # --- schema and health --------------------------------------------------------------------------
    def migrate(self) -> int:
        """Apply the pending schema migrations; how many were applied (0: current)."""

    def schema_version(self) -> int:
        """The number of the last migration applied."""

    def ping(self) -> bool:
        """A trivial query answers and the schema is this code's (readiness checks)."""

    def transaction(self) -> AbstractContextManager[Any]:
        """One atomic write block; the writes below run inside one."""

    def close(self) -> None:
        """Release the connection(s)."""

    # --- writes -------------------------------------------------------------------------------------
    def put_turns(self, user_id: str, conversation_id: str, turns: Iterable[Turn]) -> int:
        """Append the turns not stored yet; a stored id with other role/text: ValueError; how many added."""

    def put_windows(self, user_id: str, windows: Iterable[Any]) -> None:
        """Record a conversation's new windows (contract `Window`s) as pending."""

    def window_done(self, user_id: str, conversation_id: str, indexes: list[int]) -> None:
        """Mark windows done: their records are stored."""

    def insert(self, user_id: str, record: dict, vector: np.ndarray, action: str = "ADD") -> None:
        """A new active record, indexed, version 1 in its history."""

    def revise(self, user_id: str, record_id: str, fields: dict, vector: np.ndarray, action: str) -> int:
        """A new version of an active record (KeyError, RecordStateError); the new version number."""

    def set_status(self, user_id: str, record_id: str, status: str, action: str) -> None:
        """An active record becomes superseded, merged or deleted (ValueError for any other status)."""

    def restore(self, user_id: str, record_id: str, vector: np.ndarray) -> int:
        """A deleted record active again, re-indexed; the new version number."""

    # --- reads --------------------------------------------------------------------------------------
    def get(self, user_id: str, record_id: str) -> dict | None:
        """The record (any status), or None."""

    def get_many(self, user_id: str, record_ids: list[str]) -> dict[str, dict]:
        """{id: record} for those of the ids the user has."""

    def records(self, user_id: str, status: str | None = "active") -> list[dict]:
        """The user's records of a status (None: any), ordered by (created, id)."""

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
        """One keyset page of the user's records, filtered, ordered by (created, id)."""

    def count(self, user_id: str) -> int:
        """The user's active records."""

    def history(self, user_id: str, record_id: str) -> list[dict]:
        """The record's versions: [{"version", "action", "at", "record"}], oldest first."""

    def turns(self, user_id: str, conversation_id: str) -> list[Turn]:
        """The conversation's stored turns, in order."""

    def turn_count(self, user_id: str, conversation_id: str) -> int:
        """How many turns of the conversation are stored."""

    def has_turns(self, user_id: str) -> bool:
        """Whether any turns are stored for the user."""

    def next_window_index(self, user_id: str, conversation_id: str) -> int:
        """The index the conversation's next window gets."""

    def pending_windows(self, user_id: str, conversation_id: str) -> list[tuple[int, list[str], list[str]]]:
        """(index, context turn ids, new turn ids) of the windows not done, in order."""

    def assistant_replies(self, user_id: str, conversation_id: str, turn_ids: list[str]) -> list[dict]:
        """The assistant turns answering the given turns (the pointer's payoff)."""

    # --- retrieval ----------------------------------------------------------------------------------
    def candidates(
        self, user_id: str, types: str | list[str], keywords: list[str], limit: int = -1
    ) -> list[str]:
        """Active records of the type(s) sharing a keyword, most shared first (-1: no limit)."""

    def lexical(self, user_id: str, query: str, k: int) -> list[tuple[str, float]]:
        """BM25 over content, keywords and dimensions of active records: (id, score), best first."""

    def dense(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k active records nearest by cosine: (id, similarity), best first."""

    def lexical_stamp(self, user_id: str) -> tuple[int, int]:
        """(epoch, seq): the user's last change to what the lexical index holds; `seq` grows with every
        index or unindex of a record, `epoch` when the user is replaced wholesale (`load(replace=True)`)."""

    def lexical_changes(self, user_id: str, after: int) -> list[dict]:
        """The records whose index state changed after change number `after` (0: the active records), in
        change order: id, status and the indexed fields (`lexical.document`)."""

    def records_in_span(self, user_id: str, start: str, end: str, limit: int = -1) -> list[str]:
        """Active records whose time overlaps the day span, the latest-starting first."""

    def vectors(self, user_id: str, record_ids: list[str]) -> tuple[list[str], np.ndarray]:
        """(ids, float32 matrix) of the given active records' vectors, ordered by id."""

    # --- moving a store (`dimmem memory migrate --from --to`) ---------------------------------------
    def users(self) -> list[str]:
        """Every user with records, turns or windows, sorted."""

    def dump(self, user_id: str) -> dict:
        """Everything of one user as raw rows: records, history, turns, windows, vectors (lossless)."""

    def load(self, user_id: str, data: dict, replace: bool = False) -> None:
        """Write a `dump` into this store in one transaction (replace: drop the user's rows first)."""
