"""The tools over a user's memories: add (extract and store), list, and by id get, update, delete,
restore and history."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field, create_model

from serve.deps import public
from serve.mcp_tools.state import MemoryId, ToolState, User
from serve.schemas import (
    AddResponse,
    ConversationId,
    HistoryEntry,
    MemoryPage,
    MemoryType,
    Message,
    Span,
    Status,
    StoredMemory,
    UpdateRequest,
)

# what update_memory may change: the service's PATCH body without its user
MemoryChanges = create_model(
    "MemoryChanges",
    __config__=UpdateRequest.model_config,
    __doc__=UpdateRequest.__doc__,
    **{name: (f.annotation, f) for name, f in UpdateRequest.model_fields.items() if name != "user_id"},
)


class MemoryHistory(BaseModel):
    id: str
    versions: list[HistoryEntry] = Field(description="every version, oldest first")


def add_memories(
    state: ToolState,
    messages: Annotated[
        list[Message],
        Field(min_length=1, description="the conversation, oldest first; timestamps date its sessions"),
    ],
    ctx: Context,
    user_id: User = None,
    conversation_id: Annotated[
        ConversationId | None,
        Field(
            description="append to this conversation (its stored turns are skipped); default: one "
            "derived from the messages"
        ),
    ] = None,
) -> AddResponse:
    """Extract memories from a conversation's messages (the server's extractor) and store them: one
    event per memory (ADD, or how it was merged with or superseded a stored one)."""
    if len(messages) > state.config.max_messages:
        raise ToolError(f"{len(messages)} messages; at most {state.config.max_messages} per call")
    call = state.calling(ctx, user_id)
    with call.answering():
        result = state.memory.add(
            [m.model_dump(exclude_none=True) for m in messages],
            user_id=call.store_user,
            conversation_id=conversation_id,
        )
    return AddResponse.model_validate(dataclasses.asdict(result))


def get_memory(state: ToolState, memory_id: MemoryId, ctx: Context, user_id: User = None) -> StoredMemory:
    """One memory of a user, in any status, with its dimensions and source pointers."""
    call = state.calling(ctx, user_id)
    with call.answering(memory_id):
        return call.record(state.memory.get(memory_id, user_id=call.store_user), memory_id)


def list_memories(
    state: ToolState,
    ctx: Context,
    user_id: User = None,
    type: MemoryType | None = None,
    status: Annotated[Status | Literal["any"], Field(description="'any': every status")] = "active",
    conversation_id: ConversationId | None = None,
    time: Span | None = None,
    limit: Annotated[int, Field(ge=1, description="page size, capped by the server's max_page_size")] = 100,
    cursor: Annotated[str | None, Field(max_length=500, description="a page's next_cursor")] = None,
) -> MemoryPage:
    """A user's memories, oldest first, a page at a time; pass `next_cursor` back for the next one."""
    call = state.calling(ctx, user_id)
    filters = {"type": type, "status": status, "conversation_id": conversation_id, "time": time}
    with call.answering():
        page = state.memory.get_all(
            user_id=call.store_user,
            filters={key: value for key, value in filters.items() if value is not None},
            limit=min(limit, state.config.max_page_size),
            cursor=cursor,
        )
    return MemoryPage(memories=[call.record(r, r["id"]) for r in page.memories], next_cursor=page.next_cursor)


def update_memory(
    state: ToolState, memory_id: MemoryId, changes: MemoryChanges, ctx: Context, user_id: User = None
) -> StoredMemory:
    """Change fields of an active memory; the old version stays in its history."""
    call = state.calling(ctx, user_id)
    with call.answering(memory_id):
        fields = changes.model_dump(exclude_unset=True)
        return call.record(state.memory.update(memory_id, user_id=call.store_user, **fields), memory_id)


def delete_memory(state: ToolState, memory_id: MemoryId, ctx: Context, user_id: User = None) -> StoredMemory:
    """Delete an active memory: it is no longer found, and stays in its history (restore_memory
    undoes it)."""
    call = state.calling(ctx, user_id)
    with call.answering(memory_id):
        state.memory.delete(memory_id, user_id=call.store_user)
        return call.record(state.memory.get(memory_id, user_id=call.store_user), memory_id)


def restore_memory(state: ToolState, memory_id: MemoryId, ctx: Context, user_id: User = None) -> StoredMemory:
    """Make a deleted, superseded or merged memory active again: the undo of a delete or of a wrong
    merge."""
    call = state.calling(ctx, user_id)
    with call.answering(memory_id):
        return call.record(state.memory.restore(memory_id, user_id=call.store_user), memory_id)


def memory_history(
    state: ToolState, memory_id: MemoryId, ctx: Context, user_id: User = None
) -> MemoryHistory:
    """Every version of a memory, oldest first, with what changed it (ADD, UPDATE, DELETE, RESTORE,
    MERGE, SUPERSEDED_BY ...)."""
    call = state.calling(ctx, user_id)
    with call.answering(memory_id):
        versions = state.memory.history(memory_id, user_id=call.store_user)
        if not versions:
            raise call.missing(memory_id)
    return MemoryHistory(
        id=memory_id, versions=[{**h, "record": public(h["record"], call.user)} for h in versions]
    )
