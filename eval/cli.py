"""`dimmem eval ...` / `python -m eval ...`: benchmarks of the extractor and the memory runtime."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dimmem.paths import CONFIG_DIR, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", required=True)
    p = sub.add_parser("retrieval", help="LLM-free evidence recall@k and MRR per retrieval path")
    p.add_argument("--benchmark", choices=["locomo"], default="locomo")
    p.add_argument("--input", required=True, help="locomo10.json")
    p.add_argument("--memories", default="turns", help="turns | observations | a datagen labels.jsonl")
    p.add_argument("--k", default="5,10,20", help="comma-separated cut-offs")
    p.add_argument("--store", default=":memory:", help="SQLite file for the memories (default: in memory)")
    p.add_argument("--out", help="write the results as JSON here")
    p.set_defaults(eval_handler=run_retrieval)

    x = sub.add_parser("extraction", help="schema adherence and field-level quality of an extractor vs reference answers")
    x.add_argument("--references", required=True, help="data_gen output or dataset folder, DIR[:split] (default split: test)")
    source = x.add_mutually_exclusive_group(required=True)
    source.add_argument("--base-url", help="an OpenAI-compatible endpoint serving the extractor")
    source.add_argument("--hf-model", help="a local Hugging Face model or export folder (transformers generation)")
    source.add_argument("--predictions", help="stored answers, JSONL {window_id, output, finish_reason?, completion_tokens?}")
    x.add_argument("--model", help="model name at --base-url")
    x.add_argument("--api-key-env", help="environment variable holding the endpoint's API key")
    x.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=True,
                   help="structured outputs with the strict schema (endpoint only; --hf-model is unconstrained)")
    x.add_argument("--max-tokens", type=int, default=1024)
    x.add_argument("--concurrency", type=int, default=8)
    x.add_argument("--batch-size", type=int, default=8, help="--hf-model generation batch")
    x.add_argument("--limit", type=int, help="at most this many windows")
    x.add_argument("--out", required=True, help="run folder (metrics.json, report.md, plots, cache)")
    x.set_defaults(eval_handler=run_extraction)

    q = sub.add_parser("qa", help="end-to-end memory QA: ingest, retrieve, answer, judge (LoCoMo, LongMemEval)")
    q.add_argument("--benchmark", choices=["locomo", "longmemeval"], required=True)
    q.add_argument("--input", required=True)
    q.add_argument("--memory-config", default=str(CONFIG_DIR / "memory" / "default.yaml"),
                   help="runtime YAML: its extractor ingests the conversations (configs/memory/)")
    q.add_argument("--labels", help="ingest a data_gen labels.jsonl instead of running the extractor")
    for role in ("answer", "judge"):
        q.add_argument(f"--{role}-base-url", required=True)
        q.add_argument(f"--{role}-model", required=True)
        q.add_argument(f"--{role}-api-key-env", help="environment variable holding the key")
    q.add_argument("--k", type=int, default=10, help="memories retrieved per question")
    q.add_argument("--categories", default="1,2,3,4", help="LoCoMo categories (5: adversarial)")
    q.add_argument("--limit", type=int, help="at most this many questions (smoke runs)")
    q.add_argument("--out", required=True, help="run folder (metrics.json, answers.jsonl, cache, store)")
    q.set_defaults(eval_handler=run_qa_cli)

    c = sub.add_parser("compare", help="two extraction runs side by side, with deltas")
    c.add_argument("run_a")
    c.add_argument("run_b")
    c.set_defaults(eval_handler=run_compare)


def run_cli(args: argparse.Namespace) -> int:
    return args.eval_handler(args)


def run_extraction(args: argparse.Namespace) -> int:
    import time

    from eval.extraction import PredictionCache, evaluate, load_references, predict_endpoint, predict_hf, read_predictions

    refs = load_references(args.references, args.limit)
    out = Path(args.out)
    cache = PredictionCache(out / "cache.sqlite")
    start = time.perf_counter()
    if args.predictions:
        predictions, source, model = read_predictions(args.predictions), "predictions", args.predictions
    elif args.hf_model:
        predictions, source, model = predict_hf(refs, args.hf_model, cache, args.max_tokens, args.batch_size), "hf", args.hf_model
    else:
        from dimmem.llm import ChatModel

        if not args.model:
            raise SystemExit("--base-url needs --model")
        chat = ChatModel(args.base_url, args.model, api_key_env=args.api_key_env,
                         constrained=args.constrained, max_tokens=args.max_tokens)
        predictions, source, model = predict_endpoint(refs, chat, cache, args.concurrency), "endpoint", args.model
    wall = time.perf_counter() - start
    run = {"name": out.name, "references": args.references, "source": source, "model": model,
           "constrained": bool(args.constrained and args.base_url), "max_tokens": args.max_tokens}
    metrics = evaluate(refs, predictions, out, run, wall)
    print(f"{metrics['windows']} windows: parse {metrics['parse_rate']:.3f}, schema-valid {metrics['schema_valid_rate']:.3f}, "
          f"memory F1 {metrics['memory_f1']:.3f}, type {metrics['type_accuracy']:.3f}, time {metrics['time_exact']:.3f}, "
          f"keywords {metrics['keyword_f1']:.3f}, headline {metrics['headline']:.1f}  ->  {out}/report.md")
    return 0


def run_qa_cli(args: argparse.Namespace) -> int:

    from dimmem.llm import ChatModel
    from dimmem.memory import Memory
    from eval.qa import format_table, run_qa

    def model(role: str) -> ChatModel:
        return ChatModel(getattr(args, f"{role}_base_url"), getattr(args, f"{role}_model"),
                         api_key_env=getattr(args, f"{role}_api_key_env"), temperature=0.0)

    out = Path(args.out)
    memory = Memory.from_config(args.memory_config, store=str(out / "memory.sqlite"))
    metrics = run_qa(args.benchmark, args.input, memory, model("answer"), model("judge"), out, args.k,
                     {int(c) for c in args.categories.split(",")}, args.limit, args.labels)
    print(format_table(metrics))
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from eval.report import compare

    print(compare(args.run_a, args.run_b))
    return 0


def run_retrieval(args: argparse.Namespace) -> int:
    from dimmem.memory import Memory
    from eval.retrieval import format_table, run_locomo

    ks = [int(k) for k in args.k.split(",")]
    result = run_locomo(args.input, args.memories, ks, Memory(args.store, depth=max(ks + [50])))
    print(f"{result['questions']} questions, {result['records']} memories ({result['memories']})")
    print(format_table(result, ks))
    if args.out:
        write_json(args.out, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__)
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
