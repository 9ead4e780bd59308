"""`dimmem eval ...` / `python -m eval ...`: benchmarks of the extractor and the memory runtime.

Each subcommand runs from flags, from a YAML (`--config configs/eval/NAME.yaml`, see eval/config.py for
its keys), or both (flags and `--set key=value` override the file)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from dimmem.config import add_set_argument
from eval.sources import SOURCES


def int_list(text: str) -> list[int]:
    """`5,10,20` -> [5, 10, 20] (argparse names this function in its message for a bad value)."""
    return [int(part) for part in text.split(",") if part.strip()]


def str_list(text: str) -> list[str]:
    """`conv-26,conv-30` -> ["conv-26", "conv-30"]."""
    return [part.strip() for part in text.split(",") if part.strip()]


def name_path(text: str) -> tuple[str, str]:
    """`trained=runs/demo/export-tiny` -> ("trained", "runs/demo/export-tiny")."""
    name, sep, path = text.partition("=")
    if not (sep and name and path):
        raise ValueError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a YAML with this run's settings (configs/eval/)")
    add_set_argument(p, "model.max_tokens=512")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(
        dest="eval_command", required=True, metavar="{retrieval,extraction,qa,compare}"
    )
    _add_retrieval_arguments(sub)
    _add_extraction_arguments(sub)
    _add_qa_arguments(sub)
    _add_compare_arguments(sub)


def _add_retrieval_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("retrieval", help="LLM-free evidence recall@k and MRR per retrieval path")
    _common(p)
    p.add_argument("--benchmark", choices=["locomo", "toy"])
    p.add_argument("--input", help="locomo10.json")
    p.add_argument(
        "--memories",
        help="LoCoMo: turns | observations | a datagen labels.jsonl (or an extraction run's records.jsonl)",
    )
    p.add_argument("--conversations", type=str_list, help="LoCoMo: only these, e.g. conv-26,conv-30")
    p.add_argument("--k", type=int_list, help="comma-separated cut-offs (default 5,10,20)")
    p.add_argument("--store", help="LoCoMo: SQLite file or Postgres URL (default: in memory)")
    p.add_argument("--tokenizer", help="counts context tokens (default: the shared Qwen3 tokenizer)")
    p.add_argument(
        "--extractor",
        type=name_path,
        action="append",
        help="toy: NAME=MODEL_DIR, a local model whose extracted records are a memory set too (repeatable)",
    )
    p.add_argument("--out", help="write the results as JSON here")


def _add_extraction_arguments(sub: argparse._SubParsersAction) -> None:
    from dimmem.contract.formats import ExtractFormatName

    x = sub.add_parser(
        "extraction",
        help="an extractor vs a datagen split's reference answers, or vs LoCoMo's own annotations",
    )
    _common(x)
    x.add_argument(
        "--benchmark",
        choices=["references", "locomo"],
        help="references (a datagen split, the default) or locomo (its observations and events as gold)",
    )
    x.add_argument(
        "--references", help="data_gen output or dataset folder, DIR[:split] (default split: test)"
    )
    x.add_argument("--input", help="locomo: locomo10.json (default: the shared data's)")
    x.add_argument(
        "--conversations",
        type=str_list,
        help="locomo: score only these conversations, e.g. conv-26,conv-30 (those no training saw)",
    )
    answers = x.add_argument_group("the answers to score (exactly one source)")
    for source in SOURCES:
        answers.add_argument(source.flag, choices=source.choices, help=source.help)
    x.add_argument("--model", help="model name at --base-url")
    x.add_argument("--api-key-env", help="environment variable holding the endpoint's API key")
    x.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="structured outputs with the window's schema (endpoint only; default on)",
    )
    x.add_argument(
        "--extractor-format",
        choices=get_args(ExtractFormatName),
        help="what the model speaks: dimmem (default), or the DimMem authors' format (their checkpoints)",
    )
    x.add_argument("--max-tokens", type=int, help="generation budget per window (default 1024)")
    x.add_argument("--concurrency", type=int, help="requests in flight (endpoint)")
    x.add_argument("--batch-size", type=int, help="--hf-model generation batch")
    x.add_argument("--limit", type=int, help="at most this many windows")
    x.add_argument("--out", help="run folder (metrics.json, report.md, plots, cache)")


def _add_qa_arguments(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser(
        "qa", help="end-to-end memory QA: ingest, retrieve, answer, judge (LoCoMo, LongMemEval)"
    )
    _common(q)
    q.add_argument("--benchmark", choices=["locomo", "longmemeval"])
    q.add_argument("--input")
    q.add_argument(
        "--memory-config", help="runtime YAML: its extractor ingests the conversations (configs/memory/)"
    )
    q.add_argument("--labels", help="ingest a data_gen labels.jsonl instead of running the extractor")
    for role in ("answer", "judge"):
        q.add_argument(f"--{role}-base-url")
        q.add_argument(f"--{role}-model")
        q.add_argument(f"--{role}-api-key-env", help="environment variable holding the key")
    q.add_argument("--k", type=int, help="memories retrieved per question (default 10)")
    q.add_argument("--categories", type=int_list, help="LoCoMo categories, default 1,2,3,4 (5: adversarial)")
    q.add_argument("--limit", type=int, help="at most this many questions (smoke runs)")
    q.add_argument(
        "--full-context",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the whole conversation in the answer prompt instead of retrieved memories (the baseline)",
    )
    q.add_argument("--runs", type=int, help="answer and judge every question this many times (mean ± std)")
    q.add_argument("--judge-max-tokens", type=int, help="the judge's token budget (default 256)")
    q.add_argument("--out", help="run folder (metrics.json, answers.jsonl, cache, store)")


def _add_compare_arguments(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compare", help="two extraction runs side by side, with deltas")
    c.add_argument("run_a")
    c.add_argument("run_b")


def load_run(args: argparse.Namespace):
    """The subcommand's run config: its YAML (if any), then `--set`, then the flags given."""
    from dimmem.config import load_config
    from eval.config import FLAGS, ExtractionRun, QARun, RetrievalRun

    model = {"extraction": ExtractionRun, "qa": QARun, "retrieval": RetrievalRun}[args.eval_command]
    flags = {key: getattr(args, flag) for flag, key in FLAGS[args.eval_command].items()}
    if flags.get("toy.extractors") is not None:  # repeated NAME=PATH flags
        flags["toy.extractors"] = dict(flags["toy.extractors"])
    return load_config(model, args.config, args.overrides, flags=flags)


