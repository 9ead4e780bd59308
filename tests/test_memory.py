"""The memory runtime: user isolation, durability under SIGKILL, concurrent writers, history, and each
retrieval path finding what it should, with the real MiniLM embedder; each behaviour on both store
backends (the `backend` fixture of tests/conftest.py: SQLite, and Postgres as an integration test)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import numpy as np
import pytest

from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.records import memory_record
from dimmem.runtime import keyword_arms
from dimmem.runtime.consolidate import RuleConsolidator
from dimmem.runtime.memory import Memory, RecordStateError
from dimmem.runtime.query import parse_query_rules
from dimmem.runtime.stores import open_store, transfer
from dimmem.runtime.stores.schema import migrations
from dimmem.runtime.stores.sqlite import SQLiteStore

MIGRATIONS = migrations("sqlite")


def rec(**fields):
    base = memory_record(
        source_turns=["D1:1"], speaker="Ann", content="Ann said something.", type="episodic", keywords=["Ann"]
    )
    return {**base, **fields}


HIKE_APRIL = rec(
    id="hike-apr",
    content="Ann went hiking at Eagle Peak.",
    time="2023-04-02",
    keywords=["Ann", "hiking", "Eagle Peak", "dog"],
    location="Eagle Peak",
)
HIKE_MAY = rec(
    id="hike-may",
    content="Ann explored the river trail on foot.",
    time="2023-05-06",
    keywords=["Ann", "walk", "river trail"],
    location="river trail",
    source_turns=["D2:3"],
)
JAZZ = rec(
    id="jazz",
    type="profile",
    content="Ann loves jazz and listens to it every evening.",
    keywords=["Ann", "jazz", "music"],
)


@pytest.fixture
def memory(embedder, memory_factory):
    return memory_factory(embedder=embedder)


LOOSE = {"restate_similarity": 0.6}  # these short texts' rewordings count as restatements
RULES = RuleConsolidator(**LOOSE, restate_overlap=0.7)


@pytest.fixture
def loose(embedder, memory_factory):
    """The rules merging from cosine 0.6, where these short texts' rewordings meet (the default, 0.88,
    merges near restatements only): what the decisions and their writes do, not when they happen."""
    return memory_factory({"update": LOOSE}, store="loose", embedder=embedder)


def test_users_never_see_each_other(memory):
    memory.add_records([HIKE_APRIL, JAZZ], user_id="ann")
    memory.add_records(
        [
            rec(
                id="bob-jazz",
                speaker="Bob",
                content="Bob plays jazz piano.",
                type="profile",
                keywords=["Bob", "jazz", "piano"],
            )
        ],
        user_id="bob",
    )
    ann_hits = memory.search("jazz", user_id="ann").hits
    assert ann_hits[0].record["id"] == "jazz" and all(h.record["user_id"] == "ann" for h in ann_hits)
    assert all(h.record["user_id"] == "bob" for h in memory.search("jazz music Ann", user_id="bob").hits)
    assert memory.get("jazz", user_id="bob") is None and memory.history("jazz", user_id="bob") == []
    with pytest.raises(KeyError):
        memory.delete("jazz", user_id="bob")
    assert memory.get("jazz", user_id="ann")["status"] == "active"
    assert memory.search("hiking", user_id="carol").hits == []
    memory.add_records(
        [{**JAZZ, "speaker": "Carol", "keywords": ["Carol", "jazz"], "content": "Carol hates jazz."}],
        user_id="carol",
    )
    # the same id under another user
    assert memory.get("jazz", user_id="carol")["content"] == "Carol hates jazz."
    assert memory.get("jazz", user_id="ann")["content"] == JAZZ["content"]


def test_time_constrained_query_prefers_the_right_date(memory):
    memory.add_records([HIKE_APRIL, HIKE_MAY], user_id="ann")
    result = memory.search(
        "Where did Ann go hiking in May 2023?", user_id="ann", k=2, reference_date="2023-07-01"
    )
    assert result.query["time"] == "2023-05"
    dense = {h.record["id"]: h.paths.get("dense", {}).get("rank") for h in result.hits}
    assert dense["hike-apr"] < dense["hike-may"]  # April is semantically closer ("hiking")...
    assert [h.record["id"] for h in result.hits] == ["hike-may", "hike-apr"]  # ...but May is the right date
    assert result.hits[0].paths["dimension"]["rank"] == 1


# What a tiny extractor wrote for a toy conversation: short, repetitive, some all but empty ("Alice"),
# one whose time disagrees with the date its own text names (the model's own slip).
TINY_MODEL_RECORDS = [
    rec(id=f"t{i:02d}", content=content, time=time, keywords=keywords, source_turns=[f"D1:{i + 1}"])
    for i, (content, time, keywords) in enumerate(
        [
            ("Dev is going to visit her parents on 2023-03-12.", "2023-03-22", ["Dev", "parents"]),
            ("Alice", None, ["Alice"]),
            ("Alice", None, ["Alice", "Dev"]),
            ("Dev went to the market.", "2023-03-01", ["Dev", "market"]),
            ("Dev lives in Porto.", None, ["Dev", "Porto"]),
            ("Dev works as a nurse.", None, ["Dev", "nurse"]),
            ("Dev's sister Alice visited Dev on 2023-02-11.", "2023-02-11", ["Dev", "Alice", "sister"]),
            ("Dev likes jazz.", None, ["Dev", "jazz"]),
            ("Dev likes jazz music.", None, ["Dev", "jazz", "music"]),
            ("Dev went hiking.", "2023-03-04", ["Dev", "hiking"]),
            ("Dev went hiking with Alice.", "2023-03-05", ["Dev", "hiking", "Alice"]),
            ("Dev is going to the cinema.", "2023-03-18", ["Dev", "cinema"]),
            ("Dev adopted a cat.", "2023-01-20", ["Dev", "cat"]),
            ("Dev's cat is named Miso.", None, ["Dev", "cat", "Miso"]),
            ("Dev is planning a trip.", None, ["Dev", "trip"]),
            ("Dev", None, ["Dev"]),
            ("Dev visited Dev.", "2023-03-12", ["Dev"]),
            ("Dev is going to Dev on 2023-03-12.", "2023-03-12", ["Dev"]),
            ("Dev met Alice on 2023-03-12.", "2023-03-12", ["Dev", "Alice"]),
            ("Dev cooked dinner.", "2023-03-12", ["Dev", "dinner"]),
            ("Dev bought a bike.", "2023-03-10", ["Dev", "bike"]),
            ("Dev read a book.", "2023-03-11", ["Dev", "book"]),
            ("Dev is learning Spanish.", None, ["Dev", "Spanish"]),
            ("Dev's parents live in Lisbon.", None, ["Dev", "parents", "Lisbon"]),
        ]
    )
]


def test_a_record_comes_back_for_its_own_words_whatever_date_the_query_names(memory):
    """A time the query names ranks, it does not exclude: the record whose content is the query comes among
    the first though its time disagrees with the date it names (the records of that date, which also
    match its words, may come before it); and a record no path lifts never comes back."""
    memory.add_records(TINY_MODEL_RECORDS, user_id="ann", consolidate=False)
    for record in TINY_MODEL_RECORDS[:1] + TINY_MODEL_RECORDS[3:]:
        result = memory.search(record["content"], user_id="ann", k=10)
        ids = [hit.record["id"] for hit in result.hits]
        assert record["id"] in ids[:3], (record["content"], result.query.get("time"), ids)
    dev = memory.search("Dev is going to visit her parents on 2023-03-12.", user_id="ann", k=10)
    assert dev.query["time"] == "2023-03-12" and "t00" in [hit.record["id"] for hit in dev.hits[:3]]
    assert all(hit.score > 0 for hit in dev.hits) and "t01" not in [hit.record["id"] for hit in dev.hits]


def test_each_path_finds_its_own_evidence(memory):
    memory.add_records([HIKE_APRIL, HIKE_MAY, JAZZ], user_id="ann")
    lexical = memory.search("Eagle Peak", user_id="ann", k=3).hits
    assert lexical[0].record["id"] == "hike-apr" and lexical[0].paths["bm25"]["rank"] == 1
    semantic = memory.search("What kind of music does she enjoy?", user_id="ann", k=3).hits
    assert semantic[0].record["id"] == "jazz" and semantic[0].paths["dense"]["rank"] == 1
    by_type = memory.search(
        "tell me about her",
        user_id="ann",
        k=3,
        parsed={**parse_query_rules("x"), "target_types": ["profile"], "keywords": ["music"]},
    ).hits
    assert by_type[0].record["id"] == "jazz" and by_type[0].paths["dimension"]["rank"] == 1


DENVER = rec(
    id="home-1",
    type="fact",
    content="Ann lives in Denver.",
    location="Denver",
    keywords=["Ann", "home", "Denver"],
    session_time="2023-05-02T10:00",
)


def test_supersede_keeps_history_and_hides_the_old_version(loose):
    memory = loose
    old = DENVER
    new = rec(
        id="home-2",
        type="fact",
        content="Ann moved to Austin and lives in Austin now.",
        time="2023-06",
        location="Austin",
        keywords=["Ann", "home", "Austin"],
        source_turns=["D3:2"],
        session_time="2023-06-20T10:00",
    )
    memory.add_records([old], user_id="ann")
    [event] = memory.add_records([new], user_id="ann")
    assert event == {"id": "home-2", "action": "SUPERSEDE", "target": "home-1"}
    assert memory.get("home-1", user_id="ann")["status"] == "superseded"
    assert [h.record["id"] for h in memory.search("Where does Ann live?", user_id="ann").hits] == ["home-2"]
    history = memory.history("home-1", user_id="ann")
    assert [h["action"] for h in history] == ["ADD", "SUPERSEDED_BY home-2"]
    assert history[0]["record"]["content"] == "Ann lives in Denver."


def test_time_decides_and_a_wrong_decision_is_undone(memory):
    """A move told in a later session supersedes the earlier home whatever the arrival order: the older
    record arriving last becomes history (HISTORY). Nothing is lost: the history says what replaced
    what, and restore brings a superseded record back beside the one that replaced it."""
    early = DENVER
    late = {**early, "id": "home-2", "content": "Ann lives in Austin now.", "location": "Austin"}
    late |= {"keywords": ["Ann", "home", "Austin"], "session_time": "2023-06-20T10:00"}
    assert memory.add_records([late], user_id="ann")[0]["action"] == "KEEP_BOTH"
    assert memory.add_records([early], user_id="ann") == [
        {"id": "home-1", "action": "HISTORY", "target": "home-2"}
    ]
    assert [r["id"] for r in memory.get_all(user_id="ann").memories] == ["home-2"]
    assert [h["action"] for h in memory.history("home-1", user_id="ann")] == ["ADD", "SUPERSEDED_BY home-2"]
    restored = memory.restore("home-1", user_id="ann")  # the undo: both are active again
    assert restored["status"] == "active"
    assert sorted(r["id"] for r in memory.get_all(user_id="ann").memories) == ["home-1", "home-2"]
    assert memory.history("home-1", user_id="ann")[-1]["action"] == "RESTORE"
    assert "home-1" in [h.record["id"] for h in memory.search("Where does Ann live?", user_id="ann").hits]
    with pytest.raises(RecordStateError, match="only deleted, superseded or merged records"):
        memory.restore("home-1", user_id="ann")


def test_a_changed_home_or_job_in_other_words_replaces_the_earlier_telling(memory):
    """Where a person lives, told later with another place in other words (no shared keyword, another
    type), and a new job after their old one, supersede the earlier tellings on the defaults; another
    person's home and a past home stay beside; the superseded home is found no more."""
    told = {"session_time": "2023-08-01T10:00", "source_turns": ["D5:1"]}
    berlin = rec(id="home-b", type="fact", content="Jonas lives in Berlin.", location="Berlin")
    berlin |= {"speaker": "Jonas", "keywords": ["Jonas", "Berlin"], "session_time": "2023-01-05T10:00"}
    nurse = {**berlin, "id": "job-1", "content": "Jonas works as a nurse at Charite.", "location": None}
    nurse |= {"keywords": ["Jonas", "nurse", "Charite"]}
    memory.add_records([berlin, nurse], user_id="j")
    parents = rec(id="parents", content="Jonas's parents live in Lisbon.", location="Lisbon", **told)
    past = rec(id="past", content="Jonas lived in Paris as a kid.", location="Paris", **told)
    past["session_time"] = "2023-03-01T10:00"
    for r in (parents, past):
        r |= {"speaker": "Jonas", "keywords": ["Jonas", r["location"]]}
    assert [e["action"] for e in memory.add_records([parents, past], user_id="j")] == ["KEEP_BOTH"] * 2
    munich = rec(id="home-m", content="Jonas moved to Munich for a new job.", location="Munich", **told)
    munich |= {"speaker": "Jonas", "keywords": ["Jonas", "Munich", "new job"]}
    teacher = rec(id="job-2", content="Jonas got a new job as a teacher.", **told)
    teacher |= {"speaker": "Jonas", "keywords": ["Jonas", "teacher"], "source_turns": ["D5:2"]}
    events = memory.add_records([munich, teacher], user_id="j")
    assert events == [
        {"id": "home-m", "action": "SUPERSEDE", "target": "home-b"},
        {"id": "job-2", "action": "SUPERSEDE", "target": "job-1"},
    ]
    active = {r["id"] for r in memory.get_all(user_id="j").memories}
    assert active == {"home-m", "job-2", "parents", "past"}
    found = [h.record["id"] for h in memory.search("Where does Jonas live now?", user_id="j", k=3).hits]
    assert "home-m" in found and "home-b" not in found


