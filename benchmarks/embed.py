"""The embedder, side by side in one run: sentence-transformers (torch, the reference) against the ONNX
Runtime backend in fp32 and int8, and concurrent queries with and without the `Batcher`.

    python -m benchmarks.embed --out runs/bench/embed.json

For each variant: the cold start (a fresh process: imports, model load, first vector; the ONNX export
already cached), one query at a time (200 LoCoMo questions, p50/p95), ingest (LoCoMo turns in the
runtime's batches of 64, texts/s), agreement with the reference (cosine over every LoCoMo turn), and
recall@10 of the dense path on LoCoMo turns and observations (`dimmem eval retrieval`'s measure). The
timed loops alternate the variants round by round, so a noisy machine slows them alike. Then the query
embeddings of concurrent searches (1/4/16 threads) through one `Batcher` against a plain lock around
the same embedder: the runtime's micro-batching.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import numpy as np
from tqdm import tqdm

from benchmarks.runtime import percentiles
from dimmem.contract.loaders import load_conversations
from dimmem.paths import REPO_ROOT, shared_data, write_json
from dimmem.runtime.embed import Batcher, make_embedder
from dimmem.runtime.memory import Memory
from eval.retrieval import run_locomo

VARIANTS = {
    "torch": {"backend": "torch", "batch_size": 64},  # as the runtime embedded before
    "onnx fp32": {"backend": "onnx"},
    "onnx int8": {"backend": "onnx", "precision": "int8"},
}
COLD = """
import sys, time
start = time.perf_counter()
from dimmem.runtime.embed import make_embedder
make_embedder(**{settings}).encode(["What did Caroline research?"])
print(time.perf_counter() - start)
"""


def cold_start(settings: dict, rounds: int = 3) -> float:
    """Seconds from a fresh interpreter to the first vector, best of `rounds`."""
    times = []
    for _ in range(rounds):
        done = subprocess.run(
            [sys.executable, "-c", COLD.format(settings=settings)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO_ROOT,
        )
        times.append(float(done.stdout.split()[-1]))
    return round(min(times), 2)


def concurrent(encode, questions: list[str], threads: int, seconds: float) -> dict:
    """Query embeddings/s and per-query latency with `threads` threads asking one text at a time."""
    samples: list[float] = []
    stop = time.monotonic() + seconds

    def ask(offset: int) -> None:
        i = offset
        while time.monotonic() < stop:
            start = time.perf_counter()
            encode([questions[i % len(questions)]])
            samples.append(time.perf_counter() - start)
            i += threads

    workers = [threading.Thread(target=ask, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"queries_per_s": round(len(samples) / seconds, 1), **percentiles(samples)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.embed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--locomo", default=str(shared_data("locomo/locomo10.json")))
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ingest", type=int, default=2000, help="turns embedded for the ingest rate")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the timed loops")
    parser.add_argument("--seconds", type=float, default=10.0, help="each concurrency phase")
    parser.add_argument("--skip-recall", action="store_true", help="timings only")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    conversations = load_conversations("locomo", args.locomo)
    turns = [f"{t.speaker}: {t.text}" for c in conversations for t in c.turns]
    questions = [qa["question"] for c in conversations for qa in c.metadata.get("qa", [])][: args.queries]
    embedders = {name: make_embedder(**settings) for name, settings in VARIANTS.items()}
    reference = embedders["torch"].encode(turns)
    result: dict = {"variants": {}}
    for name, embedder in embedders.items():
        cosine = (embedder.encode(turns) * reference).sum(axis=1)
        result["variants"][name] = {
            "cold_start_s": cold_start(VARIANTS[name]),
            "cosine_mean": round(float(cosine.mean()), 5),
            "cosine_min": round(float(cosine.min()), 5),
            "query": [],
            "ingest": [],
        }
    ingest = turns[: args.ingest]
    for round_ in tqdm(range(args.rounds), desc="timed rounds", disable=None):
        order = list(embedders) if round_ % 2 == 0 else list(reversed(embedders))
        for name in order:
            embedder, row = embedders[name], result["variants"][name]
            for q in questions:
                start = time.perf_counter()
                embedder.encode([q])
                row["query"].append(time.perf_counter() - start)
            start = time.perf_counter()
            for i in range(0, len(ingest), 64):
                embedder.encode(ingest[i : i + 64])
            row["ingest"].append(len(ingest) / (time.perf_counter() - start))
    for row in result["variants"].values():
        row["query"] = percentiles(row["query"])
        row["ingest_texts_per_s"] = round(float(np.median(row.pop("ingest"))))
    if not args.skip_recall:
        for name, embedder in tqdm(embedders.items(), desc="recall", disable=None):
            for memories in ("turns", "observations"):
                memory = Memory({"store": ":memory:", "retrieval": {"depth": 50}}, embedder=embedder)
                scores = run_locomo(args.locomo, memories, [10], memory)
                memory.close()
                result["variants"][name][f"recall@10_{memories}"] = {
                    path: scores[path]["recall@10"] for path in ("bm25", "dense", "dimension", "fused")
                }
    onnx = embedders["onnx fp32"]
    lock = threading.Lock()

    def locked(texts):
        with lock:
            return onnx.encode(texts)

    result["concurrency"] = []
    for threads in (1, 4, 16):
        batcher = Batcher(onnx.encode)
        for name, encode in (("lock", locked), ("batcher", batcher.encode)):
            measured = concurrent(encode, questions, threads, args.seconds)
            result["concurrency"].append({"threads": threads, "embedder": name, **measured})
        result["concurrency"][-1]["texts_per_model_call"] = round(
            result["concurrency"][-1]["queries_per_s"] * args.seconds / max(batcher.calls, 1), 2
        )
    print(format_tables(result))
    if args.out:
        write_json(args.out, result)
    return 0


def format_tables(result: dict) -> str:
    lines = [
        "| embedder | cold start s | query p50 / p95 ms | ingest texts/s | cosine to torch mean (min) | "
        "dense R@10 turns | dense R@10 observations | fused R@10 turns | fused R@10 observations |",
        "|" + "---|" * 9,
    ]
    for name, r in result["variants"].items():
        recall = lambda memories, path, r=r: (  # noqa: E731
            f"{r[f'recall@10_{memories}'][path]:.4f}" if f"recall@10_{memories}" in r else "-"
        )
        lines.append(
            f"| {name} | {r['cold_start_s']} | {r['query']['p50_ms']} / {r['query']['p95_ms']} | "
            f"{r['ingest_texts_per_s']:,} | {r['cosine_mean']} ({r['cosine_min']}) | "
            f"{recall('turns', 'dense')} | {recall('observations', 'dense')} | {recall('turns', 'fused')} | "
            f"{recall('observations', 'fused')} |"
        )
    lines += [
        "",
        "| threads | embedder | queries/s | p50 / p95 ms | texts per model call |",
        "|---|---|---|---|---|",
    ]
    for c in result["concurrency"]:
        lines.append(
            f"| {c['threads']} | {c['embedder']} | {c['queries_per_s']} | {c['p50_ms']} / {c['p95_ms']} | "
            f"{c.get('texts_per_model_call', 1)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
