"""The `dimmem` command: one subcommand per stage."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import yaml
from tqdm import tqdm

from dimmem.paths import CONFIG_DIR, write_json


def _windows_parser(sub) -> None:
    p = sub.add_parser("windows", help="split conversations into overlapping windows and report prompt sizes")
    p.add_argument("--config", default=str(CONFIG_DIR / "windows.yaml"), help="YAML with defaults (flags override)")
    p.add_argument("--format", required=True, help="locomo | longmemeval | chat_jsonl | memorybank")
    p.add_argument("--input", required=True, help="input file")
    p.add_argument("--window", type=int, help="turns per window (W)")
    p.add_argument("--overlap", type=int, help="context turns repeated from the previous window (O)")
    p.add_argument("--max-tokens", type=int, help="budget for the rendered extract prompt; 0 disables it")
    p.add_argument("--tokenizer", help="tokenizer name or folder (default: the target model's)")
    p.add_argument("--out", help="write one JSON line per window here")
    p.add_argument("--stats-json", help="also write the statistics as JSON here")
    p.set_defaults(handler=run_windows)


def run_windows(args) -> int:
    from dimmem.loaders import load_conversations
    from dimmem.prompts import extract_prompt_counter, load_prompt
    from dimmem.tokens import load_tokenizer
    from dimmem.window_stats import format_stats, window_stats
    from dimmem.windows import window_conversations

    config = yaml.safe_load(Path(args.config).read_text())
    preset = config["formats"].get(args.format, {})
    window = args.window or preset.get("window")
    overlap = args.overlap if args.overlap is not None else preset.get("overlap")
    if window is None or overlap is None:
        raise SystemExit(f"no window/overlap preset for format {args.format!r} in {args.config}: pass --window and --overlap")
    budget = config.get("max_tokens") if args.max_tokens is None else args.max_tokens
    budget = budget or None
    conversations = load_conversations(args.format, args.input)  # bad input fails before the slow tokenizer load
    tokenizer = load_tokenizer(args.tokenizer or config["tokenizer"])
    template = load_prompt("extract")
    windows = window_conversations(tqdm(conversations, desc="windowing", unit="conv", disable=None), window, overlap,
                                   budget, extract_prompt_counter(tokenizer, template))

    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as out:
            for w in windows:
                out.write(json.dumps({
                    "conversation_id": w.conversation_id, "window_id": w.id, "window_index": w.index,
                    "context_turns": [t.id for t in w.context], "new_turns": [t.id for t in w.new],
                    "prompt_tokens": w.prompt_tokens, "oversized": w.oversized, "prompt_version": template.id,
                }) + "\n")
    stats = window_stats(windows, len(conversations))
    stats.update(format=args.format, window=window, overlap=overlap, max_tokens=budget, prompt_version=template.id)
    print(f"{args.format} {Path(args.input).name}: W={window} O={overlap} budget={budget or 'none'} prompt={template.id}")
    print(format_stats(stats))
    print("partition: every turn is new in exactly one window (checked)")
    if args.stats_json:
        write_json(args.stats_json, stats)
    return 0


def _train_parser(sub) -> None:
    # Listed for --help only: `main` hands `dimmem train ...` to TRL's own parser (python -m train).
    sub.add_parser("train", help="LoRA SFT (TRL): --config configs/train/NAME.yaml [--any_sft_field value ...]")


def _memory_parser(sub) -> None:
    p = sub.add_parser("memory", help="the memory runtime: add conversations, load extracted records, search")
    msub = p.add_subparsers(dest="memory_command", required=True)

    def common(q, store_required=False):
        q.add_argument("--config", default=str(CONFIG_DIR / "memory" / "default.yaml"), help="runtime YAML (configs/memory/)")
        q.add_argument("--store", required=store_required, help="SQLite file (overrides the config's)")

    add = msub.add_parser("add", help="extract and store conversations (the config's extractor), each as its own user")
    common(add)
    add.add_argument("--format", required=True, help="a dimmem loader format: locomo, longmemeval, chat_jsonl, memorybank")
    add.add_argument("--input", required=True)
    add.add_argument("--user", help="one user for all conversations (default: each conversation's id)")
    add.add_argument("--limit", type=int, help="at most this many conversations")
    add.set_defaults(handler=run_memory_add)
    load = msub.add_parser("load", help="add a datagen labels.jsonl (each conversation as its own user)")
    common(load, store_required=True)
    load.add_argument("--labels", required=True)
    load.set_defaults(handler=run_memory_load)
    search = msub.add_parser("search", help="search one user's memories, showing what each path found")
    common(search, store_required=True)
    search.add_argument("--user", required=True)
    search.add_argument("--k", type=int, default=5)
    search.add_argument("--reference-date", help="resolves relative times in the query (ISO date)")
    search.add_argument("query", nargs="+")
    search.set_defaults(handler=run_memory_search)


def _runtime(args):
    from dimmem.memory import Memory

    return Memory.from_config(args.config, store=args.store)


def _print_update_stats(memory) -> None:
    stats = memory.stats
    saved = 1 - stats["embedding_comparisons"] / max(stats["baseline_comparisons"], 1)
    print(f"{stats['KEEP_BOTH']} kept, {stats['SUPERSEDE']} superseded an older record, {stats['MERGE']} merged; "
          f"embedding comparisons {stats['embedding_comparisons']} vs {stats['baseline_comparisons']} comparing with "
          f"every stored record ({saved:.0%} fewer)")


def run_memory_add(args) -> int:
    from dimmem.loaders import load_conversations

    conversations = load_conversations(args.format, args.input)[:args.limit]
    memory = _runtime(args)
    stored = 0
    for conv in tqdm(conversations, desc="adding", unit="conv", disable=None):
        result = memory.add(conv, user_id=args.user or conv.id)
        stored += sum(e["action"] != "UNCHANGED" for e in result.events)
        for why in [*result.failed.values(), *result.rejected]:
            print(f"  skipped {why}", file=sys.stderr)
    print(f"{len(conversations)} conversations, {memory.stats['windows']} windows, {stored} records into {memory.store.path}; "
          f"{memory.stats['failed_windows']} windows without an answer, {memory.stats['rejected_memories']} memories "
          "refused by the validator")
    _print_update_stats(memory)
    return 0


def run_memory_load(args) -> int:
    from dimmem.memory import label_memories

    memory = _runtime(args)
    by_user = label_memories(args.labels)
    for user, records in tqdm(by_user.items(), desc="loading", unit="user", disable=None):
        memory.add_records(records, user_id=user)
    print(f"{sum(map(len, by_user.values()))} records for {len(by_user)} users into {memory.store.path}")
    _print_update_stats(memory)
    return 0


def run_memory_search(args) -> int:
    result = _runtime(args).search(" ".join(args.query), user_id=args.user, k=args.k, reference_date=args.reference_date)
    q = result.query
    print(f"query: {' '.join(args.query)!r}  types={q['target_types']} time={q['time']} keywords={q['keywords']}")
    for i, hit in enumerate(result.hits, start=1):
        found = ", ".join(f"{name} #{p['rank']}" for name, p in hit.paths.items())
        print(f"{i}. [{hit.record['type']}, {hit.record['time'] or 'no time'}] {hit.record['content']}  ({found})")
    for turn in result.assistant_context:
        print(f"   assistant said: {turn['text']}")
    return 0


# Stages whose flags are defined by their own package (`add_arguments`, `run_cli` in MODULE).
STAGES = {
    "datagen": ("data_gen.cli", "label windows with a teacher model and build the SFT dataset"),
    "export": ("train.export", "export a run: adapter or merged model, model card, Hub push"),
    "eval": ("eval.cli", "extraction quality, memory QA, retrieval benchmarks"),
    "serve": ("serve.cli", "vLLM for the extractor, the HTTP memory service"),
}


def _stage_parser(sub, name: str) -> None:
    module_name, help_text = STAGES[name]
    module = importlib.import_module(module_name)
    p = sub.add_parser(name, help=help_text)
    module.add_arguments(p)
    p.set_defaults(handler=module.run_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dimmem", description="DimMem compact memory extractor pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    _windows_parser(sub)
    _stage_parser(sub, "datagen")
    _train_parser(sub)
    _stage_parser(sub, "export")
    _stage_parser(sub, "eval")
    _memory_parser(sub)
    _stage_parser(sub, "serve")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from train.__main__ import main as train_main

        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, OSError) as exc:  # bad input: say what and where, no traceback
        print(f"dimmem {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
