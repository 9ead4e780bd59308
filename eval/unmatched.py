"""A seeded sample of the records a LoCoMo benchmark run matched to no observation, as a markdown table
to classify by hand (true but unannotated, or wrong): precision against incomplete gold is a lower bound,
and this says by how much.

    python -m eval.unmatched runs/eval/locomo-turns --n 30 [--seed 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def unmatched(run: Path, n: int, seed: int) -> list[dict]:
    """`n` kept records (with their window and cited turns) that match no observation, drawn at random."""
    if not (run / "windows.jsonl").is_file():
        raise FileNotFoundError(
            f"{run}: no windows.jsonl (dimmem eval extraction --benchmark locomo writes it)"
        )
    pool = []
    with open(run / "windows.jsonl", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if "gold" not in row:
                raise ValueError(f"{run}: not a LoCoMo benchmark run (its windows carry no gold)")
            turns = {t["id"]: t for t in row["turns"]}
            pool += [
                {**r, "window_id": row["window_id"], "cited": [turns[t] for t in r["source_turns"]]}
                for r in row["records"]
                if r["match"] is None
            ]
    return random.Random(seed).sample(pool, min(n, len(pool)))


def table(records: list[dict]) -> str:
    lines = ["| # | record | cited turn(s) | verdict |", "|---|---|---|---|"]
    for i, r in enumerate(records, start=1):
        cited = " / ".join(f"{t['id']} {t['speaker']}: {t['text']}" for t in r["cited"])
        cells = [str(i), r["content"], cited, ""]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.unmatched", description=__doc__)
    parser.add_argument("run", type=Path, help="a dimmem eval extraction --benchmark locomo run folder")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the table here (default: print it)")
    args = parser.parse_args(argv)
    try:
        text = table(unmatched(args.run, args.n, args.seed))
    except (OSError, ValueError) as exc:
        print(f"python -m eval.unmatched: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
