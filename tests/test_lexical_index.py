"""The per-user lexical index (dimmem.runtime.stores.indexes.bm25) over a real SQLite store: exact BM25
against a brute-force scorer through adds, revisions and deletions; per-user statistics; eviction;
reload after tombstones; concurrent searches while a writer writes."""

import math
import random
import threading
from collections import Counter

import pytest

from dimmem.contract.records import memory_record
from dimmem.runtime import lexical
from dimmem.runtime.stores.indexes.bm25 import K1, B, LexicalIndex
from dimmem.runtime.stores.sqlite import SQLiteStore

WORDS = ["hiking", "paris", "marathon", "jazz", "coffee", "tea", "dog", "cat", "garden", "piano", "berlin"]
WORDS += ["alps", "chess", "bread", "river"]


def record(rid: str, content: str) -> dict:
    return {"id": rid, **memory_record(type="fact", speaker="Ann", content=content, source_turns=["D1:1"])}


def brute_force(records: list[dict], query: str, k: int) -> list[tuple[str, float]]:
    """BM25 by the book over the given records (k1 1.2, b 0.75, FTS5's IDF floored at 1e-6), divided
    by the query's ceiling: every term at the IDF of a term no record holds, times k1 + 1."""
    docs = {r["id"]: lexical.document(r) for r in records}
    n, avgdl = len(docs), max(sum(sum(d.values()) for d in docs.values()) / max(len(docs), 1), 1.0)
    df = Counter(t for d in docs.values() for t in d)
    ceiling = len(lexical.terms(query)) * math.log((max(n, 1) + 0.5) / 0.5) * (K1 + 1)
    scores = {}
    for rid, d in docs.items():
        dl = sum(d.values())
        hits = [t for t in sorted(lexical.terms(query)) if t in d]
        if hits:
            scores[rid] = (
                sum(
                    max(math.log((n - df[t] + 0.5) / (df[t] + 0.5)), 1e-6)
                    * d[t]
                    * (K1 + 1)
                    / (d[t] + K1 * (1 - B + B * dl / avgdl))
                    for t in hits
                )
                / ceiling
            )
    return sorted(scores.items(), key=lambda x: (-x[1], x[0]))[:k]


def same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> bool:
    """The same ids in the same order, scores equal to float rounding."""
    return [r for r, _ in got] == [r for r, _ in want] and [s for _, s in got] == pytest.approx(
        [s for _, s in want]
    )


@pytest.fixture
def store(tmp_path):
    store = SQLiteStore(tmp_path / "s.sqlite")
    yield store
    store.close()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))


def test_exact_bm25_through_adds_revisions_and_deletions(store):
    rng = random.Random(7)
    for step in range(300):
        with store.transaction():
            live = [r["id"] for r in store.records("ann")]
            roll = rng.random()
            if roll < 0.6 or not live:
                store.insert("ann", record(f"r{step}", sentence(rng)), None)
            elif roll < 0.8:
                store.revise("ann", rng.choice(live), {"content": sentence(rng)}, None, "UPDATE")
            else:
                store.set_status("ann", rng.choice(live), "deleted", "DELETE")
            store.insert("bob", record(f"b{step}", "jazz " * rng.randint(1, 3)), None)  # another user
        if step % 25 == 0:
            query = " ".join(rng.sample(WORDS, 3))
            assert same(store.lookup.lexical("ann", query, 10), brute_force(store.records("ann"), query, 10))


def test_statistics_are_the_users_own(store):
    """Another user's records never move a user's scores."""
    with store.transaction():
        for i, text in enumerate(["jazz piano", "jazz club", "piano lesson"]):
            store.insert("ann", record(f"a{i}", text), None)
    before = store.lookup.lexical("ann", "jazz piano", 10)
    with store.transaction():
        for i in range(200):
            store.insert("bob", record(f"b{i}", "jazz jazz jazz"), None)
    assert store.lookup.lexical("ann", "jazz piano", 10) == before


def test_least_recently_searched_users_are_dropped_and_read_again(store):
    with store.transaction():
        for user in ("ann", "bob", "cy"):
            for i in range(20):
                store.insert(user, record(f"{user}{i}", "garden " + "river " * (i % 4)), None)
    index = LexicalIndex(store, max_postings=50)  # room for about one user's postings
    expected = {u: brute_force(store.records(u), "garden", 5) for u in ("ann", "bob", "cy")}
    for user in ("ann", "bob", "cy", "ann"):
        assert same(index.search(user, "garden", 5), expected[user])
        assert list(index.users)[-1] == user and len(index.users) == 1


def test_mostly_tombstones_reads_the_user_again(store):
    with store.transaction():
        for i in range(10):
            store.insert("ann", record(f"r{i}", f"chess bread {i}"), None)
    store.lookup.lexical("ann", "chess", 5)
    held = store.indexes["lexical"].users["ann"]
    with store.transaction():
        for i in range(8):
            store.set_status("ann", f"r{i}", "deleted", "DELETE")
    store.lookup.lexical("ann", "chess", 5)  # 8 of 10 positions dead: applied as tombstones
    with store.transaction():
        store.insert("ann", record("r10", "chess alps"), None)
    assert {r for r, _ in store.lookup.lexical("ann", "chess", 5)} == {"r8", "r9", "r10"}
    assert (
        store.indexes["lexical"].users["ann"] is held and len(held.ids) == 3
    )  # read again: no tombstones kept


def test_searches_while_a_writer_writes_see_only_whole_commits(store, tmp_path):
    other = SQLiteStore(tmp_path / "s.sqlite")  # a second connection: the writer
    done, seen = threading.Event(), []

    def write():
        for i in range(200):
            with other.transaction():
                other.insert("ann", record(f"p{i}", "piano"), None)
                other.insert("ann", record(f"q{i}", "piano"), None)
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    while not done.is_set():
        seen.append(len(store.lookup.lexical("ann", "piano", 1000)))
    thread.join()
    assert all(n % 2 == 0 for n in seen)  # a transaction's two records show together or not at all
    assert len(store.lookup.lexical("ann", "piano", 1000)) == 400
    other.close()
