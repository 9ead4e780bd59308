"""Memory.add end to end: windows -> extractor -> validator -> update -> store, with the real openai client
against the fake OpenAI-compatible server's logic, the labels replay and the rule fallback; the model
client's retries; the dense path staying in step with the store; the YAML config. The behaviours run on
both store backends (`memory_factory`, tests/conftest.py)."""

import json
import re

import numpy as np
import pytest
from datagen_helpers import mock_client

from data_gen.config import DatagenConfig
from data_gen.run import run
from devtools.fake_teacher import FakeTeacher
from dimmem.contract.records import memory_record
from dimmem.contract.toyworld import generate_dialogue
from dimmem.llm import FatalModelError, ModelClient, ModelConfig, ModelError
from dimmem.runtime.consolidate import ModelConsolidator, RuleConsolidator
from dimmem.runtime.extractors import EndpointExtractor, ReplayExtractor
from dimmem.runtime.memory import Memory
from dimmem.runtime.query import ModelQueryParser
from dimmem.runtime.stores.indexes.memory_vectors import MemoryVectors
from dimmem.runtime.stores.sqlite import SQLiteStore
from dimmem.runtime.stores.vector_rows import VectorRows

MESSAGES = [
    {"role": "user", "content": "I adopted a beagle called Biscuit last weekend.", "timestamp": "2024-03-04"},
    {"role": "assistant", "content": "Congratulations! Puppy classes at Paws Academy are great."},
    {"role": "user", "content": "I work as a nurse at the city hospital."},
    {"role": "assistant", "content": "That sounds demanding. Make sure to rest."},
]


THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}  # as configs/memory/served*.yaml set it


def served(fake: FakeTeacher, **settings) -> ModelClient:
    config = ModelConfig(
        base_url="http://fake.test/v1", model="extractor", max_retries=0, extra_body=THINKING_OFF, **settings
    )
    return ModelClient(config, http_client=mock_client(fake, sync=True))


def down(**settings) -> ModelClient:
    """A client of an endpoint nothing listens on."""
    config = ModelConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0, timeout=2, **settings)
    return ModelClient(config)


