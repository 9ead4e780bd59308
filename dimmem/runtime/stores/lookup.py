"""The reads that find records for retrieval and for the update path (a store's `lookup`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dimmem.runtime.stores import schema
from dimmem.runtime.stores.base import change_stamp


class Lookup:
    """The reads that find records rather than change them: the dimension path's lookups over the log's
    keyword table (`record_keywords`) and day columns (`t_start`, `t_end`), the lexical and dense paths'
    searches of the log's indexes (`log.indexes`), the update path's scoring of its candidates, and the
    log's change numbers (`change_stamp`, `changes`), which what a process holds in memory follows. Each
    needs none of the record lifecycle's rules: a part of their own beside the log, not more surface on
    it."""

    def __init__(self, log: Any):
        """`log`: the record log whose dialect and indexes are read."""
        self.log = log

    def keywords(
        self, user_id: str, types: str | list[str], keywords: list[str], limit: int = -1
    ) -> list[str]:
        """Active records of the type(s) sharing a keyword, most shared first (`limit` -1: all). Each
        (type, keyword) contributes at most `limit` records, the first by id, so a keyword most records
        carry costs no more than a rare one."""
        keys = sorted({k.casefold() for k in keywords})
        types = sorted({types} if isinstance(types, str) else set(types))
        if not keys or not types:
            return []
        with self.log.dialect.cursor(user_id) as sql:
            return self.log.dialect.keywords(sql, user_id, types, keys, limit)

    def keyword_arms(
        self, user_id: str, arms: list[tuple[str, str]], limit: int = -1
    ) -> dict[tuple[str, str], list[str]]:
        """For each (type, casefolded keyword) arm, the first `limit` active records carrying it, by id
        (-1: all): `keywords`' reads, ungrouped, for many records' lookups in one query."""
        found: dict[tuple[str, str], list[str]] = {arm: [] for arm in arms}
        if arms:
            with self.log.dialect.cursor(user_id) as sql:
                for kind, key, rid in self.log.dialect.keyword_arms(sql, user_id, arms, limit):
                    found[(kind, key)].append(rid)
        for ids in found.values():
            ids.sort()
        return found

    def change_stamp(self, user_id: str) -> tuple[int, int]:
        """The user's (epoch, seq) now (`base.change_stamp`)."""
        with self.log.dialect.cursor(user_id) as sql:
            return change_stamp(sql, user_id)

    def changes(self, user_id: str, after: int, fields: tuple[str, ...]) -> list[dict]:
        """The records indexed or unindexed after change number `after` (0: the active records), in change
        order: id, status and `fields`, decoded: what an in-process index (and the update path's held
        keywords) replays to follow the log."""
        columns = ", ".join(f'"{f}"' for f in fields)  # (quoted: `time` is a keyword in Postgres)
        with self.log.dialect.cursor(user_id) as sql:
            rows = sql.rows(
                f"SELECT id, status, {columns} FROM records "
                "WHERE {user} AND seq > ? AND (status = 'active' OR ? > 0) ORDER BY seq",
                (user_id, after, after),
            )
        return [schema.decode(self.log.dialect, r) for r in rows]

    def in_span(self, user_id: str, start: str, end: str, limit: int = -1) -> list[str]:
        """Active records whose time overlaps the day span [start, end], the latest-starting first: those
        starting inside it, then of those starting before it the `limit` latest-starting that still run
        into it (so a lookup reads at most twice `limit` index entries; -1: all)."""
        dialect = self.log.dialect
        first, last, limit = dialect.to_day(start), dialect.to_day(end), dialect.limit(limit)
        active = "FROM records WHERE {user} AND status='active'"
        with dialect.cursor(user_id) as sql:
            return sql.first_column(
                f"SELECT id FROM (SELECT * FROM (SELECT id, t_start {active} AND t_start BETWEEN ? AND ? "
                "ORDER BY t_start DESC, id LIMIT ?) inside UNION ALL "
                f"SELECT id, t_start FROM (SELECT id, t_start, t_end {active} AND t_start < ? "
                "ORDER BY t_start DESC, id LIMIT ?) before WHERE t_end >= ?) found "
                "ORDER BY t_start DESC, id LIMIT ?",
                (user_id, first, last, limit, user_id, first, limit, first, limit),
            )

    def lexical(self, user_id: str, query: str, k: int) -> list[tuple[str, float]]:
        """The lexical index's k best active records for the query: (id, score), best first."""
        return self.log.indexes["lexical"].search(user_id, query, k)

    def dense(self, user_id: str, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The k active records nearest by cosine: (id, similarity), best first."""
        if k <= 0:
            return []
        return self.log.indexes["dense"].search(user_id, np.asarray(vector, dtype=np.float32), k)

    def vectors(self, user_id: str, record_ids: list[str]) -> tuple[list[str], np.ndarray]:
        """(ids, float32 matrix, a row each) of those of the active records that have a vector, ordered by
        id, read in the caller's transaction."""
        with self.log.dialect.cursor(user_id) as sql:
            return self.log.indexes["dense"].vectors(sql, user_id, record_ids)

    def closest(
        self, user_id: str, vector: np.ndarray, record_ids: list[str], k: int
    ) -> list[tuple[str, float]]:
        """The k of the given active records nearest the vector by cosine, scored exactly where the
        vectors are (the database, for Postgres) in the caller's transaction: (id, similarity), best
        first, ties by id. Only scores travel, not the candidates' vectors."""
        if not record_ids or k <= 0:
            return []
        with self.log.dialect.cursor(user_id) as sql:
            return self.log.indexes["dense"].closest(
                sql, user_id, np.asarray(vector, dtype=np.float32), record_ids, k
            )
