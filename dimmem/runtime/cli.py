"""`dimmem memory add|load|search`: the memory runtime from the command line.

Each command builds the runtime from `--config` (configs/memory/*.yaml), with `--store` and any
`--set KEY=VALUE` (dotted keys, e.g. `--set retrieval.depth=100`) overriding it. Heavy imports (the
runtime, the embedder) wait for the handler: `dimmem --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from dimmem.paths import CONFIG_DIR

DEFAULT_CONFIG = CONFIG_DIR / "memory" / "default.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="memory_command", required=True, metavar="{add,load,search}")

    def common(p: argparse.ArgumentParser, store_required: bool = False) -> None:
        p.add_argument("--config", default=str(DEFAULT_CONFIG), help="runtime YAML (configs/memory/)")
        p.add_argument("--store", required=store_required, help="SQLite file (overrides the config's)")
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config key (dotted, e.g. retrieval.depth=100); repeatable",
        )

    add = sub.add_parser(
        "add", help="extract and store conversations (the config's extractor), each as its own user"
    )
    common(add)
    add.add_argument(
        "--format", required=True, help="a dimmem loader format: locomo, longmemeval, chat_jsonl, memorybank"
    )
    add.add_argument("--input", required=True)
    add.add_argument("--user", help="one user for all conversations (default: each conversation's id)")
    add.add_argument("--limit", type=int, help="at most this many conversations")
    add.set_defaults(memory_handler=run_add)

    load = sub.add_parser("load", help="add a datagen labels.jsonl (each conversation as its own user)")
    common(load, store_required=True)
    load.add_argument("--labels", required=True)
    load.set_defaults(memory_handler=run_load)

    search = sub.add_parser("search", help="search one user's memories, showing what each path found")
    common(search, store_required=True)
    search.add_argument("--user", required=True)
    search.add_argument("--k", type=int, default=5)
    search.add_argument("--reference-date", help="resolves relative times in the query (ISO date)")
    search.add_argument("query", nargs="+")
    search.set_defaults(memory_handler=run_search)


def run(args: argparse.Namespace) -> int:
    return args.memory_handler(args)


def _runtime(args: argparse.Namespace):
    from dimmem.runtime.memory import Memory

    return Memory.from_config(args.config, args.overrides, store=args.store)


def _print_update_stats(memory) -> None:
    stats = memory.stats
    saved = 1 - stats["embedding_comparisons"] / max(stats["baseline_comparisons"], 1)
    print(
        f"{stats['KEEP_BOTH']} kept, {stats['SUPERSEDE']} superseded an older record, "
        f"{stats['MERGE']} merged; embedding comparisons {stats['embedding_comparisons']} vs "
        f"{stats['baseline_comparisons']} comparing with every stored record ({saved:.0%} fewer)"
    )


def run_add(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from dimmem.contract.loaders import load_conversations

    conversations = load_conversations(args.format, args.input)[: args.limit]
    memory = _runtime(args)
    stored = 0
    for conv in tqdm(conversations, desc="adding", unit="conv", disable=None):
        result = memory.add(conv, user_id=args.user or conv.id)
        stored += sum(e["action"] != "UNCHANGED" for e in result.events)
        for why in [*result.failed.values(), *result.rejected]:
            print(f"  skipped {why}", file=sys.stderr)
    print(
        f"{len(conversations)} conversations, {memory.stats['windows']} windows, {stored} records into "
        f"{memory.store.path}; {memory.stats['failed_windows']} windows without an answer, "
        f"{memory.stats['rejected_memories']} memories refused by the validator"
    )
    _print_update_stats(memory)
    return 0


def run_load(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from dimmem.runtime.labels import label_memories

    by_user = label_memories(args.labels)  # bad input fails before the slow embedder load
    memory = _runtime(args)
    for user, records in tqdm(by_user.items(), desc="loading", unit="user", disable=None):
        memory.add_records(records, user_id=user)
    print(f"{sum(map(len, by_user.values()))} records for {len(by_user)} users into {memory.store.path}")
    _print_update_stats(memory)
    return 0


def run_search(args: argparse.Namespace) -> int:
    query = " ".join(args.query)
    result = _runtime(args).search(query, user_id=args.user, k=args.k, reference_date=args.reference_date)
    q = result.query
    print(f"query: {query!r}  types={q['target_types']} time={q['time']} keywords={q['keywords']}")
    for i, hit in enumerate(result.hits, start=1):
        found = ", ".join(f"{name} #{p['rank']}" for name, p in hit.paths.items())
        record = hit.record
        print(f"{i}. [{record['type']}, {record['time'] or 'no time'}] {record['content']}  ({found})")
    for turn in result.assistant_context:
        print(f"   assistant said: {turn['text']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dimmem memory", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
