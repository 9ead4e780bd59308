"""The dense index `memory` (SQLite): the active records' vectors in the file's `vectors` table, and each
user's held in memory, kept in step with the record log.

Loading a user's vectors from SQLite for every query would cost more than the search itself, so the
index keeps them and follows the log as the lexical index does (`bm25`): before each use it reads the
user's change stamp (epoch, seq) and, when it moved, the records indexed or unindexed since with their
vectors, in one snapshot. A changed record's row is tombstoned and an active one's new vector appended;
a user is read from scratch on first use and when the store replaced the user (a new epoch), and its rows
are compacted in memory once most are tombstones. It reads the file through a connection of its own
(WAL: what has committed, never another thread's open transaction), so a search's dense path needs no
caller's lock; an in-memory database has one connection only. Least recently used users are dropped
beyond `max_vectors` rows held in all.

The update path's reads of candidates' vectors (`vectors`, `closest`) come from the held rows when they
are exactly what the caller's transaction sees (the same stamp), else from the table.

Search is exact (one matrix product) below `ann_min_records` and a faiss HNSW graph (inner product on
unit vectors = cosine) at and above it, tombstoned rows filtered out; BENCHMARKS.md shows where the
crossover lies.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from dimmem.runtime.stores.base import Sql, change_stamp, chunks
from dimmem.runtime.stores.vector_rows import VectorRows

_STAMP = "SELECT epoch, seq FROM user_stats WHERE user_id=?"  # on the index's own connection
# the records indexed or unindexed after a change number (0: the active ones), with their vectors if any
_CHANGES = (
    "SELECT r.id, r.status, v.vec FROM records r "
    "LEFT JOIN vectors v ON v.user_id = r.user_id AND v.record_id = r.id "
    "WHERE r.user_id=? AND r.seq > ? AND (r.status = 'active' OR ? > 0) ORDER BY r.seq"
)


def _matrix(blobs: list[bytes]) -> np.ndarray:
    if not blobs:
        return np.zeros((0, 0), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1)


class _UserVectors(VectorRows):
    """One user's vectors: rows in the order their records were last indexed, tombstones for rows whose
    record changed since."""

    def __init__(self) -> None:
        super().__init__()
        self.stamp: tuple[int, int] = (-1, -1)  # (epoch, seq) read last; never a store's
        self.ids: list[str] = []  # record id of each row, tombstoned ones too
        self.live = np.zeros(0, dtype=bool)
        self.ann: Any = None  # faiss.IndexHNSWFlat over the first `ann_rows` rows, in the same order
        self.ann_rows = 0

    def drop(self, record_id: str) -> None:
        row = self.pop(record_id)
        if row is not None:
            self.live[row] = False

    def extend(self, record_ids: list[str], matrix: np.ndarray) -> None:
        start = self.used
        super().extend(record_ids, matrix)
        self.live[start : self.used] = True
        self.ids += record_ids

    def _grow(self, capacity: int, dimension: int) -> None:
        super()._grow(capacity, dimension)
        live = np.zeros(capacity, dtype=bool)
        live[: self.used] = self.live[: self.used]
        self.live = live

    def compact(self) -> None:
        """Only the live rows, in their order (the graph is built again on the next search that needs it)."""
        keep = np.flatnonzero(self.live[: self.used])
        matrix, ids, stamp = self.matrix[keep], [self.ids[i] for i in keep], self.stamp
        self.__init__()
        self.stamp = stamp
        self.extend(ids, matrix)

    def scores(self, query: np.ndarray) -> np.ndarray:
        """Each row's inner product with the query; -inf for a tombstone."""
        n = self.used
        scores = self.matrix[:n] @ query
        if len(self.row) < n:
            scores[~self.live[:n]] = -np.inf
        return scores


