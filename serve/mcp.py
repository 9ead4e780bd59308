"""`dimmem serve mcp`: the memory runtime as an MCP server (the `mcp` SDK's MCPServer), so any agent that
speaks MCP can keep and recall memories.

    dimmem serve mcp                                    # stdio: one local user, a SQLite file of theirs
    dimmem serve mcp --transport http --config configs/serve/mcp.yaml    # streamable HTTP, tenants

Each tool is a small function over one shared `Memory`, built from the memory config and store as
`dimmem serve api` builds it, so the two can share a store (a Postgres). Arguments and results are
typed (serve/schemas.py's models where they fit), so clients get JSON Schemas for both. Calls name a
user (`user_id`, default: the config's `user`); over HTTP the bearer key names the tenant and user ids
are namespaced by it inside the store as the service does (`serve.deps.scoped`), so no tenant reaches
another's records, `serve.guard` answers a request without a known key (or with two keys) before the
MCP transport reads it (and applies the service's size and time limits), and each session belongs to
the tenant that opened it: another tenant's key on it is answered as if it did not exist.

Every refusal is a tool error of one line: arguments the schema refuses (each field and the reason,
never the value given), arguments no parameter takes, an unknown record or user, a record whose status
forbids the change, a bad value, a store that does not answer, an answer over `max_result_bytes`.
Anything else is the SDK's generic "Error executing tool <name>", its traceback logged on the server's
stderr only. Over stdio a line that is not a JSON-RPC message gets JSON-RPC's error for it.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any, Literal

import anyio
import pydantic_core
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError, UnexpectedToolError
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, ToolAnnotations
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, create_model
from starlette.applications import Starlette
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse

from dimmem.runtime.memory import Memory
from dimmem.runtime.search import SearchFilters
from serve.config import McpConfig
from serve.deps import Metrics, ServiceState, public, scoped
from serve.guard import Guard, caller, clip
from serve.schemas import (
    MAX_RECORD_ID,
    AddResponse,
    ConversationId,
    HistoryEntry,
    MemoryPage,
    MemoryType,
    Message,
    SearchQuery,
    SearchResponse,
    Span,
    Status,
    StoredMemory,
    Text,
    UpdateRequest,
    UserId,
)

INSTRUCTIONS = (
    "Long-term memory of the user across conversations. Store what the user tells you that is worth "
    "keeping with add_memories (the conversation's messages, with their timestamps), and call "
    "search_memories before answering anything about the user's past, people, places, preferences or "
    "plans; filter by type, time, location or speaker when the question names one. Memories have ids: "
    "get, update, delete, restore and history take them."
)
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
# what update_memory may change: the service's PATCH body without its user
MemoryChanges = create_model(
    "MemoryChanges",
    __config__=UpdateRequest.model_config,
    __doc__=UpdateRequest.__doc__,
    **{name: (f.annotation, f) for name, f in UpdateRequest.model_fields.items() if name != "user_id"},
)
_user_id = TypeAdapter(UserId)
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DELETE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


class MemoryHistory(BaseModel):
    id: str
    versions: list[HistoryEntry] = Field(description="every version, oldest first")


@dataclass
class _Caller:
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


def _line(exc: BaseException) -> str:
    return clip(" ".join(str(exc).split()), ERROR_CHARS)


def _store_answers(memory: Memory) -> bool:
    try:
        return memory.store.ping()
    except Exception:
        return False


def _listed(items: list[str], separator: str = "; ", most: int = 5) -> str:
    """The first `most` items in one line, and how many more there are."""
    more = f" (and {len(items) - most} more)" if len(items) > most else ""
    return separator.join(items[:most]) + more


def _problems(error: ValidationError) -> str:
    """Pydantic's report in one line: where and why, never the value given (it may be huge)."""
    return _listed(
        [
            f"{'.'.join(str(part) for part in e['loc']) or 'arguments'}: {' '.join(e['msg'].split())}"
            for e in error.errors(include_url=False, include_input=False)
        ]
    )


