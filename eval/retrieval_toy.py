"""The toy-world retrieval benchmark: memory sets side by side on questions whose evidence is known.

A seeded toy world (longer dialogues than the demo's training world, from the same generator, so an
extractor trained on the demo sees the same kind of windows) is stored once per memory set, each
dialogue under its own user:

- `turns`: every turn a record (the raw-turns baseline);
- `records`: the ground-truth records (what the oracle teacher labels), stored as given;
- `records_content_only`: the same records with no type (all `fact`), no time, place, reason or purpose,
  and only the speaker as keyword (the DimMem ablation that removes the dimensions);
- `records+consolidation`: the ground-truth records through the runtime's update path (its rules: no
  model decides);
- `records+oracle_consolidation`: the same with every decision taken from the world's truth (what a
  perfect consolidation model would decide);
- `<extractor>` and `<extractor>+consolidation` for each configured extractor (a local Hugging Face model
  or export folder: the demo's trained tiny model and its untrained base), which extracts the world's
  windows (answers cached, so a re-run generates nothing).

Every question (eval/toy_truth.py) is parsed by the rule parser on its own reference date and ranked
by every path and fusion (eval/retrieval.py). Per class and overall: recall@k, MRR, current-fact
accuracy (update questions: the current home ranked in the top 10 above every record of a home it
replaced) and context tokens per question at k (the fused top k as the answer prompt lists them, counted
with the Qwen3 tokenizer).

    dimmem eval retrieval --benchmark toy --config configs/eval/retrieval-toy.yaml --out DIR
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dimmem.cache import ResponseCache
from dimmem.contract.records import MEMORY_FIELDS
from dimmem.contract.toyworld import ToyDialogue, generate_world
from dimmem.contract.validate import parse_json
from dimmem.contract.windows import Window
from dimmem.progress import progress
from dimmem.runtime.embed import TextEncoder
from dimmem.runtime.memory import Memory
from eval.retrieval import (
    PATHS,
    RANKINGS,
    ContextTokens,
    best_single_path,
    headline_k,
    question_rankings,
    rounded_mean,
    turn_records,
)
from eval.retrieval_assistant import format_assistant_recall, run_assistant_recall
from eval.toy_truth import CLASSES, Question, dialogue_questions, truth_records

CURRENT_AT = 10  # current-fact accuracy: the current value within this many results


class OracleConsolidator:
    """Consolidation decisions from the world's truth: SUPERSEDE exactly when the new record replaces the
    candidate (a move), KEEP_BOTH otherwise. What a perfect consolidator makes of the update path."""

    def __init__(self, world: list[ToyDialogue]):
        self.truth = {(d.conversation.id, r.content): r for d in world for r in d.records}

    def __call__(self, new: dict, candidate: dict, similarity: float) -> dict:
        key = new.get("conversation_id")
        replaced = self.truth.get((key, new["content"]))
        old = self.truth.get((candidate.get("conversation_id"), candidate["content"]))
        if replaced is not None and old is not None and replaced.supersedes == old.id:
            return {"action": "SUPERSEDE", "memory": {k: new[k] for k in MEMORY_FIELDS}}
        return {"action": "KEEP_BOTH", "memory": None}


class HFExtractor:
    """Extract answers from a local Hugging Face model (greedy, unconstrained, cached): the runtime's
    extractor interface over `eval.extraction.predict_hf`. Unparseable answers map to the reason."""

    def __init__(self, model_path: str, cache: ResponseCache, max_new_tokens: int, batch_size: int):
        self.model_path, self.cache = model_path, cache
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.generated = 0  # windows answered by the model, not the cache

    def __call__(self, windows: list[Window]) -> dict[str, dict | str]:
        from dimmem.contract.prompts import extract_messages
        from eval.extraction import Reference, predict_hf

        refs = [Reference(w.id, extract_messages(w), "", w.scope) for w in windows]
        predictions = predict_hf(refs, self.model_path, self.cache, self.max_new_tokens, self.batch_size)
        self.generated += sum(not p.cached for p in predictions.values())
        answers: dict[str, dict | str] = {}
        for w in windows:
            value, issues = parse_json(predictions[w.id].output)
            answers[w.id] = value if value is not None else f"{w.id}: " + "; ".join(map(str, issues))
        return answers


def extracted_records(
    world: list[ToyDialogue], extractor: HFExtractor, make_memory: Callable[..., Memory]
) -> tuple[dict, dict]:
    """{conversation: records the extractor's valid memories make}, and extraction counts. All windows of
    the world go to the extractor in one call (one model load, batches across dialogues); the runtime's
    own `Memory.extract` then validates and resolves each window's answer."""
    from dimmem.contract.windows import make_windows

    memory = make_memory(extractor=lambda ws: {win.id: answers[win.id] for win in ws})
    try:
        w = memory.config.windows
        windows = [
            win for d in world for win in make_windows(d.conversation, w.window, w.overlap, None, None)
        ]
        answers = extractor(windows)
        out, counts = {}, defaultdict(int)
        for d in world:
            extraction = memory.extract(d.conversation)
            out[d.conversation.id] = extraction.records
            counts["windows"] += extraction.windows
            counts["failed_windows"] += len(extraction.failed)
            counts["rejected_memories"] += len(extraction.rejected)
            counts["records"] += len(extraction.records)
    finally:
        memory.close()
    return out, {**counts, "generated": extractor.generated}


def score_set(
    memory: Memory,
    world: list[ToyDialogue],
    records: dict[str, list[dict]],
    consolidate: bool,
    questions: list[Question],
    vectors: np.ndarray,
    ks: list[int],
    count_tokens,
) -> dict:
    """Store one memory set and rank every question on it."""
    for d in world:
        memory.add_records(
            records[d.conversation.id],
            user_id=d.conversation.id,
            conversation=d.conversation,
            consolidate=consolidate,
        )
    active = {d.conversation.id: memory.store.records(d.conversation.id) for d in world}
    # per user: record ids are only unique within one (a raw turn's id is its turn id, "D1:1")
    sources = {user: {r["id"]: r["source_turns"] for r in rs} for user, rs in active.items()}
    tokens = {user: ContextTokens(rs, count_tokens) for user, rs in active.items()}
    per: dict[str, dict[str, dict[str, list[float]]]] = {
        name: defaultdict(lambda: defaultdict(list)) for name in RANKINGS
    }
    curve = defaultdict(lambda: defaultdict(list))  # class -> k -> recall of `fused` at k (1..max)
    context: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))  # tokens, likewise
    for q, vector in zip(questions, vectors):
        parsed = memory.query_parser(q.question, q.reference_date)
        rankings, _ = question_rankings(memory, q.question, q.conversation_id, parsed, vector)
        cited_by = sources[q.conversation_id]
        for name, ranked in rankings.items():
            scores = score_facts(ranked, cited_by, q, ks)
            if q.kind == "update":
                scores["current_fact"] = float(_current_first(ranked[:CURRENT_AT], cited_by, q))
            for group in (q.kind, "all"):
                for metric, value in scores.items():
                    per[name][group][metric].append(value)
        fused = rankings["fused"]
        every_k = list(range(1, max(ks) + 1))
        recalls = score_facts(fused, cited_by, q, every_k)
        spent = tokens[q.conversation_id].at(fused, every_k)
        for group in (q.kind, "all"):
            for k in every_k:
                curve[group][k].append(recalls[f"recall@{k}"])
                context[group][k].append(spent[f"tokens@{k}"])
    return {
        "records": sum(len(rs) for rs in active.values()),
        "rankings": {
            name: {
                group: {m: rounded_mean(v) for m, v in metrics.items()} for group, metrics in groups.items()
            }
            for name, groups in per.items()
        },
        # `fused` at every k from 1: recall, and context tokens per question
        "fused_recall_curve": {g: [rounded_mean(by_k[k]) for k in sorted(by_k)] for g, by_k in curve.items()},
        "context_tokens_curve": {
            g: [rounded_mean(by_k[k]) for k in sorted(by_k)] for g, by_k in context.items()
        },
    }


