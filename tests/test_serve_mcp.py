"""The MCP server (`dimmem serve mcp`) through the `mcp` SDK's own clients: in process (the tools'
schemas, the search filters, the record lifecycle, one-line errors, unknown arguments, answers over
`max_result_bytes`), and as a subprocess over stdio (one local user, its default store, lines that are
not JSON-RPC) and over streamable HTTP with two tenants (a wrong key or two keys refused, no hit across
tenants, no session across tenants, an answer the SDK's client could not take refused by name). Every
refusal must be a tool error of one line, and the server must keep serving."""

import json
import os
import random
import subprocess
import sys
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
import yaml
from mcp.client import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from dimmem.launch import Service, free_port
from dimmem.runtime.memory import Memory
from serve.config import McpConfig
from serve.mcp import build_server

TOOLS = {
    "add_memories",
    "search_memories",
    "get_memory",
    "list_memories",
    "update_memory",
    "delete_memory",
    "restore_memory",
    "memory_history",
}
CHAT = [
    {
        "role": "user",
        "name": "Ann",
        "content": "I adopted a beagle called Biscuit.",
        "timestamp": "2024-03-04",
    },
    {"role": "assistant", "content": "Puppy classes at Paws Academy are great."},
    {"role": "user", "name": "Ann", "content": "We hiked up Eagle Peak with Sam on Saturday."},
]
OLDER = [{"role": "user", "name": "Sam", "content": "My beagle Rex turned ten.", "timestamp": "2023-07-01"}]
KEYS = {"DIMMEM_TEST_MCP_A": "key-a-0123456789abcdef", "DIMMEM_TEST_MCP_B": "key-b-0123456789abcdef"}
LIMIT_S = 90  # a scenario that hangs fails, and its server is stopped on the way out
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}
JSON_AND_SSE = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def scenario(body) -> None:
    async def bounded():
        with anyio.fail_after(LIMIT_S):
            await body()

    anyio.run(bounded)


def refused(result, *expected: str) -> None:
    """A tool error of one line, no traceback, no huge value repeated, naming what is expected."""
    assert result.is_error, result
    text = result.content[0].text
    assert "\n" not in text and "Traceback" not in text and len(text) < 600, text
    for part in expected:
        assert part in text, text


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def hits(result) -> list[str]:
    assert not result.is_error, result.content
    return [h["record"]["content"] for h in result.structured_content["hits"]]


@pytest.fixture
def memory(tmp_path, embedder):
    memory = Memory({"store": str(tmp_path / "m.sqlite")}, embedder=embedder)
    yield memory
    memory.close()


