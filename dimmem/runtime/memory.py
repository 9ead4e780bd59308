"""`Memory`: the memory runtime's Python API, scoped by user, as memory libraries expose it (mem0's
argument order: what first, then whose).

    memory = Memory.from_config("configs/memory/default.yaml")    # or Memory({"store": "m.sqlite"})
    memory.add(messages, user_id="ann")          # OpenAI-style messages or a Conversation
    result = memory.search("When did Ann go hiking?", user_id="ann", k=5)
    memory.get(id, user_id=...), memory.get_all(user_id=..., filters={"type": "fact"}), memory.update(id,
    user_id=..., content=...), memory.delete(id, user_id=...), memory.restore(id, user_id=...),
    memory.history(id, user_id=...)

`add` windows the conversation, asks the extractor for each window's records, keeps those the
validator passes (the others are reported, not stored), resolves their pointers to conversation turn
ids and stores them with their source turns through the update path below.

Appending and crashes: `dimmem.runtime.ingest` (an add extracts only the turns not stored yet, and a
killed add is completed by the next add of the conversation).

Each new record goes through the update path (`dimmem.runtime.update`: few candidates, precise rules or a
model, time decides which of two records stays, nothing lost). Lifecycle (held by the store): only active
records are found, revised, merged into, superseded or deleted; `update` or `delete` of another raises
`RecordStateError`; a deleted, superseded or merged record comes back only by `restore` (the undo of a
wrong decision).

Threads: a `Memory` may be shared by any number of threads, and no call holds the store for long.
- One store lock (the single SQLite connection; none for Postgres, whose pool serves threads at once
  and whose transactions lock the user they write in the database) is taken per batch of records
  written (stored as given, or looked up, decided by the rules and written: one transaction), per
  record a model decides, per turns-and-windows write of an add, and by reads (`search`, `get`,
  `get_all`, `history`) only for their store calls. A model's decision runs outside the lock, between
  the candidate lookup and the record's transaction, which re-reads the target's status and version
  under `BEGIN IMMEDIATE`: a target deleted or changed meanwhile means a fresh decision, at worst
  KEEP_BOTH.
- One embedder, behind a `Batcher`: embeddings are computed outside the store lock, at most
  `EMBED_BATCH` texts per model call; the query embeddings of concurrent searches (and an add's batch)
  that queue behind one call share the next.
- Extraction (model calls) holds neither; the tokenizer and stats have their own lock.
- A search embeds its query and runs the dense path in a helper thread (`dimmem.runtime.search`).
So a search waits at most for one batch's write or one embedding batch, never for a whole add. Other
processes writing the same file are serialized by SQLite (`BEGIN IMMEDIATE`, busy timeout); writers of
one user on Postgres, in any process, by the user's row lock (`stores.postgres`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dimmem.config import validate_config
from dimmem.contract.conversation import Conversation
from dimmem.contract.records import MEMORY_FIELDS, MEMORY_TYPES, UPDATABLE_FIELDS
from dimmem.contract.timespan import parse_span
from dimmem.contract.validate import TurnScope, validate
from dimmem.runtime.config import MemoryConfig, load_memory_config
from dimmem.runtime.embed import Batcher, TextEncoder
from dimmem.runtime.extractors import Extractor
from dimmem.runtime.ingest import Extraction, Ingest, parse_messages
from dimmem.runtime.retrieval import Hit
from dimmem.runtime.search import Searcher, SearchFilters
from dimmem.runtime.stores import RecordLog
from dimmem.runtime.stores.base import RecordStateError
from dimmem.runtime.stores.log import RESTORABLE, STATUSES, STATUSES_LEFT, Stats
from dimmem.runtime.update import UpdatePath

__all__ = ["AddResult", "Extraction", "Memory", "Page", "RecordStateError", "SearchResult"]

EMBED_BATCH = 64  # texts per embedder call: the longest a search waits for the embedder
SEARCH_HELPERS = (
    8  # threads embedding concurrent searches' queries and adds' next batches (the Batcher folds)
)


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


FILTERS = ("type", "status", "conversation_id", "time")


class Memory:
    def __init__(
        self,
        config: MemoryConfig | dict | None = None,
        *,
        embedder: TextEncoder | None = None,
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
        self.store: RecordLog = config.open_store()
        self.embedder = embedder or config.build_embedder()
        self.extractor = extractor or config.build_extractor(client)
        self.query_parser = query_parser or config.build_query_parser(client)
        self.count_tokens = config.build_token_counter()
        self._embedder = Batcher(self.embedder.encode, EMBED_BATCH)  # concurrent requests share a call
        self.updates = UpdatePath(
            self.store,
            config.update,
            consolidator or config.build_consolidator(client),
            self._encode,
        )
        # query embeddings of searches and the next batch's embeddings of adds, beside the store work
        self._helpers = ThreadPoolExecutor(max_workers=SEARCH_HELPERS, thread_name_prefix="dimmem-helper")
        self.searcher = Searcher(self.store, config.retrieval, self._encode, self._helpers)
        self.ingest = Ingest(self.store, config.windows, self.extractor, self.count_tokens)

    @property
    def stats(self) -> Stats:
        """What this runtime did with its store: searches, windows, decisions, comparisons (the store's)."""
        return self.store.stats

    @property
    def consolidator(self) -> Callable[[dict, dict, float], dict]:
        """What decides MERGE, SUPERSEDE or KEEP_BOTH on the update path (rules or a model)."""
        return self.updates.consolidator

    @consolidator.setter
    def consolidator(self, value: Callable[[dict, dict, float], dict]) -> None:
        self.updates.consolidator = value

    @classmethod
    def from_config(
        cls, path: str | Path | None, overrides: Mapping[str, Any] | Iterable[str] = (), **fields: Any
    ) -> Memory:
        """A runtime built from a YAML file (configs/memory/*.yaml), then dotted `overrides`
        ("retrieval.depth=100" or {"retrieval.depth": 100}), then keyword `fields` (None: not given)."""
        return cls(load_memory_config(path, overrides, **fields))

    # --- writes -------------------------------------------------------------------------------------
    def extract(self, messages: list[dict] | Conversation, conversation_id: str | None = None) -> Extraction:
        """Windows -> extractor -> validator -> pointers resolved, without storing anything."""
        conversation, _ = parse_messages(messages, conversation_id)
        return self.ingest.extract(conversation)

    def add(
        self, messages: list[dict] | Conversation, *, user_id: str, conversation_id: str | None = None
    ) -> AddResult:
        """Extract memories from the conversation's turns not stored yet (OpenAI-style messages or a
        Conversation) and store them for the user, with the turns; see the module docstring for appending
        and retries. `windows` in the result counts the windows extracted by this call."""
        conversation, given = parse_messages(messages, conversation_id)
        windows = self.ingest.plan(user_id, conversation, given)
        extraction = self.ingest.extract_windows(conversation, windows)
        events = self._write(user_id, extraction.records, consolidate=True)
        self.ingest.done(user_id, conversation.id, windows, extraction)
        return AddResult(conversation.id, len(windows), events, extraction.rejected, extraction.failed)

    def add_records(
        self,
        records: list[dict],
        *,
        user_id: str,
        conversation: Conversation | None = None,
        consolidate: bool = True,
    ) -> list[dict]:
        """Store extracted records (source turns as conversation turn ids), consolidating each with its
        closest stored candidate (unless `consolidate=False`: stored as given, e.g. for benchmarks), and
        the `conversation`'s turns not stored yet (a stored turn id with other text: ValueError).
        Returns one event per record, in order: {"id", "action", "target"}. A record whose id is already
        stored (e.g. the same conversation added again after an interrupted add) is left as it is:
        UNCHANGED."""
        for i, record in enumerate(records):
            if issues := _record_issues(record):
                raise ValueError(f"invalid record {i}: " + "; ".join(issues))
        records = [{**r, "id": r.get("id") or _new_id(user_id, r)} for r in records]
        if conversation is not None:
            with self.store.lock, self.store.transaction():
                self.store.conversations.put_turns(user_id, conversation.id, conversation.turns)
        return self._write(user_id, records, consolidate)

    def _write(self, user_id: str, records: list[dict], consolidate: bool) -> list[dict]:
        """Embeddings a batch at a time, outside the store lock: the next batch's in a helper thread while
        this one is written, so the embedder and the store each keep a core busy. Without a model each
        batch is one transaction (stored as given, or looked up, decided by the rules and written: a
        commit per batch, not per record); a model's decisions are taken record by record
        (`UpdatePath.add`). Each write re-checks what is stored, so an id stored meanwhile (by this add's
        earlier batch, or another writer) comes back UNCHANGED."""
        batches = [records[i : i + EMBED_BATCH] for i in range(0, len(records), EMBED_BATCH)]

        def embed_next(n: int):
            """The new records of batch n, embedded in a helper (what is stored already is not)."""
            if n >= len(batches):
                return None
            with self.store.lock:
                stored = self.store.get_many(user_id, [r["id"] for r in batches[n]])
            todo = [r for r in batches[n] if r["id"] not in stored]
            texts = [r["content"] for r in todo]
            return self._helpers.submit(lambda: dict(zip((r["id"] for r in todo), self._encode(texts))))

        events: list[dict] = []
        pending = embed_next(0)
        for n, batch in enumerate(batches):
            vectors = pending.result()
            pending = embed_next(n + 1)
            if not consolidate:
                events += self._insert_batch(user_id, batch, vectors)
            else:
                events += self.updates.add_batch(user_id, batch, vectors)
        return events

    def _insert_batch(self, user_id: str, batch: list[dict], vectors: dict[str, np.ndarray]) -> list[dict]:
        """The batch's records stored as given, in one transaction: ADD, or UNCHANGED for an id stored
        already (also by another writer meanwhile, or earlier in the batch)."""
        events = []
        with self.store.lock, self.store.transaction():
            fresh = set(vectors) - set(self.store.get_many(user_id, list(vectors)))
            for record in batch:
                added = record["id"] in fresh
                if added:
                    self.store.insert(user_id, record, vectors[record["id"]])
                    fresh.discard(record["id"])
                events.append({"id": record["id"], "action": "ADD" if added else "UNCHANGED", "target": None})
        return events

    def update(self, memory_id: str, *, user_id: str, **fields) -> dict:
        """A new version of an active record with the given fields changed (the old one stays in its
        history). KeyError: no such record; RecordStateError: not active; ValueError: invalid fields."""
        unknown = set(fields) - set(UPDATABLE_FIELDS)
        if unknown:
            raise ValueError(f"cannot update {sorted(unknown)}; fields are {list(UPDATABLE_FIELDS)}")
        if not fields:
            raise ValueError(f"no field to update; fields are {list(UPDATABLE_FIELDS)}")
        for _ in range(10):
            current = self._active(user_id, memory_id, "updated")
            revised = {**{k: current[k] for k in MEMORY_FIELDS}, **fields}
            if issues := _record_issues(revised):
                raise ValueError("invalid update: " + "; ".join(issues))
            vector = self._encode([revised["content"]])[0]
            with self.store.lock, self.store.transaction():
                now = self.store.get(user_id, memory_id)
                if now is not None and now["status"] == "active" and now["content"] != current["content"]:
                    continue  # changed meanwhile by another writer: validate and embed what it holds now
                self.store.revise(user_id, memory_id, fields, vector, "UPDATE")  # checks the status again
            return self.get(memory_id, user_id=user_id)
        raise RuntimeError(f"record {memory_id!r} kept changing while this update ran")

    def delete(self, memory_id: str, *, user_id: str) -> None:
        """Delete an active record (KeyError: no such record; RecordStateError: not active)."""
        with self.store.lock, self.store.transaction():
            self.store.set_status(user_id, memory_id, "deleted", "DELETE")

    def restore(self, memory_id: str, *, user_id: str) -> dict:
        """A deleted, superseded or merged record active again, found by every path (history "RESTORE"):
        the undo of a delete or of a wrong update decision (the record that replaced it stays active).
        An active record cannot be restored (RecordStateError)."""
        with self.store.lock:
            current = self.store.get(user_id, memory_id)
        if current is None:
            raise KeyError(f"no record {memory_id!r} for user {user_id!r}")
        if current["status"] not in STATUSES_LEFT:
            raise RecordStateError(memory_id, current["status"], "restored", RESTORABLE)
        vector = self._encode([current["content"]])[0]  # a record out of use never changes its content
        with self.store.lock, self.store.transaction():
            self.store.restore(user_id, memory_id, vector)  # checks the status again
        return self.get(memory_id, user_id=user_id)

    def _active(self, user_id: str, memory_id: str, operation: str) -> dict:
        with self.store.lock:
            current = self.store.get(user_id, memory_id)
        if current is None:
            raise KeyError(f"no record {memory_id!r} for user {user_id!r}")
        if current["status"] != "active":
            raise RecordStateError(memory_id, current["status"], operation)
        return current

    def _encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings, at most EMBED_BATCH texts per model call."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        step = range(0, len(texts), EMBED_BATCH)
        return np.concatenate([self._embedder.encode(texts[i : i + EMBED_BATCH]) for i in step])

    # --- reads --------------------------------------------------------------------------------------
    def get(self, memory_id: str, *, user_id: str) -> dict | None:
        with self.store.lock:
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
        after = _decode_cursor(cursor)
        with self.store.lock:
            rows = self.store.page(
                user_id,
                type=kind,
                status=None if status == "any" else status,
                conversation_id=filters.get("conversation_id"),
                span=span,
                after=after,
                limit=limit + 1,
            )
        more = len(rows) > limit
        rows = rows[:limit]
        return Page(rows, _encode_cursor(rows[-1]) if more else None)

    def history(self, memory_id: str, *, user_id: str) -> list[dict]:
        with self.store.lock:
            return self.store.history(user_id, memory_id)

    def search(
        self,
        query: str,
        *,
        user_id: str,
        k: int = 10,
        reference_date: str | None = None,
        parsed: dict | None = None,
        filters: SearchFilters | None = None,
    ) -> SearchResult:
        """The user's `k` best records for the query (parsed by the query parser unless `parsed` is given),
        within `filters` (type, time, location, speaker): three paths fused (`dimmem.runtime.search`),
        with the assistant's replies when the query asks."""
        parsed = parsed or self.query_parser(query, reference_date)
        hits, context = self.searcher.search(query, user_id, parsed, k, filters)
        return SearchResult(filters.over(parsed) if filters else parsed, hits, context)

    def paths(self, query: str, user_id: str, parsed: dict, query_vector: np.ndarray | None = None) -> dict:
        """Each retrieval path's ranking on its own: [(record id, score)], best first."""
        return self.searcher.paths(query, user_id, parsed, query_vector)

    def close(self) -> None:
        """Close the store (its connection or pool), the helper threads, and an extractor's own server
        (the student's llama.cpp)."""
        self._helpers.shutdown()
        self.store.close()
        if hasattr(self.extractor, "close"):
            self.extractor.close()

    # --- export / import ----------------------------------------------------------------------------
    def export_jsonl(self, path: str | Path, *, user_id: str) -> int:
        with self.store.lock:
            records = self.store.records(user_id, status=None)
            histories = [self.store.history(user_id, r["id"]) for r in records]
        with open(path, "w", encoding="utf-8") as out:
            for record, history in zip(records, histories):
                out.write(json.dumps({**record, "history": history}, ensure_ascii=False) + "\n")
        return len(records)

    def import_jsonl(self, path: str | Path, *, user_id: str) -> int:
        """Re-add the active records of an export (for this user), through the normal update path."""
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        keep = (*MEMORY_FIELDS, "id", "conversation_id", "window_id", "session_time")
        active = [{k: r[k] for k in keep} for r in rows if r["status"] == "active"]
        return len(self.add_records(active, user_id=user_id))


def _record_issues(record: Any) -> list[str]:
    """What the one validator finds wrong with a record's fields (schema and rules), pointer scope aside."""
    if not isinstance(record, dict):
        return [f"expected an object, got {type(record).__name__}"]
    memory = {k: record.get(k) for k in MEMORY_FIELDS}
    turns = memory["source_turns"] if isinstance(memory["source_turns"], list) else []
    turns = [t for t in turns if isinstance(t, str)]
    scope = TurnScope({t: memory["speaker"] for t in turns}, frozenset(turns))
    issues = validate("extract", {"memories": [memory]}, scope).issues
    return [str(issue).removeprefix("memories[0].") for issue in issues]


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