class MemoryVectors:
    name, kind = "memory", "dense"

    def __init__(
        self,
        dialect: Any,  # the log's SQLiteDialect
        ann_min_records: int = 200_000,
        hnsw_m: int = 32,
        ef_construction: int = 80,
        ef_search: int = 128,
        max_vectors: int = 2_000_000,
    ):
        """`max_vectors`: rows held in all users (~3 GB at 384 dimensions), least recently used users
        dropped beyond it."""
        self.ann_min = ann_min_records
        self.hnsw_m, self.ef_construction, self.ef_search = hnsw_m, ef_construction, ef_search
        self.max_vectors = max_vectors
        self.users: OrderedDict[str, _UserVectors] = OrderedDict()
        self.held = 0  # rows held, all users
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

    def remove(self, sql: Sql, user_id: str, record_id: str) -> None:
        sql.run("DELETE FROM vectors WHERE {user} AND record_id=?", (user_id, record_id))

    def clear(self, sql: Sql, user_id: str) -> None:
        sql.run("DELETE FROM vectors WHERE {user}", (user_id,))

    def vectors(self, sql: Sql, user_id: str, record_ids: list[str] | None) -> tuple[list[str], np.ndarray]:
        """(ids, matrix) of the given (None: all) active records' vectors, ordered by id, as the caller's
        transaction sees them: from the held rows when they are as of its stamp, else from the table."""
        if record_ids is not None and self.concurrent:
            stamp = change_stamp(sql, user_id)
            with self.lock:
                user = self._refresh(user_id)
                if user.stamp == stamp:
                    ids = sorted(filter(user.row.__contains__, set(record_ids)))
                    return ids, user.rows(ids)
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
        """The k of the given records nearest the query, as the caller's transaction sees them."""
        ids, matrix = self.vectors(sql, user_id, record_ids)
        if not ids:
            return []
        scores = matrix @ query
        return [(ids[i], float(scores[i])) for i in np.argsort(-scores, kind="stable")[:k]]

    def close(self) -> None:
        if self.concurrent:
            self.db.close()

    # --- searching ------------------------------------------------------------------------------------
    def search(self, user_id: str, query: np.ndarray, depth: int) -> list[tuple[str, float]]:
        """The `depth` nearest records by cosine, best first."""
        with self.lock:
            user = self._refresh(user_id)
            depth = min(depth, len(user.row))
            if depth <= 0:
                return []
            if len(user.row) >= self.ann_min:
                return self._ann_search(user, query, depth)
            scores = user.scores(query.astype(np.float32))
            top = np.argpartition(-scores, depth - 1)[:depth] if depth < len(scores) else np.arange(depth)
            top = top[np.argsort(-scores[top], kind="stable")]
            return [(user.ids[i], float(scores[i])) for i in top]

    def _refresh(self, user_id: str) -> _UserVectors:
        """The user's held rows brought up to the last commit (under `self.lock`)."""
        user = self.users.pop(user_id, None) or _UserVectors()
        held = len(user)
        if self.concurrent:
            self.db.execute("BEGIN")  # the stamp and the changes from one snapshot
        try:
            found = self.db.execute(_STAMP, (user_id,)).fetchone()
            stamp = tuple(found) if found else (0, 0)
            if stamp != user.stamp:
                if stamp[0] != user.stamp[0] or stamp[1] < user.stamp[1]:  # first use, or a replaced user
                    user = _UserVectors()
                changed = self.db.execute(
                    _CHANGES, (user_id, max(user.stamp[1], 0), user.stamp[1])
                ).fetchall()
        finally:
            if self.concurrent:
                self.db.execute("COMMIT")
        if stamp != user.stamp:
            fresh: dict[str, bytes] = {}  # the changed records' vectors now, in change order
            for rid, status, vec in changed:
                user.drop(rid)
                fresh.pop(rid, None)
                if status == "active" and vec is not None:
                    fresh[rid] = vec
            user.extend(list(fresh), _matrix(list(fresh.values())))
            user.stamp = stamp
            if len(user.row) < len(user) // 2:  # mostly tombstones
                user.compact()
        if user.ids:  # (a user without vectors is not kept: unknown users must not grow the map)
            self.users[user_id] = user  # the most recently used last
        self._bound(len(user) - held)
        return user

    def _bound(self, grown: int) -> None:
        self.held += grown
        if self.held > self.max_vectors:  # (a running count; exact again before anyone is dropped)
            self.held = sum(len(u) for u in self.users.values())
            while len(self.users) > 1 and self.held > self.max_vectors:
                self.held -= len(self.users.popitem(last=False)[1])

    def _ann_search(self, user: _UserVectors, query: np.ndarray, depth: int) -> list[tuple[str, float]]:
        import faiss

        if user.ann is None:
            user.ann = faiss.IndexHNSWFlat(user.matrix.shape[1], self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            user.ann.hnsw.efConstruction = self.ef_construction
        if user.ann_rows < len(user):  # HNSW takes additions; only new rows are inserted
            user.ann.add(np.ascontiguousarray(user.matrix[user.ann_rows : len(user)]))
            user.ann_rows = len(user)
        params = faiss.SearchParametersHNSW(efSearch=max(self.ef_search, depth))
        if len(user.row) < len(user):  # tombstones are passed over
            bits = np.packbits(user.live[: len(user)], bitorder="little")
            params.sel = faiss.IDSelectorBitmap(len(user), faiss.swig_ptr(bits))
        scores, positions = user.ann.search(query.astype(np.float32).reshape(1, -1), depth, params=params)
        return [(user.ids[p], float(s)) for p, s in zip(positions[0], scores[0]) if p >= 0]
