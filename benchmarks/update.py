"""The update path measured against truth, each update configuration side by side in one run:

- labeled pairs (benchmarks/data/: the set the rules were set on, and a second one drawn after; both
  marked by hand): each pair's earlier observation stored, then the later one added: is it joined
  (SUPERSEDE, MERGE, HISTORY) when the label is `update` or `restated`, and kept apart when `distinct`?
  Precision and recall of joining; the same for hand-written pairs of a changed attribute (a home, a
  job, a pet, a plan told again in other words, beside look-alikes that change nothing);
- LoCoMo's 2,541 observations (as the annotations teacher writes them: typed, dated, placed) through
  the update path, in session order and shuffled (seeded): what
  is superseded or merged, how often an older record replaced a newer one, comparisons per add, time,
  and the labeled updates whose later record is the one left active (current fact);
- the toy world's known updates (truth: which record replaces which): the current record active and the
  replaced one not, and no other record joined;
- retrieval: LoCoMo's QA evidence R@10 over the observations stored as given and through each path;
- ingest: records/s through the update path against the embedder alone on the same texts (and the
  records stored as given: the store's own share of the cost).

    python -m benchmarks.update [--stores sqlite,postgres] [--llm URL=MODEL|local] [--llm-scope pairs|all]
                                [--configs ours,paper,llm] [--pairs-only] [--out runs/bench/update.json]

Configurations: `ours` (the default `update` section), `paper` (the DimMem authors' filter, the named
baseline), and with `--llm` a model consolidator on that endpoint (the consolidate prompt under
structured outputs; the rules decide when it gives no valid answer). `--llm local` serves the local
teacher (`benchmarks.local_teacher`: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, llama.cpp) for it. A model
decides record by record, seconds each on a CPU, so by default (`--llm-scope pairs`) it runs on the
labeled pairs only, on the first store (its decisions do not depend on the store).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from benchmarks.runtime import backends
from benchmarks.update_pairs import CHANGED, CHECK, PAIRS, load_pairs
from data_gen.annotations import place, record_of
from dimmem.contract.loaders import load_conversations
from dimmem.contract.records import MEMORY_FIELDS, memory_record
from dimmem.contract.toyworld import generate_world
from dimmem.paths import shared_data, write_json
from dimmem.runtime.embed import make_embedder
from dimmem.runtime.memory import EMBED_BATCH, Memory
from dimmem.runtime.update import recency
from eval.retrieval import run_locomo
from eval.toy_truth import truth_records

JOINED = ("SUPERSEDE", "MERGE", "HISTORY")
SAME = ("update", "restated")  # labels whose pair the update path should join
SEEDS = (0, 1)  # shuffled orders


LLM_MAX_TOKENS = 384  # a decision is one record (~150 tokens); a model that loops stops here


def configs(llm: str | None) -> dict[str, dict]:
    out = {"ours": {}, "paper": {"update": {"candidates": "paper"}}}
    if llm:
        url, _, model = llm.partition("=")
        endpoint = {"base_url": url, "model": model, "max_retries": 1, "max_tokens": LLM_MAX_TOKENS}
        out["llm"] = {"consolidator": "model", "model": endpoint}
    return out


def selected(llm: str | None, names: str | None) -> dict[str, dict]:
    """The configurations `--configs` names (all when it names none)."""
    every = configs(llm)
    return {name: every[name] for name in names.split(",") if name in every} if names else every


@contextmanager
def llm_endpoint(llm: str | None, log_dir: Path):
    """`URL=MODEL` as given; `local`: the local teacher served by llama.cpp for the run's length."""
    if llm != "local":
        if llm is not None and not all(llm.partition("=")[::2]):
            raise SystemExit(f"--llm {llm}: give URL=MODEL (an OpenAI-compatible endpoint) or local")
        yield llm
        return
    from benchmarks.local_teacher import teacher_file
    from dimmem.launch import free_port
    from dimmem.llamacpp import llamacpp_service

    port = free_port()
    with llamacpp_service(log_dir / "consolidator.log", teacher_file(), port, name="consolidator"):
        yield f"http://127.0.0.1:{port}/v1=consolidator"


def observation_records(conv) -> list[dict]:
    """The conversation's observations as the annotations teacher writes them (type, time resolved,
    place, keywords: the dimensions the update path decides with), ids as `benchmarks.update_pairs` names
    them, in session order (the annotation order within a session)."""
    turns, people = {t.id: t for t in conv.turns}, set(conv.speakers)
    rows = []
    for p in place(conv)[0]:
        if p.kind == "observation":
            session_time = turns[p.cites[0]].session_time
            rows.append({**record_of(p, turns, people), "id": p.gold.id, "session_time": session_time})
    return sorted(rows, key=lambda r: (r["session_time"], int(r["id"].rsplit("/", 1)[1])))


