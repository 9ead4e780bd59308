"""Property-based tests of the store (Hypothesis): random sequences of adds, updates, deletes, restores,
reads, pages and searches for two users against a simple model of the expected state, with the real
embedder and a real SQLite store. After every step: active <=> indexed (FTS, keywords, vectors), each
record's history is its versions 1..n in order, pages partition the user's records, and nothing one user
does shows up for the other."""

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dimmem.contract.records import memory_record
from dimmem.runtime.embed import WIDTH
from dimmem.runtime.memory import Memory, RecordStateError

USERS = ("ann", "bob")
IDS = tuple(f"r{i}" for i in range(6))
PHRASES = (
    "went hiking at Eagle Peak with the dog",
    "loves jazz and listens every evening",
    "works as a nurse at the city hospital",
    "adopted a beagle called Biscuit",
    "moved to Oslo for a new job",
    "went hiking at Eagle Peak with friends",
)
KEYWORDS = ("hiking", "Eagle Peak", "jazz", "nurse", "beagle", "Oslo", "dog")


class CachedEmbedder:
    """The real MiniLM embedder, each distinct text encoded once (the texts repeat across examples)."""

    def __init__(self, embedder):
        self.encode_one = lru_cache(maxsize=None)(lambda text: embedder.encode([text])[0])

    def encode(self, texts):
        return np.stack([self.encode_one(t) for t in texts]) if texts else np.zeros((0, WIDTH), np.float32)


@pytest.fixture(scope="module")
def cached(embedder):
    return CachedEmbedder(embedder)


def records(user: str):
    speaker = user.capitalize()
    return st.builds(
        lambda id, phrase, type, time, keywords, turn: {
            "id": id,
            **memory_record(
                source_turns=[f"D1:{turn}"],
                speaker=speaker,
                content=f"{speaker} {phrase}.",
                type=type,
                time=time,
                keywords=[speaker, *keywords],
            ),
        },
        st.sampled_from(IDS),
        st.sampled_from(PHRASES),
        st.sampled_from(("fact", "episodic", "profile")),
        st.sampled_from((None, "2023-04-02", "2023-05")),
        st.lists(st.sampled_from(KEYWORDS), min_size=1, max_size=3, unique=True),
        st.integers(1, 9),
    )


users = st.sampled_from(USERS)
ids = st.sampled_from(IDS)
updates = st.fixed_dictionaries(
    {},
    optional={
        "content": st.sampled_from(PHRASES).map(lambda p: f"Someone {p}."),
        "location": st.sampled_from((None, "Eagle Peak", "Oslo")),
        "keywords": st.lists(st.sampled_from(KEYWORDS), min_size=1, max_size=2, unique=True),
        "time": st.sampled_from((None, "2023-04")),
    },
).filter(bool)
operations = st.one_of(
    st.tuples(st.just("add"), users, st.booleans()).flatmap(
        lambda t: st.tuples(
            st.just(t[0]), st.just(t[1]), st.lists(records(t[1]), min_size=1, max_size=3), st.just(t[2])
        )
    ),
    st.tuples(st.just("update"), users, ids, updates),
    st.tuples(st.just("delete"), users, ids),
    st.tuples(st.just("restore"), users, ids),
    st.tuples(st.just("get"), users, ids),
    st.tuples(st.just("page"), users, st.integers(1, 4), st.sampled_from(("any", "active", "deleted"))),
    st.tuples(st.just("search"), users, st.sampled_from(PHRASES + ("jazz", "Eagle Peak"))),
)


