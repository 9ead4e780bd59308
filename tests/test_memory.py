"""The memory runtime: user isolation, durability under SIGKILL, concurrent writers, history, and each
retrieval path finding what it should, with the real MiniLM embedder."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dimmem.conversation import Conversation, Turn
from dimmem.memory import Memory
from dimmem.query import parse_query_rules
from dimmem.store import MIGRATIONS, MemoryStore


def rec(**fields):
    base = {"source_turns": ["D1:1"], "speaker": "Ann", "content": "Ann said something.", "type": "episodic",
            "time": None, "location": None, "reason": None, "purpose": None, "keywords": ["Ann"]}
    return {**base, **fields}


HIKE_APRIL = rec(id="hike-apr", content="Ann went hiking at Eagle Peak.", time="2023-04-02",
                 keywords=["Ann", "hiking", "Eagle Peak", "dog"], location="Eagle Peak")
HIKE_MAY = rec(id="hike-may", content="Ann explored the river trail on foot.", time="2023-05-06",
               keywords=["Ann", "walk", "river trail"], location="river trail", source_turns=["D2:3"])
JAZZ = rec(id="jazz", type="profile", content="Ann loves jazz and listens to it every evening.", keywords=["Ann", "jazz", "music"])


@pytest.fixture(scope="module")
def embedder():
    from dimmem.embed import Embedder

    return Embedder()


@pytest.fixture
def memory(embedder, tmp_path):
    return Memory(tmp_path / "m.sqlite", embedder=embedder)


def test_users_never_see_each_other(memory):
    memory.add_records([HIKE_APRIL, JAZZ], user_id="ann")
    memory.add_records([rec(id="bob-jazz", speaker="Bob", content="Bob plays jazz piano.", type="profile",
                            keywords=["Bob", "jazz", "piano"])], user_id="bob")
    ann_hits = memory.search("jazz", "ann").hits
    assert ann_hits[0].record["id"] == "jazz" and all(h.record["user_id"] == "ann" for h in ann_hits)
    assert all(h.record["user_id"] == "bob" for h in memory.search("jazz music Ann", "bob").hits)
    assert memory.get("jazz", "bob") is None and memory.history("jazz", "bob") == []
    with pytest.raises(KeyError):
        memory.delete("jazz", "bob")
    assert memory.get("jazz", "ann")["status"] == "active"
    assert memory.search("hiking", "carol").hits == []
    memory.add_records([{**JAZZ, "speaker": "Carol", "keywords": ["Carol", "jazz"], "content": "Carol hates jazz."}], "carol")
    assert memory.get("jazz", "carol")["content"] == "Carol hates jazz."  # the same id under another user
    assert memory.get("jazz", "ann")["content"] == JAZZ["content"]


def test_time_constrained_query_prefers_the_right_date(memory):
    memory.add_records([HIKE_APRIL, HIKE_MAY], user_id="ann")
    result = memory.search("Where did Ann go hiking in May 2023?", "ann", k=2, reference_date="2023-07-01")
    assert result.query["time"] == "2023-05"
    dense = {h.record["id"]: h.paths.get("dense", {}).get("rank") for h in result.hits}
    assert dense["hike-apr"] < dense["hike-may"]  # April is semantically closer ("hiking")...
    assert [h.record["id"] for h in result.hits] == ["hike-may", "hike-apr"]  # ...but May is the right date
    assert result.hits[0].paths["dimension"]["rank"] == 1


def test_each_path_finds_its_own_evidence(memory):
    memory.add_records([HIKE_APRIL, HIKE_MAY, JAZZ], user_id="ann")
    lexical = memory.search("Eagle Peak", "ann", k=3).hits
    assert lexical[0].record["id"] == "hike-apr" and lexical[0].paths["bm25"]["rank"] == 1
    semantic = memory.search("What kind of music does she enjoy?", "ann", k=3).hits
    assert semantic[0].record["id"] == "jazz" and semantic[0].paths["dense"]["rank"] == 1
    by_type = memory.search("tell me about her", "ann", k=3, parsed={**parse_query_rules("x"), "target_types": ["profile"],
                                                                     "keywords": ["music"]}).hits
    assert by_type[0].record["id"] == "jazz" and by_type[0].paths["dimension"]["rank"] == 1


def test_supersede_keeps_history_and_hides_the_old_version(memory):
    old = rec(id="home-1", type="fact", content="Ann lives in Denver.", keywords=["Ann", "home", "Denver"])
    new = rec(id="home-2", type="fact", content="Ann moved to Austin and lives in Austin now.", time="2023-06",
              keywords=["Ann", "home", "Austin"], source_turns=["D3:2"])
    memory.add_records([old], "ann")
    [event] = memory.add_records([new], "ann")
    assert event == {"id": "home-2", "action": "SUPERSEDE", "target": "home-1"}
    assert memory.get("home-1", "ann")["status"] == "superseded"
    assert [h.record["id"] for h in memory.search("Where does Ann live?", "ann").hits] == ["home-2"]
    history = memory.history("home-1", "ann")
    assert [h["action"] for h in history] == ["ADD", "SUPERSEDED_BY home-2"]
    assert history[0]["record"]["content"] == "Ann lives in Denver."


def test_merge_keeps_one_richer_record_and_a_bad_decision_changes_nothing(memory, embedder, tmp_path):
    first = rec(id="trip-1", content="Ann went camping at the lake.", time="2023-07-01", keywords=["Ann", "camping", "lake"])
    again = rec(id="trip-2", content="Ann went camping at the lake with her kids to watch the stars.", time="2023-07-01",
                keywords=["Ann", "camping", "kids"], source_turns=["D4:2"])
    memory.add_records([first], "ann")
    assert memory.add_records([again], "ann") == [{"id": "trip-2", "action": "MERGE", "target": "trip-1"}]
    kept = memory.get("trip-1", "ann")
    assert kept["content"] == again["content"] and kept["keywords"] == ["Ann", "camping", "lake", "kids"]
    assert kept["source_turns"] == ["D1:1", "D4:2"] and memory.get("trip-2", "ann")["status"] == "merged"
    assert [h["action"] for h in memory.history("trip-1", "ann")] == ["ADD", "MERGE trip-2"]

    broken = Memory(tmp_path / "b.sqlite", embedder=embedder,
                    consolidator=lambda new, old, sim: {"action": "MERGE", "memory": {**new, "time": "someday"}})
    broken.add_records([first], "ann")
    assert broken.add_records([again], "ann")[0]["action"] == "KEEP_BOTH"
    assert broken.stats["invalid_consolidations"] == 1 and broken.get("trip-1", "ann")["content"] == first["content"]


def test_update_and_delete_are_versioned(memory):
    memory.add_records([JAZZ], "ann")
    memory.update("jazz", "ann", content="Ann loves jazz, especially Coltrane.")
    memory.delete("jazz", "ann")
    history = memory.history("jazz", "ann")
    assert [(h["version"], h["action"]) for h in history] == [(1, "ADD"), (2, "UPDATE"), (3, "DELETE")]
    assert [h["record"]["content"] for h in history][:2] == [JAZZ["content"], "Ann loves jazz, especially Coltrane."]
    assert memory.search("jazz Coltrane", "ann").hits == []
    with pytest.raises(ValueError, match="time_format"):
        memory.add_records([rec(time="last May")], "ann")


def test_candidates_come_from_the_index_not_all_pairs(memory):
    memory.add_records([HIKE_APRIL, JAZZ, rec(id="tea", type="profile", content="Ann prefers tea.", keywords=["Ann", "tea"])], "ann")
    before = dict(memory.stats)
    memory.add_records([rec(id="jazz-2", type="profile", content="Ann listens to jazz records.", keywords=["Ann", "jazz"])], "ann")
    assert memory.stats["embedding_comparisons"] - before.get("embedding_comparisons", 0) == 1  # only the jazz profile
    assert memory.stats["baseline_comparisons"] - before.get("baseline_comparisons", 0) == 3


def test_assistant_recall_follows_the_pointer(memory):
    conv = Conversation("chat", [
        Turn("S1:1", "ann", "user", "Can you suggest a pasta recipe?", "S1", "2023-05-20T02:21"),
        Turn("S1:2", "assistant", "assistant", "Try lemon garlic spaghetti.", "S1", "2023-05-20T02:21"),
        Turn("S1:3", "ann", "user", "I adopted a cat.", "S1", "2023-05-20T02:21")])
    memory.add_records([rec(id="pasta", speaker="ann", content="Ann asked for a weeknight pasta recipe.",
                            keywords=["ann", "pasta recipe"], source_turns=["S1:1"], conversation_id="chat")], "ann", conv)
    plain = memory.search("What pasta did Ann ask about?", "ann")
    assert plain.assistant_context == []
    recalled = memory.search("What pasta recipe did you suggest?", "ann")
    assert recalled.query["need_assistant_context"] and [t["text"] for t in recalled.assistant_context] == ["Try lemon garlic spaghetti."]
    assert memory.stats["assistant_recalls"] == 1


def test_export_import_round_trip(memory, tmp_path, embedder):
    memory.add_records([HIKE_APRIL, JAZZ], "ann")
    assert memory.export_jsonl("ann", tmp_path / "ann.jsonl") == 2
    other = Memory(tmp_path / "other.sqlite", embedder=embedder)
    assert other.import_jsonl("ann", tmp_path / "ann.jsonl") == 2
    assert other.get("jazz", "ann")["content"] == JAZZ["content"]


def test_migrations_are_recorded(tmp_path):
    store = MemoryStore(tmp_path / "s.sqlite")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    store.close()
    assert MemoryStore(tmp_path / "s.sqlite").migrate() == len(MIGRATIONS)  # re-opening applies nothing twice


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from dimmem.store import MemoryStore
    store = MemoryStore(sys.argv[1])
    user, start, count, pause = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    import time
    for i in range(start, start + count):
        rec = {"id": f"{user}-{i}", "type": "fact", "speaker": "Ann", "content": f"fact {i}", "time": None,
               "location": None, "reason": None, "purpose": None, "keywords": ["Ann", f"k{i}"], "source_turns": ["D1:1"]}
        with store.transaction():
            store.insert(user, rec, np.ones(4, dtype=np.float32))
            time.sleep(pause)  # inside the transaction: a kill here must leave no partial record
        print(i, flush=True)
""")


