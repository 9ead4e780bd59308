"""The DimMem authors' extract format, spoken at the edge: their prompt layout, their answer, and both
mapped onto this project's contract so everything inside keeps one record shape.

Their window is one message per line, `[<ISO timestamp>, <Wkd>] <n>.<Speaker>: <text>`, numbered from 1
across the overlap (the context is not marked on the lines; the system message says which numbers it
holds). Their answer cites ONE message by number:

    {"memories": [{"source_id": 7, "source_speaker": "Mel", "content": "...",
                   "dimension": {"memory_type": "episodic", "time": "2023-05-07", "location": "",
                                 "reason": "", "purpose": "", "keywords": ["..."]}}]}

Two variants: `dimmem-paper` (LoCoMo: every message, `source_speaker`) and `dimmem-paper-longmemeval`
(user messages only, shown as `User`, no `source_speaker`).

Mapping (`to_contract`, `from_contract`): message n is the n-th shown line, so `source_id` n becomes that
line's window-local id (`t<k>`; the same number in the LoCoMo variant); `""` becomes null; `memory_type`
becomes `type`; the speaker is `source_speaker`, else the cited line's. Nothing is dropped on the way in:
an id that is not a shown message's number becomes a turn id the window does not have, so the contract's
validator names it (`source_turns_unknown`). What the contract carries and their format cannot: more
than one source turn (the first shown one is kept), and the pointer of a memory citing no shown line
(the longmemeval variant hides assistant turns).

Timestamps: the session time plus 0.5 s per earlier message of that session (a window that starts
mid-session counts from its `session_offset`), so every message of a windowed conversation has its own
(a session continued by a later `Memory.add` counts again from its own windows' start); a turn
whose session time has seconds (a window read from their layout) is shown at exactly that time.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path

import jinja2
import yaml

from dimmem.contract.conversation import Turn
from dimmem.contract.records import MEMORY_TYPES, memory_record
from dimmem.contract.windows import Window

PROMPT = Path(__file__).parent / "prompts" / "paper" / "extract.yaml"
DIMENSIONS = ("time", "location", "reason", "purpose")
STEP = timedelta(seconds=0.5)
SESSION_GAP = timedelta(minutes=1)  # one session's messages are seconds apart, two sessions hours or days
LINE = re.compile(
    r"^\[(?P<stamp>[^,\]]+),\s*(?P<weekday>[A-Za-z]+)\]\s*(?P<n>\d+)\.(?P<speaker>[^:]*?):\s?(?P<text>.*)$"
)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$")  # a fence around the answer, not inside it


class LayoutError(ValueError):
    """A window in their layout that cannot be read; the message says which line and why."""


@dataclass(frozen=True)
class PaperFormat:
    name: str
    speakers: bool  # LoCoMo variant: `source_speaker` in answers, every message shown
    user_only: bool  # LongMemEval variant: user messages only, shown as `User`

    # --- the prompt ------------------------------------------------------------------------------------
    def lines(self, window: Window) -> list[tuple[str, Turn]]:
        """(window-local id, turn) of each shown message in order: message n is the n-th."""
        shown = zip(window.local_ids, window.turns)
        return [(lid, t) for lid, t in shown if not self.user_only or t.role == "user"]

    def citable(self, window: Window) -> bool:
        """Whether the window shows a new message (the LongMemEval variant may show none: no question)."""
        new = {t.id for t in window.new}
        return any(t.id in new for _, t in self.lines(window))

    def n_context(self, window: Window) -> int:
        context = {t.id for t in window.context}
        return sum(t.id in context for _, t in self.lines(window))

    def messages(self, window: Window) -> list[dict]:
        lines = self.lines(window)
        system = (
            _system()
            .render(n_context=self.n_context(window), n_lines=len(lines), speakers=self.speakers)
            .strip()
        )
        stamps = _stamps(window)
        user = "\n".join(
            render_line(n, self._speaker(t), t.text, stamps[t.id]) for n, (_, t) in enumerate(lines, start=1)
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _speaker(self, turn: Turn) -> str:
        return "User" if self.user_only else turn.speaker

    # --- structured outputs ------------------------------------------------------------------------------
    def response_format(self, window: Window) -> dict:
        """Their answer's JSON Schema for this window (OpenAI strict form): `source_id` one of the new
        messages' numbers, and in the LoCoMo variant `source_speaker` that message's speaker."""
        new = {t.id for t in window.new}
        by_speaker: dict[str, list[int]] = {}
        for n, (_, turn) in enumerate(self.lines(window), start=1):
            if turn.id in new:
                key = self._speaker(turn) if self.speakers else ""
                by_speaker.setdefault(key, []).append(n)
        memories: dict = {"type": "array", "items": {"anyOf": []}}
        for speaker, numbers in by_speaker.items():
            memory = copy.deepcopy(_MEMORY_SCHEMA)
            memory["properties"]["source_id"] = {"type": "integer", "enum": numbers}
            if self.speakers:
                memory["properties"] = {
                    "source_id": memory["properties"].pop("source_id"),
                    "source_speaker": {"type": "string", "enum": [speaker]},
                    **memory["properties"],
                }
                memory["required"] = list(memory["properties"])
            memories["items"]["anyOf"].append(memory)
        if not by_speaker:  # no new message: nothing may be cited
            memories = {"type": "array", "items": copy.deepcopy(_MEMORY_SCHEMA), "maxItems": 0}
        schema = {
            "type": "object",
            "properties": {"memories": memories},
            "required": ["memories"],
            "additionalProperties": False,
        }
        name = self.name.replace("-", "_")
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}

    # --- their answer -> the contract ------------------------------------------------------------------
    def decode(self, text: str) -> dict:
        """Their parser's leniency: a `<think>` block and code fences are dropped and the first JSON
        object is read (json.JSONDecodeError when there is none)."""
        text = _FENCE.sub("", _THINK.sub("", text).strip())
        start = text.find("{")
        if start < 0:
            raise json.JSONDecodeError("no JSON object", text, 0)
        value, _ = json.JSONDecoder().raw_decode(text, start)
        return value

    def to_contract(self, answer: dict | str, window: Window) -> dict | str:
        """Their answer (text or object) as a contract extract answer, for the contract's validator; an
        answer with no JSON object in it is returned as it is (the validator names it)."""
        if isinstance(answer, str):
            try:
                answer = self.decode(answer)
            except json.JSONDecodeError:
                return answer
        if not isinstance(answer, dict) or not isinstance(answer.get("memories"), list):
            return answer  # the schema names what is wrong
        lines = self.lines(window)
        return {"memories": [self._memory(m, lines) for m in answer["memories"]]}

    def _memory(self, memory, lines: list[tuple[str, Turn]]):
        if not isinstance(memory, dict):
            return memory  # the schema names it
        n = memory.get("source_id")
        cited = None
        if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= len(lines):
            cited = lines[n - 1]
        # a number the window does not show stays visible as an id the validator refuses
        turn_id = cited[0] if cited else f"message {json.dumps(n, ensure_ascii=False)}"
        speaker = memory.get("source_speaker") if self.speakers else None
        if speaker is None:
            speaker = cited[1].speaker if cited else ""
        dimension = memory.get("dimension")
        dimension = dimension if isinstance(dimension, dict) else {}
        return memory_record(  # (a contract field their format has no place for stays empty)
            source_turns=[turn_id],
            speaker=speaker,
            content=memory.get("content"),
            type=dimension.get("memory_type"),
            **{name: _null_if_blank(dimension.get(name)) for name in DIMENSIONS},
            keywords=dimension.get("keywords"),
        )

    # --- the contract -> their answer ------------------------------------------------------------------
    def from_contract(self, answer: dict, window: Window) -> tuple[dict, int]:
        """A contract extract answer in their format, and how many memories it could not carry (citing no
        shown message). A memory citing several turns keeps the earliest shown one."""
        number = {lid: n for n, (lid, _) in enumerate(self.lines(window), start=1)}
        out, lost = [], 0
        for memory in answer["memories"]:
            cited = [number[t] for t in memory["source_turns"] if t in number]
            if not cited:
                lost += 1
                continue
            row = {"source_id": min(cited)}
            if self.speakers:
                row["source_speaker"] = memory["speaker"]
            row["content"] = memory["content"]
            row["dimension"] = {
                "memory_type": memory["type"],
                **{name: memory[name] or "" for name in DIMENSIONS},
                "keywords": list(memory["keywords"]),
            }
            out.append(row)
        return {"memories": out}, lost

    def answer_text(self, answer: dict) -> str:
        """Their answer as their SFT rows carry it: JSON with indent 2."""
        return json.dumps(answer, ensure_ascii=False, indent=2)


def _null_if_blank(value):
    return None if isinstance(value, str) and not value.strip() else value


_MEMORY_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "source_id": {"type": "integer"},
        "content": {"type": "string"},
        "dimension": {
            "type": "object",
            "properties": {
                "memory_type": {"type": "string", "enum": list(MEMORY_TYPES)},
                **{name: {"type": "string"} for name in DIMENSIONS},
                "keywords": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["memory_type", *DIMENSIONS, "keywords"],
            "additionalProperties": False,
        },
    },
    "required": ["source_id", "content", "dimension"],
    "additionalProperties": False,
}

FORMATS = {
    "dimmem-paper": PaperFormat("dimmem-paper", speakers=True, user_only=False),
    "dimmem-paper-longmemeval": PaperFormat("dimmem-paper-longmemeval", speakers=False, user_only=True),
}


@cache
def _system() -> jinja2.Template:
    spec = yaml.safe_load(PROMPT.read_text(encoding="utf-8"))
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.from_string(spec["system"])


def render_line(n: int, speaker: str, text: str, stamp: datetime) -> str:
    return f"[{stamp.isoformat()}, {stamp:%a}] {n}.{speaker}: {text}"


def _stamps(window: Window) -> dict[str, datetime]:
    """Turn id -> timestamp: its session's time plus 0.5 s per earlier message of the session (the
    window's first session counts from `session_offset`), or its own time when the session time has
    seconds (a window read from their layout). No session time: the epoch, so the lines still parse."""
    out, seen = {}, {}
    for i, turn in enumerate(window.turns):
        moment = datetime.fromisoformat(turn.session_time) if turn.session_time else datetime(1970, 1, 1)
        exact = turn.session_time is not None and turn.session_time.count(":") >= 2
        k = seen.get(turn.session_id, window.session_offset if i == 0 else 0)
        seen[turn.session_id] = k + 1
        out[turn.id] = moment if exact else moment + k * STEP
    return out


def read_lines(text: str) -> list[Turn]:
    """The turns of a window in their layout (the user message). A line that does not start a message
    continues the previous one's text; one before any message, one starting with `[` that is not a
    message, a number out of order, or a timestamp that is unreadable, zoned or not after the line before
    is a LayoutError naming the line. Each turn's id is its timestamp (unique within a
    conversation, and the same when a message reappears as the next window's context); runs of messages
    0.5 s apart form one session, whose id is its first message's time. A `User` or `Assistant` has that
    role; anyone else is a participant."""
    turns: list[Turn] = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = LINE.match(line)
        if match is None:
            if not turns or line.startswith("["):
                raise LayoutError(
                    f"line {number} is not a message `[timestamp, Wkd] n.Speaker: text`: {line[:80]!r}"
                )
            turns[-1] = replace(turns[-1], text=f"{turns[-1].text}\n{line}")
            continue
        if int(match["n"]) != len(turns) + 1:
            raise LayoutError(f"line {number}: message number {match['n']}, expected {len(turns) + 1}")
        try:
            stamp = datetime.fromisoformat(match["stamp"].strip())
        except ValueError:
            raise LayoutError(f"line {number}: timestamp {match['stamp']!r} is not ISO 8601") from None
        if stamp.tzinfo is not None:
            raise LayoutError(
                f"line {number}: timestamp {match['stamp']!r} has a time zone; theirs have none"
            )
        if turns and stamp <= datetime.fromisoformat(turns[-1].id):
            raise LayoutError(f"line {number}: timestamp {match['stamp']!r} is not after the line before")
        speaker = match["speaker"].strip()
        role = speaker.casefold() if speaker.casefold() in ("user", "assistant") else "participant"
        turns.append(Turn(stamp.isoformat(), speaker, role, match["text"], "", stamp.isoformat()))
    if not turns:
        raise LayoutError("no message lines")
    return sessions(turns)


def sessions(turns: list[Turn]) -> list[Turn]:
    """Turns read from their layout (in time order) with their session ids: runs of messages at most
    `SESSION_GAP` apart (0.5 s per message; the LongMemEval variant hides the assistant's turns in
    between), each named by its first message's time. Given all of a conversation's turns, the ids
    agree across its windows (one window that starts mid-session cannot tell where its session began)."""
    out, session, previous = [], None, None
    for turn in turns:
        stamp = datetime.fromisoformat(turn.id)
        if previous is None or not timedelta(0) < stamp - previous <= SESSION_GAP:
            session = turn.id
        previous = stamp
        out.append(replace(turn, session_id=session))
    return out


_CONTEXT_STATED = (
    re.compile(
        r"\bmessages?\s+(?:#\s*)?1\s*(?:-|–|\.\.|to|through)\s*(\d+)\b[^.\n]*\bcontext", re.IGNORECASE
    ),
    re.compile(r"\bfirst\s+(\d+)\s+messages?\b[^.\n]*\bcontext", re.IGNORECASE),
    re.compile(r"消息\s*(?:第\s*)?1\s*(?:-|–|~|到|至)\s*(\d+)\s*条?[^。\n]*上下文"),  # 消息 1-5 为上下文
)
_NO_CONTEXT = re.compile(r"\bevery message is new\b", re.IGNORECASE)


def stated_context(system: str) -> int | None:
    """How many leading messages the system message says are context, or None when it does not say."""
    for pattern in _CONTEXT_STATED:
        if match := pattern.search(system):
            return int(match[1])
    return 0 if _NO_CONTEXT.search(system) else None
