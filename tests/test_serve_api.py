"""The HTTP memory service over the real runtime and MiniLM: tenants confined to their records,
401/413/422 for bad requests, versioned updates, metrics, the checked-in OpenAPI document, and a
schema-driven fuzz run that must find no 5xx.

Each test that takes `client` runs three times: in process (FastAPI's TestClient) over SQLite and over
Postgres, and over HTTP against `dimmem serve api --workers 2` on Postgres connected as the runtime's
login role (row-level security applies to it), the deployment the service scales out with."""

import json
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import httpx2
import pytest
import schemathesis
import yaml
from conftest import BACKENDS
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from pg_server import empty_database

from dimmem.launch import Service, free_port
from dimmem.paths import CONFIG_DIR
from dimmem.runtime.extractors import TurnExtractor
from dimmem.runtime.memory import Memory
from dimmem.runtime.stores.embedded import RUNTIME_LOGIN
from serve.app import build_app
from serve.config import ServeConfig, Tenant
from serve.openapi import CHECKED_IN, openapi_document

KEYS = {"DIMMEM_TEST_KEY_A": "key-a", "DIMMEM_TEST_KEY_B": "key-b", "DIMMEM_TEST_OPERATOR": "key-operator"}
A, B, OPERATOR = ({"Authorization": f"Bearer {k}"} for k in KEYS.values())
CHAT = [
    {"role": "user", "content": "I adopted a beagle called Biscuit.", "timestamp": "2024-03-04"},
    {"role": "assistant", "content": "Puppy classes at Paws Academy are great."},
    {"role": "user", "content": "I work as a nurse at the city hospital."},
]


WORKERS = "postgres, 2 workers"
CONFIG = ServeConfig(
    tenants=[
        Tenant(name="a", api_key_env="DIMMEM_TEST_KEY_A"),
        Tenant(name="b", api_key_env="DIMMEM_TEST_KEY_B"),
    ],
    operator_key_env="DIMMEM_TEST_OPERATOR",
    max_body_bytes=20_000,
    max_messages=50,
    max_k=20,
)


@pytest.fixture(params=[*BACKENDS, pytest.param(WORKERS, marks=pytest.mark.integration)])
def backend(request) -> str:
    """conftest's backends, and the service in worker processes on Postgres."""
    return request.param


@pytest.fixture
def app(backend, memory_factory, embedder, monkeypatch):
    """The service in this process over a fresh store of the backend."""
    if backend == WORKERS:
        pytest.skip("looks inside the app, which runs in the worker processes here")
    for env, key in KEYS.items():
        monkeypatch.setenv(env, key)
    return build_app(CONFIG, memory=memory_factory(embedder=embedder))


@pytest.fixture(scope="module")
def workers(pg_server, tmp_path_factory):
    """`dimmem serve api --workers 2` with CONFIG over one Postgres database, connected as the runtime's
    login role; yields (base URL, the database's superuser URL)."""
    database = pg_server.fresh_database()
    folder, port = tmp_path_factory.mktemp("workers"), free_port()
    config = folder / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                **CONFIG.model_dump(mode="json", exclude_defaults=True),
                "memory_config": str(CONFIG_DIR / "memory" / "default.yaml"),
                "store": pg_server.login_role(RUNTIME_LOGIN, database),
                "port": port,
                "workers": 2,
            }
        )
    )
    command = [sys.executable, "-m", "dimmem", "serve", "api", "--config", str(config)]
    url = f"http://127.0.0.1:{port}"
    with Service(command, f"{url}/readyz", folder / "api.log", env=KEYS, startup_timeout=240):
        yield url, database


@pytest.fixture
def client(request, backend):
    """A client of the service under test; against the workers, over an emptied database."""
    if backend != WORKERS:
        yield TestClient(request.getfixturevalue("app"))
        return
    url, database = request.getfixturevalue("workers")
    empty_database(database)
    with httpx2.Client(base_url=url, timeout=60) as http:
        yield http


