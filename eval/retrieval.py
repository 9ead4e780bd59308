"""LLM-free retrieval benchmark on LoCoMo, and the rankings every retrieval benchmark scores
(`question_rankings`: each path alone, BM25+dense and all three as the runtime fuses them, all three
by plain RRF and by the DimMem authors' rule, `dedup`), with context tokens per question
(`ContextTokens`).

Each conversation's memories go into the runtime under their own user; each question of categories 1-4
is parsed by the rule parser (reference date: the last session) and ranked every way, plus weighted RRF
with weights fitted on the other half of the conversations (`_fitted` rows, two-fold cross-fitting). A
ranking's recall@k is the share of the question's evidence turns (`dia_id`) cited by its top k records;
MRR uses the first record citing any evidence turn; tokens@k counts the top k as the QA answer prompt
lists them. The toy-world benchmark is eval/retrieval_toy.py.

    dimmem eval retrieval --benchmark locomo --input locomo10.json \\
        --memories turns|observations|LABELS.jsonl --k 5,10,20 --out retrieval.json
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dimmem.contract.annotations import conversation_gold
from dimmem.contract.conversation import Conversation
from dimmem.contract.loaders import load_conversations
from dimmem.contract.records import memory_record
from dimmem.progress import progress
from dimmem.runtime.extractors import turn_memory
from dimmem.runtime.labels import label_memories
from dimmem.runtime.memory import Memory
from dimmem.runtime.query import content_words, parse_query_rules
from dimmem.runtime.retrieval import fuse, rrf

PATHS = ("bm25", "dense", "dimension")
# each path alone; bm25+dense and `fused` (all three) as the runtime fuses them (`Memory.search`'s
# order); all three by plain RRF, and by the DimMem authors' rule (`retrieval.dedup`, a baseline)
RANKINGS = (*PATHS, "bm25+dense", "rrf", "dedup", "fused")
FITTED = ("bm25+dense_fitted", "fused_fitted")  # weighted RRF, weights cross-fitted (LoCoMo)
# Weighted-RRF grid (bm25's weight fixed at 1: scaling every weight leaves the order unchanged).
WEIGHT_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
HEADLINE_K = 10  # the cut-off tables lead with and weights are fitted on (`headline_k`)


def headline_k(ks: list[int]) -> int:
    """HEADLINE_K when it is one of the requested cut-offs, else the largest requested one."""
    return HEADLINE_K if HEADLINE_K in ks else max(ks)


def rounded_mean(values) -> float:
    """A table's mean, to 4 places (0 for no values)."""
    return round(float(np.mean(values)), 4) if len(values) else 0.0


def turn_records(conv: Conversation) -> list[dict]:
    """Every turn as a record: the raw-turns baseline."""
    return [{**turn_memory(t, t.id), "id": t.id, "conversation_id": conv.id} for t in conv.turns]


def observation_records(conv: Conversation) -> list[dict]:
    """LoCoMo's per-session observations (`dimmem.contract.annotations`: their ids, evidence turns and
    person) with the session's date, as the runtime stores them."""
    dates = {sid: time for sid, time, _ in conv.sessions}
    return [
        {
            "id": g.id,
            **memory_record(
                source_turns=list(g.evidence),
                speaker=g.person,
                content=g.content,
                type="fact",
                time=(dates.get(g.session) or "")[:10] or None,
                keywords=(content_words(g.content) or [g.person])[:12],
            ),
            "conversation_id": conv.id,
        }
        for g in conversation_gold(conv).observations
    ]


def context_line(record: dict) -> str:
    """A record as the answer prompt lists it: its date (or the session's), then its content."""
    when = record.get("time") or (record.get("session_time") or "")[:10] or "undated"
    return f"- [{when}] {record['content']}"


def reply_line(turn: dict) -> str:
    """An assistant reply (recalled through a record's pointer) as the answer prompt lists it."""
    return f"- {turn['text']}"


