"""Labeling jobs for the three tasks: one prompt each, with what the validator and the dataset need."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dimmem.contract.conversation import Conversation
from dimmem.contract.prompts import (
    PromptTemplate,
    consolidate_messages,
    extract_messages,
    load_prompt,
    parse_query_messages,
)
from dimmem.contract.records import MEMORY_FIELDS
from dimmem.contract.validate import TurnScope
from dimmem.contract.windows import Window, window_conversations


@dataclass
class Job:
    task: str
    id: str
    conversation_id: str
    messages: list[dict]
    prompt: PromptTemplate
    scope: TurnScope | None = None
    window: Window | None = None  # extract jobs
    payload: dict = field(default_factory=dict)  # parse_query: question; consolidate: the two records


def extract_jobs(
    conversations: list[Conversation],
    window: int,
    overlap: int,
    max_tokens: int | None,
    count_tokens: Callable[[Window], int] | None,
    limit: int | None = None,
) -> list[Job]:
    prompt = load_prompt("extract")
    windows: list[Window] = []
    for (
        conv
    ) in conversations:  # one at a time, so a --limit smoke run windows (and tokenizes) only what it needs
        if limit is not None and len(windows) >= limit:
            break
        windows += window_conversations([conv], window, overlap, max_tokens, count_tokens)
    windows = windows[:limit]
    return [
        Job("extract", w.id, w.conversation_id, extract_messages(w, prompt), prompt, scope=w.scope, window=w)
        for w in windows
    ]


def questions_of(conv: Conversation) -> list[tuple[str, str, str | None]]:
    """(question id, question, reference date) from the sources that carry questions."""
    source = conv.metadata.get("source")
    last_session = conv.turns[-1].session_time if conv.turns else None
    if source == "locomo":
        return [
            (f"{conv.id}#q{i + 1}", qa["question"], last_session)
            for i, qa in enumerate(conv.metadata.get("qa", []))
            if qa.get("category") != 5
        ]  # category 5 is adversarial (unanswerable): not a retrieval query
    if source == "longmemeval" and "question" in conv.metadata:
        return [
            (f"{conv.id}#q1", conv.metadata["question"], conv.metadata.get("question_time", last_session))
        ]
    return [(q["id"], q["question"], q["reference_date"]) for q in conv.metadata.get("queries", [])]


def parse_query_jobs(conversations: list[Conversation]) -> list[Job]:
    prompt = load_prompt("parse_query")
    return [
        Job(
            "parse_query",
            qid,
            conv.id,
            parse_query_messages(question, ref, conv.speakers, prompt),
            prompt,
            payload={"question": question, "reference_date": ref},
        )
        for conv in conversations
        for qid, question, ref in questions_of(conv)
    ]


def consolidate_jobs(records_by_conversation: dict[str, list[dict]], candidates: int) -> list[Job]:
    """Pair each extracted record with up to `candidates` earlier records of the same type that share a
    keyword other than a speaker's name (the dimension-aware filter: no all-pairs comparison).

    Records are memories in global form (source turns are conversation turn ids) with an `id` and the
    `session_time` of their window.
    """
    prompt = load_prompt("consolidate")
    jobs = []
    for conv_id, records in records_by_conversation.items():
        names = {r["speaker"].casefold() for r in records}
        seen: list[tuple[dict, set[str]]] = []
        for new in records:
            keys = {k.casefold() for k in new["keywords"]} - names
            matches = [old for old, old_keys in seen if old["type"] == new["type"] and keys & old_keys][
                -candidates:
            ]
            for old in matches:
                scope = TurnScope(
                    speakers={
                        **{t: old["speaker"] for t in old["source_turns"]},
                        **{t: new["speaker"] for t in new["source_turns"]},
                    },
                    new=frozenset(old["source_turns"]) | frozenset(new["source_turns"]),
                )
                new_memory, old_memory = ({k: r[k] for k in MEMORY_FIELDS} for r in (new, old))
                messages = consolidate_messages(
                    new_memory, old_memory, new["session_time"], old["session_time"], prompt
                )
                jobs.append(
                    Job(
                        "consolidate",
                        f"{old['id']}~{new['id']}",
                        conv_id,
                        messages,
                        prompt,
                        scope=scope,
                        payload={"new": new, "candidate": old},
                    )
                )
            seen.append((new, keys))
    return jobs
