"""The update path as one user's store grows: ingest through it against the embedder alone on the same
texts, and search latency, at each of `--sizes` records in one user, on both store backends.

    python -m benchmarks.update_scale --sizes 1000,10000,40000,100000 --stores sqlite,postgres \\
        --out runs/bench/update-scale

One store per backend grows through the sizes. The records are LoCoMo turn texts, each text present in
near-duplicate variants (two words added) dated apart, added 500 at a time through the update path; ten
small users of 400 records share the store. The fill's vectors are looked up (computed once per LoCoMo
text, plus noise), so filling times the store and the rules, not the model. At each size, `--probe` new
variants go through the update path with the real embedder (ONNX MiniLM, as the runtime runs it) and the
embedder alone encodes another `--probe` texts just as new, alternately, `--rounds` times; the ratio is
each round's, the median reported. Then `--queries` LoCoMo questions are searched in the big user.
OUT/summary.json holds the numbers, OUT/update-scale.png the curves.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.runtime import backends, percentiles, synthetic
from dimmem.contract.loaders import load_conversations
from dimmem.paths import shared_data, write_json
from dimmem.runtime.embed import make_embedder
from dimmem.runtime.memory import EMBED_BATCH, Memory

ADD = 500  # records per add_records, as a client adding a conversation's records would


class Precomputed:
    """The fill's vectors by text; any other text (a probe, a query) goes to the real embedder."""

    def __init__(self, encoder):
        self.encoder, self.table = encoder, {}

    def encode(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.table]
        computed = dict(zip(missing, self.encoder.encode(missing))) if missing else {}
        return np.stack([self.table[t] if t in self.table else computed[t] for t in texts])


def records(
    n: int, texts: list[str], vectors: np.ndarray, prefix: str, seed: int
) -> list[tuple[dict, np.ndarray]]:
    """n near-duplicate variants of the LoCoMo texts (ids `prefix`N), each with a vector near its text's."""
    return [({**r, "id": f"{prefix}{r['id'][1:]}"}, v) for r, v in synthetic(n, texts, vectors, seed=seed)]


def fill(memory: Memory, user: str, rows: list[tuple[dict, np.ndarray]], table: dict, desc: str) -> float:
    """Add the rows through the update path with their vectors looked up; seconds taken."""
    table.update((r["content"], v) for r, v in rows)
    start = time.perf_counter()
    for i in tqdm(range(0, len(rows), ADD), desc=desc, unit=f"x{ADD}", disable=None):
        memory.add_records([r for r, _ in rows[i : i + ADD]], user_id=user)
    return time.perf_counter() - start


def probe(memory: Memory, encoder, fresh: list[list[dict]], alone: list[list[str]]) -> dict:
    """Records/s through the update path (real embedder) and of the embedder alone, round by round."""
    path_rates, alone_rates = [], []
    for batch, texts in zip(fresh, alone):
        start = time.perf_counter()
        for i in range(0, len(texts), EMBED_BATCH):  # the batches the update path embeds in
            encoder.encode(texts[i : i + EMBED_BATCH])
        alone_rates.append(len(texts) / (time.perf_counter() - start))
        start = time.perf_counter()
        for i in range(0, len(batch), ADD):
            memory.add_records(batch[i : i + ADD], user_id="big")
        path_rates.append(len(batch) / (time.perf_counter() - start))
    return {
        "update_path_per_s": round(statistics.median(path_rates), 1),
        "embedder_alone_per_s": round(statistics.median(alone_rates), 1),
        "ratio": round(statistics.median(p / a for p, a in zip(path_rates, alone_rates)), 3),
    }


