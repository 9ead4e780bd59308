"""The profile resource (`memory://{user_id}/profile`): a user's active profile memories as one memory
page. Its refusals are resource errors, the tools' one-line messages among them."""

from __future__ import annotations

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import TypeAdapter, ValidationError

from serve.mcp_tools.state import ToolState, oversized
from serve.schemas import MemoryPage, UserId

_user_id = TypeAdapter(UserId)  # the URI's user id is a plain string, checked here as the tools' are


def profile(state: ToolState, user_id: str, ctx: Context) -> str:
    try:
        call = state.calling(ctx, _user_id.validate_python(user_id))
        with call.answering():
            page = state.memory.get_all(
                user_id=call.store_user, filters={"type": "profile"}, limit=state.config.max_page_size
            )
    except ValidationError:
        raise ResourceError("a user id is letters, digits and _.@:-, at most 200 characters") from None
    except ToolError as exc:
        raise ResourceError(str(exc)) from None
    memories = [call.record(r, r["id"]) for r in page.memories]
    text = MemoryPage(memories=memories, next_cursor=page.next_cursor).model_dump_json()
    if why := oversized(text, state.config.max_result_bytes):
        raise ResourceError(f"{why}: page through list_memories with type profile")
    return text
