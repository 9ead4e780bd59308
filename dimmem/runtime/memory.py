"""`Memory`: the memory runtime's Python API, scoped by user, as memory libraries expose it (mem0's
argument order: what first, then whose).

    memory = Memory.from_config("configs/memory/default.yaml")    # or Memory({"store": "m.sqlite"})
    memory.add(messages, user_id="ann")          # OpenAI-style messages or a Conversation
    result = memory.search("When did Ann go hiking?", user_id="ann", k=5)
    memory.get(id, user_id=...), memory.get_all(user_id=..., filters={"type": "fact"}), memory.update(id,
    user_id=..., content=...), memory.delete(id, user_id=...), memory.history(id, user_id=...)

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

import base64
import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dimmem.config import load_config, validate_config
from dimmem.contract.conversation import Conversation
from dimmem.contract.loaders._fields import Record
from dimmem.contract.loaders.chat_jsonl import conversation_from_messages
from dimmem.contract.records import MEMORY_TYPES
from dimmem.contract.timespan import parse_span
from dimmem.contract.validate import memory_issues, validate
from dimmem.contract.windows import make_windows
from dimmem.runtime.config import MemoryConfig
from dimmem.runtime.consolidate import MEMORY_FIELDS, decision_scope
from dimmem.runtime.embed import Embedder
from dimmem.runtime.extractors import Extractor
from dimmem.runtime.query import lexical_terms
from dimmem.runtime.retrieval import Hit, dimension_path, fuse
from dimmem.runtime.store import MemoryStore
from dimmem.runtime.vector_index import VectorIndex


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


@dataclass
class Page:
    """One page of a user's records (`Memory.get_all`): pass `next_cursor` back for the next one."""

    memories: list[dict]
    next_cursor: str | None = None


STATUSES = ("active", "superseded", "merged", "deleted")
FILTERS = ("type", "status", "conversation_id", "time")