def test_a_question_about_the_present_prefers_the_newest_telling(memory):
    """Two homes of one person stored side by side (as given, or kept apart by a model's decision): a
    question about the present ranks the later telling first, the same question without "now" the
    closer text."""
    denver = {**DENVER, "session_time": "2023-01-05T10:00"}
    austin = rec(id="home-2", content="Ann moved to Austin in September.", location="Austin")
    austin |= {"keywords": ["Ann", "Austin"], "session_time": "2023-09-05T10:00", "source_turns": ["D9:1"]}
    memory.add_records([denver, austin], user_id="ann", consolidate=False)
    plain = memory.search("Where does Ann live?", user_id="ann", k=2).hits
    assert [h.record["id"] for h in plain] == ["home-1", "home-2"]
    for question in (
        "Where does Ann live now?",
        "Where is Ann living these days?",
        "Where does Ann live currently?",
    ):
        assert memory.search(question, user_id="ann", k=2).hits[0].record["id"] == "home-2", question


def _count_blocks(memory, monkeypatch) -> list[bool]:
    """The store's outermost blocks from now on, as their `write` flags."""
    blocks, depth, opened = [], [0], memory.store.transaction

    @contextmanager
    def counted(write=True):
        if not depth[0]:
            blocks.append(write)
        depth[0] += 1
        try:
            with opened(write):
                yield
        finally:
            depth[0] -= 1

    monkeypatch.setattr(memory.store, "transaction", counted)
    return blocks


