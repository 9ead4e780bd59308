"""Where the two backends' BM25 paths differ on LoCoMo: tokenization or corpus statistics.

    python -m eval.bench_lexical --memories observations
    python -m eval.bench_lexical --memories turns

SQLite's FTS5 takes BM25's document frequencies and average length over the whole index, every user's
records together; the Postgres store takes them from the user's own records (its `user_stats` row).
Recall@10 of the BM25 path alone, side by side in one run: SQLite with one store for all conversations
(as `dimmem eval retrieval` loads them), SQLite with a store per conversation (so FTS5's statistics are
the user's own), and Postgres (embedded, one database, as the runtime's login role). If the two
per-user columns agree, the tokenizers are not what separates the backends.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from dimmem.contract.loaders import load_conversations
from dimmem.paths import shared_data
from dimmem.runtime.embed import Embedder
from dimmem.runtime.memory import Memory
from dimmem.runtime.query import lexical_terms
from dimmem.runtime.stores.embedded import RUNTIME_LOGIN, start_embedded
from eval.retrieval import evidence_of, observation_records, score_ranking, turn_records


class MemoizedEmbedder:
    """MiniLM, each text embedded once for the three stores."""

    def __init__(self) -> None:
        self.embedder, self.seen = Embedder(), {}

    def encode(self, texts: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self.seen]
        if new:
            self.seen.update(zip(new, self.embedder.encode(new)))
        return np.stack([self.seen[t] for t in texts])


def bm25_recall(conversations, make_records, memory_of) -> float:
    """Mean BM25-path recall@10 over the questions of categories 1-4, conversations added in order."""
    recalls = []
    for conv in conversations:
        memory = memory_of(conv.id)
        memory.add_records(make_records(conv), user_id=conv.id, conversation=conv, consolidate=False)
        sources = {r["id"]: r["source_turns"] for r in memory.store.records(conv.id)}
        for qa in conv.metadata.get("qa", []):
            if qa.get("category") in (1, 2, 3, 4) and evidence_of(qa):
                hits = memory.store.lexical(conv.id, lexical_terms(qa["question"]), 50)
                ranked = [rid for rid, _ in hits]
                recalls.append(score_ranking(ranked, sources, evidence_of(qa), [10])["recall@10"])
    return round(float(np.mean(recalls)), 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench_lexical",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--memories", choices=["turns", "observations"], default="observations")
    parser.add_argument("--locomo", default=str(shared_data("locomo/locomo10.json")))
    args = parser.parse_args(argv)

    conversations = load_conversations("locomo", args.locomo)
    make_records = turn_records if args.memories == "turns" else observation_records
    embedder = MemoizedEmbedder()
    with tempfile.TemporaryDirectory() as folder:
        shared = Memory({"store": ":memory:"}, embedder=embedder)
        per_user: dict[str, Memory] = {}
        columns = {
            "SQLite, one store (store-wide statistics)": lambda user: shared,
            "SQLite, a store per user (per-user statistics)": lambda user: per_user.setdefault(
                user, Memory({"store": ":memory:"}, embedder=embedder)
            ),
        }
        server = start_embedded(Path(folder) / "pg", durable=False)
        try:
            owner = server.database("lexical")
            Memory({"store": owner}, embedder=embedder).close()  # migrates, as the owner
            postgres = Memory({"store": server.login_role(RUNTIME_LOGIN, owner)}, embedder=embedder)
            columns["Postgres (per-user statistics)"] = lambda user: postgres
            results = {name: bm25_recall(conversations, make_records, of) for name, of in columns.items()}
            postgres.close()
        finally:
            server.stop()
    print(f"BM25 path recall@10, LoCoMo {args.memories}:\n\n| store | recall@10 |\n|---|---|")
    for name, value in results.items():
        print(f"| {name} | {value:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