def test_tools_in_process(memory):
    """Typed schemas both ways; search filters (type, time, location, speaker); update, delete, restore,
    history; the profile resource; bad ids and users, and a store that does not answer, as one line."""
    server = build_server(McpConfig(max_k=20, user="ann"), memory)

    async def body():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            assert all(t.output_schema for t in tools.values())  # the client checks every result by it
            search = tools["search_memories"].input_schema
            assert search["required"] == ["query"]
            assert {"type", "time", "location", "speaker", "k"} <= set(search["properties"])
            assert tools["search_memories"].annotations.read_only_hint
            assert tools["delete_memory"].annotations.destructive_hint

            added = await client.call_tool("add_memories", {"messages": CHAT})
            assert len(added.structured_content["events"]) == 2  # the rule extractor: one per user turn
            await client.call_tool("add_memories", {"messages": OLDER})
            beagles = hits(await client.call_tool("search_memories", {"query": "beagle"}))
            assert len(beagles) == 2 and not any("Eagle" in h for h in beagles)  # the hike matches nothing
            march = await client.call_tool("search_memories", {"query": "beagle", "time": "2024-03"})
            assert hits(march)[0] == "Ann: I adopted a beagle called Biscuit."
            assert "Sam: My beagle Rex turned ten." not in hits(march)
            sam = await client.call_tool("search_memories", {"query": "beagle", "speaker": "sam"})
            assert hits(sam) == ["Sam: My beagle Rex turned ten."]

            hike = next(
                h["record"] for h in march.structured_content["hits"] if "Eagle" in h["record"]["content"]
            )
            assert hike["source_turns"] and hike["user_id"] == "ann"
            changes = {"location": "Eagle Peak", "type": "fact"}
            updated = await client.call_tool("update_memory", {"memory_id": hike["id"], "changes": changes})
            assert updated.structured_content["version"] == 2
            place = {"query": "where did we hike", "location": "eagle peak", "type": "fact"}
            assert hits(await client.call_tool("search_memories", place)) == [hike["content"]]
            dog = next(
                h["record"] for h in march.structured_content["hits"] if "Biscuit" in h["record"]["content"]
            )
            await client.call_tool("update_memory", {"memory_id": dog["id"], "changes": {"type": "profile"}})
            profile = await client.read_resource("memory://ann/profile")
            assert "Biscuit" in profile.contents[0].text and "Eagle" not in profile.contents[0].text

            deleted = await client.call_tool("delete_memory", {"memory_id": hike["id"]})
            assert deleted.structured_content["status"] == "deleted"
            assert hike["content"] not in hits(await client.call_tool("search_memories", place))
            refused(await client.call_tool("delete_memory", {"memory_id": hike["id"]}), "is deleted")
            await client.call_tool("restore_memory", {"memory_id": hike["id"]})
            history = await client.call_tool("memory_history", {"memory_id": hike["id"]})
            actions = [v["action"] for v in history.structured_content["versions"]]
            assert actions[1:] == ["UPDATE", "DELETE", "RESTORE"]

            refused(await client.call_tool("get_memory", {"memory_id": "c-x/w0000#m1"}), "no memory", "'ann'")
            refused(
                await client.call_tool("get_memory", {"memory_id": "x", "user_id": "bob"}), "'bob' has no"
            )
            refused(await client.call_tool("search_memories", {"query": "x", "k": 21}), "at most 20")
            refused(await client.call_tool("search_memories", {"query": "x", "time": "soon"}), "'soon'")
            refused(await client.call_tool("list_memories", {"cursor": "junk"}), "not a cursor")
            refused(
                await client.call_tool("update_memory", {"memory_id": dog["id"], "changes": {}}), "no field"
            )
            memory.store.close()
            refused(await client.call_tool("search_memories", {"query": "beagle"}), "store does not answer")

    scenario(body)


def test_unknown_arguments_are_tool_errors(memory):
    """An argument no tool parameter takes (a typo: `limt`) was dropped, and the call ran with the
    default; it is a tool error naming each unknown argument and the ones the tool takes."""
    server = build_server(McpConfig(user="ann"), memory)

    async def body():
        async with Client(server) as client:
            await client.call_tool("add_memories", {"messages": CHAT})
            refused(await client.call_tool("list_memories", {"limt": 1}), "unknown arguments: limt", "limit")
            typos = {"query": "beagle", "kk": 1, "speakr": "Ann", "z" * 5_000: 1}
            refused(await client.call_tool("search_memories", typos), "kk", "speakr", "zzz")
            listed = await client.call_tool("list_memories", {"limit": 1})
            assert len(listed.structured_content["memories"]) == 1

    scenario(body)


def test_answers_over_max_result_bytes_are_refused(memory):
    """An answer larger than `max_result_bytes`, as it goes on the wire, is a tool error naming the limit
    (the profile resource an error too); a smaller one is delivered."""
    server = build_server(McpConfig(user="ann", max_result_bytes=10_000), memory)

    async def body():
        async with Client(server) as client:
            added = await client.call_tool("add_memories", {"messages": long_messages(0, words=400)})
            ids = [e["id"] for e in added.structured_content["events"]]
            for record_id in ids:
                await client.call_tool(
                    "update_memory", {"memory_id": record_id, "changes": {"type": "profile"}}
                )
            assert not (await client.call_tool("get_memory", {"memory_id": ids[0]})).is_error
            refused(await client.call_tool("list_memories", {}), "max_result_bytes (10000)", "limit")
            with pytest.raises(MCPError, match="max_result_bytes"):
                await client.read_resource("memory://ann/profile")

    scenario(body)


