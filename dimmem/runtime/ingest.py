"""The conversation side of an add: messages parsed into a conversation, its new turns and their windows
planned and stored (pending), the extractor asked for each window and its answers validated, the windows
marked done once their records are stored. `Memory.add` runs it around the update path.

Appending: `add` with a stored `conversation_id` extracts only the turns not stored yet. Messages that
begin with the whole stored conversation (same roles and texts: a client resending the history) skip
it; a message whose `id` names a stored turn is that turn (another text under that id: ValueError);
the rest are new turns, numbered after the stored ones (`S<session>:<n>` as if the whole history had
been sent at once), windowed after the stored windows (the first new window takes the last `overlap`
stored turns as context; window indexes, hence record ids `<conversation>/wNNNN#mK`, continue).
Stored turns are never rewritten: records point at them.

Crashes and retries: an add writes its new turns and its windows (pending) in one transaction, then
its records (a batch at a time), then marks the windows done. A killed add leaves pending windows;
the next add of that conversation (a retry of the same messages, or the next turns) extracts them
again: what was stored comes back UNCHANGED (record ids are stable), the rest is added, so a retry
ends where one uninterrupted add would have. A window the extractor gave no answer for stays pending
and is retried the same way. (A retry without message ids that resends only the last turns, not the
whole conversation, cannot be told from new turns with the same text: it appends them again.)
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import groupby

from dimmem.config import WindowConfig
from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.loaders._fields import Record
from dimmem.contract.loaders.chat_jsonl import NOT_DIALOGUE, conversation_from_messages
from dimmem.contract.windows import Window, _fit, make_windows
from dimmem.runtime.extractors import Extractor, keep_valid
from dimmem.runtime.stores import RecordLog


@dataclass
class Extraction:
    conversation: Conversation
    windows: int
    records: list[dict]  # valid memories, pointers resolved to conversation turn ids
    rejected: list[str] = field(default_factory=list)  # memories the validator refused, with the reasons
    failed: dict[str, str] = field(default_factory=dict)  # window id -> why the extractor gave no answer


class Ingest:
    """One `Memory`'s ingest over its store: `plan`, `extract_windows`, `done` (and `extract`, storing
    nothing)."""

    def __init__(
        self,
        store: RecordLog,
        windows: WindowConfig,
        extractor: Extractor,
        count_tokens: Callable | None,
    ):
        self.store, self.windows, self.extractor, self.count_tokens = store, windows, extractor, count_tokens
        self.lock = store.lock
        self._extract_lock = threading.Lock()  # the tokenizer, shared by concurrent extracts

    def extract(self, conversation: Conversation) -> Extraction:
        """Windows -> extractor -> validator -> pointers resolved, without storing anything."""
        w = self.windows
        with self._extract_lock:
            windows = make_windows(conversation, w.window, w.overlap, w.max_tokens, self.count_tokens)
        return self.extract_windows(conversation, windows)

    def extract_windows(self, conversation: Conversation, windows: list[Window]) -> Extraction:
        answers = self.extractor(windows) if windows else {}
        records, rejected, failed, n_bad = [], [], {}, 0
        for window in windows:
            kept = keep_valid(window, answers[window.id])
            if kept.failure is not None:
                failed[window.id] = kept.failure
                continue
            rejected += [f"{window.id}: {issue}" for issue in kept.issues]
            records += kept.records
            n_bad += len(kept.rejected)
        self.store.stats.add(rejected_memories=n_bad, windows=len(windows), failed_windows=len(failed))
        return Extraction(conversation, len(windows), records, rejected, failed)

    def plan(self, user_id: str, conversation: Conversation, given: list[tuple[bool, bool]]) -> list[Window]:
        """Store the conversation's new turns and their windows (pending) in one transaction; the windows
        to extract: those, and any left pending by an add that did not finish."""
        for _ in range(10):  # planned outside the lock; redone if another add changed the conversation
            with self.lock:
                stored = self.store.conversations.turns(user_id, conversation.id)
                first_index = self.store.conversations.next_window_index(user_id, conversation.id)
            new = _new_turns(conversation, given, stored)
            windows = self._windows(conversation.id, stored, new, first_index) if new else []
            with self.lock, self.store.transaction():
                if (
                    self.store.conversations.turn_count(user_id, conversation.id),
                    self.store.conversations.next_window_index(user_id, conversation.id),
                ) != (len(stored), first_index):
                    continue
                self.store.conversations.put_turns(user_id, conversation.id, new)
                self.store.conversations.put_windows(user_id, windows)
                pending = self.store.conversations.pending_windows(user_id, conversation.id)
            turns, planned = {t.id: t for t in [*stored, *new]}, {w.index: w for w in windows}
            return [
                planned.get(i)
                or Window(conversation.id, i, tuple(turns[t] for t in context), tuple(turns[t] for t in ids))
                for i, context, ids in pending
            ]
        raise RuntimeError(
            f"conversation {conversation.id!r} kept changing while this add planned its windows"
        )

    def _windows(
        self, conversation_id: str, stored: list[Turn], new: list[Turn], first_index: int
    ) -> list[Window]:
        """Windows over the new turns, indexes from `first_index`, the first one with up to `overlap` stored
        turns as context (the same rules as `make_windows`, which windows a new conversation)."""
        w = self.windows
        with self._extract_lock:
            if not stored:
                windows = make_windows(
                    Conversation(conversation_id, new), w.window, w.overlap, w.max_tokens, self.count_tokens
                )
                return [replace(win, index=first_index + win.index) for win in windows]
            turns = stored[len(stored) - w.overlap :] + new if w.overlap else list(new)
            start, windows = len(turns) - len(new), []
            while start < len(turns):
                n_context = min(w.overlap, start)
                n_new = min(w.window - n_context, len(turns) - start)

                def build(
                    n_ctx: int, n_new: int, start: int = start, index: int = first_index + len(windows)
                ):
                    return Window(
                        conversation_id,
                        index,
                        tuple(turns[start - n_ctx : start]),
                        tuple(turns[start : start + n_new]),
                    )

                if w.max_tokens is not None:
                    win = _fit(build, n_context, n_new, w.max_tokens, self.count_tokens)
                else:
                    win = build(n_context, n_new)
                windows.append(win)
                start += len(win.new)
            return windows

    def done(self, user_id: str, conversation_id: str, windows: list[Window], extraction: Extraction) -> None:
        """The windows whose records are stored marked done; a failed one stays pending (the next add)."""
        with self.lock, self.store.transaction():
            self.store.conversations.window_done(
                user_id, conversation_id, [w.index for w in windows if w.id not in extraction.failed]
            )


def parse_messages(
    messages: list[dict] | Conversation, conversation_id: str | None
) -> tuple[Conversation, list]:
    """The conversation, and for each turn whether the client gave its (id, session): a Conversation gives
    both; a message without `id` or `session_id` gets them numbered (`S<session>:<n>`)."""
    if isinstance(messages, Conversation):
        return messages, [(True, True)] * len(messages.turns)
    # without an id, the same messages added twice are the same conversation
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False)
    digest = "c-" + hashlib.sha256(text.encode()).hexdigest()[:12]
    conversation = conversation_from_messages(
        {"messages": messages, "id": conversation_id or digest}, Record("messages", "request"), digest
    )
    dialogue = [m for m in messages if m.get("role") not in NOT_DIALOGUE]  # one turn each, in order
    return conversation, [(m.get("id") is not None, m.get("session_id") is not None) for m in dialogue]


def _same(a: Turn, b: Turn) -> bool:
    return (a.role, a.text) == (b.role, b.text)


def _generated_session(session_id: str) -> bool:
    return re.fullmatch(r"S\d+", session_id) is not None


def _new_turns(conversation: Conversation, given: list[tuple[bool, bool]], stored: list[Turn]) -> list[Turn]:
    """The conversation's turns not stored yet, with ids that continue the stored numbering."""
    turns = list(zip(conversation.turns, given))
    if stored and len(turns) >= len(stored) and all(map(_same, stored, (t for t, _ in turns))):
        turns = turns[len(stored) :]  # the whole stored conversation resent: only what follows is new
    by_id = {t.id: t for t in stored}
    fresh = []
    for turn, (id_given, session_given) in turns:
        if id_given and turn.id in by_id:  # a stored turn named by its id
            if not _same(by_id[turn.id], turn):
                raise ValueError(
                    f"conversation {conversation.id!r}: turn {turn.id!r} is stored with other text; stored "
                    "turns are never rewritten (records point at them): give the new turn a new id"
                )
            continue
        fresh.append((turn, id_given, session_given))
    if not fresh:
        return []
    # number generated ids as if the whole history had been sent at once
    sessions = [(sid, len(list(group))) for sid, group in groupby(stored, key=lambda t: t.session_id)]
    number = len(sessions)
    last = stored[-1] if stored else None
    used, out = set(by_id), []
    for j, (sid, group) in enumerate(groupby(fresh, key=lambda x: x[0].session_id)):
        group = list(group)
        session_given = group[0][2]
        continues = (
            j == 0
            and last is not None
            and (sid == last.session_id if session_given else _generated_session(last.session_id))
        )
        if continues:
            offset, session_id, session_time = sessions[-1][1], last.session_id, last.session_time
        else:
            number += 1
            offset, session_time = 0, group[0][0].session_time
            session_id = sid if session_given else f"S{number}"
        for k, (turn, id_given, _) in enumerate(group, start=1):
            turn_id = turn.id if id_given else f"S{number}:{offset + k}"
            if turn_id in used:
                raise ValueError(f"conversation {conversation.id!r}: turn id {turn_id!r} given twice")
            used.add(turn_id)
            out.append(replace(turn, id=turn_id, session_id=session_id, session_time=session_time))
    return out