def test_the_rules_decide_inside_the_records_write_block_a_model_outside_it(
    loose, embedder, memory_factory, monkeypatch
):
    """Records consolidated by the rules cost one transaction a batch (lookups, decisions and writes
    together, a merge's text embedded inside it); a model's decision is taken between a read block and a
    write block that re-checks its target."""
    memory = loose
    old = rec(
        id="home-1", type="fact", content="Ann lives in Denver.", location="Denver", keywords=["Ann", "home"]
    )
    new = rec(
        id="home-2",
        type="fact",
        content="Ann lives in Austin now.",
        location="Austin",
        keywords=["Ann", "home"],
    )
    memory.add_records([old], user_id="ann")
    blocks = _count_blocks(memory, monkeypatch)
    assert memory.add_records([new], user_id="ann")[0]["action"] == "SUPERSEDE"
    assert blocks == [True]
    blocks.clear()
    trip = rec(
        id="trip-1", content="Ann went camping at the lake.", time="2023-07-01", keywords=["Ann", "lake"]
    )
    again = {**trip, "id": "trip-2", "content": "Ann went camping at the lake with her kids."}
    memory.add_records([trip], user_id="ann")
    assert blocks == [True]
    assert memory.add_records([again], user_id="ann")[0]["action"] == "MERGE"
    assert blocks == [True, True]
    blocks.clear()
    rows = [
        {**trip, "id": f"book-{n}", "content": f"Ann read book {n}.", "keywords": ["Ann", f"book {n}"]}
        for n in range(3, 9)
    ]
    assert {e["action"] for e in memory.add_records(rows, user_id="ann")} == {"KEEP_BOTH"}
    assert blocks == [True]  # six records, one transaction
    assert memory.get("trip-1", user_id="ann")["content"] == again["content"]

    asked = []
    model = memory_factory(
        {"update": LOOSE},
        store="b",
        embedder=embedder,
        consolidator=lambda new, old, sim: asked.append(new["id"]) or RULES(new, old, sim),
    )
    model.add_records([old], user_id="ann")
    blocks = _count_blocks(model, monkeypatch)
    assert model.add_records([new], user_id="ann")[0]["action"] == "SUPERSEDE" and asked == ["home-2"]
    assert blocks == [False, True]


