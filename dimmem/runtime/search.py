"""Search: the three retrieval paths of one query (BM25 over the record text, dense over the embeddings,
the dimension path over the parsed query's type, time, place and keywords), fused into the user's best
records, and the assistant's replies recalled through their pointers when the query asks for them.

A search embeds its query and runs the dense path in a helper thread while it runs the lexical and
dimension paths under the store lock; the dense path takes no store lock where the store reads its
vectors through a connection of its own (`RecordLog.concurrent_dense`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from dimmem.runtime.config import RetrievalConfig
from dimmem.runtime.query import asks_about_now, lexical_terms
from dimmem.runtime.retrieval import Hit, dimension_path, fuse
from dimmem.runtime.stores import RecordLog


class Searcher:
    """One `Memory`'s searches over its store."""

    def __init__(
        self,
        store: RecordLog,
        retrieval: RetrievalConfig,
        encode: Callable[[list[str]], np.ndarray],
        store_lock: AbstractContextManager,
        stats: Counter,
        helpers: ThreadPoolExecutor,
    ):
        self.store, self.retrieval, self.encode = store, retrieval, encode
        self.lock, self.stats = store_lock, stats
        self.helpers = helpers  # the query's embedding and dense path, beside the other paths

    def search(self, query: str, user_id: str, parsed: dict, k: int) -> tuple[list[Hit], list[dict]]:
        """The fused hits, and the assistant's replies to their source turns when `parsed` asks."""
        paths = self.paths(query, user_id, parsed)
        with self.lock:
            retrieval = self.retrieval
            hits = fuse(
                self.store,
                user_id,
                paths,
                parsed,
                k,
                retrieval.weights,
                retrieval.fusion,
                retrieval.dedup_k,
                newest_first=asks_about_now(query),
            )
            self.stats["searches"] += 1
            context = []
            if parsed.get("need_assistant_context"):  # recall on demand, through the records' pointers
                self.stats["assistant_recalls"] += 1
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
