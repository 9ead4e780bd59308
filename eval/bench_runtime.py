"""Memory runtime benchmark: search latency by store size, ingest throughput, store size on disk, and the
update path's embedding comparisons against comparing with every stored record.

    python -m eval.bench_runtime --sizes 10000,100000,1000000 --out runs/bench/runtime.json

Stores of N records for one user (the worst case: every search is scoped to one user) are filled with
LoCoMo turn texts, each varied by two extra words, with their real MiniLM vectors plus small noise (so
the vectors cluster as real ones do, which matters for HNSW). Queries are LoCoMo questions. At each
size, in one run side by side: FTS5 vs bm25s for the lexical path, exact vs HNSW for the dense path
(with HNSW's recall@10 against exact), the dimension path, and the whole `Memory.search` (query
embedding, three paths, fusion). Ingest with embeddings and the update path is measured on 1e4 records.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dimmem.contract.loaders import load_conversations
from dimmem.contract.records import MEMORY_FIELDS
from dimmem.paths import shared_data, write_json
from dimmem.runtime.embed import Embedder
from dimmem.runtime.memory import Memory
from dimmem.runtime.query import content_words, lexical_terms, parse_query_rules
from dimmem.runtime.retrieval import dimension_path
from dimmem.runtime.stores.sqlite import SQLiteStore
from dimmem.runtime.vector_index import VectorIndex
from eval.retrieval import observation_records

TYPES = ("episodic", "fact", "profile")


def corpus(locomo: Path, embedder: Embedder) -> tuple[list[str], np.ndarray, list[str], np.ndarray, list]:
    """LoCoMo turn texts with their vectors, and questions (categories 1-4) with theirs."""
    conversations = load_conversations("locomo", locomo)
    texts = [f"{t.speaker}: {t.text}" for c in conversations for t in c.turns]
    questions = [
        qa["question"]
        for c in conversations
        for qa in c.metadata.get("qa", [])
        if qa.get("category") in (1, 2, 3, 4)
    ]
    return texts, embedder.encode(texts), questions, embedder.encode(questions), conversations


def synthetic(n: int, texts: list[str], vectors: np.ndarray, seed: int = 0):
    """n (record, vector) pairs: turn texts varied by two words, vectors near the text's own."""
    rng = np.random.default_rng(seed)
    vocab = sorted({w for t in texts[:2000] for w in content_words(t)})
    for i in range(n):
        j = i % len(texts)
        extra = " ".join(vocab[k] for k in rng.integers(0, len(vocab), 2))
        vector = vectors[j] + rng.normal(scale=0.02, size=vectors.shape[1]).astype(np.float32)
        day = (
            f"{2020 + int(rng.integers(0, 5))}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"
        )
        content = f"{texts[j]} {extra}"
        yield (
            {
                "id": f"r{i}",
                "source_turns": [f"D1:{i}"],
                "speaker": texts[j].split(":", 1)[0],
                "content": content,
                "type": TYPES[i % 3],
                "time": day,
                "location": None,
                "reason": None,
                "purpose": None,
                "keywords": (content_words(content) or ["x"])[:8],
            },
            vector / np.linalg.norm(vector),
        )


def percentiles(samples: list[float]) -> dict:
    ms = np.array(samples) * 1000
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p95_ms": round(float(np.percentile(ms, 95)), 2),
    }


def timed(fn, args_list) -> tuple[list, list[float]]:
    out, samples = [], []
    for args in args_list:
        start = time.perf_counter()
        out.append(fn(*args))
        samples.append(time.perf_counter() - start)
    return out, samples


