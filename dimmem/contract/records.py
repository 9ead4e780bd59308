"""The DimMem record contract (v1): one definition, from which every JSON Schema is generated.

Three tasks share it: `extract` (a window -> memories), `parse_query` (a question -> retrieval
constraints) and `consolidate` (a new record vs. a stored candidate -> action). The generated schemas
are in the form OpenAI strict structured outputs and vLLM's xgrammar backend both accept unchanged:
every property required, `additionalProperties: false`, nullable scalars as type unions, no titles.
Rules a schema cannot express live in `dimmem.contract.validate`.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema

MemoryType = Literal["fact", "episodic", "profile"]
MEMORY_TYPES: tuple[str, ...] = MemoryType.__args__
Action = Literal["MERGE", "SUPERSEDE", "KEEP_BOTH"]
ACTIONS: tuple[str, ...] = Action.__args__


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryRecord(_Strict):
    """One atomic memory with explicit dimensions."""

    source_turns: list[str] = Field(
        description="Window-local ids (t1, t2, ...) of the new turns it comes from."
    )
    speaker: str = Field(description="Name of the speaker of the cited turns whom the memory is about.")
    content: str = Field(description="Self-contained statement: names instead of pronouns, absolute dates.")
    type: MemoryType = Field(
        description="fact: stable knowledge; episodic: a dated event; profile: lasting trait or preference."
    )
    time: str | None = Field(
        description="ISO 8601 date, partial date (YYYY-MM, YYYY) or interval start/end; null if none."
    )
    location: str | None = Field(description="Where it happened or applies; null if not stated.")
    reason: str | None = Field(description="Why it happened; null if not stated.")
    purpose: str | None = Field(description="What it is for; null if not stated.")
    keywords: list[str] = Field(description="Entities and topics that anchor the memory.")


MEMORY_FIELDS: tuple[str, ...] = tuple(
    MemoryRecord.model_fields
)  # what a model writes; the pipeline adds the rest
# what a stored record's new version may change: all but the pointer and its speaker (who said it)
UPDATABLE_FIELDS: tuple[str, ...] = tuple(f for f in MEMORY_FIELDS if f not in ("source_turns", "speaker"))
DIMENSIONS: tuple[str, ...] = tuple(
    name
    for name, info in MemoryRecord.model_fields.items()
    if info.annotation == (str | None) and name != "time"
)
"""The free-text dimensions (location, reason, purpose): nullable text, indexed and scored alike; `time`
has a grammar of its own."""


def memory_record(**fields: Any) -> dict:
    """A record in the contract's field order: the fields given, every other one empty (null, or [] for
    lists), for code that builds records without a model (rule extractors, benchmarks, test worlds)."""
    if unknown := set(fields) - set(MEMORY_FIELDS):
        raise ValueError(f"not contract fields: {sorted(unknown)}")
    empty = {
        name: [] if info.annotation == list[str] else None for name, info in MemoryRecord.model_fields.items()
    }
    return {**empty, **fields}


class Extraction(_Strict):
    memories: list[MemoryRecord]


class QueryParse(_Strict):
    target_types: list[MemoryType] = Field(description="Memory types that can answer the question.")
    time: str | None = Field(
        description="Time constraint as ISO 8601 date, partial date or interval; null if none."
    )
    location: str | None = Field(description="Location constraint; null if none.")
    keywords: list[str] = Field(description="Entities and topics to look for.")
    need_assistant_context: bool = Field(
        description="True if the answer needs what the assistant said earlier."
    )


class Consolidation(_Strict):
    action: Action = Field(description="MERGE into one record, SUPERSEDE the candidate, or KEEP_BOTH.")
    memory: MemoryRecord | None = Field(
        description="The resulting record for MERGE/SUPERSEDE; null for KEEP_BOTH."
    )


TASK_MODELS: dict[str, type[_Strict]] = {
    "extract": Extraction,
    "parse_query": QueryParse,
    "consolidate": Consolidation,
}


class _StrictSchema(GenerateJsonSchema):
    """Pydantic's generator, adjusted to the strict form: `T | None` becomes a type union."""

    def nullable_schema(self, schema):
        inner = self.generate_inner(schema["schema"])
        if isinstance(inner.get("type"), str) and "$ref" not in inner:
            return {**inner, "type": [inner["type"], "null"]}
        return {"anyOf": [inner, {"type": "null"}]}


def _drop_titles(node: Any) -> Any:
    """Remove pydantic's `title` annotations (schema keywords only, never property names)."""
    if isinstance(node, list):
        return [_drop_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key in ("properties", "$defs"):
            out[key] = {name: _drop_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _drop_titles(value)
    return out


def _task_model(task: str) -> type[_Strict]:
    try:
        return TASK_MODELS[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASK_MODELS)}") from None


@cache
def _schema(task: str) -> dict:
    return _drop_titles(_task_model(task).model_json_schema(schema_generator=_StrictSchema))


def json_schema(task: str) -> dict:
    """The JSON Schema of a task's answer (a fresh copy: callers may mutate it)."""
    return copy.deepcopy(_schema(task))


def max_memories(citable: dict[str, list[str]]) -> int:
    """The most memories a window's answer may list: one per new turn (LoCoMo's annotations, the densest
    gold there is, give at most 0.9 per new turn in a window)."""
    return sum(len(turns) for turns in citable.values())


def window_schema(citable: dict[str, list[str]]) -> dict:
    """The extract schema of one window. `citable`: speaker -> the new turn ids they spoke. Each memory
    names one of those speakers and cites only new turns of that speaker (at least one): the pointer
    rules (source_turns_unknown/overlap/empty, speaker_mismatch) enforced while decoding, not after.
    At most one memory per new turn (`max_memories`): an answer stuck repeating itself ends there, with
    its JSON closed, instead of running into its token budget."""
    schema = json_schema("extract")
    memories = schema["properties"]["memories"]
    memories["maxItems"] = max_memories(citable)
    if not citable:  # no new turns: nothing may be cited, so no memory can be valid
        return schema
    record = schema["$defs"].pop("MemoryRecord")
    variants = []
    for i, (speaker, turns) in enumerate(citable.items()):
        variant = copy.deepcopy(record)
        props = variant["properties"]
        props["speaker"] = {**props["speaker"], "enum": [speaker]}
        props["source_turns"] = {
            **props["source_turns"],
            "items": {"type": "string", "enum": list(turns)},
            "minItems": 1,
        }
        schema["$defs"][f"MemoryOfSpeaker{i}"] = variant
        variants.append({"$ref": f"#/$defs/MemoryOfSpeaker{i}"})
    memories["items"] = {"anyOf": variants}
    return schema


def response_format(task: str, citable: dict[str, list[str]] | None = None) -> dict:
    """The OpenAI `response_format` for strict structured outputs of a task; for extract with `citable`,
    the window's own schema (`window_schema`)."""
    schema = window_schema(citable) if task == "extract" and citable is not None else json_schema(task)
    return {
        "type": "json_schema",
        "json_schema": {"name": f"dimmem_{task}", "schema": schema, "strict": True},
    }


def canonical_json(task: str, value: dict) -> str:
    """Compact JSON with keys in contract order: the exact text a model is trained to emit."""
    return _task_model(task).model_validate(value).model_dump_json()
