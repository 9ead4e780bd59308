"""The record's shape has one definition, the contract (`dimmem.contract.records`): every place that
stores, indexes, scores or serves a record follows it, each backend's tables hold every stored column,
and the retrieval indexes are chosen by name. A field added to the contract fails here until each of
them has it (or, for the lexical text, until it is declared not to be text). The record log's own
surface is fixed here too: another job of the store is a part of its own, not one more method."""

from __future__ import annotations

import typing

import pytest

from dimmem.contract.records import DIMENSIONS, MEMORY_FIELDS, MemoryRecord, memory_record
from dimmem.runtime import lexical
from dimmem.runtime.memory import Memory
from dimmem.runtime.stores import RecordLog, open_store, schema
from dimmem.runtime.stores.indexes import INDEXES
from dimmem.runtime.stores.sqlite import SQLiteStore

NOT_TEXT = {"source_turns", "speaker", "type", "time"}  # what the lexical path leaves to other paths


def test_every_contract_field_is_stored_indexed_scored_and_served():
    from eval import metrics
    from serve.schemas import ExtractedMemory, StoredMemory, UpdateRequest

    assert set(MEMORY_FIELDS) <= set(schema.COLUMNS)
    assert set(lexical.FIELDS) | NOT_TEXT == set(MEMORY_FIELDS)  # each field indexed or declared not text
    nullable_text = {n for n, f in MemoryRecord.model_fields.items() if f.annotation == (str | None)}
    assert set(DIMENSIONS) == nullable_text - {"time"} >= {"location", "reason", "purpose"}
    assert metrics.DIMENSIONS == DIMENSIONS
    assert set(MEMORY_FIELDS) <= set(ExtractedMemory.model_fields)
    assert set(schema.COLUMNS) <= set(StoredMemory.model_fields)
    assert set(MEMORY_FIELDS) - {"speaker", "source_turns"} <= set(UpdateRequest.model_fields)
    assert list(memory_record()) == list(MEMORY_FIELDS)
    lists = {n for n, f in MemoryRecord.model_fields.items() if typing.get_origin(f.annotation) is list}
    assert set(schema.LIST_FIELDS) == lists and all(memory_record()[n] == [] for n in lists)
    with pytest.raises(ValueError, match="not contract fields"):
        memory_record(mood="calm")


def test_the_lexical_text_is_every_text_field():
    record = memory_record(content="Ann hiked", keywords=["Alps"], location="Zermatt", purpose="training")
    assert set(lexical.document(record)) == {"ann", "hike", "alp", "zermatt", "train"}


def test_sqlite_tables_hold_every_stored_column(tmp_path):
    store = SQLiteStore(tmp_path / "s.sqlite")
    try:
        columns = {r["name"]: r["type"] for r in store.dialect.db.execute("PRAGMA table_info(records)")}
    finally:
        store.close()
    assert set(schema.COLUMNS) <= set(columns)
    assert all(columns[name] == "TEXT" for name in schema.LIST_FIELDS)  # JSON text


@pytest.mark.integration
def test_postgres_tables_hold_every_stored_column(pg_server):
    import psycopg

    url = pg_server.fresh_database()
    with psycopg.connect(url) as conn:
        columns = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'records'"
            ).fetchall()
        )
    assert set(schema.COLUMNS) <= set(columns)
    assert all(columns[name] == "ARRAY" for name in schema.LIST_FIELDS)
    assert columns["t_start"] == columns["t_end"] == "date"


def test_indexes_are_chosen_by_name_and_refused_where_they_cannot_run(tmp_path):
    assert {name: entry[2] for name, entry in INDEXES.items()} == {
        "bm25": "lexical",
        "memory": "dense",
        "pgvector": "dense",
    }
    store = open_store(str(tmp_path / "a.sqlite"), indexes={"dense": "memory", "lexical": "bm25"})
    assert [type(i).__name__ for i in store.indexes.values()] == ["LexicalIndex", "MemoryVectors"]
    store.close()
    for indexes, message in [
        ({"dense": "qdrant"}, "unknown index 'qdrant'; known: \\['bm25', 'memory', 'pgvector'\\]"),
        ({"dense": "bm25"}, "'bm25' is a lexical index"),
        ({"dense": "pgvector"}, "'pgvector' runs on postgres, not sqlite"),
        ({"sparse": "bm25"}, "unknown path"),
    ]:
        with pytest.raises(ValueError, match=message):
            open_store(str(tmp_path / "b.sqlite"), indexes=indexes)
    with pytest.raises(Exception, match="indexes"):
        Memory({"store": str(tmp_path / "c.sqlite"), "indexes": {"dense": "nope"}}, embedder=None)


def test_the_record_log_keeps_its_surface(tmp_path):
    """Schema and health, the lifecycle, the reads; the conversation log, the retrieval paths' lookups
    and moving a store are parts of their own (`conversations`, `lookup`, `stores.transfer`)."""
    public = {name for name, value in vars(RecordLog).items() if callable(value) and not name.startswith("_")}
    assert public == {
        *("migrate", "schema_version", "ping", "transaction", "close"),
        *("insert", "revise", "set_status", "restore"),
        *("get", "get_many", "page", "records", "count", "history"),
    }
    store = open_store(str(tmp_path / "s.sqlite"))
    assert [type(store.conversations).__name__, type(store.lookup).__name__] == ["ConversationLog", "Lookup"]
    store.close()