def score_facts(ranked: list[str], sources: dict[str, list[str]], q: Question, ks: list[int]) -> dict:
    """recall@k: the share of the question's facts a top-k record cites (any of a fact's turns); MRR:
    the first record citing any evidence turn."""
    out = {}
    for k in ks:
        cited = {t for rid in ranked[:k] for t in sources[rid]}
        out[f"recall@{k}"] = sum(bool(fact & cited) for fact in q.facts) / len(q.facts)
    first = next((i for i, rid in enumerate(ranked, start=1) if q.evidence & set(sources[rid])), None)
    out["mrr"] = 1.0 / first if first else 0.0
    return out


def _current_first(ranked: list[str], sources: dict[str, list[str]], q: Question) -> bool:
    """The current value is cited by a ranked record before any record that cites only replaced ones."""
    for rid in ranked:
        cited = set(sources[rid])
        if q.current in cited:
            return True
        if cited & q.stale:
            return False
    return False


def run_toy(
    cfg,
    ks: list[int],
    embedder: TextEncoder,
    count_tokens: Callable[[str], int],
    cache_path: Path | None = None,
) -> dict:
    """Every memory set of `cfg` (eval.config.ToyRetrieval) on the world's questions; extractor answers
    are cached in `cache_path` (a run without one generates them again)."""
    for name, path in cfg.extractors.items():  # before any work: a typo should not cost a run
        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(
                f"extractor {name}: {path} is not a model folder (a save_pretrained or `dimmem export` "
                "folder; `make demo` writes runs/demo/tiny-base and runs/demo/export-tiny)"
            )
    world = generate_world(cfg.conversations, cfg.seed, cfg.sessions, cfg.stories_per_session)
    questions = [q for d in world for q in dialogue_questions(d, cfg.seed, cfg.questions_per_class)]
    vectors = embedder.encode([q.question for q in questions])

    def fresh_memory(**components) -> Memory:  # consolidator=, extractor=: as `Memory` takes them
        settings = {
            "store": ":memory:",
            "retrieval": {"depth": max([*ks, 50])},
            "windows": cfg.windows.model_dump(),
        }
        return Memory(settings, embedder=embedder, **components)

    by_id = {d.conversation.id: d for d in world}
    records = {cid: truth_records(d) for cid, d in by_id.items()}
    built = {
        "turns": ({cid: turn_records(d.conversation) for cid, d in by_id.items()}, False),
        "records": (records, False),
        "records_content_only": ({cid: truth_records(d, True) for cid, d in by_id.items()}, False),
        "records+consolidation": (records, True),
        "records+oracle_consolidation": (records, OracleConsolidator(world)),
    }
    plans = [(name, *built[name]) for name in cfg.sets]
    extraction = {}
    cache = ResponseCache(cache_path or ":memory:") if cfg.extractors else None
    for name, path in cfg.extractors.items():
        extractor = HFExtractor(path, cache, cfg.max_new_tokens, cfg.batch_size)
        by_conversation, extraction[name] = extracted_records(world, extractor, fresh_memory)
        plans += [(name, by_conversation, False), (f"{name}+consolidation", by_conversation, True)]
    if cache is not None:
        cache.close()
    result = {
        "benchmark": "toy",
        "world": {
            "seed": cfg.seed,
            "conversations": cfg.conversations,
            "sessions": cfg.sessions,
            "stories_per_session": cfg.stories_per_session,
            "turns": sum(len(d.conversation.turns) for d in world),
        },
        "questions": {kind: sum(q.kind == kind for q in questions) for kind in CLASSES}
        | {"all": len(questions)},
        "k": ks,
        "extraction": extraction,
        "sets": {},
    }
    if cfg.assistant_chats:
        k = headline_k(ks)
        others = [(q.question, q.reference_date) for q in questions]
        result["assistant_recall"] = run_assistant_recall(
            cfg.assistant_chats, cfg.seed, k, fresh_memory, count_tokens, others
        )
    for name, by_conversation, consolidate in progress(plans, desc="memory sets", unit="set"):
        # consolidate: False (stored as given), True (the runtime's rules) or a consolidator
        memory = fresh_memory(consolidator=None if isinstance(consolidate, bool) else consolidate)
        try:
            result["sets"][name] = score_set(
                memory, world, by_conversation, bool(consolidate), questions, vectors, ks, count_tokens
            )
        finally:
            memory.close()
    return result