def test_a_batch_is_decided_as_record_by_record_adds_would_decide_it(embedder, memory_factory):
    """The rules decide a batch over one view of the store (a few reads at its start, its own writes laid
    over them). It must answer what the store would: the same events, and the same records in the same
    states, as the same records decided one at a time on the store itself (a consolidator that is not
    the rules' own object takes that path). The batch holds a restatement of a stored record, a record
    restated later in the batch, a move told out of order (a history record), an id already stored and
    an id given twice (once again of another type: the first's keywords are read all the same); and
    with `max_candidates` 2 below the three records sharing `cat`, an earlier telling that arrives late
    and takes the first of them out of use, after which the third is the candidate of a restatement: the
    view must read each keyword deep enough to stand in for the records the batch makes inactive."""
    settings = {"update": {**LOOSE, "max_candidates": 2}}

    def home(rid: str, city: str, day: int) -> dict:
        return rec(
            id=rid,
            type="fact",
            content=f"Ann lives in {city}.",
            keywords=["Ann", "home", city],
            location=city,
            session_time=f"2023-06-{day:02d}T10:00",
        )

    stored = [
        rec(id=f"g{n}", content=f"Ann grows {plant} in her garden.", keywords=["Ann", "garden", plant])
        for n, plant in enumerate(["tomatoes", "roses", "basil", "tulips"])
    ] + [home("home-1", "Denver", 1), rec(id="p1", content="Ann plays the cello.", keywords=["Ann", "cello"])]
    cat = {"type": "fact", "session_time": "2023-06-10T10:00"}
    stored += [
        rec(id="c1", content="Ann's cat is named Milo.", keywords=["Ann", "cat", "Milo"], **cat),
        rec(id="c2", content="Ann's cat likes tuna.", keywords=["Ann", "cat", "tuna"], **cat),
        rec(id="c3", content="Ann's cat sleeps on the sofa.", keywords=["Ann", "cat", "sofa"], **cat),
    ]
    batch = [
        rec(id="g9", content="Ann grows roses in her little garden.", keywords=["Ann", "garden", "roses"]),
        rec(id="hike-1", content="Ann went hiking at Eagle Peak.", keywords=["Ann", "hiking", "Eagle Peak"]),
        rec(id="hike-2", content="Ann went hiking at Eagle Peak again.", keywords=["Ann", "hiking"]),
        home("home-3", "Austin", 20),
        home("home-2", "Boston", 10),
        rec(
            id="z1",
            content="Ann's cat is named Milo.",
            keywords=["Ann", "cat"],
            **{**cat, "session_time": "2023-06-01"},
        ),
        rec(id="z2", content="Ann's cat sleeps on the sofa all day.", keywords=["Ann", "cat"], **cat),
        stored[0],
        rec(id="hike-1", content="Ann went hiking at Eagle Peak."),
        rec(id="p2", content="Ann plays the cello.", keywords=["Ann", "cello"]),
        rec(id="p2", type="episodic", content="Ann played at a concert.", keywords=["Ann", "concert"]),
    ]
    results = []
    for name, consolidator in (("batch", None), ("one", lambda new, old, sim: RULES(new, old, sim))):
        memory = memory_factory(settings, store=name, embedder=embedder, consolidator=consolidator)
        memory.add_records(stored, user_id="ann")
        events = memory.add_records(batch, user_id="ann")
        states = {
            r["id"]: (r["status"], r["version"], r["content"], sorted(r["keywords"]))
            for r in memory.store.records("ann", status=None)
        }
        results.append((events, states))
    assert results[0] == results[1]
    events, states = results[0]
    assert [e["action"] for e in events] == [
        "MERGE",
        "KEEP_BOTH",
        "MERGE",
        "SUPERSEDE",
        "HISTORY",
        "MERGE",
        "MERGE",
        "UNCHANGED",
        "UNCHANGED",
        "MERGE",
        "UNCHANGED",
    ]
    assert events[9] == {"id": "p2", "action": "MERGE", "target": "p1"}
    assert events[5:7] == [
        {"id": "z1", "action": "MERGE", "target": "c1"},  # an earlier telling: c1 merged into it
        {"id": "z2", "action": "MERGE", "target": "c3"},  # c3: reached past c1, out of use
    ]
    assert states["g9"][0] == "merged" and states["hike-2"][0] == "merged"
    assert [i for i, s in states.items() if s[0] == "active" and i.startswith("home")] == ["home-3"]


def test_the_keyword_index_held_between_batches_follows_every_writer(embedder, memory_factory, monkeypatch):
    """The update path keeps the keyword index's arms between its batches and lays the log's changes over
    them (its own writes, another process's adds and deletes, an update that moves a record to other
    keywords). It must decide as the store itself would: the same events and records as the same steps
    decided record by record. With `max_candidates` 2 below the three records sharing `cat`, only the
    first two by id are candidates: once another writer deletes one and adds one before them, and an
    update moves one to `dog`, the third is the candidate of its restatement. A batch whose arms are all
    held reads none from the store."""
    settings = {"update": {**LOOSE, "max_candidates": 2}}
    cat = {"type": "fact", "session_time": "2023-06-10T10:00"}
    cats = [
        rec(id="c1", content="Ann's cat is named Milo.", keywords=["Ann", "cat", "Milo"], **cat),
        rec(id="c2", content="Ann's cat likes tuna.", keywords=["Ann", "cat", "tuna"], **cat),
        rec(id="c3", content="Ann's cat sleeps on the sofa.", keywords=["Ann", "cat", "sofa"], **cat),
    ]
    sofa = rec(id="z1", content="Ann's cat sleeps on the sofa all day.", keywords=["Ann", "cat"], **cat)
    steps = [
        ("b", "add", cats),
        ("a", "add", [sofa]),  # c3 is not among the first two of `cat`: kept beside it
        ("b", "delete", "c1"),
        ("b", "add", [rec(id="c0", content="Ann's cat has a red collar.", keywords=["Ann", "cat"], **cat)]),
        ("a", "update", ("c2", {"keywords": ["Ann", "dog", "tuna"]})),
        ("a", "add", [{**sofa, "id": "z2", "content": "Ann's cat sleeps on the sofa every day."}]),
    ]
    results = []
    for name, consolidator in (("batch", None), ("one", lambda new, old, sim: RULES(new, old, sim))):
        writers = {
            who: memory_factory(settings, store=name, embedder=embedder, consolidator=consolidator)
            for who in "ab"
        }
        events = []
        for who, step, arg in steps:
            memory = writers[who]
            if step == "add":
                events.append(memory.add_records(arg, user_id="ann"))
            elif step == "delete":
                memory.delete(arg, user_id="ann")
            else:
                memory.update(arg[0], user_id="ann", **arg[1])
        states = {
            r["id"]: (r["status"], r["version"], r["content"], sorted(r["keywords"]))
            for r in writers["a"].store.records("ann", status=None)
        }
        results.append((events, states))
    assert results[0] == results[1]
    events, states = results[0]
    assert events[1][0]["action"] == "KEEP_BOTH"
    assert events[3][0] == {"id": "z2", "action": "MERGE", "target": "c3"}

    fresh = memory_factory(settings, store="batch", embedder=embedder)
    read, store_read = [], fresh.store.lookup.keyword_arms
    monkeypatch.setattr(
        fresh.store.lookup, "keyword_arms", lambda *args: read.append(args[1]) or store_read(*args)
    )
    naps = [{**sofa, "id": f"z{n}", "content": f"Ann's cat naps {n} times a day."} for n in (3, 4)]
    fresh.add_records(naps[:1], user_id="ann")
    assert read == [[("fact", "cat")]]  # nothing held yet
    fresh.add_records(naps[1:], user_id="ann")
    assert read == [[("fact", "cat")]]  # held, and the batch before laid over it
    monkeypatch.setattr(keyword_arms, "MAX_ENTRIES", 0)  # over the bound: nothing stays held
    fresh.add_records([{**naps[0], "id": "z5", "content": "Ann's cat naps all afternoon."}], user_id="ann")
    assert read == [[("fact", "cat")]]  # held still, then dropped
    fresh.add_records([{**naps[0], "id": "z6", "content": "Ann's cat naps in the sun."}], user_id="ann")
    assert read == [[("fact", "cat")]] * 2