def question_rankings(
    memory: Memory, question: str, user_id: str, parsed: dict, vector: np.ndarray
) -> tuple[dict[str, list[str]], dict]:
    """Every ranking of RANKINGS for one question (record ids, best first), and the paths' own rankings
    with scores (what weighted fusion is fitted on)."""
    paths = memory.paths(question, user_id, parsed, query_vector=vector)
    out = {name: [rid for rid, _ in ranked] for name, ranked in paths.items()}
    out["rrf"] = [rid for rid, _, _ in rrf(paths)]
    retrieval = memory.config.retrieval
    for name, used in (("bm25+dense", {k: paths[k] for k in ("bm25", "dense")}), ("fused", paths)):
        hits = fuse(
            memory.store,
            user_id,
            used,
            parsed,
            retrieval.depth,
            retrieval.weights,
            retrieval.fusion,
            retrieval.dedup_k,
        )
        out[name] = [hit.record["id"] for hit in hits]
    hits = fuse(memory.store, user_id, paths, parsed, retrieval.depth, None, "dedup", retrieval.dedup_k)
    out["dedup"] = [hit.record["id"] for hit in hits]
    return out, paths


def evidence_of(qa: dict) -> set[str]:
    return {e for item in qa.get("evidence", []) for e in re.split(r"[;,\s]+", item) if e}


def score_ranking(
    ranked: list[str], sources: dict[str, list[str]], evidence: set[str], ks: list[int]
) -> dict:
    out = {}
    for k in ks:
        cited = {t for rid in ranked[:k] for t in sources[rid]}
        out[f"recall@{k}"] = len(cited & evidence) / len(evidence)
    first = next((i for i, rid in enumerate(ranked, start=1) if evidence & set(sources[rid])), None)
    out["mrr"] = 1.0 / first if first else 0.0
    return out


def fit_weights(samples: list[dict], ks: list[int], dimension: bool = True) -> dict[str, float]:
    """The grid's weights that maximise mean recall@`headline_k` of weighted RRF on the samples (with the
    dimension path's weight held at 0 unless `dimension`)."""
    metric = f"recall@{headline_k(ks)}"

    def score(weights):
        return np.mean(
            [
                score_ranking(
                    [rid for rid, _, _ in rrf(s["paths"], weights)], s["sources"], s["evidence"], ks
                )[metric]
                for s in samples
            ]
        )

    grid = [
        {"bm25": 1.0, "dense": d, "dimension": m}
        for d in WEIGHT_GRID
        for m in (WEIGHT_GRID if dimension else (0.0,))
    ]
    return max(
        grid, key=lambda w: (score(w), -abs(w["dense"] - 1) - abs(w["dimension"] - 1))
    )  # ties: nearest plain RRF


def cross_fitted(samples: list[dict], ks: list[int], dimension: bool = True) -> tuple[list[dict], list[dict]]:
    """Two-fold cross-fitting by conversation: weights fitted on one half are scored on the other, so the
    fitted row is not measured on the questions it was fitted to. Returns (scores per sample, weights per
    fold)."""
    conversations = sorted({s["conversation"] for s in samples})
    folds = [set(conversations[0::2]), set(conversations[1::2])]
    scored, fitted = [None] * len(samples), []
    for fold in folds:
        train = [s for s in samples if s["conversation"] not in fold]
        weights = fit_weights(train, ks, dimension) if train else None
        fitted.append(weights)
        for i, s in enumerate(samples):
            if s["conversation"] in fold:
                scored[i] = score_ranking(
                    [rid for rid, _, _ in rrf(s["paths"], weights)], s["sources"], s["evidence"], ks
                )
    return scored, fitted