def _oversized(answer: BaseModel | str, limit: int) -> str | None:
    """Why `answer` cannot be sent: its JSON, as it goes on the wire, is over `limit` bytes (the SDK's
    HTTP client refuses a server-sent event over 1 MiB); None when it fits."""
    size = len(pydantic_core.to_json(answer, by_alias=True))
    return (
        f"the answer is {size} bytes, over the server's max_result_bytes ({limit})" if size > limit else None
    )


def _unreadable(error: Exception) -> JSONRPCError:
    """JSON-RPC's answer to a line that is not JSON (parse error) or is JSON but no JSON-RPC message
    (invalid request); its id is null, since none could be read."""
    if isinstance(error, ValidationError) and error.errors()[0]["type"] == "json_invalid":
        code, message = PARSE_ERROR, "Parse error: the line is not JSON"
    else:
        code, message = INVALID_REQUEST, "Invalid Request: the line is not a JSON-RPC message"
    return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message))


class _Server(MCPServer):
    """The SDK's server, stricter where it would leave a client guessing: refused arguments said in one
    line instead of pydantic's full report; arguments no parameter takes refused, not dropped (a typo
    would run with the default); an answer too large to deliver refused, naming the limit; over stdio,
    a line that is not a JSON-RPC message answered with JSON-RPC's error, not dropped without a word."""

    def __init__(self, name: str, *, max_result_bytes: int, **settings: Any) -> None:
        super().__init__(name, **settings)
        self.max_result_bytes = max_result_bytes
        self.parameters: dict[str, frozenset[str]] = {}  # tool -> the arguments it takes

    def add_tool(self, fn, **options: Any) -> None:
        super().add_tool(fn, **options)
        taken = set(inspect.signature(fn).parameters) - {find_context_parameter(fn)}
        self.parameters[options.get("name") or fn.__name__] = frozenset(taken)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        taken = self.parameters.get(name)
        if taken is not None and (unknown := sorted(set(arguments) - taken)):
            named = _listed([clip(argument, 40) for argument in unknown], ", ")
            takes = ", ".join(sorted(taken))
            raise ToolError(f"Error executing tool {name}: unknown arguments: {named} (it takes {takes})")
        try:
            result = await super().call_tool(name, arguments, context)
        except UnexpectedToolError:
            raise
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(f"Error executing tool {name}: {_problems(exc.__cause__)}") from exc.__cause__
            raise
        if why := _oversized(result, self.max_result_bytes):
            raise ToolError(f"Error executing tool {name}: {why}: ask for fewer (k, limit)")
        return result

    async def run_stdio_async(self) -> None:
        """The SDK's stdio transport and loop, with an answer for each line its transport cannot read
        (the transport passes on the exception, and the SDK's loop drops it)."""
        async with stdio_server() as (lines, answers), anyio.create_task_group() as tasks:
            messages, read = anyio.create_memory_object_stream[SessionMessage](0)

            async def answer_unreadable() -> None:
                async with messages:
                    async for line in lines:
                        if isinstance(line, Exception):
                            await answers.send(SessionMessage(_unreadable(line)))
                        else:
                            await messages.send(line)

            tasks.start_soon(answer_unreadable)
            server = self._lowlevel_server
            await server.run(read, answers, server.create_initialization_options())


@dataclass
class _TenantKeys:
    """The tenants' keys as the SDK's bearer tokens, each naming its tenant as the client: the SDK binds
    a session to the client that opened it and answers any other on it as if it did not exist (404)."""

    keys: dict[str, str]  # API key -> tenant

    async def verify_token(self, token: str) -> AccessToken | None:
        tenant = caller(f"Bearer {token}", self.keys)
        return None if tenant is None else AccessToken(token=token, client_id=tenant, scopes=[])


