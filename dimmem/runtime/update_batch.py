"""What the update path reads and writes: the store itself (a model's decisions, record by record), or,
for a batch the rules decide in one write block, a view of the store made of a few reads at the batch's
start with the batch's own writes laid over them. Each record of the batch sees what a record-by-record
add would have seen (the same candidates, scores and records), without a round trip to the database
per record: on Postgres those round trips were most of the update path's cost.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from itertools import filterfalse
from time import time

import numpy as np

from dimmem.runtime.keyword_arms import KeywordArms
from dimmem.runtime.stores import RecordLog
from dimmem.runtime.stores.vector_rows import VectorRows


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
    each `limit` deep, from `cache`, which reads from the store only what it does not hold; an arm is read
    again deeper in the rare case the batch's own writes leave fewer than `limit` of a full one's entries
    as they were), and the vectors of each record's candidates among them. A stored record
    itself is read when the path first asks for it (the few closest candidates of a record, a speaker's
    tellings), then kept: a batch reaches thousands of records but reads a few of them whole. Each write
    goes to the store and into the view (`added`: active records written or revised by the batch, with
    their vectors; `gone`: records it made inactive). An arm whose ids read hold a record the batch
    changed is `dirty` (its ids are filtered), and a write that changes an arm's first `limit` entries
    bumps its `version`: a record's candidates are found once for the vectors read at the start and
    found again, when it is decided, only if the batch has changed one of its arms since."""

    def __init__(
        self,
        store: RecordLog,
        user_id: str,
        records: list[dict],
        arms: Callable[[dict], list[tuple[str, str]]],
        limit: int,
        cache: KeywordArms,
    ):
        super().__init__(store, user_id)
        self.stored = set(store.get_many(user_id, [r["id"] for r in records]))
        new = [r for r in records if r["id"] not in self.stored]
        entries = [[(kind, k.casefold()) for kind, k in arms(r)] for r in new]  # (an id may come twice)
        wanted = sorted({arm for found in entries for arm in found})
        self.limit = limit
        read = cache.read(user_id, wanted, limit)
        self.arms = {arm: ids for arm, (ids, _) in read.items()}
        self.depth = {arm: depth for arm, (_, depth) in read.items()}  # entries each arm's ids stand for
        self.records: dict[str, dict | None] = {}  # stored records read so far (None: not in the store)
        self.added: dict[str, dict] = {}
        self.added_arms: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.gone: set[str] = set()
        self.dirty: set[tuple[str, str]] = set()  # arms whose ids read may hold a record since changed
        self.version: Counter = Counter()  # per arm: writes that changed its first `limit` entries
        self.edge: dict[tuple[str, str], str] = {}  # per arm: its `limit`-th entry, where known
        self.found: dict[tuple, tuple[tuple[int, ...], list[str]]] = {}  # keywords' answers, by arms
        self.vectors = VectorRows()
        self.read_vectors: set[str] = set()  # ids whose vectors were asked of the store (some have none)
        self.first: dict[str, list[str]] = {}  # each new record's candidates as the batch starts
        for r, found in zip(new, entries):
            candidates = self.keywords(r["type"], [k for kind, k in found if kind == r["type"]], limit)
            self.first.setdefault(r["id"], candidates)  # (an id's first record is decided, not the next)
        self._read_vectors(sorted({rid for found in self.first.values() for rid in found}))

    def prefetch(self, vectors: dict[str, np.ndarray], k: int) -> None:
        """Read in one query the stored records the path would read one new record at a time: each one's
        `k` closest candidates as the batch starts (where a read is a round trip to a server, a batch's
        writes then go out in one pipeline instead of waiting on a read per record)."""
        wanted: set[str] = set()
        for rid, found in self.first.items():
            if rid in vectors and found:
                wanted.update(r for r, _ in self.closest(vectors[rid], found, k))
        self.get_many(sorted(wanted))

    def exists(self, record_id: str) -> bool:
        return record_id in self.stored

    def keywords(self, kind: str, keys: list[str], limit: int) -> list[str]:
        """`Lookup.keywords`' records over the view, in no order (the update path takes them as a set):
        each arm's first `limit` active records by id, of those the `limit` sharing the most keys, ties
        by id (-1: all). The answer is kept while the batch's writes leave its arms as they were (the
        list returned is not to be changed)."""
        arms = [(kind, key) for key in _folded(keys)]
        asked, versions = tuple(arms), tuple(self.version[arm] for arm in arms)
        known = self.found.get(asked) if limit == self.limit else None  # (edges are `self.limit`'s)
        if known is not None and known[0] == versions:
            return known[1]
        shared: Counter = Counter()
        for arm in arms:
            ids = self._arm(arm)
            if limit == self.limit and len(ids) >= limit > 0:  # (ids past it cannot change the answer)
                self.edge[arm] = ids[limit - 1]
            shared.update(ids[:limit] if limit >= 0 else ids)
        ranked = list(shared)
        if 0 <= limit < len(ranked):  # by count, ties by id: a stable sort keeps the id order of equals
            ranked.sort()
            ranked.sort(key=shared.__getitem__, reverse=True)
            del ranked[limit:]
        if limit == self.limit:
            self.found[asked] = (versions, ranked)
        return ranked

    def _arm(self, arm: tuple[str, str]) -> list[str]:
        """The arm's active records by id as the batch has left them: its entries read at the start less
        those the batch made inactive or revised, and those the batch wrote. A full read is read again
        deeper in the rare case fewer than `limit` of its entries are left (the entries beyond it come
        after every entry read, so the first `limit` by id are then all known); that read sees the
        batch's writes, whose records are laid over from `added` as for the first."""
        ids, depth = self.arms.get(arm, []), self.depth.get(arm, self.limit)
        while True:
            if arm in self.dirty:
                kept = [i for i in ids if i not in self.gone and i not in self.added]
            else:  # (the usual case: none of its ids read has changed)
                kept = ids
            if self.limit < 0 or len(ids) < depth or len(kept) >= self.limit:
                break
            depth += self.limit - len(kept)
            ids = self.store.lookup.keyword_arms(self.user, [arm], depth)[arm]
            self.arms[arm], self.depth[arm] = ids, depth
            self.dirty.add(arm)  # (read after the batch's writes: it may hold the batch's own records)
        added = self.added_arms.get(arm)
        return sorted([*kept, *added]) if added else kept

    def closest(self, vector: np.ndarray, record_ids: list[str], k: int) -> list[tuple[str, float]]:
        """`Lookup.closest` over the view: the k nearest by cosine, ties by id."""
        self._read_vectors(list(filterfalse(self.added.__contains__, record_ids)))
        ids = sorted(filter(self.vectors.row.__contains__, record_ids))
        if not ids or k <= 0:
            return []
        scores = self.vectors.rows(ids) @ np.asarray(vector, dtype=np.float32)
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
        self._changing(record_id)
        super().set_status(record_id, status, action)
        self._drop(record_id)
        self.gone.add(record_id)

    def revise(self, record_id: str, fields: dict, vector: np.ndarray | None, action: str) -> None:
        self._changing(record_id)
        current = self.get(record_id)  # before the write: the version it revises
        super().revise(record_id, fields, vector, action)
        self._drop(record_id)
        self._add({**current, **fields, "version": current["version"] + 1}, vector)

    def _changing(self, record_id: str) -> None:
        """Before an active record is revised or made inactive: mark the arms of its stored version (read
        now if the batch has not), whose ids read may hold it. A record the batch inserted is in none."""
        if record_id not in self.records and record_id not in self.added:
            self.get(record_id)
        stored = self.records.get(record_id)
        for key in _folded(stored["keywords"]) if stored else ():
            self.dirty.add((stored["type"], key))
            self._moved((stored["type"], key), record_id)

    def _moved(self, arm: tuple[str, str], record_id: str) -> None:
        """The record came into the arm or left it: a change to its first `limit` entries unless the arm
        holds `limit` entries before it."""
        edge = self.edge.get(arm)
        if edge is None or record_id <= edge:
            self.version[arm] += 1
            self.edge.pop(arm, None)

    def _read_vectors(self, record_ids: list[str]) -> None:
        unread = list(filterfalse(self.read_vectors.__contains__, record_ids))
        if unread:
            self.vectors.extend(*self.store.lookup.vectors(self.user, unread))
            self.read_vectors.update(unread)

    def _add(self, record: dict, vector: np.ndarray | None) -> None:
        self.added[record["id"]] = record
        if vector is not None:
            self.vectors.put(record["id"], vector)
        for key in _folded(record["keywords"]):
            self.added_arms[(record["type"], key)].add(record["id"])
            self._moved((record["type"], key), record["id"])

    def _drop(self, record_id: str) -> None:
        record = self.added.pop(record_id, None)
        self.vectors.pop(record_id)
        self.read_vectors.discard(record_id)  # asked again, it is read from the store as it now is
        for key in _folded(record["keywords"]) if record else ():
            self.added_arms[(record["type"], key)].discard(record_id)
            self._moved((record["type"], key), record_id)


def _folded(keys: list[str]) -> list[str]:
    """The keys as the lookup index holds them: casefolded, each once, sorted."""
    return sorted({k.casefold() for k in keys})
