"""`dimmem serve mcp`: the memory runtime as an MCP server (the `mcp` SDK's MCPServer), so any agent that
speaks MCP can keep and recall memories.

    dimmem serve mcp                                    # stdio: one local user, a SQLite file of theirs
    dimmem serve mcp --transport http --config configs/serve/mcp.yaml    # streamable HTTP, tenants

Each tool is a small function (serve/mcp_tools/) over one shared `Memory`, built from the memory config
and store as `dimmem serve api` builds it, so the two can share a store (a Postgres). Arguments and
results are typed (serve/schemas.py's models where they fit), so clients get JSON Schemas for both.
Calls name a user (`user_id`, default: the config's `user`); over HTTP the bearer key names the tenant
and user ids are namespaced by it inside the store as the service does (`serve.deps.scoped`), so no
tenant reaches another's records, `serve.guard` answers a request without a known key (or with two
keys) before the MCP transport reads it (and applies the service's size and time limits), and each
session belongs to the tenant that opened it: another tenant's key on it is answered as if it did not
exist.

Every refusal is a tool error of one line: arguments the schema refuses (each field and the reason,
never the value given), arguments no parameter takes, an unknown record or user, a record whose status
forbids the change, a bad value, a store that does not answer, an answer over `max_result_bytes`.
Anything else is the SDK's generic "Error executing tool <name>", its traceback logged on the server's
stderr only. Over stdio a line that is not a JSON-RPC message gets JSON-RPC's error for it.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from types import MethodType
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.utilities.context_injection import find_context_parameter
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, ToolAnnotations
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse

from dimmem.runtime.memory import Memory
from serve.config import McpConfig
from serve.deps import Metrics, ServiceState
from serve.guard import Guard, caller, clip
from serve.mcp_tools import memories, profile, search
from serve.mcp_tools.state import ToolState, oversized

INSTRUCTIONS = (
    "Long-term memory of the user across conversations. Store what the user tells you that is worth "
    "keeping with add_memories (the conversation's messages, with their timestamps), and call "
    "search_memories before answering anything about the user's past, people, places, preferences or "
    "plans; filter by type, time, location or speaker when the question names one. Memories have ids: "
    "get, update, delete, restore and history take them."
)
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DELETE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
# the tools in the order clients list them, each with what it does to the store
TOOLS = (
    (memories.add_memories, WRITE),
    (search.search_memories, READ),
    (memories.get_memory, READ),
    (memories.list_memories, READ),
    (memories.update_memory, WRITE),
    (memories.delete_memory, DELETE),
    (memories.restore_memory, WRITE),
    (memories.memory_history, READ),
)


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
        if why := oversized(result, self.max_result_bytes):
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
    state = ToolState(config, memory, keys)
    for tool, hints in TOOLS:
        # bound to the state, a tool shows clients its own parameters; its docstring is its description
        server.add_tool(
            MethodType(tool, state), description=inspect.cleandoc(tool.__doc__), annotations=hints
        )
    server.resource(
        "memory://{user_id}/profile",
        name="profile",
        description="a user's active profile memories (lasting traits and preferences), as a memory page",
        mime_type="application/json",
    )(MethodType(profile.profile, state))
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

    memory = Memory.from_config(config.memory_config, config.memory_overrides(), store=config.runtime_store())
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
