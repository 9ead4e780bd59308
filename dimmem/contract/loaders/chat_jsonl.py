"""Chat JSONL: one conversation per line in OpenAI `messages` form.

    {"id": "c1", "messages": [{"role": "user", "content": "...", "timestamp": "2024-03-01T09:00",
                               "session_id": "s1", "name": "Ann"}, ...]}

`id`, `timestamp`, `session_id` and `name` are optional. Consecutive messages with the same
`session_id` form a session (one session when absent), dated by its first timestamp (or the line's
`timestamp`). System and tool messages are instructions, not dialogue: they are not windowed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.loaders._fields import Record

DATE_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d")
NOT_DIALOGUE = ("system", "developer", "tool")


def load_chat_jsonl(path: str | Path) -> list[Conversation]:
    conversations = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            rec = Record(path, f"line {number}")
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise rec.error("<line>", f"invalid JSON: {exc.msg} at column {exc.colno}") from None
            conversations.append(
                conversation_from_messages(obj, rec, default_id=f"{Path(path).stem}-{number}")
            )
    return conversations


def conversation_from_messages(obj: Any, rec: Record, default_id: str) -> Conversation:
    """One `{"messages": [...]}` record (a JSONL line or a Hugging Face dataset row) as a conversation."""
    if not isinstance(obj, dict):
        raise rec.error("<record>", f"expected an object with 'messages', got {type(obj).__name__}")
    conv_id = str(
        rec.get(obj, "id", (str, int), "id", default=None)
        or rec.get(obj, "conversation_id", (str, int), "conversation_id", default=default_id)
    )
    messages = rec.get(obj, "messages", list, "messages")
    line_time = obj.get("timestamp")
    turns: list[Turn] = []
    session_number, session_key, session_time, turn_number = 0, object(), None, 0
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        role = rec.get(msg, "role", str, f"{where}.role")
        if role in NOT_DIALOGUE:
            continue
        if role not in ("user", "assistant"):
            raise rec.error(
                f"{where}.role", f"expected user/assistant (or system/developer/tool, skipped), got {role!r}"
            )
        key = rec.get(msg, "session_id", (str, int), f"{where}.session_id", default=None)
        if session_number == 0 or key != session_key:
            session_number, session_key, turn_number = session_number + 1, key, 0
            raw_time = msg.get("timestamp", line_time if session_number == 1 else None)
            session_time = (
                rec.time(raw_time, f"{where}.timestamp", DATE_FORMATS) if raw_time is not None else None
            )
        turn_number += 1
        turns.append(
            Turn(
                id=str(
                    rec.get(msg, "id", (str, int), f"{where}.id", default=f"S{session_number}:{turn_number}")
                ),
                speaker=rec.get(msg, "name", str, f"{where}.name", default=role),
                role=role,
                text=_text(rec, msg, where),
                session_id=str(key) if key is not None else f"S{session_number}",
                session_time=session_time,
            )
        )
    if not turns:
        raise rec.error("messages", "no user or assistant messages")
    return Conversation(id=conv_id, turns=turns, metadata={"source": "chat_jsonl"})


def conversation_messages(conversation: Conversation) -> list[dict]:
    """A conversation as the chat messages `conversation_from_messages` reads: participants speak as
    "user" under their names; each message carries its session and the session's time."""
    return [
        {
            "role": "assistant" if t.role == "assistant" else "user",
            "name": t.speaker,
            "content": t.text,
            "timestamp": t.session_time,
            "session_id": t.session_id,
        }
        for t in conversation.turns
    ]


def _text(rec: Record, msg: dict, where: str) -> str:
    content = rec.get(msg, "content", (str, list), f"{where}.content")
    if isinstance(content, str):
        return content
    parts = []  # OpenAI content parts: keep the text ones
    for j, part in enumerate(content):
        if rec.get(part, "type", str, f"{where}.content[{j}].type") == "text":
            parts.append(rec.get(part, "text", str, f"{where}.content[{j}].text"))
    return "\n".join(parts)
