"""LLM-free retrieval benchmark on LoCoMo: evidence recall@k and MRR per path and fused.

Each conversation's memories go into the runtime under their own user; each question of categories 1-4
is parsed by the rule parser (reference date: the last session) and answered by every path alone, by
BM25+dense fused, and by all three fused. A ranking's recall@k is the share of the question's evidence
turns (`dia_id`) cited by its top k records; MRR uses the first record citing any evidence turn.

    dimmem eval retrieval --benchmark locomo --input locomo10.json --memories turns|observations|LABELS.jsonl \\
        --k 5,10,20 --out retrieval.json
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dimmem.conversation import Conversation
from dimmem.extractors import turn_memory
from dimmem.loaders import load_conversations
from dimmem.memory import Memory, label_memories
from dimmem.query import content_words, parse_query_rules
from dimmem.retrieval import rrf

RANKINGS = ("bm25", "dense", "dimension", "bm25+dense", "fused")


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
                records.append({"id": f"{key}/{speaker}/{i}", "source_turns": turns, "speaker": speaker, "content": text,
                                "type": "fact", "time": (dates.get(session) or "")[:10] or None, "location": None,
                                "reason": None, "purpose": None, "keywords": (content_words(text) or [speaker])[:12],
                                "conversation_id": conv.id})
    return records


def evidence_of(qa: dict) -> set[str]:
    return {e for item in qa.get("evidence", []) for e in re.split(r"[;,\s]+", item) if e}


def score_ranking(ranked: list[str], sources: dict[str, list[str]], evidence: set[str], ks: list[int]) -> dict:
    out = {}
    for k in ks:
        cited = {t for rid in ranked[:k] for t in sources[rid]}
        out[f"recall@{k}"] = len(cited & evidence) / len(evidence)
    first = next((i for i, rid in enumerate(ranked, start=1) if evidence & set(sources[rid])), None)
    out["mrr"] = 1.0 / first if first else 0.0
    return out


def run_locomo(input_path: str, memories: str, ks: list[int], memory: Memory, categories=(1, 2, 3, 4)) -> dict:
    conversations = load_conversations("locomo", input_path)
    labels = label_memories(memories) if memories not in ("turns", "observations") else None
    totals: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in RANKINGS}
    per_category: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    context_words: dict[int, list[int]] = defaultdict(list)
    questions = 0
    for conv in tqdm(conversations, desc="conversations", unit="conv", disable=None):
        records = (turn_records(conv) if memories == "turns" else observation_records(conv) if memories == "observations"
                   else labels.get(conv.id, []))
        if not records:
            continue
        memory.add_records(records, user_id=conv.id, conversation=conv, consolidate=False)
        stored = memory.store.records(conv.id)
        sources = {r["id"]: r["source_turns"] for r in stored}
        content = {r["id"]: r["content"] for r in stored}
        qas = [qa for qa in conv.metadata.get("qa", []) if qa.get("category") in categories and evidence_of(qa)]
        vectors = memory.embedder.encode([qa["question"] for qa in qas])
        reference = conv.turns[-1].session_time
        for qa, vector in zip(qas, vectors):
            paths = memory.paths(qa["question"], conv.id, parse_query_rules(qa["question"], reference), query_vector=vector)
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
            questions += 1
    mean = lambda values: round(float(np.mean(values)), 4) if values else 0.0  # noqa: E731
    result = {name: {metric: mean(v) for metric, v in metrics.items()} for name, metrics in totals.items()}
    result.update(
        benchmark="locomo", memories=memories if labels is None else Path(memories).name, questions=questions,
        categories=list(categories), fused_by_category={str(c): {m: mean(v) for m, v in ms.items()} for c, ms in sorted(per_category.items())},
        context_words_per_query={f"@{k}": mean(v) for k, v in context_words.items()},
        records=sum(memory.store.count(c.id) for c in conversations),
    )
    return result


def format_table(result: dict, ks: list[int]) -> str:
    header = "| path | " + " | ".join(f"recall@{k}" for k in ks) + " | MRR |"
    lines = [header, "|" + "---|" * (len(ks) + 2)]
    for name in RANKINGS:
        row = result[name]
        lines.append(f"| {name} | " + " | ".join(f"{row[f'recall@{k}']:.3f}" for k in ks) + f" | {row['mrr']:.3f} |")
    return "\n".join(lines)
