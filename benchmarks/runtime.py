"""Memory runtime benchmark: search latency by store size and by user size, ingest throughput and store
size on disk (the update path's decisions against truth: `python -m benchmarks.update`).

    python -m benchmarks.runtime --sizes 1000,10000,100000,1000000 --spread 1000000/1000 \\
        --stores sqlite,postgres --out runs/bench/runtime.json

Stores are filled with LoCoMo turn texts, each varied by two extra words, with their real MiniLM vectors
plus small noise (so the vectors cluster as real ones do, which matters for HNSW). Queries are LoCoMo
questions. `--sizes`: stores of N records in one user (the worst case: every search is scoped to one
user); `--spread N/U`: N records over U users of N/U records each, every query to a user drawn at
random (what a search costs a small user of a large store). At each size the store backends run side by
side (SQLite; Postgres on an embedded server with fsync on, as the runtime's login role): fill rate and
size on disk, then each path alone as the runtime calls it (BM25, dense with its recall@10 against exact
search, dimension), the whole `Memory.search` (query embedding, three paths, fusion), and the first
search of a user in this process (the in-process indexes read the user). Beside SQLite's BM25, the same
queries on one FTS5 index over the same records, the lexical path before the per-user index; beside the
runtime's query embedding (ONNX Runtime), sentence-transformers', the embedder before. A filled store is
settled before it is measured (SQLite's write-ahead log checkpointed, Postgres ANALYZEd). Ingest with
embeddings (`--ingest` records, as given and through the update path) runs on each backend with each
embedder (ONNX fp32 and int8, sentence-transformers).
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.lexical import SharedFTS5
from dimmem.contract.loaders import load_conversations
from dimmem.contract.records import memory_record
from dimmem.paths import shared_data, write_json
from dimmem.runtime.embed import TextEncoder, make_embedder
from dimmem.runtime.memory import Memory
from dimmem.runtime.query import content_words, lexical_terms, parse_query_rules
from dimmem.runtime.retrieval import dimension_path
from dimmem.runtime.stores import open_store

TYPES = ("episodic", "fact", "profile")


def corpus(locomo: Path, embedder: TextEncoder) -> tuple[list[str], np.ndarray, list[str], np.ndarray, list]:
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
                **memory_record(
                    source_turns=[f"D1:{i}"],
                    speaker=texts[j].split(":", 1)[0],
                    content=content,
                    type=TYPES[i % 3],
                    time=day,
                    keywords=(content_words(content) or ["x"])[:8],
                ),
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


def exact_top(matrix: np.ndarray, qvectors: np.ndarray, k: int = 10) -> list[set[int]]:
    """The true top-k rows by cosine for each query (the vectors are unit length): HNSW's reference."""
    scores = qvectors @ matrix.T
    return [set(np.argpartition(-row, k)[:k].tolist()) for row in scores]


@contextmanager
def backends(names: list[str], workdir: Path) -> Iterator[dict]:
    """backend -> (a fresh store's URL by name, a store's size on disk in bytes by name, what settles a
    filled store before it is measured): SQLite files in `workdir` (the write-ahead log folded into the
    file), and databases on one embedded Postgres (durable, as deployed) whose runtime connects as its
    login role (planner statistics gathered, as autovacuum does in a running database)."""
    from dimmem.runtime.stores.embedded import RUNTIME_LOGIN, start_embedded

    made: dict = {}
    if "sqlite" in names:

        def checkpoint(name: str) -> None:
            with closing(sqlite3.connect(workdir / f"{name}.sqlite")) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        made["sqlite"] = (
            lambda name: str(workdir / f"{name}.sqlite"),
            lambda name: sum(p.stat().st_size for p in workdir.glob(f"{name}.sqlite*")),
            checkpoint,
        )
    server = start_embedded(workdir / "pg") if "postgres" in names else None
    try:
        if server is not None:

            def fresh(name: str) -> str:
                owner = server.database(name, fresh=True)
                open_store(owner).close()  # migrates, as the owner
                return server.login_role(RUNTIME_LOGIN, owner)

            def size(name: str) -> int:
                import psycopg  # the [postgres] extra, needed only when Postgres is measured

                with psycopg.connect(server.database(name)) as conn:  # the store's tables, their
                    return conn.execute(  # indexes and TOAST; not the catalogs of an empty database
                        "SELECT sum(pg_total_relation_size(oid))::bigint FROM pg_class "
                        "WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'"
                    ).fetchone()[0]

            def settle(name: str) -> None:
                import psycopg

                with psycopg.connect(server.database(name), autocommit=True) as conn:
                    conn.execute("ANALYZE")

            made["postgres"] = (fresh, size, settle)
        yield made
    finally:
        if server is not None:
            server.stop()


