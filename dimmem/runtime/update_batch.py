"""What the update path reads and writes: the store itself (a model's decisions, record by record), or,
for a batch the rules decide in one write block, a view of the store made of a few reads at the batch's
start with the batch's own writes laid over them. Each record of the batch sees what a record-by-record
add would have seen (the same candidates, scores and records), without a round trip to the database
per record: on Postgres those round trips were most of the update path's cost.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from time import time

import numpy as np

from dimmem.runtime.stores import RecordLog


class StoreView:
    """The update path's reads and writes, straight on the store (inside the caller's blocks)."""

    def __init__(self, store: RecordLog, user_id: str):
        self.store, self.user = store, user_id

    def exists(self, record_id: str) -> bool:
        return self.store.get(self.user, record_id) is not None

    def keywords(self, kind: str, keys: list[str], limit: int) -> list[str]:
        return self.store.lookup.keywords(self.user, kind, keys, limit)

    def closest(self, vector: np.ndarray, record_ids: list[str], k: int) -> list[tuple[str, float]]:
        return self.store.lookup.closest(self.user, vector, record_ids, k)

    def get(self, record_id: str) -> dict | None:
        return self.store.get(self.user, record_id)

    def get_many(self, record_ids: list[str]) -> dict[str, dict]:
        return self.store.get_many(self.user, record_ids)

    def insert(self, record: dict, vector: np.ndarray) -> None:
        self.store.insert(self.user, record, vector)

    def set_status(self, record_id: str, status: str, action: str) -> None:
        self.store.set_status(self.user, record_id, status, action)

    def revise(self, record_id: str, fields: dict, vector: np.ndarray | None, action: str) -> None:
        self.store.revise(self.user, record_id, fields, vector, action)


class BatchView(StoreView):
    """One batch's view, inside its write block. Read at its start: which of its ids are stored, the active
    records its records' keyword arms reach (`arms(record)`: its (type, keyword) entries of the index,
    each read `limit` deep, and read again deeper in the rare case the batch's own writes leave fewer than
    `limit` of a full one's entries as they were), and the vectors of each record's candidates among
    them: three queries. A stored record
    itself is read when the path first asks for it (the few closest candidates of a record, a speaker's
    tellings), then kept: a batch reaches thousands of records but reads a few of them whole. Each write
    goes to the store and into the view (`added`: active records written or revised by the batch, with
    their vectors; `gone`: records it made inactive)."""

    def __init__(
        self,
        store: RecordLog,
        user_id: str,
        records: list[dict],
        arms: Callable[[dict], list[tuple[str, str]]],
        limit: int,
    ):
        super().__init__(store, user_id)
        self.stored = set(store.get_many(user_id, [r["id"] for r in records]))
        new = [r for r in records if r["id"] not in self.stored]
        entries = {r["id"]: [(kind, k.casefold()) for kind, k in arms(r)] for r in new}
        wanted = sorted({arm for found in entries.values() for arm in found})
        self.limit = limit
        self.arms = store.lookup.keyword_arms(user_id, wanted, limit)
        self.depth: dict[tuple[str, str], int] = {}  # arms read deeper than `limit`
        self.records: dict[str, dict | None] = {}  # stored records read so far (None: not in the store)
        self.added: dict[str, dict] = {}
        self.added_arms: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.gone: set[str] = set()
        self.vectors: dict[str, np.ndarray] = {}
        self.read_vectors: set[str] = set()  # ids whose vectors were asked of the store (some have none)
        candidates = {
            rid
            for r in new
            for rid in self.keywords(
                r["type"], [k for kind, k in entries[r["id"]] if kind == r["type"]], limit
            )
        }
        self._read_vectors(sorted(candidates))

    def exists(self, record_id: str) -> bool:
        return record_id in self.stored

    def keywords(self, kind: str, keys: list[str], limit: int) -> list[str]:
        """`Lookup.keywords` over the view: each arm's first `limit` active records by id, then those
        sharing the most keys first, ties by id, `limit` of them (-1: all)."""
        shared: Counter = Counter()
        for key in _folded(keys):
            ids = self._arm((kind, key))
            shared.update(ids[:limit] if limit >= 0 else ids)
        ranked = sorted(sorted(shared), key=shared.__getitem__, reverse=True)  # (stable: ties stay by id)
        return ranked[:limit] if limit >= 0 else ranked

    def _arm(self, arm: tuple[str, str]) -> list[str]:
        """The arm's active records by id as the batch has left them: its entries read at the start less
        those the batch made inactive or revised, and those the batch wrote. A full read is read again
        deeper in the rare case fewer than `limit` of its entries are left (the entries beyond it come
        after every entry read, so the first `limit` by id are then all known); that read sees the
        batch's writes, whose records are laid over from `added` as for the first."""
        ids, depth = self.arms.get(arm, []), self.depth.get(arm, self.limit)
        while True:
            kept = [i for i in ids if i not in self.gone and i not in self.added]
            if self.limit < 0 or len(ids) < depth or len(kept) >= self.limit:
                break
            depth += self.limit - len(kept)
            ids = self.store.lookup.keyword_arms(self.user, [arm], depth)[arm]
            self.arms[arm], self.depth[arm] = ids, depth
        added = self.added_arms.get(arm)
        return sorted([*kept, *added]) if added else kept

    def closest(self, vector: np.ndarray, record_ids: list[str], k: int) -> list[tuple[str, float]]:
        """`Lookup.closest` over the view: the k nearest by cosine, ties by id."""
        self._read_vectors([i for i in record_ids if i not in self.added])
        ids = sorted(i for i in record_ids if i in self.vectors)
        if not ids or k <= 0:
            return []
        scores = np.stack([self.vectors[i] for i in ids]) @ np.asarray(vector, dtype=np.float32)
        return [(ids[i], float(scores[i])) for i in np.argsort(-scores, kind="stable")[:k]]

    def get(self, record_id: str) -> dict | None:
        return self.get_many([record_id]).get(record_id)

    def vector(self, record_id: str) -> np.ndarray | None:
        """An active record's stored vector (or the one the batch gave it)."""
        if record_id not in self.added:
            self._read_vectors([record_id])
        return self.vectors.get(record_id)

    def get_many(self, record_ids: list[str]) -> dict[str, dict]:
        unread = [rid for rid in record_ids if rid not in self.added and rid not in self.records]
        if unread:  # one query for all a step asks that the view has not read
            found = self.store.get_many(self.user, unread)
            self.records.update((rid, found.get(rid)) for rid in unread)
        return {
            rid: found
            for rid in record_ids
            if (found := self.added.get(rid) or self.records.get(rid)) is not None
        }

    def insert(self, record: dict, vector: np.ndarray) -> None:
        super().insert(record, vector)
        self.stored.add(record["id"])
        self._add({**record, "created": time(), "status": "active", "version": 1}, vector)

    def set_status(self, record_id: str, status: str, action: str) -> None:
        super().set_status(record_id, status, action)
        self._drop(record_id)
        self.gone.add(record_id)

    def revise(self, record_id: str, fields: dict, vector: np.ndarray | None, action: str) -> None:
        current = self.get(record_id)  # before the write: the version it revises
        super().revise(record_id, fields, vector, action)
        self._drop(record_id)
        self._add({**current, **fields, "version": current["version"] + 1}, vector)

    def _read_vectors(self, record_ids: list[str]) -> None:
        unread = [rid for rid in record_ids if rid not in self.read_vectors]
        if unread:
            self.vectors.update(self.store.lookup.vectors(self.user, unread))
            self.read_vectors.update(unread)

    def _add(self, record: dict, vector: np.ndarray | None) -> None:
        self.added[record["id"]] = record
        if vector is not None:
            self.vectors[record["id"]] = np.asarray(vector, dtype=np.float32)
        for key in _folded(record["keywords"]):
            self.added_arms[(record["type"], key)].add(record["id"])

    def _drop(self, record_id: str) -> None:
        record = self.added.pop(record_id, None)
        self.vectors.pop(record_id, None)
        self.read_vectors.discard(record_id)  # asked again, it is read from the store as it now is
        for key in _folded(record["keywords"]) if record else ():
            self.added_arms[(record["type"], key)].discard(record_id)


def _folded(keys: list[str]) -> list[str]:
    """The keys as the lookup index holds them: casefolded, each once, sorted."""
    return sorted({k.casefold() for k in keys})