def equal_recall_lines(result: dict, k: int) -> list[str]:
    """Context tokens each memory set needs to reach raw turns' fused recall@k (its smallest such k)."""
    sets = result["sets"]
    if "turns" not in sets:
        return []
    target = sets["turns"]["fused_recall_curve"]["all"][k - 1]
    spent = sets["turns"]["context_tokens_curve"]["all"][k - 1]
    lines = [f"context tokens per question to reach raw turns' R@{k} ({target:.3f}, {spent:.0f} tokens):"]
    for name, s in sets.items():
        if name == "turns":
            continue
        curve = s["fused_recall_curve"]["all"]
        reached = next((i for i, r in enumerate(curve, start=1) if r >= target), None)
        if reached is None:
            lines.append(f"- {name}: not reached by k={len(curve)}")
        else:
            tokens = s["context_tokens_curve"]["all"][reached - 1]
            lines.append(f"- {name}: k={reached}, {tokens:.0f} tokens ({tokens / spent - 1:+.0%})")
    return lines


def fusion_lines(result: dict) -> list[str]:
    """The three paths fused three ways, side by side per memory set: the runtime's score fusion
    (`fused`), plain RRF and the DimMem authors' rule (`dedup`)."""
    k10 = headline_k(result["k"])
    fusions = (("fused", "score"), ("rrf", "rrf"), ("dedup", "dedup"))
    lines = [
        "| memory set | "
        + " | ".join(f"{label} R@{k10}" for _, label in fusions)
        + " | "
        + " | ".join(f"{label} MRR" for _, label in fusions)
        + " | current fact "
        + " / ".join(label for _, label in fusions)
        + " |",
        "|---|" + "---|" * (2 * len(fusions) + 1),
    ]
    for name, s in result["sets"].items():
        r = {ranking: s["rankings"][ranking] for ranking, _ in fusions}
        current = [r[ranking].get("update", {}).get("current_fact") for ranking, _ in fusions]
        lines.append(
            f"| {name} | "
            + " | ".join(f"{r[ranking]['all'][f'recall@{k10}']:.3f}" for ranking, _ in fusions)
            + " | "
            + " | ".join(f"{r[ranking]['all']['mrr']:.3f}" for ranking, _ in fusions)
            + " | "
            + (" / ".join(f"{c:.3f}" for c in current) if None not in current else "-")
            + " |"
        )
    return lines


