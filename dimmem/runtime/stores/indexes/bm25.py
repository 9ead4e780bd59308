"""The lexical index `bm25` (`Lookup.lexical`, both backends): each user's postings held in memory and
scored by BM25 with numpy, kept in step with the record log.

The log is the truth. Every write that indexes or unindexes a record stamps the record with the user's
next change number (`seq`) in the same transaction, so a committed write is seen by the next search and a
crashed one by none. Before each search the index reads the user's stamp (epoch, seq) and, when it moved,
the records changed since, both from the log's tables through its dialect: a changed record's old
postings are dropped (tombstoned) and an active one's new postings, from `lexical.document`, appended.
A user is read from scratch on first use, when the store replaced the user wholesale (a new epoch) and
when over half of the user's positions are tombstones.

Scores are BM25 (k1 1.2, b 0.75, FTS5's IDF) from the user's own active records, divided by the query's
ceiling (what a record holding every query term, and alone, would score): comparable across queries and
with the other retrieval paths' scores, which fusion adds. No other user's records move them, and a
search costs the postings of the query's terms in this user, whatever else the store holds. Least
recently searched users are dropped beyond `max_postings` postings in all.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import OrderedDict
from typing import Any

import numpy as np

from dimmem.runtime import lexical

K1, B = 1.2, 0.75  # the BM25 constants of SQLite FTS5 and most engines


class _User:
    """One user's postings: record positions in the order they were indexed, tombstones for positions
    whose record changed since, and per term the positions and term frequencies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.stamp: tuple[int, int] = (-1, -1)  # (epoch, seq) read last; never a store's
        self.ids: list[str] = []
        self.where: dict[str, int] = {}  # record id -> its live position
        self.alive, self.dl = array("b"), array("i")
        self.postings: dict[str, tuple[array, array]] = {}
        self.tokens = self.size = 0  # live records' terms; postings held (tombstoned ones too)

    def add(self, record: dict) -> None:
        counts = lexical.document(record)
        position = len(self.ids)
        for term, tf in counts.items():
            if term not in self.postings:
                self.postings[term] = (array("i"), array("i"))
            positions, tfs = self.postings[term]
            positions.append(position)
            tfs.append(tf)
        dl = sum(counts.values())
        self.ids.append(record["id"])
        self.where[record["id"]] = position
        self.alive.append(1)
        self.dl.append(dl)
        self.tokens, self.size = self.tokens + dl, self.size + len(counts)

    def drop(self, record_id: str) -> None:
        position = self.where.pop(record_id, None)
        if position is not None:
            self.alive[position] = 0
            self.tokens -= self.dl[position]

    def top(self, wanted: list[str], k: int) -> list[tuple[str, float]]:
        """The k best live records: (id, BM25 score / the query's ceiling), best first, ties by id. The
        ceiling is what a record would score that holds every query term, infinitely often, as the only
        record holding it: scores lie in [0, 1) and say how much of the query a record matches, and how
        rarely; a name most of the user's records share scores near 0 however it ranks."""
        alive = np.frombuffer(self.alive, dtype=np.int8)
        dl = np.frombuffer(self.dl, dtype=np.int32)
        n = max(len(self.where), 1)  # the live records
        avgdl = max(self.tokens / n, 1.0)
        all_positions, all_weights = [], []
        ceiling = len(wanted) * math.log((n + 0.5) / 0.5) * (K1 + 1)
        for term in wanted:  # in term order: each record's score sums its terms in the same order
            if term not in self.postings:
                continue
            positions, tfs = (np.frombuffer(a, dtype=np.int32) for a in self.postings[term])
            if len(self.where) < len(self.ids):  # tombstones: only live positions count
                live = alive[positions] == 1
                positions, tfs = positions[live], tfs[live]
            if not len(positions):
                continue
            df = len(positions)
            idf = max(math.log((n - df + 0.5) / (df + 0.5)), 1e-6)  # floored: a common term still counts
            all_positions.append(positions)
            all_weights.append(idf * tfs * (K1 + 1) / (tfs + K1 * (1 - B + B * dl[positions] / avgdl)))
        if not all_positions:
            return []
        scores = np.bincount(np.concatenate(all_positions), weights=np.concatenate(all_weights))
        # the matching records only: numpy's partition is ~25x slower on an array of mostly equal values
        # (the zeros of the records no term matched) than on the matches alone
        chosen = np.flatnonzero(scores > 0)
        if len(chosen) > k:  # the k best, and any tied with them
            floor = np.partition(scores[chosen], -k)[-k]
            chosen = chosen[scores[chosen] >= floor]
        ranked = sorted(((self.ids[i], float(scores[i])) for i in chosen), key=lambda x: (-x[1], x[0]))
        return [(rid, score / ceiling) for rid, score in ranked[:k]]


class LexicalIndex:
    name, kind = "bm25", "lexical"
    concurrent = False  # reads the log through the caller's connection

    def __init__(self, log: Any, max_postings: int = 50_000_000):
        """`log`: the record log that owns the index (its tables are read through its dialect)."""
        self.log, self.max_postings = log, max_postings
        self.users: OrderedDict[str, _User] = OrderedDict()
        self.held = 0  # postings held, all users
        self.lock = threading.Lock()  # the users map and `held`; each user has a lock of its own

    @classmethod
    def from_options(cls, log: Any, options: dict) -> LexicalIndex:
        return cls(log)

    # the log's change numbers say what to re-read: nothing to write in its transactions
    def upsert(self, sql: Any, user_id: str, record: dict, vector: Any) -> None:
        pass

    def remove(self, sql: Any, user_id: str, record_id: str) -> None:
        pass

    def clear(self, sql: Any, user_id: str) -> None:
        pass

    def close(self) -> None:
        pass

    def search(self, user_id: str, query: str, k: int) -> list[tuple[str, float]]:
        """The user's k best active records for the query (any term matching): (id, BM25 score), best
        first, ties by id."""
        wanted = sorted(lexical.terms(query))
        if not wanted or k <= 0:
            return []
        with self.lock:
            user = self.users.setdefault(user_id, _User())
            self.users.move_to_end(user_id)
        with user.lock:
            before = user.size
            self._refresh(user_id, user)
            hits = user.top(wanted, k)
            grown = user.size - before
        with self.lock:
            if not user.ids and self.users.get(user_id) is user:  # no records: nothing worth keeping
                del self.users[user_id]  # (searches for unknown users must not grow the map)
            self.held += grown
            if self.held > self.max_postings:  # (a running count; exact again before anyone is dropped)
                self.held = sum(u.size for u in self.users.values())
                while len(self.users) > 1 and self.held > self.max_postings:  # least recently searched
                    self.held -= self.users.popitem(last=False)[1].size
        return hits

    def _refresh(self, user_id: str, user: _User) -> None:
        stamp = self.log.lookup.change_stamp(user_id)
        if stamp == user.stamp:
            return
        if stamp[0] != user.stamp[0] or stamp[1] < user.stamp[1] or len(user.where) < len(user.ids) // 2:
            user.reset()  # from scratch: first use, a replaced user, or mostly tombstones
        for record in self.log.lookup.changes(user_id, max(user.stamp[1], 0), lexical.FIELDS):
            user.drop(record["id"])
            if record["status"] == "active":
                user.add(record)
        user.stamp = stamp
