"""LongMemEval (`longmemeval_{s,m,oracle}.json`): one user-assistant history per question.

Each instance has `haystack_sessions` (lists of `{role, content, has_answer?}`), parallel
`haystack_session_ids` and `haystack_dates` ("2023/05/20 (Sat) 02:21"). Turn ids are
`<session id>:<n>` so `answer_session_ids` and `has_answer` evidence map onto them.
"""

from __future__ import annotations

from pathlib import Path

from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.loaders._fields import Record, read_json

DATE_FORMATS = ("%Y/%m/%d (%a) %H:%M", "%Y/%m/%d %H:%M", "%Y/%m/%d")


def load_longmemeval(path: str | Path) -> list[Conversation]:
    data = read_json(path)
    if not isinstance(data, list):
        raise Record(path, "<root>").error(
            "<root>", f"expected a list of instances, got {type(data).__name__}"
        )
    return [_instance(path, index, item) for index, item in enumerate(data)]


def _instance(path, index: int, item) -> Conversation:
    rec = Record(path, index)
    qid = rec.get(item, "question_id", str, "question_id")
    rec.record = f"{index} ({qid})"
    sessions = rec.get(item, "haystack_sessions", list, "haystack_sessions")
    session_ids = rec.get(item, "haystack_session_ids", list, "haystack_session_ids")
    dates = rec.get(item, "haystack_dates", list, "haystack_dates")
    if not len(sessions) == len(session_ids) == len(dates):
        raise rec.error(
            "haystack_sessions",
            f"{len(sessions)} sessions, {len(session_ids)} ids and {len(dates)} dates must be parallel lists",
        )
    turns: list[Turn] = []
    evidence: list[str] = []
    for s in range(len(sessions)):
        sid = rec.get(session_ids, s, str, f"haystack_session_ids[{s}]")
        when = rec.time(rec.get(dates, s, str, f"haystack_dates[{s}]"), f"haystack_dates[{s}]", DATE_FORMATS)
        for n, raw in enumerate(rec.get(sessions, s, list, f"haystack_sessions[{s}]"), start=1):
            where = f"haystack_sessions[{s}][{n - 1}]"
            role = rec.get(raw, "role", str, f"{where}.role")
            if role not in ("user", "assistant"):
                raise rec.error(f"{where}.role", f"expected 'user' or 'assistant', got {role!r}")
            turn = Turn(
                id=f"{sid}:{n}",
                speaker=role,
                role=role,
                text=rec.get(raw, "content", str, f"{where}.content"),
                session_id=sid,
                session_time=when,
            )
            if raw.get("has_answer"):
                evidence.append(turn.id)
            turns.append(turn)
    metadata = {
        key: item[key]
        for key in ("question_type", "question", "answer", "question_date", "answer_session_ids")
        if key in item
    }
    metadata.update(source="longmemeval", evidence_turns=evidence)
    if "question_date" in item:  # the reference date relative questions resolve against
        metadata["question_time"] = rec.time(
            rec.get(item, "question_date", str, "question_date"), "question_date", DATE_FORMATS
        )
    return Conversation(id=qid, turns=turns, metadata=metadata)