@pytest.mark.integration
def test_stdio_answers_an_unreadable_line(tmp_path):
    """`dimmem serve mcp` over stdio dropped a line that is not JSON without a word; JSON-RPC answers it
    with a parse error (-32700, id null), and JSON that is no JSON-RPC message with an invalid request
    (-32600). The server goes on: the request after them is answered."""
    lines = ["{not json", "[1, 2]", json.dumps(INITIALIZE)]
    result = subprocess.run(
        [sys.executable, "-m", "dimmem", "serve", "mcp", "--user", "ann"],
        input="".join(line + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        cwd=tmp_path,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")},
    )
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["id"] for a in answers] == [None, None, 1], result.stdout
    assert [a["error"]["code"] for a in answers[:2]] == [-32700, -32600]
    assert answers[2]["result"]["serverInfo"]["name"] == "dimmem"
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_config():
    """HTTP needs tenants; one process; without a memory config the store is the user's data file."""
    with pytest.raises(ValueError, match="needs tenants"):
        McpConfig(transport="http")
    with pytest.raises(ValueError, match="one process"):
        McpConfig(workers=2)
    assert McpConfig().runtime_store().endswith("dimmem/memory.sqlite")
    assert McpConfig(memory_config="configs/memory/default.yaml").runtime_store() is None


@asynccontextmanager
async def connected(streams):
    async with ClientSession(*streams) as session:
        await session.initialize()
        yield session


@pytest.mark.integration
def test_stdio_subprocess(tmp_path):
    """`dimmem serve mcp` started by the SDK's stdio client from another directory: list, add, find by
    a time filter, delete, gone; bad arguments (missing, wrong types, huge) are tool errors and the
    server keeps serving. Its store is the user's data file."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "dimmem", "serve", "mcp", "--user", "ann", "--set", "max_messages=5"],
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")},  # the SDK passes few by default
        cwd=tmp_path,
    )
    log = tmp_path / "stderr.log"

    async def body():
        with log.open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as streams, connected(streams) as session:
                assert {t.name for t in (await session.list_tools()).tools} == TOOLS
                await session.call_tool("add_memories", {"messages": CHAT})
                march = await session.call_tool("search_memories", {"query": "beagle", "time": "2024-03"})
                assert hits(march)[0] == "Ann: I adopted a beagle called Biscuit."
                assert (
                    hits(await session.call_tool("search_memories", {"query": "beagle", "time": "2023"}))
                    == []
                )
                found = march.structured_content["hits"][0]["record"]
                await session.call_tool("delete_memory", {"memory_id": found["id"]})
                assert found["content"] not in hits(
                    await session.call_tool("search_memories", {"query": "beagle"})
                )
                gone = await session.call_tool("get_memory", {"memory_id": found["id"]})
                assert gone.structured_content["status"] == "deleted"

                refused(await session.call_tool("add_memories", {}), "messages: Field required")
                refused(await session.call_tool("search_memories", {"query": "beagle", "k": "many"}), "k:")
                refused(await session.call_tool("search_memories", {"query": ["beagle"]}), "query:")
                refused(await session.call_tool("search_memories", {"query": "x" * 300_000}), "at most 2000")
                huge = [{"role": "user", "content": "y" * 200_000}]
                refused(await session.call_tool("add_memories", {"messages": huge}), "at most 100000")
                refused(await session.call_tool("add_memories", {"messages": CHAT * 2}), "at most 5")
                refused(await session.call_tool("get_memory", {"memory_id": "z" * 10_000}), "memory_id")
                refused(await session.call_tool("no_such_tool", {}), "no_such_tool")
                assert len(hits(await session.call_tool("search_memories", {"query": "Eagle Peak"}))) == 1

    scenario(body)
    assert (tmp_path / "data" / "dimmem" / "memory.sqlite").is_file()
    assert "Traceback" not in log.read_text()


MAX_BODY = 300_000  # the HTTP server's: room for the long records below, a body over it 413


@pytest.fixture(scope="module")
def http_url(tmp_path_factory):
    """`dimmem serve mcp --transport http` with tenants a and b over one SQLite file: its base URL."""
    folder = tmp_path_factory.mktemp("mcp-http")
    port = free_port()
    config = folder / "mcp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "transport": "http",
                "store": str(folder / "shared.sqlite"),
                "tenants": [
                    {"name": "a", "api_key_env": "DIMMEM_TEST_MCP_A"},
                    {"name": "b", "api_key_env": "DIMMEM_TEST_MCP_B"},
                ],
                "port": port,
                "max_body_bytes": MAX_BODY,
            }
        )
    )
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "dimmem", "serve", "mcp", "--config", str(config)]
    with Service(command, f"{url}/healthz", folder / "mcp.log", env=KEYS, startup_timeout=120):
        yield url


@asynccontextmanager
async def tenant(url: str, key: str, **http_options):
    """A session of the SDK's client over HTTP with `key` as its bearer key."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60, **http_options) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as streams,
        connected(streams) as session,
    ):
        yield session


