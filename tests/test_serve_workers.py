"""`dimmem serve api --workers N`: worker processes over one store, readiness that asks the store, and a
worker killed with SIGKILL under load while the others keep serving."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from dimmem.launch import Service, free_port
from dimmem.paths import CONFIG_DIR

pytestmark = pytest.mark.integration

KEY = "workers-test-key-tenant-a"


def call(port: int, method: str, path: str, body=None, key: str | None = KEY, timeout: float = 60):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"} if key else {}
    try:
        connection.request(method, path, json.dumps(body).encode() if body is not None else None, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def service(folder: Path, store: str, workers: int) -> Service:
    port = free_port()
    config = folder / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "memory_config": str(CONFIG_DIR / "memory" / "default.yaml"),
                "store": store,
                "tenants": [{"name": "a", "api_key_env": "WORKERS_KEY"}],
                "port": port,
                "workers": workers,
            }
        )
    )
    command = [sys.executable, "-m", "dimmem", "serve", "api", "--config", str(config)]
    running = Service(
        command,
        f"http://127.0.0.1:{port}/readyz",
        folder / "api.log",
        env={"WORKERS_KEY": KEY},
        startup_timeout=240,
        name="memory service",
    )
    running.port = port
    return running


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_two_workers_share_one_store_and_survive_a_killed_worker(tmp_path, store_url):
    with service(tmp_path, store_url, workers=2) as running:
        port = running.port
        assert call(port, "GET", "/readyz", key=None) == (200, {"status": "ready", "detail": None})
        assert wait_for(lambda: len(running.workers()) == 2, 60), "two worker processes"
        acknowledged, errors, stop = {}, [], threading.Event()

        def adder(worker: int) -> None:
            for n in range(10_000):
                if stop.is_set():
                    return
                body = {
                    "user_id": f"u{worker}",
                    "conversation_id": f"c{worker}-{n}",
                    "messages": [
                        {"role": "user", "content": f"Note {n} of writer {worker}: the key is in box {n}."}
                    ],
                }
                try:
                    status, answer = call(port, "POST", "/v1/memories", body)
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(repr(exc))
                    continue
                if status == 200:
                    acknowledged[body["conversation_id"]] = (
                        body["user_id"],
                        [e["id"] for e in answer["events"]],
                    )
                else:
                    errors.append(status)

        with ThreadPoolExecutor(4) as pool:
            writers = [pool.submit(adder, w) for w in range(4)]
            try:
                assert wait_for(lambda: len(acknowledged) >= 8, 120)
                victim = running.workers()[0]
                os.kill(victim.pid, signal.SIGKILL)
                killed_at = len(acknowledged)
                assert wait_for(lambda: len(acknowledged) >= killed_at + 8, 120), "the other worker serves on"
                assert wait_for(lambda: len(running.workers()) == 2, 120), "the dead worker is replaced"
            finally:
                stop.set()
            for writer in writers:
                writer.result(timeout=120)
        # only requests the killed worker had in flight may fail; nothing acknowledged is lost
        assert len(errors) <= 4, errors
        for user, ids in acknowledged.values():
            for record_id in ids:
                status, record = call(
                    port, "GET", f"/v1/memories/{record_id.replace('#', '%23')}?user_id={user}"
                )
                assert status == 200, (record_id, status, record)  # active, or merged by a later add
        status, found = call(
            port, "POST", "/v1/search", {"user_id": "u0", "query": "where is the key", "k": 3}
        )
        assert status == 200 and found["hits"]


def test_readiness_says_when_the_store_does_not_answer(tmp_path):
    from fastapi.testclient import TestClient

    from dimmem.runtime.extractors import TurnExtractor
    from dimmem.runtime.memory import Memory
    from serve.app import build_app
    from serve.config import ServeConfig, Tenant

    os.environ["WORKERS_KEY"] = KEY
    memory = Memory({"store": str(tmp_path / "m.sqlite")}, extractor=TurnExtractor())
    config = ServeConfig(tenants=[Tenant(name="a", api_key_env="WORKERS_KEY")])
    client = TestClient(build_app(config, memory=memory))
    assert client.get("/readyz").json() == {"status": "ready", "detail": None}
    memory.store.close()
    answer = client.get("/readyz")
    assert answer.status_code == 503 and answer.json()["status"] == "unavailable"
    assert client.get("/healthz").status_code == 200  # alive, just not ready