def test_a_failed_batch_leaves_the_held_keyword_index_as_the_store_is(loose, monkeypatch):
    """A batch that fails midway rolls back, and the keyword index held for the next batch is the store's:
    the restatement the failed batch had merged is merged again, into the record it rolled back."""
    memory = loose
    camping = rec(id="t1", content="Ann went camping at the lake.", keywords=["Ann", "camping", "lake"])
    memory.add_records([camping], user_id="ann")
    again = {**camping, "id": "t2", "content": "Ann went camping at the lake with her kids."}
    other = rec(id="t3", content="Ann bought a red kayak.", keywords=["Ann", "kayak", "lake"])
    inserted, store_insert = [], memory.store.insert

    def failing(*args, **kwargs):
        inserted.append(args[1]["id"])
        if len(inserted) == 2:
            raise OSError("disk full")
        return store_insert(*args, **kwargs)

    monkeypatch.setattr(memory.store, "insert", failing)
    with pytest.raises(OSError):
        memory.add_records([again, other], user_id="ann")
    monkeypatch.setattr(memory.store, "insert", store_insert)
    assert [r["id"] for r in memory.store.records("ann", status=None)] == ["t1"]
    assert memory.add_records([again], user_id="ann") == [{"id": "t2", "action": "MERGE", "target": "t1"}]


def test_a_rules_merge_embeds_no_text_twice(embedder, memory_factory):
    """The rules' merge keeps the longer of the two texts, whose vector is at hand (the new record's, or
    the stored one's): a restatement costs one embedding, its own, whichever text is kept, and the kept
    record's vector is its text's."""

    class Counting:
        def __init__(self):
            self.texts = []

        def encode(self, texts):
            self.texts += texts
            return embedder.encode(texts)

    counting = Counting()
    memory = memory_factory({"update": LOOSE}, embedder=counting)
    short = rec(id="t1", content="Ann went camping at the lake.", keywords=["Ann", "camping", "lake"])
    longer = {**short, "id": "t2", "content": "Ann went camping at the lake with her kids."}
    for user, (first, second) in {"ann": (short, longer), "bob": (longer, short)}.items():
        memory.add_records([first], user_id=user)
        counting.texts.clear()
        assert memory.add_records([second], user_id=user)[0]["action"] == "MERGE"
        assert counting.texts == [second["content"]]
        (kept,) = memory.get_all(user_id=user).memories
        assert kept["content"] == longer["content"]
        ids, matrix = memory.store.lookup.vectors(user, [kept["id"]])
        assert ids == [kept["id"]]
        vector = matrix[0]
        assert np.allclose(vector, embedder.encode([longer["content"]])[0], atol=1e-5)


def test_the_dense_index_reads_the_vectors_asked_for_or_all(memory_factory, embedder):
    """The update path reads its candidates' vectors by id, a copy reads all of them: only active records'
    vectors, ordered by id, an unknown or another user's id skipped."""
    memory = memory_factory(embedder=embedder)
    texts = ["Ann lives in Oslo.", "Ann has two cats.", "Ann plays the cello."]
    added = [memory.add_records([rec(id=f"v{i}", content=t)], user_id="ann")[0] for i, t in enumerate(texts)]
    ids = [a["id"] for a in added]
    memory.add_records([rec(id="b0", content="Bob lives in Rome.")], user_id="bob")
    memory.delete(ids[1], user_id="ann")
    dense = memory.store.indexes["dense"]
    with memory.store.dialect.cursor("ann") as sql:
        some, some_matrix = dense.vectors(sql, "ann", [ids[2], "b0", ids[1], "nope", ids[0]])
        every, every_matrix = dense.vectors(sql, "ann", None)
        assert dense.vectors(sql, "ann", [])[0] == dense.vectors(sql, "ann", ["nope", ids[1]])[0] == []
    assert some == every == sorted([ids[0], ids[2]])
    expected = embedder.encode([texts[0], texts[2]] if ids[0] < ids[2] else [texts[2], texts[0]])
    assert np.allclose(some_matrix, expected, atol=1e-5) and np.array_equal(some_matrix, every_matrix)
    assert some_matrix.dtype == np.float32 and some_matrix.flags.c_contiguous


def test_merge_keeps_one_richer_record_and_a_bad_decision_changes_nothing(loose, embedder, memory_factory):
    memory = loose
    first = rec(
        id="trip-1",
        content="Ann went camping at the lake.",
        time="2023-07-01",
        keywords=["Ann", "camping", "lake"],
    )
    again = rec(
        id="trip-2",
        content="Ann went camping at the lake with her kids to watch the stars.",
        time="2023-07-01",
        keywords=["Ann", "camping", "kids"],
        source_turns=["D4:2"],
    )
    memory.add_records([first], user_id="ann")
    assert memory.add_records([again], user_id="ann") == [
        {"id": "trip-2", "action": "MERGE", "target": "trip-1"}
    ]
    kept = memory.get("trip-1", user_id="ann")
    assert kept["content"] == again["content"] and kept["keywords"] == ["Ann", "camping", "kids", "lake"]
    assert (
        kept["source_turns"] == ["D1:1", "D4:2"] and memory.get("trip-2", user_id="ann")["status"] == "merged"
    )
    assert [h["action"] for h in memory.history("trip-1", user_id="ann")] == ["ADD", "MERGE trip-2"]

    broken = memory_factory(
        {"update": LOOSE},
        store="b",
        embedder=embedder,
        consolidator=lambda new, old, sim: {"action": "MERGE", "memory": {**new, "time": "someday"}},
    )
    broken.add_records([first], user_id="ann")
    assert broken.add_records([again], user_id="ann")[0]["action"] == "KEEP_BOTH"
    assert (
        broken.stats["invalid_consolidations"] == 1
        and broken.get("trip-1", user_id="ann")["content"] == first["content"]
    )


def test_update_and_delete_are_versioned(memory):
    memory.add_records([JAZZ], user_id="ann")
    memory.update("jazz", user_id="ann", content="Ann loves jazz, especially Coltrane.")
    memory.delete("jazz", user_id="ann")
    history = memory.history("jazz", user_id="ann")
    assert [(h["version"], h["action"]) for h in history] == [(1, "ADD"), (2, "UPDATE"), (3, "DELETE")]
    assert [h["record"]["content"] for h in history][:2] == [
        JAZZ["content"],
        "Ann loves jazz, especially Coltrane.",
    ]
    assert memory.search("jazz Coltrane", user_id="ann").hits == []
    with pytest.raises(ValueError, match="time_format"):
        memory.add_records([rec(time="last May")], user_id="ann")