def test_add_messages_through_an_endpoint_stores_records_with_global_pointers(embedder, memory_factory):
    fake = FakeTeacher()
    memory = memory_factory(
        {"windows": {"window": 2, "overlap": 1}},
        embedder=embedder,
        extractor=EndpointExtractor(served(fake), concurrency=4),
    )
    result = memory.add(MESSAGES, user_id="ann", conversation_id="chat-1")
    assert result.windows == 3 and not result.failed and not result.rejected
    # the fake extracts each window's first new turn; pointers come back as the conversation's turn ids
    stored = memory.store.records("ann")
    assert [r["source_turns"] for r in stored] == [["S1:1"], ["S1:3"], ["S1:4"]]
    assert all(r["conversation_id"] == "chat-1" and r["session_time"] == "2024-03-04" for r in stored)
    body = fake.bodies[0]  # the request the served model got: strict schema, thinking off, greedy
    assert body["response_format"]["json_schema"]["strict"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["temperature"] == 0.0
    assert memory.search("Biscuit the beagle", user_id="ann", k=1).hits[0].record["source_turns"] == ["S1:1"]
    again = memory.add(MESSAGES, user_id="ann", conversation_id="chat-1")  # idempotent: nothing doubles
    assert (again.windows, again.events) == (0, []) and memory.store.count("ann") == 3


def test_bad_windows_cost_only_themselves(embedder, memory_factory):
    first_new = {"overlap": "t2 user: I work as a nurse", "nonjson": "t2 assistant: That sounds demanding"}
    fake = FakeTeacher({first_new["overlap"]: ["overlap"], first_new["nonjson"]: ["nonjson"]})
    memory = memory_factory(
        {"windows": {"window": 2, "overlap": 1}},
        embedder=embedder,
        extractor=EndpointExtractor(served(fake), concurrency=4),
    )
    result = memory.add(MESSAGES, user_id="ann")
    assert [r["source_turns"] for r in memory.store.records("ann")] == [["S1:1"]]
    assert all(r.startswith(f"{result.conversation_id}/w0001: memories[0]") for r in result.rejected)
    assert any("[source_turns_overlap]" in r for r in result.rejected)
    assert list(result.failed) == [f"{result.conversation_id}/w0002"] and "not JSON" in next(
        iter(result.failed.values())
    )
    assert memory.stats["rejected_memories"] == 1 and memory.stats["failed_windows"] == 1


def test_model_client_doubles_a_truncated_budget_and_reports_what_failed():
    fake = FakeTeacher({"t1 user: I adopted": ["truncated", "ok"]})
    model = served(fake, max_tokens=100, max_tokens_cap=400)
    from dimmem.contract.loaders._fields import Record
    from dimmem.contract.loaders.chat_jsonl import conversation_from_messages
    from dimmem.contract.prompts import extract_messages
    from dimmem.contract.windows import make_windows

    window = make_windows(conversation_from_messages({"messages": MESSAGES}, Record("m", 1), "c"), 4, 0)[0]
    answer = model.json("extract", extract_messages(window), scope=window.scope)
    assert answer["memories"][0]["source_turns"] == ["t1"]
    assert [b["max_tokens"] for b in fake.bodies] == [100, 200]
    with pytest.raises(ModelError, match="still cut off at max_tokens=400"):
        served(FakeTeacher({"t1 user": ["truncated"]}), max_tokens=100, max_tokens_cap=400).json(
            "extract", extract_messages(window)
        )
    refusing = ModelClient(
        ModelConfig(base_url="http://fake.test/v1", model="m", max_retries=0), http_client=_status_client(401)
    )
    with pytest.raises(FatalModelError, match="\\(401\\)"):
        refusing.json("extract", [])
    with pytest.raises(ModelError, match="^http://127.0.0.1:9/v1: .*attempts"):  # says where and how often
        down().json("extract", [])


def _status_client(status: int):
    import httpx2

    return httpx2.Client(
        transport=httpx2.MockTransport(
            lambda request: httpx2.Response(status, json={"error": {"message": "bad key", "type": "auth"}})
        )
    )


def test_model_parser_and_consolidator_fall_back_to_rules_when_the_endpoint_is_down():
    parser = ModelQueryParser(down())
    assert parser("What did Ann do in May 2023?", "2023-06-01")["time"] == "2023-05"
    assert parser.stats == {"unavailable": 1}
    up = ModelQueryParser(served(FakeTeacher()))
    assert up("anything", "2023-06-01")["keywords"] == ["question"] and up.stats == {"model": 1}
    new = memory_record(
        source_turns=["D2:1"],
        speaker="Ann",
        content="Ann lives in Porto.",
        type="fact",
        location="Porto",
        keywords=["Ann", "home"],
    )
    old = {**new, "source_turns": ["D1:1"], "content": "Ann lives in Lisbon.", "location": "Lisbon"}
    rules = RuleConsolidator(0.88, 0.7)
    assert ModelConsolidator(down(), rules)(new, old, 0.7)["action"] == "SUPERSEDE"  # a fact that moved
    assert ModelConsolidator(served(FakeTeacher()), rules)(new, old, 0.7) == {
        "action": "KEEP_BOTH",
        "memory": None,
    }


def test_replay_of_toy_labels_stores_the_teachers_records(embedder, tmp_path, memory_factory):
    run(
        DatagenConfig.model_validate(
            {
                "source": {"format": "toy", "conversations": 2, "sessions": 2},
                "out": str(tmp_path / "d"),
                "windows": {"window": 10, "overlap": 2, "max_tokens": None},
                "teacher": {"kind": "oracle"},
                "tasks": {"parse_query": False, "consolidate": False},
            }
        ),
        show_progress=False,
    )
    labels = tmp_path / "d" / "labels.jsonl"
    expected = {
        m["id"]
        for line in labels.read_text().splitlines()
        if (row := json.loads(line))["conversation_id"] == "toy-0001"
        for m in row["memories"]
    }
    memory = memory_factory(
        {"windows": {"window": 10, "overlap": 2}}, embedder=embedder, extractor=ReplayExtractor(labels)
    )
    result = memory.add(generate_dialogue(1, seed=0, sessions=2).conversation, user_id="u1")
    assert not result.failed and not result.rejected
    assert {e["id"] for e in result.events} == expected  # every labelled record, under its labelled id
    missing = memory_factory(
        {"windows": {"window": 7, "overlap": 2}},
        store="missing",
        embedder=embedder,
        extractor=ReplayExtractor(labels),
    ).add(generate_dialogue(1, seed=0, sessions=2).conversation, user_id="u1")
    assert missing.failed and all("no stored answer" in why for why in missing.failed.values())


def test_dense_path_follows_appends_removals_and_other_writers(embedder, memory_factory):
    """SQLite: the in-process index reloads from the file's change stamps; Postgres: searched in place."""
    a = memory_factory(embedder=embedder)
    b = memory_factory(embedder=embedder)  # a second writer on the same store
    a.add(MESSAGES, user_id="ann", conversation_id="c1")
    query = embedder.encode(["beagle puppy"])[0]
    assert a.store.lookup.dense("ann", query, 1)[0][0] == "c1/w0000#m1"
    b.add(
        [{"role": "user", "content": "My beagle puppy Biscuit chewed my beagle puppy toy."}],
        user_id="ann",
        conversation_id="c2",
    )
    chewed = embedder.encode(["the puppy chewed a toy"])[0]
    assert a.store.lookup.dense("ann", chewed, 1)[0][0] == "c2/w0000#m1"  # appended by the other writer
    b.delete("c2/w0000#m1", user_id="ann")
    assert "c2/w0000#m1" not in dict(a.store.lookup.dense("ann", chewed, 10))  # a removal reloads
    assert a.store.lookup.dense("bob", query, 10) == []


def _unit_store(tmp_path, n: int, seed: int = 0) -> tuple[SQLiteStore, np.ndarray]:
    """A SQLite store with n records `r<i>` for user "u", each with a random unit vector."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = SQLiteStore(tmp_path / "vectors.sqlite")
    with store.transaction():
        for i, v in enumerate(vectors):
            record = memory_record(
                source_turns=["t"], speaker="A", content=f"x{i}", type="fact", keywords=["k"]
            )
            store.insert("u", {"id": f"r{i}", **record}, v)
    return store, vectors


def test_the_held_dense_index_follows_removals_without_reading_the_user_again(tmp_path):
    """A delete, a revision and an insert by another process's writes reach the held rows as tombstones
    and appended rows, read from the changes alone; once most rows are tombstones they are compacted.
    Every search ranks as an index read from scratch."""
    store, vectors = _unit_store(tmp_path, 60)
    dense = MemoryVectors(store.dialect)
    assert [r for r, _ in dense.search("u", vectors[3], 2)][0] == "r3"
    held, reads = dense.users["u"], []
    dense.db.set_trace_callback(reads.append)
    with store.transaction():
        store.set_status("u", "r3", "deleted", "DELETE")
        store.revise("u", "r5", {"content": "y"}, vectors[3], "UPDATE")
        store.insert("u", {**store.get("u", "r6"), "id": "new"}, vectors[7])
    hits = dense.search("u", vectors[3], 3)
    assert [r for r, _ in hits][:1] == ["r5"] and "r3" not in dict(hits)  # r5 now carries r3's vector
    assert dense.users["u"] is held and len(held.ids) == 62 and len(held.row) == 60  # no reload
    assert not any("SELECT r.id" in q and "seq > 0 " in q for q in reads)  # only the changes were read
    for q in vectors[:10]:
        assert dense.search("u", q, 5) == MemoryVectors(store.dialect).search("u", q, 5)
    with store.transaction():
        for i in range(8, 50):
            store.set_status("u", f"r{i}", "deleted", "DELETE")
    assert [r for r, _ in dense.search("u", vectors[50], 1)] == ["r50"]
    assert len(held.ids) == len(held.row) == 18  # compacted: most rows were tombstones
    assert dense.search("u", vectors[7], 18) == MemoryVectors(store.dialect).search("u", vectors[7], 18)


def test_the_update_paths_vectors_are_as_its_transaction_sees_them(tmp_path):
    """`vectors` answers from the held rows when they are as of the caller's stamp, and from the table when
    the caller's own open write moved it: its uncommitted record is there, the record it deleted is not."""
    store, vectors = _unit_store(tmp_path, 30)
    dense, ids = store.indexes["dense"], [f"r{i}" for i in range(0, 30, 3)]
    with store.transaction(), store.dialect.cursor("u") as sql:
        found, matrix = dense.vectors(sql, "u", ids)
        assert "u" in dense.users  # served from the held rows
        assert found == sorted(ids) and np.array_equal(matrix, vectors[[int(i[1:]) for i in found]])
        store.insert("u", {**store.get("u", "r1"), "id": "r99"}, vectors[4])
        store.set_status("u", "r3", "deleted", "DELETE")
        found, matrix = dense.vectors(sql, "u", [*ids, "r99"])
        assert found == sorted({*ids, "r99"} - {"r3"}) and np.array_equal(matrix[-1], vectors[4])
        assert [r for r, _ in dense.closest(sql, "u", vectors[4], ["r99", "r4", "r3"], 3)] == ["r4", "r99"]
    assert dense.search("u", vectors[4], 2)[1][0] == "r99"  # committed: the held rows follow


def test_the_held_dense_index_drops_the_least_recently_used_users_beyond_its_bound(tmp_path):
    store, vectors = _unit_store(tmp_path, 40)
    with store.transaction():
        for i in range(10):
            store.insert("v", {**store.get("u", "r0"), "id": f"v{i}"}, vectors[i])
    dense = MemoryVectors(store.dialect, max_vectors=45)
    dense.search("u", vectors[0], 1)
    dense.search("v", vectors[0], 1)  # 50 rows held: "u", used least recently, goes
    assert list(dense.users) == ["v"] and dense.held == 10
    assert dense.search("u", vectors[0], 1)[0][0] == "r0" and list(dense.users) == ["u"]


def test_vector_rows_keep_every_row_as_they_grow_and_an_ids_latest_vector():
    """The growing matrix under the held dense index and the update path's batch view."""
    rows, rng = VectorRows(), np.random.default_rng(0)
    first, second = rng.random((200, 8), dtype=np.float32), rng.random((300, 8), dtype=np.float32)
    rows.extend([f"r{i}" for i in range(200)], first)
    rows.extend([f"s{i}" for i in range(300)], second)  # past the first capacity: grown, rows copied
    rows.put("r5", second[0])  # a new vector for a held id takes a row of its own
    assert len(rows) == 501
    assert np.array_equal(rows.rows(["r0", "s299", "r5"]), np.stack([first[0], second[299], second[0]]))
    copy = rows.get("r1")
    copy[:] = 0
    assert np.array_equal(rows.get("r1"), first[1])
    assert rows.pop("s0") == 200 and rows.get("s0") is None and rows.pop("s0") is None


def test_the_dense_path_reads_committed_vectors_while_another_thread_writes(tmp_path, embedder):
    """SQLite: the dense index reads the file through its own connection, so a search's dense path runs
    while another thread holds the runtime's store lock in an open write, and sees only what is
    committed; an in-memory store has one connection and serializes it instead."""
    memory = Memory({"store": str(tmp_path / "m.sqlite")}, embedder=embedder)
    memory.add(MESSAGES, user_id="ann", conversation_id="c1")
    store, query = memory.store, embedder.encode(["a beagle chewing a toy"])[0]
    assert (
        store.concurrent_dense and not Memory({"store": ":memory:"}, embedder=embedder).store.concurrent_dense
    )
    record = {**store.get("ann", "c1/w0000#m1"), "id": "chewed", "content": "Biscuit chewed a toy."}
    with memory.store.lock, store.transaction():  # a write in flight in this thread
        store.insert("ann", record, query)
        during = memory._helpers.submit(store.lookup.dense, "ann", query, 5).result(timeout=10)
    assert "chewed" not in dict(during)  # not committed yet: not seen
    assert store.lookup.dense("ann", query, 1)[0][0] == "chewed"
    result = memory.search("beagle chewing toy", user_id="ann", k=3)
    assert result.hits[0].record["id"] == "chewed" and result.hits[0].paths["dense"]["rank"] == 1
    memory.close()


def test_ann_and_exact_search_agree_on_a_clustered_store(tmp_path):  # SQLite's in-process index only
    rng = np.random.default_rng(0)
    store = SQLiteStore(tmp_path / "ann.sqlite")
    centers = rng.normal(size=(20, 16)).astype(np.float32)
    vectors = centers[rng.integers(0, 20, 2000)] + 0.1 * rng.normal(size=(2000, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with store.transaction():
        for i, v in enumerate(vectors):
            store.insert(
                "u",
                {
                    "id": f"r{i}",
                    **memory_record(
                        source_turns=["t"], speaker="A", content="x", type="fact", keywords=["k"]
                    ),
                },
                v,
            )
    exact, ann = MemoryVectors(store.dialect), MemoryVectors(store.dialect, ann_min_records=1)
    overlap = [
        len({r for r, _ in exact.search("u", q, 10)} & {r for r, _ in ann.search("u", q, 10)}) / 10
        for q in vectors[:50]
    ]
    assert np.mean(overlap) >= 0.95
    assert exact.search("u", vectors[7], 1)[0][0] == ann.search("u", vectors[7], 1)[0][0] == "r7"
    with store.transaction():  # removed records are passed over by the graph, which is not built again
        for i in range(0, 2000, 3):
            store.set_status("u", f"r{i}", "deleted", "DELETE")
    graph = ann.users["u"].ann
    assert ann.search("u", vectors[7], 1)[0][0] == "r7" and ann.users["u"].ann is graph
    hits = [ann.search("u", q, 10) for q in vectors[:50]]
    assert all(int(r[1:]) % 3 for found in hits for r, _ in found)
    overlap = [
        len({r for r, _ in exact.search("u", q, 10)} & {r for r, _ in found}) / 10
        for q, found in zip(vectors[:50], hits)
    ]
    assert np.mean(overlap) >= 0.95


def test_memory_config_builds_the_runtime_and_names_what_is_missing(tmp_path):
    from dimmem.config import ConfigError

    config = tmp_path / "m.yaml"
    config.write_text(
        f"store: {tmp_path / 'm.sqlite'}\n"
        "retrieval: {depth: 7, weights: {bm25: 1, dense: 1, dimension: 0.5}}\n"
    )
    memory = Memory.from_config(config)
    retrieval = memory.config.retrieval
    assert retrieval.depth == 7 and retrieval.weights["dimension"] == 0.5
    assert type(memory.extractor).__name__ == "TurnExtractor"
    for text, problem in (
        ("extractor: model\n", "needs a `model:` section"),
        ("extractor: replay\n", "needs `labels:`"),
        ("retrieval: {depth: many}\n", "retrieval.depth"),
        ("model: {base_url: x}\n", "missing key 'model.model'"),
        ("windows: {window: 4, overlap: 4}\n", "overlap (4) must be smaller"),
        ("model: {model: m, constrained: true}\n", "unknown key 'model.constrained'"),
    ):
        config.write_text(text)
        with pytest.raises(ConfigError, match=f"^{re.escape(str(config))}: .*{re.escape(problem)}"):
            Memory.from_config(config)
    config.write_text(
        "extractor: model\nquery_parser: model\nmodel: {base_url: 'http://127.0.0.1:9/v1', model: m}\n"
    )
    served_memory = Memory.from_config(config, store=":memory:")
    # one client for the model tasks: one rate limit, one usage count
    assert served_memory.extractor.client is served_memory.query_parser.client
    assert type(served_memory.consolidator).__name__ == "RuleConsolidator"


def test_shipped_memory_configs_load():
    from dimmem.config import load_config
    from dimmem.paths import CONFIG_DIR
    from dimmem.runtime.config import MemoryConfig

    for path in sorted((CONFIG_DIR / "memory").glob("*.yaml")):
        config = load_config(MemoryConfig, path)
        if config.model is not None:
            assert config.model.extra_body == THINKING_OFF and config.model.structured_outputs


def test_memory_add_command_extracts_a_chat_file_and_search_finds_it(tmp_path, capsys):
    import argparse
    from pathlib import Path

    from dimmem.runtime import cli

    def main(argv):
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        return cli.run(parser.parse_args(argv))

    chats = Path(__file__).parent / "fixtures" / "chats.jsonl"
    store = str(tmp_path / "m.sqlite")
    assert main(["add", "--format", "chat_jsonl", "--input", str(chats), "--store", store]) == 0
    out = capsys.readouterr().out
    assert "2 conversations" in out and "0 windows without an answer" in out
    assert (
        main(["search", "--store", store, "--user", "chat-1", "--k", "1", "where", "does", "Ann", "live"])
        == 0
    )
    assert "Lisbon" in capsys.readouterr().out.splitlines()[1]


def test_weighted_fusion_and_fitted_weights_on_crafted_rankings():
    from dimmem.runtime.retrieval import rrf
    from eval.retrieval import fit_weights

    paths = {"bm25": [("a", 3.0), ("b", 2.0)], "dense": [("b", 0.9), ("c", 0.8)], "dimension": [("c", 2.0)]}
    assert [rid for rid, _, _ in rrf(paths)][0] == "b"  # on two paths
    assert [rid for rid, _, _ in rrf(paths, {"bm25": 1.0, "dense": 0.0, "dimension": 0.0})] == ["a", "b", "c"]
    assert rrf(paths)[0][2] == {"bm25": {"rank": 2, "score": 2.0}, "dense": {"rank": 1, "score": 0.9}}
    # the evidence is found by the dimension path alone; plain RRF puts the other paths' agreement first
    samples = [
        {
            "conversation": f"c{i}",
            "evidence": {f"t{i}"},
            "sources": {"x": ["t-x"], "y": ["t-y"], "e": [f"t{i}"]},
            "paths": {
                "bm25": [("x", 1.0), ("y", 0.5)],
                "dense": [("x", 1.0), ("y", 0.5)],
                "dimension": [("e", 1.0)],
            },
        }
        for i in range(4)
    ]
    assert all([rid for rid, _, _ in rrf(s["paths"])][0] == "x" for s in samples)
    weights = fit_weights(samples, [1])
    assert weights["dimension"] > weights["dense"] and weights["dimension"] >= 1.0


def test_a_changed_tiny_base_spec_rebuilds_the_base(tmp_path):
    from train.tiny import SPEC_FILE, is_built

    spec = {"tokenizer": "tok", "vocab_size": 600, "hidden_size": 64}
    assert not is_built(tmp_path, 0, **spec)
    (tmp_path / SPEC_FILE).write_text(json.dumps({**spec, "seed": 0, "num_hidden_layers": 2}))
    assert is_built(tmp_path, 0, **spec)
    assert not is_built(tmp_path, 0, **{**spec, "hidden_size": 128}) and not is_built(tmp_path, 1, **spec)


# --- appending to a conversation ----------------------------------------------------


def _turns(memory: Memory, user: str, conversation: str) -> list[tuple[str, str, str]]:
    return [(t.id, t.role, t.text) for t in memory.store.conversations.turns(user, conversation)]


def test_adding_turn_by_turn_extracts_each_new_turn_and_never_rewrites_stored_ones(embedder, memory_factory):
    config = {"windows": {"window": 2, "overlap": 1}}
    memory = memory_factory(config, embedder=embedder)
    results = [memory.add([m], user_id="ann", conversation_id="c1") for m in MESSAGES]  # as mem0 users do
    assert [r.windows for r in results] == [1, 1, 1, 1]
    assert [[e["id"] for e in r.events] for r in results] == [["c1/w0000#m1"], [], ["c1/w0002#m1"], []]
    whole = memory_factory(config, store="whole", embedder=embedder)
    whole.add(MESSAGES, user_id="ann", conversation_id="c1")
    # the same turns, ids and records as one add of the whole conversation
    assert _turns(memory, "ann", "c1") == _turns(whole, "ann", "c1")
    assert [t[0] for t in _turns(memory, "ann", "c1")] == ["S1:1", "S1:2", "S1:3", "S1:4"]
    pointers = [(r["source_turns"], r["content"]) for r in memory.store.records("ann")]
    assert pointers == [(r["source_turns"], r["content"]) for r in whole.store.records("ann")]
    assert [p for p, _ in pointers] == [["S1:1"], ["S1:3"]]
    # the pointer still resolves to the text the record came from, and recall finds the assistant's reply
    text = {t[0]: t[2] for t in _turns(memory, "ann", "c1")}
    assert text["S1:1"] == MESSAGES[0]["content"] and text["S1:3"] == MESSAGES[2]["content"]
    recalled = memory.search("What did you recommend for my beagle Biscuit?", user_id="ann", k=1)
    assert recalled.query["need_assistant_context"]
    assert [c["text"] for c in recalled.assistant_context] == [MESSAGES[1]["content"]]


def test_resending_the_whole_history_extracts_only_what_is_new(embedder, memory_factory):
    memory = memory_factory({"windows": {"window": 2, "overlap": 1}}, embedder=embedder)
    first = memory.add(MESSAGES[:2], user_id="ann", conversation_id="c1")
    second = memory.add(MESSAGES, user_id="ann", conversation_id="c1")  # the client resends everything
    assert [e["id"] for e in first.events] == ["c1/w0000#m1"]
    assert second.windows == 2 and [e["id"] for e in second.events] == ["c1/w0001#m1"]  # S1:3 and S1:4
    assert memory.get("c1/w0001#m1", user_id="ann")["source_turns"] == ["S1:3"]
    assert [t[2] for t in _turns(memory, "ann", "c1")] == [m["content"] for m in MESSAGES]
    again = memory.add(MESSAGES, user_id="ann", conversation_id="c1")
    assert (again.windows, again.events) == (0, []) and memory.store.count("ann") == 2
    # a new message that happens to repeat an earlier one is a new turn, not a resend
    repeat = memory.add([MESSAGES[2]], user_id="ann", conversation_id="c1")
    assert [t[0] for t in _turns(memory, "ann", "c1")][-1] == "S1:5"
    assert [e["id"] for e in repeat.events] == ["c1/w0003#m1"]  # (merged with the record it repeats)


def test_a_client_turn_id_that_names_a_stored_turn_with_other_text_is_refused(embedder, memory_factory):
    memory = memory_factory(embedder=embedder)
    memory.add(
        [{"role": "user", "content": "I live in Oslo.", "id": "m1"}], user_id="ann", conversation_id="c1"
    )
    with pytest.raises(ValueError, match="turn 'm1' is stored with other text"):
        memory.add(
            [{"role": "user", "content": "I live in Rome.", "id": "m1"}], user_id="ann", conversation_id="c1"
        )
    same = memory.add(
        [{"role": "user", "content": "I live in Oslo.", "id": "m1"}], user_id="ann", conversation_id="c1"
    )
    assert same.events == [] and _turns(memory, "ann", "c1") == [("m1", "user", "I live in Oslo.")]
    memory.add(
        [{"role": "user", "content": "I moved to Rome.", "id": "m2"}], user_id="ann", conversation_id="c1"
    )
    assert [t[0] for t in _turns(memory, "ann", "c1")] == ["m1", "m2"] and memory.store.count("ann") == 2
    with pytest.raises(ValueError, match="stored with other text"):  # add_records keeps the same rule
        memory.add_records([], user_id="ann", conversation=_conversation("c1", [("m1", "I live in Bergen.")]))


def _conversation(conversation_id: str, turns: list[tuple[str, str]]):
    from dimmem.contract.conversation import Conversation, Turn

    return Conversation(
        conversation_id,
        [Turn(i, "Ann", "participant", text, i.split(":")[0], "2024-01-01") for i, text in turns],
    )


def test_a_longer_conversation_object_continues_the_windows_after_the_stored_ones(embedder, memory_factory):
    turns = [(f"D1:{i}", f"Ann mentioned topic number {i} today.") for i in range(1, 9)]
    memory = memory_factory({"windows": {"window": 3, "overlap": 1}}, embedder=embedder)
    first = memory.add(_conversation("lc", turns[:4]), user_id="ann")
    second = memory.add(_conversation("lc", turns), user_id="ann")
    assert first.windows == 2 and second.windows == 2  # D1:5..D1:8 only, with D1:4 as context
    ids = [r["id"] for r in memory.store.records("ann", status=None)]
    assert len(ids) == len(set(ids)) == 8 and {i.split("#")[0] for i in ids} == {
        f"lc/w000{n}" for n in range(4)
    }
    cited = {t for r in memory.store.records("ann", status=None) for t in r["source_turns"]}
    assert cited == {t for t, _ in turns}  # every turn extracted once, none lost


def test_a_memory_repeated_word_for_word_is_kept_once():
    """A served model stuck in a loop repeats its last record until the budget: the repeats are one record
    (and counted), a different record after them is kept."""
    from dimmem.contract.windows import make_windows
    from dimmem.runtime.extractors import keep_valid

    window = make_windows(generate_dialogue(3, seed=0).conversation, 6, 0)[0]
    speaker = window.new[0].speaker
    same = memory_record(source_turns=["t1"], speaker=speaker, content=f"{speaker} said hi.", type="fact")
    same["keywords"] = [speaker]
    other = {**same, "content": f"{speaker} said bye."}
    kept = keep_valid(window, {"memories": [same, same, same, other]})
    assert [r["content"] for r in kept.records] == [same["content"], other["content"]]
    assert kept.repeated == 2 and not kept.issues
