"""Consolidation of a new record with its closest stored candidate: MERGE, SUPERSEDE or KEEP_BOTH
(a `consolidate` answer), decided by rules or by a model with the rules as fallback."""

from __future__ import annotations

from collections import Counter

from dimmem.contract.prompts import consolidate_messages
from dimmem.contract.records import MEMORY_FIELDS
from dimmem.contract.validate import TurnScope, validate
from dimmem.llm import ModelClient, ModelError


def consolidate_rules(new: dict, candidate: dict, similarity: float) -> dict:
    """The rule fallback."""
    if new["type"] in ("fact", "profile"):  # stable knowledge and traits change: the newer statement holds
        return {"action": "SUPERSEDE", "memory": {k: new[k] for k in MEMORY_FIELDS}}
    if new.get("time") == candidate.get("time"):  # the same event told twice: keep one, richer record
        merged = {k: candidate[k] if candidate.get(k) is not None else new.get(k) for k in MEMORY_FIELDS}
        merged["content"] = max((new["content"], candidate["content"]), key=len)
        merged["keywords"] = list(dict.fromkeys(candidate["keywords"] + new["keywords"]))
        merged["source_turns"] = list(dict.fromkeys(candidate["source_turns"] + new["source_turns"]))
        return {"action": "MERGE", "memory": merged}
    return {"action": "KEEP_BOTH", "memory": None}


def decision_scope(new: dict, candidate: dict) -> TurnScope:
    """The turns a decision's memory may cite: those of the two records."""
    return TurnScope(
        {
            **{t: candidate["speaker"] for t in candidate["source_turns"]},
            **{t: new["speaker"] for t in new["source_turns"]},
        },
        frozenset(candidate["source_turns"]) | frozenset(new["source_turns"]),
    )


class ModelConsolidator:
    """Asks the model; an unavailable endpoint or an invalid decision falls back to the rules."""

    def __init__(self, client: ModelClient):
        self.client, self.stats = client, Counter()

    def __call__(self, new: dict, candidate: dict, similarity: float) -> dict:
        messages = consolidate_messages(
            {k: new[k] for k in MEMORY_FIELDS},
            {k: candidate[k] for k in MEMORY_FIELDS},
            new.get("session_time"),
            candidate.get("session_time"),
        )
        try:
            decision = self.client.json("consolidate", messages)
            if validate("consolidate", decision, decision_scope(new, candidate)).ok:
                self.stats["model"] += 1
                return decision
            self.stats["invalid"] += 1
        except ModelError:
            self.stats["unavailable"] += 1
        return consolidate_rules(new, candidate, similarity)
