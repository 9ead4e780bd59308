"""LLM-free retrieval benchmark on LoCoMo: evidence recall@k and MRR per path and fused.

Each conversation's memories go into the runtime under their own user; each question of categories 1-4
is parsed by the rule parser (reference date: the last session) and answered by every path alone, by
BM25+dense fused, and by all three fused, each fusion both as plain RRF and with weights fitted on the
other half of the conversations (`_fitted` rows, two-fold cross-fitting). A ranking's recall@k is the
share of the question's evidence turns (`dia_id`) cited by its top k records; MRR uses the first record
citing any evidence turn.

    dimmem eval retrieval --benchmark locomo --input locomo10.json \\
        --memories turns|observations|LABELS.jsonl --k 5,10,20 --out retrieval.json
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dimmem.contract.conversation import Conversation
from dimmem.contract.loaders import load_conversations
from dimmem.runtime.extractors import turn_memory
from dimmem.runtime.labels import label_memories
from dimmem.runtime.memory import Memory
from dimmem.runtime.query import content_words, parse_query_rules
from dimmem.runtime.retrieval import rrf

RANKINGS = ("bm25", "dense", "dimension", "bm25+dense", "fused", "bm25+dense_fitted", "fused_fitted")
PATHS = ("bm25", "dense", "dimension")
# Weighted-RRF grid (bm25's weight fixed at 1: scaling every weight leaves the order unchanged).
WEIGHT_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
FIT_AT = 10  # weights are fitted on recall at this cut-off (the largest requested one when 10 is not)


def turn_records(conv: Conversation) -> list[dict]:
    """Every turn as a record: the raw-turns baseline."""
    return [{**turn_memory(t, t.id), "id": t.id, "conversation_id": conv.id} for t in conv.turns]


def observation_records(conv: Conversation) -> list[dict]:
    """LoCoMo's per-session observations, with their dia_id pointers and the session's date."""
    dates = {sid: time for sid, time, _ in conv.sessions}
    records = []
    for key, by_speaker in sorted(conv.metadata.get("observation", {}).items()):
        session = "S" + re.search(r"\d+", key).group(0)
        for speaker, items in by_speaker.items():
            for i, (text, pointer) in enumerate(items):
                turns = [pointer] if isinstance(pointer, str) else list(pointer)
                records.append(
                    {
                        "id": f"{key}/{speaker}/{i}",
                        "source_turns": turns,
                        "speaker": speaker,
                        "content": text,
                        "type": "fact",
                        "time": (dates.get(session) or "")[:10] or None,
                        "location": None,
                        "reason": None,
                        "purpose": None,
                        "keywords": (content_words(text) or [speaker])[:12],
                        "conversation_id": conv.id,
                    }
                )
    return records


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
    """The grid's weights that maximise mean recall@FIT_AT of weighted RRF on the samples (with the
    dimension path's weight held at 0 unless `dimension`)."""
    metric = f"recall@{FIT_AT if FIT_AT in ks else max(ks)}"

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
    input_path: str, memories: str, ks: list[int], memory: Memory, categories=(1, 2, 3, 4)
) -> dict:
    conversations = load_conversations("locomo", input_path)
    labels = label_memories(memories) if memories not in ("turns", "observations") else None
    totals: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in RANKINGS}
    per_category: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    context_words: dict[int, list[int]] = defaultdict(list)
    samples: list[dict] = []
    recalls = 0  # questions whose parse asks for the assistant's replies
    for conv in tqdm(conversations, desc="conversations", unit="conv", disable=None):
        records = (
            turn_records(conv)
            if memories == "turns"
            else observation_records(conv)
            if memories == "observations"
            else labels.get(conv.id, [])
        )
        if not records:
            continue
        memory.add_records(records, user_id=conv.id, conversation=conv, consolidate=False)
        stored = memory.store.records(conv.id)
        sources = {r["id"]: r["source_turns"] for r in stored}
        content = {r["id"]: r["content"] for r in stored}
        qas = [
            qa for qa in conv.metadata.get("qa", []) if qa.get("category") in categories and evidence_of(qa)
        ]
        vectors = memory.embedder.encode([qa["question"] for qa in qas])
        reference = conv.turns[-1].session_time
        for qa, vector in zip(qas, vectors):
            parsed = parse_query_rules(qa["question"], reference)
            recalls += parsed["need_assistant_context"]
            paths = memory.paths(qa["question"], conv.id, parsed, query_vector=vector)
            rankings = {name: [rid for rid, _ in ranked] for name, ranked in paths.items()}
            rankings["bm25+dense"] = [rid for rid, _, _ in rrf({k: paths[k] for k in ("bm25", "dense")})]
            rankings["fused"] = [rid for rid, _, _ in rrf(paths)]
            evidence = evidence_of(qa)
            for name, ranked in rankings.items():
                for metric, value in score_ranking(ranked, sources, evidence, ks).items():
                    totals[name][metric].append(value)
                    if name == "fused":
                        per_category[qa["category"]][metric].append(value)
            for k in ks:
                context_words[k].append(sum(len(content[rid].split()) for rid in rankings["fused"][:k]))
            samples.append(
                {"conversation": conv.id, "paths": paths, "sources": sources, "evidence": evidence}
            )
    fitted = {}
    for name, dimension in (("bm25+dense_fitted", False), ("fused_fitted", True)):
        scored, fitted[name] = cross_fitted(samples, ks, dimension)
        for sample_scores in scored:
            for metric, value in sample_scores.items():
                totals[name][metric].append(value)
    mean = lambda values: round(float(np.mean(values)), 4) if values else 0.0  # noqa: E731
    result = {name: {metric: mean(v) for metric, v in metrics.items()} for name, metrics in totals.items()}
    result.update(
        benchmark="locomo",
        memories=memories if labels is None else Path(memories).name,
        questions=len(samples),
        fitted_weights_per_fold=fitted,
        fitted_weights_all=fit_weights(samples, ks) if samples else None,
        categories=list(categories),
        fused_by_category={
            str(c): {m: mean(v) for m, v in ms.items()} for c, ms in sorted(per_category.items())
        },
        assistant_recall_rate=round(recalls / max(len(samples), 1), 4),
        context_words_per_query={f"@{k}": mean(v) for k, v in context_words.items()},
        records=sum(memory.store.count(c.id) for c in conversations),
    )
    return result


def format_table(result: dict, ks: list[int]) -> str:
    header = "| path | " + " | ".join(f"recall@{k}" for k in ks) + " | MRR |"
    lines = [header, "|" + "---|" * (len(ks) + 2)]
    for name in RANKINGS:
        row = result[name]
        lines.append(
            f"| {name} | " + " | ".join(f"{row[f'recall@{k}']:.3f}" for k in ks) + f" | {row['mrr']:.3f} |"
        )
    k = f"recall@{10 if 10 in ks else ks[-1]}"
    lines.append(
        f"\ndimension path on top of bm25+dense ({k}): "
        f"plain RRF {result['fused'][k] - result['bm25+dense'][k]:+.3f}, "
        f"fitted weights {result['fused_fitted'][k] - result['bm25+dense_fitted'][k]:+.3f} "
        f"(two-fold by conversation; weights fitted on all questions: {result['fitted_weights_all']})"
    )
    return "\n".join(lines)
