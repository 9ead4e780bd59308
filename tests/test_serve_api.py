"""The HTTP memory service in process (FastAPI's TestClient over the real runtime and MiniLM): tenants
confined to their records, 401/413/422 for bad requests, versioned updates, metrics, the checked-in
OpenAPI document, and a schema-driven fuzz run that must find no 5xx."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from dimmem.runtime.extractors import TurnExtractor
from dimmem.runtime.memory import Memory
from serve.app import build_app
from serve.config import ServeConfig, Tenant
from serve.openapi import CHECKED_IN, openapi_document

KEYS = {"DIMMEM_TEST_KEY_A": "key-a", "DIMMEM_TEST_KEY_B": "key-b"}
A, B = ({"Authorization": f"Bearer {k}"} for k in KEYS.values())
CHAT = [
    {"role": "user", "content": "I adopted a beagle called Biscuit.", "timestamp": "2024-03-04"},
    {"role": "assistant", "content": "Puppy classes at Paws Academy are great."},
    {"role": "user", "content": "I work as a nurse at the city hospital."},
]


@pytest.fixture(scope="module")
def embedder():
    from dimmem.runtime.embed import Embedder

    return Embedder()


@pytest.fixture
def app(tmp_path, embedder, monkeypatch):
    for env, key in KEYS.items():
        monkeypatch.setenv(env, key)
    config = ServeConfig(
        tenants=[
            Tenant(name="a", api_key_env="DIMMEM_TEST_KEY_A"),
            Tenant(name="b", api_key_env="DIMMEM_TEST_KEY_B"),
        ],
        max_body_bytes=20_000,
        max_messages=50,
        max_k=20,
    )
    return build_app(config, memory=Memory({"store": str(tmp_path / "m.sqlite")}, embedder=embedder))


@pytest.fixture
def client(app):
    return TestClient(app)


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
    client.post("/v1/search", json={"user_id": "ann", "query": "x"}, headers=A)
    client.post("/v1/search", json={"user_id": "ann", "query": "x"})
    text = client.get("/metrics", headers=A).text
    assert 'dimmem_requests_total{route="/v1/search",status="200"} 1.0' in text
    assert 'dimmem_requests_total{route="/v1/search",status="401"} 1.0' in text


def test_listing_pages_filters_and_stays_in_the_tenant(client, app):
    app.state.service.config.max_page_size = 3  # a larger limit is capped to this
    long_chat = [
        {
            "role": "user",
            "content": f"I visited museum number {i} in Porto.",
            "session_id": f"s{i}",
            "timestamp": f"2024-03-0{i + 1}",
        }
        for i in range(7)
    ]  # a day each: kept apart, not merged
    trip = {"user_id": "ann", "messages": long_chat, "conversation_id": "trip"}
    pets = {"user_id": "ann", "messages": CHAT, "conversation_id": "pets"}
    added = client.post("/v1/memories", json=trip, headers=A).json()
    client.post("/v1/memories", json=pets, headers=A)
    client.post("/v1/memories", json=pets, headers=B)
    ids, cursor, pages = [], None, 0
    while True:
        params = {"user_id": "ann", "conversation_id": "trip", "limit": 50}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/memories", params=params, headers=A)
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["memories"]) <= 3 and all(m["user_id"] == "ann" for m in body["memories"])
        ids += [m["id"] for m in body["memories"]]
        pages += 1
        if not (cursor := body["next_cursor"]):
            break
    assert ids == [e["id"] for e in added["events"]] and pages == 3  # oldest first, every record once
    everything = client.get("/v1/memories", params={"user_id": "ann", "limit": 3}, headers=A).json()
    assert everything["next_cursor"]  # 9 records for ann in tenant a
    # tenant b sees its own 2 records of "ann" only, also with tenant a's cursor (a position, not a grant)
    from_b = client.get("/v1/memories", params={"user_id": "ann"}, headers=B).json()
    assert [m["conversation_id"] for m in from_b["memories"]] == ["pets", "pets"]
    assert from_b["next_cursor"] is None
    replayed = client.get(
        "/v1/memories", params={"user_id": "ann", "cursor": everything["next_cursor"]}, headers=B
    )
    assert replayed.json() == from_b
    client.delete(f"/v1/memories/{quote(ids[0], safe='')}?user_id=ann", headers=A)
    deleted = client.get("/v1/memories", params={"user_id": "ann", "status": "deleted"}, headers=A).json()
    assert [m["id"] for m in deleted["memories"]] == [ids[0]] and deleted["memories"][0]["version"] == 2
    params = {"user_id": "ann", "time": "2024-03-02/2024-03-03", "type": "episodic"}
    dated = client.get("/v1/memories", params=params, headers=A)
    assert dated.status_code == 200
    assert [m["time"] for m in dated.json()["memories"]] == ["2024-03-02", "2024-03-03"]
    for params in (
        {"user_id": "ann", "status": "gone"},
        {"user_id": "ann", "type": "dream"},
        {"user_id": "ann", "cursor": "nope"},
        {"user_id": "ann", "time": "last May"},
        {"user_id": "ann", "limit": 0},
        {},
    ):
        assert client.get("/v1/memories", params=params, headers=A).status_code == 422, params
    assert client.get("/v1/memories", params={"user_id": "ann"}).status_code == 401


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
def test_schema_driven_fuzzing_finds_no_server_error(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures = []
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = operation.as_strategy()

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=strategy)
        def run(case):
            for headers in (A, {}):
                response = case.call(headers=headers)
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
