"""What the memory service accepts and answers: request bodies (strict: unknown fields are 422) and
response models (every route declares one, so the OpenAPI document shows the real shapes)."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from dimmem.contract.records import MEMORY_TYPES, UPDATABLE_FIELDS, MemoryRecord, QueryParse
from dimmem.runtime.stores.log import STATUSES

NAME_PATTERN = r"^[A-Za-z0-9_.@:\-]+$"
MAX_RECORD_ID = 512  # a conversation id (<= 200) + "/<window id>#m<n>", with room to spare
UserId = Annotated[str, Field(min_length=1, max_length=200, pattern=NAME_PATTERN)]
ConversationId = Annotated[str, Field(min_length=1, max_length=200, pattern=NAME_PATTERN)]
SearchQuery = Annotated[str, Field(min_length=1, max_length=2_000)]
MemoryType = Literal[MEMORY_TYPES]  # type: ignore[valid-type]
Span = Annotated[
    str,
    Field(
        max_length=40,
        description="ISO date, partial date or interval (2024-03, 2024-03-01/2024-03-07): memories whose "
        "time overlaps it (a memory without a time is left out)",
    ),
]
Text = Annotated[str, Field(min_length=1, max_length=500)]
Status = Literal[STATUSES]  # type: ignore[valid-type]
# HISTORY: stored as the history of a later record (superseded by it: dimmem.runtime.update)
Action = Literal["ADD", "KEEP_BOTH", "MERGE", "SUPERSEDE", "HISTORY", "UNCHANGED"]


# --- requests -------------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Body):
    role: Literal["user", "assistant", "system", "developer", "tool"]
    content: str = Field(max_length=100_000)
    name: str | None = Field(default=None, max_length=200)
    timestamp: str | None = Field(
        default=None, max_length=40, description="ISO 8601; starts a session's date"
    )
    session_id: str | None = Field(default=None, max_length=200)


class AddRequest(_Body):
    user_id: UserId
    messages: list[Message] = Field(min_length=1)
    conversation_id: ConversationId | None = None


class ExtractRequest(_Body):
    messages: list[Message] = Field(min_length=1)


class SearchRequest(_Body):
    user_id: UserId
    query: SearchQuery
    k: int = Field(default=10, ge=1)
    reference_date: date | None = Field(
        default=None, description="what 'last week' in the query is relative to; default: today"
    )
    type: MemoryType | None = Field(default=None, description="only memories of this type")
    time: Span | None = None
    location: Text | None = Field(default=None, description="a place the memory's location contains")
    speaker: Text | None = Field(default=None, description="whom the memory is about, by name")

    def filters(self):
        """The runtime's search filters of this request (`dimmem.runtime.search.SearchFilters`)."""
        from dimmem.runtime.search import SearchFilters

        return SearchFilters(self.type, self.time, self.location, self.speaker)


def _no_null_default(schema: dict) -> None:
    """Fields that may be omitted but not null: their schema shows no `default: null`."""
    for prop in schema.get("properties", {}).values():
        if prop.get("default", ...) is None and "anyOf" not in prop and prop.get("type") != "null":
            del prop["default"]


# what a PATCH may change (the contract's UPDATABLE_FIELDS), each with the service's size limit (a
# record's content, a dimension, a keyword list)
_LIMITS = {
    "content": {"min_length": 1, "max_length": 10_000},
    "type": {},
    "time": {"max_length": 40},
    "location": {"max_length": 500},
    "reason": {"max_length": 2_000},
    "purpose": {"max_length": 2_000},
    "keywords": {"max_length": 50},
}


class _Update(_Body):
    """Only the fields given change. `content`, `type` and `keywords` may be omitted but not null;
    `time`, `location`, `reason` and `purpose` may be null (the dimension is cleared)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_no_null_default)

    user_id: UserId


def _updatable(name: str, limits: dict) -> tuple:
    """The contract field's type (a keyword's length limited too) with the service's limits; a None
    default is never validated: omitted -> unset, an explicit null on a non-nullable field is 422."""
    annotation = MemoryRecord.model_fields[name].annotation
    if name == "keywords":
        annotation = list[Annotated[str, Field(max_length=200)]]
    return annotation, Field(default=None, **limits)


UpdateRequest = create_model(
    "UpdateRequest",
    __base__=_Update,
    __doc__=_Update.__doc__,
    **{name: _updatable(name, _LIMITS[name]) for name in UPDATABLE_FIELDS},
)


# --- responses ------------------------------------------------------------------------------------
class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ExtractedMemory(MemoryRecord):
    """A record as extraction makes it: the DimMem fields (the contract's own), pointers resolved to
    conversation turn ids, and where it came from."""

    model_config = ConfigDict(extra="ignore")

    source_turns: list[str] = Field(description="the conversation turn ids it comes from")
    id: str = Field(description="<conversation id>/<window id>#m<n>, stable across re-runs")
    conversation_id: str | None
    window_id: str | None
    session_time: str | None = Field(description="when the session of its turns took place")


class StoredMemory(ExtractedMemory):
    """A stored record: the extracted fields and its state in the store."""

    user_id: str
    status: Status
    version: int = Field(description="1 when added; each update, merge or status change adds one")
    created: float = Field(description="Unix time it was stored")
    updated: float = Field(description="Unix time of its latest version")
    t_start: str | None = Field(description="first day of `time` (derived, for interval queries)")
    t_end: str | None = Field(description="last day of `time` (derived)")


class PathScore(_Answer):
    rank: int = Field(description="1-based rank on this retrieval path")
    score: float = Field(description="the path's own score (BM25, cosine or dimension match)")


class Hit(_Answer):
    score: float = Field(description="the fused (reciprocal rank fusion) score")
    paths: dict[str, PathScore] = Field(description="bm25 / dense / dimension: where this path ranked it")
    record: StoredMemory


class ParsedQuery(QueryParse):
    """The question as the query parser read it (the contract's `parse_query` answer)."""

    model_config = ConfigDict(extra="ignore")


class AssistantTurn(_Answer):
    turn_id: str
    speaker: str
    role: str
    text: str
    session_time: str | None


class SearchResponse(_Answer):
    query: ParsedQuery
    hits: list[Hit]
    assistant_context: list[AssistantTurn] = Field(
        description="the assistant's replies to the hits' turns, when the question asks what it said"
    )


class Event(_Answer):
    id: str
    action: Action
    target: str | None = Field(description="the stored record it merged into or superseded")


class AddResponse(_Answer):
    conversation_id: str
    windows: int
    events: list[Event]
    rejected: list[str] = Field(description="memories the validator refused, with the reasons")
    failed: dict[str, str] = Field(description="window id -> why the extractor gave no answer")


class ExtractResponse(_Answer):
    conversation_id: str
    windows: int
    memories: list[ExtractedMemory]
    rejected: list[str]
    failed: dict[str, str]


class HistoryEntry(_Answer):
    version: int
    action: str = Field(
        description="ADD, UPDATE, DELETE, RESTORE, MERGE <id>, MERGED_INTO <id>, SUPERSEDED_BY <id>"
    )
    at: float = Field(description="Unix time")
    record: StoredMemory = Field(description="the record as this version left it")


class MemoryPage(_Answer):
    memories: list[StoredMemory]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: no more")


class Health(_Answer):
    status: Literal["ok"]


class Readiness(_Answer):
    status: Literal["ready", "unavailable"]
    detail: str | None  # why not, when unavailable
