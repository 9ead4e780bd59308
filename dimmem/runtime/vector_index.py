"""The SQLite store's dense index (`SQLiteStore.dense`): each user's vectors held in memory and kept in
step with the store.

Loading a user's vectors from SQLite for every query would cost more than the search itself, so the
index keeps them, and before each search compares the store's change stamp for the user
(`SQLiteStore.vector_state`, bumped by every writer process in the same transaction as the write):
new vectors are appended, a removal (update, supersede, merge, delete) reloads the user.

Search is exact (one matrix product) below `ann_min_records` and a faiss HNSW graph (inner product on
unit vectors = cosine) at and above it; BENCHMARKS.md shows where the crossover lies.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class _UserVectors:
    stamp: tuple[int, int] = (0, 0)
    last_rowid: int = 0
    ids: list[str] = field(default_factory=list)
    chunks: list[np.ndarray] = field(default_factory=list)
    matrix: np.ndarray | None = None
    ann: object | None = None  # faiss.IndexHNSWFlat over `matrix`'s rows, in the same order
    ann_rows: int = 0


class VectorIndex:
    def __init__(
        self,
        store: Any,  # the SQLiteStore that owns the index (`vector_state`, `vectors_after`)
        ann_min_records: int = 200_000,
        hnsw_m: int = 32,
        ef_construction: int = 80,
        ef_search: int = 128,
    ):
        self.store, self.ann_min = store, ann_min_records
        self.hnsw_m, self.ef_construction, self.ef_search = hnsw_m, ef_construction, ef_search
        self.users: dict[str, _UserVectors] = {}
        self.lock = threading.Lock()

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
        stamp = self.store.vector_state(user_id)
        if stamp != user.stamp:
            if stamp[1] != user.stamp[1]:  # something was removed: start over
                user = _UserVectors()
            rowids, ids, matrix = self.store.vectors_after(user_id, user.last_rowid)
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