@pytest.mark.integration
def test_http_two_tenants(http_url):
    """`dimmem serve mcp --transport http` with two tenants: no key or a wrong one is 401 before the MCP
    transport reads the body (the SDK's client fails), an oversized body 413; a tenant finds its own
    memory by a time filter and deletes it; the other tenant, same user id, sees nothing of it."""

    async def body():
        async with httpx2.AsyncClient(timeout=30) as http:
            for headers in ({}, {"Authorization": "Bearer key-c-0123456789abcdef"}):
                status = (await http.post(f"{http_url}/mcp", headers=headers, content=b"x" * 10)).status_code
                assert status == 401
            big = {"Authorization": f"Bearer {KEYS['DIMMEM_TEST_MCP_A']}", "Content-Type": "application/json"}
            over = b"x" * (MAX_BODY + 10_000)
            assert (await http.post(f"{http_url}/mcp", headers=big, content=over)).status_code == 413
        with pytest.raises(Exception) as failed:
            async with tenant(http_url, "key-c-0123456789abcdef"):
                pass
        assert any(isinstance(leaf, MCPError) for leaf in leaves(failed.value))

        async with tenant(http_url, KEYS["DIMMEM_TEST_MCP_A"]) as a:
            assert {t.name for t in (await a.list_tools()).tools} == TOOLS
            await a.call_tool("add_memories", {"user_id": "ann", "messages": CHAT})
            march = {"user_id": "ann", "query": "beagle", "time": "2024-03"}
            found = (await a.call_tool("search_memories", march)).structured_content["hits"][0]["record"]
            assert found["user_id"] == "ann" and "Biscuit" in found["content"]
        theirs = {"user_id": "ann", "memory_id": found["id"]}
        async with tenant(http_url, KEYS["DIMMEM_TEST_MCP_B"]) as b:
            assert hits(await b.call_tool("search_memories", {"user_id": "ann", "query": "beagle"})) == []
            refused(await b.call_tool("get_memory", theirs), "'ann' has no memories")
            refused(await b.call_tool("delete_memory", theirs), "'ann' has no memories")
            listed = await b.call_tool("list_memories", {"user_id": "ann"})
            assert listed.structured_content["memories"] == []
            refused(await b.call_tool("search_memories", {"user_id": "a/ann", "query": "beagle"}), "user_id")
        async with tenant(http_url, KEYS["DIMMEM_TEST_MCP_A"]) as a:
            await a.call_tool("delete_memory", theirs)
            after = hits(await a.call_tool("search_memories", {"user_id": "ann", "query": "beagle"}))
            assert found["content"] not in after

    scenario(body)