def bench_size(
    backend: tuple, n: int, users: int, data: tuple, memory_of, queries: int, before_embedder: TextEncoder
) -> dict:
    """Fill a fresh store of `backend` with n records over `users` users, then time each path and the
    whole search on the same queries (each to a user drawn at random)."""
    fresh, size_of, settle = backend
    texts, vectors, questions, qvectors = data
    name = f"size_{n}_{users}"
    memory = memory_of(fresh(name))
    store, batch, kept, reference_seconds = memory.store, 10_000, [], 0.0
    owner = [f"u{i % users}" for i in range(n)]
    fts5 = SharedFTS5() if store.dialect.name == "sqlite" else None  # SQLite: the lexical path before
    rows = synthetic(n, texts, vectors)
    start = time.perf_counter()
    with tqdm(total=n, desc=f"fill {n:,} / {users:,} users", unit="rec", disable=None) as bar:
        for first in range(0, n, batch):
            chunk = [next(rows) for _ in range(min(batch, n - first))]
            with store.transaction():
                for i, (record, vector) in enumerate(chunk, start=first):
                    store.insert(owner[i], record, vector)
            kept += [vector for _, vector in chunk]
            bar.update(len(chunk))
            if fts5 is not None:  # (not part of the store's fill rate)
                since = time.perf_counter()
                fts5.add([(owner[i], record) for i, (record, _) in enumerate(chunk, start=first)])
                reference_seconds += time.perf_counter() - since
    fill_seconds = time.perf_counter() - start - reference_seconds
    settle(name)
    size = size_of(name)
    rng = np.random.default_rng(1)
    asked = [
        (f"u{int(rng.integers(0, users))}", q, v) for q, v in zip(questions[:queries], qvectors[:queries])
    ]
    result = {
        "records": n,
        "users": users,
        "fill_records_per_s": round(n / fill_seconds),
        "store_bytes": size,
        "store_bytes_per_record": round(size / n),
    }
    first = {}  # each user's first search in this process: the in-process indexes read the user
    for user in dict.fromkeys(u for u, _, _ in asked):
        start = time.perf_counter()
        memory.search("first", user_id=user, k=10, reference_date="2023-10-01")
        first[user] = time.perf_counter() - start
    result["first_search"] = percentiles(list(first.values()))
    if fts5 is not None:
        _, before = timed(lambda u, q: fts5.search(u, lexical_terms(q), 50), [(u, q) for u, q, _ in asked])
        result["bm25_fts5"] = percentiles(before)
    _, lexical = timed(
        lambda u, q: store.lookup.lexical(u, lexical_terms(q), 50), [(u, q) for u, q, _ in asked]
    )
    result["bm25"] = percentiles(lexical)
    hits, dense = timed(lambda u, v: store.lookup.dense(u, v, 50), [(u, v) for u, _, v in asked])
    result["dense"] = percentiles(dense)
    recalls = []  # against the exact neighbours among the user's own vectors
    for user in dict.fromkeys(u for u, _, _ in asked):
        rows_of = np.arange(int(user[1:]), n, users)  # record i belongs to user i % users
        mine = [i for i, (u, _, _) in enumerate(asked) if u == user]
        truth = exact_top(np.stack([kept[i] for i in rows_of]), np.stack([asked[i][2] for i in mine]))
        for i, top in zip(mine, truth):
            found = {int(r[1:]) for r, _ in hits[i][:10]}
            recalls.append(len(found & {int(rows_of[j]) for j in top}) / 10)
    del kept
    result["dense_recall@10"] = round(float(np.mean(recalls)), 4)
    parsed = [(u, parse_query_rules(q, "2023-10-01")) for u, q, _ in asked]
    _, dimension = timed(lambda u, p: dimension_path(store, u, p, 50), parsed)
    result["dimension"] = percentiles(dimension)
    _, searches = timed(
        lambda u, q: memory.search(q, user_id=u, k=10, reference_date="2023-10-01"),
        [(u, q) for u, q, _ in asked],
    )
    result["search"] = percentiles(searches)
    for key, embedder in (("query_embedding", memory.embedder), ("query_embedding_before", before_embedder)):
        _, samples = timed(lambda q, e=embedder: e.encode([q]), [(q,) for _, q, _ in asked])
        result[key] = percentiles(samples)
    memory.close()
    return result


def bench_ingest(
    backend: tuple, texts: list[str], vectors: np.ndarray, embedder: TextEncoder, n: int, label: str
) -> dict:
    """Records/s into a fresh store, embeddings included (no extractor), as given and through the update
    path."""
    fresh = backend[0]
    rows = [r for r, _ in synthetic(n, texts, vectors)]
    out = {}
    for consolidate in (False, True):
        key = "with_update" if consolidate else "without_update"
        memory = Memory({"store": fresh(f"ingest_{label}_{key}")}, embedder=embedder)
        start = time.perf_counter()
        for i in range(0, n, 500):
            memory.add_records(rows[i : i + 500], user_id="ingest", consolidate=consolidate)
        out[f"ingest_records_per_s_{key}"] = round(n / (time.perf_counter() - start))
        memory.close()
    return out