class Memory:
    def __init__(
        self,
        config: MemoryConfig | dict | None = None,
        *,
        embedder: Embedder | None = None,
        extractor: Extractor | None = None,
        query_parser: Callable[[str, str | None], dict] | None = None,
        consolidator: Callable[[dict, dict, float], dict] | None = None,
    ):
        """The runtime `config` describes (every default is `MemoryConfig`'s); the components given here
        replace the configured ones (tests share one embedder, benchmarks pass a scripted extractor)."""
        if config is None:
            config = MemoryConfig()
        elif isinstance(config, dict):
            config = validate_config(MemoryConfig, config, "memory config")
        elif not isinstance(config, MemoryConfig):
            raise TypeError(
                f"Memory(config): expected a MemoryConfig, a dict or None, "
                f"got {type(config).__name__} "
                "(a YAML file: Memory.from_config(path); a store: Memory({'store': path}))"
            )
        self.config = config
        given = {"extractor": extractor, "query_parser": query_parser, "consolidator": consolidator}
        client = None  # one client for the 'model' components: one rate limit, one usage count
        if any(component is None and getattr(config, name) == "model" for name, component in given.items()):
            client = config.client()
        self.store = MemoryStore(config.store_path())
        self.embedder = embedder or config.build_embedder()
        self.vectors = VectorIndex(self.store, ann_min_records=config.retrieval.ann_min_records)
        self.extractor = extractor or config.build_extractor(client)
        self.query_parser = query_parser or config.build_query_parser(client)
        self.consolidator = consolidator or config.build_consolidator(client)
        self.count_tokens = config.build_token_counter()
        self.stats: Counter = Counter()
        self._extract_lock = threading.Lock()  # the tokenizer and the stats, shared by concurrent extracts

    @classmethod
    def from_config(
        cls, path: str | Path | None, overrides: Mapping[str, Any] | Iterable[str] = (), **fields: Any
    ) -> Memory:
        """A runtime built from a YAML file (configs/memory/*.yaml), then dotted `overrides`
        ("retrieval.depth=100" or {"retrieval.depth": 100}), then keyword `fields` (None: not given)."""
        return cls(load_config(MemoryConfig, path, overrides, **fields))

    # --- writes -------------------------------------------------------------------------------------
    def add(
        self, messages: list[dict] | Conversation, *, user_id: str, conversation_id: str | None = None
    ) -> AddResult:
        """Extract memories from a conversation (or OpenAI-style messages) and store them for the user."""
        extraction = self.extract(messages, conversation_id)
        events = self.add_records(extraction.records, user_id=user_id, conversation=extraction.conversation)
        return AddResult(
            extraction.conversation.id, extraction.windows, events, extraction.rejected, extraction.failed
        )

    def extract(self, messages: list[dict] | Conversation, conversation_id: str | None = None) -> Extraction:
        """Windows -> extractor -> validator -> pointers resolved, without storing anything."""
        if isinstance(messages, Conversation):
            conversation = messages
        else:  # without an id, the same messages added twice are the same conversation
            text = json.dumps(messages, sort_keys=True, ensure_ascii=False)
            digest = "c-" + hashlib.sha256(text.encode()).hexdigest()[:12]
            conversation = conversation_from_messages(
                {"messages": messages, "id": conversation_id or digest}, Record("messages", "request"), digest
            )
        w = self.config.windows
        with self._extract_lock:
            windows = make_windows(conversation, w.window, w.overlap, w.max_tokens, self.count_tokens)
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

    def add_records(
        self,
        records: list[dict],
        *,
        user_id: str,
        conversation: Conversation | None = None,
        consolidate: bool = True,
    ) -> list[dict]:
        """Store extracted records (source turns as conversation turn ids), consolidating each with its
        closest stored candidate (unless `consolidate=False`: stored as given, e.g. for benchmarks).
        Returns one event per record: {"id", "action", "target"}. A record whose id is already stored
        (e.g. the same conversation added again after an interrupted add) is left as it is: UNCHANGED."""
        for i, record in enumerate(records):
            if issues := memory_issues(record, i, None):
                raise ValueError("invalid record: " + "; ".join(map(str, issues)))
        records = [{**r, "id": r.get("id") or _new_id(user_id, r)} for r in records]
        stored = self.store.get_many(user_id, [r["id"] for r in records])
        unchanged = [
            {"id": r["id"], "action": "UNCHANGED", "target": None} for r in records if r["id"] in stored
        ]
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
        return unchanged + [
            self._add_one(user_id, record, vector) for record, vector in zip(records, vectors)
        ]

    def _add_one(self, user_id: str, record: dict, vector: np.ndarray) -> dict:
        names = {record["speaker"].casefold()}
        keys = [k for k in record["keywords"] if k.casefold() not in names]
        update = self.config.update
        candidates = self.store.candidates(user_id, record["type"], keys, update.max_candidates)
        self.stats["embedding_comparisons"] += len(candidates)
        self.stats["baseline_comparisons"] += self.store.count(user_id)  # comparing with everything
        best, similarity = None, 0.0
        if candidates:
            ids, matrix = self.store.vectors(user_id, candidates)
            scores = matrix @ vector
            best, similarity = ids[int(np.argmax(scores))], float(np.max(scores))
        decision = {"action": "KEEP_BOTH", "memory": None}
        if best is not None and similarity >= update.similarity_threshold:
            candidate = self.store.get(user_id, best)
            decision = self.consolidator(record, candidate, similarity)
            # a bad decision never damages the store
            if not validate("consolidate", decision, decision_scope(record, candidate)).ok:
                self.stats["invalid_consolidations"] += 1
                decision = {"action": "KEEP_BOTH", "memory": None}
        action = decision["action"]
        self.stats[action] += 1
        merged_vector = None
        if action == "MERGE":
            merged_vector = self.embedder.encode([decision["memory"]["content"]])[0]
        with self.store.transaction():  # the record and its consolidation land together or not at all
            if action == "MERGE":
                self.store.insert(user_id, record, vector)
                self.store.set_status(user_id, record["id"], "merged", f"MERGED_INTO {best}")
                self.store.revise(user_id, best, decision["memory"], merged_vector, f"MERGE {record['id']}")
            elif action == "SUPERSEDE":
                self.store.set_status(user_id, best, "superseded", f"SUPERSEDED_BY {record['id']}")
                self.store.insert(user_id, {**record, **decision["memory"]}, vector)
            else:
                self.store.insert(user_id, record, vector)
        return {"id": record["id"], "action": action, "target": best if action != "KEEP_BOTH" else None}

    def update(self, memory_id: str, *, user_id: str, **fields) -> dict:
        unknown = set(fields) - set(MEMORY_FIELDS)
        if unknown:
            raise ValueError(f"cannot update {sorted(unknown)}; fields are {list(MEMORY_FIELDS)}")
        current = self.get(memory_id, user_id=user_id)
        if current is None:
            raise KeyError(f"no record {memory_id!r} for user {user_id!r}")
        if issues := memory_issues({**current, **fields}, None, None):
            raise ValueError("invalid update: " + "; ".join(map(str, issues)))
        vector = self.embedder.encode([fields.get("content", current["content"])])[0]
        with self.store.transaction():
            self.store.revise(user_id, memory_id, fields, vector, "UPDATE")
        return self.get(memory_id, user_id=user_id)

    def delete(self, memory_id: str, *, user_id: str) -> None:
        with self.store.transaction():
            self.store.set_status(user_id, memory_id, "deleted", "DELETE")

    # --- reads --------------------------------------------------------------------------------------
    def get(self, memory_id: str, *, user_id: str) -> dict | None:
        return self.store.get(user_id, memory_id)

    def get_all(
        self, *, user_id: str, filters: dict | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page:
        """The user's records, oldest first, a page at a time. `filters`: `type`, `status` (default
        "active"; "any": every status), `conversation_id`, `time` (an ISO date, partial date or interval:
        records whose time overlaps it). Pass the page's `next_cursor` back for the next page."""
        filters = dict(filters or {})
        if unknown := sorted(set(filters) - set(FILTERS)):
            raise ValueError(f"unknown filter {unknown}; filters are {list(FILTERS)}")
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        kind = filters.get("type")
        if kind is not None and kind not in MEMORY_TYPES:
            raise ValueError(f"type {kind!r}: expected one of {list(MEMORY_TYPES)}")
        status = filters.get("status") or "active"
        if status not in (*STATUSES, "any"):
            raise ValueError(f"status {status!r}: expected one of {[*STATUSES, 'any']}")
        span = None
        if filters.get("time") is not None:
            start, end = parse_span(str(filters["time"]))
            span = (start.isoformat(), end.isoformat())
        rows = self.store.page(
            user_id,
            type=kind,
            status=None if status == "any" else status,
            conversation_id=filters.get("conversation_id"),
            span=span,
            after=_decode_cursor(cursor),
            limit=limit + 1,
        )
        more = len(rows) > limit
        rows = rows[:limit]
        return Page(rows, _encode_cursor(rows[-1]) if more else None)

    def history(self, memory_id: str, *, user_id: str) -> list[dict]:
        return self.store.history(user_id, memory_id)

    def search(
        self,
        query: str,
        *,
        user_id: str,
        k: int = 10,
        reference_date: str | None = None,
        parsed: dict | None = None,
    ) -> SearchResult:
        parsed = parsed or self.query_parser(query, reference_date)
        paths = self.paths(query, user_id, parsed)
        hits = fuse(self.store, user_id, paths, parsed, k, self.config.retrieval.weights)
        self.stats["searches"] += 1
        context = []
        if parsed.get("need_assistant_context"):  # recall on demand, through the records' pointers
            self.stats["assistant_recalls"] += 1
            for hit in hits:
                if hit.record.get("conversation_id"):
                    context += self.store.assistant_replies(
                        user_id, hit.record["conversation_id"], hit.record["source_turns"]
                    )
        return SearchResult(parsed, hits, context)

    def paths(self, query: str, user_id: str, parsed: dict, query_vector: np.ndarray | None = None) -> dict:
        """Each retrieval path's ranking on its own: [(record id, score)], best first."""
        vector = self.embedder.encode([query])[0] if query_vector is None else query_vector
        depth = self.config.retrieval.depth
        return {
            "bm25": self.store.lexical(user_id, lexical_terms(query), depth),
            "dense": self.vectors.search(user_id, vector, depth),
            "dimension": dimension_path(self.store, user_id, parsed, depth),
        }

    # --- export / import ----------------------------------------------------------------------------
    def export_jsonl(self, path: str | Path, *, user_id: str) -> int:
        records = self.store.records(user_id, status=None)
        with open(path, "w", encoding="utf-8") as out:
            for record in records:
                history = self.history(record["id"], user_id=user_id)
                out.write(json.dumps({**record, "history": history}, ensure_ascii=False) + "\n")
        return len(records)

    def import_jsonl(self, path: str | Path, *, user_id: str) -> int:
        """Re-add the active records of an export (for this user), through the normal update path."""
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        keep = (*MEMORY_FIELDS, "id", "conversation_id", "window_id", "session_time")
        active = [{k: r[k] for k in keep} for r in rows if r["status"] == "active"]
        return len(self.add_records(active, user_id=user_id))


def _encode_cursor(record: dict) -> str:
    raw = json.dumps([record["created"], record["id"]], ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str | None) -> tuple[float, str] | None:
    if cursor is None:
        return None
    try:
        created, record_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if isinstance(created, (int, float)) and not isinstance(created, bool) and isinstance(record_id, str):
            return float(created), record_id
    except (ValueError, TypeError):
        pass
    raise ValueError(f"cursor {cursor[:40]!r}: not a cursor this API returned")


def _new_id(user_id: str, record: dict) -> str:
    text = json.dumps([user_id, record], sort_keys=True, ensure_ascii=False)
    return "m-" + hashlib.sha256(text.encode()).hexdigest()[:16]