def run_locomo(
    input_path: str,
    memories: str,
    ks: list[int],
    memory: Memory,
    count_tokens: Callable[[str], int],
    only: list[str] | None = None,
    categories=(1, 2, 3, 4),
    consolidate: bool = False,
) -> dict:
    """`consolidate`: the memories go through the runtime's update path (else stored as given)."""
    conversations = load_conversations("locomo", input_path)
    if only is not None:
        if unknown := sorted(set(only) - {c.id for c in conversations}):
            raise ValueError(f"conversations {unknown} not in {input_path}")
        conversations = [c for c in conversations if c.id in only]
    labels = label_memories(memories) if memories not in ("turns", "observations") else None
    totals: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in (*RANKINGS, *FITTED)}
    per_category: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    samples: list[dict] = []
    recalls = 0  # questions whose parse asks for the assistant's replies
    for conv in progress(conversations, desc="conversations", unit="conv"):
        records = (
            turn_records(conv)
            if memories == "turns"
            else observation_records(conv)
            if memories == "observations"
            else labels.get(conv.id, [])
        )
        if not records:
            continue
        memory.add_records(records, user_id=conv.id, conversation=conv, consolidate=consolidate)
        stored = memory.store.records(conv.id)
        sources = {r["id"]: r["source_turns"] for r in stored}
        tokens = ContextTokens(stored, count_tokens)
        qas = [
            qa for qa in conv.metadata.get("qa", []) if qa.get("category") in categories and evidence_of(qa)
        ]
        vectors = memory.embedder.encode([qa["question"] for qa in qas])
        reference = conv.turns[-1].session_time
        for qa, vector in zip(qas, vectors):
            parsed = parse_query_rules(qa["question"], reference)
            recalls += parsed["need_assistant_context"]
            rankings, paths = question_rankings(memory, qa["question"], conv.id, parsed, vector)
            evidence = evidence_of(qa)
            for name, ranked in rankings.items():
                scores = {**score_ranking(ranked, sources, evidence, ks), **tokens.at(ranked, ks)}
                for metric, value in scores.items():
                    totals[name][metric].append(value)
                    if name == "fused":
                        per_category[qa["category"]][metric].append(value)
            samples.append(
                {"conversation": conv.id, "paths": paths, "sources": sources, "evidence": evidence}
            )
    fitted = {}
    for name, dimension in zip(FITTED, (False, True)):
        scored, fitted[name] = cross_fitted(samples, ks, dimension)
        for sample_scores in scored:
            for metric, value in sample_scores.items():
                totals[name][metric].append(value)
    result = {
        name: {metric: rounded_mean(v) for metric, v in metrics.items()} for name, metrics in totals.items()
    }
    result.update(
        benchmark="locomo",
        memories=memories if labels is None else Path(memories).name,
        questions=len(samples),
        fitted_weights_per_fold=fitted,
        fitted_weights_all=fit_weights(samples, ks) if samples else None,
        categories=list(categories),
        fused_by_category={
            str(c): {m: rounded_mean(v) for m, v in ms.items()} for c, ms in sorted(per_category.items())
        },
        assistant_recall_rate=round(recalls / max(len(samples), 1), 4),
        records=sum(memory.store.count(c.id) for c in conversations),
    )
    return result


class ContextTokens:
    """Context tokens of a ranking's top k: each record's `context_line`, counted once per record."""

    def __init__(self, records: list[dict], count_tokens: Callable[[str], int]):
        self.lines = {r["id"]: context_line(r) for r in records}
        self.count_tokens, self.counted = count_tokens, {}

    def of(self, record_id: str) -> int:
        if record_id not in self.counted:
            self.counted[record_id] = self.count_tokens(self.lines[record_id])
        return self.counted[record_id]

    def at(self, ranked: list[str], ks: list[int]) -> dict[str, int]:
        return {f"tokens@{k}": sum(self.of(rid) for rid in ranked[:k]) for k in ks}


def best_single_path(result: dict, metric: str) -> tuple[str, float]:
    return max(((p, result[p][metric]) for p in PATHS), key=lambda x: x[1])


def format_table(result: dict, ks: list[int]) -> str:
    k10 = headline_k(ks)
    header = "| ranking | " + " | ".join(f"recall@{k}" for k in ks) + f" | MRR | tokens@{k10} |"
    lines = [header, "|" + "---|" * (len(ks) + 3)]
    for name in (*RANKINGS, *FITTED):
        row = result[name]
        tokens = f"{row[f'tokens@{k10}']:.0f}" if f"tokens@{k10}" in row else "-"
        lines.append(
            f"| {name} | "
            + " | ".join(f"{row[f'recall@{k}']:.3f}" for k in ks)
            + f" | {row['mrr']:.3f} | {tokens} |"
        )
    k = f"recall@{k10}"
    best, value = best_single_path(result, k)
    lines.append(
        f"\nfused ({k}) against the best single path ({best}): {result['fused'][k] - value:+.3f}; "
        "the dimension path on top of bm25+dense: "
        f"plain RRF {result['rrf'][k] - result['bm25+dense'][k]:+.3f}, "
        f"fitted weights {result['fused_fitted'][k] - result['bm25+dense_fitted'][k]:+.3f} "
        f"(two-fold by conversation; weights fitted on all questions: {result['fitted_weights_all']})"
    )
    lines.append(
        f"fused ({k}) against the DimMem authors' rule (dedup {result['dedup'][k]:.3f}): "
        f"{result['fused'][k] - result['dedup'][k]:+.3f}; plain RRF against it: "
        f"{result['rrf'][k] - result['dedup'][k]:+.3f}"
    )
    return "\n".join(lines)