def bench_size(
    n: int, texts, vectors, questions, qvectors, embedder: Embedder, workdir: Path, queries: int
) -> dict:
    import bm25s

    path = workdir / f"store-{n}.sqlite"
    store = SQLiteStore(path)
    start, batch = time.perf_counter(), 10_000
    rows = synthetic(n, texts, vectors)
    with tqdm(total=n, desc=f"fill {n:,}", unit="rec", disable=None) as bar:
        for _ in range(0, n, batch):
            with store.transaction():
                for record, vector in (next(rows) for _ in range(min(batch, n - bar.n))):
                    store.insert("bench", record, vector)
            bar.update(min(batch, n - bar.n))
    fill_seconds = time.perf_counter() - start
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = sum(p.stat().st_size for p in workdir.glob(f"store-{n}.sqlite*"))

    qs = list(zip(questions[:queries], qvectors[:queries]))
    parsed = [parse_query_rules(q, "2023-10-01") for q, _ in qs]
    result = {
        "records": n,
        "fill_records_per_s": round(n / fill_seconds),
        "store_bytes": size,
        "store_bytes_per_record": round(size / n),
    }

    _, lexical = timed(lambda q: store.lexical("bench", lexical_terms(q), 50), [(q,) for q, _ in qs])
    result["bm25_fts5"] = percentiles(lexical)
    contents = [r["content"] for r, _ in synthetic(n, texts, vectors)]
    start = time.perf_counter()
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(contents, stopwords="en", show_progress=False), show_progress=False)
    result["bm25s_index_s"] = round(time.perf_counter() - start, 1)
    del contents
    _, lexical_bm25s = timed(
        lambda q: retriever.retrieve(
            bm25s.tokenize([lexical_terms(q)], stopwords="en", show_progress=False), k=50, show_progress=False
        ),
        [(q,) for q, _ in qs],
    )
    result["bm25_bm25s"] = percentiles(lexical_bm25s)
    retriever = None  # free the index before the dense ones are built

    exact = VectorIndex(store, ann_min_records=n + 1)
    start = time.perf_counter()
    exact.search("bench", qs[0][1], 50)
    result["dense_exact_load_s"] = round(time.perf_counter() - start, 2)
    exact_hits, exact_times = timed(lambda v: exact.search("bench", v, 50), [(v,) for _, v in qs])
    result["dense_exact"] = percentiles(exact_times)
    ann = VectorIndex(store, ann_min_records=1)
    start = time.perf_counter()
    ann.search("bench", qs[0][1], 50)
    result["dense_hnsw_build_s"] = round(time.perf_counter() - start, 1)
    ann_hits, ann_times = timed(lambda v: ann.search("bench", v, 50), [(v,) for _, v in qs])
    result["dense_hnsw"] = percentiles(ann_times)
    result["hnsw_recall@10"] = round(
        float(
            np.mean(
                [
                    len({r for r, _ in a[:10]} & {r for r, _ in e[:10]}) / 10
                    for a, e in zip(ann_hits, exact_hits)
                ]
            )
        ),
        4,
    )

    _, dimension = timed(lambda p: dimension_path(store, "bench", p, 50), [(p,) for p in parsed])
    result["dimension"] = percentiles(dimension)
    store.close()

    # the runtime as users call it, with its default exact/HNSW choice
    memory = Memory({"store": str(path)}, embedder=embedder)
    memory.store.index = ann if n >= memory.store.index.ann_min else exact  # already loaded (timed above)
    memory.store.index.store = memory.store
    ann = exact = None  # the index the runtime does not use can be freed
    _, searches = timed(
        lambda q: memory.search(q, user_id="bench", k=10, reference_date="2023-10-01"), [(q,) for q, _ in qs]
    )
    result["search"] = percentiles(searches)
    memory.store.close()
    return result


def bench_ingest(texts: list[str], vectors: np.ndarray, embedder: Embedder, n: int) -> dict:
    """Records/s into a fresh store, embeddings included (no extractor), as given and through the update
    path."""
    rows = [r for r, _ in synthetic(n, texts, vectors)]
    out = {}
    for consolidate in (False, True):
        memory = Memory({"store": ":memory:"}, embedder=embedder)
        start = time.perf_counter()
        for i in range(0, n, 500):
            memory.add_records(rows[i : i + 500], user_id="ingest", consolidate=consolidate)
        key = "with_update" if consolidate else "without_update"
        out[f"ingest_records_per_s_{key}"] = round(n / (time.perf_counter() - start))
    start = time.perf_counter()
    embedder.encode([r["content"] for r in rows])
    out["embedding_records_per_s"] = round(n / (time.perf_counter() - start))
    return out


