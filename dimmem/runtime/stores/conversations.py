"""The conversation log: the turns a user's records point into, and the windows an add plans over them,
in the record log's database (a store's `conversations`).

Conversation turns are written once (`put_turns` inserts, never replaces): records point at them. A
conversation's windows are recorded with the turns (`put_windows`), pending until their records are stored
(`window_done`), so an add that was killed midway is completed by the next add of the conversation. Like
the log's, every call names one user, and writes made inside the log's `transaction()` land with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from dimmem.contract.conversation import Turn
from dimmem.runtime.stores.base import Dialect

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


class ConversationLog:
    """A store's turns and windows, over the record log's dialect."""

    def __init__(self, dialect: Dialect):
        self.dialect = dialect

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


def _session(turn: dict) -> str:
    """A stored turn's session; rows written before sessions were have none: their id's prefix."""
    if turn["session_id"] is not None:
        return turn["session_id"]
    return turn["turn_id"].rsplit(":", 1)[0] if ":" in turn["turn_id"] else "S1"