def run(memory: Memory, model: dict, operation: tuple) -> None:
    """Apply one operation to the store and to the model, checking what the store answers."""
    kind, user = operation[0], operation[1]
    if kind == "add":
        _, _, batch, consolidate = operation
        events = memory.add_records(batch, user_id=user, consolidate=consolidate)
        assert [e["id"] for e in events] == [r["id"] for r in batch]
        for record, event in zip(batch, events):
            key = (user, record["id"])
            if key in model:
                assert event["action"] == "UNCHANGED"
                continue
            action, target = event["action"], event["target"]
            assert action in ("ADD", "KEEP_BOTH", "MERGE", "SUPERSEDE") and (
                action in ("ADD", "KEEP_BOTH")
            ) == (target is None)
            assert consolidate or action == "ADD"
            if target is not None:
                assert model[user, target]["status"] == "active"  # consolidated only with an active record
                model[user, target]["version"] += 1
            if action == "MERGE":
                model[user, target]["fields"] = None  # the merged fields are the consolidator's
                model[key] = {"status": "merged", "version": 2, "fields": record}
            else:
                if action == "SUPERSEDE":
                    model[user, target]["status"] = "superseded"
                    record = None  # the decision's memory
                model[key] = {"status": "active", "version": 1, "fields": record}
    elif kind in ("update", "delete", "restore"):
        record_id = operation[2]
        state = model.get((user, record_id))
        call = {
            "update": lambda: memory.update(record_id, user_id=user, **operation[3]),
            "delete": lambda: memory.delete(record_id, user_id=user),
            "restore": lambda: memory.restore(record_id, user_id=user),
        }[kind]
        allowed = "deleted" if kind == "restore" else "active"
        if state is None:
            with pytest.raises(KeyError):
                call()
        elif state["status"] != allowed:
            with pytest.raises(RecordStateError):
                call()
        else:
            call()
            state["version"] += 1
            state["status"] = {"delete": "deleted", "restore": "active"}.get(kind, state["status"])
            if kind == "update" and state["fields"] is not None:
                state["fields"] = {**state["fields"], **operation[3]}
    elif kind == "get":
        got, state = memory.get(operation[2], user_id=user), model.get((user, operation[2]))
        assert (got is None) == (state is None)
        if got is not None:
            assert (got["status"], got["version"]) == (state["status"], state["version"])
            if state["fields"] is not None:
                assert {k: got[k] for k in state["fields"] if k != "id"} == {
                    k: v for k, v in state["fields"].items() if k != "id"
                }
    elif kind == "page":
        _, _, limit, status = operation
        seen, cursor = [], None
        while True:
            page = memory.get_all(user_id=user, filters={"status": status}, limit=limit, cursor=cursor)
            assert len(page.memories) <= limit and all(r["user_id"] == user for r in page.memories)
            seen += [r["id"] for r in page.memories]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        expected = {i for (u, i), s in model.items() if u == user and status in ("any", s["status"])}
        assert len(seen) == len(set(seen)) and set(seen) == expected  # the pages partition the records
    elif kind == "search":
        hits = memory.search(operation[2], user_id=user, k=20).hits
        active = {i for (u, i), s in model.items() if u == user and s["status"] == "active"}
        assert {h.record["id"] for h in hits} <= active and all(h.record["user_id"] == user for h in hits)


def check_invariants(memory: Memory, model: dict) -> None:
    db = memory.store.dialect.db
    for user in USERS:
        rows = db.execute("SELECT id, status, version FROM records WHERE user_id=?", (user,)).fetchall()
        stored = {r[0]: (r[1], r[2]) for r in rows}
        expected = {i: (s["status"], s["version"]) for (u, i), s in model.items() if u == user}
        assert stored == expected, user  # nothing another user did shows up here
        active = {i for i, (status, _) in stored.items() if status == "active"}
        held = [r[0] for r in db.execute("SELECT record_id FROM vectors WHERE user_id=?", (user,))]
        assert len(held) == len(set(held)) and set(held) == active
        memory.store.lookup.lexical(user, "anything", 1)  # brings the lexical index up to date
        held = memory.store.indexes["lexical"].users.get(user)  # (no entry for a user without active records)
        assert set(held.where if held else ()) == active
        keywords = {
            r[0] for r in db.execute("SELECT record_id FROM record_keywords WHERE user_id=?", (user,))
        }
        assert keywords == active
        for record_id, (_, version) in stored.items():
            history = [h["version"] for h in memory.history(record_id, user_id=user)]
            assert history == list(range(1, version + 1))  # strictly increasing, one entry per version


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(operations, min_size=1, max_size=12))
def test_random_operation_sequences_keep_the_store_equal_to_the_model(cached, tmp_path_factory, steps):
    path = tmp_path_factory.mktemp("store") / "m.sqlite"
    memory = Memory({"store": str(path)}, embedder=cached)
    model: dict = {}
    try:
        for operation in steps:
            run(memory, model, operation)
            check_invariants(memory, model)
        assert memory.store.dialect.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        memory.store.close()


# --- the keyword index held between batches -----------------------------------------------------------
TOLD = {  # what Ann tells, with its keywords: one shared by two tellings, one ("week") by all
    "went hiking at Eagle Peak with the dog": ["hiking", "Eagle Peak", "dog"],
    "went hiking at Eagle Peak with friends": ["hiking", "Eagle Peak"],
    "loves jazz and listens every evening": ["jazz"],
    "adopted a beagle called Biscuit": ["beagle", "dog"],
}
told = st.builds(
    lambda rid, phrase, kind: {
        "id": f"t{rid}",
        **memory_record(
            source_turns=["D1:1"],
            speaker="Ann",
            content=f"Ann {phrase}.",
            type=kind,
            keywords=["Ann", "week", *TOLD[phrase]],
        ),
    },
    st.integers(0, 11),
    st.sampled_from(sorted(TOLD)),
    st.sampled_from(("episodic", "profile")),
)
writers = st.sampled_from(("a", "b"))
told_ids = st.integers(0, 11).map(lambda n: f"t{n}")
adds = st.tuples(st.just("add"), writers, st.lists(told, min_size=1, max_size=4))
shared_store_steps = st.one_of(
    adds,
    adds,  # (adds twice as likely as each other step)
    st.tuples(
        st.just("update"), writers, told_ids, st.fixed_dictionaries({"keywords": st.just(["Ann", "jazz"])})
    ),
    st.tuples(st.just("delete"), writers, told_ids),
    st.tuples(st.just("restore"), writers, told_ids),
)


