"""The labeled set of the update benchmark: LoCoMo observation pairs that update filters propose, each
marked by hand as a true update, the same fact restated, or distinct (benchmarks/data/README.md says how).

    python -m benchmarks.update_pairs sample --n 240 --seed 0     # the pairs, unlabeled (done once)
    python -m benchmarks.update_pairs show --out runs/bench/update-pairs.md   # their texts, to label
    python -m benchmarks.update_pairs sample --check --n 160 --seed 1   # a second set, drawn after the
                                                        # update path's rules were set on the first

Half the pairs are drawn from each filter's proposals. They come from adding each conversation's
observations in session order with every record kept (a recording consolidator answers KEEP_BOTH), so
each new observation is proposed against every earlier one a filter lets through: this runtime's first
filter (same type, a shared keyword besides the speaker's name, same speaker, cosine from 0.6) and the
DimMem authors' (keyword Jaccard from 0.3, cosine from 0.7, never a later session). The file holds
observation ids only (`conv-26/S3/obs/41`): LoCoMo's text stays in the shared data folder and is read
from there.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from dimmem.contract.annotations import conversation_gold
from dimmem.contract.loaders import load_conversations
from dimmem.paths import shared_data
from dimmem.runtime.memory import Memory
from eval.retrieval import observation_records

PAIRS = Path(__file__).parent / "data" / "locomo-update-pairs.jsonl"  # the update path's rules were set on it
CHECK = Path(__file__).parent / "data" / "locomo-update-pairs-check.jsonl"  # drawn after: none of PAIRS
CHANGED = Path(__file__).parent / "data" / "changed-attribute-pairs.jsonl"  # hand-written records, not ids
LABELS = ("update", "restated", "distinct")
# the filters whose proposals are sampled: (name, update config)
FILTERS = (
    ("dimmem-v1", {"candidates": "dimmem", "similarity_threshold": 0.6}),
    ("paper", {"candidates": "paper"}),
)


def session_number(record: dict) -> int:
    return int(record["id"].split("/")[1].removeprefix("S"))


def in_session_order(conv) -> list[dict]:
    """The conversation's observations as records, dated by their session, sessions in time order."""
    return sorted(observation_records(conv), key=session_number)  # stable: the annotation order within


def proposals(conversations, embedder=None) -> dict[tuple[str, str], dict]:
    """(new id, earlier id) -> {"filters": [...], "cosine": x}: every pair a filter proposes."""
    found: dict[tuple[str, str], dict] = {}
    for name, update in FILTERS:

        def record(new: dict, candidate: dict, similarity: float, name=name) -> dict:
            pair = found.setdefault(
                (new["id"], candidate["id"]), {"filters": [], "cosine": round(similarity, 4)}
            )
            pair["filters"].append(name)
            return {"action": "KEEP_BOTH", "memory": None}

        memory = Memory({"store": ":memory:", "update": update}, embedder=embedder, consolidator=record)
        for conv in conversations:
            rows = [{**r, "session_time": r["time"]} for r in in_session_order(conv)]
            memory.add_records(rows, user_id=conv.id)
        memory.close()
    return found


def sample(n: int, seed: int, skip: set[tuple[str, str]] = frozenset()) -> list[dict]:
    """`n` pairs, half drawn from each filter's proposals (seeded; a pair both propose counts once), so
    the filter that proposes far fewer is measured on as many pairs; none of `skip`."""
    conversations = load_conversations("locomo", shared_data("locomo/locomo10.json"))
    found = {k: v for k, v in proposals(conversations).items() if k not in skip}
    rng, chosen = random.Random(seed), set()
    for i, (name, _) in enumerate(FILTERS):
        pool = sorted(k for k, v in found.items() if name in v["filters"] and k not in chosen)
        want = (n - len(chosen)) // (len(FILTERS) - i)
        chosen |= set(rng.sample(pool, min(want, len(pool))))
    return [{"new": new, "old": old, **found[(new, old)], "label": None} for new, old in sorted(chosen)]


def load_pairs(path: Path = PAIRS) -> list[dict]:
    """The labeled pairs; a label outside LABELS is a ValueError naming the line."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        row = json.loads(line)
        if row.get("label") not in LABELS:
            raise ValueError(f"{path}: line {number}: label {row.get('label')!r} is not one of {LABELS}")
        rows.append(row)
    return rows


def texts() -> dict[str, dict]:
    """Observation id -> its person, session date and text (from the shared data)."""
    out = {}
    for conv in load_conversations("locomo", shared_data("locomo/locomo10.json")):
        dates = {sid: time for sid, time, _ in conv.sessions}
        for g in conversation_gold(conv).observations:
            out[g.id] = {"person": g.person, "date": (dates[g.session] or "")[:10], "content": g.content}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.update_pairs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="write the unlabeled pairs to benchmarks/data/")
    s.add_argument("--n", type=int, default=240)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--check", action="store_true", help=f"draw {CHECK.name}: pairs not in {PAIRS.name}")
    v = sub.add_parser("show", help="the pairs with their texts, as markdown")
    v.add_argument("--out", required=True)
    v.add_argument("--check", action="store_true", help=f"show {CHECK.name}")
    args = parser.parse_args(argv)
    path = CHECK if args.check else PAIRS
    if args.command == "sample":
        skip = {(r["new"], r["old"]) for r in load_pairs(PAIRS)} if args.check else set()
        rows = sample(args.n, args.seed, skip)
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{len(rows)} pairs -> {path}")
        return 0
    text = texts()
    lines = []
    for i, row in enumerate(json.loads(line) for line in path.read_text().splitlines()):
        new, old = text[row["new"]], text[row["old"]]
        lines += [
            f"## {i + 1}. {row['new']} vs {row['old']} (cosine {row['cosine']}, {', '.join(row['filters'])})",
            f"- OLD [{old['date']}] {old['person']}: {old['content']}",
            f"- NEW [{new['date']}] {new['person']}: {new['content']}",
            f"- label: {row['label']}",
            "",
        ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    print(f"{args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