def format_tables(result: dict) -> str:
    """Latency (each component before -> after, side by side in the run), then fill and size."""
    lines = [
        "| records / users | store | query embedding ms torch -> onnx | BM25 ms FTS5 -> per-user index | "
        "dense ms (recall@10) | dimension ms | whole search ms | first search ms |",
        "|" + "---|" * 8,
    ]
    for r in result["sizes"]:
        pp = lambda key, r=r: f"{r[key]['p50_ms']} / {r[key]['p95_ms']}" if key in r else "-"  # noqa: E731
        lines.append(
            f"| {r['records']:,} / {r['users']:,} | {r['store']} | {pp('query_embedding_before')} -> "
            f"{pp('query_embedding')} | {pp('bm25_fts5')} -> {pp('bm25')} | "
            f"{pp('dense')} ({r['dense_recall@10']}) | {pp('dimension')} | {pp('search')} | "
            f"{pp('first_search')} |"
        )
    lines += [
        "",
        "(p50 / p95 ms)",
        "",
        "| records / users | store | MB on disk (B/record) | fill records/s |",
    ]
    lines.append("|---|---|---|---|")
    for r in result["sizes"]:
        lines.append(
            f"| {r['records']:,} / {r['users']:,} | {r['store']} | {r['store_bytes'] / 1e6:,.0f} "
            f"({r['store_bytes_per_record']:,}) | {r['fill_records_per_s']:,} |"
        )
    lines += ["", "| ingest with embeddings, records/s | store | as given | through the update path |"]
    lines.append("|---|---|---|---|")
    for name, by_embedder in result["ingest"].items():
        for embedder, ingest in by_embedder.items():
            lines.append(
                f"| {embedder} | {name} | {ingest['ingest_records_per_s_without_update']:,} | "
                f"{ingest['ingest_records_per_s_with_update']:,} |"
            )
    lines.append(
        "embedder alone, records/s: "
        + ", ".join(f"{k} {v:,}" for k, v in result["embedding_records_per_s"].items())
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.runtime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="1000,10000,100000,1000000", help="records, all in one user")
    parser.add_argument(
        "--spread", default="1000000/1000", help="RECORDS/USERS,...: records over users of equal size"
    )
    parser.add_argument(
        "--postgres-max",
        type=int,
        default=100_000,
        help="larger stores are measured on SQLite only (Postgres fills at ~10^2 records/s here)",
    )
    parser.add_argument("--stores", default="sqlite,postgres", help="backends, side by side at each size")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ingest", type=int, default=10_000, help="records for the ingest measurement")
    parser.add_argument("--locomo", default=str(shared_data("locomo/locomo10.json")))
    parser.add_argument("--workdir", help="where the stores are built (default: a temporary folder, removed)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    embedder = make_embedder()
    before_embedder = make_embedder(
        backend="torch", batch_size=64
    )  # the embedder before: sentence-transformers
    texts, vectors, questions, qvectors, conversations = corpus(Path(args.locomo), embedder)
    embedders = {"onnx": embedder, "onnx_int8": make_embedder(precision="int8"), "torch": before_embedder}
    rates = {}
    for name, each in embedders.items():
        each.encode(["warm-up"])  # loaded before it is timed
        start = time.perf_counter()
        for i in range(0, min(args.ingest, len(texts)), 64):  # the runtime's batches
            each.encode(texts[i : min(i + 64, args.ingest)])
        rates[name] = round(min(args.ingest, len(texts)) / (time.perf_counter() - start))
    result = {
        "embedding_records_per_s": rates,
        "ingest": {},
        "sizes": [],
    }
    data = (texts, vectors, questions, qvectors)
    memory_of = lambda url: Memory({"store": url}, embedder=embedder)  # noqa: E731
    names = [n for n in re.split(r"[,\s]+", args.stores) if n]
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir, backends(names, Path(workdir)) as made:
        for name in names:
            result["ingest"][name] = {
                key: bench_ingest(made[name], texts, vectors, each, args.ingest, key)
                for key, each in embedders.items()
            }
        cases = [(int(s), 1) for s in re.split(r"[,\s]+", args.sizes) if s]
        cases += [tuple(int(x) for x in s.split("/")) for s in re.split(r"[,\s]+", args.spread) if s]
        for n, users in cases:
            for name in names:  # side by side at each size
                if name == "postgres" and n > args.postgres_max:
                    continue
                measured = bench_size(made[name], n, users, data, memory_of, args.queries, before_embedder)
                result["sizes"].append({"store": name, **measured})
                print(json.dumps(result["sizes"][-1]), flush=True)
    print(format_tables(result))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