def written(row: dict) -> dict:
    """A hand-written record of the labeled file, in the contract's shape (blank fields empty)."""
    fields = {k: row[k] for k in MEMORY_FIELDS if k in row}
    return {**memory_record(**fields), "id": row["id"], "session_time": row["session_time"]}


def memory_for(url: str, settings: dict, embedder) -> Memory:
    return Memory({"store": url, **settings}, embedder=embedder)


def labeled_pairs(make, pairs: list[tuple[dict, dict, str]]) -> dict:
    """Each (earlier, later, label) pair in a user of its own: the earlier stored, the later added;
    joined or kept apart. With a model consolidator, also what it decided (`model`) and what fell back to
    the rules (`invalid`, `unavailable`), and its seconds a decision."""
    memory = make("pairs")
    outcome = Counter()
    start = time.perf_counter()
    try:
        for n, (old, new, label) in enumerate(tqdm(pairs, desc="labeled pairs", leave=False, disable=None)):
            memory.add_records([old], user_id=f"p{n}", consolidate=False)
            [event] = memory.add_records([new], user_id=f"p{n}")
            joined = event["action"] in JOINED
            outcome[("joined" if joined else "apart", label)] += 1
        result = _precision_recall(outcome)
        decisions = getattr(memory.consolidator, "stats", None)
        if decisions is not None:
            asked = sum(decisions.values())
            seconds = time.perf_counter() - start
            result["consolidator"] = {**decisions, "seconds_a_decision": round(seconds / max(asked, 1), 1)}
        return result
    finally:
        memory.close()


def _precision_recall(outcome: Counter) -> dict:
    joined = sum(v for (j, _), v in outcome.items() if j == "joined")
    right = sum(outcome[("joined", label)] for label in SAME)
    same = sum(v for (_, label), v in outcome.items() if label in SAME)
    return {
        "joined": joined,
        "joined_right": right,
        "precision": round(right / joined, 4) if joined else None,
        "recall": round(right / same, 4) if same else None,
        "by_label": {f"{j} {label}": v for (j, label), v in sorted(outcome.items())},
    }


def ingest_observations(make, name: str, records: dict, order_seed: int | None, pairs: list[dict]) -> dict:
    """Every conversation's observations through the update path, in session order or shuffled."""
    memory = make(name)
    events, older, start = Counter(), 0, time.perf_counter()
    try:
        for user, rows in records.items():
            rows = list(rows)
            if order_seed is not None:
                random.Random(f"{order_seed}/{user}").shuffle(rows)
            by_id = {r["id"]: r for r in rows}
            for event in memory.add_records(rows, user_id=user):
                events[event["action"]] += 1
                if event["action"] == "SUPERSEDE":  # the new record replaced its target
                    older += recency(by_id[event["id"]]) < recency(by_id[event["target"]])
        seconds = time.perf_counter() - start
        active = {r["id"] for user in records for r in memory.store.records(user)}
        current = [p for p in pairs if p["label"] == "update"]
        stats = memory.stats
        return {
            "events": dict(events),
            "replaced": events["SUPERSEDE"] + events["MERGE"] + events["HISTORY"],
            "older_replaced_newer": older,
            "active": len(active),
            "comparisons_per_add": round(stats["embedding_comparisons"] / max(sum(events.values()), 1), 2),
            "current_fact": round(
                sum(p["new"] in active and p["old"] not in active for p in current) / len(current), 4
            )
            if current
            else None,
            "seconds": round(seconds, 1),
            "active_ids": sorted(active),
        }
    finally:
        memory.close()


def toy_updates(make, seed: int = 1000, conversations: int = 12) -> dict:
    """The toy world's records through the update path. Current fact: each chain of known updates ends
    with its last record active and every record it replaced out of use. Precision: a record joined
    (out of use) is one the truth replaces, or the same text as an active record (told twice)."""
    world = generate_world(conversations, seed, 8, 5)
    memory = make("toy")
    outcome = Counter()
    try:
        for d in world:
            rows = truth_records(d)
            memory.add_records(rows, user_id=d.conversation.id)
            stored = memory.store.records(d.conversation.id)
            active = {r["id"] for r in stored}
            texts = {r["content"].casefold() for r in stored}
            before = {r.id: r.supersedes for r in d.records if r.supersedes}
            for last in set(before) - set(before.values()):  # the end of each chain
                chain, at = [], last
                while at in before:
                    chain.append(before[at])
                    at = before[at]
                outcome["chains"] += 1
                outcome["current"] += last in active and not active & set(chain)
            gone = [r for r in rows if r["id"] not in active]
            outcome["joined"] += len(gone)
            outcome["joined_right"] += sum(
                r["id"] in before.values() or r["content"].casefold() in texts for r in gone
            )
    finally:
        memory.close()
    return {
        "chains": outcome["chains"],
        "current_fact": round(outcome["current"] / outcome["chains"], 4),
        "joined": outcome["joined"],
        "precision": round(outcome["joined_right"] / outcome["joined"], 4) if outcome["joined"] else None,
    }


