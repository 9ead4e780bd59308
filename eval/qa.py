"""`dimmem eval qa`: end-to-end memory QA. Each conversation is ingested into the runtime (through the
extractor its config names, or from a data_gen labels file), each question is answered by an answer
model from what `Memory.search` returns, and the answer is judged against the gold answer by a judge
model (both OpenAI-compatible).

    dimmem eval qa --benchmark locomo --input locomo10.json --memory-config configs/memory/served.yaml \\
        --answer-base-url URL --answer-model M --judge-base-url URL --judge-model J --out DIR [--limit 50]

LoCoMo: categories 1-4 (5, adversarial, with --categories 1,2,3,4,5), lenient CORRECT/WRONG judging.
LongMemEval: one question per instance, judged with its question type's criterion (eval/prompts/qa.v1.yaml).
Answers and judgments are cached in DIR/cache.sqlite and the store persists in DIR/memory.sqlite, so a
killed run resumes without re-ingesting or re-asking.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path

import numpy as np
import yaml
from tqdm import tqdm

from dimmem.cache import Completion
from dimmem.contract.loaders import load_conversations
from dimmem.contract.prompts import PromptTemplate, human_date
from dimmem.llm import ModelClient
from dimmem.runtime.labels import label_memories
from dimmem.runtime.memory import Memory
from eval.metrics import token_f1, tokens

PROMPTS = Path(__file__).parent / "prompts" / "qa.v1.yaml"


@cache
def prompts() -> dict:
    spec = yaml.safe_load(PROMPTS.read_text())
    return {
        "answer": PromptTemplate(
            "qa_answer", spec["version"], spec["answer"]["system"], spec["answer"]["user"]
        ),
        "judge": PromptTemplate("qa_judge", spec["version"], spec["judge"]["system"], spec["judge"]["user"]),
        "criteria": spec["criteria"],
    }


def bleu1(candidate: str, reference: str) -> float:
    """BLEU-1: clipped unigram precision times the brevity penalty (one reference)."""
    c, r = tokens(candidate), tokens(reference)
    if not c or not r:
        return float(c == r)
    clipped = sum((Counter(c) & Counter(r)).values())
    penalty = 1.0 if len(c) > len(r) else float(np.exp(1 - len(r) / len(c)))
    return penalty * clipped / len(c)


def questions(conv, benchmark: str, categories: set[int]) -> list[dict]:
    """{id, question, gold, category, reference date} for one conversation."""
    if benchmark == "longmemeval":
        meta = conv.metadata
        qtype = "abstention" if conv.id.endswith("_abs") else meta.get("question_type", "default")
        return [
            {
                "id": conv.id,
                "question": meta["question"],
                "gold": str(meta["answer"]),
                "category": qtype,
                "reference": meta.get("question_time") or conv.turns[-1].session_time,
            }
        ]
    out = []
    for i, qa in enumerate(conv.metadata.get("qa", [])):
        if qa.get("category") in categories:
            gold = qa.get("answer", qa.get("adversarial_answer", ""))
            out.append(
                {
                    "id": f"{conv.id}#q{i + 1}",
                    "question": qa["question"],
                    "gold": str(gold),
                    "category": str(qa["category"]),
                    "reference": conv.turns[-1].session_time,
                }
            )
    return out


def ask(client: ModelClient, qid: str, messages: list[dict], max_tokens: int) -> Completion:
    """A free-text answer, from the client's cache when this exact request was answered before."""
    return client.send(client.body(None, messages, max_tokens), label=qid)


