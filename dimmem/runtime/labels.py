"""The records a data_gen `labels.jsonl` holds, ready for `Memory.add_records`: one JSON object per
line, the `extract` rows carrying their window's memories with conversation turn ids. Bad input is
one error naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

from dimmem.contract.records import MEMORY_FIELDS

ROW_KEYS = ("task", "conversation_id", "window_id")


def label_memories(path: str | Path) -> dict[str, list[dict]]:
    """{conversation id: its extracted records}; blank lines are skipped, any other bad line is a
    ValueError naming `path` and the line."""
    path = Path(path)
    by_conversation: dict[str, list[dict]] = {}
    first = True
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {number}"
            if first and line.lstrip().startswith("["):
                raise ValueError(
                    f"{where}: a JSON array; expected JSON lines, one object per line "
                    "(the labels.jsonl data_gen writes)"
                )
            first = False
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a JSON {type(row).__name__}, expected an object")
            if missing := [key for key in ROW_KEYS if key not in row]:
                raise ValueError(f"{where}: missing key {missing[0]!r}")
            if row["task"] != "extract":
                continue
            by_conversation.setdefault(row["conversation_id"], []).extend(_records(row, where))
    return by_conversation


def _records(row: dict, where: str) -> list[dict]:
    memories = row.get("memories", ...)
    if memories is ...:
        raise ValueError(f"{where}: missing key 'memories'")
    if not isinstance(memories, list):
        shown = "null" if memories is None else f"a JSON {type(memories).__name__}"
        raise ValueError(f"{where}: memories is {shown}, expected a list of records")
    out = []
    for i, memory in enumerate(memories):
        if not isinstance(memory, dict):
            raise ValueError(f"{where}: memories[{i}] is a JSON {type(memory).__name__}, expected an object")
        if missing := [key for key in ("id", *MEMORY_FIELDS) if key not in memory]:
            raise ValueError(f"{where}: memories[{i}]: missing key {missing[0]!r}")
        out.append(
            {
                **{k: memory[k] for k in MEMORY_FIELDS},
                "id": memory["id"],
                "session_time": memory.get("session_time"),
                "conversation_id": row["conversation_id"],
                "window_id": row["window_id"],
            }
        )
    return out