@pytest.mark.integration
def test_sigkill_mid_add_leaves_no_partial_record(tmp_path):
    db = tmp_path / "k.sqlite"
    MemoryStore(db).close()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db), "ann", "0", "1000", "0.02"], stdout=subprocess.PIPE, text=True)
    committed = [proc.stdout.readline() for _ in range(10)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = MemoryStore(db)
    records = store.records("ann")
    assert len(records) >= len(committed)  # nothing committed was lost
    for r in records:  # and whatever is there is whole: index, vector and history entries with it
        assert store.history("ann", r["id"]) and store.candidates("ann", "fact", [r["keywords"][1]]) == [r["id"]]
    _, ids, _ = store.vectors_after("ann", 0)
    assert sorted(ids) == sorted(r["id"] for r in records) and store.vector_state("ann") == (len(records), 0)
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.integration
def test_concurrent_writers_lose_nothing(tmp_path):
    db = tmp_path / "c.sqlite"
    MemoryStore(db).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(db), "ann", str(n * 100), "60", "0"],
                              stdout=subprocess.DEVNULL) for n in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert len(MemoryStore(db).records("ann")) == 240


@pytest.mark.slow
def test_memory_cli_loads_labels_and_searches(tmp_path, capsys):
    from data_gen.config import DatagenConfig
    from data_gen.run import run
    from dimmem.cli import main

    run(DatagenConfig.model_validate({"source": {"format": "toy", "conversations": 3}, "out": str(tmp_path / "d"),
                                      "windows": {"window": 12, "overlap": 3, "max_tokens": None},
                                      "teacher": {"kind": "oracle"}, "tasks": {"parse_query": False, "consolidate": False}}),
        show_progress=False)
    assert main(["memory", "load", "--labels", str(tmp_path / "d" / "labels.jsonl"), "--store", str(tmp_path / "m.sqlite")]) == 0
    loaded = capsys.readouterr().out
    assert "for 3 users" in loaded and "fewer)" in loaded
    assert main(["memory", "search", "--store", str(tmp_path / "m.sqlite"), "--user", "toy-0000", "--k", "3", "where", "does", "he", "live"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("query: 'where does he live'") and lines[1].startswith("1. [") and "#1" in "".join(lines[1:])