def test_candidates_come_from_the_index_not_all_pairs(memory):
    memory.add_records(
        [
            HIKE_APRIL,
            JAZZ,
            rec(id="tea", type="profile", content="Ann prefers tea.", keywords=["Ann", "tea"]),
        ],
        user_id="ann",
    )
    before = dict(memory.stats)
    memory.add_records(
        [rec(id="jazz-2", type="profile", content="Ann listens to jazz records.", keywords=["Ann", "jazz"])],
        user_id="ann",
    )
    assert (
        memory.stats["embedding_comparisons"] - before.get("embedding_comparisons", 0) == 1
    )  # only the jazz profile
    assert memory.stats["baseline_comparisons"] - before.get("baseline_comparisons", 0) == 3


def test_assistant_recall_follows_the_pointer(memory):
    conv = Conversation(
        "chat",
        [
            Turn("S1:1", "ann", "user", "Can you suggest a pasta recipe?", "S1", "2023-05-20T02:21"),
            Turn("S1:2", "assistant", "assistant", "Try lemon garlic spaghetti.", "S1", "2023-05-20T02:21"),
            Turn("S1:3", "ann", "user", "I adopted a cat.", "S1", "2023-05-20T02:21"),
        ],
    )
    memory.add_records(
        [
            rec(
                id="pasta",
                speaker="ann",
                content="Ann asked for a weeknight pasta recipe.",
                keywords=["ann", "pasta recipe"],
                source_turns=["S1:1"],
                conversation_id="chat",
            )
        ],
        user_id="ann",
        conversation=conv,
    )
    plain = memory.search("What pasta did Ann ask about?", user_id="ann")
    assert plain.assistant_context == []
    recalled = memory.search("What pasta recipe did you suggest?", user_id="ann")
    assert recalled.query["need_assistant_context"] and [t["text"] for t in recalled.assistant_context] == [
        "Try lemon garlic spaghetti."
    ]
    assert memory.stats["assistant_recalls"] == 1


def test_export_import_round_trip(memory, tmp_path, embedder, memory_factory):
    memory.add_records([HIKE_APRIL, JAZZ], user_id="ann")
    assert memory.export_jsonl(tmp_path / "ann.jsonl", user_id="ann") == 2
    other = memory_factory(store="other", embedder=embedder)
    assert other.import_jsonl(tmp_path / "ann.jsonl", user_id="ann") == 2
    assert other.get("jazz", user_id="ann")["content"] == JAZZ["content"]


def test_migrations_are_recorded(tmp_path):  # SQLite only: PRAGMA user_version (Postgres: test_pg_store)
    store = SQLiteStore(tmp_path / "s.sqlite", migrate=False)
    assert store.schema_version() == 0 and not store.ping()
    assert store.migrate() == len(MIGRATIONS) and store.ping() and store.serialized
    assert store.dialect.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    store.close()
    assert SQLiteStore(tmp_path / "s.sqlite").migrate() == 0  # re-opening applies nothing twice


def test_upgrade_indexes_the_records_already_stored(tmp_path):
    """A store at schema 3 (one FTS5 table) upgrades in place: its active records are found by the
    per-user lexical index at once, other statuses are not, and new writes continue the numbering."""
    store = SQLiteStore(tmp_path / "s.sqlite", migrate=False)
    store.dialect.migrate(MIGRATIONS[:3])
    for user, rid, content, status in [
        ("ann", "a1", "Ann hiked Eagle Peak", "active"),
        ("ann", "a2", "Ann hiked Mount Tam", "superseded"),
        ("bob", "b1", "Bob hiked the Alps", "active"),
    ]:
        store.dialect.db.execute(
            "INSERT INTO records (id, user_id, type, speaker, content, keywords, source_turns, created, "
            "updated, version, status) VALUES (?, ?, 'episodic', 'Ann', ?, '[\"hiking\"]', '[\"D1:1\"]', "
            "1, 1, 1, ?)",
            (rid, user, content, status),
        )
    store.close()
    store = SQLiteStore(tmp_path / "s.sqlite")
    assert store.schema_version() == len(MIGRATIONS)
    assert [rid for rid, _ in store.lookup.lexical("ann", "hiking", 10)] == ["a1"]
    assert [rid for rid, _ in store.lookup.lexical("bob", "Alps", 10)] == ["b1"]
    with store.transaction():
        store.insert("ann", {**store.get("ann", "a1"), "id": "a3", "content": "Ann hiked Half Dome"}, None)
    assert [rid for rid, _ in store.lookup.lexical("ann", "hiked", 10)] == ["a1", "a3"]
    store.close()


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from dimmem.contract.records import memory_record
    from dimmem.runtime.embed import WIDTH
    from dimmem.runtime.stores import open_store
    store = open_store(sys.argv[1])
    user, start, count, pause = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    import time
    for i in range(start, start + count):
        rec = {"id": f"{user}-{i}", **memory_record(type="fact", speaker="Ann", content=f"fact {i}",
                                                     keywords=["Ann", f"k{i}"], source_turns=["D1:1"])}
        with store.transaction():
            store.insert(user, rec, np.ones(WIDTH, dtype=np.float32) / WIDTH**0.5)
            time.sleep(pause)  # inside the transaction: a kill here must leave no partial record
        print(i, flush=True)
""")


@pytest.mark.integration
def test_sigkill_mid_add_leaves_no_partial_record(store_url, backend):
    open_store(store_url).close()
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, store_url, "ann", "0", "1000", "0.02"],
        stdout=subprocess.PIPE,
        text=True,
    )
    watcher = open_store(store_url)  # a reader whose in-process indexes follow the writer as it goes
    committed = []
    for _ in range(10):
        committed.append(proc.stdout.readline())
        watcher.lookup.lexical("ann", "fact", 10_000)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = open_store(store_url)
    records = store.records("ann")
    assert len(records) >= len(committed)  # nothing committed was lost
    every = sorted(r["id"] for r in records)  # each record's content is "fact N"
    lookup = store.lookup
    assert sorted(rid for rid, _ in watcher.lookup.lexical("ann", "fact", 10_000)) == every  # up to date
    assert sorted(rid for rid, _ in lookup.lexical("ann", "fact", 10_000)) == every  # read from scratch
    watcher.close()
    for r in records:  # and whatever is there is whole: index, vector and history entries with it
        assert store.history("ann", r["id"]) and lookup.keywords("ann", "fact", [r["keywords"][1]]) == [
            r["id"]
        ]
    ids = sorted(r["id"] for r in records)
    vectors = transfer.dump(store, "ann")["vectors"]
    assert sorted(vectors) == ids and lookup.lexical("ann", "fact", 10_000)
    assert sorted(rid for rid, _ in lookup.dense("ann", vectors[ids[0]], 10_000)) == ids
    if backend == "sqlite":  # the file itself
        assert sorted(store.indexes["dense"].users["ann"].row) == ids  # the rows the search above held
        assert store.dialect.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store.close()


def empty_behind_its_back(store_url: str, backend: str) -> None:
    """Every table emptied through a connection of its own, as an operator's TRUNCATE or a restored
    backup would: the user's change numbers start again from nothing."""
    if backend == "sqlite":
        import sqlite3

        with sqlite3.connect(store_url) as db:
            tables = db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite%'"
            )
            for (table,) in tables.fetchall():
                if table != "schema_migrations":
                    db.execute(f"DELETE FROM {table}")
        return
    from pg_server import empty_database

    empty_database(store_url)


