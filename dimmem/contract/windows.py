"""Overlap-aware windowing.

A window is up to W turns: O overlap turns shown as context (already processed by the previous window)
followed by new turns. The first window has no context. The new parts of a conversation's windows
partition it: every turn is new in exactly one window. An optional token budget caps each window's
rendered prompt; a single turn that does not fit even alone is emitted in a window of its own and
flagged `oversized`, never dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.validate import TurnScope


@dataclass(frozen=True)
class Window:
    conversation_id: str
    index: int
    context: tuple[Turn, ...]
    new: tuple[Turn, ...]
    prompt_tokens: int | None = None
    oversized: bool = False
    session_offset: int = 0  # turns of its first turn's session before the window (that turn's position)

    @property
    def id(self) -> str:
        return f"{self.conversation_id}/w{self.index:04d}"

    @property
    def turns(self) -> tuple[Turn, ...]:
        return self.context + self.new

    @property
    def local_ids(self) -> list[str]:
        """Window-local ids `t1..tn`, context first: what the model sees and cites."""
        return [f"t{i}" for i in range(1, len(self.turns) + 1)]

    @property
    def scope(self) -> TurnScope:
        local = self.local_ids
        return TurnScope(
            speakers={lid: turn.speaker for lid, turn in zip(local, self.turns)},
            new=frozenset(local[len(self.context) :]),
        )

    def global_ids(self, local_ids: list[str]) -> list[str]:
        """Map cited local ids back to the conversation's stable turn ids (the record's pointer)."""
        table = dict(zip(self.local_ids, (t.id for t in self.turns)))
        return [table[lid] for lid in local_ids]

    def resolve(self, memories: list[dict]) -> list[dict]:
        """An extract answer's memories as stored records: the pointer resolved to conversation turn ids,
        the session time of the new part, and an id stable across re-runs (`<window id>#m<n>`)."""
        session_time = self.new[0].session_time
        return [
            {
                **memory,
                "source_turns": self.global_ids(memory["source_turns"]),
                "session_time": session_time,
                "conversation_id": self.conversation_id,
                "window_id": self.id,
                "id": f"{self.id}#m{i + 1}",
            }
            for i, memory in enumerate(memories)
        ]


def window_record(window: Window) -> dict:
    """A window's turns as JSON (datagen's jobs.jsonl), so a later stage can show it again."""
    return {
        "index": window.index,
        "context": [asdict(t) for t in window.context],
        "new": [asdict(t) for t in window.new],
        "session_offset": window.session_offset,
    }


def window_from_record(conversation_id: str, record: dict) -> Window:
    context, new = (tuple(Turn(**t) for t in record[part]) for part in ("context", "new"))
    offset = record.get("session_offset", 0)  # absent in outputs written before it was recorded
    return Window(conversation_id, record["index"], context, new, session_offset=offset)


def job_windows(path: str | Path) -> Iterator[tuple[dict, Window]]:
    """Each job of a datagen output's jobs.jsonl that shows a window, in file order: (its row, the window).
    A line that is not a JSON object is a ValueError naming the file and the line."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                row = json.loads(line)
                window = row.get("window") and window_from_record(row["conversation_id"], row["window"])
            except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}: line {number}: not a datagen job: {exc!r}") from None
            if window:
                yield row, window


def make_windows(
    conversation: Conversation,
    window: int,
    overlap: int,
    max_tokens: int | None = None,
    count_tokens: Callable[[Window], int] | None = None,
) -> list[Window]:
    """Split a conversation into windows of `window` turns with `overlap` turns of context.

    With `max_tokens`, `count_tokens(window)` measures each candidate's rendered prompt; a window gives
    up new turns first, then context turns, until it fits.
    """
    if window < 1 or not 0 <= overlap < window:
        raise ValueError(f"need window >= 1 and 0 <= overlap < window, got window={window} overlap={overlap}")
    if max_tokens is not None and count_tokens is None:
        raise ValueError("a token budget needs count_tokens")
    turns = conversation.turns
    in_session = [0] * len(turns)  # each turn's position in its session
    for i in range(1, len(turns)):
        if turns[i].session_id == turns[i - 1].session_id:
            in_session[i] = in_session[i - 1] + 1
    windows: list[Window] = []
    start = 0
    while start < len(turns):
        index = len(windows)
        n_context = min(overlap, start) if index else 0
        n_new = min(window - n_context, len(turns) - start)

        def build(n_ctx: int, n_new: int, start: int = start, index: int = index) -> Window:
            return Window(
                conversation.id,
                index,
                tuple(turns[start - n_ctx : start]),
                tuple(turns[start : start + n_new]),
                session_offset=in_session[start - n_ctx],
            )

        win = build(n_context, n_new)
        if max_tokens is not None:
            win = _fit(build, n_context, n_new, max_tokens, count_tokens)
        elif count_tokens is not None:
            win = replace(win, prompt_tokens=count_tokens(win))
        windows.append(win)
        start += len(win.new)
    return windows


def _fit(build, n_context: int, n_new: int, budget: int, count_tokens) -> Window:
    """The largest window under budget: most new turns with full context, else less context, else flagged."""
    measured: dict[tuple[int, int], int] = {}

    def tokens(c: int, k: int) -> int:
        if (c, k) not in measured:
            measured[c, k] = count_tokens(build(c, k))
        return measured[c, k]

    if tokens(n_context, n_new) <= budget:  # the common case: one measurement
        return replace(build(n_context, n_new), prompt_tokens=tokens(n_context, n_new))
    if tokens(n_context, 1) <= budget:
        k = _largest(1, n_new, lambda k: tokens(n_context, k) <= budget)
        return replace(build(n_context, k), prompt_tokens=tokens(n_context, k))
    if tokens(0, 1) <= budget:
        c = _largest(0, n_context - 1, lambda c: tokens(c, 1) <= budget)
        return replace(build(c, 1), prompt_tokens=tokens(c, 1))
    return replace(build(0, 1), prompt_tokens=tokens(0, 1), oversized=True)


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """Largest n in [low, high] with fits(n), given fits(low) and monotone fits (binary search)."""
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def window_conversations(
    conversations: list[Conversation],
    window: int,
    overlap: int,
    max_tokens: int | None = None,
    count_tokens: Callable[[Window], int] | None = None,
) -> list[Window]:
    """Every conversation's windows, in order, each conversation's partition checked."""
    windows: list[Window] = []
    for conv in conversations:
        conv_windows = make_windows(conv, window, overlap, max_tokens, count_tokens)
        check_partition(conv, conv_windows)
        windows += conv_windows
    return windows


def check_partition(conversation: Conversation, windows: list[Window]) -> None:
    """Raise ValueError unless the windows' new parts partition the conversation in order, and each
    window's context is exactly the turns just before its new part (none for the first window)."""
    ids = [t.id for t in conversation.turns]
    new_ids = [t.id for w in windows for t in w.new]
    if new_ids != ids:
        raise ValueError(
            f"{conversation.id}: new parts cover {len(new_ids)} turns in windows, conversation has {len(ids)}"
        )
    position = 0
    for w in windows:
        expected = ids[position - len(w.context) : position] if w.context else []
        if (w.index == 0 and w.context) or [t.id for t in w.context] != expected or not w.new:
            raise ValueError(f"{w.id}: context {[t.id for t in w.context]} does not precede its new turns")
        position += len(w.new)