def apply(memory: Memory, step: tuple):
    """One step of a writer: an add's events, or the error it raised (None for another step)."""
    kind, _, arg, *fields = step
    try:
        if kind == "add":
            return memory.add_records(arg, user_id="ann")
        if kind == "update":
            memory.update(arg, user_id="ann", **fields[0])
        else:
            getattr(memory, kind)(arg, user_id="ann")
    except (KeyError, RecordStateError, ValueError) as exc:
        return type(exc).__name__
    return None


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(shared_store_steps, min_size=3, max_size=12))
def test_batches_over_the_held_keyword_index_decide_as_record_by_record(cached, tmp_path_factory, steps):
    """Two writers on one store, each holding the keyword index between its batches and following the
    other's adds, updates, deletes and restores through the log (`max_candidates` 2: a common keyword
    reaches past what is held), answer every step as the same steps decided record by record on the store
    itself: the same events, errors and records."""
    runs = []
    for by_record in (False, True):
        path = tmp_path_factory.mktemp("shared") / "m.sqlite"
        pair = {
            w: Memory({"store": str(path), "update": {"max_candidates": 2}}, embedder=cached) for w in "ab"
        }
        if by_record:  # a consolidator other than the rules' own object decides record by record
            for memory in pair.values():
                memory.consolidator = (lambda rules: lambda new, old, sim: rules(new, old, sim))(
                    memory.consolidator
                )
        try:
            answers = []
            for step in steps:
                answers.append(apply(pair[step[1]], step))
                records = pair["a"].store.records("ann", status=None)
                answers.append({r["id"]: (r["status"], r["version"], r["content"]) for r in records})
            runs.append(answers)
        finally:
            for memory in pair.values():
                memory.close()
    assert runs[0] == runs[1]


# --- the update path: time decides, not arrival -------------------------------------------------------
CITIES = ("Denver", "Austin", "Oslo", "Lisbon")
SAID = (  # what is said again, word for word: one record whoever says it first
    ("Ann works as a nurse at the city hospital.", ["Ann", "nurse", "hospital"]),
    ("Ann adopted a beagle called Biscuit.", ["Ann", "beagle", "Biscuit"]),
)
ONCE = (  # said once each
    ("Ann loves jazz and listens every evening.", ["Ann", "jazz"]),
    ("Ann went hiking at Eagle Peak with the dog.", ["Ann", "hiking", "Eagle Peak"]),
)


def conversation_records():
    """A user's records told over sessions: where Ann lives (each a later move), facts said again in later
    sessions, facts said once. Ids are drawn at random, so they say nothing of the order."""

    def build(moves, repeats, once, days, ids):
        rows = []
        for city in moves:
            rows.append(("fact", f"Ann lives in {city}.", ["Ann", "home", city], city))
        for n in repeats:
            rows.append(("profile", *SAID[n], None))
        rows += [("profile", *ONCE[n], None) for n in once]
        out = []
        for (kind, content, keywords, place), day, rid in zip(rows, days, ids):
            out.append(
                {
                    "id": f"r{rid}",
                    **memory_record(
                        source_turns=[f"D{day}:1"],
                        speaker="Ann",
                        content=content,
                        type=kind,
                        location=place,
                        keywords=keywords,
                    ),
                    "session_time": f"2023-06-{day:02d}T10:00",
                }
            )
        return out

    return st.builds(
        build,
        st.lists(st.sampled_from(CITIES), min_size=1, max_size=4, unique=True),
        st.lists(st.integers(0, len(SAID) - 1), max_size=4),
        st.lists(st.integers(0, len(ONCE) - 1), max_size=2, unique=True),
        st.lists(st.integers(1, 28), min_size=10, max_size=10, unique=True),
        st.lists(st.integers(0, 999), min_size=10, max_size=10, unique=True),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=conversation_records(), order=st.randoms(use_true_random=False))
def test_the_same_records_in_any_order_leave_the_same_active_records(cached, tmp_path_factory, rows, order):
    """Added in their sessions' order and in a shuffled one, the same records leave the same active
    records: the last place Ann lives in (every earlier one superseded or history of a later one), each
    repeated fact once (the first telling), each fact said once."""
    shuffled = list(rows)
    order.shuffle(shuffled)
    by_time = sorted(rows, key=lambda r: r["session_time"])
    active = []
    for arrival in (by_time, shuffled):
        memory = Memory({"store": str(tmp_path_factory.mktemp("order") / "m.sqlite")}, embedder=cached)
        try:
            memory.add_records(arrival, user_id="ann")
            active.append({r["id"]: r["content"] for r in memory.store.records("ann")})
            events = memory.get_all(user_id="ann", filters={"status": "any"}, limit=100).memories
            assert len(events) == len(rows)  # nothing lost: every record stored, most recent or history
        finally:
            memory.close()
    assert active[0] == active[1]
    homes = [r for r in by_time if "home" in r["keywords"]]
    assert [c for c in active[0].values() if c.startswith("Ann lives in")] == [homes[-1]["content"]]
    said = {r["content"] for r in rows if "home" not in r["keywords"]}
    assert sorted(c for c in active[0].values() if not c.startswith("Ann lives in")) == sorted(said)
