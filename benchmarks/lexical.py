"""The lexical path before and after the per-user index, on LoCoMo, side by side in one run.

    python -m benchmarks.lexical --memories observations
    python -m benchmarks.lexical --memories turns

Recall@10 of the BM25 path alone (questions of categories 1-4, each conversation one user, added in
order as `dimmem eval retrieval` adds them) for:
- FTS5, one index over all users: the SQLite store's lexical path until schema 4 (Porter over unicode61
  tokens, every word kept, statistics from every user's records loaded so far), rebuilt here as the
  reference;
- the runtime's per-user index (`dimmem.runtime.stores.indexes.bm25`) on SQLite and on Postgres (embedded, as
  the runtime's login role): one analyzer (Snowball, English stop words dropped), statistics from the
  user's own records.
The two runtime columns must agree exactly; the difference to FTS5 is what per-user statistics and the
analyzer cost or buy.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from pathlib import Path

import numpy as np

from dimmem.contract.loaders import load_conversations
from dimmem.paths import shared_data
from dimmem.runtime import lexical
from dimmem.runtime.embed import make_embedder
from dimmem.runtime.memory import Memory
from dimmem.runtime.query import lexical_terms
from dimmem.runtime.stores.embedded import RUNTIME_LOGIN, start_embedded
from eval.retrieval import evidence_of, observation_records, score_ranking, turn_records


class SharedFTS5:
    """The previous SQLite lexical path: one FTS5 table for every user, BM25 over the whole table."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute(
            "CREATE VIRTUAL TABLE fts USING fts5(record_id UNINDEXED, user_id UNINDEXED, body, "
            "tokenize='porter unicode61')"
        )

    def add(self, rows: list[tuple[str, dict]]) -> None:
        """Index (user id, record) pairs."""
        body = lambda r: " ".join(  # noqa: E731  (the runtime's indexed fields)
            " ".join(v) if isinstance(v, list) else v for f in lexical.FIELDS if (v := r[f])
        )
        self.db.executemany("INSERT INTO fts VALUES (?,?,?)", [(r["id"], user, body(r)) for user, r in rows])

    def search(self, user_id: str, query: str, k: int) -> list[str]:
        words = [t for t in "".join(c if c.isalnum() else " " for c in query).split() if len(t) > 1]
        if not words:
            return []
        rows = self.db.execute(
            "SELECT record_id FROM fts WHERE fts MATCH ? AND user_id=? ORDER BY bm25(fts) LIMIT ?",
            (" OR ".join(f'"{w}"' for w in words), user_id, k),
        )
        return [r[0] for r in rows]


def questions(conv) -> list[dict]:
    return [
        qa for qa in conv.metadata.get("qa", []) if qa.get("category") in (1, 2, 3, 4) and evidence_of(qa)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lexical",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--memories", choices=["turns", "observations"], default="observations")
    parser.add_argument("--locomo", default=str(shared_data("locomo/locomo10.json")))
    args = parser.parse_args(argv)

    conversations = load_conversations("locomo", args.locomo)
    make_records = turn_records if args.memories == "turns" else observation_records
    embedder = make_embedder()
    recalls: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        server = start_embedded(Path(folder) / "pg", durable=False)
        try:
            owner = server.database("lexical")
            Memory({"store": owner}, embedder=embedder).close()  # migrates, as the owner
            stores = {
                "SQLite, per-user index": Memory({"store": ":memory:"}, embedder=embedder),
                "Postgres, per-user index": Memory(
                    {"store": server.login_role(RUNTIME_LOGIN, owner)}, embedder=embedder
                ),
            }
            fts5 = SharedFTS5()
            for conv in conversations:
                records = make_records(conv)
                fts5.add([(conv.id, r) for r in records])
                for memory in stores.values():
                    memory.add_records(records, user_id=conv.id, conversation=conv, consolidate=False)
                sources = {r["id"]: r["source_turns"] for r in records}  # as given (FTS5) and as stored
                sources |= {
                    r["id"]: r["source_turns"]
                    for r in stores["SQLite, per-user index"].store.records(conv.id)
                }
                for qa in questions(conv):
                    query = lexical_terms(qa["question"])
                    ranked = {"FTS5, one index for all users (before)": fts5.search(conv.id, query, 50)}
                    for name, memory in stores.items():
                        ranked[name] = [rid for rid, _ in memory.store.lookup.lexical(conv.id, query, 50)]
                    for name, ids in ranked.items():
                        score = score_ranking(ids, sources, evidence_of(qa), [10])["recall@10"]
                        recalls.setdefault(name, []).append(score)
            for memory in stores.values():
                memory.close()
        finally:
            server.stop()
    print(f"BM25 path recall@10, LoCoMo {args.memories}:\n\n| lexical path | recall@10 |\n|---|---|")
    for name, values in recalls.items():
        print(f"| {name} | {np.mean(values):.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
