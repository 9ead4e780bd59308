"""Extractors: windows in, one extract answer per window out (window-local turn ids, as a model gives
them). The runtime validates each answer and resolves its pointers; an extractor only answers.

- `EndpointExtractor`: a model behind an OpenAI-compatible endpoint (the served compact extractor),
  the windows of a conversation sent concurrently.
- `ReplayExtractor`: the answers stored in a data_gen `labels.jsonl`, looked up by window id (tests,
  the toy world, re-ingesting what a teacher already labelled).
- `TurnExtractor`: the fallback without a model: each new turn of a participant or user is one
  episodic record dated by its session (the raw-turns baseline of the retrieval benchmark).

A window without an answer maps to the reason (a string) instead, so one bad window costs only itself.
`keep_valid` is what the runtime makes of one window's answer: the memories the validator passes, their
pointers resolved (the memory runtime stores them; the extraction benchmark scores them).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dimmem.contract.conversation import Turn
from dimmem.contract.formats import ExtractFormat, extract_format
from dimmem.contract.records import memory_record
from dimmem.contract.validate import Issue, complete_memories, validate
from dimmem.contract.windows import Window
from dimmem.llm import ModelClient, ModelError
from dimmem.runtime.query import content_words


class Extractor(Protocol):
    def __call__(self, windows: list[Window]) -> dict[str, dict | str]:
        """{window id: extract answer, or why there is none}."""


@dataclass
class WindowRecords:
    records: list[dict]  # the valid memories as records, pointers resolved to conversation turn ids
    issues: list[Issue] = field(default_factory=list)  # everything the validator found
    failure: str | None = None  # why the window gives no record at all (no answer, or an unusable one)
    repeated: int = 0  # valid memories the answer had given already, word for word (kept once)

    @property
    def rejected(self) -> set[int]:
        """Indexes of the memories the validator refused (each costs only itself)."""
        return {issue.index for issue in self.issues if issue.index is not None}


def keep_valid(window: Window, answer: dict | str) -> WindowRecords:
    """One window's answer (or the reason it has none) as the records the runtime keeps."""
    if isinstance(answer, str):
        return WindowRecords([], failure=answer)
    issues = validate("extract", answer, window.scope).issues
    if any(issue.index is None for issue in issues):  # the answer as a whole is unusable
        return WindowRecords([], issues, f"{window.id}: " + "; ".join(map(str, issues)))
    result, seen, kept = WindowRecords([], issues), set(), []
    for i, memory in enumerate(answer["memories"]):
        if i in result.rejected:
            continue
        key = json.dumps(memory, sort_keys=True)
        if key in seen:  # a model stuck in a loop repeats its last record
            result.repeated += 1
            continue
        seen.add(key)
        kept.append(memory)
    result.records = window.resolve(kept)
    return result


class EndpointExtractor:
    """`fmt`: the extract format the served model speaks (`dimmem.contract.formats`); its answers come
    back as contract answers."""

    def __init__(self, client: ModelClient, concurrency: int = 8, fmt: ExtractFormat | None = None):
        self.client, self.concurrency = client, concurrency
        self.fmt = fmt or extract_format("dimmem")

    def __call__(self, windows: list[Window]) -> dict[str, dict | str]:
        fmt = self.fmt

        def one(window: Window) -> dict | str:
            if not fmt.citable(window):  # e.g. assistant turns only, to a format that shows user messages
                return {"memories": []}
            try:
                messages, schema = fmt.messages(window), fmt.response_format(window)
                answer = self.client.json(
                    "extract", messages, schema=schema, decode=fmt.decode, partial=complete_memories
                )
            except ModelError as exc:
                return f"{window.id}: {exc}"
            return fmt.to_contract(answer, window)

        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(windows)))) as pool:
            return dict(zip((w.id for w in windows), pool.map(one, windows)))


class ReplayExtractor:
    def __init__(self, labels_path: str | Path):
        self.path = Path(labels_path)
        self.answers: dict[str, dict] = {}
        with open(self.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{self.path}: line {number}: invalid JSON ({exc.msg})") from None
                if row.get("task") == "extract":
                    self.answers[row["window_id"]] = row["value"]

    def __call__(self, windows: list[Window]) -> dict[str, dict | str]:
        return {w.id: self.answers.get(w.id, f"{w.id}: no stored answer in {self.path}") for w in windows}


def turn_memory(turn: Turn, turn_id: str) -> dict:
    """One turn as an episodic memory citing it (`turn_id`: local or global, as the caller needs)."""
    return memory_record(
        source_turns=[turn_id],
        speaker=turn.speaker,
        content=f"{turn.speaker}: {turn.text}",
        type="episodic",
        time=turn.session_time[:10] if turn.session_time else None,
        keywords=(content_words(turn.text) or [turn.speaker])[:12],
    )


class TurnExtractor:
    def __call__(self, windows: list[Window]) -> dict[str, dict | str]:
        answers = {}
        for w in windows:
            new_ids = w.local_ids[len(w.context) :]
            answers[w.id] = {
                "memories": [
                    turn_memory(t, lid)
                    for t, lid in zip(w.new, new_ids)
                    if t.role != "assistant" and t.text.strip()
                ]
            }
        return answers