def searches(memory: Memory, questions: list[str]) -> dict:
    memory.search(questions[0], user_id="big", k=10)  # the user's indexes read once, not timed
    samples = []
    for question in questions:
        start = time.perf_counter()
        memory.search(question, user_id="big", k=10, reference_date="2023-10-01")
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def run_store(url: str, sizes: list[int], data: dict, args) -> list[dict]:
    encoder = data["encoder"]
    embedder = Precomputed(encoder)
    memory = Memory({"store": url}, embedder=embedder)
    out, stored, seed = [], 0, 100
    try:
        for user in range(args.small_users):  # the neighbours the big user shares the store with
            fill(
                memory,
                f"small{user}",
                records(400, *data["corpus"], f"s{user}-", seed + user),
                embedder.table,
                "small users",
            )
        for size in sizes:
            rows = records(max(size - stored, 0), *data["corpus"], f"f{size}-", size)
            fill_s = fill(memory, "big", rows, embedder.table, f"fill to {size:,}")
            stored = max(size, stored)

            # new texts for every round: an embedder (or a cache) never sees a text twice
            def new(prefix: str, draw: int) -> list[dict]:
                return [r for r, _ in records(args.probe, *data["corpus"], prefix, draw)]

            fresh = [new(f"p{size}-{k}-", 7 * size + k) for k in range(args.rounds)]
            alone = [[r["content"] for r in new(f"a{size}-{k}-", 11 * size + k)] for k in range(args.rounds)]
            row = {
                "size": stored,
                "fill_ms_per_record": round(fill_s / len(rows) * 1000, 3) if rows else None,
                **probe(memory, encoder, fresh, alone),
            }
            stored += args.probe * args.rounds
            row["search"] = searches(memory, data["questions"][: args.queries])
            row["decisions"] = {a: memory.stats[a] for a in ("KEEP_BOTH", "SUPERSEDE", "MERGE")}
            print(row, flush=True)
            out.append(row)
    finally:
        memory.close()
    return out


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ratio, search) = plt.subplots(1, 2, figsize=(10, 4))
    for store, rows in result["stores"].items():
        sizes = [r["size"] for r in rows]
        ratio.plot(sizes, [r["ratio"] for r in rows], "o-", label=store)
        search.plot(sizes, [r["search"]["p50_ms"] for r in rows], "o-", label=f"{store} p50")
        search.plot(sizes, [r["search"]["p95_ms"] for r in rows], "x--", label=f"{store} p95", alpha=0.6)
    ratio.axhline(1.0, color="grey", lw=0.8)
    ratio.set(
        xscale="log",
        ylim=(0, 1.2),
        xlabel="records of the user",
        ylabel="ingest / embedder alone",
        title="Ingest through the update path",
    )
    search.set(xscale="log", xlabel="records of the user", ylabel="ms", title="Search (k=10)")
    for ax in (ratio, search):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.update_scale", description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,40000,100000", help="records of the big user")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--probe", type=int, default=1000, help="records a round at each size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--small-users", type=int, default=10)
    parser.add_argument("--out", default="runs/bench/update-scale")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if sizes[0] < 1:
        parser.error("--sizes: positive record counts")
    conversations = load_conversations("locomo", shared_data("locomo/locomo10.json"))
    texts = [f"{t.speaker}: {t.text}" for c in conversations for t in c.turns]
    questions = [qa["question"] for c in conversations for qa in c.metadata.get("qa", [])]
    encoder = make_embedder()
    data = {"encoder": encoder, "corpus": (texts, encoder.encode(texts)), "questions": questions}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.stores.split(",") if n]
    result: dict = {"sizes": sizes, "probe": args.probe, "rounds": args.rounds, "stores": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir, backends(names, Path(workdir)) as made:
        for name in names:
            result["stores"][name] = run_store(made[name][0]("scale"), sizes, data, args)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    write_json(out / "summary.json", result)
    plot(result, out / "update-scale.png")
    for name, rows in result["stores"].items():
        for r in rows:
            print(
                f"{name} {r['size']:>7,}: ingest {r['update_path_per_s']}/s against the embedder's "
                f"{r['embedder_alone_per_s']}/s = {r['ratio']:.2f}x; fill {r['fill_ms_per_record']} ms a "
                f"record; search p50 {r['search']['p50_ms']} ms"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
