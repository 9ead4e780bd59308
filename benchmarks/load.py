"""Load benchmark of the HTTP memory service on loopback: concurrent clients, bounded in count and time.

    python -m benchmarks.load --deployments sqlite:1,postgres:1,postgres:2 --clients 1,4,16 --seconds 20
    python -m benchmarks.load --served runs/demo/export-tiny --clients 1,4 --seconds 30

For each deployment (`STORE:WORKERS`: SQLite in one process, or Postgres with N worker processes on an
embedded server, fsync on, connected as the runtime's login role) starts `dimmem serve api` over a fresh
store, loads one conversation per user, then for each client count runs three phases of `--seconds`
each: search (questions about them), add, and search with one client while the others add; it reports
requests/s and latency percentiles side by side. A deployment with several workers then runs one more
add phase in which one worker is killed with SIGKILL a third of the way in: it counts the requests
that failed and checks that every acknowledged add can be read back.

By default the rule extractor (every user turn a record) stands in for the model, so add measures the
service, store, embedder and update path. With `--served EXPORT` the export is served by vLLM and the
memory service extracts through it (configs/memory/served-tiny.yaml); the conversations and questions
are then toy ones, as the tiny model learned, and each add is a new 12-turn toy chat (one window).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import httpx2
import numpy as np
import yaml

from devtools.serve_demo import toy_messages
from dimmem.contract.loaders import conversation_messages, load_conversations
from dimmem.launch import Service, free_port
from dimmem.paths import CONFIG_DIR, shared_data, write_json
from serve.vllm import vllm_service

KEY = "bench-key"


def service(workdir: Path, memory_config: Path, store: str, workers: int) -> Service:
    """`dimmem serve api` on a free port over `store` with `workers` processes."""
    port = free_port()
    config = workdir / f"serve-{port}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "memory_config": str(memory_config),
                "store": store,
                "tenants": [{"name": "bench", "api_key_env": "DIMMEM_BENCH_KEY"}],
                "port": port,
                "workers": workers,
                "max_body_bytes": 10_000_000,
                "max_messages": 10_000,
            }
        )
    )
    return Service(
        [sys.executable, "-m", "serve", "api", "--config", str(config)],
        f"http://127.0.0.1:{port}/readyz",
        workdir / f"api-{port}.log",
        env={"DIMMEM_BENCH_KEY": KEY},
        startup_timeout=300,
        name="memory service",
    )


@contextmanager
def stores(deployments: list[tuple[str, int]], workdir: Path) -> Iterator[list[str]]:
    """A fresh store URL per deployment: a SQLite file, or a database on one embedded Postgres."""
    server = None
    if any(kind == "postgres" for kind, _ in deployments):
        from dimmem.runtime.stores import open_store
        from dimmem.runtime.stores.embedded import RUNTIME_LOGIN, start_embedded

        server = start_embedded(workdir / "pg")
    try:
        urls = []
        for i, (kind, _) in enumerate(deployments):
            if kind == "sqlite":
                urls.append(str(workdir / f"m{i}.sqlite"))
                continue
            owner = server.database(f"load_{i}", fresh=True)
            open_store(owner).close()  # migrates, as the owner
            urls.append(server.login_role(RUNTIME_LOGIN, owner))
        yield urls
    finally:
        if server is not None:
            server.stop()


@contextmanager
def extractor(workdir: Path, export: str | None) -> Iterator[Path]:
    """The memory config to serve: the rule extractor, or `export` on vLLM behind served-tiny.yaml."""
    if export is None:
        yield CONFIG_DIR / "memory" / "default.yaml"
        return
    port = free_port()
    with vllm_service(workdir / "vllm.log", port=port, model=export):
        config = yaml.safe_load((CONFIG_DIR / "memory" / "served-tiny.yaml").read_text())
        config["model"]["base_url"] = f"http://127.0.0.1:{port}/v1"
        config["windows"]["tokenizer"] = export
        (workdir / "memory.yaml").write_text(yaml.safe_dump(config))
        yield workdir / "memory.yaml"


async def phase(url: str, clients: int, seconds: float, make_request, answered=None) -> dict:
    """`clients` loops sending requests until the time is up; latency of each, errors counted (an
    error status, or a connection that broke); `answered(request, response)` sees each answer."""
    latencies, errors = [], 0
    stop = time.perf_counter() + seconds

    async def client(i: int, http: httpx2.AsyncClient):
        nonlocal errors
        n = 0
        while time.perf_counter() < stop:
            method, path, body = make_request(i, n)
            start = time.perf_counter()
            n += 1
            try:
                response = await http.request(method, path, json=body)
            except httpx2.TransportError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - start)
            errors += response.status_code >= 400
            if answered is not None:
                answered(body, response)

    async with httpx2.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    ) as http:
        began = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        wall = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors,
        "requests_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p95_ms": round(float(np.percentile(ms, 95)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
    }


async def add_with_a_worker_killed(url: str, server: Service, clients: int, seconds: float, add) -> dict:
    """`clients` adders for `seconds`; one worker gets SIGKILL a third of the way in. Then every add
    that was acknowledged is read back: `lost` counts those that cannot be."""
    acknowledged: list[tuple[str, str]] = []

    def keep(body, response):
        if response.status_code == 200:
            acknowledged.extend((body["user_id"], e["id"]) for e in response.json()["events"])

    async def kill():
        await asyncio.sleep(seconds / 3)
        os.kill(server.workers()[0].pid, signal.SIGKILL)

    row, _ = await asyncio.gather(phase(url, clients, seconds, add, keep), kill())
    async with httpx2.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    ) as http:
        lost = 0
        for user, record_id in acknowledged:
            response = await http.get(f"/v1/memories/{quote(record_id, safe='')}", params={"user_id": user})
            lost += response.status_code != 200
    return {**row, "acknowledged": len(acknowledged), "lost": lost, "workers_after": len(server.workers())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--deployments",
        default="sqlite:1",
        help="comma-separated STORE:WORKERS, STORE sqlite or postgres (embedded), run one after another",
    )
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--users", type=int, default=2, help="conversations loaded, one user each")
    parser.add_argument("--locomo", default=str(shared_data("locomo/locomo10.json")))
    parser.add_argument(
        "--served", metavar="EXPORT", help="extract through this merged export served by vLLM"
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    deployments = []
    for item in args.deployments.split(","):
        kind, _, workers = item.partition(":")
        if kind not in ("sqlite", "postgres") or not workers.isdigit() or int(workers) < 1:
            parser.error(f"--deployments: {item!r} is not STORE:WORKERS (sqlite:1, postgres:2, ...)")
        if kind == "sqlite" and int(workers) > 1:
            parser.error("--deployments: several workers need a store they can share (postgres)")
        deployments.append((kind, int(workers)))
    clients_list = [int(c) for c in args.clients.split(",")]

    if (
        args.served
    ):  # toy conversations, the kind the tiny extractor learned from, and the toy world's questions
        chats = {f"toy-{i}": toy_messages(i) for i in range(5_000, 5_000 + args.users)}
        preload = {user: messages for user, (messages, _) in chats.items()}
        questions = [(user, q["question"]) for user, (_, queries) in chats.items() for q in queries]
    else:
        conversations = load_conversations("locomo", args.locomo)[: args.users]
        preload = {c.id: conversation_messages(c) for c in conversations}
        questions = [(c.id, qa["question"]) for c in conversations for qa in c.metadata.get("qa", [])]

    def search(i, n):
        user, question = questions[(i * 7919 + n) % len(questions)]
        return "POST", "/v1/search", {"user_id": user, "query": question, "k": 10}

    notes = itertools.count()  # every add says something new, so each one stores a record

    def add(i, n):
        n = next(notes)
        if args.served:  # a new toy chat each time: one window for the served extractor
            return (
                "POST",
                "/v1/memories",
                {"user_id": f"writer-{i}", "messages": toy_messages(10_000 + 1_000 * i + n)[0][:12]},
            )
        return (
            "POST",
            "/v1/memories",
            {
                "user_id": f"writer-{i}",
                "messages": [
                    {
                        "role": "user",
                        "content": f"Note {n}: I bought {n % 7 + 1} plants for the balcony today.",
                        "timestamp": "2024-05-01",
                    }
                ],
            },
        )

    async def search_while_adding(url: str, clients: int) -> dict:
        searched, _ = await asyncio.gather(
            phase(url, 1, args.seconds, search), phase(url, clients, args.seconds, add)
        )
        return {**searched, "clients": clients}

    def measure(url: str, server: Service, workers: int) -> Iterator[tuple[str, dict]]:
        for clients in clients_list:
            yield "search", asyncio.run(phase(url, clients, args.seconds, search))
            yield "add", asyncio.run(phase(url, clients, args.seconds, add))
            yield "search while adding", asyncio.run(search_while_adding(url, clients))
        if workers > 1:
            killed = add_with_a_worker_killed(url, server, max(clients_list), args.seconds, add)
            yield "add, one worker SIGKILLed", asyncio.run(killed)

    rows = []
    with (
        tempfile.TemporaryDirectory() as workdir,
        extractor(Path(workdir), args.served) as memory_config,
        stores(deployments, Path(workdir)) as urls,
    ):
        for (kind, workers), store in zip(deployments, urls):
            deployment = f"{kind}, {workers} worker{'s' * (workers > 1)}"
            with service(Path(workdir), memory_config, store, workers) as server:
                url = server.health_url.removesuffix("/readyz")
                with httpx2.Client(
                    base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=600
                ) as http:
                    for user, messages in preload.items():  # one conversation per user
                        http.post(
                            "/v1/memories", json={"user_id": user, "messages": messages}
                        ).raise_for_status()
                for name, measured in measure(url, server, workers):
                    row = {"deployment": deployment, "operation": name, "extractor": args.served or "rules"}
                    rows.append({**row, **measured})
                    print(json.dumps(rows[-1]), flush=True)
    print(
        "| deployment | operation | clients | requests/s | p50 ms | p95 ms | p99 ms | errors |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for r in rows:  # "search while adding": one searcher's figures, `clients` adding alongside
        print(
            f"| {r['deployment']} | {r['operation']} | {r['clients']} | {r['requests_per_s']} | "
            f"{r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['errors']} |"
        )
    for r in rows:
        if "lost" in r:
            print(
                f"{r['deployment']}, one worker SIGKILLed during adds: {r['acknowledged']} records "
                f"acknowledged, {r['lost']} lost, {r['errors']} requests failed, "
                f"{r['workers_after']} workers serving after"
            )
    if args.out:
        write_json(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
