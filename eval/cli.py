"""`dimmem eval ...` / `python -m eval ...`: benchmarks of the extractor and the memory runtime."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", required=True)
    p = sub.add_parser("retrieval", help="LLM-free evidence recall@k and MRR per retrieval path")
    p.add_argument("--benchmark", choices=["locomo"], default="locomo")
    p.add_argument("--input", required=True, help="locomo10.json")
    p.add_argument("--memories", default="turns", help="turns | observations | a datagen labels.jsonl")
    p.add_argument("--k", default="5,10,20", help="comma-separated cut-offs")
    p.add_argument("--store", default=":memory:", help="SQLite file for the memories (default: in memory)")
    p.add_argument("--out", help="write the results as JSON here")


def run_cli(args: argparse.Namespace) -> int:
    from dimmem.memory import Memory
    from eval.retrieval import format_table, run_locomo

    ks = [int(k) for k in args.k.split(",")]
    result = run_locomo(args.input, args.memories, ks, Memory(args.store, depth=max(ks + [50])))
    print(f"{result['questions']} questions, {result['records']} memories ({result['memories']})")
    print(format_table(result, ks))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__)
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
