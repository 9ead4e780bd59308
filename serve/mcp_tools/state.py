"""What every MCP tool shares: `ToolState` (the config, the memory, the tenants' keys), the `Caller` of
one call (its user, as named and as stored, and the runtime's refusals as one-line tool errors), the
argument types several tools take, and the size check on an answer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

import pydantic_core
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from dimmem.runtime.memory import Memory
from serve.config import McpConfig
from serve.deps import public, scoped
from serve.guard import caller, clip
from serve.schemas import MAX_RECORD_ID, StoredMemory, UserId

ERROR_CHARS = 300  # of a runtime message a tool error repeats

User = Annotated[
    UserId | None,
    Field(description="whose memories (letters, digits, _.@:-); default: the server's user"),
]
MemoryId = Annotated[
    str,
    Field(
        min_length=1, max_length=MAX_RECORD_ID, description="a memory's id, as add, search or list show it"
    ),
]


@dataclass
class ToolState:
    """What the tools share. `keys` (API key -> tenant): calls come over HTTP and each is confined to its
    key's tenant; None: one local client (stdio), user ids as given."""

    config: McpConfig
    memory: Memory
    keys: dict[str, str] | None = None

    def calling(self, ctx: Context, user_id: str | None) -> Caller:
        """The call's user: `user_id` or the server's, namespaced in the store by the key's tenant."""
        user = user_id or self.config.user
        if self.keys is None:
            return Caller(self.memory, user, user)
        tenant = caller(ctx.headers.get("authorization") if ctx.headers else None, self.keys)
        if tenant is None:  # serve.guard has refused it already; this holds without it
            raise ToolError("missing or unknown API key")
        return Caller(self.memory, user, scoped(tenant, user))


@dataclass
class Caller:
    """One call's user, as the caller names it and as the store does (namespaced by tenant over HTTP)."""

    memory: Memory
    user: str
    store_user: str

    def record(self, record: dict | None, record_id: str) -> StoredMemory:
        if record is None:
            raise self.missing(record_id)
        return StoredMemory.model_validate(public(record, self.user))

    def missing(self, record_id: str) -> ToolError:
        """Not found: the user has no such memory, or no memory at all (a user id mistyped, say)."""
        page = self.memory.get_all(user_id=self.store_user, filters={"status": "any"}, limit=1)
        if not page.memories:
            return ToolError(f"user {self.user!r} has no memories")
        return ToolError(f"no memory {clip(record_id)!r} for user {self.user!r}")

    @contextmanager
    def answering(self, record_id: str = "") -> Iterator[None]:
        """The runtime's refusals as one-line tool errors: an unknown record (KeyError), a status that
        forbids the change (RecordStateError), a bad value (ValueError); a failure with a store that does
        not answer says so. Anything else is a bug: the SDK logs it and answers generically."""
        try:
            yield
        except ToolError:
            raise
        except KeyError:
            raise self.missing(record_id) from None
        except ValueError as exc:  # RecordStateError, DataFormatError and timespan errors are ValueErrors
            raise ToolError(_line(exc)) from None
        except OverflowError as exc:  # date arithmetic on a far-off date
            raise ToolError(f"a value is out of range: {_line(exc)}") from None
        except Exception as exc:
            if not _store_answers(self.memory):
                raise ToolError("the memory store does not answer; try again later") from exc
            raise


def oversized(answer: BaseModel | str, limit: int) -> str | None:
    """Why `answer` cannot be sent: its JSON, as it goes on the wire, is over `limit` bytes (the SDK's
    HTTP client refuses a server-sent event over 1 MiB); None when it fits."""
    size = len(pydantic_core.to_json(answer, by_alias=True))
    return (
        f"the answer is {size} bytes, over the server's max_result_bytes ({limit})" if size > limit else None
    )


def _line(exc: BaseException) -> str:
    return clip(" ".join(str(exc).split()), ERROR_CHARS)


def _store_answers(memory: Memory) -> bool:
    try:
        return memory.store.ping()
    except Exception:
        return False
