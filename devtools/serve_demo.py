"""The demo's last step: the exported extractor served by vLLM, the memory service in front of it, and
one new conversation through both.

    python -m devtools.serve_demo --export runs/demo/export-tiny --config configs/serve/demo.yaml \\
        --out runs/demo/serve

Starts `dimmem serve vllm` on the port the memory config's `model.base_url` names and `dimmem serve api`
with a one-off API key, posts a toy conversation the model never saw (POST /v1/memories), asks the
service a question about it (POST /v1/search), prints both, writes OUT/demo.json and stops the servers.
Without .venv-vllm it says how to get it and exits 0: the rest of the demo does not need it.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from dimmem.config import load_config
from dimmem.contract.loaders import conversation_messages
from dimmem.contract.toyworld import generate_dialogue
from dimmem.launch import Service, ServiceError, port_in_use
from dimmem.paths import write_json
from dimmem.runtime.config import MemoryConfig
from serve.config import load_serve_config
from serve.vllm import VLLM_READY, vllm_service

CONVERSATION_INDEX = 5000  # far past the demo dataset's 60 toy conversations: unseen in training


def call(url: str, key: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def toy_messages(index: int) -> tuple[list[dict], list[dict]]:
    """A generated toy conversation as chat messages, and the toy world's questions about it, each with
    the true memory it asks about (query `...#q<n>` is about the n-th record)."""
    dialogue = generate_dialogue(index, seed=0)
    messages = conversation_messages(dialogue.conversation)
    queries = [
        {**q, "truth": dialogue.records[int(q["id"].rsplit("q", 1)[1]) - 1].content}
        for q in dialogue.conversation.metadata["queries"]
    ]
    return messages, queries


def run(export: str, config_path: str, out: Path) -> dict:
    """vLLM and the memory service up, one conversation added and searched, both down again."""
    config = load_serve_config(config_path)
    model_url = urlparse(load_config(MemoryConfig, config.memory_config).model.base_url)
    if model_url.port is None:
        raise ValueError(
            f"{config.memory_config}: model.base_url needs an explicit port for vLLM to listen on"
        )
    for port in (model_url.port, config.port):
        if port_in_use(port):
            raise ValueError(
                f"port {port} is in use: stop what listens there, "
                f"or change {config_path} / {config.memory_config}"
            )
    key = secrets.token_urlsafe(16)
    api_command = [sys.executable, "-m", "serve", "api", "--config", config_path]
    api_url = f"http://{config.host}:{config.port}"
    messages, queries = toy_messages(CONVERSATION_INDEX)
    began = time.monotonic()
    with vllm_service(out / "vllm.log", port=model_url.port, host=model_url.hostname, model=export) as vllm:
        print(
            f"vLLM serves {export} as dimmem-extractor "
            f"({vllm.startup_s:.0f} s to start; log {out / 'vllm.log'})"
        )
        with Service(
            api_command,
            f"{api_url}/healthz",
            out / "api.log",
            env={config.tenants[0].api_key_env: key},
            startup_timeout=120,
            name="memory service",
        ) as api:
            print(f"memory service on {api_url} ({api.startup_s:.0f} s to start; log {out / 'api.log'})")
            t = time.monotonic()
            added = call(f"{api_url}/v1/memories", key, {"user_id": "demo", "messages": messages})
            add_s = time.monotonic() - t
            stored = [e for e in added["events"] if e["action"] != "UNCHANGED"]
            print(
                f"\nPOST /v1/memories: {len(messages)} messages, {added['windows']} windows -> "
                f"{len(added['events'])} memories ({len(stored)} new), "
                f"{len(added['rejected'])} refused by the validator, "
                f"{len(added['failed'])} windows failed, in {add_s:.1f} s"
            )
            searches = []
            for query in queries[:2]:
                found = call(
                    f"{api_url}/v1/search",
                    key,
                    {
                        "user_id": "demo",
                        "query": query["question"],
                        "k": 3,
                        "reference_date": query["reference_date"][:10],
                    },
                )
                searches.append({**query, "hits": found["hits"]})
                print(f"\nPOST /v1/search {query['question']!r}  (truth: {query['truth']})")
                for hit in found["hits"]:
                    record = hit["record"]
                    print(f"  {hit['score']:.3f}  [{record['type']}, {record['time']}] {record['content']}")
    return {
        "export": export,
        "messages": len(messages),
        "add": added,
        "add_s": round(add_s, 2),
        "searches": searches,
        "total_s": round(time.monotonic() - began, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.serve_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--export", required=True, help="a merged export folder (dimmem export --merge)")
    parser.add_argument("--config", required=True, help="the memory service's config (configs/serve/*.yaml)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not VLLM_READY:
        print(
            "serving step skipped: vLLM for CPU is not installed here. "
            "`make serve-cpu` builds it in .venv-vllm "
            "(about 3 minutes, 3.4 GB); then `make demo-serve` runs this step."
        )
        return 0
    try:
        result = run(args.export, args.config, Path(args.out))
    except (
        ServiceError,
        OSError,
        ValueError,
    ) as exc:  # a server that would not start says why in its log tail
        print(f"devtools.serve_demo: {exc}", file=sys.stderr)
        return 1
    write_json(Path(args.out) / "demo.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
