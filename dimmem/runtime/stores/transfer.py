"""Moving a store (`dimmem memory migrate --from --to`): a user at a time, as raw rows (`dump`: every
status, the history, turns, windows and the active records' vectors) that `load` writes back losslessly
into a store of either backend, in one transaction; `users` names whom to move, and `refusal` says what
in a dump no store keeps, so a copy can check every user before it writes any.
"""

from __future__ import annotations

from dimmem.runtime.stores import schema
from dimmem.runtime.stores.conversations import _INSERT_TURN, _TURN_COLUMNS
from dimmem.runtime.stores.log import _INSERT_HISTORY, _INSERT_RECORD, RecordLog


def users(log: RecordLog) -> list[str]:
    """Every user with records, turns or windows, sorted."""
    with log.dialect.all_users() as (sql, where):
        rows = sql.rows(
            f"SELECT user_id FROM records {where} UNION SELECT user_id FROM turns {where} "
            f"UNION SELECT user_id FROM windows {where} ORDER BY 1"
        )
    return [r["user_id"] for r in rows]


def dump(log: RecordLog, user_id: str) -> dict:
    """Everything of one user as raw rows (every status, history, turns, windows, the active records'
    vectors): what `load` writes back, losslessly, into either backend."""
    with log.transaction(), log.dialect.cursor(user_id) as sql:
        history = [
            {**r, "snapshot": schema.snapshot_of(log.dialect, r)}
            for r in sql.rows(
                "SELECT record_id, version, action, snapshot, at FROM record_history WHERE {user} "
                "ORDER BY record_id, version",
                (user_id,),
            )
        ]
        turns = sql.rows(
            f"SELECT {', '.join(_TURN_COLUMNS)} FROM turns WHERE {{user}} ORDER BY conversation_id, position",
            (user_id,),
        )
        windows = [
            {
                **w,
                "context": log.dialect.from_array(w["context"]),
                "new": log.dialect.from_array(w["new"]),
            }
            | {"done": bool(w["done"])}
            for w in sql.rows(
                "SELECT conversation_id, idx, context, new, done FROM windows WHERE {user} "
                "ORDER BY conversation_id, idx",
                (user_id,),
            )
        ]
        ids, matrix = log.indexes["dense"].vectors(sql, user_id, None)
        records = log.records(user_id, status=None)
    return {
        "user_id": user_id,
        "records": records,
        "history": history,
        "turns": turns,
        "windows": windows,
        "vectors": dict(zip(ids, matrix.copy())),
    }


def load(log: RecordLog, user_id: str, data: dict, replace: bool = False) -> None:
    """Write a `dump` (of either backend) for `user_id` in one transaction, indexes rebuilt for the
    active records; `replace`: the user's rows here are dropped first (else a stored id conflicts)."""
    dialect, to_array = log.dialect, log.dialect.to_array
    with log.transaction(), dialect.cursor(user_id, write=True) as sql:
        if replace:
            for table in ("records", "record_history", "record_keywords", "turns", "windows"):
                sql.run(f"DELETE FROM {table} WHERE {{user}}", (user_id,))
            for index in log.indexes.values():
                index.clear(sql, user_id)
            sql.run("UPDATE user_stats SET epoch = epoch + 1 WHERE {user}", (user_id,))  # indexes start over
        for record in data["records"]:
            row = {**record, **schema.encode(dialect, schema.row(record)), "user_id": user_id}
            sql.run(_INSERT_RECORD, [*(row[c] for c in schema.COLUMNS), 0])  # (stamped when indexed)
            if record["status"] == "active":
                # the log's own indexing (keywords, change stamp, every index): one way in for a record
                log._index(sql, user_id, record, data["vectors"].get(record["id"]))
        sql.many(
            _INSERT_HISTORY,
            [
                (user_id, h["record_id"], h["version"], h["action"], dialect.to_json(h["snapshot"]), h["at"])
                for h in data["history"]
            ],
        )
        sql.many(_INSERT_TURN, [(user_id, *(t[c] for c in _TURN_COLUMNS)) for t in data["turns"]])
        sql.many(
            "INSERT INTO windows (user_id, conversation_id, idx, context, new, done) VALUES (?,?,?,?,?,?)",
            [
                (user_id, w["conversation_id"], w["idx"], to_array(w["context"]), to_array(w["new"]))
                + (dialect.to_flag(bool(w["done"])),)
                for w in data["windows"]
            ],
        )


def refusal(data: dict) -> str | None:
    """Why a `dump` cannot be copied as it is (None: either backend keeps it): the first text holding a
    NUL character (PostgreSQL refuses it; SQLite stores it, but its SQL functions stop there) or one that
    is not Unicode, named by its user, row and field. Both backends refuse the same dumps."""
    user = data["user_id"]
    if why := _bad_text(user):
        return f"user {user!r}: the user id {why}"
    rows = (
        [(f"record {r['id']!r}", r) for r in data["records"]]
        + [(f"record {h['record_id']!r}, history version {h['version']}", h) for h in data["history"]]
        + [(f"turn {t['turn_id']!r} of conversation {t['conversation_id']!r}", t) for t in data["turns"]]
        + [(f"window {w['idx']} of conversation {w['conversation_id']!r}", w) for w in data["windows"]]
    )
    for what, row in rows:
        for field, value in row.items():
            if why := _bad_text(value):
                return f"user {user!r}, {what}: {field} {why}"
    return None


def _bad_text(value) -> str | None:
    """What is wrong with the first bad string in `value` (a string, or lists and mappings of them)."""
    if isinstance(value, str):
        if "\x00" in value:
            return "holds a NUL character (\\x00), which PostgreSQL cannot store"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"is not valid Unicode ({exc.reason} at character {exc.start})"
        return None
    if isinstance(value, dict):
        value = [*value, *value.values()]
    if isinstance(value, list | tuple):
        return next(filter(None, map(_bad_text, value)), None)
    return None
