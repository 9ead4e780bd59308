"""Conversations as loaders produce them: sessions of turns with stable global ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

ROLES = ("user", "assistant", "participant")


class DataFormatError(ValueError):
    """Malformed input, located by file, record and field so it can be fixed by hand."""

    def __init__(self, path: str | Path, record: str | int, field: str, problem: str):
        self.path, self.record, self.field, self.problem = str(path), record, field, problem
        super().__init__(f"{path}: record {record}: field {field!r}: {problem}")


@dataclass(frozen=True)
class Turn:
    id: str  # stable global id, e.g. LoCoMo "D3:5"; the pointer records keep back to their source
    speaker: str
    role: str  # "user" | "assistant" (agent chats) or "participant" (two named people)
    text: str
    session_id: str
    session_time: (
        str | None
    )  # ISO 8601, "YYYY-MM-DDTHH:MM" or "YYYY-MM-DD"; relative times resolve against it


@dataclass
class Conversation:
    id: str
    turns: list[Turn]
    metadata: dict = field(default_factory=dict)  # source extras: QA, observations, question, ...

    def __post_init__(self):
        seen: set[str] = set()
        for turn in self.turns:
            if turn.id in seen:
                raise ValueError(f"conversation {self.id}: duplicate turn id {turn.id!r}")
            if turn.role not in ROLES:
                raise ValueError(
                    f"conversation {self.id}: turn {turn.id} has role {turn.role!r}, expected one of {ROLES}"
                )
            seen.add(turn.id)

    @property
    def sessions(self) -> list[tuple[str, str | None, list[Turn]]]:
        """(session id, session time, turns) in conversation order."""
        return [
            (sid, (grp := list(turns))[0].session_time, grp)
            for sid, turns in groupby(self.turns, key=lambda t: t.session_id)
        ]

    @property
    def speakers(self) -> list[str]:
        return list(dict.fromkeys(t.speaker for t in self.turns))
