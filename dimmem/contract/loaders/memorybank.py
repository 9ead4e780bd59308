"""MemoryBank (`memory_bank_en.json`): per user, `history` maps a date to `{query, response}` exchanges."""

from __future__ import annotations

from pathlib import Path

from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.loaders._fields import Record, read_json

DATE_FORMATS = ("%Y-%m-%d",)
ASSISTANT_NAME = "assistant"


def load_memorybank(path: str | Path) -> list[Conversation]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise Record(path, "<root>").error(
            "<root>", f"expected an object keyed by user name, got {type(data).__name__}"
        )
    return [_user(path, name, entry) for name, entry in data.items()]


def _user(path, name: str, entry) -> Conversation:
    rec = Record(path, name)
    user = rec.get(entry, "name", str, "name", default=name)
    history = rec.get(entry, "history", dict, "history")
    turns: list[Turn] = []
    for s, date in enumerate(sorted(history), start=1):
        when = rec.time(date, f"history.{date}", DATE_FORMATS)
        n = 0
        for j, exchange in enumerate(rec.get(history, date, list, f"history.{date}")):
            for key, speaker, role in (("query", user, "user"), ("response", ASSISTANT_NAME, "assistant")):
                n += 1
                text = rec.get(exchange, key, str, f"history.{date}[{j}].{key}")
                turns.append(
                    Turn(
                        id=f"S{s}:{n}",
                        speaker=speaker,
                        role=role,
                        text=text,
                        session_id=f"S{s}",
                        session_time=when,
                    )
                )
    meta = {key: entry[key] for key in ("meta_information", "personality", "summary") if entry.get(key)}
    return Conversation(id=name, turns=turns, metadata={"source": "memorybank", **meta})