def test_a_store_emptied_and_refilled_behind_a_process_is_read_again(
    embedder, memory_factory, store_url, backend
):
    """A second runtime over the store (another worker) that searched before the tables were emptied and
    refilled past its change numbers finds the new records and none of the old: a deleted record that
    shares an id with one it held is not found (two HTTP workers over one database, one of them
    emptied between tests, returned a deleted record)."""
    writer, worker = memory_factory(embedder=embedder), memory_factory(embedder=embedder)
    writer.add_records([HIKE_APRIL, JAZZ], user_id="ann", consolidate=False)
    assert {h.record["id"] for h in worker.search("jazz hiking Eagle Peak", user_id="ann").hits} == {
        "hike-apr",
        "jazz",
    }
    empty_behind_its_back(store_url, backend)
    for record in (HIKE_MAY, HIKE_APRIL, rec(id="tea", content="Ann drinks green tea by the river.")):
        writer.add_records([record], user_id="ann", consolidate=False)
    writer.delete("hike-apr", user_id="ann")
    found = {h.record["id"] for h in worker.search("jazz hiking Eagle Peak river", user_id="ann").hits}
    assert found <= {"hike-may", "tea"}
    assert {rid for rid, _ in worker.store.lookup.lexical("ann", "river", 10)} == {"hike-may", "tea"}


@pytest.mark.integration
def test_concurrent_writers_lose_nothing(store_url):
    open_store(store_url).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, store_url, "ann", str(n * 100), "60", "0"],
            stdout=subprocess.DEVNULL,
        )
        for n in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    store = open_store(store_url)
    assert len(store.records("ann")) == 240 and store.count("ann") == 240
    store.close()


def memory_command(argv: list[str]) -> int:
    """`dimmem memory ...` through the command group's own parser (what the dimmem dispatcher calls)."""
    import argparse

    from dimmem.runtime import cli

    parser = argparse.ArgumentParser(prog="dimmem memory")
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


@pytest.mark.slow
def test_memory_cli_loads_labels_and_searches(tmp_path, capsys):
    from data_gen.config import DatagenConfig
    from data_gen.run import run

    run(
        DatagenConfig.model_validate(
            {
                "source": {"format": "toy", "conversations": 3},
                "out": str(tmp_path / "d"),
                "windows": {"window": 12, "overlap": 3, "max_tokens": None},
                "teacher": {"kind": "oracle"},
                "tasks": {"parse_query": False, "consolidate": False},
            }
        ),
        show_progress=False,
    )
    store = str(tmp_path / "m.sqlite")
    assert (
        memory_command(
            [
                "load",
                "--labels",
                str(tmp_path / "d" / "labels.jsonl"),
                "--store",
                store,
                "--set",
                "update.similarity_threshold=0.7",
            ]
        )
        == 0
    )
    loaded = capsys.readouterr().out
    assert "for 3 users" in loaded and "fewer)" in loaded
    assert (
        memory_command(
            ["search", "--store", store, "--user", "toy-0000", "--k", "3", "where", "does", "he", "live"]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0].startswith("query: 'where does he live'")
        and lines[1].startswith("1. [")
        and "#1" in "".join(lines[1:])
    )


GOOD_ROW = {
    "task": "extract",
    "conversation_id": "c1",
    "window_id": "c1/w0000",
    "memories": [{"id": "c1/w0000#m1", **{k: v for k, v in rec().items()}, "session_time": "2023-01-01"}],
}


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{not json\n", "line 1: not JSON"),
        ('"a string"\n', "line 1: a JSON str, expected an object"),
        ('[{"task": "extract"}]\n', "line 1: a JSON array; expected JSON lines"),
        ('[\n  {"task": "extract"}\n]\n', "line 1: a JSON array"),
        ('{"task": "extract", "window_id": "w"}\n', "line 1: missing key 'conversation_id'"),
        (
            '{"task": "extract", "conversation_id": "c", "window_id": "w", "memories": null}\n',
            "line 1: memories is null",
        ),
        ('{"task": "extract", "conversation_id": "c", "window_id": "w"}\n', "line 1: missing key 'memories'"),
        (
            '{"task": "extract", "conversation_id": "c", "window_id": "w", "memories": [{"id": "x"}]}\n',
            "line 1: memories[0]: missing key 'source_turns'",
        ),
        ("\n{GOOD}\n\n[1]\n", "line 4: a JSON list, expected an object"),
    ],
)
def test_label_memories_names_the_file_and_line_of_bad_input(tmp_path, text, problem):
    from dimmem.runtime.labels import label_memories

    path = tmp_path / "labels.jsonl"
    path.write_text(text.replace("{GOOD}", json.dumps(GOOD_ROW)))
    with pytest.raises(ValueError) as error:
        label_memories(path)
    assert str(error.value).startswith(f"{path}: ") and problem in str(error.value)


def test_label_memories_skips_blank_lines_and_other_tasks(tmp_path):
    from dimmem.runtime.labels import label_memories

    path = tmp_path / "labels.jsonl"
    other = {"task": "parse_query", "conversation_id": "c1", "window_id": "q1", "value": {}}
    path.write_text(f"\n{json.dumps(GOOD_ROW)}\n   \n{json.dumps(other)}\n")
    [record] = label_memories(path)["c1"]
    assert record["id"] == "c1/w0000#m1" and record["window_id"] == "c1/w0000"
    assert record["session_time"] == "2023-01-01"


def test_memory_load_command_reports_bad_labels_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "labels.jsonl"
    bad.write_text(json.dumps(GOOD_ROW) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"labels.jsonl: line 2: not JSON"):
        memory_command(["load", "--labels", str(bad), "--store", str(tmp_path / "m.sqlite")])
    assert not (tmp_path / "m.sqlite").exists()  # refused before the store was opened


