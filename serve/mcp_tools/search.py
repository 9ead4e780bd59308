"""The search tool: the runtime's tri-path search, with the HTTP service's filters and answer."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from dimmem.runtime.search import SearchFilters
from serve.deps import public
from serve.mcp_tools.state import ToolState, User
from serve.schemas import MemoryType, SearchQuery, SearchResponse, Span, Text


def search_memories(
    state: ToolState,
    query: SearchQuery,
    ctx: Context,
    user_id: User = None,
    k: Annotated[int, Field(ge=1, description="hits, at most the server's max_k")] = 10,
    type: MemoryType | None = None,
    time: Span | None = None,
    location: Annotated[Text | None, Field(description="a place the memory's location contains")] = None,
    speaker: Annotated[Text | None, Field(description="whom the memory is about, by name")] = None,
    reference_date: Annotated[
        date | None, Field(description="what 'last week' in the query is relative to; default: today")
    ] = None,
) -> SearchResponse:
    """Search a user's memories: BM25, embeddings and the query's dimensions fused; each hit has its
    dimensions (type, time, location, reason, purpose), its source turns and its score per path.

    Filters are strict, a hit outside them is dropped (`time`: a memory without a time too), and they
    replace what the query parser read from the question, so retrieval looks for memories of that
    type, time and place in the first place."""
    if k > state.config.max_k:
        raise ToolError(f"k={k}; at most {state.config.max_k}")
    call = state.calling(ctx, user_id)
    with call.answering():
        result = state.memory.search(
            query,
            user_id=call.store_user,
            k=k,
            reference_date=reference_date.isoformat() if reference_date else None,
            filters=SearchFilters(type, time, location, speaker),
        )
    hits = [{"score": h.score, "paths": h.paths, "record": public(h.record, call.user)} for h in result.hits]
    return SearchResponse.model_validate(
        {"query": result.query, "hits": hits, "assistant_context": result.assistant_context}
    )
