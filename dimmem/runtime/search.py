"""Search: the three retrieval paths of one query (BM25 over the record text, dense over the embeddings,
the dimension path over the parsed query's type, time, place and keywords), fused into the user's best
records, and the assistant's replies recalled through their pointers when the query asks for them.
`SearchFilters` narrow a search (its type, time, place, speaker) the same way wherever it is asked: the
runtime, the HTTP service and the MCP tool.

A search embeds its query and runs the dense path in a helper thread while it runs the lexical and
dimension paths under the store lock; the dense path takes no store lock where the store reads its
vectors through a connection of its own (`RecordLog.concurrent_dense`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from dimmem.contract.timespan import overlaps, parse_span
from dimmem.runtime.config import RetrievalConfig
from dimmem.runtime.query import asks_about_now, lexical_terms
from dimmem.runtime.retrieval import Hit, dimension_path, fuse
from dimmem.runtime.stores import RecordLog


@dataclass(frozen=True)
class SearchFilters:
    """What a search is narrowed to: a memory type, a time its time overlaps (an ISO date, partial date or
    interval), a place its location contains, its speaker (both case-blind). The given ones replace what
    the query parser read from the question (the dimension path looks for them in the first place), and a
    hit outside any of them is dropped (`time`: a memory without a time too)."""

    type: str | None = None
    time: str | None = None
    location: str | None = None
    speaker: str | None = None

    def __post_init__(self):
        if self.time is not None:
            parse_span(self.time)  # ValueError naming what is wrong with it

    @property
    def narrowed(self) -> bool:
        return any((self.type, self.time, self.location, self.speaker))

    def over(self, parsed: dict) -> dict:
        """The parsed query with the filters in place of what it read."""
        given = {
            "target_types": [self.type] if self.type else None,
            "time": self.time,
            "location": self.location,
        }
        return {**parsed, **{key: value for key, value in given.items() if value}}

    def admit(self, record: dict) -> bool:
        time = record.get("time")
        return (
            (self.type is None or record["type"] == self.type)
            and (
                self.time is None or (time is not None and overlaps(parse_span(self.time), parse_span(time)))
            )
            and (
                self.location is None or self.location.casefold() in (record.get("location") or "").casefold()
            )
            and (self.speaker is None or self.speaker.casefold() == (record.get("speaker") or "").casefold())
        )


class Searcher:
    """One `Memory`'s searches over its store."""

    def __init__(
        self,
        store: RecordLog,
        retrieval: RetrievalConfig,
        encode: Callable[[list[str]], np.ndarray],
        helpers: ThreadPoolExecutor,
    ):
        self.store, self.retrieval, self.encode = store, retrieval, encode
        self.lock = store.lock
        self.helpers = helpers  # the query's embedding and dense path, beside the other paths

    def search(
        self, query: str, user_id: str, parsed: dict, k: int, filters: SearchFilters | None = None
    ) -> tuple[list[Hit], list[dict]]:
        """The fused hits within `filters`, and the assistant's replies to their source turns when
        `parsed` asks. Narrowed, the hits are drawn from a pool as deep as the paths, then sifted."""
        narrowed = filters is not None and filters.narrowed
        parsed = filters.over(parsed) if narrowed else parsed
        paths = self.paths(query, user_id, parsed)
        with self.lock:
            retrieval = self.retrieval
            hits = fuse(
                self.store,
                user_id,
                paths,
                parsed,
                max(k, retrieval.depth) if narrowed else k,
                retrieval.weights,
                retrieval.fusion,
                retrieval.dedup_k,
                newest_first=asks_about_now(query),
            )
            if narrowed:
                hits = [hit for hit in hits if filters.admit(hit.record)][:k]
            self.store.stats.add(searches=1)
            context = []
            if parsed.get("need_assistant_context"):  # recall on demand, through the records' pointers
                self.store.stats.add(assistant_recalls=1)
                for hit in hits:
                    if hit.record.get("conversation_id"):
                        context += self.store.conversations.assistant_replies(
                            user_id, hit.record["conversation_id"], hit.record["source_turns"]
                        )
        return hits, context

    def paths(self, query: str, user_id: str, parsed: dict, query_vector: np.ndarray | None = None) -> dict:
        """Each retrieval path's ranking on its own: [(record id, score)], best first. The query's
        embedding (unless given) is computed by a helper thread while the lexical and dimension paths
        run: they need no vector. The dense path follows the embedding in that thread, under no lock of
        this runtime's where the store allows it (`RecordLog.concurrent_dense`)."""
        depth = self.retrieval.depth
        dense_lock = nullcontext() if self.store.concurrent_dense else self.lock

        def dense() -> list[tuple[str, float]]:
            vector = self.encode([query])[0] if query_vector is None else query_vector
            with dense_lock:
                return self.store.lookup.dense(user_id, vector, depth)

        pending = self.helpers.submit(dense)
        with self.lock:
            bm25 = self.store.lookup.lexical(user_id, lexical_terms(query), depth)
            dimension = dimension_path(self.store, user_id, parsed, depth)
        return {"bm25": bm25, "dense": pending.result(), "dimension": dimension}
