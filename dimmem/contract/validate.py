"""The one validator for every model answer: JSON parse, JSON Schema, then the rules a schema cannot say.

Every issue names the memory index, the field and the rule id. The rule ids are the ones the prompts
state, so the issues can be sent back to a teacher for repair and read by a human.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator

from dimmem.contract.records import DIMENSIONS, json_schema
from dimmem.contract.timespan import parse_span

RULES: dict[str, str] = {
    "json": "the answer is one JSON object and nothing else",
    "schema": "every field is present with the type the schema gives, and no other field",
    "content_empty": "content is a non-empty statement",
    "dimension_blank": f"{', '.join(DIMENSIONS)} are null when unknown, never blank strings",
    "time_format": (
        "time is null or ISO 8601: YYYY-MM-DD, YYYY-MM, YYYY, "
        "or an interval start/end of those with start not after end"
    ),
    "source_turns_empty": "every memory cites at least one source turn",
    "source_turns_unknown": "every cited turn id exists in the input",
    "source_turns_overlap": "cited turns lie in the new part of the window, never in the overlap context",
    "speaker_mismatch": "speaker is the speaker of one of the cited turns",
    "keywords_empty": "keywords has at least one entry and none is blank",
    "keywords_duplicate": "no keyword is repeated (case-insensitive)",
    "action_memory": "MERGE and SUPERSEDE come with the resulting memory; KEEP_BOTH with null",
}

# Which rules each task's answers are checked against (and so which rules its prompt must state).
_MEMORY_RULES = (
    "content_empty",
    "dimension_blank",
    "time_format",
    "source_turns_empty",
    "source_turns_unknown",
    "speaker_mismatch",
    "keywords_empty",
    "keywords_duplicate",
)
TASK_RULES: dict[str, tuple[str, ...]] = {
    "extract": ("json", "schema", *_MEMORY_RULES, "source_turns_overlap"),
    "parse_query": ("json", "schema", "time_format", "keywords_empty", "keywords_duplicate"),
    "consolidate": ("json", "schema", "action_memory", *_MEMORY_RULES),
}

_FENCE = re.compile(r"^```(?:json)?\s*\n(.*)\n```$", re.DOTALL)


@dataclass(frozen=True)
class Issue:
    rule: str
    message: str
    index: int | None = None  # memory index, when the issue is about one memory
    field: str | None = None

    def __str__(self) -> str:
        where = f"memories[{self.index:d}]" if self.index is not None else ""
        if self.field:
            where = f"{where}.{self.field}" if where else self.field
        return f"{where or '<answer>'}: [{self.rule}] {self.message}"


@dataclass
class Validation:
    value: dict | None  # the parsed answer (None when it is not a JSON object)
    issues: list[Issue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues

    def rules_broken(self) -> list[str]:
        return sorted({issue.rule for issue in self.issues})

    def report(self) -> str:
        """The issues as lines a teacher can repair from and a human can read."""
        return "\n".join(str(issue) for issue in self.issues)


@dataclass(frozen=True)
class TurnScope:
    """The turns an answer may cite: id -> speaker, and which ids are new (citable)."""

    speakers: dict[str, str]
    new: frozenset[str]

    def citable(self) -> dict[str, list[str]]:
        """Speaker -> the new turn ids they spoke, in window order (for `records.window_schema`)."""
        out: dict[str, list[str]] = {}
        for turn, speaker in self.speakers.items():
            if turn in self.new:
                out.setdefault(speaker, []).append(turn)
        return out

    def to_json(self) -> str:
        """As stored with a dataset row, so an evaluation can check answers against the same scope."""
        return json.dumps({"speakers": self.speakers, "new": sorted(self.new)}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | None) -> TurnScope | None:
        if not text:
            return None
        obj = json.loads(text)
        return cls(obj["speakers"], frozenset(obj["new"]))


def parse_json(output: str | dict) -> tuple[dict | None, list[Issue]]:
    if isinstance(output, dict):
        return output, []
    text = output.strip()
    if fenced := _FENCE.match(text):  # a markdown fence around otherwise valid JSON is a harmless habit
        text = fenced.group(1)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [Issue("json", f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")]
    if not isinstance(value, dict):
        return None, [Issue("json", f"expected a JSON object, got {type(value).__name__}")]
    return value, []


_MEMORIES = re.compile(r'\s*\{\s*"memories"\s*:\s*\[')


def complete_memories(text: str) -> dict | None:
    """An extract answer cut off mid-way (a model that ran into its token budget, often repeating its last
    record): every memory object complete before the cut, as an answer `{"memories": [...]}`; None when
    the text does not begin as an extract answer or no memory is complete (nothing to keep: the window
    failed). What is kept is still checked by `validate`."""
    start = _MEMORIES.match(text)
    if start is None:
        return None
    decoder, at, memories = json.JSONDecoder(), start.end(), []
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] != "{":
            break
        try:
            memory, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:  # the cut one
            break
        memories.append(memory)
    return {"memories": memories} if memories else None


def validate(task: str, output: str | dict, scope: TurnScope | None = None) -> Validation:
    """Validate one answer of `task` ("extract", "parse_query", "consolidate").

    `scope` is required for "extract" (the window's turns) and optional for "consolidate" (the turns the
    two input records cite).
    """
    value, issues = parse_json(output)
    if value is None:
        return Validation(None, issues)
    issues += _schema_issues(task, value)
    if task == "extract":
        if scope is None:
            raise ValueError("validating an extraction needs the window's TurnScope")
        for i, memory in enumerate(_list(value.get("memories"))):
            issues += memory_issues(memory, i, scope)
    elif task == "parse_query":
        issues += _time_issues(value.get("time"), None)
        issues += _keyword_issues(value.get("keywords"), None)
    elif task == "consolidate":
        action, memory = value.get("action"), value.get("memory")
        if action in ("MERGE", "SUPERSEDE") and memory is None:
            issues.append(
                Issue("action_memory", f"{action} needs the resulting memory, got null", field="memory")
            )
        elif action == "KEEP_BOTH" and memory is not None:
            issues.append(
                Issue(
                    "action_memory",
                    "KEEP_BOTH keeps both records as they are: memory must be null",
                    field="memory",
                )
            )
        if isinstance(memory, dict):
            issues += memory_issues(memory, None, scope)
    return Validation(value, issues)


def memory_issues(memory: Any, index: int | None, scope: TurnScope | None) -> list[Issue]:
    """The rules for one memory record. Fields of the wrong type are left to the schema issues."""
    if not isinstance(memory, dict):
        return []
    issues = []
    content = memory.get("content")
    if isinstance(content, str) and not content.strip():
        issues.append(Issue("content_empty", "content is empty", index, "content"))
    for name in DIMENSIONS:
        value = memory.get(name)
        if isinstance(value, str) and not value.strip():
            issues.append(
                Issue(
                    "dimension_blank", f"blank {name}: use null when the dialogue does not say", index, name
                )
            )
    issues += _time_issues(memory.get("time"), index)
    issues += _keyword_issues(memory.get("keywords"), index)
    turns = memory.get("source_turns")
    if isinstance(turns, list):
        issues += _source_issues(
            [t for t in turns if isinstance(t, str)], memory.get("speaker"), index, scope
        )
    return issues


def _source_issues(turns: list[str], speaker: Any, index: int | None, scope: TurnScope | None) -> list[Issue]:
    if not turns:
        return [Issue("source_turns_empty", "no source turn cited", index, "source_turns")]
    if scope is None:
        return []
    issues = []
    unknown = [t for t in turns if t not in scope.speakers]
    if unknown:
        issues.append(
            Issue(
                "source_turns_unknown",
                f"{unknown} not in the input (known: {_span(scope.speakers)})",
                index,
                "source_turns",
            )
        )
    overlap = [t for t in turns if t in scope.speakers and t not in scope.new]
    if overlap:
        issues.append(
            Issue(
                "source_turns_overlap",
                f"{overlap} are overlap context; cite only new turns ({_span(scope.new)})",
                index,
                "source_turns",
            )
        )
    cited = {scope.speakers[t] for t in turns if t in scope.speakers}
    if isinstance(speaker, str) and cited and speaker not in cited:
        issues.append(
            Issue(
                "speaker_mismatch",
                f"speaker {speaker!r} did not speak the cited turns (spoken by {sorted(cited)})",
                index,
                "speaker",
            )
        )
    return issues


def _time_issues(value: Any, index: int | None) -> list[Issue]:
    if value is None or not isinstance(value, str):
        return []
    problem = time_problem(value)
    return [Issue("time_format", problem, index, "time")] if problem else []


def time_problem(value: str) -> str | None:
    """Why `value` is not a normalized ISO 8601 time, or None when it is one."""
    try:
        parse_span(value)
    except ValueError as exc:
        return str(exc)
    return None


def _keyword_issues(keywords: Any, index: int | None) -> list[Issue]:
    if not isinstance(keywords, list):
        return []
    words = [k for k in keywords if isinstance(k, str)]
    if not words or any(not k.strip() for k in words):
        return [
            Issue(
                "keywords_empty", "keywords must be a non-empty list of non-blank strings", index, "keywords"
            )
        ]
    seen, repeated = set(), []
    for word in words:
        key = word.strip().casefold()
        if key in seen:
            repeated.append(word)
        seen.add(key)
    return [Issue("keywords_duplicate", f"repeated: {repeated}", index, "keywords")] if repeated else []


@cache
def _schema_validator(task: str) -> Draft202012Validator:
    return Draft202012Validator(json_schema(task))


@cache
def _schema_check(task: str):
    """The same schema compiled by jsonschema-rs: a yes/no 40x faster than walking it in Python, so
    only an answer that fails pays for the issue list (the update path checks every record)."""
    import jsonschema_rs

    return jsonschema_rs.validator_for(json_schema(task))


def _schema_issues(task: str, value: dict) -> list[Issue]:
    if _schema_check(task).is_valid(value):
        return []
    issues = []
    for error in _schema_validator(task).iter_errors(value):
        path, index = list(error.absolute_path), None
        if task == "extract" and len(path) >= 2 and path[0] == "memories":
            index, path = path[1], path[2:]
        issues.append(Issue("schema", error.message, index, ".".join(map(str, path)) or None))
    return issues


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _span(ids) -> str:
    ids = sorted(ids, key=lambda t: (len(t), t))
    return f"{ids[0]}..{ids[-1]}" if len(ids) > 2 else ", ".join(ids) or "none"
