"""Load benchmark of the HTTP memory service on loopback: concurrent clients, bounded in count and time.

    python -m serve.bench_load --clients 1,4,16 --seconds 20
    python -m serve.bench_load --served runs/demo/export-tiny --clients 1,4 --seconds 30

Starts `dimmem serve api` in its own process over a fresh store, loads one conversation per user, then
for each client count runs three phases of `--seconds` each: search (questions about them), add, and
search with one client while the others add; it reports requests/s and latency percentiles side by side.

By default the rule extractor (every user turn a record) stands in for the model, so add measures the
service, store, embedder and update path. With `--served EXPORT` the export is served by vLLM and the
memory service extracts through it (configs/memory/served-tiny.yaml); the conversations and questions
are then toy ones, as the tiny model learned, and each add is a new 12-turn toy chat (one window).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import numpy as np
import yaml

from dimmem.contract.loaders import conversation_messages, load_conversations
from dimmem.launch import Service, free_port
from dimmem.paths import CONFIG_DIR, shared_data, write_json
from serve.demo import toy_messages
from serve.vllm import vllm_service

KEY = "bench-key"


def service(workdir: Path, memory_config: Path) -> Service:
    """`dimmem serve api` on a free port over a fresh store in `workdir`."""
    port = free_port()
    config = workdir / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "memory_config": str(memory_config),
                "store": str(workdir / "m.sqlite"),
                "tenants": [{"name": "bench", "api_key_env": "DIMMEM_BENCH_KEY"}],
                "port": port,
                "max_body_bytes": 10_000_000,
                "max_messages": 10_000,
            }
        )
    )
    return Service(
        [sys.executable, "-m", "serve", "api", "--config", str(config)],
        f"http://127.0.0.1:{port}/healthz",
        workdir / "api.log",
        env={"DIMMEM_BENCH_KEY": KEY},
        startup_timeout=120,
        name="memory service",
    )


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


async def phase(url: str, clients: int, seconds: float, make_request) -> dict:
    """`clients` loops sending requests until the time is up; latency of each, errors counted."""
    latencies, errors = [], 0
    stop = time.perf_counter() + seconds

    async def client(i: int, http: httpx2.AsyncClient):
        nonlocal errors
        n = 0
        while time.perf_counter() < stop:
            method, path, body = make_request(i, n)
            start = time.perf_counter()
            response = await http.request(method, path, json=body)
            latencies.append(time.perf_counter() - start)
            errors += response.status_code >= 400
            n += 1

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve.bench_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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

    def add(i, n):
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

    rows = []
    with (
        tempfile.TemporaryDirectory() as workdir,
        extractor(Path(workdir), args.served) as memory_config,
        service(Path(workdir), memory_config) as server,
    ):
        url = server.health_url.removesuffix("/healthz")
        with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=600) as http:
            for user, messages in preload.items():  # one conversation per user
                http.post("/v1/memories", json={"user_id": user, "messages": messages}).raise_for_status()
        for clients in (int(c) for c in args.clients.split(",")):
            for name, run in (
                ("search", lambda clients=clients: phase(url, clients, args.seconds, search)),
                ("add", lambda clients=clients: phase(url, clients, args.seconds, add)),
                ("search while adding", lambda clients=clients: search_while_adding(url, clients)),
            ):
                rows.append({"operation": name, "extractor": args.served or "rules", **asyncio.run(run())})
                print(json.dumps(rows[-1]), flush=True)
    print(
        "| operation | clients | requests/s | p50 ms | p95 ms | p99 ms | errors |\n"
        "|---|---|---|---|---|---|---|"
    )
    for r in rows:  # "search while adding": one searcher's figures, `clients` adding alongside
        print(
            f"| {r['operation']} | {r['clients']} | {r['requests_per_s']} | "
            f"{r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['errors']} |"
        )
    if args.out:
        write_json(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
