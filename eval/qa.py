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

`--full-context` answers from the whole conversation instead (the baseline a memory must beat on cost
at equal accuracy); `--runs N` answers and judges every question N times (mean ± std). A judge reply
with no verdict is asked once more, then counted as a judge failure: never correct, and reported
(`judge_failures`, `judge_failure_rate`). The judge gets `--judge-max-tokens` (256) to reason first.
metrics.json pins the prompts (file, version, sha256) and gives answer prompt tokens per question as
the answer model's server counted them.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import yaml

from dimmem.cache import Completion
from dimmem.contract.loaders import load_conversations
from dimmem.contract.prompts import PromptTemplate, human_date
from dimmem.llm import ModelClient
from dimmem.progress import progress
from dimmem.runtime.labels import label_memories
from dimmem.runtime.memory import Memory
from eval.metrics import token_f1, tokens
from eval.retrieval import context_line, reply_line, turn_records

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


def ask(client: ModelClient, qid: str, messages: list[dict], max_tokens: int, salt=None) -> Completion:
    """A free-text answer, from the client's cache when this exact request was answered before (`salt`:
    another run of the same request, asked anew)."""
    return client.send(client.body(None, messages, max_tokens), salt=salt, label=qid)


_VERDICT = re.compile(r"\b(CORRECT|INCORRECT|WRONG)\b")
_THINKING = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
REASK = "\n\nReply with exactly one word: CORRECT or WRONG."


def verdict(text: str) -> str | None:
    """CORRECT, WRONG, or None when the judge's reply says neither. Reasoning before the verdict is
    allowed (the last upper-case CORRECT / WRONG / INCORRECT wins, `<think>` blocks skipped), as is a
    JSON object holding it or the one word in any case; "is not correct" in prose is not a verdict."""
    text = _THINKING.sub("", text).strip()
    try:
        value = json.loads(text)
        if isinstance(value, dict):
            text = " ".join(str(v) for v in value.values())
    except ValueError:
        pass
    if word := re.fullmatch(r"\W*(correct|incorrect|wrong)\W*", text, re.IGNORECASE):
        found = word.group(1).upper()
    else:
        found = (_VERDICT.findall(text) or [None])[-1]
    return {"CORRECT": "CORRECT", "INCORRECT": "WRONG", "WRONG": "WRONG"}.get(found) if found else None


def judge_answer(judge: ModelClient, qid: str, messages: list[dict], max_tokens: int, salt=None) -> dict:
    """The judge's verdict, asked once more with a stricter instruction when its reply holds none; then a
    judge failure (counted apart, never silently WRONG)."""
    replies = []
    for attempt in range(2):
        if attempt:  # the same grading prompt, ending in the instruction to answer in one word
            messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + REASK}]
        reply = ask(judge, qid, messages, max_tokens, salt).text.strip()
        replies.append(reply)
        if (found := verdict(reply)) is not None:
            return {"verdict": found, "judge_replies": replies, "judge_failed": False}
    return {"verdict": None, "judge_replies": replies, "judge_failed": True}


