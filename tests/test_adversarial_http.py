"""The standing adversarial suite, HTTP part: the memory service as a real process
(`dimmem serve api` under uvicorn), driven by raw sockets where a polite client would not go.

- body and header limits: chunked, trickled, oversized and unauthenticated bodies, URLs and headers too
  long to parse: each answered (401/408/413/414/431) quickly, without the server holding the body;
- id and user-id tricks across two tenants: percent-encoded slashes, "..", unicode, the other
  tenant's ids and cursors, huge ids, a second Authorization header: never a byte of the other
  tenant's records, never a 5xx;
- config mistakes for `serve api`: exit 2 and one line naming what is wrong, no traceback;
- SIGKILL during adds, then a restart: every acknowledged add is there, the store passes
  `PRAGMA integrity_check`.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest
import yaml

from dimmem.launch import Service, free_port
from dimmem.paths import CONFIG_DIR

pytestmark = pytest.mark.integration

KEYS = {
    "ADV_KEY_A": "adversarial-key-tenant-a",
    "ADV_KEY_B": "adversarial-key-tenant-b",
    "ADV_OPERATOR": "adversarial-key-operator",
}
A, B, OPERATOR = KEYS.values()
MAX_BODY = 65_536
SECRET = "Biscuit the beagle lives at 12 Harbour Lane"
CHAT = [
    {"role": "user", "content": f"I adopted a beagle. {SECRET}.", "timestamp": "2024-03-04"},
    {"role": "assistant", "content": "Puppy classes at Paws Academy are great."},
    {"role": "user", "content": "I work as a nurse at the city hospital."},
]


def write_config(folder: Path, port: int, **overrides) -> Path:
    config = {
        "memory_config": str(CONFIG_DIR / "memory" / "default.yaml"),
        "store": str(folder / "memory.sqlite"),
        "tenants": [{"name": "a", "api_key_env": "ADV_KEY_A"}, {"name": "b", "api_key_env": "ADV_KEY_B"}],
        "operator_key_env": "ADV_OPERATOR",
        "max_body_bytes": MAX_BODY,
        "max_body_seconds": 3,
        "max_messages": 200,
        "port": port,
        **overrides,
    }
    path = folder / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start(folder: Path, port: int | None = None) -> Service:
    port = port or free_port()
    config = write_config(folder, port)
    command = [sys.executable, "-m", "dimmem", "serve", "api", "--config", str(config)]
    service = Service(
        command, f"http://127.0.0.1:{port}/healthz", folder / "api.log", env=KEYS, startup_timeout=180
    )
    service.port = port
    return service


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with start(tmp_path_factory.mktemp("adversarial")) as service:
        yield service


def call(port: int, method: str, target: str, key: str | None = None, body=None, timeout: float = 30):
    """One request with the target sent exactly as given (no normalisation); (status, parsed body)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        connection.request(method, target, body=payload, headers=headers)
        response = connection.getresponse()
        text = response.read().decode()
    finally:
        connection.close()
    try:
        return response.status, json.loads(text)
    except ValueError:
        return response.status, text


