"""Load benchmark of the HTTP memory service on loopback: concurrent clients, bounded in count and time.

    python -m serve.bench_load --clients 1,4,16 --seconds 20

Starts `dimmem serve api` in its own process over a fresh store (rule extractor: every user turn is a
record, so add measures the service, store, embedder and update path, not a model), loads one LoCoMo
conversation per user, then for each client count runs a search phase (LoCoMo questions) and an add
phase (short chats), each for `--seconds`, and reports requests/s and latency percentiles side by side.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import numpy as np
import yaml

from dimmem.loaders import load_conversations
from dimmem.paths import CONFIG_DIR, shared_data, write_json

KEY = "bench-key"


def start_server(workdir: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = workdir / "serve.yaml"
    config.write_text(yaml.safe_dump({"memory_config": str(CONFIG_DIR / "memory" / "default.yaml"), "store": str(workdir / "m.sqlite"),
                                      "tenants": [{"name": "bench", "api_key_env": "DIMMEM_BENCH_KEY"}], "port": port,
                                      "max_body_bytes": 10_000_000, "max_messages": 10_000}))
    proc = subprocess.Popen([sys.executable, "-m", "serve", "api", "--config", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "DIMMEM_BENCH_KEY": KEY})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx2.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("memory service did not start")


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

    async with httpx2.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as http:
        began = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        wall = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return {"clients": clients, "requests": len(latencies), "errors": errors, "requests_per_s": round(len(latencies) / wall, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 1), "p95_ms": round(float(np.percentile(ms, 95)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve.bench_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--users", type=int, default=2, help="LoCoMo conversations loaded, one user each")
    parser.add_argument("--locomo", default=str(shared_data("locomo/locomo10.json")))
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    conversations = load_conversations("locomo", args.locomo)[:args.users]
    questions = [(c.id, qa["question"]) for c in conversations for qa in c.metadata.get("qa", [])]
    with tempfile.TemporaryDirectory() as workdir:
        proc, url = start_server(Path(workdir))
        try:
            with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=600) as http:
                for conv in conversations:  # preload: each conversation's turns as one user's memories
                    messages = [{"role": "user", "name": t.speaker, "content": t.text, "timestamp": t.session_time,
                                 "session_id": t.session_id} for t in conv.turns]
                    http.post("/v1/memories", json={"user_id": conv.id, "messages": messages}).raise_for_status()

            def search(i, n):
                user, question = questions[(i * 7919 + n) % len(questions)]
                return "POST", "/v1/search", {"user_id": user, "query": question, "k": 10}

            def add(i, n):
                return "POST", "/v1/memories", {"user_id": f"writer-{i}", "messages": [
                    {"role": "user", "content": f"Note {n}: I bought {n % 7 + 1} plants for the balcony today.",
                     "timestamp": "2024-05-01"}]}

            rows = []
            for clients in (int(c) for c in args.clients.split(",")):
                for name, make in (("search", search), ("add", add)):
                    rows.append({"operation": name, **asyncio.run(phase(url, clients, args.seconds, make))})
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print("| operation | clients | requests/s | p50 ms | p95 ms | p99 ms | errors |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['operation']} | {r['clients']} | {r['requests_per_s']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['errors']} |")
    if args.out:
        write_json(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