def format_toy(result: dict) -> str:
    """The overall table (one row per memory set) and the per-class fused recall@10 table."""
    ks = result["k"]
    k10 = headline_k(ks)
    lines = [
        f"{result['questions']['all']} questions over {result['world']['conversations']} dialogues "
        f"({result['world']['turns']} turns); fused = the runtime's search order",
        "",
        "| memory set | records | "
        + " | ".join(f"R@{k}" for k in ks)
        + f" | MRR | current fact | tokens@{k10} | best single path R@{k10} | fused - best |",
        "|---|" + "---|" * (len(ks) + 6),
    ]
    for name, s in result["sets"].items():
        fused = s["rankings"]["fused"]
        overall = {path: s["rankings"][path]["all"] for path in PATHS}
        best_name, best = best_single_path(overall, f"recall@{k10}")
        current = fused.get("update", {}).get("current_fact")
        lines.append(
            f"| {name} | {s['records']} | "
            + " | ".join(f"{fused['all'][f'recall@{k}']:.3f}" for k in ks)
            + f" | {fused['all']['mrr']:.3f} | "
            + (f"{current:.3f}" if current is not None else "-")
            + f" | {s['context_tokens_curve']['all'][k10 - 1]:.0f} | {best_name} {best:.3f} | "
            + f"{fused['all'][f'recall@{k10}'] - best:+.3f} |"
        )
    lines += ["", *equal_recall_lines(result, k10), "", *fusion_lines(result)]
    if "assistant_recall" in result:
        lines += ["", *format_assistant_recall(result["assistant_recall"])]
    classes = [c for c in CLASSES if result["questions"].get(c)]
    lines += [
        "",
        f"fused R@{k10} by question class (and what the dimension path adds to bm25+dense):",
        "",
        "| memory set | " + " | ".join(f"{c} ({result['questions'][c]})" for c in classes) + " |",
        "|---|" + "---|" * len(classes),
    ]
    for name, s in result["sets"].items():
        r = s["rankings"]
        cells = [
            f"{r['fused'][c][f'recall@{k10}']:.3f} "
            f"({r['fused'][c][f'recall@{k10}'] - r['bm25+dense'][c][f'recall@{k10}']:+.3f})"
            for c in classes
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
