"""The MCP server (`dimmem serve mcp`) through the `mcp` SDK's own clients: in process (the tools'
schemas, the search filters, the record lifecycle, one-line errors), and as a subprocess over stdio
(one local user, its default store) and over streamable HTTP with two tenants (a wrong key refused, no
hit across tenants). Every refusal must be a tool error of one line, and the server must keep serving."""

import os
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
            assert len(hits(await client.call_tool("search_memories", {"query": "beagle"}))) == 3
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


@pytest.mark.integration
def test_http_two_tenants(tmp_path):
    """`dimmem serve mcp --transport http` with two tenants: no key or a wrong one is 401 before the MCP
    transport reads the body (the SDK's client fails), an oversized body 413; a tenant finds its own
    memory by a time filter and deletes it; the other tenant, same user id, sees nothing of it."""
    port = free_port()
    config = tmp_path / "mcp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "transport": "http",
                "store": str(tmp_path / "shared.sqlite"),
                "tenants": [
                    {"name": "a", "api_key_env": "DIMMEM_TEST_MCP_A"},
                    {"name": "b", "api_key_env": "DIMMEM_TEST_MCP_B"},
                ],
                "port": port,
                "max_body_bytes": 50_000,
            }
        )
    )
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "dimmem", "serve", "mcp", "--config", str(config)]

    @asynccontextmanager
    async def tenant(key: str):
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http,
            streamable_http_client(f"{url}/mcp", http_client=http) as streams,
            connected(streams) as session,
        ):
            yield session

    async def body():
        async with httpx2.AsyncClient(timeout=30) as http:
            for headers in ({}, {"Authorization": "Bearer key-c-0123456789abcdef"}):
                assert (await http.post(f"{url}/mcp", headers=headers, content=b"x" * 10)).status_code == 401
            big = {"Authorization": f"Bearer {KEYS['DIMMEM_TEST_MCP_A']}", "Content-Type": "application/json"}
            assert (await http.post(f"{url}/mcp", headers=big, content=b"x" * 60_000)).status_code == 413
        with pytest.raises(Exception) as failed:
            async with tenant("key-c-0123456789abcdef"):
                pass
        assert any(isinstance(leaf, MCPError) for leaf in leaves(failed.value))

        async with tenant(KEYS["DIMMEM_TEST_MCP_A"]) as a:
            assert {t.name for t in (await a.list_tools()).tools} == TOOLS
            await a.call_tool("add_memories", {"user_id": "ann", "messages": CHAT})
            march = {"user_id": "ann", "query": "beagle", "time": "2024-03"}
            found = (await a.call_tool("search_memories", march)).structured_content["hits"][0]["record"]
            assert found["user_id"] == "ann" and "Biscuit" in found["content"]
        theirs = {"user_id": "ann", "memory_id": found["id"]}
        async with tenant(KEYS["DIMMEM_TEST_MCP_B"]) as b:
            assert hits(await b.call_tool("search_memories", {"user_id": "ann", "query": "beagle"})) == []
            refused(await b.call_tool("get_memory", theirs), "'ann' has no memories")
            refused(await b.call_tool("delete_memory", theirs), "'ann' has no memories")
            listed = await b.call_tool("list_memories", {"user_id": "ann"})
            assert listed.structured_content["memories"] == []
            refused(await b.call_tool("search_memories", {"user_id": "a/ann", "query": "beagle"}), "user_id")
        async with tenant(KEYS["DIMMEM_TEST_MCP_A"]) as a:
            await a.call_tool("delete_memory", theirs)
            after = hits(await a.call_tool("search_memories", {"user_id": "ann", "query": "beagle"}))
            assert found["content"] not in after

    with Service(command, f"{url}/healthz", tmp_path / "mcp.log", env=KEYS, startup_timeout=120):
        scenario(body)
