"""The dense index `memory` (SQLite): the active records' vectors in the file's `vectors` table, and each
user's held in memory, kept in step with the file.

Loading a user's vectors from SQLite for every query would cost more than the search itself, so the
index keeps them, and before each search compares the user's epoch and counts of vectors appended and
removed (`user_stats`, bumped by every writer process in the same transaction as the write): new vectors are
appended, a removal (update, supersede, merge, delete) reloads the user. It reads the file through a
connection of its own (WAL: what has committed, never another thread's open transaction), so a search's
dense path needs no caller's lock; an in-memory database has one connection only.

Search is exact (one matrix product) below `ann_min_records` and a faiss HNSW graph (inner product on
unit vectors = cosine) at and above it; BENCHMARKS.md shows where the crossover lies.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dimmem.runtime.stores.base import Sql, chunks


def _matrix(blobs: list[bytes]) -> np.ndarray:
    if not blobs:
        return np.zeros((0, 0), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1)


@dataclass
class _UserVectors:
    stamp: tuple[int, int, int] = (0, 0, 0)
    last_rowid: int = 0
    ids: list[str] = field(default_factory=list)
    chunks: list[np.ndarray] = field(default_factory=list)
    matrix: np.ndarray | None = None
    ann: object | None = None  # faiss.IndexHNSWFlat over `matrix`'s rows, in the same order
    ann_rows: int = 0


class MemoryVectors:
    name, kind = "memory", "dense"

    def __init__(
        self,
        dialect: Any,  # the log's SQLiteDialect
        ann_min_records: int = 200_000,
        hnsw_m: int = 32,
        ef_construction: int = 80,
        ef_search: int = 128,
    ):
        self.ann_min = ann_min_records
        self.hnsw_m, self.ef_construction, self.ef_search = hnsw_m, ef_construction, ef_search
        self.users: dict[str, _UserVectors] = {}
        self.lock = threading.Lock()
        self.concurrent = dialect.path != ":memory:"
        self.db = dialect.connect() if self.concurrent else dialect.db

    @classmethod
    def from_options(cls, log: Any, options: dict) -> MemoryVectors:
        return cls(log.dialect, ann_min_records=options.get("ann_min_records", 200_000))

    # --- in the log's write transaction ----------------------------------------------------------
    def upsert(self, sql: Sql, user_id: str, record: dict, vector: np.ndarray | None) -> None:
        if vector is None:  # (a copied record without a vector: found by the other paths only)
            return
        sql.run(
            "INSERT INTO vectors (record_id, user_id, vec) VALUES (?,?,?)",
            (record["id"], user_id, np.asarray(vector, dtype=np.float32).tobytes()),
        )
        sql.run("UPDATE user_stats SET appended = appended + 1 WHERE {user}", (user_id,))

    def remove(self, sql: Sql, user_id: str, record_id: str) -> None:
        sql.run("DELETE FROM vectors WHERE {user} AND record_id=?", (user_id, record_id))
        sql.run("UPDATE user_stats SET removed = removed + 1 WHERE {user}", (user_id,))

    def clear(self, sql: Sql, user_id: str) -> None:
        sql.run("DELETE FROM vectors WHERE {user}", (user_id,))
        sql.run("UPDATE user_stats SET removed = removed + 1 WHERE {user}", (user_id,))

    def vectors(self, sql: Sql, user_id: str, record_ids: list[str] | None) -> tuple[list[str], np.ndarray]:
        """(ids, matrix) of the given (None: all) active records' vectors, ordered by id."""
        rows = []  # (id, bytes): the update path reads thousands a batch, no dict each
        for chunk in [None] if record_ids is None else chunks(record_ids):
            only = "" if chunk is None else f" AND record_id IN ({','.join('?' * len(chunk))})"
            rows += sql.tuples(
                f"SELECT record_id, vec FROM vectors WHERE {{user}}{only}", (user_id, *(chunk or ()))
            )
        rows.sort()
        return [r[0] for r in rows], _matrix([r[1] for r in rows])

    def closest(
        self, sql: Sql, user_id: str, query: np.ndarray, record_ids: list[str], k: int
    ) -> list[tuple[str, float]]:
        """The k of the given records nearest the query: read in the caller's transaction, not from the
        held matrix, which follows only what has committed."""
        ids, matrix = self.vectors(sql, user_id, record_ids)
        if not ids:
            return []
        scores = matrix @ query
        return [(ids[i], float(scores[i])) for i in np.argsort(-scores, kind="stable")[:k]]

    def close(self) -> None:
        if self.concurrent:
            self.db.close()

    # --- searching ------------------------------------------------------------------------------------
    def state(self, user_id: str) -> tuple[int, int, int]:
        """(epoch, vectors appended, vectors removed) so far for the user: the change stamp the index
        follows."""
        row = self.db.execute(
            "SELECT epoch, appended, removed FROM user_stats WHERE user_id=?", (user_id,)
        ).fetchone()
        return tuple(row) if row else (0, 0, 0)

    def vectors_after(self, user_id: str, rowid: int) -> tuple[list[int], list[str], np.ndarray]:
        """The user's vectors stored after `rowid` (0: all), in storage order: (rowids, ids, matrix)."""
        rows = self.db.execute(
            "SELECT rowid, record_id, vec FROM vectors WHERE user_id=? AND rowid>? ORDER BY rowid",
            (user_id, rowid),
        ).fetchall()
        return [r[0] for r in rows], [r[1] for r in rows], _matrix([r[2] for r in rows])

    def search(self, user_id: str, query: np.ndarray, depth: int) -> list[tuple[str, float]]:
        """The `depth` nearest records by cosine, best first."""
        with self.lock:
            user = self._refresh(user_id)
            if not user.ids:
                return []
            if len(user.ids) >= self.ann_min:
                return self._ann_search(user, query, depth)
            scores = user.matrix @ query.astype(np.float32)
            top = np.argpartition(-scores, depth)[:depth] if depth < len(scores) else np.arange(len(scores))
            top = top[np.argsort(-scores[top], kind="stable")]
            return [(user.ids[i], float(scores[i])) for i in top]

    def _refresh(self, user_id: str) -> _UserVectors:
        user = self.users.get(user_id) or _UserVectors()
        stamp = self.state(user_id)
        if stamp != user.stamp:
            if stamp[::2] != user.stamp[::2]:  # something was removed, or the user's row is new: start over
                user = _UserVectors()
            rowids, ids, matrix = self.vectors_after(user_id, user.last_rowid)
            if ids:
                user.ids += ids
                user.chunks.append(matrix)
                user.last_rowid = rowids[-1]
            user.stamp = stamp
        if user.chunks:
            user.matrix = np.concatenate(([user.matrix] if user.matrix is not None else []) + user.chunks)
            user.chunks = []
        self.users[user_id] = user
        return user

    def _ann_search(self, user: _UserVectors, query: np.ndarray, depth: int) -> list[tuple[str, float]]:
        import faiss

        if user.ann is None:
            user.ann = faiss.IndexHNSWFlat(user.matrix.shape[1], self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            user.ann.hnsw.efConstruction = self.ef_construction
        if user.ann_rows < len(user.ids):  # HNSW takes additions; only new rows are inserted
            user.ann.add(np.ascontiguousarray(user.matrix[user.ann_rows :]))
            user.ann_rows = len(user.ids)
        user.ann.hnsw.efSearch = max(self.ef_search, depth)
        scores, positions = user.ann.search(query.astype(np.float32).reshape(1, -1), depth)
        return [(user.ids[p], float(s)) for p, s in zip(positions[0], scores[0]) if p >= 0]