def build_server(config: McpConfig, memory: Memory, keys: dict[str, str] | None = None) -> MCPServer:
    """The tools and the profile resource over `memory`. `keys` (API key -> tenant): calls come over HTTP
    and each is confined to its key's tenant; None: one local client (stdio), user ids as given."""
    server = _Server("dimmem", instructions=INSTRUCTIONS, max_result_bytes=config.max_result_bytes)

    def calling(ctx: Context, user_id: str | None) -> _Caller:
        user = user_id or config.user
        if keys is None:
            return _Caller(memory, user, user)
        tenant = caller(ctx.headers.get("authorization") if ctx.headers else None, keys)
        if tenant is None:  # serve.guard has refused it already; this holds without it
            raise ToolError("missing or unknown API key")
        return _Caller(memory, user, scoped(tenant, user))

    def tool(annotations: ToolAnnotations):
        """Register a tool; its docstring, dedented, is the description clients give the model."""

        def register(fn):
            server.add_tool(fn, description=inspect.cleandoc(fn.__doc__), annotations=annotations)
            return fn

        return register

    @tool(WRITE)
    def add_memories(
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
        if len(messages) > config.max_messages:
            raise ToolError(f"{len(messages)} messages; at most {config.max_messages} per call")
        call = calling(ctx, user_id)
        with call.answering():
            result = memory.add(
                [m.model_dump(exclude_none=True) for m in messages],
                user_id=call.store_user,
                conversation_id=conversation_id,
            )
        return AddResponse.model_validate(dataclasses.asdict(result))

    @tool(READ)
    def search_memories(
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
        if k > config.max_k:
            raise ToolError(f"k={k}; at most {config.max_k}")
        call = calling(ctx, user_id)
        with call.answering():
            result = memory.search(
                query,
                user_id=call.store_user,
                k=k,
                reference_date=reference_date.isoformat() if reference_date else None,
                filters=SearchFilters(type, time, location, speaker),
            )
        hits = [
            {"score": h.score, "paths": h.paths, "record": public(h.record, call.user)} for h in result.hits
        ]
        return SearchResponse.model_validate(
            {"query": result.query, "hits": hits, "assistant_context": result.assistant_context}
        )

    @tool(READ)
    def get_memory(memory_id: MemoryId, ctx: Context, user_id: User = None) -> StoredMemory:
        """One memory of a user, in any status, with its dimensions and source pointers."""
        call = calling(ctx, user_id)
        with call.answering(memory_id):
            return call.record(memory.get(memory_id, user_id=call.store_user), memory_id)

    @tool(READ)
    def list_memories(
        ctx: Context,
        user_id: User = None,
        type: MemoryType | None = None,
        status: Annotated[Status | Literal["any"], Field(description="'any': every status")] = "active",
        conversation_id: ConversationId | None = None,
        time: Span | None = None,
        limit: Annotated[
            int, Field(ge=1, description="page size, capped by the server's max_page_size")
        ] = 100,
        cursor: Annotated[str | None, Field(max_length=500, description="a page's next_cursor")] = None,
    ) -> MemoryPage:
        """A user's memories, oldest first, a page at a time; pass `next_cursor` back for the next one."""
        call = calling(ctx, user_id)
        filters = {"type": type, "status": status, "conversation_id": conversation_id, "time": time}
        with call.answering():
            page = memory.get_all(
                user_id=call.store_user,
                filters={key: value for key, value in filters.items() if value is not None},
                limit=min(limit, config.max_page_size),
                cursor=cursor,
            )
        return MemoryPage(
            memories=[call.record(r, r["id"]) for r in page.memories], next_cursor=page.next_cursor
        )

    @tool(WRITE)
    def update_memory(
        memory_id: MemoryId, changes: MemoryChanges, ctx: Context, user_id: User = None
    ) -> StoredMemory:
        """Change fields of an active memory; the old version stays in its history."""
        call = calling(ctx, user_id)
        with call.answering(memory_id):
            fields = changes.model_dump(exclude_unset=True)
            return call.record(memory.update(memory_id, user_id=call.store_user, **fields), memory_id)

    @tool(DELETE)
    def delete_memory(memory_id: MemoryId, ctx: Context, user_id: User = None) -> StoredMemory:
        """Delete an active memory: it is no longer found, and stays in its history (restore_memory
        undoes it)."""
        call = calling(ctx, user_id)
        with call.answering(memory_id):
            memory.delete(memory_id, user_id=call.store_user)
            return call.record(memory.get(memory_id, user_id=call.store_user), memory_id)

    @tool(WRITE)
    def restore_memory(memory_id: MemoryId, ctx: Context, user_id: User = None) -> StoredMemory:
        """Make a deleted, superseded or merged memory active again: the undo of a delete or of a wrong
        merge."""
        call = calling(ctx, user_id)
        with call.answering(memory_id):
            return call.record(memory.restore(memory_id, user_id=call.store_user), memory_id)

    @tool(READ)
    def memory_history(memory_id: MemoryId, ctx: Context, user_id: User = None) -> MemoryHistory:
        """Every version of a memory, oldest first, with what changed it (ADD, UPDATE, DELETE, RESTORE,
        MERGE, SUPERSEDED_BY ...)."""
        call = calling(ctx, user_id)
        with call.answering(memory_id):
            versions = memory.history(memory_id, user_id=call.store_user)
            if not versions:
                raise call.missing(memory_id)
        return MemoryHistory(
            id=memory_id, versions=[{**h, "record": public(h["record"], call.user)} for h in versions]
        )

    @server.resource(
        "memory://{user_id}/profile",
        name="profile",
        description="a user's active profile memories (lasting traits and preferences), as a memory page",
        mime_type="application/json",
    )
    def profile(user_id: str, ctx: Context) -> str:
        try:
            call = calling(ctx, _user_id.validate_python(user_id))
            with call.answering():
                page = memory.get_all(
                    user_id=call.store_user, filters={"type": "profile"}, limit=config.max_page_size
                )
        except ValidationError:
            raise ResourceError("a user id is letters, digits and _.@:-, at most 200 characters") from None
        except ToolError as exc:
            raise ResourceError(str(exc)) from None
        memories = [call.record(r, r["id"]) for r in page.memories]
        text = MemoryPage(memories=memories, next_cursor=page.next_cursor).model_dump_json()
        if why := _oversized(text, config.max_result_bytes):
            raise ResourceError(f"{why}: page through list_memories with type profile")
        return text

    return server


def http_app(config: McpConfig, memory: Memory) -> Starlette:
    """The streamable HTTP app at `config.path`, behind the service's guard (401 without a tenant's key,
    400 with two, the body and head limits), with /healthz (no key) for whatever watches it; each session
    bound to the tenant whose key opened it."""
    keys = config.keys()  # refuses missing, empty or shared keys, naming the variables
    server = build_server(config, memory, keys)

    @server.custom_route("/healthz", methods=["GET"])
    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = server.streamable_http_app(
        streamable_http_path=config.path, max_request_body_size=config.max_body_bytes, host=config.host
    )
    # no operator key: /metrics is the service's; here it would only let a key through that reads nothing
    state = ServiceState(config=config, memory=memory, keys=keys, metrics=Metrics())
    app.add_middleware(AuthenticationMiddleware, backend=BearerAuthBackend(_TenantKeys(keys)))
    app.add_middleware(Guard, state=state, routes=[r for r in app.routes if hasattr(r, "path")])
    return app


def serve(config: McpConfig) -> None:
    """Run the server on the config's transport until its client goes (stdio) or it is stopped (HTTP)."""
    from dimmem.runtime.stores import redacted
    from serve.server import serve as serve_http

    memory = Memory.from_config(
        config.memory_config, store=config.runtime_store(), extractor=config.extractor()
    )
    try:
        memory.embedder.encode(["warm-up"])  # the first search does not wait for the model to load
        if config.transport == "stdio":
            store = redacted(memory.config.store_url())
            print(f"dimmem serve mcp: stdio, user {config.user!r}, store {store}", file=sys.stderr)
            build_server(config, memory).run("stdio")
        else:
            serve_http(http_app(config, memory), config)
    finally:
        memory.close()
