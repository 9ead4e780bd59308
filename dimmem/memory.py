"""`Memory`: the memory runtime's Python API, scoped by user, as memory libraries expose it.

    memory = Memory.from_config("configs/memory/default.yaml")        # or Memory(path, extractor=...)
    memory.add(messages, user_id="ann")          # OpenAI-style messages or a Conversation
    result = memory.search("When did Ann go hiking?", user_id="ann", k=5)
    memory.get(id, user_id=...), memory.update(...), memory.delete(...), memory.history(...)

`add` windows the conversation, asks the extractor for each window's records, keeps those the
validator passes (the others are reported, not stored), resolves their pointers to conversation turn
ids and stores them with their source turns through the update path below.

Each new record meets only the stored records of its type that share a keyword (an index lookup), is
compared by embedding with those alone, and is consolidated with the closest one when similar enough:
MERGE, SUPERSEDE or KEEP_BOTH, decided by a model (`consolidator`) or by rules. Replaced and merged
versions stay in the history.

Threads: `extract` may run from many threads at once (its model calls then overlap at the server);
everything that touches the store or the embedder takes turns (one SQLite connection), which is how
the HTTP service calls it.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from dimmem.consolidate import MEMORY_FIELDS, consolidate_rules, decision_scope
from dimmem.conversation import Conversation
from dimmem.embed import Embedder
from dimmem.extractors import Extractor, TurnExtractor
from dimmem.loaders._fields import Record
from dimmem.loaders.chat_jsonl import conversation_from_messages
from dimmem.query import lexical_terms, parse_query_rules
from dimmem.retrieval import Hit, dimension_path, fuse
from dimmem.store import MemoryStore
from dimmem.validate import memory_issues, validate
from dimmem.vector_index import VectorIndex
from dimmem.windows import Window, make_windows


@dataclass
class Extraction:
    conversation: Conversation
    windows: int
    records: list[dict]  # valid memories, pointers resolved to conversation turn ids
    rejected: list[str] = field(default_factory=list)  # memories the validator refused, with the reasons
    failed: dict[str, str] = field(default_factory=dict)  # window id -> why the extractor gave no answer


@dataclass
class AddResult:
    conversation_id: str
    windows: int
    events: list[dict]  # one per stored record: {"id", "action", "target"}
    rejected: list[str] = field(default_factory=list)  # memories the validator refused, with the reasons
    failed: dict[str, str] = field(default_factory=dict)  # window id -> why the extractor gave no answer


@dataclass
class SearchResult:
    query: dict  # the parsed query (parse_query answer)
    hits: list[Hit]
    assistant_context: list[dict] = field(default_factory=list)


class Memory:
    def __init__(self, path: str | Path = ":memory:", embedder: Embedder | None = None,
                 extractor: Extractor | None = None,
                 query_parser: Callable[[str, str | None], dict] | None = None,
                 consolidator: Callable[[dict, dict, float], dict] | None = None,
                 window: int = 20, overlap: int = 4, count_tokens: Callable[[Window], int] | None = None,
                 max_tokens: int | None = None, similarity_threshold: float = 0.6, max_candidates: int = 200,
                 depth: int = 50, weights: dict[str, float] | None = None, ann_min_records: int = 200_000):
        self.store = MemoryStore(path)
        self.embedder = embedder or Embedder()
        self.vectors = VectorIndex(self.store, ann_min_records=ann_min_records)
        self.extractor = extractor or TurnExtractor()
        self.query_parser = query_parser or parse_query_rules
        self.consolidator = consolidator or consolidate_rules
        self.window, self.overlap, self.count_tokens, self.max_tokens = window, overlap, count_tokens, max_tokens
        self.threshold, self.max_candidates, self.depth, self.weights = similarity_threshold, max_candidates, depth, weights
        self.stats: Counter = Counter()
        self._extract_lock = threading.Lock()  # the prompt tokenizer and the stats, shared by concurrent extracts

    @classmethod
    def from_config(cls, path: str | Path, **overrides) -> "Memory":
        """A runtime built from a YAML file (configs/memory/*.yaml); keyword overrides win."""
        from dimmem.memory_config import load_memory_config

        return load_memory_config(path, **overrides).build()

    # --- writes -------------------------------------------------------------------------------------
    def add(self, messages: list[dict] | Conversation, user_id: str, conversation_id: str | None = None) -> AddResult:
        """Extract memories from a conversation (or OpenAI-style messages) and store them for the user."""
        extraction = self.extract(messages, conversation_id)
        events = self.add_records(extraction.records, user_id, extraction.conversation)
        return AddResult(extraction.conversation.id, extraction.windows, events, extraction.rejected, extraction.failed)

    def extract(self, messages: list[dict] | Conversation, conversation_id: str | None = None) -> "Extraction":
        """Windows -> extractor -> validator -> pointers resolved, without storing anything."""
        if isinstance(messages, Conversation):
            conversation = messages
        else:  # without an id, the same messages added twice are the same conversation
            digest = "c-" + hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:12]
            conversation = conversation_from_messages({"messages": messages, "id": conversation_id or digest},
                                                      Record("messages", "request"), digest)
        with self._extract_lock:
            windows = make_windows(conversation, self.window, self.overlap, self.max_tokens, self.count_tokens)
        answers = self.extractor(windows)
        records, rejected, failed, n_bad = [], [], {}, 0
        for window in windows:
            answer = answers[window.id]
            if isinstance(answer, str):
                failed[window.id] = answer
                continue
            issues = validate("extract", answer, window.scope).issues
            if any(issue.index is None for issue in issues):  # the answer as a whole is unusable
                failed[window.id] = f"{window.id}: " + "; ".join(map(str, issues))
                continue
            bad = {issue.index for issue in issues}  # a bad memory costs only itself
            rejected += [f"{window.id}: {issue}" for issue in issues]
            records += window.resolve([m for i, m in enumerate(answer["memories"]) if i not in bad])
            n_bad += len(bad)
        with self._extract_lock:
            self.stats["rejected_memories"] += n_bad
            self.stats["windows"] += len(windows)
            self.stats["failed_windows"] += len(failed)
        return Extraction(conversation, len(windows), records, rejected, failed)

    def add_records(self, records: list[dict], user_id: str, conversation: Conversation | None = None,
                    consolidate: bool = True) -> list[dict]:
        """Store extracted records (source turns as conversation turn ids), consolidating each with its
        closest stored candidate (unless `consolidate=False`: stored as given, e.g. for benchmarks).
        Returns one event per record: {"id", "action", "target"}. A record whose id is already stored
        (e.g. the same conversation added again after an interrupted add) is left as it is: UNCHANGED."""
        for i, record in enumerate(records):
            if issues := memory_issues(record, i, None):
                raise ValueError("invalid record: " + "; ".join(map(str, issues)))
        records = [{**r, "id": r.get("id") or _new_id(user_id, r)} for r in records]
        stored = self.store.get_many(user_id, [r["id"] for r in records])
        unchanged = [{"id": r["id"], "action": "UNCHANGED", "target": None} for r in records if r["id"] in stored]
        records = [r for r in records if r["id"] not in stored]
        if conversation is not None:
            with self.store.transaction():
                self.store.put_turns(user_id, conversation.id, conversation.turns)
        vectors = self.embedder.encode([r["content"] for r in records])
        if not consolidate:
            with self.store.transaction():
                for record, vector in zip(records, vectors):
                    self.store.insert(user_id, record, vector)
            return unchanged + [{"id": r["id"], "action": "ADD", "target": None} for r in records]
        return unchanged + [self._add_one(user_id, record, vector) for record, vector in zip(records, vectors)]

    def _add_one(self, user_id: str, record: dict, vector: np.ndarray) -> dict:
        names = {record["speaker"].casefold()}
        keys = [k for k in record["keywords"] if k.casefold() not in names]
        candidates = self.store.candidates(user_id, record["type"], keys, self.max_candidates)
        self.stats["embedding_comparisons"] += len(candidates)
        self.stats["baseline_comparisons"] += self.store.count(user_id)  # what comparing with everything would cost
        best, similarity = None, 0.0
        if candidates:
            ids, matrix = self.store.vectors(user_id, candidates)
            scores = matrix @ vector
            best, similarity = ids[int(np.argmax(scores))], float(np.max(scores))
        decision = {"action": "KEEP_BOTH", "memory": None}
        if best is not None and similarity >= self.threshold:
            candidate = self.store.get(user_id, best)
            decision = self.consolidator(record, candidate, similarity)
            if not validate("consolidate", decision, decision_scope(record, candidate)).ok:  # a bad decision never damages the store
                self.stats["invalid_consolidations"] += 1
                decision = {"action": "KEEP_BOTH", "memory": None}
        self.stats[decision["action"]] += 1
        merged_vector = self.embedder.encode([decision["memory"]["content"]])[0] if decision["action"] == "MERGE" else None
        with self.store.transaction():  # the record and its consolidation land together or not at all
            if decision["action"] == "MERGE":
                self.store.insert(user_id, record, vector)
                self.store.set_status(user_id, record["id"], "merged", f"MERGED_INTO {best}")
                self.store.revise(user_id, best, decision["memory"], merged_vector, f"MERGE {record['id']}")
            elif decision["action"] == "SUPERSEDE":
                self.store.set_status(user_id, best, "superseded", f"SUPERSEDED_BY {record['id']}")
                self.store.insert(user_id, {**record, **decision["memory"]}, vector)
            else:
                self.store.insert(user_id, record, vector)
        return {"id": record["id"], "action": decision["action"], "target": best if decision["action"] != "KEEP_BOTH" else None}

    def update(self, record_id: str, user_id: str, **fields) -> dict:
        unknown = set(fields) - set(MEMORY_FIELDS)
        if unknown:
            raise ValueError(f"cannot update {sorted(unknown)}; fields are {list(MEMORY_FIELDS)}")
        current = self.get(record_id, user_id)
        if current is None:
            raise KeyError(f"no record {record_id!r} for user {user_id!r}")
        if issues := memory_issues({**current, **fields}, None, None):
            raise ValueError("invalid update: " + "; ".join(map(str, issues)))
        vector = self.embedder.encode([fields.get("content", current["content"])])[0]
        with self.store.transaction():
            self.store.revise(user_id, record_id, fields, vector, "UPDATE")
        return self.get(record_id, user_id)

    def delete(self, record_id: str, user_id: str) -> None:
        with self.store.transaction():
            self.store.set_status(user_id, record_id, "deleted", "DELETE")

    # --- reads --------------------------------------------------------------------------------------
    def get(self, record_id: str, user_id: str) -> dict | None:
        return self.store.get(user_id, record_id)

    def history(self, record_id: str, user_id: str) -> list[dict]:
        return self.store.history(user_id, record_id)

    def search(self, query: str, user_id: str, k: int = 10, reference_date: str | None = None,
               parsed: dict | None = None) -> SearchResult:
        parsed = parsed or self.query_parser(query, reference_date)
        hits = fuse(self.store, user_id, self.paths(query, user_id, parsed), parsed, k, self.weights)
        self.stats["searches"] += 1
        context = []
        if parsed.get("need_assistant_context"):  # recall on demand, through the records' pointers
            self.stats["assistant_recalls"] += 1
            for hit in hits:
                if hit.record.get("conversation_id"):
                    context += self.store.assistant_replies(user_id, hit.record["conversation_id"], hit.record["source_turns"])
        return SearchResult(parsed, hits, context)

    def paths(self, query: str, user_id: str, parsed: dict, query_vector: np.ndarray | None = None) -> dict:
        """Each retrieval path's ranking on its own: [(record id, score)], best first."""
        vector = self.embedder.encode([query])[0] if query_vector is None else query_vector
        return {"bm25": self.store.lexical(user_id, lexical_terms(query), self.depth),
                "dense": self.vectors.search(user_id, vector, self.depth),
                "dimension": dimension_path(self.store, user_id, parsed, self.depth)}

    # --- export / import ----------------------------------------------------------------------------
    def export_jsonl(self, user_id: str, path: str | Path) -> int:
        records = self.store.records(user_id, status=None)
        with open(path, "w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps({**record, "history": self.history(record["id"], user_id)}, ensure_ascii=False) + "\n")
        return len(records)

    def import_jsonl(self, user_id: str, path: str | Path) -> int:
        """Re-add the active records of an export (for this user), through the normal update path."""
        rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        active = [{k: r[k] for k in (*MEMORY_FIELDS, "id", "conversation_id", "window_id", "session_time")} for r in rows
                  if r["status"] == "active"]
        return len(self.add_records(active, user_id))


def label_memories(path: str | Path) -> dict[str, list[dict]]:
    """The extracted records of a datagen labels.jsonl, by conversation, ready for `add_records`."""
    by_conversation: dict[str, list[dict]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("task") == "extract":
            by_conversation.setdefault(row["conversation_id"], []).extend(
                {**{k: m[k] for k in MEMORY_FIELDS}, "id": m["id"], "session_time": m.get("session_time"),
                 "conversation_id": row["conversation_id"], "window_id": row["window_id"]} for m in row["memories"])
    return by_conversation


def _new_id(user_id: str, record: dict) -> str:
    return "m-" + hashlib.sha256(json.dumps([user_id, record], sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]