def ingest_speed(make, name: str, texts: list[str], rows: list[dict], embedder, rounds: int = 3) -> dict:
    """Records/s of the embedder alone on the texts, of the records stored as given (the store's own
    writes), and through the update path, one after the other in each of `rounds` rounds (this machine
    is noisy: the ratios are each round's, their median reported)."""
    speeds: dict[str, list[float]] = {"embedder_alone": [], "as_given": [], "update_path": []}
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(0, len(texts), EMBED_BATCH):
            embedder.encode(texts[i : i + EMBED_BATCH])
        speeds["embedder_alone"].append(len(texts) / (time.perf_counter() - start))
        for column, consolidate in (("as_given", False), ("update_path", True)):
            memory = make(name)
            try:
                start = time.perf_counter()
                memory.add_records(rows, user_id="speed", consolidate=consolidate)
                speeds[column].append(len(rows) / (time.perf_counter() - start))
            finally:
                memory.close()
    alone = speeds["embedder_alone"]
    return {
        **{column: round(statistics.median(values)) for column, values in speeds.items()},
        "ratio": round(statistics.median(p / a for p, a in zip(speeds["update_path"], alone)), 3),
        "as_given_ratio": round(statistics.median(g / a for g, a in zip(speeds["as_given"], alone)), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.update", description=__doc__)
    parser.add_argument("--stores", default="sqlite", help="comma-separated: sqlite,postgres")
    parser.add_argument(
        "--llm",
        help="URL=MODEL: a model consolidator on that OpenAI-compatible endpoint; local: the local teacher",
    )
    parser.add_argument(
        "--llm-scope",
        choices=("pairs", "all"),
        default="pairs",
        help="the model consolidator on the labeled pairs only (first store), or on every measurement",
    )
    parser.add_argument("--configs", help="comma-separated, which of ours,paper,llm to run (default: all)")
    parser.add_argument(
        "--pairs-only",
        action="store_true",
        help="the labeled pairs alone (a minute): no LoCoMo ingest, toy world, ingest speed or retrieval",
    )
    parser.add_argument("--out", default="runs/bench/update.json")
    args = parser.parse_args(argv)
    if args.configs and (unknown := set(args.configs.split(",")) - {"ours", "paper", "llm"}):
        parser.error(f"--configs: unknown {sorted(unknown)}; choose from ours, paper, llm")
    if args.configs and "llm" in args.configs.split(",") and not args.llm:
        parser.error("--configs llm needs --llm URL=MODEL or --llm local")
    conversations = load_conversations("locomo", shared_data("locomo/locomo10.json"))
    records = {c.id: observation_records(c) for c in conversations}
    observations = {r["id"]: r for rows in records.values() for r in rows}
    pairs, check = load_pairs(PAIRS), load_pairs(CHECK)
    labeled_sets = {
        name: [(observations[p["old"]], observations[p["new"]], p["label"]) for p in rows]
        for name, rows in (("pairs", pairs), ("check", check))
    }
    labeled_sets["changed"] = [
        (written(p["old"]), written(p["new"]), p["label"]) for p in load_pairs(CHANGED)
    ]
    embedder = make_embedder()
    files = (PAIRS, CHECK, CHANGED)
    result: dict = {"pairs": {f.name: Counter(p["label"] for p in load_pairs(f)) for f in files}}
    result["stores"] = {}
    stores = args.stores.split(",")
    with (
        tempfile.TemporaryDirectory() as tmp,
        llm_endpoint(args.llm, Path(args.out).parent) as llm,
        backends(stores, Path(tmp)) as made,
    ):
        for store, (fresh, _, _) in made.items():
            out = result["stores"][store] = {}
            made = Counter()
            for name, settings in selected(llm, args.configs).items():
                pairs_only = args.pairs_only or (name == "llm" and args.llm_scope == "pairs")
                if pairs_only and store != stores[0]:
                    continue

                def make(label: str, settings=settings, name=name, fresh=fresh, made=made) -> Memory:
                    made[label] += 1  # each store a database (or file) of its own
                    return memory_for(fresh(f"{name}_{label}_{made[label]}"), settings, embedder)

                row = out[name] = {
                    labeled: labeled_pairs(make, these) for labeled, these in labeled_sets.items()
                }
                if not pairs_only:
                    row.update(locomo_and_toy(make, records, observations, pairs + check, embedder))
                print(name, store, json.dumps(row)[:400], flush=True)
        scope = selected(llm if args.llm_scope == "all" else None, args.configs)
        result["retrieval"] = {} if args.pairs_only else retrieval(records, scope, embedder, Path(tmp))
    write_json(args.out, result)
    print(format_table(result))
    return 0


def locomo_and_toy(make, records: dict, observations: dict, labeled: list[dict], embedder) -> dict:
    """LoCoMo's observations in session order and shuffled, the toy world's updates, ingest speed."""
    row = {"session_order": ingest_observations(make, "locomo", records, None, labeled)}
    shuffled = [ingest_observations(make, "shuffled", records, s, labeled) for s in SEEDS]
    row["shuffled"] = [{k: v for k, v in s.items() if k != "active_ids"} for s in shuffled]
    # records active in one order and not in another (0: the same active set)
    first = set(row["session_order"]["active_ids"])
    row["active_differences"] = [len(first ^ set(s["active_ids"])) for s in shuffled]
    del row["session_order"]["active_ids"]
    row["toy"] = toy_updates(make)
    texts = [o["content"] for o in observations.values()]  # the same texts, embedded twice
    row["ingest"] = ingest_speed(make, "speed", texts, list(observations.values()), embedder)
    return row


def retrieval(records: dict[str, list[dict]], settings: dict[str, dict], embedder, tmp: Path) -> dict:
    """LoCoMo QA evidence R@10 over the observations as given and through each update configuration."""
    from dimmem.contract.tokens import load_tokenizer

    tokenizer = load_tokenizer(str(shared_data("qwen3-tokenizer")))

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    labels = tmp / "observations.jsonl"  # the records in datagen's labels layout, as run_locomo reads them
    labels.write_text(
        "".join(
            json.dumps({"task": "extract", "conversation_id": user, "window_id": user, "memories": rows})
            + "\n"
            for user, rows in records.items()
        )
    )
    out = {}
    for name, extra in {"as given": None, **settings}.items():
        memory = Memory({"store": ":memory:", "retrieval": {"depth": 50}, **(extra or {})}, embedder=embedder)
        r = run_locomo(
            str(shared_data("locomo/locomo10.json")),
            str(labels),
            [10],
            memory,
            count,
            consolidate=extra is not None,
        )
        out[name] = {
            "records": r["records"],
            "recall@10": r["fused"]["recall@10"],
            "tokens@10": r["fused"]["tokens@10"],
        }
        memory.close()
    return out


def format_table(result: dict) -> str:
    lines = [
        "| store | update path | pairs P / R (joined) | second set P / R (joined) | changed attributes P / R "
        "(joined) | joined: session order / "
        "shuffled | older replaced newer | same active set | current fact (LoCoMo / toy) | toy P | "
        "comparisons / add | ingest ratio (stored as given) |",
        "|" + "---|" * 12,
    ]
    for store, rows in result["stores"].items():
        for name, r in rows.items():
            cells = [
                f"{r[s]['precision']} / {r[s]['recall']} ({r[s]['joined']})"
                for s in ("pairs", "check", "changed")
            ]
            if "session_order" in r:
                s = r["session_order"]
                shuffled = " / ".join(str(x["replaced"]) for x in r["shuffled"])
                older = [s["older_replaced_newer"], *(x["older_replaced_newer"] for x in r["shuffled"])]
                cells += [
                    f"{s['replaced']} / {shuffled}",
                    ", ".join(map(str, older)),
                    ", ".join(map(str, r["active_differences"])),
                    f"{s['current_fact']} / {r['toy']['current_fact']}",
                    str(r["toy"]["precision"]),
                    str(s["comparisons_per_add"]),
                    f"{r['ingest']['ratio']} ({r['ingest']['as_given_ratio']})",
                ]
            else:
                cells += ["not run"] * 7
            lines.append(f"| {store} | {name} | " + " | ".join(cells) + " |")
    for store, rows in result["stores"].items():
        for name, r in rows.items():
            for labeled in ("pairs", "check", "changed"):
                if "consolidator" in r[labeled]:
                    lines.append(f"\n{store} {name} {labeled}, decisions: {r[labeled]['consolidator']}")
    lines += ["", "| observations | records | evidence R@10 | tokens@10 |", "|---|---|---|---|"]
    for name, r in result["retrieval"].items():
        lines.append(f"| {name} | {r['records']} | {r['recall@10']:.3f} | {r['tokens@10']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