def counted(client, route: str, status: str) -> float:
    """dimmem_requests_total for (route, status) as /metrics reports it now."""
    text = client.get("/metrics", headers=OPERATOR).text
    pattern = rf'^dimmem_requests_total\{{route="{re.escape(route)}",status="{status}"\}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_tenants_never_see_each_other(client):
    added = client.post("/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A).json()
    assert len(added["events"]) == 2 and not added["failed"]
    record_id = added["events"][0]["id"]
    path = quote(record_id, safe="")  # ids hold "/" and "#"
    hits = client.post("/v1/search", json={"user_id": "ann", "query": "beagle Biscuit"}, headers=A).json()[
        "hits"
    ]
    assert (
        hits[0]["record"]["id"] == record_id
        and hits[0]["record"]["user_id"] == "ann"
        and "bm25" in hits[0]["paths"]
    )
    # tenant b, same user id: nothing to find, nothing to read, change or delete
    assert (
        client.post("/v1/search", json={"user_id": "ann", "query": "beagle Biscuit"}, headers=B).json()[
            "hits"
        ]
        == []
    )
    for method, url, kwargs in (
        ("get", f"/v1/memories/{path}?user_id=ann", {}),
        ("get", f"/v1/history/{path}?user_id=ann", {}),
        ("delete", f"/v1/memories/{path}?user_id=ann", {}),
        ("patch", f"/v1/memories/{path}", {"json": {"user_id": "ann", "content": "pwned"}}),
    ):
        assert client.request(method, url, headers=B, **kwargs).status_code == 404, (method, url)
    assert (
        client.get(f"/v1/memories/{path}?user_id=ann", headers=A)
        .json()["content"]
        .startswith("user: I adopted")
    )


def test_search_takes_the_filters_the_mcp_tool_takes(client):
    """The same narrowing as the MCP tool's (one runtime search): type, time, location, speaker; a time
    that is no ISO span is 422 naming it."""
    older = [
        {"role": "user", "name": "Sam", "content": "My beagle Rex turned ten.", "timestamp": "2023-07-01"}
    ]
    client.post("/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A)
    client.post("/v1/memories", json={"user_id": "ann", "messages": older}, headers=A)

    def found(**filters) -> list[str]:
        body = {"user_id": "ann", "query": "beagle", **filters}
        answer = client.post("/v1/search", json=body, headers=A)
        assert answer.status_code == 200, answer.text
        return [h["record"]["content"] for h in answer.json()["hits"]]

    assert len(found()) == 2
    assert found(speaker="sam") == ["Sam: My beagle Rex turned ten."]
    assert found(time="2023-07") == ["Sam: My beagle Rex turned ten."]
    assert "Sam: My beagle Rex turned ten." not in found(time="2024-03")
    assert found(type="profile") == []
    bad = client.post("/v1/search", json={"user_id": "ann", "query": "beagle", "time": "soon"}, headers=A)
    assert bad.status_code == 422 and "time" in bad.text


def test_a_slow_extraction_does_not_hold_up_searches(tmp_path, embedder, monkeypatch):
    """Extraction (model calls, seconds per window when served) runs outside the store's lock: a search
    answers while an add waits on its extractor, and the add then lands."""
    release, extracting = threading.Event(), threading.Event()

    def slow_extractor(windows):
        extracting.set()
        assert release.wait(timeout=60)
        return TurnExtractor()(windows)

    monkeypatch.setenv("DIMMEM_TEST_KEY_A", "key-a")
    memory = Memory({"store": str(tmp_path / "m.sqlite")}, embedder=embedder, extractor=slow_extractor)
    config = ServeConfig(tenants=[Tenant(name="a", api_key_env="DIMMEM_TEST_KEY_A")])
    client = TestClient(build_app(config, memory=memory))
    with ThreadPoolExecutor(1) as pool:
        adding = pool.submit(
            client.post, "/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A
        )
        assert extracting.wait(timeout=60)
        searched = client.post("/v1/search", json={"user_id": "ann", "query": "beagle"}, headers=A)
        assert searched.status_code == 200 and not adding.done()
        release.set()
        assert adding.result(timeout=60).status_code == 200
    assert client.post("/v1/search", json={"user_id": "ann", "query": "beagle"}, headers=A).json()["hits"]


def test_update_delete_and_history_are_versioned(client):
    record_id = client.post("/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A).json()[
        "events"
    ][0]["id"]
    path = quote(record_id, safe="")
    updated = client.patch(f"/v1/memories/{path}", json={"user_id": "ann", "location": "Lisbon"}, headers=A)
    assert (
        updated.status_code == 200
        and updated.json()["location"] == "Lisbon"
        and updated.json()["version"] == 2
    )
    assert client.delete(f"/v1/memories/{path}?user_id=ann", headers=A).status_code == 204
    history = client.get(f"/v1/history/{path}?user_id=ann", headers=A).json()
    assert [h["action"] for h in history] == ["ADD", "UPDATE", "DELETE"] and history[0]["record"][
        "location"
    ] is None
    assert (
        client.post("/v1/search", json={"user_id": "ann", "query": "beagle"}, headers=A).json()["hits"][0][
            "record"
        ]["id"]
        != record_id
    )


def test_extract_returns_records_without_storing(client):
    body = client.post("/v1/extract", json={"messages": CHAT}, headers=A).json()
    assert [m["source_turns"] for m in body["memories"]] == [["S1:1"], ["S1:3"]]
    assert (
        client.post("/v1/search", json={"user_id": "ann", "query": "beagle"}, headers=A).json()["hits"] == []
    )


def test_bad_requests_get_clear_4xx(client):
    assert client.post("/v1/search", json={"user_id": "ann", "query": "x"}).status_code == 401
    assert (
        client.post(
            "/v1/search", json={"user_id": "ann", "query": "x"}, headers={"Authorization": "Bearer nope"}
        ).status_code
        == 401
    )
    assert client.get("/metrics").status_code == 401 and client.get("/healthz").json() == {"status": "ok"}
    cases = [
        ({"user_id": "ann"}, "messages"),
        ({"user_id": "a/b", "messages": CHAT}, "user_id"),
        ({"user_id": "ann", "messages": []}, "messages"),
        ({"user_id": "ann", "messages": [{"role": "robot", "content": "x"}]}, "role"),
    ]
    for body, field in cases:
        response = client.post("/v1/memories", json=body, headers=A)
        assert response.status_code == 422 and field in json.dumps(response.json()["detail"]), body
    assert (
        client.post(
            "/v1/memories", content=b"{not json", headers={**A, "Content-Type": "application/json"}
        ).status_code
        == 422
    )
    bad_time = client.post(
        "/v1/memories",
        json={"user_id": "ann", "messages": [{"role": "user", "content": "hi", "timestamp": "yesterday"}]},
        headers=A,
    )
    assert bad_time.status_code == 422 and "timestamp" in bad_time.json()["detail"]
    assert (
        client.post("/v1/search", json={"user_id": "ann", "query": "x", "k": 21}, headers=A).status_code
        == 422
    )
    path = quote(
        client.post("/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A).json()["events"][0][
            "id"
        ],
        safe="",
    )
    wrong = client.patch(f"/v1/memories/{path}", json={"user_id": "ann", "time": "last spring"}, headers=A)
    assert wrong.status_code == 422 and "time" in wrong.json()["detail"]
    assert client.patch(f"/v1/memories/{path}", json={"user_id": "ann"}, headers=A).status_code == 422
    big = {"user_id": "ann", "messages": [{"role": "user", "content": "x" * 30_000}]}
    assert client.post("/v1/memories", json=big, headers=A).status_code == 413
    many = {"user_id": "ann", "messages": [{"role": "user", "content": "hi"}] * 51}
    assert client.post("/v1/memories", json=many, headers=A).status_code == 413


def test_metrics_count_requests_by_route_and_status(client):
    """Counted by route and status; with several workers, /metrics sums them all, whichever answers."""
    before = {status: counted(client, "/v1/search", status) for status in ("200", "401")}
    for _ in range(3):
        client.post("/v1/search", json={"user_id": "ann", "query": "x"}, headers=A)
    client.post("/v1/search", json={"user_id": "ann", "query": "x"})
    for _ in range(4):  # asked several times: any worker may answer, each must see every count
        assert counted(client, "/v1/search", "200") - before["200"] == 3
        assert counted(client, "/v1/search", "401") - before["401"] == 1


def test_metrics_need_the_operator_key(client, tmp_path, embedder, monkeypatch):
    """/metrics counts every tenant's calls, so a tenant's key gets 403 (it was 200), the
    operator key 200; the operator key reads nothing else; with no operator key /metrics is off."""
    assert client.get("/metrics", headers=A).status_code == 403
    assert client.get("/metrics", headers=OPERATOR).status_code == 200
    assert client.get("/metrics").status_code == 401
    assert (
        client.post("/v1/search", json={"user_id": "ann", "query": "x"}, headers=OPERATOR).status_code == 403
    )
    monkeypatch.setenv("DIMMEM_TEST_KEY_A", "key-a")
    config = ServeConfig(tenants=[Tenant(name="a", api_key_env="DIMMEM_TEST_KEY_A")])
    off = TestClient(
        build_app(config, memory=Memory({"store": str(tmp_path / "off.sqlite")}, embedder=embedder))
    )
    assert off.get("/metrics", headers=A).status_code == 404


def test_patch_refuses_null_for_fields_that_cannot_be_null(client):
    """{"type": null} / {"keywords": null} were 500, {"content": null} leaked the
    embedder's message; each is now 422 naming the field. The dimensions may still be cleared."""
    record_id = client.post("/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A).json()[
        "events"
    ][0]["id"]
    path = quote(record_id, safe="")
    for field in ("type", "keywords", "content"):
        response = client.patch(f"/v1/memories/{path}", json={"user_id": "ann", field: None}, headers=A)
        assert response.status_code == 422, (field, response.text)
        assert [e["loc"] for e in response.json()["detail"]] == [["body", field]]
    cleared = client.patch(f"/v1/memories/{path}", json={"user_id": "ann", "time": None}, headers=A)
    assert cleared.status_code == 200 and cleared.json()["time"] is None
    assert client.get(f"/v1/memories/{path}?user_id=ann", headers=A).json()["keywords"]


def test_search_with_a_far_off_reference_date_is_not_a_server_error(client):
    """ "last week" against 0001-01-01 was an OverflowError (500)."""
    client.post("/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A)
    for query in ("what did I do last week", "what happened yesterday", "last year in 2024"):
        for day in ("0001-01-01", "9999-12-31"):
            body = {"user_id": "ann", "query": query, "reference_date": day}
            response = client.post("/v1/search", json=body, headers=A)
            assert response.status_code in (200, 422), (query, day, response.text)


def test_hostile_ids_are_clipped_and_refused_before_a_lookup(client, app, monkeypatch):
    """a 100k-character id was echoed in full in the 404; ids over the maximum are
    422 without reaching the store, a URL over max_url_bytes is 414, and what comes back is short."""
    lookups = []
    real_get = app.state.service.memory.get
    monkeypatch.setattr(
        app.state.service.memory, "get", lambda *a, **k: lookups.append(a) or real_get(*a, **k)
    )
    unknown = client.get(f"/v1/memories/{'x' * 500}?user_id=ann", headers=A)
    assert unknown.status_code == 404 and len(unknown.text) < 300 and "500 characters" in unknown.text
    lookups.clear()
    too_long = client.get(f"/v1/memories/{'x' * 600}?user_id=ann", headers=A)
    assert too_long.status_code == 422 and len(too_long.text) < 1_000 and lookups == []
    huge = client.get(f"/v1/memories/{'x' * 60_000}?user_id=ann", headers=A)  # httpx's own cap: 64 KiB
    assert huge.status_code == 414 and len(huge.text) < 300 and lookups == []
    assert client.get(f"/healthz?{'q' * 9_000}").status_code == 414
    # a long field value is clipped in the 422 too
    big_user = client.get("/v1/memories", params={"user_id": "u" * 5_000}, headers=A)
    assert big_user.status_code == 422 and len(big_user.text) < 1_000


def test_unauthenticated_requests_get_401_before_the_body_limit(client):
    """with no key a huge body got 413, not 401; unknown routes need a key too."""
    huge = b'{"user_id": "ann", "messages": []}' + b" " * 100_000
    headers = {"Content-Type": "application/json"}
    assert client.post("/v1/memories", content=huge, headers=headers).status_code == 401
    assert client.post("/v1/memories", content=huge, headers={**headers, **A}).status_code == 413
    assert client.get("/v1/nowhere").status_code == 401
    assert client.get("/v1/nowhere", headers=A).status_code == 404
    assert client.get("/openapi.json").status_code == 200 and client.get("/healthz").status_code == 200

    def chunks():  # no Content-Length: counted while it streams
        yield b'{"user_id": "ann", "messages": ['
        for _ in range(100):
            yield b'{"role": "user", "content": "' + b"x" * 1_000 + b'"},'

    assert client.post("/v1/memories", content=chunks(), headers={**headers, **A}).status_code == 413


def test_changing_a_record_that_is_not_active_is_409_and_restore_brings_it_back(client):
    """The service's side: PATCH of a deleted record was 200 (it came back in search) and
    a second DELETE 204; both are 409 now, and POST .../restore is the one way back."""
    record_id = client.post("/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A).json()[
        "events"
    ][0]["id"]
    path = quote(record_id, safe="")
    assert client.post(f"/v1/memories/{path}/restore?user_id=ann", headers=A).status_code == 409  # active
    assert client.delete(f"/v1/memories/{path}?user_id=ann", headers=A).status_code == 204
    patched = client.patch(f"/v1/memories/{path}", json={"user_id": "ann", "content": "back"}, headers=A)
    assert patched.status_code == 409 and "deleted" in patched.json()["detail"]
    assert client.delete(f"/v1/memories/{path}?user_id=ann", headers=A).status_code == 409
    hits = client.post("/v1/search", json={"user_id": "ann", "query": "beagle Biscuit"}, headers=A).json()
    assert record_id not in [h["record"]["id"] for h in hits["hits"]]
    assert client.post(f"/v1/memories/{path}/restore?user_id=ann", headers=B).status_code == 404
    restored = client.post(f"/v1/memories/{path}/restore?user_id=ann", headers=A)
    assert restored.status_code == 200 and restored.json()["status"] == "active", restored.text
    hits = client.post("/v1/search", json={"user_id": "ann", "query": "beagle Biscuit"}, headers=A).json()
    assert hits["hits"][0]["record"]["id"] == record_id
    actions = [h["action"] for h in client.get(f"/v1/history/{path}?user_id=ann", headers=A).json()]
    assert actions[-2:] == ["DELETE", "RESTORE"]


def test_every_route_declares_its_response_schema():
    document = openapi_document()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            ok = operation["responses"].get("200") or operation["responses"].get("204")
            assert ok is not None, (method, path)
            if "content" in ok:
                schema = next(iter(ok["content"].values()))["schema"]
                described = schema != {} and (schema.get("type") != "object" or "properties" in schema)
                assert described, (method, path)
    hit = document["components"]["schemas"]["Hit"]["properties"]
    assert hit["record"] == {"$ref": "#/components/schemas/StoredMemory"}
    assert hit["paths"]["additionalProperties"] == {"$ref": "#/components/schemas/PathScore"}
    stored = document["components"]["schemas"]["StoredMemory"]["properties"]
    assert {
        "id",
        "user_id",
        "status",
        "version",
        "created",
        "updated",
        "conversation_id",
        "window_id",
        "session_time",
        "source_turns",
    } <= set(stored)


def test_responses_match_their_schemas(client):
    record_id = client.post("/v1/memories", json={"user_id": "ann", "messages": CHAT}, headers=A).json()[
        "events"
    ][0]["id"]
    record = client.get(f"/v1/memories/{quote(record_id, safe='')}?user_id=ann", headers=A).json()
    from serve.schemas import StoredMemory

    # every field of the stored record, no more
    assert StoredMemory.model_validate(record).model_dump() == record


def test_checked_in_openapi_document_is_current():
    assert json.loads(CHECKED_IN.read_text()) == json.loads(json.dumps(openapi_document(), sort_keys=True)), (
        "regenerate: dimmem serve api --openapi serve/openapi.json"
    )


@pytest.mark.integration
def test_schema_driven_fuzzing_finds_no_server_error(request, backend):
    if backend == WORKERS:
        url = request.getfixturevalue("client").base_url  # the workers over an emptied database
        schema, call = (
            schemathesis.openapi.from_url(f"{url}/openapi.json"),
            {"base_url": str(url), "timeout": 60},
        )
    else:
        schema, call = schemathesis.openapi.from_asgi("/openapi.json", request.getfixturevalue("app")), {}
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = operation.as_strategy()

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=strategy)
        def run(case):
            for headers in (A, {}):
                response = case.call(headers=headers, **call)
                if response.status_code >= 500:
                    failures.append(
                        f"{case.method} {case.formatted_path} -> {response.status_code}: "
                        f"{response.text[:200]}"
                    )

        run()
    assert not failures, failures[:5]


def test_serve_config_loads_with_dotted_overrides(tmp_path):
    from dimmem.config import ConfigError
    from dimmem.paths import CONFIG_DIR
    from serve.config import load_serve_config

    config = load_serve_config(
        CONFIG_DIR / "serve" / "default.yaml",
        ["max_k=7", "tenants=[{name: x, api_key_env: X}]"],
        port=9000,
        host=None,
    )
    assert config.max_k == 7 and config.port == 9000 and config.host == "127.0.0.1"
    assert config.tenants[0].name == "x"
    with pytest.raises(ConfigError, match="unknown key 'max_kk'"):
        load_serve_config(CONFIG_DIR / "serve" / "default.yaml", ["max_kk=7"])