def bench_update(conversations, embedder: Embedder) -> dict:
    """Embedding comparisons of the update path on LoCoMo observations vs comparing with every record."""
    memory = Memory({"store": ":memory:"}, embedder=embedder)
    for conv in conversations:
        memory.add_records(
            [{k: r[k] for k in (*MEMORY_FIELDS, "id")} for r in observation_records(conv)], user_id=conv.id
        )
    s = memory.stats
    return {
        "records": sum(len(observation_records(c)) for c in conversations),
        "comparisons": s["embedding_comparisons"],
        "baseline_comparisons": s["baseline_comparisons"],
        "reduction": round(1 - s["embedding_comparisons"] / max(s["baseline_comparisons"], 1), 4),
        "decisions": {a: s[a] for a in ("KEEP_BOTH", "SUPERSEDE", "MERGE")},
    }


def format_tables(result: dict) -> str:
    lines = [
        "| records | store MB (B/record) | fill rec/s | FTS5 p50/p95 ms | bm25s p50/p95 ms (index s) "
        "| exact p50/p95 ms (load s) | HNSW p50/p95 ms (build s, recall@10) | dimension p50/p95 ms "
        "| search p50/p95 ms |",
        "|" + "---|" * 9,
    ]
    for r in result["sizes"]:
        pp = lambda key, r=r: f"{r[key]['p50_ms']} / {r[key]['p95_ms']}"  # noqa: E731
        lines.append(
            f"| {r['records']:,} | {r['store_bytes'] / 1e6:,.0f} ({r['store_bytes_per_record']:,}) | "
            f"{r['fill_records_per_s']:,} | {pp('bm25_fts5')} | {pp('bm25_bm25s')} ({r['bm25s_index_s']}) | "
            f"{pp('dense_exact')} ({r['dense_exact_load_s']}) | "
            f"{pp('dense_hnsw')} ({r['dense_hnsw_build_s']}, {r['hnsw_recall@10']}) | "
            f"{pp('dimension')} | {pp('search')} |"
        )
    ingest, update = result["ingest"], result["update"]
    lines += [
        "",
        "ingest, embeddings included: "
        f"{ingest['ingest_records_per_s_without_update']:,} records/s stored as given, "
        f"{ingest['ingest_records_per_s_with_update']:,} records/s through the update path "
        f"(MiniLM alone: {ingest['embedding_records_per_s']:,} records/s)",
        f"update on LoCoMo observations ({update['records']:,} records): "
        f"{update['comparisons']:,} embedding comparisons "
        f"vs {update['baseline_comparisons']:,} comparing with every stored record "
        f"({update['reduction']:.1%} fewer); "
        f"decisions {update['decisions']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval.bench_runtime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ingest", type=int, default=10_000, help="records for the ingest measurement")
    parser.add_argument("--locomo", default=str(shared_data("locomo/locomo10.json")))
    parser.add_argument("--workdir", help="where the stores are built (default: a temporary folder, removed)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    embedder = Embedder()
    texts, vectors, questions, qvectors, conversations = corpus(Path(args.locomo), embedder)
    result = {
        "ingest": bench_ingest(texts, vectors, embedder, args.ingest),
        "update": bench_update(conversations, embedder),
        "sizes": [],
    }
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        for n in (int(s) for s in re.split(r"[,\s]+", args.sizes) if s):
            result["sizes"].append(
                bench_size(n, texts, vectors, questions, qvectors, embedder, Path(workdir), args.queries)
            )
            for f in Path(workdir).glob("store-*"):
                f.unlink()
            print(json.dumps(result["sizes"][-1]), flush=True)
    print(format_tables(result))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
