"""The keyword index's arms as the update path read them, kept between its batches.

A batch of the update path starts by reading the (type, keyword) arms of its records' keywords, each up
to `max_candidates` entries deep. As a user's store grows, the common keywords' arms are full, so every
batch read tens of thousands of index rows, most of them the same rows the batch before had read: the
path's cost per record grew with the user. This cache keeps each arm as read and follows the record log
as the in-process indexes do (`stores.indexes.bm25`): at each batch's start, inside its write block, it
reads the user's change stamp and, when it moved, the records indexed or unindexed since (the previous
batch's own writes, and any other writer's), and lays them over the arms it holds. Only arms it has not
read, or that its replay left shorter than asked, are read from the store.

An arm is held as the ids of its active records in id order that the cache knows, and a bound: every
active record of the arm with an id up to the bound is among them (no bound: the whole arm). So the
first `n` ids are the arm's first `n` entries by id, as the store would answer them, while `n` known
ids remain; a replayed record beyond the bound is not added (it lies in the part not read).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections import OrderedDict
from dataclasses import dataclass, field

from dimmem.runtime.stores import RecordLog

Arm = tuple[str, str]  # (type, casefolded keyword)
MAX_ENTRIES = 1_000_000  # arms and ids held in all (~50 MB); beyond, the least recently used users go


@dataclass
class _UserArms:
    keep: int  # ids held of an arm at most: beyond it the last are dropped and the bound lowered
    stamp: tuple[int, int] = (0, -1)  # (epoch, seq) the arms are as of; never a store's
    ids: dict[Arm, list[str]] = field(default_factory=dict)
    bound: dict[Arm, str | None] = field(default_factory=dict)  # None: the whole arm is held
    where: dict[str, list[Arm]] = field(default_factory=dict)  # record id -> the held arms holding it
    entries: int = 0  # arms and ids held

    def put(self, arm: Arm, ids: list[str], depth: int) -> None:
        """The arm as the store answered it, `depth` entries deep (fewer: the whole arm)."""
        self._forget(arm)
        self.ids[arm] = ids
        self.bound[arm] = ids[-1] if depth >= 0 and len(ids) >= depth else None
        for rid in ids:
            self.where.setdefault(rid, []).append(arm)
        self.entries += 1 + len(ids)

    def replay(self, record: dict) -> None:
        """A record indexed or unindexed since: out of the arms that held it, into its held arms (within
        their bounds) when it is active."""
        rid = record["id"]
        for arm in self.where.pop(rid, ()):
            ids = self.ids[arm]
            del ids[bisect_left(ids, rid)]
            self.entries -= 1
        if record["status"] != "active":
            return
        for key in sorted({k.casefold() for k in record["keywords"]}):
            arm = (record["type"], key)
            if arm in self.ids and (self.bound[arm] is None or rid <= self.bound[arm]):
                ids = self.ids[arm]
                insort(ids, rid)
                self.where.setdefault(rid, []).append(arm)
                self.entries += 1
                if len(ids) > self.keep:  # a common keyword: its first `keep` entries are enough
                    self._unhold(ids.pop(), arm)
                    self.bound[arm] = ids[-1]

    def answer(self, arm: Arm, limit: int) -> tuple[list[str], int] | None:
        """(ids, depth) as `BatchView` takes an arm: the first `depth` entries by id (fewer ids: the whole
        arm); None when the arm must be read from the store (not held, or fewer than `limit` known)."""
        ids = self.ids.get(arm)
        if ids is None:
            return None
        if self.bound[arm] is None:
            return ids, len(ids) + 1
        return (ids, len(ids)) if limit >= 0 and len(ids) >= limit else None

    def _forget(self, arm: Arm) -> None:
        if arm in self.ids:
            for rid in self.ids.pop(arm):
                self._unhold(rid, arm)
            del self.bound[arm]
            self.entries -= 1

    def _unhold(self, rid: str, arm: Arm) -> None:
        held = self.where[rid]
        held.remove(arm)
        if not held:
            del self.where[rid]
        self.entries -= 1


class KeywordArms:
    """The arms of the users the update path wrote last (`MAX_ENTRIES` in all), following the store's
    log."""

    def __init__(self, store: RecordLog):
        self.store = store
        self.users: OrderedDict[str, _UserArms] = OrderedDict()
        self.lock = threading.Lock()  # around `users` only: a user's own arms change under its write lock

    def read(self, user_id: str, arms: list[Arm], limit: int) -> dict[Arm, tuple[list[str], int]]:
        """{arm: (ids, depth)} for each arm, as the store has them now, `limit` entries of each asked (twice
        as many are held): call inside the batch's write block (which holds the user's write lock, so
        nothing changes them before it commits). The lists are the cache's own: read them, do not change
        them."""
        user = self._held(user_id, 2 * limit)
        answers = {arm: user.answer(arm, limit) for arm in arms}
        unread = [arm for arm, found in answers.items() if found is None]
        if unread:
            for arm, ids in self.store.lookup.keyword_arms(user_id, unread, limit).items():
                user.put(arm, ids, limit)
                answers[arm] = user.answer(arm, limit)
        with self.lock:  # (what a batch was given stays valid when its user is dropped: it is not changed)
            while self.users and sum(u.entries for u in self.users.values()) > MAX_ENTRIES:
                self.users.popitem(last=False)  # the least recently used first, this user last
        return answers

    def _held(self, user_id: str, keep: int) -> _UserArms:
        """The user's arms as the log has them now (a batch that rolled back changed nothing: its stamp
        did not move, and its arms were read before its writes)."""
        with self.lock:
            user = self.users.pop(user_id, None) or _UserArms(keep)
            self.users[user_id] = user  # the most recently used last
        stamp = self.store.lookup.change_stamp(user_id)
        if stamp == user.stamp:
            return user
        if user.stamp[1] >= 0 and stamp[0] == user.stamp[0] and stamp[1] > user.stamp[1]:
            for record in self.store.lookup.changes(user_id, user.stamp[1], ("type", "keywords")):
                user.replay(record)
        elif user.ids:  # a replaced user (another epoch, or its changes numbered anew): read anew
            user = _UserArms(keep)
            with self.lock:
                self.users[user_id] = user
        user.stamp = stamp
        return user
