"""Assistant recall, measured on toy user-assistant chats (`toyworld.generate_assistant_chat`).

Records hold what the user said and point at the user's turn; the assistant's own reply is fetched
through that pointer only when the parsed query asks for it (`need_assistant_context`: "what did you
suggest for my knee?"). Each chat asks, per request for help, one question that needs the assistant's
reply and one that does not; the toy world's retrieval questions join them for the trigger rate.
Compared on the records (top k of `Memory.search`):

- `dynamic`: the runtime's policy, assistant replies fetched when the query triggers recall;
- `always`: the replies to every hit fetched for every question;
- `never`: records only;
- `raw turns`: every turn, the assistant's included, stored as a record (no pointers needed).

Reported: the trigger rate over all questions against the share that needs the assistant, the share of
those questions whose needed reply reaches the context, and context tokens per question.
"""

from __future__ import annotations

from collections.abc import Callable

from dimmem.contract.toyworld import generate_assistant_chat
from dimmem.runtime.memory import Memory
from eval.retrieval import context_line, reply_line, rounded_mean, turn_records
from eval.toy_truth import truth_records


def run_assistant_recall(
    chats: int,
    seed: int,
    k: int,
    make_memory: Callable[[], Memory],
    count_tokens: Callable[[str], int],
    other_questions: list[tuple[str, str]],
) -> dict:
    """`other_questions`: (question, reference date) pairs that never need the assistant (the toy
    world's), parsed for the trigger rate only."""
    world = [generate_assistant_chat(i, seed) for i in range(chats)]
    records, turns = make_memory(), make_memory()
    parse = records.query_parser
    try:
        for chat in world:
            conv = chat.conversation
            records.add_records(truth_records(chat), user_id=conv.id, conversation=conv, consolidate=False)
            turns.add_records(turn_records(conv), user_id=conv.id, conversation=conv, consolidate=False)
        found = {"dynamic": [], "always": [], "never": [], "raw turns": []}
        tokens = {name: [] for name in found}
        triggers, needing = [], 0
        for chat in world:
            conv = chat.conversation
            reference = conv.turns[-1].session_time[:10]
            for question, reply, _ in chat.questions:
                needing += reply is not None
                result = records.search(question, user_id=conv.id, k=k, reference_date=reference)
                triggers.append(bool(result.query["need_assistant_context"]))
                lines = [context_line(h.record) for h in result.hits]
                every = [
                    t
                    for h in result.hits
                    for t in records.store.conversations.assistant_replies(
                        conv.id, conv.id, h.record["source_turns"]
                    )
                ]
                given = {
                    "dynamic": result.assistant_context,
                    "always": list({t["turn_id"]: t for t in every}.values()),
                    "never": [],
                }
                for name, replies in given.items():
                    if reply is not None:
                        found[name].append(reply in {t["turn_id"] for t in replies})
                    tokens[name].append(sum(map(count_tokens, lines + [reply_line(t) for t in replies])))
                raw = turns.search(question, user_id=conv.id, k=k, reference_date=reference).hits
                if reply is not None:
                    found["raw turns"].append(any(reply in h.record["source_turns"] for h in raw))
                tokens["raw turns"].append(sum(count_tokens(context_line(h.record)) for h in raw))
        for question, reference in other_questions:
            triggers.append(bool(parse(question, reference)["need_assistant_context"]))
    finally:
        records.close()
        turns.close()
    total = len(triggers)
    return {
        "chats": chats,
        "k": k,
        "questions": total,
        "needing_assistant": needing,
        "needing_share": round(needing / max(total, 1), 4),
        "trigger_rate": rounded_mean(triggers),
        "recall_when_needed": {name: rounded_mean(values) for name, values in found.items()},
        "context_tokens_per_question": {name: rounded_mean(values) for name, values in tokens.items()},
    }


def format_assistant_recall(r: dict) -> list[str]:
    lines = [
        f"assistant recall ({r['chats']} user-assistant chats, top {r['k']}): trigger rate "
        f"{r['trigger_rate']:.1%} of {r['questions']} questions, {r['needing_share']:.1%} need the assistant",
        "",
        "| policy | needed reply in context | context tokens per chat question |",
        "|---|---|---|",
    ]
    for name, found in r["recall_when_needed"].items():
        lines.append(f"| {name} | {found:.3f} | {r['context_tokens_per_question'][name]:.0f} |")
    return lines