# --- Memory(config): every default in MemoryConfig ---------------------------------------------------
def test_memory_config_defaults_and_overrides(tmp_path, embedder):
    from dimmem.config import ConfigError
    from dimmem.runtime.config import MemoryConfig

    memory = Memory({"store": str(tmp_path / "m.sqlite")}, embedder=embedder)
    assert memory.config == MemoryConfig(store=str(tmp_path / "m.sqlite"))  # nothing else set: the defaults
    assert memory.config.windows.window == 20 and memory.config.retrieval.depth == 50
    assert type(memory.extractor).__name__ == "TurnExtractor" and memory.embedder is embedder
    memory.add_records([JAZZ], user_id="ann")
    as_url = Memory({"store": f"sqlite:///{tmp_path / 'm.sqlite'}"}, embedder=embedder)
    assert as_url.get("jazz", user_id="ann")
    with pytest.raises(ConfigError, match="unknown key 'retreival'"):
        Memory({"retreival": {"depth": 3}}, embedder=embedder)
    with pytest.raises(ConfigError, match="retrieval.depth"):
        Memory({"retrieval": {"depth": 0}}, embedder=embedder)
    with pytest.raises(ConfigError, match="'mysql' stores are not supported"):
        Memory({"store": "mysql://db/memories"}, embedder=embedder)
    with pytest.raises(TypeError, match="Memory.from_config"):
        Memory(str(tmp_path / "m.sqlite"), embedder=embedder)
    config = tmp_path / "m.yaml"
    config.write_text("retrieval: {depth: 7}\n")
    built = Memory.from_config(
        config,
        ["retrieval.weights={bm25: 1, dense: 1, dimension: 0.5}"],
        store=str(tmp_path / "y.sqlite"),
        embedder=None,
    )
    assert built.config.retrieval.depth == 7 and built.config.retrieval.weights["dimension"] == 0.5
    assert built.store.url == str(tmp_path / "y.sqlite")


def test_the_store_url_can_come_from_an_environment_variable(tmp_path, embedder, monkeypatch):
    from dimmem.runtime.config import MemoryConfig, load_memory_config

    assert (
        MemoryConfig(store="postgresql://app:secret@db/mem").store_url() == "postgresql://app:secret@db/mem"
    )
    config = MemoryConfig(store=str(tmp_path / "unused.sqlite"), store_env="DIMMEM_TEST_STORE")
    monkeypatch.delenv("DIMMEM_TEST_STORE", raising=False)
    with pytest.raises(ValueError, match="environment variable DIMMEM_TEST_STORE .* is not set"):
        Memory(config, embedder=embedder)
    monkeypatch.setenv("DIMMEM_TEST_STORE", f"sqlite:///{tmp_path / 'env.sqlite'}")
    memory = Memory(config, embedder=embedder)  # the variable wins over `store`
    assert memory.store.url == str(tmp_path / "env.sqlite") and not (tmp_path / "unused.sqlite").exists()
    memory.close()
    # a store the command names wins over the variable, in every command
    file = tmp_path / "env.yaml"
    file.write_text("store_env: DIMMEM_TEST_STORE\n")
    named = Memory(load_memory_config(file, store=str(tmp_path / "named.sqlite")), embedder=embedder)
    assert named.store.url == str(tmp_path / "named.sqlite")
    named.close()
    from dimmem.runtime.cli import main as memory_cli

    assert memory_cli(["migrate", "--config", str(file), "--store", str(tmp_path / "m.sqlite")]) == 0
    assert (tmp_path / "m.sqlite").exists()
    monkeypatch.setenv("DIMMEM_TEST_STORE", "mysql://db")
    with pytest.raises(ValueError, match="DIMMEM_TEST_STORE: 'mysql' stores are not supported"):
        config.store_url()
    from dimmem.runtime.stores import redacted

    assert redacted("postgresql://app:secret@db:5432/mem") == "postgresql://app:***@db:5432/mem"


# --- get_all: filters and keyset paging ----------------------------------------------------------------
def test_get_all_filters_and_pages(memory):
    records = [
        rec(
            id=f"r{i:02d}",
            type=("fact", "episodic", "profile")[i % 3],
            content=f"Ann fact number {i}.",
            time=f"2023-{i % 12 + 1:02d}-01" if i % 3 == 1 else None,
            keywords=["Ann", f"k{i}"],
            conversation_id="c1" if i < 10 else "c2",
        )
        for i in range(25)
    ]
    memory.add_records(records, user_id="ann", consolidate=False)
    memory.add_records([rec(id="bob-1", speaker="Bob", keywords=["Bob"])], user_id="bob")
    memory.delete("r00", user_id="ann")

    seen, cursor, pages = [], None, 0
    while True:
        page = memory.get_all(user_id="ann", limit=7, cursor=cursor)
        seen += [r["id"] for r in page.memories]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages == 4 and seen == [f"r{i:02d}" for i in range(1, 25)]  # active only, in order, none twice
    everything = memory.get_all(user_id="ann", filters={"status": "any"}, limit=100)
    assert len(everything.memories) == 25 and everything.next_cursor is None
    assert [r["id"] for r in memory.get_all(user_id="ann", filters={"status": "deleted"}).memories] == ["r00"]
    episodic = memory.get_all(user_id="ann", filters={"type": "episodic", "conversation_id": "c2"}).memories
    assert [r["id"] for r in episodic] == ["r10", "r13", "r16", "r19", "r22"]
    in_spring = memory.get_all(user_id="ann", filters={"time": "2023-03/2023-05"}).memories
    # r04 and r16; undated records never match a time
    assert sorted(r["time"] for r in in_spring) == ["2023-05-01", "2023-05-01"]
    assert {r["user_id"] for r in memory.get_all(user_id="bob").memories} == {"bob"}
    assert memory.get_all(user_id="carol").memories == []
    for bad, match in (
        ({"colour": "red"}, "unknown filter"),
        ({"type": "dream"}, "type 'dream'"),
        ({"status": "gone"}, "status 'gone'"),
        ({"time": "last May"}, "last May"),
    ):
        with pytest.raises(ValueError, match=match):
            memory.get_all(user_id="ann", filters=bad)
    with pytest.raises(ValueError, match="cursor"):
        memory.get_all(user_id="ann", cursor="not-a-cursor")
    with pytest.raises(ValueError, match="limit"):
        memory.get_all(user_id="ann", limit=0)


def test_lexical_index_holds_no_entry_for_users_without_records(tmp_path):
    store = SQLiteStore(tmp_path / "s.sqlite")
    for i in range(100):
        assert store.lookup.lexical(f"nobody-{i}", "hiking", 5) == []
    assert store.indexes["lexical"].users == {}
    store.close()