def raw(port: int, timeout: float = 30) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def answered(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def status_of(sock: socket.socket) -> int:
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return int(head.split(b" ", 2)[1])


def rss(service: Service) -> int:
    return psutil.Process(service.process.pid).memory_info().rss


def chunked_head(target: str, key: str | None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {target} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


# --- body, URL and header limits ------------------------------------------------------------------
def send_until_answered(sock: socket.socket, most: int, piece: bytes, pause: float = 0.0) -> int:
    """Chunks of `piece` until the server answers or `most` bytes are sent; the bytes sent."""
    sent = 0
    sock.sendall(chunk(b'{"user_id": "ann", "messages": [{"role": "user", "content": "'))
    while sent < most and not answered(sock):
        try:
            sock.sendall(chunk(piece))
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(piece)
        if pause:
            time.sleep(pause)
    return sent


def test_a_chunked_body_over_the_limit_is_413_while_it_streams(server):
    """without Content-Length the whole body was read, then 413 (192 MiB taken into
    memory). Now the answer comes once the limit is passed and the server never holds the body."""
    before = rss(server)
    began = time.monotonic()
    with raw(server.port) as sock:
        sock.sendall(chunked_head("/v1/memories", A))
        sent = send_until_answered(sock, 128 * 2**20, b"x" * 2**18)
        assert status_of(sock) == 413
    assert time.monotonic() - began < 10
    assert sent < 32 * 2**20, f"the server answered only after {sent} bytes"
    assert rss(server) - before < 48 * 2**20, "the server held the body"
    assert call(server.port, "GET", "/healthz")[0] == 200


def test_no_key_is_401_before_any_body_is_read(server):
    """with no key (or a wrong one) a huge body got 413, not 401: the body was read first."""
    for key in (None, "not-a-key-of-anyone"):
        with raw(server.port) as sock:  # declared: 200 MB that never come
            auth = f"Authorization: Bearer {key}\r\n" if key else ""
            sock.sendall(
                f"POST /v1/memories HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 200000000\r\n\r\n{{".encode()
            )
            assert status_of(sock) == 401
        with raw(server.port) as sock:  # chunked
            sock.sendall(chunked_head("/v1/search", key))
            send_until_answered(sock, 16 * 2**20, b"x" * 2**16)
            assert status_of(sock) == 401
    with raw(server.port) as sock:  # a known key, a declared size over the limit: 413 before the body
        sock.sendall(
            f"POST /v1/memories HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {A}\r\n"
            f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
        )
        assert status_of(sock) == 413


def test_a_trickled_body_is_bounded_in_size_and_time(server):
    """A slow body is held to the same limit (413 once past it) and to max_body_seconds (408)."""
    with raw(server.port) as sock:
        sock.sendall(chunked_head("/v1/memories", A))
        sent = send_until_answered(sock, 8 * MAX_BODY, b"x" * 1_024, pause=0.002)
        assert status_of(sock) == 413 and sent < 4 * MAX_BODY
    began = time.monotonic()
    with raw(server.port) as sock:  # 20 bytes a quarter second: never over the size limit
        sock.sendall(chunked_head("/v1/memories", A))
        send_until_answered(sock, 10_000, b"y" * 20, pause=0.25)
        assert status_of(sock) == 408
    assert 2.5 < time.monotonic() - began < 15


def test_long_urls_are_414_and_long_headers_431(server):
    """a 1 MB URL got a connection reset; now 414 (and 431 for huge headers), and the
    connection closes gently, so the client reads the answer."""
    for length in (10_000, 100_000, 1_000_000):
        with raw(server.port) as sock:
            sock.sendall(f"GET /v1/memories/{'x' * length}?user_id=ann HTTP/1.1\r\nHost: x\r\n".encode())
            sock.sendall(f"Authorization: Bearer {A}\r\n\r\n".encode())
            assert status_of(sock) == 414, length
    with raw(server.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Junk: " + b"j" * 40_000 + b"\r\n\r\n")
        assert status_of(sock) == 431
    with raw(server.port) as sock:  # many small headers add up too
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 8_000 + b"\r\n")
        assert status_of(sock) == 431
    assert call(server.port, "GET", "/healthz")[0] == 200
    log = Path(server.log).read_text()
    assert "x" * 300 not in log, "the access log repeats a whole hostile path"


# --- ids and user ids across tenants --------------------------------------------------------------
def test_two_authorization_headers_are_400(server):
    """The guard checked one Authorization header and the route read the other, so a request carrying
    another tenant's key beside its own ran as whichever the route read. More than one is refused."""
    status, added = call(server.port, "POST", "/v1/memories", A, {"user_id": "zoe", "messages": CHAT})
    assert status == 200, added
    body = json.dumps({"user_id": "zoe", "query": SECRET}).encode()
    for first, second in ((B, A), (A, B), ("not-a-key-of-anyone", A)):
        for head in (
            f"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n",
            "GET /v1/memories?user_id=zoe HTTP/1.1\r\nHost: x\r\n",
        ):
            with raw(server.port) as sock:
                auth = f"Authorization: Bearer {first}\r\nAuthorization: Bearer {second}\r\n\r\n"
                sock.sendall((head + auth).encode() + (body if head.startswith("POST") else b""))
                assert status_of(sock) == 400, (head, first, second)
    status, found = call(server.port, "POST", "/v1/search", A, {"user_id": "zoe", "query": SECRET})
    assert status == 200 and SECRET in json.dumps(found["hits"])  # one header: served as before


def test_no_id_or_user_id_trick_reaches_the_other_tenant(server):
    status, added = call(server.port, "POST", "/v1/memories", A, {"user_id": "ann", "messages": CHAT})
    assert status == 200, added
    record_id = next(e["id"] for e in added["events"])
    status, listed = call(server.port, "GET", "/v1/memories?user_id=ann&limit=1", A)
    cursor = listed["next_cursor"]
    encoded = quote(record_id, safe="")
    targets = [
        f"/v1/memories/{encoded}?user_id=ann",
        f"/v1/memories/{record_id.replace('#', '%23')}?user_id=ann",
        f"/v1/memories/{encoded.replace('%2F', '%252F')}?user_id=ann",
        f"/v1/memories/..%2F..%2Fa%2F{encoded}?user_id=ann",
        f"/v1/memories/../memories/{encoded}?user_id=ann",
        f"/v1/memories/%2e%2e/{encoded}?user_id=ann",
        f"/v1/memories/{encoded}?user_id=a%2Fann",
        f"/v1/memories/{encoded}?user_id=..%2Fa%2Fann",
        f"/v1/memories/{encoded}?user_id=ann&user_id=a%2Fann",
        f"/v1/memories/{encoded}?user_id=%C3%A5nn",
        f"/v1/memories/{encoded}?user_id=ann%00",
        f"/v1/memories/{encoded}?user_id=%EF%BD%81nn",  # fullwidth "a"
        f"/v1/history/{encoded}?user_id=ann",
        f"/v1/memories/{'%2F' * 3000}?user_id=ann",
        f"/v1/memories/{quote('é' * 300)}?user_id=ann",
        f"/v1/memories?user_id=ann&cursor={cursor}",
        f"/v1/memories?user_id=ann&status=any&limit=1000&conversation_id={added['conversation_id']}",
        "/v1/memories?user_id=a/ann",
        f"/v1/memories/{encoded}/restore?user_id=ann",
    ]
    for target in targets:
        for method in ("POST",) if target.partition("?")[0].endswith("/restore") else ("GET", "DELETE"):
            status, body = call(server.port, method, target, B)
            assert status in (200, 404, 405, 414, 422), (method, target, status, body)
            assert SECRET not in json.dumps(body), (method, target)
            if status == 200 and isinstance(body, dict) and "memories" in body:
                assert body["memories"] == [], (target, body)
        path = target.partition("?")[0]
        status, body = call(server.port, "PATCH", path, B, {"user_id": "ann", "content": "pwned"})
        assert status in (404, 405, 414, 422) and SECRET not in json.dumps(body), (path, status)
    status, hits = call(server.port, "POST", "/v1/search", B, {"user_id": "ann", "query": SECRET})
    assert status == 200 and hits["hits"] == []
    for user_id in ("ann", "a/ann", "../a/ann", "ann\u0000"):
        status, body = call(server.port, "POST", "/v1/search", B, {"user_id": user_id, "query": SECRET})
        assert status in (200, 422) and SECRET not in json.dumps(body), user_id
    # the owner still has it, unchanged
    status, record = call(server.port, "GET", f"/v1/memories/{encoded}?user_id=ann", A)
    assert status == 200 and record["status"] == "active" and record["version"] == 1
    # an unknown id is echoed short, however long it is
    status, body = call(server.port, "GET", f"/v1/memories/{'z' * 500}?user_id=ann", A)
    assert status == 404 and len(json.dumps(body)) < 300
    # the operator key reads metrics and nothing else; tenant keys do not read metrics
    assert call(server.port, "GET", "/metrics", OPERATOR)[0] == 200
    assert call(server.port, "GET", "/metrics", A)[0] == 403
    assert call(server.port, "GET", f"/v1/memories/{encoded}?user_id=ann", OPERATOR)[0] == 403


# --- config mistakes ------------------------------------------------------------------------------
def config_mistakes(folder: Path) -> dict[str, tuple[Path, dict, list[str]]]:
    """name -> (config file, environment, words the one line must hold)."""
    base = {
        "memory_config": str(CONFIG_DIR / "memory" / "default.yaml"),
        "store": str(folder / "m.sqlite"),
        "tenants": [{"name": "a", "api_key_env": "ADV_KEY_A"}, {"name": "b", "api_key_env": "ADV_KEY_B"}],
        "port": free_port(),
    }

    def file(name: str, text: str) -> Path:
        path = folder / f"{name}.yaml"
        path.write_text(text)
        return path

    same = {"ADV_KEY_A": A, "ADV_KEY_B": A}
    two_names = {
        **base,
        "tenants": [{"name": "a", "api_key_env": "ADV_KEY_A"}, {"name": "a", "api_key_env": "ADV_KEY_B"}],
    }
    one_var = {
        **base,
        "tenants": [{"name": "a", "api_key_env": "ADV_KEY_A"}, {"name": "b", "api_key_env": "ADV_KEY_A"}],
    }
    return {
        "shared key": (file("shared", yaml.safe_dump(base)), same, ["ADV_KEY_A", "ADV_KEY_B", "same"]),
        "operator shares a key": (
            file("operator", yaml.safe_dump({**base, "operator_key_env": "ADV_OPERATOR"})),
            {"ADV_KEY_A": A, "ADV_KEY_B": B, "ADV_OPERATOR": B},
            ["ADV_KEY_B", "ADV_OPERATOR"],
        ),
        "shared name": (
            file("names", yaml.safe_dump(two_names)),
            {"ADV_KEY_A": A, "ADV_KEY_B": B},
            ["tenants", "names", "a"],
        ),
        "shared variable": (
            file("vars", yaml.safe_dump(one_var)),
            {"ADV_KEY_A": A},
            ["tenants", "ADV_KEY_A"],
        ),
        "missing variable": (file("missing", yaml.safe_dump(base)), {"ADV_KEY_A": A}, ["ADV_KEY_B"]),
        "empty key": (
            file("empty_key", yaml.safe_dump(base)),
            {"ADV_KEY_A": A, "ADV_KEY_B": ""},
            ["ADV_KEY_B"],
        ),
        "broken YAML": (file("broken", "tenants: [{name: a\nport: 1\n"), {}, ["broken.yaml", "YAML"]),
        "empty file": (file("blank", ""), {}, ["blank.yaml", "tenants"]),
        "unknown key": (
            file("unknown", yaml.safe_dump({**base, "max_kk": 3})),
            {},
            ["unknown.yaml", "max_kk"],
        ),
        "no such file": (folder / "absent.yaml", {}, ["absent.yaml"]),
        "bad limit": (file("limit", yaml.safe_dump({**base, "max_body_bytes": -1})), {}, ["max_body_bytes"]),
    }


def test_config_mistakes_exit_2_with_one_line(tmp_path):
    """two tenants sharing a key started, and the key then read the last tenant's records."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ADV_")}

    def run(case):
        path, env, _ = case
        command = [sys.executable, "-m", "dimmem", "serve", "api", "--config", str(path)]
        return subprocess.run(command, env={**clean, **env}, capture_output=True, text=True, timeout=120)

    mistakes = config_mistakes(tmp_path)
    with ThreadPoolExecutor(len(mistakes)) as pool:
        results = dict(zip(mistakes, pool.map(run, mistakes.values())))
    for name, result in results.items():
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, (
            name,
            result.stderr,
        )
        assert lines[0].startswith("dimmem serve: error: "), (name, lines)
        for word in mistakes[name][2]:
            assert word in lines[0], (name, word, lines[0])
        for key in (A, B):
            assert key not in result.stderr + result.stdout, name  # keys are never said


# --- SIGKILL during adds --------------------------------------------------------------------------
def test_sigkill_during_adds_loses_no_acknowledged_add(tmp_path):
    """After SIGKILL mid-traffic and a restart every acknowledged add is readable, the store is intact, a
    retried acknowledged add stores nothing twice, and the unacknowledged ones complete on retry."""
    port = free_port()
    acknowledged: dict[str, tuple[dict, list[str]]] = {}  # conversation -> (request, record ids)
    unanswered: list[dict] = []
    stop = threading.Event()

    def adder(worker: int) -> None:
        for n in range(1_000):
            if stop.is_set():
                return
            messages = [
                {"role": "user", "content": f"Worker {worker} note {n}: I keep item {i} in drawer {n}."}
                for i in range(5)
            ]
            body = {"user_id": f"user{worker}", "messages": messages, "conversation_id": f"w{worker}-c{n}"}
            try:
                status, answer = call(port, "POST", "/v1/memories", A, body, timeout=60)
            except (OSError, http.client.HTTPException):
                unanswered.append(body)
                return
            assert status == 200, answer
            acknowledged[body["conversation_id"]] = (body, [e["id"] for e in answer["events"]])

    with start(tmp_path, port) as service, ThreadPoolExecutor(3) as pool:
        workers = [pool.submit(adder, w) for w in range(3)]
        deadline = time.monotonic() + 60
        while len(acknowledged) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(service.process.pid, signal.SIGKILL)
        service.process.wait()
        stop.set()
        for worker in workers:
            worker.result(timeout=120)
    assert len(acknowledged) >= 5
    with sqlite3.connect(tmp_path / "memory.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with start(tmp_path, port):
        for body, ids in acknowledged.values():
            for record_id in ids:
                target = f"/v1/memories/{quote(record_id, safe='')}?user_id={body['user_id']}"
                status, record = call(port, "GET", target, A)
                assert status == 200, (record_id, status, record)  # active, or merged by a later add
        body, ids = next(iter(acknowledged.values()))  # a retry of an acknowledged add finds nothing new
        status, again = call(port, "POST", "/v1/memories", A, body)
        assert status == 200 and again["events"] == [] and again["windows"] == 0, again
        for body in unanswered:  # an add cut off by the kill completes on retry (or had committed whole
            status, retried = call(port, "POST", "/v1/memories", A, body)  # before its answer was lost)
            assert status == 200 and len(retried["events"]) in (0, len(body["messages"])), retried
            status, page = call(
                port,
                "GET",
                f"/v1/memories?user_id={body['user_id']}&status=any&conversation_id={body['conversation_id']}",
                A,
            )
            assert len(page["memories"]) == len(body["messages"]), page
    with sqlite3.connect(tmp_path / "memory.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