@pytest.mark.integration
def test_http_two_authorization_headers_are_400(http_url):
    """The guard read one Authorization header and the tools the other, so a request carrying tenant b's
    key beside a's ran as either, by their order. More than one is refused before the transport."""
    a, b = KEYS["DIMMEM_TEST_MCP_A"], KEYS["DIMMEM_TEST_MCP_B"]

    async def body():
        async with httpx2.AsyncClient(timeout=30) as http:
            for first, second in ((b, a), (a, b), ("key-c-0123456789abcdef", a)):
                headers = [*JSON_AND_SSE.items(), ("Authorization", f"Bearer {first}")]
                headers.append(("Authorization", f"Bearer {second}"))
                answer = await http.post(f"{http_url}/mcp", headers=headers, json=INITIALIZE)
                assert answer.status_code == 400, (first, second, answer.text)
            one = {**JSON_AND_SSE, "Authorization": f"Bearer {a}"}
            assert (await http.post(f"{http_url}/mcp", headers=one, json=INITIALIZE)).status_code == 200

    scenario(body)


@pytest.mark.integration
def test_http_a_session_belongs_to_its_tenant(http_url):
    """Tenant b, with its own valid key, was served on the session tenant a opened: every method on it
    (a request, the event stream, ending it) with another tenant's key is now answered as if the session
    did not exist, and a's session goes on."""
    opened: set[str] = set()

    async def note_session(response):
        if session_id := response.headers.get("mcp-session-id"):
            opened.add(session_id)

    async def body():
        hooks = {"event_hooks": {"response": [note_session]}}
        async with tenant(http_url, KEYS["DIMMEM_TEST_MCP_A"], **hooks) as a:
            (session_id,) = opened
            b = {**JSON_AND_SSE, "Authorization": f"Bearer {KEYS['DIMMEM_TEST_MCP_B']}"}
            b["mcp-session-id"] = session_id
            listing = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}
            async with httpx2.AsyncClient(timeout=30) as http:
                assert (await http.post(f"{http_url}/mcp", headers=b, json=listing)).status_code == 404
                assert (await http.get(f"{http_url}/mcp", headers=b)).status_code == 404
                assert (await http.delete(f"{http_url}/mcp", headers=b)).status_code == 404
            assert {t.name for t in (await a.list_tools()).tools} == TOOLS

    scenario(body)


def long_messages(first: int, count: int = 4, words: int = 5_000) -> list[dict]:
    """Messages of about 8 characters a word, each of its own speaker (so none merges with another)."""
    draw = random.Random(first)
    return [
        {
            "role": "user",
            "name": f"Person{n}",
            "content": "My beagle notes: " + " ".join(f"w{draw.randrange(10**6)}" for _ in range(words)),
            "timestamp": "2024-03-04",
        }
        for n in range(first, first + count)
    ]


@pytest.mark.integration
def test_http_answers_over_the_limit_are_tool_errors(http_url):
    """A search answer over 1 MiB went as one server-sent event, which the SDK's client refuses: the call
    failed in the transport. Over `max_result_bytes` it is a tool error naming the limit, the session
    goes on, and a smaller answer is delivered."""

    async def body():
        async with tenant(http_url, KEYS["DIMMEM_TEST_MCP_A"]) as a:
            for first in range(0, 16, 4):  # 16 memories of about 40 kB, four a call: under the body limit
                added = await a.call_tool(
                    "add_memories", {"user_id": "big", "messages": long_messages(first)}
                )
                assert not added.is_error, added.content
            all_of_them = {"user_id": "big", "query": "beagle notes", "k": 16}
            refused(await a.call_tool("search_memories", all_of_them), "max_result_bytes", "1000000", "k")
            refused(await a.call_tool("list_memories", {"user_id": "big"}), "max_result_bytes")
            assert len(hits(await a.call_tool("search_memories", {**all_of_them, "k": 4}))) == 4
            page = await a.call_tool("list_memories", {"user_id": "big", "limit": 4})
            assert len(page.structured_content["memories"]) == 4

    scenario(body)