def prompt_pin() -> dict:
    """Which answer and judge prompts a run used: the file, its version and the hash of its text."""
    text = PROMPTS.read_text(encoding="utf-8")
    return {
        "file": f"eval/prompts/{PROMPTS.name}",
        "version": yaml.safe_load(text)["version"],
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }


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
    full_context: bool = False,
    runs: int = 1,
    judge_max_tokens: int = 256,
) -> dict:
    """Answers and judgments go through the clients' response cache (the CLI keeps it in OUT/cache.sqlite).
    `full_context`: the whole conversation in the answer prompt instead of retrieved memories (nothing is
    ingested). `runs`: every question answered and judged that many times (run r > 0 asks anew; with a
    sampling temperature the runs differ), reported as mean and standard deviation."""
    out.mkdir(parents=True, exist_ok=True)
    conversations = load_conversations(benchmark, input_path)
    by_conversation = label_memories(labels) if labels else None
    todo = [(conv, q) for conv in conversations for q in questions(conv, benchmark, categories)][:limit]
    needed = list(dict.fromkeys(conv.id for conv, _ in todo))
    ingested = ingest(
        memory, [] if full_context else [c for c in conversations if c.id in needed], by_conversation
    )
    rows, search_seconds = [], []
    for run, (conv, q) in progress(
        [(r, item) for r in range(runs) for item in todo], desc="answering", unit="question"
    ):
        context = answer_context(memory, conv, q, k, full_context)
        if context.search_seconds is not None:
            search_seconds.append(context.search_seconds)
        rows.append(answer_and_judge(answer, judge, benchmark, q, run, context, judge_max_tokens))
    with open(out / "answers.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    metrics = summarize(rows, search_seconds)
    metrics.update(
        benchmark=benchmark,
        mode="full-context" if full_context else "memory",
        k=None if full_context else k,
        conversations_ingested=ingested,
        answer_model=answer.model,
        judge_model=judge.model,
        judge_max_tokens=judge_max_tokens,
        prompts=prompt_pin(),
    )
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def ingest(memory: Memory, conversations: list, by_conversation: dict | None) -> int:
    """Stores each conversation not stored yet, from its labels when given (else through the extractor);
    returns how many were ingested now."""
    ingested = 0
    for conv in progress(conversations, desc="ingesting", unit="conv"):
        if memory.store.conversations.has_turns(conv.id):
            continue  # already in the store from an earlier (interrupted) run
        if by_conversation is not None:
            memory.add_records(by_conversation.get(conv.id, []), user_id=conv.id, conversation=conv)
        else:
            memory.add(conv, user_id=conv.id)
        ingested += 1
    return ingested


class AnswerContext(NamedTuple):
    """What the answer prompt is given for one question, and how it was found."""

    memories: list[str]
    assistant: list[str]  # the assistant's replies the hits point at
    hits: list[str]  # record ids, best first
    assistant_recall: bool  # the parsed query asked for what the assistant said
    search_seconds: float | None  # None: no search (full context)


def answer_context(memory: Memory, conv, q: dict, k: int, full_context: bool) -> AnswerContext:
    """The whole conversation, each turn listed as a raw-turn memory is, or what `Memory.search` returns."""
    if full_context:
        return AnswerContext([context_line(r) for r in turn_records(conv)], [], [], False, None)
    start = time.perf_counter()
    result = memory.search(q["question"], user_id=conv.id, k=k, reference_date=q["reference"])
    seconds = time.perf_counter() - start
    return AnswerContext(
        [context_line(h.record) for h in result.hits],
        [reply_line(t) for t in result.assistant_context],
        [h.record["id"] for h in result.hits],
        bool(result.query.get("need_assistant_context")),
        seconds,
    )


def answer_and_judge(
    answer: ModelClient,
    judge: ModelClient,
    benchmark: str,
    q: dict,
    run: int,
    context: AnswerContext,
    judge_max_tokens: int,
) -> dict:
    """One question's row in answers.jsonl: the answer from the context, its verdict and its scores."""
    template = prompts()
    salt = run or None  # run 0 is the request a single run makes (its cache entries stay valid)
    messages = template["answer"].render(
        memories=context.memories,
        assistant=context.assistant,
        question=q["question"],
        today=human_date(q["reference"]),
    )
    given = ask(answer, q["id"], messages, 128, salt)
    given_text = given.text.strip()
    criterion = template["criteria"].get(q["category"], "") if benchmark == "longmemeval" else ""
    judged = judge_answer(
        judge,
        q["id"],
        template["judge"].render(
            question=q["question"], gold=q["gold"], answer=given_text, criterion=criterion
        ),
        judge_max_tokens,
        salt,
    )
    return {
        **q,
        "run": run,
        "answer": given_text,
        "judgment": judged["verdict"] or judged["judge_replies"][-1],
        "judge_replies": judged["judge_replies"],
        "judge_failed": judged["judge_failed"],
        "correct": judged["verdict"] == "CORRECT",
        "f1": token_f1(given_text, q["gold"]),
        "bleu1": bleu1(given_text, q["gold"]),
        "context_words": sum(len(line.split()) for line in context.memories + context.assistant),
        "answer_prompt_tokens": given.input_tokens,
        "assistant_recall": context.assistant_recall,
        "answer_seconds": given.seconds,
        "hits": context.hits,
    }


def summarize(rows: list[dict], search_seconds: list[float]) -> dict:
    def block(group: list[dict]) -> dict:
        return {
            "questions": len(group),
            "judge_accuracy": float(np.mean([r["correct"] for r in group])),
            "f1": float(np.mean([r["f1"] for r in group])),
            "bleu1": float(np.mean([r["bleu1"] for r in group])),
        }

    by_category: dict[str, list[dict]] = defaultdict(list)
    by_run: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_category[r["category"]].append(r)
        by_run[r["run"]].append(r)
    ms = np.array(search_seconds or [0.0]) * 1000
    tokens = [r["answer_prompt_tokens"] for r in rows if r.get("answer_prompt_tokens") is not None]
    per_run = [block(group)["judge_accuracy"] for _, group in sorted(by_run.items())]
    return {
        **(block(rows) if rows else {"questions": 0}),
        "runs": len(by_run),
        # per run, then over runs: a judge's (or a sampling answerer's) spread beside its accuracy
        "judge_accuracy_per_run": per_run,
        "judge_accuracy_std": float(np.std(per_run)) if per_run else 0.0,
        "judge_failures": sum(r["judge_failed"] for r in rows),
        "judge_failure_rate": float(np.mean([r["judge_failed"] for r in rows])) if rows else 0.0,
        "by_category": {c: block(g) for c, g in sorted(by_category.items())},
        "context_words_per_query": float(np.mean([r["context_words"] for r in rows])) if rows else 0.0,
        "answer_prompt_tokens_per_query": float(np.mean(tokens)) if tokens else None,
        "assistant_recall_rate": float(np.mean([r["assistant_recall"] for r in rows])) if rows else 0.0,
        "search_ms": {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95))},
    }


def format_table(metrics: dict) -> str:
    lines = ["| category | questions | judge accuracy | F1 | BLEU-1 |", "|---|---|---|---|---|"]
    for name, b in [*metrics["by_category"].items(), ("all", metrics)]:
        lines.append(
            f"| {name} | {b['questions']} | {b['judge_accuracy']:.3f} | {b['f1']:.3f} | {b['bleu1']:.3f} |"
        )
    tokens = metrics.get("answer_prompt_tokens_per_query")
    lines += [
        "",
        f"{metrics['mode']}: judge accuracy {metrics['judge_accuracy']:.3f}"
        f" ± {metrics['judge_accuracy_std']:.3f} over {metrics['runs']} run(s);"
        f" judge failures {metrics['judge_failures']}"
        f" ({metrics['judge_failure_rate']:.1%}, not counted correct)",
        f"answer prompt tokens/query {tokens:.0f}"
        if tokens is not None
        else "answer prompt tokens: not reported",
        f"context words/query {metrics['context_words_per_query']:.0f}, assistant recall "
        f"{metrics['assistant_recall_rate']:.1%}, search p50/p95 {metrics['search_ms']['p50']:.0f}/"
        f"{metrics['search_ms']['p95']:.0f} ms; "
        f"prompts {metrics['prompts']['file']} v{metrics['prompts']['version']}",
    ]
    return "\n".join(lines)