def run_qa(
    benchmark: str,
    input_path: str,
    memory: Memory,
    answer: ModelClient,
    judge: ModelClient,
    out: Path,
    k: int,
    categories: set[int],
    limit: int | None = None,
    labels: str | None = None,
) -> dict:
    """Answers and judgments go through the clients' response cache (the CLI keeps it in OUT/cache.sqlite)."""
    out.mkdir(parents=True, exist_ok=True)
    conversations = load_conversations(benchmark, input_path)
    by_conversation = label_memories(labels) if labels else None
    rows, search_seconds, ingested = [], [], 0
    todo = [(conv, q) for conv in conversations for q in questions(conv, benchmark, categories)][:limit]
    needed = list(dict.fromkeys(conv.id for conv, _ in todo))
    for conv in tqdm(
        [c for c in conversations if c.id in needed], desc="ingesting", unit="conv", disable=None
    ):
        if memory.store.has_turns(conv.id):
            continue  # already in the store from an earlier (interrupted) run
        if by_conversation is not None:
            memory.add_records(by_conversation.get(conv.id, []), user_id=conv.id, conversation=conv)
        else:
            memory.add(conv, user_id=conv.id)
        ingested += 1
    template = prompts()
    for conv, q in tqdm(todo, desc="answering", unit="question", disable=None):
        start = time.perf_counter()
        result = memory.search(q["question"], user_id=conv.id, k=k, reference_date=q["reference"])
        search_seconds.append(time.perf_counter() - start)
        memories = [
            f"- [{h.record.get('time') or (h.record.get('session_time') or '')[:10] or 'undated'}] "
            f"{h.record['content']}"
            for h in result.hits
        ]
        assistant = [f"- {t['text']}" for t in result.assistant_context]
        messages = template["answer"].render(
            memories=memories, assistant=assistant, question=q["question"], today=human_date(q["reference"])
        )
        given = ask(answer, q["id"], messages, 128)
        given_text = given.text.strip()
        criterion = template["criteria"].get(q["category"], "") if benchmark == "longmemeval" else ""
        verdict = ask(
            judge,
            q["id"],
            template["judge"].render(
                question=q["question"], gold=q["gold"], answer=given_text, criterion=criterion
            ),
            8,
        )
        verdict_text = verdict.text.strip()
        rows.append(
            {
                **q,
                "answer": given_text,
                "judgment": verdict_text,
                "correct": bool(re.match(r"\W*correct\b", verdict_text, re.IGNORECASE)),
                "f1": token_f1(given_text, q["gold"]),
                "bleu1": bleu1(given_text, q["gold"]),
                "context_words": sum(len(line.split()) for line in memories + assistant),
                "assistant_recall": bool(result.query.get("need_assistant_context")),
                "answer_seconds": given.seconds,
                "hits": [h.record["id"] for h in result.hits],
            }
        )
    with open(out / "answers.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    metrics = summarize(rows, search_seconds)
    metrics.update(
        benchmark=benchmark,
        k=k,
        conversations_ingested=ingested,
        answer_model=answer.model,
        judge_model=judge.model,
    )
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def summarize(rows: list[dict], search_seconds: list[float]) -> dict:
    def block(group: list[dict]) -> dict:
        return {
            "questions": len(group),
            "judge_accuracy": float(np.mean([r["correct"] for r in group])),
            "f1": float(np.mean([r["f1"] for r in group])),
            "bleu1": float(np.mean([r["bleu1"] for r in group])),
        }

    by_category: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_category[r["category"]].append(r)
    ms = np.array(search_seconds or [0.0]) * 1000
    return {
        **(block(rows) if rows else {"questions": 0}),
        "by_category": {c: block(g) for c, g in sorted(by_category.items())},
        "context_words_per_query": float(np.mean([r["context_words"] for r in rows])) if rows else 0.0,
        "assistant_recall_rate": float(np.mean([r["assistant_recall"] for r in rows])) if rows else 0.0,
        "search_ms": {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95))},
    }


def format_table(metrics: dict) -> str:
    lines = ["| category | questions | judge accuracy | F1 | BLEU-1 |", "|---|---|---|---|---|"]
    for name, b in [*metrics["by_category"].items(), ("all", metrics)]:
        lines.append(
            f"| {name} | {b['questions']} | {b['judge_accuracy']:.3f} | {b['f1']:.3f} | {b['bleu1']:.3f} |"
        )
    return "\n".join(lines) + (
        f"\n\ncontext words/query {metrics['context_words_per_query']:.0f}, assistant recall "
        f"{metrics['assistant_recall_rate']:.1%}, search p50/p95 {metrics['search_ms']['p50']:.0f}/"
        f"{metrics['search_ms']['p95']:.0f} ms"
    )