def run(args: argparse.Namespace) -> int:
    handler = {
        "extraction": run_extraction,
        "qa": run_qa_cli,
        "retrieval": run_retrieval,
        "compare": run_compare,
    }
    return handler[args.eval_command](args)


def run_extraction(args: argparse.Namespace) -> int:
    import time

    from dimmem.cache import ResponseCache

    cfg = load_run(args)
    out = Path(cfg.out)
    cache = ResponseCache(out / "cache.sqlite")
    if cfg.benchmark == "locomo":
        from eval.extraction_locomo import run_locomo
        from eval.report import locomo_summary

        print(locomo_summary(run_locomo(cfg, out, cache), out))
        return 0
    from eval.extraction import attach_windows, evaluate, load_references
    from eval.sources import answers

    refs = load_references(cfg.references, cfg.limit)
    if cfg.extractor_format != "dimmem" and not cfg.predictions:
        refs = attach_windows(refs, cfg.references)
    start = time.perf_counter()
    predictions, source = answers(cfg, refs, cache)
    wall = time.perf_counter() - start
    run_info = {
        "name": out.name,
        "references": cfg.references,
        "source": source.name,
        "model": source.label(cfg),
        "constrained": bool(cfg.model and cfg.model.structured_outputs),
        "max_tokens": cfg.max_tokens,
        "extractor_format": cfg.extractor_format,
    }
    metrics = evaluate(refs, predictions, out, run_info, wall if source.generates else None)
    print(
        f"{metrics['windows']} windows: parse {metrics['parse_rate']:.3f}, "
        f"schema-valid {metrics['schema_valid_rate']:.3f}, "
        f"memory F1 {metrics['memory_f1']:.3f}, type {metrics['type_accuracy']:.3f}, "
        f"time {metrics['time_exact']:.3f}, "
        f"keywords {metrics['keyword_f1']:.3f}, headline {metrics['headline']:.1f}  ->  {out}/report.md"
    )
    return 0


def run_qa_cli(args: argparse.Namespace) -> int:
    from dimmem.cache import ResponseCache
    from dimmem.llm import ModelClient
    from dimmem.runtime.memory import Memory
    from eval.qa import format_table, run_qa

    cfg = load_run(args)
    out = Path(cfg.out)
    cache = ResponseCache(out / "cache.sqlite")
    answer, judge = (
        ModelClient(m, cache=cache, key_extra={"endpoint": m.base_url}) for m in (cfg.answer, cfg.judge)
    )
    memory = Memory.from_config(cfg.memory_config, store=str(out / "memory.sqlite"))
    metrics = run_qa(
        cfg.benchmark,
        cfg.input,
        memory,
        answer,
        judge,
        out,
        cfg.k,
        set(cfg.categories),
        cfg.limit,
        cfg.labels,
        cfg.full_context,
        cfg.runs,
        cfg.judge_max_tokens,
    )
    print(format_table(metrics))
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from eval.report import compare

    print(compare(args.run_a, args.run_b))
    return 0


def run_retrieval(args: argparse.Namespace) -> int:
    from dimmem.contract.tokens import load_tokenizer
    from dimmem.paths import shared_data, write_json
    from dimmem.runtime.memory import Memory

    cfg = load_run(args)
    ks = cfg.k
    tokenizer = load_tokenizer(cfg.tokenizer or str(shared_data("qwen3-tokenizer")))

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    if cfg.benchmark == "toy":
        from dimmem.runtime.embed import make_embedder
        from eval.retrieval_toy import format_toy, run_toy

        cache = Path(cfg.out).with_suffix(".cache.sqlite") if cfg.out else None
        result = run_toy(cfg.toy, ks, make_embedder(), count_tokens, cache)
        print(format_toy(result))
        if cfg.out:
            from eval.report import plot_recall_tokens

            print(f"plot: {plot_recall_tokens(result, Path(cfg.out).with_suffix('.png'))}")
    else:
        from eval.retrieval import format_table, run_locomo

        memory = Memory({"store": cfg.store, "retrieval": {"depth": max([*ks, 50])}})
        result = run_locomo(cfg.input, cfg.memories, ks, memory, count_tokens, cfg.conversations)
        print(f"{result['questions']} questions, {result['records']} memories ({result['memories']})")
        print(format_table(result, ks))
    if cfg.out:
        write_json(cfg.out, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    from dimmem.errors import run_command

    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__)
    add_arguments(parser)
    return run_command("eval", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
