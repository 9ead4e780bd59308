"""The update path: each new record meets the stored records it may update, and is consolidated with the
closest one: MERGE, SUPERSEDE or KEEP_BOTH, decided by rules or a model (`dimmem.runtime.consolidate`).

What it promises (docs/runtime.md, "The update path"):
- Candidates are few: the stored active records of the new record's type that share a keyword other than
  the speaker's name (an index lookup, at most `update.max_candidates`), of the same speaker, compared by
  embedding where the vectors are (`Lookup.closest`); the closest from `update.similarity_threshold` is
  the one consulted. `update.candidates: paper` is the DimMem authors' filter instead, a baseline.
- A record that tells an attribute of its speaker a later telling replaces (where they live, a new job:
  `consolidate.slot`) is first set against the speaker's latest record of that attribute with another
  value, of any type and in any words, found through the speaker's name in the same keyword index.
- Time decides, not arrival. Of a pair the consolidator calls an update, the later one (`recency`: when
  it was told, then when it happened, then its session time, then its id) stays active: a new record
  supersedes an earlier one, and one that arrives after a later record is stored as that record's
  history (`HISTORY`: superseded by it, which stays as it is). A restatement (MERGE) keeps the earlier
  telling, with the merged text (the rules' merge reads the same whichever came first). Added in any
  order, the same records leave the same active records, but for a record restated by two that do
  not restate each other: the first to arrive is merged, and the merged text may not match the other.
- Nothing is lost: superseded and merged records stay in the store with their history, and `restore`
  brings one back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dimmem.contract.records import MEMORY_TYPES
from dimmem.contract.validate import validate
from dimmem.runtime.config import UpdateConfig
from dimmem.runtime.consolidate import KEEP_BOTH, RuleConsolidator, changed, decision_scope, recency, slot
from dimmem.runtime.keyword_arms import KeywordArms
from dimmem.runtime.stores import RecordLog
from dimmem.runtime.update_batch import BatchView, StoreView

SPEAKER_PROBES = 5  # update candidates above the threshold read to find the closest of the same speaker
CONSOLIDATION_ATTEMPTS = 3  # fresh decisions when the target changed meanwhile, then KEEP_BOTH


class UpdatePath:
    """A `Memory`'s update path over its store: `add(user, record, vector, active)` -> the event."""

    def __init__(
        self,
        store: RecordLog,
        config: UpdateConfig,
        consolidator: Callable[[dict, dict, float], dict],
        encode: Callable[[list[str]], np.ndarray],
    ):
        self.store, self.config, self.consolidator = store, config, consolidator
        self.lock, self.encode = store.lock, encode
        # the keyword index's arms as batches read them, kept between batches
        self.arm_cache = KeywordArms(store)

    def add_batch(self, user_id: str, records: list[dict], vectors: dict[str, np.ndarray]) -> list[dict]:
        """One event per record (UNCHANGED for one without a vector: stored already). By the rules, the
        whole batch is looked up, decided and written in one write block; a model's decisions record by
        record (`add`)."""
        with self.lock:  # the stats' baseline (comparing with every active record), once a batch
            active = self.store.count(user_id)
        if not isinstance(self.consolidator, RuleConsolidator):
            events = []
            for record in records:
                if record["id"] not in vectors:
                    events.append(_unchanged(record))
                    continue
                events.append(self.add(user_id, record, vectors[record["id"]], active))
                active += events[-1]["action"] == "KEEP_BOTH"  # supersede, merge: one in, one out
            return events
        events = []
        with self.lock, self.store.transaction():
            limit = self.config.max_candidates
            view = BatchView(self.store, user_id, records, self._arms, limit, self.arm_cache)
            if not self.store.dialect.serialized:  # a server's reads are round trips: read ahead
                view.prefetch(vectors, SPEAKER_PROBES)
            for record in records:
                vector = vectors.get(record["id"])
                if vector is None or view.exists(record["id"]):
                    events.append(_unchanged(record))
                    continue
                best, similarity, candidate = self._candidate(view, record, vector, active, False)
                decision = self._consult(record, candidate, similarity)
                merged = self._merged_vector(view, record, vector, candidate, decision)
                events.append(self._apply(view, record, vector, candidate, decision, merged))
                active += events[-1]["action"] == "KEEP_BOTH"
        return events

    def add(self, user_id: str, record: dict, vector: np.ndarray, active: int) -> dict:
        """A model's decision on one record: the reads in a read block, the model's call outside the store,
        the write in another block that re-reads the target (deleted, merged away or changed by another
        writer meanwhile: decide again; the last attempt keeps both). `active`: the user's active
        records before this one (a statistic: this writer's count)."""
        view = StoreView(self.store, user_id)
        for attempt in range(CONSOLIDATION_ATTEMPTS + 1):
            last = attempt == CONSOLIDATION_ATTEMPTS  # the last attempt: KEEP_BOTH
            with self.lock, self.store.transaction(write=False):  # the reads for one decision
                best, similarity, candidate = self._candidate(view, record, vector, active, last)
            decision = self._consult(record, candidate, similarity)  # a model call, maybe
            merged = None
            if decision["action"] == "MERGE":
                merged = self.encode([decision["memory"]["content"]])[0]
            with self.lock, self.store.transaction():
                if view.exists(record["id"]):
                    return _unchanged(record)
                if decision["action"] != "KEEP_BOTH":
                    now = view.get(best)
                    if now is None or (now["status"], now["version"]) != ("active", candidate["version"]):
                        self.store.stats.add(stale_consolidations=1)
                        continue
                return self._apply(view, record, vector, candidate, decision, merged)
        raise AssertionError("unreachable: the last attempt keeps both")

    def _merged_vector(
        self, view: BatchView, record: dict, vector: np.ndarray, candidate: dict | None, decision: dict
    ) -> np.ndarray | None:
        """A merge's vector (None for another decision): the rules' merge keeps one of the two texts (the
        longer), whose vector is at hand, so only another text is embedded (one at a time, inside the
        write block)."""
        if decision["action"] != "MERGE":
            return None
        text = decision["memory"]["content"]
        if text == record["content"]:
            return vector
        known = view.vector(candidate["id"]) if text == candidate["content"] else None
        return known if known is not None else self.encode([text])[0]

    def _keys(self, record: dict) -> list[str]:
        """The keywords a record's candidates share with it: all but the speaker's name (the authors'
        filter: all)."""
        names = set() if self.config.candidates == "paper" else {record["speaker"].casefold()}
        return [k for k in record["keywords"] if k.casefold() not in names]

    def _arms(self, record: dict) -> list[tuple[str, str]]:
        """The keyword index's (type, keyword) entries a record's candidates are found under: its type and
        keys, and its speaker's name under every type when it tells a replaceable attribute."""
        arms = [(record["type"], k) for k in self._keys(record)]
        if self.config.candidates != "paper" and slot(record):
            arms += [(kind, record["speaker"]) for kind in MEMORY_TYPES]
        return arms

    def _candidate(
        self, view: StoreView, record: dict, vector: np.ndarray, active: int, last: bool
    ) -> tuple[str | None, float, dict | None]:
        """The stored record to consolidate the new one with: (id, similarity, record), or (None, 0, None)
        when none is close enough, and on the `last` attempt (which keeps both without looking). A changed
        attribute's earlier telling first (`_changed_attribute`)."""
        if last:
            return None, 0.0, None
        paper = self.config.candidates == "paper"
        if not paper and slot(record) and (found := self._changed_attribute(view, record, vector)):
            return found
        candidates = view.keywords(record["type"], self._keys(record), self.config.max_candidates)
        if paper:
            candidates = self._paper_candidates(view, record, candidates)
        # what comparing with every active record would have cost beside it
        self.store.stats.add(embedding_comparisons=len(candidates), baseline_comparisons=active)
        if not candidates:
            return None, 0.0, None
        return self._closest(view, record, vector, candidates, paper)

    def _changed_attribute(
        self, view: StoreView, record: dict, vector: np.ndarray
    ) -> tuple[str, float, dict] | None:
        """The speaker's latest active record (by `recency`) of the attribute this record tells, when the
        two are a change (`consolidate.changed`), with their cosine; None otherwise. The speaker's records
        come from the keyword index under their name (at most `max_candidates` of each type)."""
        limit = self.config.max_candidates
        ids = {rid for kind in MEMORY_TYPES for rid in view.keywords(kind, [record["speaker"]], limit)}
        kind = slot(record)[0]
        told = [
            r
            for r in view.get_many(sorted(ids)).values()
            if r["speaker"].casefold() == record["speaker"].casefold() and (slot(r) or ("",))[0] == kind
        ]
        if not told:
            return None
        latest = max(told, key=recency)
        if not changed(record, latest):
            return None
        scores = dict(view.closest(vector, [latest["id"]], 1))
        return latest["id"], scores.get(latest["id"], 0.0), latest

    def _consult(self, record: dict, candidate: dict | None, similarity: float) -> dict:
        """The consolidator's decision; KEEP_BOTH without a candidate or for an invalid decision."""
        if candidate is None:
            return KEEP_BOTH
        decision = self.consolidator(record, candidate, similarity)
        if decision == KEEP_BOTH or validate("consolidate", decision, decision_scope(record, candidate)).ok:
            return decision
        self.store.stats.add(invalid_consolidations=1)
        return KEEP_BOTH

    def _apply(
        self,
        view: StoreView,
        record: dict,
        vector: np.ndarray,
        candidate: dict | None,
        decision: dict,
        merged: np.ndarray | None = None,
    ) -> dict:
        """Write the record and its decision (inside the caller's write block); `merged`: the merged
        text's vector. A merge keeps the earlier of the two, with the merged text; a supersession the
        later (`recency`). Returns the record's event."""
        action, memory, new_id = decision["action"], decision["memory"], record["id"]
        if action == "KEEP_BOTH":
            view.insert(record, vector)
        elif action == "MERGE" and recency(record) > recency(candidate):  # the first telling stays
            view.insert(record, vector)
            view.set_status(new_id, "merged", f"MERGED_INTO {candidate['id']}")
            view.revise(candidate["id"], memory, merged, f"MERGE {new_id}")
        elif action == "MERGE":  # an earlier telling arrived late: it stays, with the merged text
            view.set_status(candidate["id"], "merged", f"MERGED_INTO {new_id}")
            view.insert({**record, **memory}, merged)
        elif recency(record) > recency(candidate):
            view.set_status(candidate["id"], "superseded", f"SUPERSEDED_BY {new_id}")
            view.insert({**record, **memory}, vector)
        else:  # it arrived after a later record: stored as that record's history, which stays as it is
            view.insert(record, vector)
            view.set_status(new_id, "superseded", f"SUPERSEDED_BY {candidate['id']}")
            action = "HISTORY"
        self.store.stats.add(**{action: 1})
        return {"id": new_id, "action": action, "target": None if action == "KEEP_BOTH" else candidate["id"]}

    def _closest(
        self, view: StoreView, record: dict, vector: np.ndarray, candidates: list[str], paper: bool = False
    ) -> tuple[str | None, float, dict | None]:
        """The most similar candidate above the threshold whose speaker is the record's: (id, similarity,
        record), or (None, 0, None). Another speaker's record is another person's memory ("Bob loves
        jazz" must not supersede "Alice loves jazz"), however close the two texts are. Only the
        `SPEAKER_PROBES` closest are read. `paper` (the authors' filter): the threshold is
        `paper_similarity`, and any speaker's record qualifies, as theirs does not ask."""
        threshold = self.config.paper_similarity if paper else self.config.similarity_threshold
        speaker = record["speaker"].casefold()
        probes = [
            (rid, score)
            for rid, score in view.closest(vector, candidates, SPEAKER_PROBES)
            if score >= threshold
        ]
        found = view.get_many([rid for rid, _ in probes])  # read together
        for rid, score in probes:
            other = found.get(rid)
            if other is not None and (paper or other["speaker"].casefold() == speaker):
                return rid, score, other
        return None, 0.0, None

    def _paper_candidates(self, view: StoreView, record: dict, candidates: list[str]) -> list[str]:
        """The DimMem authors' update filter (`update.candidates: paper`), a baseline, on the index's
        candidates (same type, a shared keyword): those whose keyword set (casefolded, the speaker's name
        included) has Jaccard similarity with the record's from `paper_jaccard` on, and that do not come
        from a later session than the record (ISO `session_time`s compared as text). The cosine step is
        `_closest`'s, from `paper_similarity`."""
        mine = {k.casefold() for k in record["keywords"]}
        when = record.get("session_time")
        kept = []
        for rid, other in view.get_many(candidates).items():
            theirs = {k.casefold() for k in other["keywords"]}
            newer = when and other.get("session_time") and other["session_time"] > when
            if len(mine & theirs) / len(mine | theirs) >= self.config.paper_jaccard and not newer:
                kept.append(rid)
        return kept


def _unchanged(record: dict) -> dict:
    return {"id": record["id"], "action": "UNCHANGED", "target": None}
